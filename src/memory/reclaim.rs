//! The reclaim executor: frees host ranges (guest RAM) with per-node worker
//! threads pinned to their node, one chunk at a time, counting per node the
//! address space done and the resident memory freed (from `mincore`, just
//! before each chunk is freed). Below a size threshold the caller's thread
//! does it all. Whatever workers fail to free (an error, a panic) is freed
//! afterwards on the caller's thread, so nothing is left behind.
//!
//! Cost of the measurement: `mincore` over a touched 1 GiB chunk of 4 KiB
//! pages (a reused 256 KiB vector, counted) took 0.8-1.3 ms in a release
//! build on the development host, against about 42 ms for the
//! `MADV_DONTNEED` of that chunk: 2-3% (test `mincore_cost_on_one_gib`,
//! ignored by default because it touches 1 GiB).

use std::os::fd::RawFd;
use std::panic::AssertUnwindSafe;

use super::numa::HostTopology;
use super::plan::{default_chunk_bytes, largest_node_bytes, plan_chunks, Chunk};
use super::progress::{ReclaimProgress, ReclaimReport};
use super::sys;
use super::workers::{run_pinned, ChunkQueues};

/// Errors of a reclaim.
#[derive(Debug, thiserror::Error)]
pub enum ReclaimError {
    /// The options cannot be used.
    #[error("invalid reclaim options: {0}")]
    InvalidOptions(String),
    /// The progress given was already used by another reclaim.
    #[error("this reclaim progress was already used by another reclaim")]
    ProgressReused,
    /// Some chunks could not be freed by their workers (errors or panics);
    /// everything left was then freed on the caller's thread, unless a
    /// failure says otherwise.
    #[error("reclaim had {} failure(s): {failures}", failures.total())]
    Failed {
        /// What went wrong: the count, and the first few with their text.
        failures: Failures,
        /// The statistics of the reclaim as it ended.
        report: Box<ReclaimReport>,
    },
    /// A view of guest memory ([`crate::memory::GuestView`]) is still held,
    /// so the memory cannot be taken back and freed in parallel; it is
    /// unmapped (in one thread) when the last view is dropped.
    #[error("{views} view(s) of guest memory are still held; the memory is unmapped when the last one is dropped")]
    ViewStillHeld {
        /// How many views were held (at the time of the refusal).
        views: usize,
    },
    /// A mapping could not be unmapped after it was freed.
    #[error("munmap of {addr:#x}+{len:#x} failed: {source}")]
    Unmap {
        /// Host address of the mapping.
        addr: usize,
        /// Its length.
        len: u64,
        /// Why.
        source: std::io::Error,
    },
}

/// The failures of a reclaim, in bounded memory: every one is counted,
/// the first [`Failures::KEPT`] are kept with their text. Shown as the kept
/// texts joined by `; `, then `; and N more` for the rest.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Failures {
    kept: Vec<String>,
    total: u64,
}

impl Failures {
    /// How many failures keep their text.
    pub const KEPT: usize = 8;

    /// No failure yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Counts a failure; its text is only written while fewer than
    /// [`Failures::KEPT`] are kept.
    pub fn push(&mut self, failure: impl std::fmt::Display) {
        self.total += 1;
        if self.kept.len() < Self::KEPT {
            self.kept.push(failure.to_string());
        }
    }

    /// How many failures there were.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// The texts of the first ones.
    pub fn kept(&self) -> &[String] {
        &self.kept
    }

    /// Whether there was none.
    pub fn is_empty(&self) -> bool {
        self.total == 0
    }
}

impl std::fmt::Display for Failures {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.kept.join("; "))?;
        let more = self.total - self.kept.len() as u64;
        if more > 0 {
            write!(f, "; and {more} more")?;
        }
        Ok(())
    }
}

/// Why one chunk could not be freed; its text is written only when shown.
#[derive(Debug)]
pub(crate) struct ChunkError {
    what: &'static str,
    addr: usize,
    len: u64,
    node: u32,
    /// The file and offset, for a hole punch.
    file: Option<(RawFd, u64)>,
    source: std::io::Error,
}

