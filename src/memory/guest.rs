//! Guest RAM as one owner: [`GuestMemory`] holds the node slices' mappings
//! ([`SliceMapping`], each unmapped in its `Drop`) in an `Arc` shared with
//! the vm-memory views it hands out ([`GuestView`]), so no view can outlive
//! the memory; it gives the memslots to register, populates (cancellable,
//! with progress) and reclaims. Dropping a `GuestMemory` (and its last view)
//! unmaps it in one thread (the baseline); `reclaim` frees it in parallel
//! first, and refuses while a view is still held.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use super::admission;
pub use super::error::GuestMemoryError;
use super::gmem::{GuestMemfdSource, NumaBinding, PLACEMENT_SAMPLES};
use super::hotplug::{hotplug_parts, HotplugOptions};
use super::layout::ram_regions;
use super::mapping::SliceMapping;
use super::numa::{host_has_node, HostTopology};
use super::options::Backing;
use super::options::{MemoryOptions, NumaPolicy, PageSize};
use super::plan::{partition, NodeSlice, PlanError};
use super::populate::{
    self, PopulateError, PopulateMethod, PopulateProgress, PopulateRange, PopulateStats,
};
use super::progress::{ReclaimProgress, ReclaimReport};
use super::reclaim::{self, HostRange, ReclaimError, ReclaimOptions};
use super::slots::{split_bound, GmemBinding, GuestSlot, MAX_SLOT_BYTES};
use super::uffd::UffdSession;
use super::view::{GuestLease, GuestView, Mappings, PluggedSlots};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
/// The unit of work of populate workers (rounded up to the huge page size).
/// Each `MADV_POPULATE_WRITE` holds the mmap lock for its whole range, and
/// anything that maps (a new API connection's thread stack) waits behind
/// it: measured during a 6 GiB populate of 4 KiB pages, `GET /` on a new
/// connection took up to 1.2 s with 256 MiB chunks, 24–58 ms with 16 MiB,
/// 12–28 ms with 4 MiB, at the same populate speed.
const POPULATE_CHUNK_BYTES: u64 = 4 * MIB;

/// The guest's RAM.
#[derive(Debug)]
pub struct GuestMemory {
    // The view first: it drops before the mappings' own `Arc`.
    view: GuestView,
    mappings: Arc<Mappings>,
    mem_bytes: u64,
    page_size: PageSize,
}

impl GuestMemory {
    /// Partitions guest RAM over the selected nodes (aligned to 1 GiB, or the
    /// hugetlb page size if larger; 2 MiB when RAM is too small for 1 GiB per
    /// node) and maps each slice: anonymous private with `MAP_NORESERVE`, or
    /// memfd stripes mapped shared into one reservation; hugetlb without
    /// `MAP_NORESERVE`, so a host without reserved pages fails here.
    /// Anonymous memory is advised `MADV_HUGEPAGE` (Transparent) or
    /// `MADV_NOHUGEPAGE` (Small); all of it `MADV_DONTDUMP`; then each slice
    /// is bound to its node per `opts.policy` before any page is touched.
    ///
    /// Before anything is mapped, a guest that will be populated, or backed
    /// by hugetlb pages, is admitted only if this process may get that much
    /// memory ([`admission`]). On error everything mapped
    /// so far is unmapped.
    pub fn new(
        opts: &MemoryOptions,
        topology: &HostTopology,
    ) -> Result<GuestMemory, GuestMemoryError> {
        GuestMemory::new_with(opts, topology, None)
    }

    /// [`GuestMemory::new`], with the source of guest_memfd files (the VM)
    /// for guest_memfd backing: each slice is then striped over
    /// guest_memfds as memfd is, and the memslots bind them
    /// ([`GuestMemory::slots`]).
    pub fn new_with(
        opts: &MemoryOptions,
        topology: &HostTopology,
        gmem: Option<&dyn GuestMemfdSource>,
    ) -> Result<GuestMemory, GuestMemoryError> {
        GuestMemory::new_with_hotplug(opts, topology, gmem, None)
    }

