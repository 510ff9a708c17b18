//! The MMIO bus beside the port bus: virtio-mmio devices in Firecracker's
//! window, 4 KiB each from [`MMIO_BASE`] in the 3–4 GiB gap, one GSI each
//! from [`FIRST_GSI`], in the order they are added. A vCPU's MMIO exit
//! reaches the device whose window holds the address ([`MmioBus::read`],
//! [`MmioBus::write`]); an address no device claims reads `0xff` and is
//! logged once. At shutdown [`MmioBus::detach_all`] takes every device off
//! the bus, so a vCPU thread that outlives its stop (and still holds the
//! bus) no longer holds a device, nor the guest memory the device holds.

use std::collections::HashSet;
use std::sync::{Mutex, MutexGuard, PoisonError};

use super::virtio::{DeviceMemory, MmioTransport};

/// The first device's window: Firecracker's `MMIO_MEM_START` + 4 KiB.
pub const MMIO_BASE: u64 = 0xC000_1000;
/// Bytes of each device's window.
pub const MMIO_SLOT_BYTES: u64 = 0x1000;
/// The first device's interrupt line (Firecracker's `IRQ_BASE`).
pub const FIRST_GSI: u32 = 5;
/// The last device's interrupt line: the IOAPIC's last pin (Firecracker's
/// `GSI_LEGACY_END`); a Linux guest never gets an interrupt past it.
pub const LAST_GSI: u32 = 23;
/// Most devices on the bus: one per GSI from [`FIRST_GSI`] to [`LAST_GSI`].
pub const MAX_MMIO_DEVICES: usize = (LAST_GSI - FIRST_GSI + 1) as usize;

/// A device on the MMIO bus; `offset` is relative to its window.
pub trait MmioDevice: Send {
    /// A guest read: fill `data`.
    fn mmio_read(&mut self, offset: u64, data: &mut [u8]);
    /// A guest write of `data`.
    fn mmio_write(&mut self, offset: u64, data: &[u8]);
}

impl<M: DeviceMemory> MmioDevice for MmioTransport<M> {
    fn mmio_read(&mut self, offset: u64, data: &mut [u8]) {
        if let Err(e) = self.read(offset, data) {
            log::debug!("virtio-mmio read at {offset:#x}: {e}");
            data.fill(0);
        }
    }

    fn mmio_write(&mut self, offset: u64, data: &[u8]) {
        if let Err(e) = self.write(offset, data) {
            log::debug!("virtio-mmio write at {offset:#x}: {e}");
        }
    }
}

/// Where a device sits: its window and interrupt line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MmioSlot {
    /// Guest physical address of its 4 KiB window.
    pub base: u64,
    /// Its GSI.
    pub gsi: u32,
}

impl MmioSlot {
    /// The slot of the `index`th device.
    pub fn nth(index: usize) -> MmioSlot {
        MmioSlot {
            base: MMIO_BASE + index as u64 * MMIO_SLOT_BYTES,
            gsi: FIRST_GSI + index as u32,
        }
    }

    /// The Linux command-line parameter that tells the guest of it
    /// (`virtio_mmio.device=4K@<addr>:<irq>`, as Firecracker writes it).
    pub fn cmdline_param(&self) -> String {
        format!("virtio_mmio.device=4K@{:#x}:{}", self.base, self.gsi)
    }
}

/// Errors of the MMIO bus.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum MmioBusError {
    /// No slot is left.
    #[error(
        "no MMIO slot left for another device ({MAX_MMIO_DEVICES} at most: one per GSI from \
         {FIRST_GSI} to {LAST_GSI})"
    )]
    Full,
}

/// One slot's device, taken out at shutdown.
type Slot = Mutex<Option<Box<dyn MmioDevice>>>;

/// The MMIO devices, shared by all vCPU threads.
#[derive(Default)]
pub struct MmioBus {
    devices: Vec<Slot>,
    unknown_seen: Mutex<HashSet<u64>>,
}

impl std::fmt::Debug for MmioBus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MmioBus")
            .field("devices", &self.devices.len())
            .finish()
    }
}

fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl MmioBus {
    /// Adds `device` in the next slot.
    pub fn add(&mut self, device: Box<dyn MmioDevice>) -> Result<MmioSlot, MmioBusError> {
        if self.devices.len() >= MAX_MMIO_DEVICES {
            return Err(MmioBusError::Full);
        }
        let slot = MmioSlot::nth(self.devices.len());
        self.devices.push(Mutex::new(Some(device)));
        Ok(slot)
    }

    /// How many devices were added.
    pub fn len(&self) -> usize {
        self.devices.len()
    }

    /// Whether no device was added.
    pub fn is_empty(&self) -> bool {
        self.devices.is_empty()
    }

    fn find(&self, addr: u64) -> Option<(&Slot, u64)> {
        let rel = addr.checked_sub(MMIO_BASE)?;
        let index = usize::try_from(rel / MMIO_SLOT_BYTES).ok()?;
        Some((self.devices.get(index)?, rel % MMIO_SLOT_BYTES))
    }

    fn unknown(&self, addr: u64, what: &str) {
        let page = addr & !(MMIO_SLOT_BYTES - 1);
        if lock(&self.unknown_seen).insert(page) {
            log::debug!("MMIO {what} at {addr:#x} with no device (logged once per page)");
        }
    }

    /// A guest read at `addr`; `0xff` where no device is.
    pub fn read(&self, addr: u64, data: &mut [u8]) {
        match self.find(addr) {
            Some((slot, offset)) => match lock(slot).as_mut() {
                Some(d) => d.mmio_read(offset, data),
                None => data.fill(0xff),
            },
            None => {
                self.unknown(addr, "read");
                data.fill(0xff);
            }
        }
    }

    /// A guest write at `addr`; ignored where no device is.
    pub fn write(&self, addr: u64, data: &[u8]) {
        match self.find(addr) {
            Some((slot, offset)) => {
                if let Some(d) = lock(slot).as_mut() {
                    d.mmio_write(offset, data);
                }
            }
            None => self.unknown(addr, "write"),
        }
    }

    /// Takes every device off the bus (and drops it): from now on the
    /// windows read `0xff`.
    pub fn detach_all(&self) {
        for slot in &self.devices {
            let device = lock(slot).take();
            drop(device);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    type Writes = Arc<Mutex<Vec<(u64, Vec<u8>)>>>;

    struct Recorder(Writes);

    impl MmioDevice for Recorder {
        fn mmio_read(&mut self, offset: u64, data: &mut [u8]) {
            data.fill(offset as u8);
        }
        fn mmio_write(&mut self, offset: u64, data: &[u8]) {
            lock(&self.0).push((offset, data.to_vec()));
        }
    }

    #[test]
    fn slots_follow_firecrackers_window_and_gsis() {
        assert_eq!(
            MmioSlot::nth(0),
            MmioSlot {
                base: 0xC000_1000,
                gsi: 5
            }
        );
        assert_eq!(MmioSlot::nth(2).base, 0xC000_3000);
        assert_eq!(
            MmioSlot::nth(1).cmdline_param(),
            "virtio_mmio.device=4K@0xc0002000:6"
        );
    }

    #[test]
    fn accesses_reach_the_device_of_the_window_until_detached() {
        let writes = Arc::new(Mutex::new(Vec::new()));
        let mut bus = MmioBus::default();
        let slot = bus.add(Box::new(Recorder(writes.clone()))).unwrap();
        let mut data = [0u8; 4];
        bus.read(slot.base + 0x70, &mut data);
        assert_eq!(data, [0x70; 4]);
        bus.write(slot.base + 0x50, &[1, 0, 0, 0]);
        assert_eq!(lock(&writes).as_slice(), &[(0x50, vec![1, 0, 0, 0])]);
        // Past the last device, and below the window: nothing there.
        bus.read(slot.base + MMIO_SLOT_BYTES, &mut data);
        assert_eq!(data, [0xff; 4]);
        bus.read(MMIO_BASE - 4, &mut data);
        assert_eq!(data, [0xff; 4]);
        bus.detach_all();
        bus.read(slot.base, &mut data);
        assert_eq!(data, [0xff; 4]);
        bus.write(slot.base + 0x50, &[2, 0, 0, 0]);
        assert_eq!(lock(&writes).len(), 1);
    }

    #[test]
    fn the_bus_is_bounded() {
        let mut bus = MmioBus::default();
        for _ in 0..MAX_MMIO_DEVICES {
            bus.add(Box::new(Recorder(Arc::default()))).unwrap();
        }
        assert_eq!(
            bus.add(Box::new(Recorder(Arc::default()))),
            Err(MmioBusError::Full)
        );
    }
}