impl std::fmt::Display for ChunkError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ChunkError {
            what,
            addr,
            len,
            node,
            file,
            source,
        } = self;
        match file {
            Some((fd, offset)) => write!(
                f,
                "{what} of fd {fd} at {offset:#x}+{len:#x} (node {node}) failed: {source}"
            ),
            None => write!(
                f,
                "{what} of {addr:#x}+{len:#x} (node {node}) failed: {source}"
            ),
        }
    }
}

/// How a range's memory is given back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FreeMethod {
    /// `madvise(MADV_DONTNEED)`, for private anonymous memory.
    DontNeed,
    /// `fallocate(FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE)` on the file
    /// mapped at the range, which starts at `file_offset` in it.
    PunchHole {
        /// The file (a memfd).
        fd: RawFd,
        /// Offset of the range's first byte in the file.
        file_offset: u64,
    },
    /// guest_memfd: `madvise(MADV_DONTNEED)` of teravm's own mapping first
    /// (it only zaps teravm's page table entries, in bulk), then the hole
    /// punch that frees the pages. The punch alone walks each page's
    /// reverse map to unmap it: measured here on 2 GiB touched through the
    /// mapping, 690 ms against 282 ms for both (and nothing to zap, 0 ms,
    /// where only the guest touched it).
    ZapThenPunch {
        /// The file (a guest_memfd).
        fd: RawFd,
        /// Offset of the range's first byte in the file.
        file_offset: u64,
    },
}

/// A host mapping to free, placed on a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostRange {
    /// The host node whose workers free it.
    pub node: u32,
    /// Page-aligned host virtual address.
    pub host_addr: usize,
    /// Length in bytes.
    pub len: u64,
    /// How to free it.
    pub method: FreeMethod,
}

/// How a reclaim runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReclaimOptions {
    /// Worker threads per node.
    pub workers_per_node: u32,
    /// The unit of work (rounded up to whole pages); `None`: sized from the
    /// largest node's bytes and the workers ([`default_chunk_bytes`]), so
    /// that every worker has chunks to take whatever the guest's size.
    pub chunk_bytes: Option<u64>,
    /// Below this many bytes in all, the caller's thread frees everything.
    pub parallel_threshold_bytes: u64,
    /// Workers whose queue is empty take chunks from the fullest other queue.
    pub steal: bool,
}

impl ReclaimOptions {
    /// The chunk a reclaim of `ranges` takes: the one given; else, for
    /// memory files (memfd, hugetlb, guest_memfd), their largest stripe (a
    /// file a chunk), and for anonymous memory the default for the node
    /// with the most bytes among `ranges`.
    pub fn chunk_bytes_for(&self, ranges: &[HostRange]) -> u64 {
        self.chunk_bytes.unwrap_or_else(|| {
            // Memory files are freed a whole stripe (one file) a chunk, so
            // that no two workers punch holes in one file at once (its
            // inode lock: `mapping::MEMFD_STRIPE_BYTES` says why); a
            // slice has at most 32 of them, at least 8 from 1 GiB up.
            if !ranges.is_empty()
                && ranges
                    .iter()
                    .all(|r| !matches!(r.method, FreeMethod::DontNeed))
            {
                return ranges.iter().map(|r| r.len).max().unwrap_or(0);
            }
            let largest = largest_node_bytes(ranges.iter().map(|r| (r.node, r.len)));
            default_chunk_bytes(largest, self.workers_per_node)
        })
    }

    /// How many workers a reclaim of `total_bytes` over `nodes` nodes runs:
    /// `(in all, per node)`. Below the threshold the caller's thread does it
    /// all, which counts as one worker per node's report.
    pub fn worker_counts(&self, total_bytes: u64, nodes: usize) -> (u32, u32) {
        if total_bytes >= self.parallel_threshold_bytes {
            let nodes = u32::try_from(nodes).unwrap_or(u32::MAX);
            (
                self.workers_per_node.saturating_mul(nodes),
                self.workers_per_node,
            )
        } else {
            (1, 1)
        }
    }
}