    /// [`GuestMemory::new_with`], and the hotplug region of `hotplug_opts`
    /// (virtio-mem) mapped beside RAM the same way, one part per node of
    /// RAM's slices ([`hotplug_parts`]): never populated, in no memslot of
    /// [`GuestMemory::slots`] (its memslots are registered as the guest
    /// plugs it, [`GuestMemory::hotplug_memslots`]), reached through a view
    /// only while plugged ([`PluggedSlots`]), freed and unmapped with RAM.
    pub fn new_with_hotplug(
        opts: &MemoryOptions,
        topology: &HostTopology,
        gmem: Option<&dyn GuestMemfdSource>,
        hotplug_opts: Option<HotplugOptions>,
    ) -> Result<GuestMemory, GuestMemoryError> {
        let map = |slice: &NodeSlice, i: usize| {
            SliceMapping::new(slice, i, opts.backing, opts.page_size, opts.policy, gmem)
        };
        let (mapped, hotplug) = GuestMemory::map_slices(opts, topology, gmem, hotplug_opts, &map)?;
        GuestMemory::assemble(opts, mapped, hotplug, hotplug_opts, None)
    }

    /// Plans, checks and maps RAM's slices with `map` (given each slice
    /// and its index) and the hotplug region's parts as `opts` asks. On
    /// error everything mapped so far is unmapped.
    pub(crate) fn map_slices(
        opts: &MemoryOptions,
        topology: &HostTopology,
        gmem: Option<&dyn GuestMemfdSource>,
        hotplug_opts: Option<HotplugOptions>,
        map: &dyn Fn(&NodeSlice, usize) -> Result<SliceMapping, GuestMemoryError>,
    ) -> Result<(Vec<SliceMapping>, Vec<SliceMapping>), GuestMemoryError> {
        let slices = GuestMemory::plan(opts, topology)?;
        let parts = match hotplug_opts {
            Some(h) => {
                let nodes: Vec<u32> = slices.iter().map(|s| s.node).collect();
                hotplug_parts(&h, opts.mem_bytes, &nodes)?
            }
            None => Vec::new(),
        };
        if opts.policy != NumaPolicy::None {
            // Asked of the kernel (get_mempolicy), so not in the plan, which
            // the event loop computes too.
            let mut nodes: Vec<u32> = slices.iter().map(|s| s.node).collect();
            nodes.dedup();
            if let Some(&n) = nodes.iter().find(|&&n| !host_has_node(n)) {
                return Err(GuestMemoryError::HostLacksNode(n));
            }
        }
        admission::check(opts)?;
        // For the reclaim's count of what the guest owned (the VMM opens it
        // at its start; here for other callers, on a thread that may open
        // /proc files).
        super::pagemap::open();
        if opts.backing == Backing::GuestMemfd && opts.page_size == PageSize::Transparent {
            log::info!(
                "guest_memfd: 4 KiB pages (this kernel offers no transparent huge pages for guest_memfd)"
            );
        }
        let mut mapped = Vec::with_capacity(slices.len());
        for (i, slice) in slices.iter().enumerate() {
            mapped.push(map(slice, i)?);
        }
        let mut hotplug = Vec::with_capacity(parts.len());
        for (i, part) in parts.iter().enumerate() {
            hotplug.push(SliceMapping::new(
                part,
                slices.len() + i,
                opts.backing,
                opts.page_size,
                opts.policy,
                gmem,
            )?);
        }
        if let Some(s) = mapped
            .iter()
            .find(|s| s.numa_binding() == NumaBinding::IgnoredByKernel)
        {
            log::warn!(
                "guest_memfd: this kernel ignores the NUMA policy of guest_memfd files (the mbind of node {}'s slice is not the file's): pages come from the node of the thread that first touches them; populate: true places them with workers pinned to each node",
                s.slice().node
            );
        }
        Ok((mapped, hotplug))
    }

    /// The guest memory of mapped slices, which owns them (and `uffd`,
    /// the userfaultfd they are registered with, if any) from here on.
    pub(crate) fn assemble(
        opts: &MemoryOptions,
        mapped: Vec<SliceMapping>,
        hotplug: Vec<SliceMapping>,
        hotplug_opts: Option<HotplugOptions>,
        uffd: Option<UffdSession>,
    ) -> Result<GuestMemory, GuestMemoryError> {
        let plugged = PluggedSlots::over(&hotplug, hotplug_opts.map_or(1, |h| h.slot_bytes));
        let mappings = Arc::new(Mappings {
            slices: mapped,
            hotplug,
            plugged: Arc::new(plugged),
            lease: Arc::new(()),
            uffd,
        });
        let view = GuestView::new(&mappings)?;
        Ok(GuestMemory {
            view,
            mappings,
            mem_bytes: opts.mem_bytes,
            page_size: opts.page_size,
        })
    }

