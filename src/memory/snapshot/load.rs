//! Guest memory for a restored microVM ([`GuestMemory::from_snapshot`]),
//! three ways ([`SnapshotMemory`]): the memory file mapped private, lazily
//! (Firecracker's `File` backend); anonymous memory filled by a page fault
//! handler over userfaultfd (Firecracker's `Uffd` backend,
//! [`crate::memory::uffd`]); or anonymous memory read eagerly, per node, by
//! [`GuestMemory::load_memory_file`]. All three keep the per-node slices of
//! a fresh guest ([`GuestMemory::plan`]), bound to their nodes, so memslots,
//! views and the parallel reclaim use them unchanged.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::PathBuf;

use super::super::error::GuestMemoryError;
use super::super::guest::GuestMemory;
use super::super::layout::ram_regions;
use super::super::mapping::{Contents, SliceMapping};
use super::super::numa::HostTopology;
use super::super::options::{Backing, MemoryOptions};
use super::super::plan::NodeSlice;
use super::super::uffd::{GuestRegionUffdMapping, UffdError, UffdSession};
use super::{FileRegion, MemoryFileError, MemoryFileOptions};

/// Where a restored guest's memory comes from.
#[derive(Debug)]
pub enum SnapshotMemory {
    /// The memory file (opened for reading), each slice mapped
    /// `MAP_PRIVATE` from its offset: pages are read as the guest touches
    /// them, writes are copies of its own (the file never changes).
    /// Firecracker's default. The file must stay unchanged for the guest's
    /// life.
    Lazy(File),
    /// Anonymous memory as at a start, then the file read into each node's
    /// slices by that node's workers.
    Eager {
        /// The memory file (opened for reading).
        file: File,
        /// Worker threads per node (1 to [`super::MAX_WORKERS_PER_NODE`]).
        workers_per_node: u32,
    },
    /// Anonymous memory registered with a userfaultfd, given to the page
    /// fault handler listening on a Unix socket (Firecracker's protocol).
    Uffd {
        /// The handler's socket.
        handler: PathBuf,
        /// `/dev/userfaultfd` (read-write), where this root has one: the
        /// userfaultfd is made from it, else by `userfaultfd(2)`.
        device: Option<File>,
    },
}

/// Errors of building a restored guest's memory.
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    /// Only anonymous backing is restored.
    #[error("a snapshot is restored into anonymous memory only, not {0:?} backing")]
    Backing(Backing),
    /// hugetlb pages cannot map a regular file.
    #[error("a lazily loaded memory file cannot be mapped with {} MiB hugetlb pages; use memory_load \"Eager\" or the Uffd backend", page >> 20)]
    LazyHugePages {
        /// The page size.
        page: u64,
    },
    /// The state's regions are not Firecracker's layout of this guest's RAM.
    #[error("the snapshot's memory regions do not match the configured RAM of {mem_bytes} bytes: {reason}")]
    Regions {
        /// Configured RAM.
        mem_bytes: u64,
        /// What differs.
        reason: String,
    },
    /// The memory file is shorter than the guest's RAM.
    #[error("the memory file holds {file_bytes} bytes, less than the snapshot's {mem_bytes} bytes of guest RAM")]
    FileTooShort {
        /// The file's length.
        file_bytes: u64,
        /// Guest RAM.
        mem_bytes: u64,
    },
    /// The memory file's size could not be read.
    #[error("cannot read the memory file's size: {0}")]
    Metadata(std::io::Error),
    /// Mapping guest memory failed.
    #[error(transparent)]
    Memory(#[from] GuestMemoryError),
    /// The eager load failed.
    #[error("loading the memory file: {0}")]
    Load(#[from] MemoryFileError),
    /// The userfaultfd or its handler.
    #[error(transparent)]
    Uffd(#[from] UffdError),
}

/// Checks `regions` (from the state file) against `mem_bytes` of RAM: in
/// guest address order, each at the file offset of the RAM before it
/// (contiguous from 0), together exactly RAM's regions. Pure.
pub fn check_regions(regions: &[FileRegion], mem_bytes: u64) -> Result<(), RestoreError> {
    let bad = |reason: String| RestoreError::Regions { mem_bytes, reason };
    let mut offset = 0u64;
    let mut merged: Vec<(u64, u64)> = Vec::new();
    for (i, r) in regions.iter().enumerate() {
        let (g, len) = (r.slice.guest_addr, r.slice.len);
        if r.file_offset != offset {
            return Err(bad(format!(
                "region {i} (guest {g:#x}+{len:#x}) is at file offset {:#x}, not {offset:#x}",
                r.file_offset
            )));
        }
        match merged.last_mut() {
            Some((start, l)) if *start + *l == g => *l += len,
            Some((start, l)) if *start + *l > g => {
                return Err(bad(format!("region {i} (guest {g:#x}) is out of order")))
            }
            _ => merged.push((g, len)),
        }
        offset = offset
            .checked_add(len)
            .ok_or_else(|| bad("overflow".into()))?;
    }
    let ram: Vec<(u64, u64)> = ram_regions(mem_bytes)
        .iter()
        .map(|r| (r.guest_addr, r.len))
        .collect();
    if merged != ram {
        return Err(bad(format!(
            "they cover {merged:#x?}, the configured RAM is {ram:#x?}"
        )));
    }
    Ok(())
}

/// The file offset of each planned slice: the RAM before it (the layout
/// [`check_regions`] accepted).
fn offsets(slices: &[NodeSlice]) -> Vec<u64> {
    super::file_regions(slices)
        .iter()
        .map(|r| r.file_offset)
        .collect()
}

/// Maps `slice` private from `file` at `offset` (`MAP_NORESERVE`): its
/// pages are the file's until written.
fn map_private(
    file: &File,
    slice: &NodeSlice,
    offset: u64,
) -> Result<SliceMapping, GuestMemoryError> {
    let err = |source| GuestMemoryError::Mmap {
        node: slice.node,
        len: slice.len,
        source,
    };
    let len = usize::try_from(slice.len)
        .map_err(|_| err(std::io::Error::from_raw_os_error(libc::ENOMEM)))?;
    let off = libc::off_t::try_from(offset)
        .map_err(|_| err(std::io::Error::from_raw_os_error(libc::EOVERFLOW)))?;
    // SAFETY: no MAP_FIXED, so the kernel picks a free range and nothing of
    // ours is replaced; the descriptor is a live file.
    let addr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_NORESERVE,
            file.as_raw_fd(),
            off,
        )
    };
    if addr == libc::MAP_FAILED {
        return Err(err(std::io::Error::last_os_error()));
    }
    // SAFETY: the fresh mapping just made, which nothing else owns.
    Ok(unsafe { SliceMapping::adopt(slice, addr as usize, Contents::MemoryFile) })
}

