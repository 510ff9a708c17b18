//! teravm's firmware ports at 0xf00: a millisecond clock (`in` 0xf00), park
//! this vCPU (`out` 0xf04) and report an error (`out` 0xf08). They must match
//! `firmware/firmware.S`.

use std::time::Instant;

use super::bus::{BusEvent, PioDevice};

/// First port.
pub const FW_PORTS_BASE: u16 = 0xf00;
/// Ports spanned.
pub const FW_PORTS_LEN: u16 = 12;
const CLOCK: u16 = 0;
const PARK: u16 = 4;
const ERROR: u16 = 8;

/// The firmware's ports.
#[derive(Debug)]
pub struct FirmwarePorts {
    boot: Instant,
}

impl FirmwarePorts {
    /// Ports whose clock counts from `boot`.
    pub fn new(boot: Instant) -> Self {
        FirmwarePorts { boot }
    }
}

impl PioDevice for FirmwarePorts {
    fn read(&mut self, offset: u16, data: &mut [u8]) {
        let value = match offset {
            CLOCK => self.boot.elapsed().as_millis() as u32,
            _ => 0,
        };
        let bytes = value.to_le_bytes();
        for (i, b) in data.iter_mut().enumerate() {
            *b = bytes.get(i).copied().unwrap_or(0);
        }
    }

    fn write(&mut self, offset: u16, data: &[u8]) -> Option<BusEvent> {
        match offset {
            PARK => Some(BusEvent::Park),
            ERROR => {
                let mut bytes = [0u8; 4];
                for (d, s) in bytes.iter_mut().zip(data) {
                    *d = *s;
                }
                Some(BusEvent::FirmwareError(u32::from_le_bytes(bytes)))
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn clock_counts_milliseconds() {
        let mut p = FirmwarePorts::new(Instant::now() - Duration::from_millis(1500));
        let mut b = [0u8; 4];
        p.read(CLOCK, &mut b);
        let ms = u32::from_le_bytes(b);
        assert!((1500..10_000).contains(&ms), "{ms}");
    }

    #[test]
    fn park_and_error() {
        let mut p = FirmwarePorts::new(Instant::now());
        assert_eq!(p.write(PARK, &[0]), Some(BusEvent::Park));
        assert_eq!(
            p.write(ERROR, &7u32.to_le_bytes()),
            Some(BusEvent::FirmwareError(7))
        );
        assert_eq!(p.write(1, &[0]), None);
    }
}