impl Default for ReclaimOptions {
    /// 2 workers per node, chunks sized from the guest (1 GiB from 8 GiB
    /// per node up), parallel from 1 GiB, stealing: the measured defaults
    /// (the config file's `reclaim` section documents how they were
    /// measured).
    fn default() -> Self {
        ReclaimOptions {
            workers_per_node: 2,
            chunk_bytes: None,
            parallel_threshold_bytes: 1 << 30,
            steal: true,
        }
    }
}

/// A hook called with a thread name, a queue and a chunk index.
type FreedHook<'a> = &'a (dyn Fn(&str, usize, u64) + Sync);

/// Test hooks into the executor (all `None` outside tests).
#[derive(Default)]
pub(crate) struct Hooks<'a> {
    /// Called on each worker thread once it is pinned, before any chunk.
    pub on_start: Option<&'a (dyn Fn(u32, u32) + Sync)>,
    /// Called with (queue, index) before a chunk is freed (may panic).
    pub before_free: Option<&'a (dyn Fn(usize, u64) + Sync)>,
    /// Called with (thread name, queue, index) after a chunk is freed.
    pub after_free: Option<FreedHook<'a>>,
}

/// Frees `ranges` as `opts` says, counting into `progress`, and returns the
/// final report. Everything is freed even when workers fail or panic: what
/// they left is freed on the caller's thread, and the failures are returned.
///
/// # Safety
/// Every range is a live mapping owned by the caller that nothing else
/// touches during the call; its contents are discarded.
pub unsafe fn execute(
    ranges: &[HostRange],
    opts: &ReclaimOptions,
    topology: &HostTopology,
    progress: &ReclaimProgress,
) -> Result<ReclaimReport, ReclaimError> {
    let fired = std::sync::atomic::AtomicBool::new(false);
    let panic_once = |_: usize, _: u64| {
        if !fired.swap(true, std::sync::atomic::Ordering::SeqCst) {
            panic!(
                "injected reclaim worker panic ({})",
                crate::faults::FAULT_INJECT_ENV
            );
        }
    };
    let hooks = Hooks {
        before_free: crate::faults::injected("reclaim-worker-panic")
            .then_some(&panic_once as &(dyn Fn(usize, u64) + Sync)),
        ..Hooks::default()
    };
    // SAFETY: the caller's contract is the same as ours.
    unsafe { execute_with(ranges, opts, topology, progress, &hooks) }
}

