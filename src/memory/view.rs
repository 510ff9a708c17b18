//! The vm-memory view of guest RAM ([`GuestView`]) that cannot outlive the
//! mappings: every region of the view carries, as its vm-memory "bitmap", a
//! clone of the `Arc` that owns the mappings. Cloning the view, one of its
//! regions, or a slice taken from it keeps the mappings alive, so no safe
//! code can read guest RAM after it was unmapped; `GuestMemory::reclaim`
//! takes the mappings back only when no view is left.

use std::sync::Arc;

use vm_memory::bitmap::{Bitmap, BitmapSlice, WithBitmapSlice};
use vm_memory::mmap::MmapRegionBuilder;
use vm_memory::{GuestAddress, GuestMemoryMmap, GuestRegionMmap};

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
    /// unmapped with it, but in no view ([`GuestView`] covers RAM only) and
    /// in memslots only while plugged.
    pub(crate) hotplug: Vec<SliceMapping>,
    pub(crate) lease: Arc<()>,
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

/// A vm-memory view of guest RAM (for the firmware, boot info, page tables,
/// devices), which keeps the mappings alive as long as it (or anything
/// cloned from it) exists.
#[derive(Debug, Clone)]
pub struct GuestView {
    mem: GuestMemoryMmap<MappingsAlive>,
}

impl std::ops::Deref for GuestView {
    type Target = GuestMemoryMmap<MappingsAlive>;

    fn deref(&self) -> &Self::Target {
        &self.mem
    }
}

impl GuestView {
    /// The vm-memory guest memory.
    pub fn mem(&self) -> &GuestMemoryMmap<MappingsAlive> {
        &self.mem
    }

    /// A view over `mappings`: one region per slice.
    pub(crate) fn new(mappings: &Arc<Mappings>) -> Result<GuestView, GuestMemoryError> {
        let mut regions = Vec::with_capacity(mappings.slices.len());
        for s in &mappings.slices {
            let flags = if s.stripes().is_empty() {
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS
            } else {
                libc::MAP_SHARED
            };
            let builder = MmapRegionBuilder::new_with_bitmap(
                s.slice().len as usize,
                MappingsAlive(mappings.clone()),
            )
            .with_mmap_prot(libc::PROT_READ | libc::PROT_WRITE)
            .with_mmap_flags(flags);
            // SAFETY: the range is the slice's live mapping of exactly this
            // length, readable and writable; the region holds (in its bitmap)
            // an `Arc` of the mappings, so the mapping outlives the region.
            let raw = unsafe { builder.with_raw_mmap_pointer(s.host_addr() as *mut u8) }
                .build()
                .map_err(|e| GuestMemoryError::View(e.to_string()))?;
            let region = GuestRegionMmap::new(raw, GuestAddress(s.slice().guest_addr))
                .ok_or_else(|| GuestMemoryError::View("guest address overflows".into()))?;
            regions.push(region);
        }
        let mem = GuestMemoryMmap::from_regions(regions)
            .map_err(|e| GuestMemoryError::View(e.to_string()))?;
        Ok(GuestView { mem })
    }
}
