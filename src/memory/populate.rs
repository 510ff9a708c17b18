//! The populate executor, the mirror of reclaim: per-node workers pinned to
//! their node fault in their node's slices with `MADV_POPULATE_WRITE` (or
//! allocate them in their guest_memfd with `fallocate`), one chunk at a time, so that a shortage (`ENOMEM`, missing huge pages) is an
//! error now rather than a `SIGBUS` in the guest later. The first failure
//! stops all workers.
//!
//! A populate is a cancellable job: workers add each chunk to a
//! [`PopulateProgress`] (atomics another thread reads while it runs) and
//! check a cancel flag between chunks, so a shutdown during a long populate
//! ends it within one chunk per worker.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use super::numa::HostTopology;
use super::plan::plan_chunks;
use super::sys;
use super::workers::{run_pinned, ChunkQueues};

/// Errors of populate.
#[derive(Debug, thiserror::Error)]
pub enum PopulateError {
    /// The options cannot be used.
    #[error("invalid populate options: {0}")]
    InvalidOptions(String),
    /// Some memory could not be faulted in.
    #[error("populating guest memory failed: {}", .0.join("; "))]
    Failed(Vec<String>),
}

/// Progress of a populate, readable from another thread while it runs.
#[derive(Debug, Default)]
pub struct PopulateProgress {
    total: AtomicU64,
    done: AtomicU64,
}

impl PopulateProgress {
    /// Nothing to do yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Bytes of address space populated so far.
    pub fn bytes_done(&self) -> u64 {
        self.done.load(Ordering::Relaxed)
    }

    /// Bytes to populate in all (0 until the populate begins).
    pub fn total_bytes(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }
}

/// Statistics of a populate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PopulateStats {
    /// Wall time.
    pub elapsed_ms: u64,
    /// Address space populated, in bytes.
    pub bytes: u64,
    /// Worker threads.
    pub workers: u32,
    /// Host nodes.
    pub nodes: u32,
    /// Stopped early by the cancel flag (`bytes` then counts what was done).
    pub cancelled: bool,
}

/// A host range to populate.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PopulateRange {
    /// The node whose workers populate it.
    pub node: u32,
    /// Host address of its first byte.
    pub host_addr: usize,
    /// Its length.
    pub len: u64,
    /// How.
    pub method: PopulateMethod,
}

/// How a range is populated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PopulateMethod {
    /// `madvise(MADV_POPULATE_WRITE)`: faulted in through the mapping.
    PopulateWrite,
    /// `fallocate(FALLOC_FL_KEEP_SIZE)` of the file at `file_offset`
    /// (guest_memfd): the pages are allocated in the file without teravm
    /// mapping them, and the kernel zeroes each where it is first used.
    /// Measured here on 2 GiB: 340 ms with one thread against 1,000–1,170
    /// ms for `MADV_POPULATE_WRITE`, 170 ms with two threads on one file;
    /// and the reclaim then has no page table entries of teravm's to zap.
    Allocate {
        /// The file.
        fd: std::os::fd::RawFd,
        /// Offset of the range's first byte in it.
        file_offset: u64,
    },
}

impl PopulateRange {
    /// A range faulted in through the mapping.
    pub(crate) fn mapped(node: u32, host_addr: usize, len: u64) -> PopulateRange {
        PopulateRange {
            node,
            host_addr,
            len,
            method: PopulateMethod::PopulateWrite,
        }
    }
}

/// Faults in every page of `ranges` for writing, with `workers_per_node`
/// pinned workers per node taking chunks of `chunk_bytes`, counting into
/// `progress`, stopping between chunks once `cancel` is set.
///
/// # Safety
/// Every range is a live, writable mapping owned by the caller.
pub(crate) unsafe fn execute(
    ranges: &[PopulateRange],
    chunk_bytes: u64,
    workers_per_node: u32,
    topology: &HostTopology,
    progress: &PopulateProgress,
    cancel: &AtomicBool,
) -> Result<PopulateStats, PopulateError> {
    if workers_per_node == 0 {
        return Err(PopulateError::InvalidOptions(
            "workers_per_node is 0".into(),
        ));
    }
    let page = sys::page_size() as u64;
    let chunk_bytes = chunk_bytes.max(1).div_ceil(page).saturating_mul(page);
    let plan = plan_chunks(
        &ranges.iter().map(|r| (r.node, r.len)).collect::<Vec<_>>(),
        chunk_bytes,
    );
    let nodes: Vec<u32> = plan.queues.iter().map(|q| q.node).collect();
    let queues = ChunkQueues::new(&plan);
    progress.total.store(plan.total_bytes(), Ordering::Relaxed);
    let stop = AtomicBool::new(false);
    let start = Instant::now();
    let failures = run_pinned("populate", &nodes, workers_per_node, topology, |w| {
        while let Some(claim) = queues.take(w.queue, true) {
            if stop.load(Ordering::Relaxed) || cancel.load(Ordering::Relaxed) {
                break;
            }
            let chunk = claim.chunk;
            let range = ranges[chunk.range];
            let (node, addr) = (range.node, range.host_addr + chunk.offset as usize);
            let done = match range.method {
                // SAFETY: the caller's live writable mapping; populating
                // only faults pages in, it does not change their contents.
                PopulateMethod::PopulateWrite => unsafe {
                    sys::madvise(addr, chunk.len as usize, libc::MADV_POPULATE_WRITE)
                },
                PopulateMethod::Allocate { fd, file_offset } => {
                    sys::allocate(fd, file_offset + chunk.offset, chunk.len)
                }
            };
            if let Err(e) = done {
                if let PopulateMethod::Allocate { .. } = range.method {
                    stop.store(true, Ordering::Relaxed);
                    return Err(format!(
                        "fallocate(FALLOC_FL_KEEP_SIZE) of the guest_memfd at {addr:#x}+{:#x} (node {node}) failed (out of memory?): {e}",
                        chunk.len
                    ));
                }
                stop.store(true, Ordering::Relaxed);
                let why = match e.raw_os_error() {
                    Some(libc::ENOMEM) => "out of memory, or no huge pages left",
                    Some(libc::EINVAL) => "MADV_POPULATE_WRITE needs Linux 5.14 or later",
                    Some(libc::EFAULT) => "the memory could not be faulted in",
                    Some(libc::EHWPOISON) => "hardware-poisoned page",
                    _ => "populate failed",
                };
                return Err(format!(
                    "{why}: madvise(MADV_POPULATE_WRITE) of {addr:#x}+{:#x} (node {node}): {e}",
                    chunk.len
                ));
            }
            progress.done.fetch_add(chunk.len, Ordering::Relaxed);
            claim.done();
        }
        Ok(())
    });
    if !failures.is_empty() {
        return Err(PopulateError::Failed(
            failures.iter().map(|f| f.to_string()).collect(),
        ));
    }
    Ok(PopulateStats {
        elapsed_ms: start.elapsed().as_millis() as u64,
        bytes: progress.bytes_done(),
        workers: workers_per_node.saturating_mul(nodes.len() as u32),
        nodes: nodes.len() as u32,
        cancelled: progress.bytes_done() < plan.total_bytes(),
    })
}

