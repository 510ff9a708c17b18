//! The vm-memory view of guest RAM ([`GuestView`]) that cannot outlive the
//! mappings: every region of the view carries, as its vm-memory "bitmap", a
//! clone of the `Arc` that owns the mappings. Cloning the view, one of its
//! regions, or a slice taken from it keeps the mappings alive, so no safe
//! code can read guest RAM after it was unmapped; `GuestMemory::reclaim`
//! takes the mappings back only when no view is left.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use vm_memory::bitmap::{Bitmap, BitmapSlice, WithBitmapSlice};
use vm_memory::mmap::MmapRegionBuilder;
use vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestRegionMmap};

use super::error::GuestMemoryError;
use super::mapping::SliceMapping;

/// The slices' mappings, shared by the `GuestMemory` and its views. When
/// the last owner drops them while a [`GuestLease`] is held (a vCPU thread
/// that did not stop), each range is freed and kept reserved instead of
/// unmapped ([`SliceMapping::reserve`]): nothing else may be mapped where a
/// guest may still write.
#[derive(Debug)]
pub(crate) struct Mappings {
    pub(crate) slices: Vec<SliceMapping>,
    /// The hotplug region's parts (virtio-mem): mapped with RAM, freed and
    /// unmapped with it, in memslots and reachable through a view only
    /// while plugged ([`PluggedSlots`]).
    pub(crate) hotplug: Vec<SliceMapping>,
    /// Which of the region's slots devices may reach.
    pub(crate) plugged: Arc<PluggedSlots>,
    pub(crate) lease: Arc<()>,
    /// The userfaultfd the slices are registered with and the handler's
    /// connection (a guest restored with the uffd backend), kept for the
    /// memory's life; dropped after the slices are unmapped.
    pub(crate) uffd: Option<super::uffd::UffdSession>,
}

/// The hotplug region's slots as devices see them (virtio-mem): a slot's
/// memory is reachable through a [`GuestView`] only while its flag is set.
/// The sink sets it once the slot is in KVM and clears it before the slot
/// leaves KVM, then waits for every device pass that may have found the
/// slot to end ([`crate::devices::virtio::quiesce`]) before anything of it
/// is freed: devices follow the plugged memslots as KVM does.
#[derive(Debug)]
pub struct PluggedSlots {
    /// First guest physical address of the region.
    base: u64,
    /// The memslot size.
    slot_bytes: u64,
    /// One flag per slot, in address order.
    plugged: Box<[AtomicBool]>,
}

impl PluggedSlots {
    /// No hotplug region.
    fn none() -> PluggedSlots {
        PluggedSlots {
            base: 0,
            slot_bytes: 1,
            plugged: Box::new([]),
        }
    }

    /// Slot `i`'s index for a guest address in the region, if it is.
    fn index(&self, addr: u64) -> Option<usize> {
        let i = addr.checked_sub(self.base)? / self.slot_bytes;
        (i < self.plugged.len() as u64).then_some(i as usize)
    }

    /// Devices may reach the slot holding `guest_addr` (after it entered
    /// KVM) or may not (before it leaves); false if the address is not in
    /// the region.
    pub fn set(&self, guest_addr: u64, plugged: bool) -> bool {
        match self.index(guest_addr) {
            Some(i) => {
                // SeqCst: a device pass that starts after a clear is
                // ordered after it (see `quiesce`).
                self.plugged[i].store(plugged, Ordering::SeqCst);
                true
            }
            None => false,
        }
    }

    /// Whether devices may reach the slot holding `guest_addr`.
    pub fn is_plugged(&self, guest_addr: u64) -> bool {
        self.index(guest_addr)
            .is_some_and(|i| self.plugged[i].load(Ordering::SeqCst))
    }

    /// The slots of `slot_bytes` over the hotplug `parts` (contiguous, in
    /// address order, each a whole number of slots), all unplugged.
    pub(crate) fn over(parts: &[SliceMapping], slot_bytes: u64) -> PluggedSlots {
        let (Some(first), Some(last)) = (parts.first(), parts.last()) else {
            return PluggedSlots::none();
        };
        let base = first.slice().guest_addr;
        let end = last.slice().guest_addr + last.slice().len;
        let slot_bytes = slot_bytes.max(1);
        PluggedSlots {
            base,
            slot_bytes,
            plugged: (0..(end - base).div_ceil(slot_bytes))
                .map(|_| AtomicBool::new(false))
                .collect(),
        }
    }
}

