//! The memory file of a snapshot: guest RAM written to a file in
//! Firecracker's layout, sparse and in parallel per NUMA node, and read
//! back eagerly the same way.
//!
//! What it owns: the layout ([`GuestMemory::memory_file_regions`]: each
//! RAM slice, in guest address order, at the file offset that is the sum of
//! the RAM before it, so the offsets are contiguous from 0 and the file is
//! the size of RAM, as Firecracker's `GuestMemoryExtension::dump` writes it
//! and its `GuestRegionUffdMapping.offset` counts it); the write
//! ([`GuestMemory::write_memory_file`]), which writes only where the guest
//! has memory (the present or swapped pages of anonymous memory, from
//! `PAGEMAP_SCAN`, or `mincore` where the kernel lacks it; the data
//! extents of memfd and guest_memfd files, from `SEEK_DATA`/`SEEK_HOLE`, or
//! `mincore` of the mapping where the file has no `SEEK_DATA`) and leaves
//! holes elsewhere; and the eager load ([`GuestMemory::load_memory_file`]),
//! which reads the file's data extents into a freshly mapped guest and
//! leaves its holes untouched (unpopulated, reading zero).
//!
//! Threads: both run scoped workers per node (`memsave-n{node}-{i}`,
//! `memload-n{node}-{i}`), pinned to the node's CPUs, so each node's slice
//! is read (write) or first touched (load) on its node. Workers take
//! chunks of their own node's ranges only (no stealing, which would read a
//! slice from another node) from the atomic queues of
//! `memory/workers.rs` (as populate and reclaim), and add their bytes to per-node atomic counters;
//! the first failure sets a shared stop flag, and the failures and panics
//! come back at join, one per worker at most. The I/O is positioned
//! (`pwrite`, `pread`), so workers share the file without a lock.
//!
//! A restored guest's memory ([`GuestMemory::from_snapshot`], in `load.rs`)
//! is built three ways ([`SnapshotMemory`]): the file mapped private
//! (lazy), a userfaultfd served by a page fault handler
//! ([`crate::memory::uffd`]), or the eager load. A snapshot of such a guest
//! reads all of its memory through the mapping (its untouched pages are
//! still in the file or with the handler), writing holes only where a page
//! reads zero.
//!
//! What issue 36 builds on it: `PUT /snapshot/create` writes the file
//! after pausing the guest, and the state file records
//! [`GuestMemory::memory_file_regions`]; `PUT /snapshot/load` with
//! `"memory_load": "Eager"` maps a fresh guest of the state's layout and
//! calls the load. Not here: the API, the state file, the atomic
//! appearance of the files (a temporary name renamed when whole), diff
//! snapshots, cancellation, and
//! the hotplug region (Firecracker's file carries its regions after RAM).

mod exec;
mod io;
mod load;

#[cfg(test)]
mod load_tests;
#[cfg(test)]
mod tests;

use std::fs::File;
use std::time::Duration;

use super::guest::GuestMemory;
use super::mapping::Contents;
use super::numa::HostTopology;
use super::options::Backing;
use super::plan::NodeSlice;
use exec::{execute, CopyRange, Direction, Source};
pub use load::{check_regions, RestoreError, SnapshotMemory};

/// Most workers per node a write or a load may run.
pub const MAX_WORKERS_PER_NODE: u32 = 64;

