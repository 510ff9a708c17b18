//! COM1 at 0x3f8: a vm-superio 16550A UART. Its output goes into the
//! console's bounded buffer ([`super::console`]), so a vCPU writing to it
//! never waits on the host. Its interrupt line is pluggable: none for the
//! firmware, which only writes; an `EventFd` registered as an irqfd for a
//! guest kernel, which needs the interrupt for input and output.

use std::io::{self, Write};

use vm_superio::serial::NoEvents;
use vm_superio::{Serial, Trigger};
use vmm_sys_util::eventfd::EventFd;

use super::bus::{BusEvent, PioDevice};
use super::console::ConsoleOut;

/// First port of COM1.
pub const COM1_BASE: u16 = 0x3f8;
/// Ports COM1 spans.
pub const COM1_LEN: u16 = 8;

/// The UART's interrupt line.
#[derive(Debug, Default)]
pub enum SerialIrq {
    /// No line (the firmware polls nothing and only writes).
    #[default]
    None,
    /// An `EventFd` the VMM registers with KVM as an irqfd.
    EventFd(EventFd),
}

impl Trigger for SerialIrq {
    type E = io::Error;
    fn trigger(&self) -> io::Result<()> {
        match self {
            SerialIrq::None => Ok(()),
            SerialIrq::EventFd(fd) => fd.write(1),
        }
    }
}

/// COM1 on the bus, writing into `W` (the console buffer; a `Vec` in tests).
pub struct SerialConsole<W: Write + Send = ConsoleOut> {
    serial: Serial<SerialIrq, NoEvents, W>,
    write_failed: bool,
}

impl<W: Write + Send> SerialConsole<W> {
    /// A UART writing to `out`, with no interrupt line.
    pub fn new(out: W) -> Self {
        Self::with_irq(out, SerialIrq::None)
    }

    /// A UART writing to `out` that raises `irq`.
    pub fn with_irq(out: W, irq: SerialIrq) -> Self {
        SerialConsole {
            serial: Serial::new(irq, out),
            write_failed: false,
        }
    }

    /// Bytes for the guest to read (console input); returns how many fit in
    /// the UART's receive FIFO.
    pub fn enqueue_input(&mut self, bytes: &[u8]) -> usize {
        let room = self.serial.fifo_capacity();
        let n = room.min(bytes.len());
        if n > 0 && self.serial.enqueue_raw_bytes(&bytes[..n]).is_err() {
            return 0;
        }
        n
    }

    /// What the UART wrote into.
    pub fn writer(&self) -> &W {
        self.serial.writer()
    }
}

impl<W: Write + Send> PioDevice for SerialConsole<W> {
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
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_reach_the_output() {
        let mut s = SerialConsole::new(Vec::new());
        for b in b"hi\n" {
            assert_eq!(s.write(0, &[*b]), None);
        }
        assert_eq!(s.writer(), b"hi\n");
        let mut lsr = [0u8];
        s.read(5, &mut lsr);
        assert_ne!(lsr[0] & 0x20, 0, "transmitter holding register empty");
    }

    #[test]
    fn input_fills_the_receive_fifo_and_raises_the_irq() {
        let irq = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        let mut s =
            SerialConsole::with_irq(Vec::new(), SerialIrq::EventFd(irq.try_clone().unwrap()));
        // Without the received-data interrupt enabled: queued, no interrupt.
        assert_eq!(s.enqueue_input(b"ab"), 2);
        assert!(irq.read().is_err(), "no interrupt while IER is 0");
        s.write(1, &[0x01]);
        assert_eq!(s.enqueue_input(&[b'c'; 100]), 62, "64-byte FIFO");
        assert_eq!(irq.read().unwrap(), 1);
        assert_eq!(s.enqueue_input(b"d"), 0, "full");
        let mut got = Vec::new();
        loop {
            let mut lsr = [0u8];
            s.read(5, &mut lsr);
            if lsr[0] & 1 == 0 {
                break;
            }
            let mut d = [0u8];
            s.read(0, &mut d);
            got.push(d[0]);
        }
        assert_eq!(&got[..3], b"abc");
        assert_eq!(got.len(), 64);
        assert_eq!(s.enqueue_input(b"e"), 1, "room again once read");
    }
}
