//! The executor of a write or a load: the ranges cut into chunks, one
//! queue per node, drained by workers pinned to their node; per chunk the
//! data extents are found and copied with positioned I/O.

use std::fs::File;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use super::super::numa::HostTopology;
use super::super::pagemap;
use super::super::plan::{default_chunk_bytes, largest_node_bytes, plan_chunks, Chunk};
use super::super::sys;
use super::super::workers::{run_pinned, ChunkQueues, WorkerFailure};
use super::io::{data_extents, pread_exact, pwrite_all, Extents};
use super::{
    MemoryFileError, MemoryFileNode, MemoryFileOptions, MemoryFileReport, MAX_WORKERS_PER_NODE,
};

/// Where the data of a range is found when it is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Source {
    /// Private anonymous memory: its present or swapped pages that are not
    /// the zero page (`PAGEMAP_SCAN`), else what `mincore` calls resident.
    Anonymous,
    /// A memory file mapped at the range from its offset 0 (memfd): its
    /// data extents (`SEEK_DATA`), else (a file without `SEEK_DATA`) what
    /// `mincore` calls resident in the mapping.
    File {
        /// The file.
        fd: RawFd,
    },
    /// What `mincore` calls resident in the mapping (hugetlb memfd, whose
    /// `SEEK_DATA` calls all of it data; guest_memfd, which has none).
    Resident,
    /// Every page that does not read zero, read through the mapping: a
    /// restored guest's memory (a memory file mapped private, or a
    /// userfaultfd's), whose untouched pages are not in memory yet. Reading
    /// them faults them in (from the file, or served by the handler).
    Whole,
}

/// A host range of guest RAM and its place in the memory file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct CopyRange {
    pub node: u32,
    pub host_addr: usize,
    pub len: u64,
    pub file_offset: u64,
    pub source: Source,
}

/// Which way the bytes go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Direction {
    /// Guest memory to the file.
    Write,
    /// The file to guest memory.
    Load,
}

pub(super) fn check(opts: &MemoryFileOptions) -> Result<(), MemoryFileError> {
    if opts.workers_per_node == 0 || opts.workers_per_node > MAX_WORKERS_PER_NODE {
        return Err(MemoryFileError::InvalidOptions(format!(
            "workers_per_node is {}, not 1 to {MAX_WORKERS_PER_NODE}",
            opts.workers_per_node
        )));
    }
    if opts.chunk_bytes == Some(0) {
        return Err(MemoryFileError::InvalidOptions("chunk_bytes is 0".into()));
    }
    Ok(())
}

/// Per-node counters the workers add to.
struct NodeCount {
    bytes: AtomicU64,
    extents: AtomicU64,
}