/// Errors of writing or loading a memory file.
#[derive(Debug, thiserror::Error)]
pub enum MemoryFileError {
    /// The options cannot be used.
    #[error("invalid memory file options: {0}")]
    InvalidOptions(String),
    /// The memory file could not be sized to guest RAM.
    #[error("cannot size the memory file to {len} bytes: {source}")]
    Resize {
        /// The size asked for.
        len: u64,
        /// Why.
        source: std::io::Error,
    },
    /// The memory file's size could not be read.
    #[error("cannot read the memory file's size: {0}")]
    Metadata(std::io::Error),
    /// The memory file is not the size of guest RAM.
    #[error("the memory file holds {file_bytes} bytes, guest RAM is {mem_bytes} bytes")]
    SizeMismatch {
        /// The file's length.
        file_bytes: u64,
        /// Guest RAM.
        mem_bytes: u64,
    },
    /// Writing guest memory into the file failed (a full disk: `ENOSPC`).
    #[error("{worker}: writing {len:#x} bytes of node {node}'s memory at memory file offset {file_offset:#x} failed: {source}")]
    Write {
        /// The worker thread.
        worker: String,
        /// The node of the slice.
        node: u32,
        /// Where in the file.
        file_offset: u64,
        /// How many bytes the write was to put there.
        len: u64,
        /// Why.
        source: std::io::Error,
    },
    /// Reading the file into guest memory failed.
    #[error("{worker}: reading {len:#x} bytes at memory file offset {file_offset:#x} into node {node}'s memory failed: {source}")]
    Read {
        /// The worker thread.
        worker: String,
        /// The node of the slice.
        node: u32,
        /// Where in the file.
        file_offset: u64,
        /// How many bytes.
        len: u64,
        /// Why.
        source: std::io::Error,
    },
    /// Finding where the data is failed: `PAGEMAP_SCAN` or `mincore` of
    /// guest memory, or `lseek(SEEK_DATA)` of a memory file.
    #[error("{worker}: {what} at {at:#x}+{len:#x} (node {node}) failed: {source}")]
    Extents {
        /// The worker thread.
        worker: String,
        /// The node of the slice.
        node: u32,
        /// The call.
        what: &'static str,
        /// Host address (a scan of memory) or file offset (a seek).
        at: u64,
        /// The length looked at.
        len: u64,
        /// Why.
        source: std::io::Error,
    },
    /// A worker thread could not be started.
    #[error("cannot start {worker}: {source}")]
    Spawn {
        /// The worker thread.
        worker: String,
        /// Why.
        source: std::io::Error,
    },
    /// A worker panicked.
    #[error("{worker} panicked: {message}")]
    Panicked {
        /// The worker thread.
        worker: String,
        /// The panic's text.
        message: String,
    },
    /// Workers failed (at most one failure each: a worker stops at its
    /// first, and the others at their next chunk). The file is incomplete.
    #[error("the memory file is incomplete: {}", errors.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("; "))]
    Workers {
        /// What failed, one per failed worker (each a `Write`, `Read`,
        /// `Extents`, `Spawn` or `Panicked`).
        errors: Vec<MemoryFileError>,
        /// What was done before they stopped.
        report: Box<MemoryFileReport>,
    },
}

/// How a write or a load runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryFileOptions {
    /// Worker threads per node (1 to [`MAX_WORKERS_PER_NODE`]).
    pub workers_per_node: u32,
    /// The unit of work (rounded up to whole pages); `None`: sized from the
    /// largest node's bytes and the workers as reclaim's default
    /// ([`super::plan::default_chunk_bytes`]: 4 chunks per worker, 2 MiB to
    /// 1 GiB).
    pub chunk_bytes: Option<u64>,
}

impl Default for MemoryFileOptions {
    /// 2 workers per node (reclaim's default), chunks sized from the guest.
    fn default() -> Self {
        MemoryFileOptions {
            workers_per_node: 2,
            chunk_bytes: None,
        }
    }
}

/// What one node's workers did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryFileNode {
    /// The host node.
    pub node: u32,
    /// Bytes of guest RAM on it.
    pub slice_bytes: u64,
    /// Bytes written to (read from) the file.
    pub copied_bytes: u64,
    /// Data extents copied (each one `pwrite`/`pread` or more).
    pub extents: u64,
}

/// What a write or a load did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryFileReport {
    /// The file's size: all of guest RAM.
    pub file_bytes: u64,
    /// Bytes written (read) in all: what the guest had, not its size.
    pub copied_bytes: u64,
    /// Per node, in node order.
    pub nodes: Vec<MemoryFileNode>,
    /// Worker threads in all.
    pub workers: u32,
    /// Worker threads per node.
    pub workers_per_node: u32,
    /// The chunk the workers took.
    pub chunk_bytes: u64,
    /// From the start of the workers to their join.
    pub elapsed: Duration,
}

/// One RAM slice's place in the memory file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileRegion {
    /// The slice (its node, guest address and length).
    pub slice: NodeSlice,
    /// Offset of its first byte in the memory file.
    pub file_offset: u64,
}

/// The file offset of each slice (given in guest address order): the RAM
/// before it, so contiguous from 0. Pure.
pub fn file_regions(slices: &[NodeSlice]) -> Vec<FileRegion> {
    let mut offset = 0u64;
    slices
        .iter()
        .map(|&slice| {
            let r = FileRegion {
                slice,
                file_offset: offset,
            };
            offset += slice.len;
            r
        })
        .collect()
}