#[cfg(test)]
mod tests {
    use super::super::reclaim::tests::Map;
    use super::*;

    #[test]
    fn populates_every_page() {
        let m = Map::anon(32 << 20);
        assert_eq!(m.resident(), 0);
        let topo = HostTopology::from_sysfs(std::path::Path::new("/sys")).unwrap();
        // SAFETY: our own writable mapping.
        let (p, go) = (PopulateProgress::new(), AtomicBool::new(false));
        // SAFETY: our own writable mapping.
        let s = unsafe {
            execute(
                &[PopulateRange::mapped(0, m.addr, m.len as u64)],
                4 << 20,
                2,
                &topo,
                &p,
                &go,
            )
        }
        .unwrap();
        assert_eq!(m.resident(), 32 << 20);
        assert_eq!((s.bytes, s.workers, s.nodes), (32 << 20, 2, 1));
        assert!(!s.cancelled);
        assert_eq!((p.bytes_done(), p.total_bytes()), (32 << 20, 32 << 20));
        // SAFETY: as above.
        let e = unsafe { execute(&[], 1, 0, &topo, &p, &go) }.unwrap_err();
        assert!(matches!(e, PopulateError::InvalidOptions(_)));
    }

    #[test]
    fn a_failure_is_an_error() {
        let topo = HostTopology::from_sysfs(std::path::Path::new("/sys")).unwrap();
        // Page 0 is never mapped.
        // SAFETY: nothing is mapped there, so nothing is touched.
        let e = unsafe {
            execute(
                &[PopulateRange::mapped(0, 0, 8192)],
                4096,
                1,
                &topo,
                &PopulateProgress::new(),
                &AtomicBool::new(false),
            )
        }
        .unwrap_err();
        assert!(e.to_string().contains("MADV_POPULATE_WRITE"), "{e}");
        assert!(e.to_string().contains("populate-n0-0"), "{e}");
    }

    #[test]
    fn cancel_stops_between_chunks() {
        let m = Map::anon(64 << 20);
        let topo = HostTopology::from_sysfs(std::path::Path::new("/sys")).unwrap();
        let p = PopulateProgress::new();
        // Cancelled before it starts: nothing is faulted in.
        let cancel = AtomicBool::new(true);
        // SAFETY: our own writable mapping.
        let s = unsafe {
            execute(
                &[PopulateRange::mapped(0, m.addr, m.len as u64)],
                4 << 20,
                1,
                &topo,
                &p,
                &cancel,
            )
        }
        .unwrap();
        assert!(s.cancelled);
        assert_eq!((s.bytes, p.bytes_done(), p.total_bytes()), (0, 0, 64 << 20));
        assert_eq!(m.resident(), 0);
        // Cancelled by another thread while it runs, once it has begun: it
        // stops before the end. The mapping is large (2 GiB, reserved but
        // not committed) so that the watcher, which cancels as soon as the
        // first chunk is counted, cannot lose the race to a populate that
        // finishes first: a broken cancel populates all of it and fails.
        let p = PopulateProgress::new();
        let cancel = AtomicBool::new(false);
        std::thread::scope(|scope| {
            scope.spawn(|| {
                while p.bytes_done() == 0 {
                    std::thread::yield_now();
                }
                cancel.store(true, Ordering::Relaxed);
            });
            let big = Map::anon(2 << 30);
            // SAFETY: our own writable mapping.
            let s = unsafe {
                execute(
                    &[PopulateRange::mapped(0, big.addr, big.len as u64)],
                    1 << 20,
                    1,
                    &topo,
                    &p,
                    &cancel,
                )
            }
            .unwrap();
            assert!(s.cancelled, "{s:?}");
            assert!(s.bytes > 0 && s.bytes < 1 << 30, "{s:?}");
            assert_eq!(big.resident(), s.bytes);
        });
    }
}