/// [`execute`] with test hooks.
///
/// # Safety
/// As [`execute`].
pub(crate) unsafe fn execute_with(
    ranges: &[HostRange],
    opts: &ReclaimOptions,
    topology: &HostTopology,
    progress: &ReclaimProgress,
    hooks: &Hooks<'_>,
) -> Result<ReclaimReport, ReclaimError> {
    if opts.workers_per_node == 0 {
        return Err(ReclaimError::InvalidOptions("workers_per_node is 0".into()));
    }
    if opts.chunk_bytes == Some(0) {
        return Err(ReclaimError::InvalidOptions("chunk_bytes is 0".into()));
    }
    no_recency(ranges);
    let page = sys::page_size() as u64;
    let chunk_bytes = opts
        .chunk_bytes_for(ranges)
        .div_ceil(page)
        .saturating_mul(page);
    let plan = plan_chunks(
        &ranges.iter().map(|r| (r.node, r.len)).collect::<Vec<_>>(),
        chunk_bytes,
    );
    let nodes: Vec<(u32, u64)> = plan.queues.iter().map(|q| (q.node, q.bytes)).collect();
    let total: u64 = nodes.iter().map(|n| n.1).sum();
    let parallel = total >= opts.parallel_threshold_bytes;
    let (workers, per_node) = opts.worker_counts(total, nodes.len());
    if !progress.begin(&nodes, workers, per_node) {
        return Err(ReclaimError::ProgressReused);
    }
    let queues = ChunkQueues::new(&plan);

    // One worker's loop: take chunks until none is left for it. A chunk
    // whose free fails or panics is abandoned by its claim, for the caller.
    let drain = |name: &str, own: usize, steal: bool| -> Result<(), ChunkError> {
        let mut buf = Vec::new();
        while let Some(claim) = queues.take(own, steal) {
            let (q, i, chunk) = (claim.queue, claim.index, claim.chunk);
            if let Some(h) = hooks.before_free {
                h(q, i);
            }
            // SAFETY: the range is the caller's live mapping, given to us to free.
            let resident = unsafe { free_chunk(&ranges[chunk.range], &chunk, &mut buf) }?;
            claim.done();
            progress.add(q, chunk.len, resident);
            if let Some(h) = hooks.after_free {
                h(name, q, i);
            }
        }
        Ok(())
    };

    let mut failures = Failures::new();
    if parallel {
        let ids: Vec<u32> = nodes.iter().map(|n| n.0).collect();
        let failed = run_pinned("reclaim", &ids, opts.workers_per_node, topology, |w| {
            if let Some(h) = hooks.on_start {
                h(w.node, w.index);
            }
            drain(&w.name, w.queue, opts.steal)
        });
        failed.iter().for_each(|f| failures.push(f));
    } else {
        let name = std::thread::current()
            .name()
            .unwrap_or("caller")
            .to_string();
        match std::panic::catch_unwind(AssertUnwindSafe(|| drain(&name, 0, true))) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => failures.push(format_args!("{name}: {e}")),
            Err(_) => failures.push(format_args!("{name} panicked while freeing")),
        }
    }

    // Whatever the workers left (errors, panics) is freed here, one try
    // per chunk.
    let left = queues.left();
    if left > 0 {
        log::warn!(
            "reclaim: freeing {left} chunk(s) left by failed workers on the caller's thread"
        );
        let mut buf = Vec::new();
        while let Some(claim) = queues.take_left() {
            let (q, i, chunk) = (claim.queue, claim.index, claim.chunk);
            // SAFETY: as above; no worker runs any more.
            match unsafe { free_chunk(&ranges[chunk.range], &chunk, &mut buf) } {
                Ok(resident) => {
                    claim.done();
                    progress.add(q, chunk.len, resident);
                    if let Some(h) = hooks.after_free {
                        h("fallback", q, i);
                    }
                }
                Err(e) => {
                    claim.give_up();
                    failures.push(format_args!("caller thread: {e}"));
                }
            }
        }
    }
    progress.finish(failures.is_empty());
    let report = progress.snapshot();
    if failures.is_empty() {
        Ok(report)
    } else {
        Err(ReclaimError::Failed {
            failures,
            report: Box::new(report),
        })
    }
}

/// Tells the kernel that the file-backed ranges' accesses carry no
/// recency (`MADV_RANDOM`, whose `VM_RAND_READ` makes `vma_has_recency`
/// false), once, before their chunks are freed. Unmapping a file page
/// whose PTE is young otherwise marks it accessed first
/// (`zap_present_ptes` -> `folio_mark_accessed`): it moves to the active
/// LRU list under the node's LRU lock, which the workers then contend on,
/// only to be freed a moment later. Measured here, 4 GiB of touched 4 KiB
/// memfd pages: one worker 0.80 s -> 0.66 s, two 0.57 s -> 0.45 s
/// (1.36x -> 1.8x one `munmap`). Anonymous memory never takes that path,
/// and a running guest's mappings keep their recency (the kernel's reclaim
/// ages them by it): only a reclaim, whose memory goes anyway, asks.
/// Advice only: a kernel that refuses it frees as before.
fn no_recency(ranges: &[HostRange]) {
    for r in ranges {
        if matches!(r.method, FreeMethod::DontNeed) {
            continue;
        }
        // SAFETY: `r` is a live mapping the caller gave us to free (the
        // executor's contract); MADV_RANDOM changes only how the kernel
        // treats its accesses, never its contents.
        if let Err(e) = unsafe { sys::madvise(r.host_addr, r.len as usize, libc::MADV_RANDOM) } {
            log::debug!(
                "madvise(MADV_RANDOM) of {:#x}+{:#x}: {e}",
                r.host_addr,
                r.len
            );
        }
    }
}

