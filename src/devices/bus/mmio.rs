//! The MMIO bus beside the port bus: virtio-mmio devices in Firecracker's
//! window, 4 KiB each from [`MMIO_BASE`] in the 3–4 GiB gap, one GSI each
//! from [`FIRST_GSI`], in the order they are added. A vCPU's MMIO exit
//! reaches the device whose window holds the address ([`MmioBus::read`],
//! [`MmioBus::write`]); an address no device claims reads `0xff`, except
//! in a memory hotplug region ([`MmioBus::add_unplugged`]): memory never
//! plugged, or unplugged, is in no memslot, and a guest touching it reads
//! zeros, its writes ignored and counted. What a
//! guest does wrong here is logged at most [`LOG_LINES_PER_SEC`] lines a
//! second ([`LogLimiter`], the lines left out are counted in the next one):
//! an unclaimed page once (up to [`UNKNOWN_PAGES_REMEMBERED`] distinct
//! pages, then every access, rate-limited), a register access the
//! transport refuses every time. Nothing a guest does grows memory here.
//! At shutdown [`MmioBus::detach_all`] takes every device off
//! the bus, so a vCPU thread that outlives its stop (and still holds the
//! bus) no longer holds a device, nor the guest memory the device holds.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crate::devices::virtio::fence::RESET_WAIT;
use crate::devices::virtio::{DeviceMemory, MmioError, MmioTransport, ResetFence, TransportState};
use crate::devices::wake::WakeHub;

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

/// Lines a second the bus logs about guest accesses (each kind apart).
pub const LOG_LINES_PER_SEC: u32 = 10;
/// Distinct unclaimed pages remembered, each logged once; past them an
/// unclaimed access is logged every time, within the rate limit.
pub const UNKNOWN_PAGES_REMEMBERED: usize = 64;

/// At most `per_sec` lines a second; counts those it holds back.
#[derive(Debug)]
pub struct LogLimiter {
    per_sec: u32,
    state: Mutex<LimiterState>,
}

#[derive(Debug)]
struct LimiterState {
    window: Option<Instant>,
    lines: u32,
    held_back: u64,
}

impl LogLimiter {
    /// A limiter of `per_sec` lines a second.
    pub const fn new(per_sec: u32) -> LogLimiter {
        LogLimiter {
            per_sec,
            state: Mutex::new(LimiterState {
                window: None,
                lines: 0,
                held_back: 0,
            }),
        }
    }

    /// Whether a line may be logged now: `Some(n)` with the lines held back
    /// since the last one that was, or None (counted).
    pub fn allow(&self, now: Instant) -> Option<u64> {
        let mut s = lock(&self.state);
        if s.window
            .is_none_or(|w| now.saturating_duration_since(w) >= Duration::from_secs(1))
        {
            s.window = Some(now);
            s.lines = 0;
        }
        if s.lines >= self.per_sec {
            s.held_back += 1;
            return None;
        }
        s.lines += 1;
        Some(std::mem::take(&mut s.held_back))
    }
}

/// Register accesses the transports refused.
static TRANSPORT_LOG: LogLimiter = LogLimiter::new(LOG_LINES_PER_SEC);

fn held_back(n: u64) -> String {
    if n == 0 {
        String::new()
    } else {
        format!(" ({n} similar lines left out)")
    }
}

/// A device on the MMIO bus; `offset` is relative to its window.
pub trait MmioDevice: Send {
    /// A guest read: fill `data`.
    fn mmio_read(&mut self, offset: u64, data: &mut [u8]);
    /// A guest write of `data`; what the vCPU must wait for before the
    /// write returns to the guest, with no lock held (a reset's fence).
    fn mmio_write(&mut self, offset: u64, data: &[u8]) -> Option<Arc<ResetFence>>;
    /// A virtio transport's state, for a snapshot (`None`: not one).
    fn save_transport(&self) -> Option<TransportState> {
        None
    }
    /// Puts a virtio transport back from a snapshot (`None`: not one).
    fn restore_transport(&mut self, _state: &TransportState) -> Option<Result<(), MmioError>> {
        None
    }
}

impl<M: DeviceMemory> MmioDevice for MmioTransport<M> {
    fn mmio_read(&mut self, offset: u64, data: &mut [u8]) {
        if let Err(e) = self.read(offset, data) {
            if let Some(n) = TRANSPORT_LOG.allow(Instant::now()) {
                log::debug!("virtio-mmio read at {offset:#x}: {e}{}", held_back(n));
            }
            data.fill(0);
        }
    }

