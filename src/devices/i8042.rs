//! The i8042 keyboard controller, as far as a microVM needs it: command 0xFE
//! on port 0x64 asks for a reset (Linux's `reboot=k`, and the firmware), and
//! a Ctrl-Alt-Del from the VMM is queued as scancodes the guest reads from
//! port 0x60 (status bit 0 on port 0x64 says a byte is waiting).

use std::collections::VecDeque;

use super::bus::{BusEvent, PioDevice};

/// First port of the device (data); it spans 0x60..=0x64.
pub const I8042_BASE: u16 = 0x60;
/// Ports the device spans.
pub const I8042_LEN: u16 = 5;
const DATA: u16 = 0;
const CMD: u16 = 4;
const CMD_RESET: u8 = 0xfe;
const STATUS_OUTPUT_FULL: u8 = 0x01;
/// Ctrl down, Alt down, Del down (extended), as set-1 scancodes.
const CTRL_ALT_DEL: [u8; 4] = [0x1d, 0x38, 0xe0, 0x53];
/// Bytes the output queue holds: a few key sequences the guest has not read
/// yet. A client that sends Ctrl-Alt-Del faster than the guest reads gets no
/// more queued (the guest has one to act on already).
pub const I8042_QUEUE_BYTES: usize = 4 * CTRL_ALT_DEL.len();

/// The i8042 device.
#[derive(Debug, Default)]
pub struct I8042 {
    output: VecDeque<u8>,
}

impl I8042 {
    /// A controller with nothing queued.
    pub fn new() -> Self {
        Self::default()
    }

    /// Queues the Ctrl-Alt-Del key sequence for the guest; `false` when the
    /// queue is full (the guest has not read the ones before).
    pub fn send_ctrl_alt_del(&mut self) -> bool {
        if self.output.len() + CTRL_ALT_DEL.len() > I8042_QUEUE_BYTES {
            return false;
        }
        self.output.extend(CTRL_ALT_DEL);
        true
    }
}

impl PioDevice for I8042 {
    fn read(&mut self, offset: u16, data: &mut [u8]) {
        let value = match offset {
            DATA => self.output.pop_front().unwrap_or(0),
            CMD if !self.output.is_empty() => STATUS_OUTPUT_FULL,
            _ => 0,
        };
        data.fill(0);
        if let Some(first) = data.first_mut() {
            *first = value;
        }
    }

    fn write(&mut self, offset: u16, data: &[u8]) -> Option<BusEvent> {
        (offset == CMD && data.first() == Some(&CMD_RESET)).then_some(BusEvent::Reset)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reset_command() {
        let mut d = I8042::new();
        assert_eq!(d.write(CMD, &[CMD_RESET]), Some(BusEvent::Reset));
        assert_eq!(d.write(CMD, &[0xaa]), None);
        assert_eq!(d.write(DATA, &[CMD_RESET]), None);
    }

    #[test]
    fn ctrl_alt_del_is_read_back() {
        let mut d = I8042::new();
        let mut b = [0u8];
        d.read(CMD, &mut b);
        assert_eq!(b[0] & STATUS_OUTPUT_FULL, 0);
        d.send_ctrl_alt_del();
        let mut seen = Vec::new();
        loop {
            d.read(CMD, &mut b);
            if b[0] & STATUS_OUTPUT_FULL == 0 {
                break;
            }
            d.read(DATA, &mut b);
            seen.push(b[0]);
        }
        assert_eq!(seen, CTRL_ALT_DEL);
    }

    #[test]
    fn the_queue_is_bounded() {
        let mut d = I8042::new();
        let accepted = (0..10_000).filter(|_| d.send_ctrl_alt_del()).count();
        assert_eq!(accepted, I8042_QUEUE_BYTES / CTRL_ALT_DEL.len());
        assert_eq!(d.output.len(), I8042_QUEUE_BYTES);
        let mut b = [0u8];
        d.read(DATA, &mut b);
        assert_eq!(b[0], CTRL_ALT_DEL[0]);
        // Room for one more only once the guest read a whole sequence.
        assert!(!d.send_ctrl_alt_del());
    }
}
