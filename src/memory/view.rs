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

use super::guest::GuestMemoryError;
use super::mapping::SliceMapping;

/// The slices' mappings, shared by the `GuestMemory` and its views.
#[derive(Debug)]
pub(crate) struct Mappings(pub(crate) Vec<SliceMapping>);

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
        let mut regions = Vec::with_capacity(mappings.0.len());
        for s in &mappings.0 {
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