    /// The slices [`GuestMemory::new`] maps for `opts` on `topology`,
    /// computed without mapping anything and without a system call (what a
    /// reclaim will free, before the memory exists: the event loop asks).
    pub fn plan(
        opts: &MemoryOptions,
        topology: &HostTopology,
    ) -> Result<Vec<NodeSlice>, GuestMemoryError> {
        let nodes = match &opts.host_nodes {
            Some(n) => n.clone(),
            None => topology.nodes_with_memory(),
        };
        if nodes.is_empty() {
            return Err(GuestMemoryError::NoNodes);
        }
        for &n in &nodes {
            if topology.node(n).is_none() {
                return Err(GuestMemoryError::UnknownNode(n));
            }
        }
        let regions = ram_regions(opts.mem_bytes);
        let page = opts.page_size.hugetlb_bytes().unwrap_or(0);
        Ok(match partition(&regions, &nodes, GIB.max(page)) {
            Err(PlanError::TooSmall { .. }) => partition(&regions, &nodes, (2 * MIB).max(page))?,
            other => other?,
        })
    }

    /// A lease for a thread that may make KVM touch guest memory (a vCPU):
    /// while one is held, dropping or reclaiming the memory frees it but
    /// keeps its address range reserved.
    pub fn lease(&self) -> GuestLease {
        GuestLease(self.mappings.lease.clone())
    }

    /// The slices and their mappings, in guest address order.
    pub fn slices(&self) -> &[SliceMapping] {
        &self.mappings.slices
    }

    /// The hotplug region's parts and their mappings, in guest address
    /// order (none without hotplug).
    pub fn hotplug(&self) -> &[SliceMapping] {
        &self.mappings.hotplug
    }