/// Copies `ranges` between guest memory and `file` (`file_bytes` long) as
/// `dir` says, with `opts.workers_per_node` workers per node.
///
/// # Safety
/// Every range is a live mapping (and its `Source::File` descriptor a live
/// file) of the caller for the whole call; for a load, writable, and never
/// borrowed as a Rust reference meanwhile.
pub(super) unsafe fn execute(
    ranges: &[CopyRange],
    file: &File,
    dir: Direction,
    opts: &MemoryFileOptions,
    topology: &HostTopology,
    file_bytes: u64,
) -> Result<MemoryFileReport, MemoryFileError> {
    let page = sys::page_size() as u64;
    let plan_in: Vec<(u32, u64)> = ranges.iter().map(|r| (r.node, r.len)).collect();
    let largest = largest_node_bytes(plan_in.iter().copied());
    let chunk_bytes = opts
        .chunk_bytes
        .unwrap_or_else(|| default_chunk_bytes(largest, opts.workers_per_node))
        .div_ceil(page)
        .saturating_mul(page);
    let plan = plan_chunks(&plan_in, chunk_bytes);
    let queues = ChunkQueues::new(&plan);
    let counts: Vec<NodeCount> = plan
        .queues
        .iter()
        .map(|_| NodeCount {
            bytes: AtomicU64::new(0),
            extents: AtomicU64::new(0),
        })
        .collect();
    let stop = AtomicBool::new(false);
    let nodes: Vec<u32> = plan.queues.iter().map(|q| q.node).collect();
    let prefix = match dir {
        Direction::Write => "memsave",
        Direction::Load => "memload",
    };
    let started = Instant::now();
    let failed = run_pinned(prefix, &nodes, opts.workers_per_node, topology, |w| {
        let mut buf = Vec::new();
        // Own queue only: a chunk of another node would be read there.
        while let Some(claim) = queues.take(w.queue, false) {
            if stop.load(Ordering::Relaxed) {
                claim.give_up();
                break;
            }
            let range = &ranges[claim.chunk.range];
            let copy = ChunkCopy {
                worker: &w.name,
                range,
                chunk: claim.chunk,
                file,
            };
            // SAFETY: the range is the caller's live mapping (our contract).
            let done = unsafe {
                match dir {
                    Direction::Write => copy.write(&mut buf),
                    Direction::Load => copy.load(),
                }
            };
            match done {
                Ok((bytes, extents)) => {
                    claim.done();
                    // Its own queue's chunk: its node's counters.
                    let c = &counts[w.queue];
                    c.bytes.fetch_add(bytes, Ordering::Relaxed);
                    c.extents.fetch_add(extents, Ordering::Relaxed);
                }
                Err(e) => {
                    claim.give_up();
                    stop.store(true, Ordering::Relaxed);
                    return Err(e);
                }
            }
        }
        Ok(())
    });
    let elapsed = started.elapsed();
    let report = MemoryFileReport {
        file_bytes,
        copied_bytes: counts.iter().map(|c| c.bytes.load(Ordering::Relaxed)).sum(),
        nodes: plan
            .queues
            .iter()
            .zip(&counts)
            .map(|(q, c)| MemoryFileNode {
                node: q.node,
                slice_bytes: q.bytes,
                copied_bytes: c.bytes.load(Ordering::Relaxed),
                extents: c.extents.load(Ordering::Relaxed),
            })
            .collect(),
        workers: opts.workers_per_node * nodes.len() as u32,
        workers_per_node: opts.workers_per_node,
        chunk_bytes,
        elapsed,
    };
    if failed.is_empty() {
        return Ok(report);
    }
    let errors = failed
        .into_iter()
        .map(|f| match f {
            WorkerFailure::Failed { error, .. } => error,
            WorkerFailure::Spawn { name, error } => MemoryFileError::Spawn {
                worker: name,
                source: error,
            },
            WorkerFailure::Panicked { name, message } => MemoryFileError::Panicked {
                worker: name,
                message,
            },
        })
        .collect();
    Err(MemoryFileError::Workers {
        errors,
        report: Box::new(report),
    })
}

/// One chunk to copy, by one worker.
struct ChunkCopy<'a> {
    worker: &'a str,
    range: &'a CopyRange,
    chunk: Chunk,
    file: &'a File,
}

