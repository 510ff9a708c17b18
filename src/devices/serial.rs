//! COM1 at 0x3f8: a vm-superio 16550A UART whose output goes to teravm's
//! stdout and, when asked, to a file. No interrupt line: the firmware polls
//! nothing and only writes; a guest kernel will need an irqfd here.

use std::fs::File;
use std::io::{self, Write};
use std::sync::atomic::{AtomicBool, Ordering};

use vm_superio::serial::NoEvents;
use vm_superio::{Serial, Trigger};

use super::bus::{BusEvent, PioDevice};

/// First port of COM1.
pub const COM1_BASE: u16 = 0x3f8;
/// Ports COM1 spans.
pub const COM1_LEN: u16 = 8;

/// An interrupt line that goes nowhere (no irqchip is set up for the firmware).
#[derive(Debug, Default)]
pub struct NoInterrupt;

impl Trigger for NoInterrupt {
    type E = io::Error;
    fn trigger(&self) -> io::Result<()> {
        Ok(())
    }
}

/// Whether the guest left teravm's stdout in the middle of a line (so that
/// teravm's own summary line starts on a fresh one).
static STDOUT_MID_LINE: AtomicBool = AtomicBool::new(false);

/// Whether the guest's last byte on stdout was not a newline.
pub fn stdout_mid_line() -> bool {
    STDOUT_MID_LINE.load(Ordering::Relaxed)
}

/// Where the guest's serial output goes.
pub enum SerialOut {
    /// teravm's stdout.
    Stdout,
    /// stdout and a file.
    StdoutAndFile(File),
    /// A buffer (tests).
    Buffer(Vec<u8>),
}

impl Write for SerialOut {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            SerialOut::Stdout => io::stdout().write_all(buf)?,
            SerialOut::StdoutAndFile(f) => {
                io::stdout().write_all(buf)?;
                f.write_all(buf)?;
            }
            SerialOut::Buffer(v) => {
                v.extend_from_slice(buf);
                return Ok(buf.len());
            }
        }
        if let Some(&last) = buf.last() {
            STDOUT_MID_LINE.store(last != b'\n', Ordering::Relaxed);
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            SerialOut::Stdout => io::stdout().flush(),
            SerialOut::StdoutAndFile(f) => {
                io::stdout().flush()?;
                f.flush()
            }
            SerialOut::Buffer(_) => Ok(()),
        }
    }
}

/// COM1 on the bus.
pub struct SerialConsole {
    serial: Serial<NoInterrupt, NoEvents, SerialOut>,
    write_failed: bool,
}

impl SerialConsole {
    /// A UART writing to `out`.
    pub fn new(out: SerialOut) -> Self {
        SerialConsole {
            serial: Serial::new(NoInterrupt, out),
            write_failed: false,
        }
    }

    /// What was written so far, for a [`SerialOut::Buffer`].
    pub fn buffer(&self) -> Option<&[u8]> {
        match self.serial.writer() {
            SerialOut::Buffer(v) => Some(v),
            _ => None,
        }
    }
}

impl PioDevice for SerialConsole {
    fn read(&mut self, offset: u16, data: &mut [u8]) {
        data.fill(0);
        if let (Some(first), Ok(offset)) = (data.first_mut(), u8::try_from(offset)) {
            *first = self.serial.read(offset);
        }
    }

    fn write(&mut self, offset: u16, data: &[u8]) -> Option<BusEvent> {
        let (Some(&value), Ok(offset)) = (data.first(), u8::try_from(offset)) else {
            return None;
        };
        if let Err(e) = self.serial.write(offset, value) {
            if !self.write_failed {
                log::warn!("serial console output failed: {e:?} (further errors not logged)");
                self.write_failed = true;
            }
        }
        if value == b'\n' && offset == 0 {
            let _ = self.serial.writer_mut().flush();
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_reach_the_output() {
        let mut s = SerialConsole::new(SerialOut::Buffer(Vec::new()));
        for b in b"hi\n" {
            assert_eq!(s.write(0, &[*b]), None);
        }
        assert_eq!(s.buffer().unwrap(), b"hi\n");
        let mut lsr = [0u8];
        s.read(5, &mut lsr);
        assert_ne!(lsr[0] & 0x20, 0, "transmitter holding register empty");
    }
}