impl GuestMemory {
    /// Where each RAM slice lies in the memory file (Firecracker's layout:
    /// guest address order, contiguous from 0), for the state file and the
    /// uffd message.
    pub fn memory_file_regions(&self) -> Vec<FileRegion> {
        let slices: Vec<NodeSlice> = self.slices().iter().map(|s| s.slice()).collect();
        file_regions(&slices)
    }

    /// The ranges the workers copy: one per anonymous slice, one per
    /// memfd or guest_memfd stripe, each with its file offset and where
    /// its data is found.
    fn copy_ranges(&self) -> Vec<CopyRange> {
        let regions = self.memory_file_regions();
        let hugetlb = self.hugetlb_page_bytes().is_some();
        let mut ranges = Vec::new();
        for (s, r) in self.slices().iter().zip(&regions) {
            let node = s.slice().node;
            if s.stripes().is_empty() {
                ranges.push(CopyRange {
                    node,
                    host_addr: s.host_addr(),
                    len: s.slice().len,
                    file_offset: r.file_offset,
                    source: match s.contents() {
                        Contents::Own => Source::Anonymous,
                        Contents::MemoryFile | Contents::Userfault => Source::Whole,
                    },
                });
                continue;
            }
            for stripe in s.stripes() {
                // hugetlbfs answers SEEK_DATA with the whole file, and
                // guest_memfd has no `llseek`: the pages in their page
                // cache (`mincore` of the mapping) are what they hold.
                let resident = (hugetlb && s.backing() == Backing::Memfd)
                    || s.backing() == Backing::GuestMemfd;
                let source = if resident {
                    Source::Resident
                } else {
                    Source::File {
                        fd: std::os::fd::AsRawFd::as_raw_fd(&stripe.file),
                    }
                };
                ranges.push(CopyRange {
                    node,
                    host_addr: s.host_addr() + stripe.offset as usize,
                    len: stripe.len,
                    file_offset: r.file_offset + stripe.offset,
                    source,
                });
            }
        }
        ranges
    }

    /// Writes guest RAM to `file` (opened for writing) in Firecracker's
    /// memory-file layout: the file is emptied and sized to RAM, then each
    /// node's workers write the data of their node's slices where it lies
    /// ([`GuestMemory::memory_file_regions`]), leaving
    /// holes where the guest has no memory. The guest must not run meanwhile
    /// (a paused guest), or the file holds a torn copy.
    ///
    /// The file is emptied first because what is not written must read
    /// zero; a file that a lazily loaded guest maps must not be given (its
    /// unread pages would go).
    pub fn write_memory_file(
        &self,
        file: &File,
        opts: &MemoryFileOptions,
        topology: &HostTopology,
    ) -> Result<MemoryFileReport, MemoryFileError> {
        exec::check(opts)?;
        let len = self.mem_bytes();
        for l in [0, len] {
            file.set_len(l)
                .map_err(|source| MemoryFileError::Resize { len: l, source })?;
        }
        let ranges = self.copy_ranges();
        // SAFETY: the ranges are our own live mappings and files, kept
        // alive by `&self` for the call; a write only reads them.
        unsafe { execute(&ranges, file, Direction::Write, opts, topology, len) }
    }

    /// Reads a memory file written by [`GuestMemory::write_memory_file`]
    /// (or Firecracker) into this guest memory, freshly mapped with the
    /// same RAM size: each node's workers read the data extents of their
    /// slices' part of the file into their node's memory; holes are left
    /// untouched, so they stay unpopulated (and read zero in a fresh
    /// memory). The guest must not run meanwhile.
    pub fn load_memory_file(
        &self,
        file: &File,
        opts: &MemoryFileOptions,
        topology: &HostTopology,
    ) -> Result<MemoryFileReport, MemoryFileError> {
        exec::check(opts)?;
        let file_bytes = file.metadata().map_err(MemoryFileError::Metadata)?.len();
        let mem_bytes = self.mem_bytes();
        if file_bytes != mem_bytes {
            return Err(MemoryFileError::SizeMismatch {
                file_bytes,
                mem_bytes,
            });
        }
        let ranges = self.copy_ranges();
        // SAFETY: the ranges are our own live, writable mappings, kept
        // alive by `&self`; guest memory is only reached through raw
        // pointers and volatile accesses (views), never a Rust reference,
        // so the kernel's writes into it alias nothing.
        unsafe { execute(&ranges, file, Direction::Load, opts, topology, mem_bytes) }
    }
}
