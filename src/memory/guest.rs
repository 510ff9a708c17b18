//! Guest RAM: one host mapping per node slice (anonymous, memfd, hugetlb),
//! advised for (transparent) huge pages and bound to its node with `mbind`
//! before any page is touched; a non-owning vm-memory view over the same
//! mappings; populate and reclaim over them. Dropping a `GuestMemory`
//! unmaps it in one thread (the baseline); `reclaim` frees it in parallel.

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};
use std::path::Path;

use vm_memory::{GuestAddress, GuestMemoryMmap, GuestRegionMmap, MmapRegion};

use super::layout::ram_regions;
use super::numa::HostTopology;
use super::plan::{partition, NodeSlice, PlanError};
use super::populate::{self, PopulateError, PopulateStats};
use super::progress::{ReclaimProgress, ReclaimReport};
use super::reclaim::{self, FreeMethod, HostRange, ReclaimError, ReclaimOptions};
use super::sys;
use crate::config::{Backing, HugePages, MachineConfig, MemoryConfig, NumaPolicy};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
/// The unit of work of populate workers (rounded up to the huge page size).
const POPULATE_CHUNK_BYTES: u64 = 256 * MIB;

/// Errors setting up guest memory.
#[derive(Debug, thiserror::Error)]
pub enum GuestMemoryError {
    /// Guest RAM cannot be split over the selected nodes.
    #[error("cannot place guest memory: {0}")]
    Plan(#[from] PlanError),
    /// No node of the topology has memory.
    #[error("no host node has memory")]
    NoNodes,
    /// A selected node is not in the host topology.
    #[error("host node {0} is not in the host topology")]
    UnknownNode(u32),
    /// A selected node does not exist on this host, so it cannot be bound.
    #[error("host node {0} does not exist on this host, so memory cannot be bound to it (choose existing nodes or numa_policy \"none\")")]
    HostLacksNode(u32),
    /// `memfd_create` failed.
    #[error("memfd_create for the slice of node {node} failed: {source}")]
    Memfd {
        /// The slice's node.
        node: u32,
        /// Why.
        source: std::io::Error,
    },
    /// The memfd could not be sized.
    #[error("cannot size the memfd of node {node} to {len} bytes: {source}")]
    Truncate {
        /// The slice's node.
        node: u32,
        /// The size.
        len: u64,
        /// Why.
        source: std::io::Error,
    },
    /// `mmap` failed.
    #[error("mmap of {len} bytes for node {node} failed: {source}")]
    Mmap {
        /// The slice's node.
        node: u32,
        /// The size.
        len: u64,
        /// Why.
        source: std::io::Error,
    },
    /// hugetlb pages could not be reserved.
    #[error("cannot map {len} bytes of {} MiB huge pages for node {node}: {source}; reserve huge pages on the host (/sys/kernel/mm/hugepages/hugepages-{}kB/nr_hugepages) or use huge_pages \"None\" or \"Transparent\"", page >> 20, page >> 10)]
    HugePages {
        /// The slice's node.
        node: u32,
        /// The size.
        len: u64,
        /// The huge page size.
        page: u64,
        /// Why.
        source: std::io::Error,
    },
    /// `madvise` (huge page advice) failed.
    #[error("madvise({advice}) of the slice of node {node} failed: {source}")]
    Madvise {
        /// The slice's node.
        node: u32,
        /// Which advice.
        advice: &'static str,
        /// Why.
        source: std::io::Error,
    },
    /// `mbind` failed.
    #[error("mbind of the slice of node {node} failed: {source}")]
    Mbind {
        /// The slice's node.
        node: u32,
        /// Why.
        source: std::io::Error,
    },
    /// The vm-memory view could not be built.
    #[error("cannot build the guest memory view: {0}")]
    View(String),
}

/// One node slice and the host mapping behind it.
#[derive(Debug)]
pub struct SliceMapping {
    /// The slice of guest RAM.
    pub slice: NodeSlice,
    /// Host virtual address of its mapping (0 once unmapped).
    pub host_addr: usize,
    /// The memfd behind it, for memfd backing.
    pub memfd: Option<File>,
}

/// Mappings made so far, unmapped on drop unless taken.
struct Mapped(Vec<SliceMapping>);

impl Drop for Mapped {
    fn drop(&mut self) {
        unmap_all(&mut self.0);
    }
}

fn unmap_all(slices: &mut [SliceMapping]) -> Option<ReclaimError> {
    let mut first = None;
    for s in slices.iter_mut().filter(|s| s.host_addr != 0) {
        // SAFETY: the mapping was made by us with this length, and its owner
        // (the GuestMemory or the construction in progress) is done with it.
        let ret = unsafe { libc::munmap(s.host_addr as *mut libc::c_void, s.slice.len as usize) };
        if ret != 0 && first.is_none() {
            first = Some(ReclaimError::Unmap {
                addr: s.host_addr,
                len: s.slice.len,
                source: std::io::Error::last_os_error(),
            });
        }
        s.host_addr = 0;
        s.memfd = None;
    }
    first
}

/// The guest's RAM.
pub struct GuestMemory {
    slices: Vec<SliceMapping>,
    view: GuestMemoryMmap,
    mem_bytes: u64,
    hugetlb_page_bytes: Option<u64>,
}

impl std::fmt::Debug for GuestMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GuestMemory")
            .field("slices", &self.slices)
            .field("mem_bytes", &self.mem_bytes)
            .field("hugetlb_page_bytes", &self.hugetlb_page_bytes)
            .finish()
    }
}