impl Mappings {
    /// Whether a [`GuestLease`] is still held.
    pub(crate) fn leased(&self) -> bool {
        Arc::strong_count(&self.lease) > 1
    }

    /// Unmaps every slice, or, while a lease is held, reserves it; returns
    /// the bytes kept reserved and the first `munmap` failure.
    pub(crate) fn release(&mut self) -> (u64, Option<(usize, u64, std::io::Error)>) {
        let leased = self.leased();
        let mut reserved = 0;
        let mut failed = None;
        let mut all = std::mem::take(&mut self.slices);
        all.append(&mut self.hotplug);
        for s in all {
            if leased {
                reserved += s.slice().len;
                if let Err(e) = s.reserve() {
                    log::error!(
                        "cannot reserve guest memory while a vCPU may run: {e}; left mapped"
                    );
                }
            } else if let Err(e) = s.unmap() {
                failed.get_or_insert(e);
            }
        }
        if reserved > 0 {
            log::warn!(
                "a vCPU thread did not stop: {} MiB of guest address space kept reserved until exit",
                reserved >> 20
            );
        }
        (reserved, failed)
    }
}

impl Drop for Mappings {
    fn drop(&mut self) {
        if let (_, Some((addr, len, e))) = self.release() {
            log::warn!("munmap of {addr:#x}+{len:#x} failed: {e}");
        }
    }
}

/// Held by each vCPU thread for as long as it may enter the guest (its vCPU
/// fd keeps the VM and its memslots alive): while one is held, guest memory
/// is never unmapped, only freed and kept reserved until exit.
#[derive(Debug, Clone)]
pub struct GuestLease(
    // Never read: holding it is its whole job.
    #[allow(dead_code)] pub(crate) Arc<()>,
);

impl GuestLease {
    /// A lease on no teravm guest memory (tests that map memory of their
    /// own).
    pub fn unbound() -> GuestLease {
        GuestLease(Arc::new(()))
    }
}

/// Keeps the mappings alive: the "dirty bitmap" of every view region, which
/// tracks nothing (no dirty logging) but owns a clone of the `Arc`.
#[derive(Debug, Clone)]
pub struct MappingsAlive(
    // Never read: holding it is its whole job.
    #[allow(dead_code)] Arc<Mappings>,
);

impl WithBitmapSlice<'_> for MappingsAlive {
    type S = Self;
}

impl BitmapSlice for MappingsAlive {}

impl Bitmap for MappingsAlive {
    fn mark_dirty(&self, _offset: usize, _len: usize) {}

    fn dirty_at(&self, _offset: usize) -> bool {
        false
    }

    fn slice_at(&self, _offset: usize) -> Self {
        self.clone()
    }
}

/// What a [`GuestView`] reaches: guest RAM, and each slot of the hotplug
/// region while it is plugged ([`PluggedSlots`]). Every access a device
/// makes (vm-memory's `Bytes`, `get_slice`, the queues' rings) finds its
/// region through [`GuestMemoryBackend::find_region`], so a buffer in
/// unplugged memory is an invalid guest address to the device (an error
/// to the guest), never a fault in teravm.
///
/// [`GuestMemoryBackend::iter`] yields RAM's regions only: what iterates
/// (the balloon's map of RAM, made once at activation) must not take a
/// slot for RAM that may be unplugged after.
#[derive(Debug)]
pub struct ViewMemory {
    ram: GuestMemoryMmap<MappingsAlive>,
    /// One region per slot of the hotplug region, in address order.
    slots: Vec<GuestRegionMmap<MappingsAlive>>,
    plugged: Arc<PluggedSlots>,
}

impl ViewMemory {
    /// Guest RAM alone (the firmware, boot info, page tables, a kernel).
    pub fn ram(&self) -> &GuestMemoryMmap<MappingsAlive> {
        &self.ram
    }

    /// Which slots of the hotplug region this view reaches now.
    pub fn plugged(&self) -> &Arc<PluggedSlots> {
        &self.plugged
    }
}