impl GuestMemory {
    /// The memory of a guest restored from a snapshot whose memory file
    /// holds `regions` (as [`GuestMemory::memory_file_regions`] gave them
    /// when it was written, kept in the state file), laid out and bound
    /// per node as `opts` asks on `topology` (which may differ from the
    /// snapshot's host: the file offsets follow guest addresses), its
    /// contents from `source`. Anonymous backing only; no hotplug region.
    ///
    /// On error nothing is left: no mapping, descriptor or thread.
    pub fn from_snapshot(
        opts: &MemoryOptions,
        topology: &HostTopology,
        regions: &[FileRegion],
        source: SnapshotMemory,
    ) -> Result<GuestMemory, RestoreError> {
        if opts.backing != Backing::Anonymous {
            return Err(RestoreError::Backing(opts.backing));
        }
        check_regions(regions, opts.mem_bytes)?;
        let file_long_enough = |file: &File| -> Result<(), RestoreError> {
            let file_bytes = file.metadata().map_err(RestoreError::Metadata)?.len();
            if file_bytes < opts.mem_bytes {
                return Err(RestoreError::FileTooShort {
                    file_bytes,
                    mem_bytes: opts.mem_bytes,
                });
            }
            Ok(())
        };
        let offsets = offsets(&GuestMemory::plan(opts, topology)?);
        match source {
            SnapshotMemory::Lazy(file) => {
                if let Some(page) = opts.page_size.hugetlb_bytes() {
                    return Err(RestoreError::LazyHugePages { page });
                }
                file_long_enough(&file)?;
                let map = |slice: &NodeSlice, i: usize| {
                    map_private(&file, slice, offsets[i])?.settle(opts.page_size, opts.policy)
                };
                let (mapped, hotplug) = GuestMemory::map_slices(opts, topology, None, None, &map)?;
                Ok(GuestMemory::assemble(opts, mapped, hotplug, None, None)?)
            }
            SnapshotMemory::Eager {
                file,
                workers_per_node,
            } => {
                file_long_enough(&file)?;
                let mem = GuestMemory::new_with_hotplug(opts, topology, None, None)?;
                let load = MemoryFileOptions {
                    workers_per_node,
                    chunk_bytes: None,
                };
                let report = mem
                    .load_memory_file(&file, &load, topology)
                    .map_err(RestoreError::Load)?;
                log::info!(
                    "memory file loaded: {} MiB of {} MiB in {:?} by {} workers",
                    report.copied_bytes >> 20,
                    report.file_bytes >> 20,
                    report.elapsed,
                    report.workers
                );
                Ok(mem)
            }
            SnapshotMemory::Uffd {
                handler: path,
                device,
            } => {
                let mut uffd = UffdSession::new(device.as_ref())?;
                let map = |slice: &NodeSlice, i: usize| {
                    SliceMapping::new(slice, i, opts.backing, opts.page_size, opts.policy, None)
                };
                let (mut mapped, hotplug) =
                    GuestMemory::map_slices(opts, topology, None, None, &map)?;
                let page = opts
                    .page_size
                    .hugetlb_bytes()
                    .unwrap_or(super::super::sys::page_size() as u64)
                    as usize;
                let mut messages = Vec::with_capacity(mapped.len());
                for (s, &offset) in mapped.iter_mut().zip(&offsets) {
                    let (addr, len) = (s.host_addr(), s.slice().len as usize);
                    uffd.register(addr, len)?;
                    s.set_contents(Contents::Userfault);
                    messages.push(GuestRegionUffdMapping {
                        base_host_virt_addr: addr as u64,
                        size: len,
                        offset,
                        page_size: page,
                        page_size_kib: page,
                    });
                }
                uffd.handshake(&path, &messages)?;
                Ok(GuestMemory::assemble(
                    opts,
                    mapped,
                    hotplug,
                    None,
                    Some(uffd),
                )?)
            }
        }
    }
}