impl ChunkCopy<'_> {
    fn extents_error(
        &self,
        what: &'static str,
        at: u64,
        len: u64,
    ) -> impl Fn(std::io::Error) -> MemoryFileError + '_ {
        move |source| MemoryFileError::Extents {
            worker: self.worker.to_string(),
            node: self.range.node,
            what,
            at,
            len,
            source,
        }
    }

    /// Writes the chunk's data to the file; returns (bytes, extents).
    ///
    /// # Safety
    /// The range is a live, readable mapping.
    unsafe fn write(&self, buf: &mut Vec<u8>) -> Result<(u64, u64), MemoryFileError> {
        let r = self.range;
        let addr = r.host_addr + self.chunk.offset as usize;
        let len = self.chunk.len;
        let (mut bytes, mut extents) = (0u64, 0u64);
        let mut write_error = None;
        // Called with host addresses inside the chunk.
        let mut put = |start: u64, end: u64| -> std::io::Result<()> {
            let file_offset = r.file_offset + (start - r.host_addr as u64);
            // SAFETY: `start..end` lies in the chunk, inside the caller's
            // live readable mapping.
            unsafe { pwrite_all(self.file, start as usize, end - start, file_offset) }.map_err(
                |source| {
                    let e = std::io::Error::new(source.kind(), "write failed");
                    write_error = Some(MemoryFileError::Write {
                        worker: self.worker.to_string(),
                        node: r.node,
                        file_offset,
                        len: end - start,
                        source,
                    });
                    e
                },
            )?;
            bytes += end - start;
            extents += 1;
            Ok(())
        };
        let scanned = match r.source {
            Source::Anonymous => match pagemap::data_ranges(addr, len as usize, &mut put) {
                Some(result) => result.map_err(|e| ("PAGEMAP_SCAN", addr as u64, e)),
                None => sys::resident_ranges(addr, len as usize, buf, &mut put)
                    .map_err(|e| ("mincore", addr as u64, e)),
            },
            Source::File { fd } => {
                // The file is mapped from its offset 0 at the range.
                let base = r.host_addr as u64;
                let off = self.chunk.offset;
                let mut put_file = |s: u64, e: u64| put(base + s, base + e);
                match data_extents(fd, off, off + len, &mut put_file) {
                    Ok(Extents::Walked) => Ok(()),
                    // A file without SEEK_DATA: its pages in core.
                    Ok(Extents::Unsupported) => {
                        sys::resident_ranges(addr, len as usize, buf, &mut put)
                            .map_err(|e| ("mincore", addr as u64, e))
                    }
                    Err(e) => Err(("lseek(SEEK_DATA)", off, e)),
                }
            }
            Source::Resident => sys::resident_ranges(addr, len as usize, buf, &mut put)
                .map_err(|e| ("mincore", addr as u64, e)),
            Source::Whole => {
                // SAFETY: the chunk lies in the caller's live readable mapping.
                let found = unsafe { nonzero_ranges(addr, len, &mut put) };
                found.map_err(|e| ("read", addr as u64, e))
            }
        };
        if let Some(e) = write_error {
            return Err(e);
        }
        scanned.map_err(|(what, at, e)| self.extents_error(what, at, len)(e))?;
        Ok((bytes, extents))
    }

    /// Reads the file's data extents of the chunk into guest memory;
    /// returns (bytes, extents).
    ///
    /// # Safety
    /// The range is a live, writable mapping that no Rust reference borrows.
    unsafe fn load(&self) -> Result<(u64, u64), MemoryFileError> {
        let r = self.range;
        let start = r.file_offset + self.chunk.offset;
        let end = start + self.chunk.len;
        let (mut bytes, mut extents) = (0u64, 0u64);
        let mut read_error = None;
        let mut get = |s: u64, e: u64| -> std::io::Result<()> {
            let dst = r.host_addr + (s - r.file_offset) as usize;
            // SAFETY: `s..e` lies in the chunk's part of the file, so `dst`
            // lies in the chunk, inside the caller's live writable mapping.
            unsafe { pread_exact(self.file, dst, e - s, s) }.map_err(|source| {
                let err = std::io::Error::new(source.kind(), "read failed");
                read_error = Some(MemoryFileError::Read {
                    worker: self.worker.to_string(),
                    node: r.node,
                    file_offset: s,
                    len: e - s,
                    source,
                });
                err
            })?;
            bytes += e - s;
            extents += 1;
            Ok(())
        };
        let walked = data_extents(self.file.as_raw_fd(), start, end, &mut get);
        let walked = match walked {
            // A file system without SEEK_DATA: all of it is data.
            Ok(Extents::Unsupported) => get(start, end).map(|()| Extents::Walked),
            other => other,
        };
        if let Some(e) = read_error {
            return Err(e);
        }
        walked.map_err(|e| self.extents_error("lseek(SEEK_DATA)", start, self.chunk.len)(e))?;
        Ok((bytes, extents))
    }
}

/// Calls `put(start, end)` for each run of pages of `addr..addr + len`
/// (page-aligned) that do not read all zero, in address order.
///
/// # Safety
/// The range is a live, readable mapping.
unsafe fn nonzero_ranges(
    addr: usize,
    len: u64,
    put: &mut dyn FnMut(u64, u64) -> std::io::Result<()>,
) -> std::io::Result<()> {
    let page = sys::page_size();
    let end = addr + len as usize;
    let mut run: Option<usize> = None;
    let mut at = addr;
    while at < end {
        let words = (at..at + page).step_by(8);
        // SAFETY: each word lies in the page at `at`, inside the live
        // readable range (our contract); read volatile, never borrowed.
        let zero = words
            .into_iter()
            .all(|w| unsafe { std::ptr::read_volatile(w as *const u64) } == 0);
        match (zero, run) {
            (false, None) => run = Some(at),
            (true, Some(s)) => {
                put(s as u64, at as u64)?;
                run = None;
            }
            _ => {}
        }
        at += page;
    }
    if let Some(s) = run {
        put(s as u64, end as u64)?;
    }
    Ok(())
}