fn host_has_node(node: u32) -> bool {
    let dir = Path::new("/sys/devices/system/node");
    dir.join(format!("node{node}")).is_dir() || (node == 0 && !dir.is_dir())
}

impl GuestMemory {
    /// Partitions guest RAM over the selected nodes (aligned to 1 GiB, or the
    /// hugetlb page size if larger; 2 MiB when RAM is too small for 1 GiB per
    /// node) and maps each slice: anonymous private with `MAP_NORESERVE`, or
    /// one memfd per slice mapped shared; hugetlb without `MAP_NORESERVE`, so
    /// a host without reserved pages fails here. Anonymous memory is advised
    /// `MADV_HUGEPAGE` (Transparent) or `MADV_NOHUGEPAGE` (None); then each
    /// slice is bound to its node per `memory.numa_policy` before any page is
    /// touched. On error everything mapped so far is unmapped.
    pub fn new(
        machine: &MachineConfig,
        memory: &MemoryConfig,
        topology: &HostTopology,
    ) -> Result<GuestMemory, GuestMemoryError> {
        let mem_bytes = machine.mem_bytes();
        let hugetlb = machine.huge_pages.hugetlb_page_bytes();
        let nodes = match &memory.host_nodes {
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
            if memory.numa_policy != NumaPolicy::None && !host_has_node(n) {
                return Err(GuestMemoryError::HostLacksNode(n));
            }
        }
        let regions = ram_regions(mem_bytes);
        let page = hugetlb.unwrap_or(0);
        let slices = match partition(&regions, &nodes, GIB.max(page)) {
            Err(PlanError::TooSmall { .. }) => partition(&regions, &nodes, (2 * MIB).max(page))?,
            other => other?,
        };

        let mut mapped = Mapped(Vec::with_capacity(slices.len()));
        for (i, slice) in slices.iter().enumerate() {
            let m = map_slice(slice, i, memory.backing, machine.huge_pages)?;
            mapped.0.push(m);
            let m = mapped.0.last().map(|m| m.host_addr).unwrap_or(0);
            let (node, len) = (slice.node, slice.len as usize);
            if memory.backing == Backing::Anonymous && hugetlb.is_none() {
                let (advice, name) = if machine.huge_pages == HugePages::None {
                    (libc::MADV_NOHUGEPAGE, "MADV_NOHUGEPAGE")
                } else {
                    (libc::MADV_HUGEPAGE, "MADV_HUGEPAGE")
                };
                // SAFETY: our fresh mapping; huge page advice keeps contents.
                unsafe { sys::madvise(m, len, advice) }.map_err(|source| {
                    GuestMemoryError::Madvise {
                        node,
                        advice: name,
                        source,
                    }
                })?;
            }
            let mode = match memory.numa_policy {
                NumaPolicy::Bind => Some(libc::MPOL_BIND),
                NumaPolicy::Preferred => Some(libc::MPOL_PREFERRED),
                NumaPolicy::None => None,
            };
            if let Some(mode) = mode {
                sys::mbind(m, len, mode, node)
                    .map_err(|source| GuestMemoryError::Mbind { node, source })?;
            }
        }

        let flags = |s: &SliceMapping| {
            if s.memfd.is_some() {
                libc::MAP_SHARED
            } else {
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS
            }
        };
        let mut regions = Vec::with_capacity(mapped.0.len());
        for s in &mapped.0 {
            // SAFETY: the range is our live mapping with these protections and
            // flags, and it outlives the view (both live in the GuestMemory,
            // and the mappings are only unmapped when it is dropped or consumed).
            let raw = unsafe {
                MmapRegion::build_raw(
                    s.host_addr as *mut u8,
                    s.slice.len as usize,
                    libc::PROT_READ | libc::PROT_WRITE,
                    flags(s),
                )
            }
            .map_err(|e| GuestMemoryError::View(e.to_string()))?;
            let region = GuestRegionMmap::new(raw, GuestAddress(s.slice.guest_addr))
                .ok_or_else(|| GuestMemoryError::View("guest address overflows".into()))?;
            regions.push(region);
        }
        let view = GuestMemoryMmap::from_regions(regions)
            .map_err(|e| GuestMemoryError::View(e.to_string()))?;
        Ok(GuestMemory {
            slices: std::mem::take(&mut mapped.0),
            view,
            mem_bytes,
            hugetlb_page_bytes: hugetlb,
        })
    }