    /// The KVM memslots that map `[guest_addr, guest_addr + len)` of the
    /// hotplug region: one, or one per guest_memfd stripe it crosses (a
    /// memslot binds one file). Empty if the range is not inside one part.
    pub fn hotplug_memslots(&self, guest_addr: u64, len: u64) -> Vec<GuestSlot<'_>> {
        let Some(end) = guest_addr.checked_add(len) else {
            return Vec::new();
        };
        let Some(part) = self.hotplug().iter().find(|p| {
            let s = p.slice();
            s.guest_addr <= guest_addr && end <= s.guest_addr + s.len
        }) else {
            return Vec::new();
        };
        let slice = part.slice();
        let offset = guest_addr - slice.guest_addr;
        let host_addr = part.host_addr() as u64;
        if part.backing() != Backing::GuestMemfd {
            return split_bound(
                &[(guest_addr, len, host_addr + offset, None)],
                MAX_SLOT_BYTES,
            );
        }
        let mut ranges = Vec::new();
        for stripe in part.stripes() {
            let (lo, hi) = (
                offset.max(stripe.offset),
                (offset + len).min(stripe.offset + stripe.len),
            );
            if lo < hi {
                ranges.push((
                    slice.guest_addr + lo,
                    hi - lo,
                    host_addr + lo,
                    Some(GmemBinding {
                        fd: std::os::fd::AsFd::as_fd(&stripe.file),
                        offset: lo - stripe.offset,
                    }),
                ));
            }
        }
        split_bound(&ranges, MAX_SLOT_BYTES)
    }

    /// For a guest restored with the Uffd backend, the connection to its
    /// page fault handler (kept open for the memory's life), for a caller
    /// to poll: its hang-up (`POLLHUP`) says the handler is gone, so no
    /// missing page will be served any more (a thread that touches one
    /// waits for ever). None for other memory.
    pub fn uffd_handler_connection(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        self.mappings.uffd.as_ref()?.handler_connection()
    }

    /// Guest RAM in bytes.
    pub fn mem_bytes(&self) -> u64 {
        self.mem_bytes
    }

    /// The hugetlb page size, for hugetlb backing.
    pub fn hugetlb_page_bytes(&self) -> Option<u64> {
        self.page_size.hugetlb_bytes()
    }

    /// A vm-memory view of guest memory: RAM (for writing the firmware,
    /// boot info and page tables), and the hotplug region's slots while
    /// they are plugged (for devices). It keeps the mappings alive: [`GuestMemory::reclaim`]
    /// refuses ([`ReclaimError::ViewStillHeld`]) while one is held.
    pub fn view(&self) -> GuestView {
        self.view.clone()
    }

    /// The memslots to register with KVM, in guest address order: one per
    /// slice (one per stripe for guest_memfd, since a memslot binds one
    /// file), cut at [`MAX_SLOT_BYTES`] (KVM's limit of 2^31 - 1 pages).
    pub fn slots(&self) -> Vec<GuestSlot<'_>> {
        let mut ranges = Vec::new();
        for s in self.slices() {
            let (guest_addr, len) = (s.slice().guest_addr, s.slice().len);
            let host_addr = s.host_addr() as u64;
            if s.backing() != Backing::GuestMemfd {
                ranges.push((guest_addr, len, host_addr, None));
                continue;
            }
            for stripe in s.stripes() {
                ranges.push((
                    guest_addr + stripe.offset,
                    stripe.len,
                    host_addr + stripe.offset,
                    Some(GmemBinding {
                        fd: std::os::fd::AsFd::as_fd(&stripe.file),
                        offset: 0,
                    }),
                ));
            }
        }
        split_bound(&ranges, MAX_SLOT_BYTES)
    }

    /// Faults in all guest RAM with `workers_per_node` workers per node,
    /// pinned to the node's CPUs (threads `populate-n{node}-{i}`), doing
    /// `MADV_POPULATE_WRITE` on chunks of their node's slices, counting into
    /// `progress`. Workers stop between chunks once `cancel` is set; the
    /// stats then say `cancelled`. A shortage is returned as an error, never
    /// a `SIGBUS` later.
    pub fn populate(
        &self,
        workers_per_node: u32,
        topology: &HostTopology,
        progress: &PopulateProgress,
        cancel: &AtomicBool,
    ) -> Result<PopulateStats, PopulateError> {
        let mut ranges = Vec::new();
        for s in self.slices() {
            let node = s.slice().node;
            if s.backing() != Backing::GuestMemfd {
                ranges.push(PopulateRange::mapped(node, s.host_addr(), s.slice().len));
                continue;
            }
            for stripe in s.stripes() {
                ranges.push(PopulateRange {
                    node,
                    host_addr: s.host_addr() + stripe.offset as usize,
                    len: stripe.len,
                    method: PopulateMethod::Allocate {
                        fd: std::os::fd::AsRawFd::as_raw_fd(&stripe.file),
                        file_offset: 0,
                    },
                });
            }
        }
        let chunk = POPULATE_CHUNK_BYTES.max(self.hugetlb_page_bytes().unwrap_or(0));
        // SAFETY: the ranges are our live, writable mappings (kept alive by
        // `&self`) and their own files; MADV_POPULATE_WRITE and fallocate
        // put pages in without changing any contents a view may have written.
        let stats = unsafe {
            populate::execute(&ranges, chunk, workers_per_node, topology, progress, cancel)
        }?;
        if !stats.cancelled {
            self.check_placement();
        }
        Ok(stats)
    }

    /// After a populate of slices bound to their node: where sampled pages
    /// of each landed, kept per slice and logged where some are elsewhere.
    fn check_placement(&self) {
        for s in self.slices() {
            if s.numa_binding() == NumaBinding::NotAsked {
                continue;
            }
            let p = s.check_placement(PLACEMENT_SAMPLES);
            if p.on_node < p.sampled_pages {
                log::warn!(
                    "node {}'s slice: {} of {} sampled pages are on node {} ({} elsewhere, {} unknown){}",
                    s.slice().node,
                    p.on_node,
                    p.sampled_pages,
                    s.slice().node,
                    p.elsewhere,
                    p.unknown,
                    if s.numa_binding() == NumaBinding::IgnoredByKernel {
                        ": this kernel ignores the NUMA policy of guest_memfd"
                    } else {
                        ""
                    }
                );
            } else {
                log::info!(
                    "node {}'s slice: all {} sampled pages are on its node",
                    s.slice().node,
                    p.sampled_pages
                );
            }
        }
    }

    /// Frees all guest RAM with the reclaim executor, then unmaps it (and
    /// closes the memfds). Refuses with [`ReclaimError::ViewStillHeld`] while
    /// a [`GuestView`] exists: the memory is then unmapped when the last
    /// view drops, nothing leaks. Otherwise always frees: what failed
    /// workers left is freed on the caller's thread, and the mappings are
    /// unmapped whatever happened.
    ///
    /// What the compiler refuses: using guest memory after reclaim (it is
    /// consumed), and changing a slice's mapping (its fields are private):
    ///
    /// ```compile_fail
    /// # use teravm::memory::{GuestMemory, HostTopology, ReclaimOptions, ReclaimProgress};
    /// # fn f(m: GuestMemory, t: &HostTopology) {
    /// let _ = m.reclaim(&ReclaimOptions::default(), t, &ReclaimProgress::new());
    /// let _view = m.view(); // error[E0382]: borrow of moved value: `m`
    /// # }
    /// ```
    ///
    /// ```compile_fail
    /// # use teravm::memory::GuestMemory;
    /// # fn f(m: &GuestMemory) {
    /// let s = &m.slices()[0];
    /// let _ = s.map; // error[E0616]: field `map` of `SliceMapping` is private
    /// # }
    /// ```
    ///
    /// A view held at reclaim is refused at run time:
    ///
    /// ```no_run
    /// # use teravm::memory::*;
    /// # fn f(m: GuestMemory, t: &HostTopology) {
    /// let view = m.view();
    /// let e = m.reclaim(&ReclaimOptions::default(), t, &ReclaimProgress::new());
    /// assert!(matches!(e, Err(ReclaimError::ViewStillHeld { views: 1 })));
    /// drop(view); // unmaps the memory
    /// # }
    /// ```
    pub fn reclaim(
        self,
        opts: &ReclaimOptions,
        topology: &HostTopology,
        progress: &ReclaimProgress,
    ) -> Result<ReclaimReport, ReclaimError> {
        let GuestMemory {
            view,
            mappings,
            page_size,
            ..
        } = self;
        drop(view);
        let views = Arc::strong_count(&mappings).saturating_sub(1);
        let Some(mappings) = Arc::into_inner(mappings) else {
            return Err(ReclaimError::ViewStillHeld { views });
        };
        let mut mappings = mappings;
        if let Some(uffd) = mappings.uffd.take() {
            // Unregistered first: with UFFD_FEATURE_EVENT_REMOVE, an
            // MADV_DONTNEED of a registered range waits for the handler
            // to read its event, which a dead handler never does.
            uffd.close();
        }
        let ranges: Vec<HostRange> = mappings
            .slices
            .iter()
            .chain(&mappings.hotplug)
            .flat_map(|s| s.free_ranges())
            .collect();
        let mut opts = opts.clone();
        if let Some(page) = page_size.hugetlb_bytes() {
            // Huge pages are only freed whole.
            let chunk = opts.chunk_bytes_for(&ranges);
            opts.chunk_bytes = Some(chunk.max(1).div_ceil(page).saturating_mul(page));
        }
        // SAFETY: the ranges are the mappings we now own alone (no view is
        // left, and `mappings` is ours by value); discarding their contents
        // is what reclaim is for. The calls themselves cannot touch memory
        // outside those ranges.
        let result = unsafe { reclaim::execute(&ranges, &opts, topology, progress) };
        let (reserved, unmapped) = mappings.release();
        let unmapped =
            unmapped.map(|(addr, len, source)| ReclaimError::Unmap { addr, len, source });
        match (result, unmapped) {
            (Err(e), _) | (Ok(_), Some(e)) => Err(e),
            (Ok(mut report), None) => {
                report.reserved_bytes = reserved;
                Ok(report)
            }
        }
    }
}

#[cfg(test)]
#[path = "guest_tests.rs"]
mod tests;
