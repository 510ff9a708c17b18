//! teravm's firmware ports at 0xf00: a millisecond clock (`in` 0xf00), park
//! this vCPU (`out` 0xf04), report an error (`out` 0xf08) and wait for a
//! device (`out` 0xf0c). They must match `firmware/firmware.S`.
//!
//! The wait port stands for `sti; hlt` of a Linux vCPU with KVM's
//! in-kernel irqchip: the one thing a driver does while it has nothing to
//! do until its device signals, and the one thing code at CPL3 without
//! interrupts cannot do. `out dx=0xf0c, eax` with eax bits 0..15 the
//! virtio-mmio device's slot (`(base - 0xC000_1000) / 0x1000`, the order
//! the devices sit on the MMIO bus) and bits 16..31 a timeout in
//! milliseconds (0: [`DEFAULT_WAIT_MS`]). The vCPU thread sleeps until
//! that device's `InterruptStatus` is non-zero (an interrupt the guest has
//! not acknowledged), the timeout passes, or the vCPU is asked to stop or
//! pause, then enters the guest again; it returns at once if the status is
//! already non-zero or the slot has no device. The guest acknowledges
//! (`InterruptACK`) after waking, as a Linux interrupt handler does; a
//! guest that never does returns at once each time (it busy-waits, it
//! never hangs). On a VMM where the port is unclaimed (QEMU, Firecracker)
//! the `out` does nothing and the guest's loop degrades to polling.

use std::time::Instant;

use super::bus::{BusEvent, PioDevice};

/// First port.
pub const FW_PORTS_BASE: u16 = 0xf00;
/// Ports spanned.
pub const FW_PORTS_LEN: u16 = 16;
const CLOCK: u16 = 0;
const PARK: u16 = 4;
const ERROR: u16 = 8;
const WAIT: u16 = 12;
/// The wait port's timeout when the guest gives 0 ms.
pub const DEFAULT_WAIT_MS: u16 = 100;

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
        // Bytes the guest did not write (an `out` of 1 or 2 bytes) are 0.
        let mut bytes = [0u8; 4];
        for (d, s) in bytes.iter_mut().zip(data) {
            *d = *s;
        }
        let value = u32::from_le_bytes(bytes);
        match offset {
            PARK => Some(BusEvent::Park),
            ERROR => Some(BusEvent::FirmwareError(value)),
            WAIT => {
                let timeout_ms = (value >> 16) as u16;
                Some(BusEvent::WaitDevice {
                    slot: value as u16,
                    timeout_ms: if timeout_ms == 0 {
                        DEFAULT_WAIT_MS
                    } else {
                        timeout_ms
                    },
                })
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

    #[test]
    fn wait_names_a_slot_and_a_timeout() {
        let mut p = FirmwarePorts::new(Instant::now());
        assert_eq!(
            p.write(WAIT, &((250u32 << 16) | 3).to_le_bytes()),
            Some(BusEvent::WaitDevice {
                slot: 3,
                timeout_ms: 250
            })
        );
        // 0 ms is the default; a 2-byte `out` names only the slot.
        assert_eq!(
            p.write(WAIT, &7u32.to_le_bytes()),
            Some(BusEvent::WaitDevice {
                slot: 7,
                timeout_ms: DEFAULT_WAIT_MS
            })
        );
        assert_eq!(
            p.write(WAIT, &[0xff, 0xff]),
            Some(BusEvent::WaitDevice {
                slot: 0xffff,
                timeout_ms: DEFAULT_WAIT_MS
            })
        );
        assert_eq!(FW_PORTS_BASE + WAIT, 0xf0c);
        assert_eq!(FW_PORTS_LEN, WAIT + 4);
    }
}