    /// The slices and their mappings, in guest address order.
    pub fn slices(&self) -> &[SliceMapping] {
        &self.slices
    }

    /// Guest RAM in bytes.
    pub fn mem_bytes(&self) -> u64 {
        self.mem_bytes
    }

    /// The hugetlb page size, for hugetlb backing.
    pub fn hugetlb_page_bytes(&self) -> Option<u64> {
        self.hugetlb_page_bytes
    }

    /// A vm-memory view over the same mappings (non-owning), for writing the
    /// firmware, boot info and page tables.
    pub fn vm_memory(&self) -> &GuestMemoryMmap {
        &self.view
    }

    /// Faults in all guest RAM with `workers_per_node` workers per node,
    /// pinned to the node's CPUs (threads `populate-n{node}-{i}`), doing
    /// `MADV_POPULATE_WRITE` on chunks of their node's slices. A shortage is
    /// returned as an error, never a `SIGBUS` later.
    pub fn populate(
        &self,
        workers_per_node: u32,
        topology: &HostTopology,
    ) -> Result<PopulateStats, PopulateError> {
        let ranges: Vec<_> = self
            .slices
            .iter()
            .map(|s| (s.slice.node, s.host_addr, s.slice.len))
            .collect();
        let chunk = POPULATE_CHUNK_BYTES.max(self.hugetlb_page_bytes.unwrap_or(0));
        // SAFETY: the slices are our live writable mappings.
        unsafe { populate::execute(&ranges, chunk, workers_per_node, topology) }
    }