    fn mmio_write(&mut self, offset: u64, data: &[u8]) -> Option<Arc<ResetFence>> {
        if let Err(e) = self.write(offset, data) {
            if let Some(n) = TRANSPORT_LOG.allow(Instant::now()) {
                log::debug!("virtio-mmio write at {offset:#x}: {e}{}", held_back(n));
            }
        }
        self.take_reset_wait()
    }

    fn save_transport(&self) -> Option<TransportState> {
        Some(self.save_state())
    }

    fn restore_transport(&mut self, state: &TransportState) -> Option<Result<(), MmioError>> {
        Some(self.restore_state(state))
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

    /// Its index on the bus (what the firmware's wait port names).
    pub fn index(&self) -> usize {
        ((self.base - MMIO_BASE) / MMIO_SLOT_BYTES) as usize
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
pub struct MmioBus {
    devices: Vec<Slot>,
    /// Unclaimed pages already logged (at most [`UNKNOWN_PAGES_REMEMBERED`]).
    unknown_seen: Mutex<HashSet<u64>>,
    unknown_log: LogLimiter,
    /// Where the devices' interrupts wake waiting vCPUs.
    wake: Arc<WakeHub>,
    /// Hotplug regions `(start, len)`: what is not plugged reads zeros.
    unplugged: Vec<(u64, u64)>,
    /// Guest accesses to a hotplug region outside its memslots.
    unplugged_accesses: Arc<AtomicU64>,
}

impl Default for MmioBus {
    fn default() -> Self {
        MmioBus {
            wake: Arc::new(WakeHub::new()),
            unplugged: Vec::new(),
            unplugged_accesses: Arc::new(AtomicU64::new(0)),
            devices: Vec::new(),
            unknown_seen: Mutex::new(HashSet::new()),
            unknown_log: LogLimiter::new(LOG_LINES_PER_SEC),
        }
    }
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

    /// The VM's wake hub: the transports' interrupts notify it, vCPUs
    /// waiting on port 0xf0c sleep on it.
    pub fn wake_hub(&self) -> &Arc<WakeHub> {
        &self.wake
    }

    /// Marks `[start, start + len)` as a memory hotplug region: an
    /// access there that reaches the bus (the memory is in no memslot:
    /// never plugged, or its slot unplugged) reads zeros and its writes
    /// are ignored; both are counted ([`MmioBus::unplugged_accesses`]).
    /// Returns the count (one for all regions), for the metrics.
    pub fn add_unplugged(&mut self, start: u64, len: u64) -> Arc<AtomicU64> {
        self.unplugged.push((start, len));
        self.unplugged_accesses.clone()
    }

    /// Guest accesses to hotplug memory outside its memslots so far.
    pub fn unplugged_accesses(&self) -> u64 {
        self.unplugged_accesses.load(Ordering::Relaxed)
    }

    /// Whether `addr` lies in a hotplug region; counts the access if so.
    fn in_unplugged(&self, addr: u64) -> bool {
        let hit = self
            .unplugged
            .iter()
            .any(|&(start, len)| addr.checked_sub(start).is_some_and(|off| off < len));
        if hit {
            self.unplugged_accesses.fetch_add(1, Ordering::Relaxed);
        }
        hit
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
        let first = {
            let mut seen = lock(&self.unknown_seen);
            if seen.contains(&page) {
                return;
            }
            // Past the bound every access is logged (rate-limited), none
            // remembered.
            seen.len() < UNKNOWN_PAGES_REMEMBERED && seen.insert(page)
        };
        if let Some(n) = self.unknown_log.allow(Instant::now()) {
            let once = if first { " (logged once per page)" } else { "" };
            log::debug!(
                "MMIO {what} at {addr:#x} with no device{once}{}",
                held_back(n)
            );
        }
    }

    /// Unclaimed pages remembered (bounded by [`UNKNOWN_PAGES_REMEMBERED`]).
    pub fn unknown_pages_remembered(&self) -> usize {
        lock(&self.unknown_seen).len()
    }

    /// A guest read at `addr`; `0xff` where no device is, zeros in a
    /// hotplug region.
    pub fn read(&self, addr: u64, data: &mut [u8]) {
        match self.find(addr) {
            Some((slot, offset)) => match lock(slot).as_mut() {
                Some(d) => d.mmio_read(offset, data),
                None => data.fill(0xff),
            },
            None => {
                self.unknown(addr, "read");
                data.fill(if self.in_unplugged(addr) { 0 } else { 0xff });
            }
        }
    }

    /// A guest write at `addr`; ignored where no device is. A reset that
    /// left work in flight returns only once it ended (or at
    /// [`RESET_WAIT`]), waited for here with the slot's lock let go.
    pub fn write(&self, addr: u64, data: &[u8]) {
        match self.find(addr) {
            Some((slot, offset)) => {
                let wait = lock(slot).as_mut().and_then(|d| d.mmio_write(offset, data));
                if let Some(fence) = wait {
                    if !fence.wait(Instant::now() + RESET_WAIT) {
                        log::warn!(
                            "a device reset at {addr:#x} returns to the guest after {RESET_WAIT:?} \
                             with {} discard(s) still in flight",
                            fence.pending()
                        );
                    }
                }
            }
            None => {
                self.in_unplugged(addr);
                self.unknown(addr, "write");
            }
        }
    }

    /// Runs `f` on the device in `slot` (its lock held); `None` if the slot
    /// is empty or not on this bus.
    pub fn with_device<R>(
        &self,
        slot: MmioSlot,
        f: impl FnOnce(&mut dyn MmioDevice) -> R,
    ) -> Option<R> {
        let mut held = lock(self.devices.get(slot.index())?);
        let device = held.as_mut()?;
        Some(f(&mut **device))
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

    type Writes = Arc<Mutex<Vec<(u64, Vec<u8>)>>>;

    struct Recorder(Writes);

    impl MmioDevice for Recorder {
        fn mmio_read(&mut self, offset: u64, data: &mut [u8]) {
            data.fill(offset as u8);
        }
        fn mmio_write(&mut self, offset: u64, data: &[u8]) -> Option<Arc<ResetFence>> {
            lock(&self.0).push((offset, data.to_vec()));
            None
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
    fn unclaimed_pages_stay_bounded_whatever_the_guest_touches() {
        let bus = MmioBus::default();
        let mut data = [0u8; 4];
        // A guest walking 100,000 distinct pages of the gap and beyond.
        for i in 0..100_000u64 {
            bus.read(0xD000_0000 + i * MMIO_SLOT_BYTES, &mut data);
            assert_eq!(data, [0xff; 4]);
        }
        assert_eq!(bus.unknown_pages_remembered(), UNKNOWN_PAGES_REMEMBERED);
    }

    #[test]
    fn the_log_limiter_allows_per_second_and_counts_the_rest() {
        let l = LogLimiter::new(3);
        let t = Instant::now();
        assert_eq!(l.allow(t), Some(0));
        assert_eq!(l.allow(t), Some(0));
        assert_eq!(l.allow(t + Duration::from_millis(500)), Some(0));
        for _ in 0..5 {
            assert_eq!(l.allow(t + Duration::from_millis(900)), None);
        }
        // A new second: the first line says how many were left out.
        assert_eq!(l.allow(t + Duration::from_secs(1)), Some(5));
        assert_eq!(l.allow(t + Duration::from_secs(1)), Some(0));
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

    #[test]
    fn a_hotplug_region_reads_zeros_and_counts_what_the_guest_does() {
        let mut bus = MmioBus::default();
        let count = bus.add_unplugged(1 << 32, 1 << 30);
        let mut b = [0x11u8; 8];
        bus.read((1 << 32) + (1 << 30) - 8, &mut b);
        assert_eq!(b, [0; 8]);
        bus.write(1 << 32, &[0x5a; 8]);
        bus.read(1 << 32, &mut b);
        assert_eq!(b, [0; 8]);
        assert_eq!(bus.unplugged_accesses(), 3);
        // Past the region, and below it: no device, all ones, not counted.
        bus.read((1 << 32) + (1 << 30), &mut b);
        assert_eq!(b, [0xff; 8]);
        bus.read((1 << 32) - 8, &mut b);
        assert_eq!(b, [0xff; 8]);
        assert_eq!(bus.unplugged_accesses(), 3);
        assert_eq!(count.load(Ordering::Relaxed), 3);
    }
}
