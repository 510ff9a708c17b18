//! A port I/O bus: devices registered on port ranges; accesses to ports no
//! device claims are logged once per port and ignored (reads see `0xff`).

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

/// What a device asks the vCPU loop to do after an access.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BusEvent {
    /// The guest asked for a reset (i8042 command 0xFE): shut the VM down.
    Reset,
    /// The firmware parks this vCPU until it is woken or the VM stops.
    Park,
    /// The firmware reported an error with this code.
    FirmwareError(u32),
    /// The firmware waits for the virtio-mmio device in slot `slot` to
    /// interrupt, `timeout_ms` at most ([`crate::devices::firmware_ports`], port 0xf0c).
    WaitDevice {
        /// The device's slot on the MMIO bus.
        slot: u16,
        /// Milliseconds at most (never 0).
        timeout_ms: u16,
    },
}

/// A device on the port I/O bus. `offset` is relative to the device's base.
pub trait PioDevice: Send {
    /// A guest `in`: fill `data`.
    fn read(&mut self, offset: u16, data: &mut [u8]);
    /// A guest `out` of `data`.
    fn write(&mut self, offset: u16, data: &[u8]) -> Option<BusEvent>;
}

/// Errors of bus construction.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BusError {
    /// Two devices claim the same port.
    #[error("port range {base:#x}+{len} overlaps a device already on the bus")]
    Overlap {
        /// First port of the refused range.
        base: u16,
        /// Number of ports.
        len: u16,
    },
    /// A range of no ports, or one that runs past port 0xffff.
    #[error("invalid port range {base:#x}+{len}")]
    InvalidRange {
        /// First port of the refused range.
        base: u16,
        /// Number of ports.
        len: u16,
    },
}

struct Entry {
    base: u16,
    len: u16,
    device: Arc<Mutex<dyn PioDevice>>,
}

/// The port I/O bus shared by all vCPU threads.
#[derive(Default)]
pub struct PioBus {
    entries: Vec<Entry>,
    unknown_seen: Mutex<HashSet<u16>>,
}

impl PioBus {
    /// An empty bus.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers `device` on ports `base..base + len`.
    pub fn insert(
        &mut self,
        base: u16,
        len: u16,
        device: Arc<Mutex<dyn PioDevice>>,
    ) -> Result<(), BusError> {
        let end = u32::from(base) + u32::from(len);
        if len == 0 || end > 0x1_0000 {
            return Err(BusError::InvalidRange { base, len });
        }
        if self.entries.iter().any(|e| {
            u32::from(base) < u32::from(e.base) + u32::from(e.len) && u32::from(e.base) < end
        }) {
            return Err(BusError::Overlap { base, len });
        }
        self.entries.push(Entry { base, len, device });
        Ok(())
    }

    fn find(&self, port: u16) -> Option<(&Entry, u16)> {
        self.entries
            .iter()
            .find(|e| port >= e.base && u32::from(port) < u32::from(e.base) + u32::from(e.len))
            .map(|e| (e, port - e.base))
    }

    fn unknown(&self, port: u16, what: &str) {
        let mut seen = self.unknown_seen.lock().unwrap_or_else(|p| p.into_inner());
        if seen.insert(port) {
            log::warn!(
                "guest {what} on port {port:#x}, which has no device: ignored (logged once)"
            );
        }
    }

    /// A guest `in` on `port`.
    pub fn read(&self, port: u16, data: &mut [u8]) {
        match self.find(port) {
            Some((e, offset)) => lock(&e.device).read(offset, data),
            None => {
                self.unknown(port, "read");
                data.fill(0xff);
            }
        }
    }

    /// A guest `out` on `port`.
    pub fn write(&self, port: u16, data: &[u8]) -> Option<BusEvent> {
        match self.find(port) {
            Some((e, offset)) => lock(&e.device).write(offset, data),
            None => {
                self.unknown(port, "write");
                None
            }
        }
    }

    /// How many distinct unclaimed ports the guest has touched.
    pub fn unknown_port_count(&self) -> usize {
        self.unknown_seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .len()
    }
}

/// Locks a device, carrying on if another vCPU panicked while holding it: a
/// device's state is a few registers, still usable for shutting down.
fn lock<'a>(
    device: &'a Mutex<dyn PioDevice + 'static>,
) -> std::sync::MutexGuard<'a, dyn PioDevice + 'static> {
    device.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Echo(Vec<(u16, Vec<u8>)>);
    impl PioDevice for Echo {
        fn read(&mut self, offset: u16, data: &mut [u8]) {
            data.fill(offset as u8);
        }
        fn write(&mut self, offset: u16, data: &[u8]) -> Option<BusEvent> {
            self.0.push((offset, data.to_vec()));
            (offset == 1).then_some(BusEvent::Reset)
        }
    }

    #[test]
    fn routes_by_range_and_offset() {
        let dev = Arc::new(Mutex::new(Echo(Vec::new())));
        let mut bus = PioBus::new();
        bus.insert(0x100, 4, dev.clone()).unwrap();
        let mut b = [0u8; 2];
        bus.read(0x102, &mut b);
        assert_eq!(b, [2, 2]);
        assert_eq!(bus.write(0x101, &[7]), Some(BusEvent::Reset));
        assert_eq!(bus.write(0x103, &[8]), None);
        assert_eq!(dev.lock().unwrap().0, vec![(1, vec![7]), (3, vec![8])]);
    }

    #[test]
    fn unknown_ports_read_ff_and_are_counted_once() {
        let bus = PioBus::new();
        let mut b = [0u8; 4];
        bus.read(0x80, &mut b);
        assert_eq!(b, [0xff; 4]);
        for _ in 0..100 {
            assert_eq!(bus.write(0x80, &[1]), None);
        }
        bus.write(0x81, &[1]);
        assert_eq!(bus.unknown_port_count(), 2);
    }

    #[test]
    fn overlaps_and_bad_ranges_are_refused() {
        let mut bus = PioBus::new();
        bus.insert(0x3f8, 8, Arc::new(Mutex::new(Echo(Vec::new()))))
            .unwrap();
        let e = bus.insert(0x3ff, 1, Arc::new(Mutex::new(Echo(Vec::new()))));
        assert_eq!(
            e,
            Err(BusError::Overlap {
                base: 0x3ff,
                len: 1
            })
        );
        let e = bus.insert(0xffff, 2, Arc::new(Mutex::new(Echo(Vec::new()))));
        assert!(matches!(e, Err(BusError::InvalidRange { .. })));
        let e = bus.insert(0x10, 0, Arc::new(Mutex::new(Echo(Vec::new()))));
        assert!(matches!(e, Err(BusError::InvalidRange { .. })));
        bus.insert(0x3f0, 8, Arc::new(Mutex::new(Echo(Vec::new()))))
            .unwrap();
    }
}