    /// Frees all guest RAM with the reclaim executor, then unmaps it (and
    /// closes the memfds). Always frees: what failed workers left is freed on
    /// the caller's thread, and the mappings are unmapped whatever happened.
    pub fn reclaim(
        mut self,
        opts: &ReclaimOptions,
        topology: &HostTopology,
        progress: &ReclaimProgress,
    ) -> Result<ReclaimReport, ReclaimError> {
        let ranges: Vec<HostRange> = self
            .slices
            .iter()
            .map(|s| HostRange {
                node: s.slice.node,
                host_addr: s.host_addr,
                len: s.slice.len,
                method: match &s.memfd {
                    Some(f) => FreeMethod::PunchHole {
                        fd: f.as_raw_fd(),
                        file_offset: 0,
                    },
                    None => FreeMethod::DontNeed,
                },
            })
            .collect();
        let mut opts = opts.clone();
        if let Some(page) = self.hugetlb_page_bytes {
            // Huge pages are only freed whole.
            opts.chunk_bytes = opts.chunk_bytes.max(1).div_ceil(page).saturating_mul(page);
        }
        // SAFETY: the ranges are our live mappings; `self` is consumed, so
        // nothing else (the view included) can touch them any more.
        let result = unsafe { reclaim::execute(&ranges, &opts, topology, progress) };
        let unmapped = unmap_all(&mut self.slices);
        match (result, unmapped) {
            (Err(e), _) | (Ok(_), Some(e)) => Err(e),
            (Ok(report), None) => Ok(report),
        }
    }
}

impl Drop for GuestMemory {
    /// Unmaps whatever is still mapped, in one thread (the `munmap` baseline).
    fn drop(&mut self) {
        if let Some(e) = unmap_all(&mut self.slices) {
            log::warn!("dropping guest memory: {e}");
        }
    }
}

/// Maps one slice.
fn map_slice(
    slice: &NodeSlice,
    index: usize,
    backing: Backing,
    huge_pages: HugePages,
) -> Result<SliceMapping, GuestMemoryError> {
    let (node, len) = (slice.node, slice.len);
    let hugetlb = huge_pages.hugetlb_page_bytes();
    let huge_flag = match huge_pages {
        HugePages::Huge2M => libc::MAP_HUGE_2MB,
        HugePages::Huge1G => libc::MAP_HUGE_1GB,
        HugePages::None | HugePages::Transparent => 0,
    };
    let map_error = |source: std::io::Error| match hugetlb {
        Some(page) => GuestMemoryError::HugePages {
            node,
            len,
            page,
            source,
        },
        None => GuestMemoryError::Mmap { node, len, source },
    };
    let memfd = match backing {
        Backing::Anonymous => None,
        Backing::Memfd => {
            let name =
                std::ffi::CString::new(format!("teravm-n{node}-{index}")).unwrap_or_default();
            let mut flags = libc::MFD_CLOEXEC;
            if hugetlb.is_some() {
                flags |= libc::MFD_HUGETLB | huge_flag as libc::c_uint;
            }
            // SAFETY: `name` is NUL-terminated; no memory of ours is touched.
            let fd = unsafe { libc::memfd_create(name.as_ptr(), flags) };
            if fd < 0 {
                let source = std::io::Error::last_os_error();
                return Err(match hugetlb {
                    Some(page) => GuestMemoryError::HugePages {
                        node,
                        len,
                        page,
                        source,
                    },
                    None => GuestMemoryError::Memfd { node, source },
                });
            }
            // SAFETY: `fd` is a fresh descriptor that nothing else owns.
            let file = unsafe { File::from_raw_fd(fd) };
            file.set_len(len)
                .map_err(|source| GuestMemoryError::Truncate { node, len, source })?;
            Some(file)
        }
    };
    let mut flags = match &memfd {
        Some(_) => libc::MAP_SHARED,
        None => libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
    };
    if hugetlb.is_some() {
        if memfd.is_none() {
            flags |= libc::MAP_HUGETLB | huge_flag;
        }
    } else {
        flags |= libc::MAP_NORESERVE;
    }
    let fd = memfd.as_ref().map(|f| f.as_raw_fd()).unwrap_or(-1);
    let Ok(size) = usize::try_from(len) else {
        return Err(map_error(std::io::Error::from_raw_os_error(libc::ENOMEM)));
    };
    // SAFETY: a new mapping at an address the kernel picks; nothing existing
    // is replaced.
    let addr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            flags,
            fd,
            0,
        )
    };
    if addr == libc::MAP_FAILED {
        return Err(map_error(std::io::Error::last_os_error()));
    }
    Ok(SliceMapping {
        slice: *slice,
        host_addr: addr as usize,
        memfd,
    })
}

#[cfg(test)]
#[path = "guest_tests.rs"]
mod tests;