/// Frees one chunk of a range; returns the resident bytes it held
/// (measured just before: the pages of anonymous memory that are the
/// guest's own, [`super::pagemap`]; `mincore` of a memory file;
/// `cachestat` of a guest_memfd).
///
/// # Safety
/// `range` is a live mapping the caller may discard.
unsafe fn free_chunk(
    range: &HostRange,
    chunk: &Chunk,
    buf: &mut Vec<u8>,
) -> Result<u64, ChunkError> {
    let addr = range.host_addr + chunk.offset as usize;
    let len = chunk.len as usize;
    let fail = |what, file, source| ChunkError {
        what,
        addr,
        len: chunk.len,
        node: range.node,
        file,
        source,
    };
    let resident = match range.method {
        // A guest_memfd page allocated but never used (a populate's
        // fallocate) is not "in core" for mincore; the file's page cache
        // counts it.
        FreeMethod::ZapThenPunch { fd, file_offset } => {
            let offset = file_offset + chunk.offset;
            sys::file_cached_bytes(fd, offset, chunk.len)
                .map_err(|e| fail("cachestat", Some((fd, offset)), e))?
        }
        // Anonymous memory: only the pages the guest owns, not those it
        // only read (the shared zero page, which `mincore` counts too).
        FreeMethod::DontNeed => match super::pagemap::owned_bytes(addr, len) {
            Some(owned) => owned.map_err(|e| fail("PAGEMAP_SCAN", None, e))?,
            None => sys::resident_bytes(addr, len, buf).map_err(|e| fail("mincore", None, e))?,
        },
        // A memory file's pages in its page cache, mapped here or not.
        FreeMethod::PunchHole { .. } => {
            sys::resident_bytes(addr, len, buf).map_err(|e| fail("mincore", None, e))?
        }
    };
    // SAFETY: the caller's contract is the same as ours; the chunk lies
    // inside the range (the plan cuts ranges into chunks).
    unsafe { free_part(range, chunk.offset, chunk.len) }?;
    Ok(resident)
}

/// Frees `offset..offset+len` of `range` as its method says: one
/// `madvise(MADV_DONTNEED)`, or one hole punch in its file at the matching
/// offset. The one free path of guest memory, shared by reclaim and the
/// discard pool ([`crate::memory::discard`]).
///
/// # Safety
/// `range` is a live mapping the caller may discard, and
/// `offset..offset+len` lies inside it.
pub(crate) unsafe fn free_part(range: &HostRange, offset: u64, len: u64) -> Result<(), ChunkError> {
    let addr = range.host_addr + offset as usize;
    let fail = |what, file, source| ChunkError {
        what,
        addr,
        len,
        node: range.node,
        file,
        source,
    };
    match range.method {
        FreeMethod::DontNeed => {
            // SAFETY: the caller owns the mapping and discards its contents;
            // the part lies inside it.
            unsafe { sys::madvise(addr, len as usize, libc::MADV_DONTNEED) }
                .map_err(|e| fail("madvise(MADV_DONTNEED)", None, e))
        }
        FreeMethod::PunchHole { fd, file_offset }
        | FreeMethod::ZapThenPunch { fd, file_offset } => {
            if let FreeMethod::ZapThenPunch { .. } = range.method {
                // SAFETY: as for DontNeed: the caller's mapping, whose
                // contents go now anyway; on a shared mapping this only
                // drops our page table entries.
                unsafe { sys::madvise(addr, len as usize, libc::MADV_DONTNEED) }
                    .map_err(|e| fail("madvise(MADV_DONTNEED)", None, e))?;
            }
            let offset = file_offset + offset;
            sys::punch_hole(fd, offset, len).map_err(|e| fail("hole punch", Some((fd, offset)), e))
        }
    }
}

#[cfg(test)]
#[path = "reclaim_tests.rs"]
pub(crate) mod tests;