impl GuestMemoryBackend for ViewMemory {
    type R = GuestRegionMmap<MappingsAlive>;

    fn num_regions(&self) -> usize {
        self.ram.num_regions()
    }

    fn find_region(&self, addr: GuestAddress) -> Option<&Self::R> {
        let plugged = &self.plugged;
        match plugged.index(addr.0) {
            Some(i) if plugged.plugged[i].load(Ordering::SeqCst) => self.slots.get(i),
            Some(_) => None,
            None => self.ram.find_region(addr),
        }
    }

    fn iter(&self) -> impl Iterator<Item = &Self::R> {
        self.ram.iter()
    }
}

/// A vm-memory view of guest memory (RAM for the firmware, boot info, page
/// tables; RAM and plugged hotplug memory for devices), which keeps the
/// mappings alive as long as it (or anything cloned from it) exists.
#[derive(Debug, Clone)]
pub struct GuestView {
    mem: Arc<ViewMemory>,
}

impl std::ops::Deref for GuestView {
    type Target = ViewMemory;

    fn deref(&self) -> &Self::Target {
        &self.mem
    }
}

/// A region over `len` bytes of a live mapping at `host_addr`, placed at
/// `guest_addr`.
fn region(
    mappings: &Arc<Mappings>,
    s: &SliceMapping,
    host_addr: u64,
    guest_addr: u64,
    len: u64,
) -> Result<GuestRegionMmap<MappingsAlive>, GuestMemoryError> {
    let flags = if s.stripes().is_empty() {
        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS
    } else {
        libc::MAP_SHARED
    };
    let builder = MmapRegionBuilder::new_with_bitmap(len as usize, MappingsAlive(mappings.clone()))
        .with_mmap_prot(libc::PROT_READ | libc::PROT_WRITE)
        .with_mmap_flags(flags);
    // SAFETY: the range lies inside the slice's live mapping (the caller
    // takes it from `s`), readable and writable; the region holds (in its
    // bitmap) an `Arc` of the mappings, so the mapping outlives the region.
    let raw = unsafe { builder.with_raw_mmap_pointer(host_addr as *mut u8) }
        .build()
        .map_err(|e| GuestMemoryError::View(e.to_string()))?;
    GuestRegionMmap::new(raw, GuestAddress(guest_addr))
        .ok_or_else(|| GuestMemoryError::View("guest address overflows".into()))
}

impl GuestView {
    /// Guest RAM alone, as vm-memory's own type.
    pub fn mem(&self) -> &GuestMemoryMmap<MappingsAlive> {
        self.mem.ram()
    }

    /// A view over `mappings`: one region per RAM slice, one per slot of
    /// the hotplug region (reached only while plugged).
    pub(crate) fn new(mappings: &Arc<Mappings>) -> Result<GuestView, GuestMemoryError> {
        let mut regions = Vec::with_capacity(mappings.slices.len());
        for s in &mappings.slices {
            let (g, len) = (s.slice().guest_addr, s.slice().len);
            regions.push(region(mappings, s, s.host_addr() as u64, g, len)?);
        }
        let ram = GuestMemoryMmap::from_regions(regions)
            .map_err(|e| GuestMemoryError::View(e.to_string()))?;
        let plugged = &mappings.plugged;
        let mut slots = Vec::with_capacity(plugged.plugged.len());
        for i in 0..plugged.plugged.len() as u64 {
            let g = plugged.base + i * plugged.slot_bytes;
            let part = mappings
                .hotplug
                .iter()
                .find(|p| (p.slice().guest_addr..p.slice().guest_addr + p.slice().len).contains(&g))
                .ok_or_else(|| GuestMemoryError::View(format!("slot {g:#x} in no part")))?;
            let off = g - part.slice().guest_addr;
            let len = plugged
                .slot_bytes
                .min(part.slice().guest_addr + part.slice().len - g);
            slots.push(region(
                mappings,
                part,
                part.host_addr() as u64 + off,
                g,
                len,
            )?);
        }
        Ok(GuestView {
            mem: Arc::new(ViewMemory {
                ram,
                slots,
                plugged: plugged.clone(),
            }),
        })
    }
}
