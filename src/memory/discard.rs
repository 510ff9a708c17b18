//! The discard pool: frees the guest ranges a running guest gives back
//! (virtio-balloon inflate, free page reporting) with long-lived worker
//! threads per host node, through the reclaim executor's free path
//! (`reclaim::free_part`: `MADV_DONTNEED`, or a hole punch in the memfd
//! stripe) and its pinning (`workers::node_cpus`, `workers::pin_current`).
//!
//! What it owns: a translation table built once from the slices' mappings
//! (one entry per anonymous slice or memfd stripe: guest range, host range,
//! node, free method) and a [`GuestView`] that keeps those mappings alive.
//! A guest range is turned into host pieces only by that table (clipped to
//! guest RAM, split at slice and stripe ends, merged within a batch, aligned
//! inward to whole pages — hugetlb pages included), and the free path takes
//! only such pieces (`HostPiece`, private, built nowhere else): no range
//! outside guest RAM can reach `madvise` or `fallocate`.
//!
//! How its threads talk: [`DiscardPool::discard`] runs on the caller's
//! thread (a device's). A batch below [`INLINE_THRESHOLD_BYTES`] is freed
//! there; a larger one is cut into parts of at most [`PART_BYTES`] pushed
//! onto their node's bounded queue (a `Mutex<VecDeque>` and a `Condvar`),
//! where the node's workers `discard-n{node}-{i}` take them; a part that
//! finds its queue full is freed on the caller's thread instead, so memory
//! never grows with the guest's requests. Each part holds its batch; the
//! last part to finish (or to be dropped: a panic, a shutdown) calls the
//! batch's `done` once, from its drop guard. Batches in flight are listed
//! (their guest ranges) under one lock with a `Condvar`, which
//! [`DiscardPool::wait_overlapping`] waits on (a deflate of pages still
//! being freed). Counters are atomics ([`DiscardPool::snapshot`]).
//!
//! Lifetime: each worker holds the pool's shared state, and with it the
//! view. [`DiscardPool::shutdown`] stops the workers, completes what is
//! still queued as not freed, and joins them by a deadline; a worker still
//! in the kernel past it is left behind still holding the view, so
//! `GuestMemory::reclaim` refuses (`ViewStillHeld`) and the memory is
//! unmapped when that worker ends: never while it may still free a range.

use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::guest::GuestMemory;
use super::numa::HostTopology;
use super::reclaim::{self, HostRange};
use super::sys;
use super::view::GuestView;
use super::workers::{node_cpus, pin_current};

const MIB: u64 = 1 << 20;

/// Batches smaller than this are freed on the caller's thread. Measured on
/// the development host (release build, test `inline_threshold_measurement`,
/// ignored by default; best of 20): one `madvise(MADV_DONTNEED)` of touched
/// 4 KiB pages took 1 us for 4 KiB, 3.4 us for 64 KiB, 12 us for 256 KiB,
/// 52 us for 1 MiB, 105 us for 2 MiB and 860 us for 16 MiB, while handing a
/// 4 KiB part to a parked worker and being told it is done took 51 us
/// (median; best 38 us) of wake-ups. So 1 MiB is where freeing inline costs
/// the caller (a device thread) as much as the hand-off: below it inline is
/// cheaper, above it the hand-off blocks the caller less.
pub const INLINE_THRESHOLD_BYTES: u64 = MIB;

/// Largest part a worker frees in one call (rounded up to whole pages): a
/// big reported range is spread over the node's workers, and one
/// `madvise` holds the mmap lock for no more than some milliseconds.
pub const PART_BYTES: u64 = 64 * MIB;

/// Parts each node's queue holds; a part that finds the queue full is
/// freed on the caller's thread.
pub const QUEUE_DEPTH: usize = 1024;

/// How long a failed start waits for the workers it already started.
const SPAWN_FAILURE_JOIN: Duration = Duration::from_secs(1);

/// How many free failures are logged (all are counted).
const LOGGED_FAILURES: u64 = 8;

/// Called on each worker thread with its name once it is pinned, before it
/// takes any part (e.g. to install the thread's seccomp filter).
pub type WorkerStartHook = Arc<dyn Fn(&str) + Send + Sync>;

/// Called once per batch with its outcome, when every part of it is freed
/// (or failed); on the caller's thread or on a worker's.
pub type DiscardDone = Box<dyn FnOnce(DiscardOutcome) + Send>;

/// Run once before any part of its batch is freed, off the caller's
/// thread where the batch goes to the workers ([`DiscardPool::discard_after`]):
/// virtio-mem takes an emptied slot out of KVM here, so the guest cannot
/// fault a page back in behind the free.
pub type DiscardPrelude = Box<dyn FnOnce() + Send>;

/// Errors of the discard pool.
#[derive(Debug, thiserror::Error)]
pub enum DiscardError {
    /// The options cannot be used.
    #[error("invalid discard options: {0}")]
    InvalidOptions(String),
    /// A slice or stripe does not start on a page of the discard page size.
    #[error("guest range at {guest_addr:#x} (node {node}) is not aligned to the discard page size {page_bytes:#x}")]
    Misaligned {
        /// Its guest address.
        guest_addr: u64,
        /// Its node.
        node: u32,
        /// The page size.
        page_bytes: u64,
    },
    /// A worker thread could not be started.
    #[error("cannot start discard worker {name}: {source}")]
    Spawn {
        /// The thread's name.
        name: String,
        /// Why.
        source: std::io::Error,
    },
    /// A deadline passed while discards of the ranges waited for were still
    /// in flight.
    #[error("{batches} discard batch(es) of these ranges still in flight at the deadline")]
    StillInFlight {
        /// How many batches overlapped at the deadline.
        batches: usize,
    },
    /// Workers did not end by the shutdown deadline (stuck in the kernel):
    /// they keep the guest memory view until they end.
    #[error("discard worker(s) {} did not end by the deadline; guest memory stays mapped until they do", names.join(", "))]
    WorkersLeftBehind {
        /// Their thread names.
        names: Vec<String>,
    },
}

/// How the pool runs.
#[derive(Clone)]
pub struct DiscardOptions {
    /// Worker threads per node (at least 1).
    pub workers_per_node: u32,
    /// Batches below this many bytes are freed on the caller's thread.
    pub inline_threshold_bytes: u64,
    /// Parts each node's queue holds (at least 1).
    pub queue_depth: usize,
    /// Free only whole pages of at least this size (a power of two, or 0).
    /// The page size used is the largest of this, the host's base page and
    /// the guest's hugetlb page, so a hugetlb guest is never freed by part
    /// of a huge page, whatever this says.
    pub min_page_bytes: u64,
    /// Called on each worker once pinned.
    pub on_worker_start: Option<WorkerStartHook>,
    /// Serial, as Firecracker frees reported pages: no workers (whatever
    /// `workers_per_node` says), every batch freed on the caller's thread,
    /// one free call per range as given (after clipping to guest RAM,
    /// splitting at slice and stripe ends and aligning inward), adjacent
    /// ranges not merged nor cut into parts. A baseline to measure against.
    pub serial: bool,
    /// Each part waits this long before it is freed (0: none): the
    /// `slow-discard` fault ([`crate::faults::SLOW_DISCARD`]), a discard
    /// that takes long. The wait ends early when the pool stops
    /// ([`DiscardPool::cancel`], [`DiscardPool::shutdown`]); the part is
    /// then not freed.
    pub delay_before_free: Duration,
    /// The first batch's parts fail without being freed, as a failed free
    /// call would, on its first try (1) or on its retry too (2): the
    /// `discard-fails-once` and `discard-fails-twice` faults
    /// ([`crate::faults::DISCARD_FAILS_ONCE`]), which walk what the callers
    /// do with a failed discard.
    pub failing_tries: u8,
}

impl Default for DiscardOptions {
    /// One worker per node, [`INLINE_THRESHOLD_BYTES`], [`QUEUE_DEPTH`].
    fn default() -> Self {
        DiscardOptions {
            workers_per_node: 1,
            inline_threshold_bytes: INLINE_THRESHOLD_BYTES,
            queue_depth: QUEUE_DEPTH,
            min_page_bytes: 0,
            on_worker_start: None,
            serial: false,
            delay_before_free: Duration::ZERO,
            failing_tries: 0,
        }
    }
}

impl std::fmt::Debug for DiscardOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiscardOptions")
            .field("workers_per_node", &self.workers_per_node)
            .field("inline_threshold_bytes", &self.inline_threshold_bytes)
            .field("queue_depth", &self.queue_depth)
            .field("min_page_bytes", &self.min_page_bytes)
            .field("on_worker_start", &self.on_worker_start.is_some())
            .field("serial", &self.serial)
            .field("delay_before_free", &self.delay_before_free)
            .finish()
    }
}

/// What became of one batch of guest ranges.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DiscardOutcome {
    /// Bytes freed.
    pub bytes_freed: u64,
    /// Guest ranges in the batch.
    pub ranges: u64,
    /// Parts not freed: a failed call, a panic, or queued at shutdown.
    pub failed: u64,
    /// Bytes outside guest RAM (the MMIO gap, past the end), never touched.
    pub refused_bytes: u64,
    /// Bytes of guest RAM not freed because they are not whole pages.
    pub unaligned_bytes: u64,
}

/// Bytes discarded on one host node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeDiscard {
    /// The node.
    pub node: u32,
    /// Bytes freed from its slices.
    pub bytes: u64,
}

/// The pool's counters at one moment.
#[derive(Debug, Clone, PartialEq)]
pub struct DiscardSnapshot {
    /// Bytes freed in all.
    pub bytes_discarded: u64,
    /// Bytes freed per host node, in node order.
    pub per_node: Vec<NodeDiscard>,
    /// Guest ranges received.
    pub ranges: u64,
    /// Batches received (`discard` calls).
    pub batches: u64,
    /// Free calls made (`madvise` or `fallocate`).
    pub calls: u64,
    /// Parts not freed (failed calls, panics, cancelled at shutdown).
    pub failures: u64,
    /// Bytes refused: outside guest RAM.
    pub refused_bytes: u64,
    /// Bytes of guest RAM left because they are not whole pages.
    pub unaligned_bytes: u64,
    /// Parts freed on the caller's thread (small batches, full queues).
    pub inline_parts: u64,
    /// Parts freed by workers.
    pub worker_parts: u64,
    /// Batches in flight now.
    pub in_flight_batches: usize,
    /// Wall time with at least one batch in flight, in nanoseconds.
    pub busy_ns: u64,
    /// Time since the pool started, in nanoseconds.
    pub uptime_ns: u64,
    /// The discard rate: `bytes_discarded` over the busy time (bytes per
    /// second while the pool had work; 0 before any).
    pub rate_bytes_per_sec: f64,
}

/// One entry of the translation table: an anonymous slice, or one memfd
/// stripe of a slice.
#[derive(Debug)]
struct Entry {
    guest_addr: u64,
    /// Where it lives and how it is freed (the slice's own `free_ranges`).
    host: HostRange,
    /// Index of its node in [`Table::nodes`].
    node_index: usize,
}

impl Entry {
    fn guest_end(&self) -> u64 {
        self.guest_addr + self.host.len
    }
}

/// The guest-to-host translation of guest RAM.
#[derive(Debug)]
struct Table {
    /// Sorted by guest address, not overlapping.
    entries: Vec<Entry>,
    /// The nodes of the entries, sorted.
    nodes: Vec<u32>,
    page_bytes: u64,
    part_bytes: u64,
    /// One piece per range and entry: no merge, no parts.
    serial: bool,
}

/// A part of guest RAM to free: whole pages inside one table entry. Only
/// [`Table::translate`] builds one, so the free path never sees a range
/// that is not guest RAM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct HostPiece {
    entry: usize,
    offset: u64,
    len: u64,
}

/// A batch turned into pieces.
#[derive(Debug, Default)]
struct Translation {
    /// In guest address order, merged, whole pages, each at most
    /// `part_bytes`.
    pieces: Vec<HostPiece>,
    refused_bytes: u64,
    unaligned_bytes: u64,
}

impl Table {
    fn new(memory: &GuestMemory, page_bytes: u64) -> Result<Table, DiscardError> {
        let mut entries = Vec::new();
        let all = || memory.slices().iter().chain(memory.hotplug());
        let mut nodes: Vec<u32> = all().map(|s| s.slice().node).collect();
        nodes.sort_unstable();
        nodes.dedup();
        for s in all() {
            let slice = s.slice();
            for host in s.free_ranges() {
                let guest_addr = slice.guest_addr + (host.host_addr - s.host_addr()) as u64;
                if guest_addr % page_bytes != 0 || host.len % page_bytes != 0 {
                    return Err(DiscardError::Misaligned {
                        guest_addr,
                        node: host.node,
                        page_bytes,
                    });
                }
                let node_index = nodes.binary_search(&host.node).unwrap_or(0);
                entries.push(Entry {
                    guest_addr,
                    host,
                    node_index,
                });
            }
        }
        entries.sort_by_key(|e| e.guest_addr);
        Ok(Table {
            entries,
            nodes,
            page_bytes,
            part_bytes: PART_BYTES.div_ceil(page_bytes) * page_bytes,
            serial: false,
        })
    }

    /// Clips each guest range to the entries, merges what overlaps or
    /// touches within an entry, aligns each merged span inward to whole
    /// pages and cuts it into parts. Serial: each clipped range aligned
    /// inward is one piece, in the order given, nothing merged or cut.
    fn translate(&self, ranges: &[(u64, u64)]) -> Translation {
        let mut out = Translation::default();
        // (entry, start offset, end offset), not yet aligned.
        let mut spans: Vec<(usize, u64, u64)> = Vec::new();
        for &(addr, len) in ranges {
            let end = addr.saturating_add(len);
            let mut inside = 0u64;
            let first = self.entries.partition_point(|e| e.guest_end() <= addr);
            for (i, e) in self.entries.iter().enumerate().skip(first) {
                if e.guest_addr >= end {
                    break;
                }
                let start = addr.max(e.guest_addr);
                let stop = end.min(e.guest_end());
                inside += stop - start;
                spans.push((i, start - e.guest_addr, stop - e.guest_addr));
            }
            out.refused_bytes += len - inside;
        }
        let page = self.page_bytes;
        if self.serial {
            for (entry, start, stop) in spans {
                let a = start.div_ceil(page) * page;
                let b = stop / page * page;
                let whole = b.saturating_sub(a);
                out.unaligned_bytes += (stop - start) - whole;
                if whole > 0 {
                    out.pieces.push(HostPiece {
                        entry,
                        offset: a,
                        len: whole,
                    });
                }
            }
            return out;
        }
        spans.sort_unstable();
        let mut merged: Vec<(usize, u64, u64)> = Vec::with_capacity(spans.len());
        for s in spans {
            match merged.last_mut() {
                Some(m) if m.0 == s.0 && s.1 <= m.2 => m.2 = m.2.max(s.2),
                _ => merged.push(s),
            }
        }
        for (entry, start, stop) in merged {
            let a = start.div_ceil(page) * page;
            let b = stop / page * page;
            let whole = b.saturating_sub(a);
            out.unaligned_bytes += (stop - start) - whole;
            let mut offset = a;
            while offset < b {
                let len = (b - offset).min(self.part_bytes);
                out.pieces.push(HostPiece { entry, offset, len });
                offset += len;
            }
        }
        out
    }

    /// The guest range of a piece.
    fn guest_range(&self, p: &HostPiece) -> (u64, u64) {
        (self.entries[p.entry].guest_addr + p.offset, p.len)
    }

    fn node_index(&self, p: &HostPiece) -> usize {
        self.entries[p.entry].node_index
    }
}

/// The counters.
#[derive(Debug)]
struct Counters {
    bytes: AtomicU64,
    per_node: Vec<AtomicU64>,
    ranges: AtomicU64,
    batches: AtomicU64,
    calls: AtomicU64,
    failures: AtomicU64,
    refused_bytes: AtomicU64,
    unaligned_bytes: AtomicU64,
    inline_parts: AtomicU64,
    worker_parts: AtomicU64,
}

/// Batches in flight, with their (freed) guest ranges, and the busy time.
#[derive(Debug, Default)]
struct InFlightState {
    next_id: u64,
    /// (batch id, its guest ranges sorted by address).
    batches: Vec<(u64, Vec<(u64, u64)>)>,
    busy_since: Option<Instant>,
    busy_ns: u64,
}

#[derive(Debug, Default)]
struct InFlight {
    state: Mutex<InFlightState>,
    changed: Condvar,
}

impl InFlight {
    fn lock(&self) -> MutexGuard<'_, InFlightState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn register(&self, ranges: Vec<(u64, u64)>) -> u64 {
        let mut s = self.lock();
        let id = s.next_id;
        s.next_id += 1;
        if s.batches.is_empty() {
            s.busy_since = Some(Instant::now());
        }
        s.batches.push((id, ranges));
        id
    }

    fn unregister(&self, id: u64) {
        let mut s = self.lock();
        s.batches.retain(|b| b.0 != id);
        if s.batches.is_empty() {
            if let Some(t) = s.busy_since.take() {
                s.busy_ns += t.elapsed().as_nanos() as u64;
            }
        }
        drop(s);
        self.changed.notify_all();
    }
}

/// `ranges` sorted by address, those that overlap or touch merged.
fn sorted_merged(mut ranges: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    ranges.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
    for (addr, len) in ranges {
        match out.last_mut() {
            Some(last) if addr <= last.0 + last.1 => {
                last.1 = last.1.max(addr + len - last.0);
            }
            _ => out.push((addr, len)),
        }
    }
    out
}

/// Whether `a` (sorted, not overlapping) overlaps `(addr, len)`.
fn overlaps(sorted: &[(u64, u64)], addr: u64, len: u64) -> bool {
    let end = addr.saturating_add(len);
    let i = sorted.partition_point(|r| r.0.saturating_add(r.1) <= addr);
    sorted.get(i).is_some_and(|r| r.0 < end)
}

/// Which try of a batch a submission is.
#[derive(Debug, Clone, Copy)]
enum Try {
    /// The caller's: retried once if it fails.
    First,
    /// The retry of a failed one; `fails`: injected to fail too.
    Retry { fails: bool },
}

/// One batch: counts its parts down and calls `done` when the last ends.
struct Batch {
    id: u64,
    /// Its parts fail unfreed ([`DiscardOptions::failing_tries`]).
    fails: bool,
    remaining: AtomicUsize,
    freed: AtomicU64,
    failed: AtomicU64,
    outcome: DiscardOutcome,
    done: Mutex<Option<DiscardDone>>,
    in_flight: Arc<InFlight>,
}

impl Batch {
    fn part_ended(&self, freed: Option<u64>) {
        match freed {
            Some(n) => self.freed.fetch_add(n, Ordering::Relaxed),
            None => self.failed.fetch_add(1, Ordering::Relaxed),
        };
        if self.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
            // `done` first, while the batch is still in flight: a caller
            // that submits its ranges again from `done` (a retry of a
            // failed discard) has them registered before these leave, so
            // no fence wait slips between the two.
            let done = self.done.lock().unwrap_or_else(|e| e.into_inner()).take();
            // Unregistered even if `done` panics.
            struct Leave<'a>(&'a InFlight, u64);
            impl Drop for Leave<'_> {
                fn drop(&mut self) {
                    self.0.unregister(self.1);
                }
            }
            let _leave = Leave(&self.in_flight, self.id);
            if let Some(done) = done {
                done(DiscardOutcome {
                    bytes_freed: self.freed.load(Ordering::Relaxed),
                    failed: self.failed.load(Ordering::Relaxed),
                    ..self.outcome
                });
            }
        }
    }
}

/// A piece of a batch; dropped without [`Part::finish`] (a panic, a
/// shutdown), it counts as failed, so the batch always completes.
struct Part {
    piece: HostPiece,
    batch: Arc<Batch>,
    ended: bool,
}

impl Part {
    fn finish(mut self, freed: bool) {
        self.ended = true;
        self.batch.part_ended(freed.then_some(self.piece.len));
    }
}

impl Drop for Part {
    fn drop(&mut self) {
        if !self.ended {
            self.batch.part_ended(None);
        }
    }
}

/// What a worker takes from its queue: a part to free, or a batch's
/// prelude to run before its parts are dispatched. Dropped unrun (a
/// shutdown), a prelude's parts end as failed and its closure is not
/// called.
enum Job {
    Part(Part),
    Prelude(DiscardPrelude, Vec<Part>),
}

/// One node's queue of jobs.
#[derive(Default)]
struct NodeQueue {
    parts: Mutex<VecDeque<Job>>,
    ready: Condvar,
}

impl NodeQueue {
    fn lock(&self) -> MutexGuard<'_, VecDeque<Job>> {
        self.parts.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// What the pool and its workers share.
struct Shared {
    // Its raw host addresses and fds are valid while `_view` is.
    table: Table,
    queues: Vec<NodeQueue>,
    stopping: AtomicBool,
    counters: Counters,
    in_flight: Arc<InFlight>,
    started: Instant,
    inline_threshold_bytes: u64,
    queue_depth: usize,
    delay_before_free: Duration,
    /// [`DiscardOptions::failing_tries`].
    failing_tries: u8,
    /// The first batch was submitted (for `failing_tries`).
    first_taken: AtomicBool,
    /// Woken when the pool stops: a part waiting out `delay_before_free`
    /// gives up.
    halt: Mutex<()>,
    halted: Condvar,
    /// Keeps the mappings (and the memfds) that `table` points into alive.
    _view: GuestView,
}

impl Shared {
    /// Waits `delay_before_free`; false if the pool stopped meanwhile.
    fn delay(&self) -> bool {
        let until = Instant::now() + self.delay_before_free;
        let mut g = self.halt.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if self.stopping.load(Ordering::Acquire) {
                return false;
            }
            let now = Instant::now();
            if now >= until {
                return true;
            }
            g = self
                .halted
                .wait_timeout(g, until - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Frees one part and ends it. Once the pool stops, a part is ended
    /// as not freed instead.
    fn free(&self, part: Part, on_worker: bool) {
        let waited = self.delay_before_free.is_zero() || self.delay();
        if !waited || part.batch.fails || self.stopping.load(Ordering::Acquire) {
            self.counters.failures.fetch_add(1, Ordering::Relaxed);
            part.finish(false);
            return;
        }
        let piece = part.piece;
        let entry = &self.table.entries[piece.entry];
        // SAFETY: `piece` was built by `Table::translate`, so it is whole
        // pages inside one entry of the table, that is inside a slice's
        // mapping or one memfd stripe of it, which `_view` keeps mapped (and
        // the memfd open) for as long as this `Shared` lives. The guest gave
        // these pages back (inflated or reported), so their contents may go.
        let result = unsafe { reclaim::free_part(&entry.host, piece.offset, piece.len) };
        let c = &self.counters;
        c.calls.fetch_add(1, Ordering::Relaxed);
        let parts = if on_worker {
            &c.worker_parts
        } else {
            &c.inline_parts
        };
        parts.fetch_add(1, Ordering::Relaxed);
        match result {
            Ok(()) => {
                c.bytes.fetch_add(piece.len, Ordering::Relaxed);
                c.per_node[entry.node_index].fetch_add(piece.len, Ordering::Relaxed);
                part.finish(true);
            }
            Err(e) => {
                if c.failures.fetch_add(1, Ordering::Relaxed) < LOGGED_FAILURES {
                    log::warn!("discard: {e}");
                }
                part.finish(false);
            }
        }
    }

    /// [`DiscardPool::discard_after`]'s work. On a first `try_`, a batch
    /// with a part not freed is submitted once more (its own ranges, no
    /// prelude), from its `done` while it is still in flight, before the
    /// caller's `done` hears of it.
    fn submit(
        self: &Arc<Self>,
        ranges: &[(u64, u64)],
        fence: &[(u64, u64)],
        before: Option<DiscardPrelude>,
        done: DiscardDone,
        try_: Try,
    ) {
        let shared = self;
        let (done, fails) = match try_ {
            Try::First => {
                let first = !shared.first_taken.swap(true, Ordering::Relaxed);
                let fails = first && shared.failing_tries >= 1;
                let retry_fails = first && shared.failing_tries >= 2;
                (shared.retrying(ranges, done, retry_fails), fails)
            }
            Try::Retry { fails } => (done, fails),
        };
        let table = &shared.table;
        let t = table.translate(ranges);
        let c = &shared.counters;
        c.batches.fetch_add(1, Ordering::Relaxed);
        c.ranges.fetch_add(ranges.len() as u64, Ordering::Relaxed);
        c.refused_bytes
            .fetch_add(t.refused_bytes, Ordering::Relaxed);
        c.unaligned_bytes
            .fetch_add(t.unaligned_bytes, Ordering::Relaxed);
        let outcome = DiscardOutcome {
            bytes_freed: 0,
            ranges: ranges.len() as u64,
            failed: 0,
            refused_bytes: t.refused_bytes,
            unaligned_bytes: t.unaligned_bytes,
        };
        if t.pieces.is_empty() {
            if let Some(before) = before {
                shared.prelude(before);
            }
            done(outcome);
            return;
        }
        let total: u64 = t.pieces.iter().map(|p| p.len).sum();
        let mut guest: Vec<(u64, u64)> = t.pieces.iter().map(|p| table.guest_range(p)).collect();
        if table.serial || !fence.is_empty() {
            // Listed sorted and merged, as `overlaps` needs (serial pieces
            // come in the order given; the fence is the caller's).
            guest.extend_from_slice(fence);
            guest = sorted_merged(guest);
        }
        let id = shared.in_flight.register(guest);
        let batch = Arc::new(Batch {
            id,
            fails,
            remaining: AtomicUsize::new(t.pieces.len()),
            freed: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            outcome,
            done: Mutex::new(Some(done)),
            in_flight: shared.in_flight.clone(),
        });
        let first_node = table.node_index(&t.pieces[0]);
        let parts: Vec<Part> = t
            .pieces
            .into_iter()
            .map(|piece| Part {
                piece,
                batch: batch.clone(),
                ended: false,
            })
            .collect();
        if table.serial || total < shared.inline_threshold_bytes {
            if let Some(before) = before {
                shared.prelude(before);
            }
            for part in parts {
                shared.free(part, false);
            }
            return;
        }
        let Some(before) = before else {
            shared.dispatch(parts);
            return;
        };
        let queue = &shared.queues[first_node];
        let mut q = queue.lock();
        if q.len() < shared.queue_depth && !shared.stopping.load(Ordering::Acquire) {
            q.push_back(Job::Prelude(before, parts));
            drop(q);
            queue.ready.notify_one();
        } else {
            drop(q);
            shared.prelude(before);
            shared.dispatch(parts);
        }
    }

    /// `done`, behind one retry of `ranges` if the batch ends with a part
    /// not freed (a failed call; not a stop). Weak: a batch never keeps the
    /// pool (and the guest memory it maps) alive.
    fn retrying(
        self: &Arc<Self>,
        ranges: &[(u64, u64)],
        done: DiscardDone,
        fails: bool,
    ) -> DiscardDone {
        let pool = Arc::downgrade(self);
        let ranges = ranges.to_vec();
        Box::new(move |outcome: DiscardOutcome| {
            let pool = pool
                .upgrade()
                .filter(|p| outcome.failed > 0 && !p.stopping.load(Ordering::Acquire));
            match pool {
                Some(p) => {
                    log::warn!(
                        "discard: {} part(s) of a batch of {} ranges not freed; retrying it",
                        outcome.failed,
                        ranges.len()
                    );
                    p.submit(&ranges, &[], None, done, Try::Retry { fails });
                }
                None => done(outcome),
            }
        })
    }

    /// Runs a batch's prelude, after `delay_before_free` as a part waits
    /// (a slow discard is slow from its first step); not at all once the
    /// pool stops (its parts then end as not freed).
    fn prelude(&self, before: DiscardPrelude) {
        if (self.delay_before_free.is_zero() || self.delay())
            && !self.stopping.load(Ordering::Acquire)
        {
            before();
        }
    }

    /// Pushes each part onto its node's queue, or frees it here where the
    /// queue is full or the pool stopping.
    fn dispatch(&self, parts: Vec<Part>) {
        for part in parts {
            let queue = &self.queues[self.table.node_index(&part.piece)];
            let mut q = queue.lock();
            if q.len() < self.queue_depth && !self.stopping.load(Ordering::Acquire) {
                q.push_back(Job::Part(part));
                drop(q);
                queue.ready.notify_one();
            } else {
                drop(q);
                self.free(part, false);
            }
        }
    }

    /// A worker's loop: take jobs of queue `q` until the pool stops.
    fn work(&self, q: usize) {
        let queue = &self.queues[q];
        loop {
            let job = {
                let mut parts = queue.lock();
                loop {
                    if self.stopping.load(Ordering::Acquire) {
                        return;
                    }
                    if let Some(p) = parts.pop_front() {
                        break p;
                    }
                    parts = queue.ready.wait(parts).unwrap_or_else(|e| e.into_inner());
                }
            };
            // A panic (in a batch's `done`, a prelude) ends that part (or
            // the prelude's parts) as failed, from its drop guard; the
            // worker carries on.
            let ran = std::panic::catch_unwind(AssertUnwindSafe(|| match job {
                Job::Part(part) => self.free(part, true),
                Job::Prelude(before, parts) => {
                    self.prelude(before);
                    self.dispatch(parts);
                }
            }));
            if let Err(payload) = ran {
                log::error!(
                    "discard worker panicked: {}",
                    crate::util::panic_text(&*payload)
                );
            }
        }
    }

    /// Stops the workers and ends every queued part as not freed.
    fn stop(&self) {
        self.stopping.store(true, Ordering::Release);
        {
            let _g = self.halt.lock().unwrap_or_else(|e| e.into_inner());
            self.halted.notify_all();
        }
        for q in &self.queues {
            let left: Vec<Job> = q.lock().drain(..).collect();
            q.ready.notify_all();
            if !left.is_empty() {
                log::debug!(
                    "discard: {} queued part(s) not freed at shutdown",
                    left.len()
                );
            }
            self.counters
                .failures
                .fetch_add(left.len() as u64, Ordering::Relaxed);
            drop(left);
        }
    }
}

/// Workers that ended, by name: each pushes its name from a drop guard
/// after it let go of the shared state.
#[derive(Default)]
struct Exits {
    names: Mutex<Vec<String>>,
    changed: Condvar,
}

struct ExitGuard {
    exits: Arc<Exits>,
    name: String,
}

impl Drop for ExitGuard {
    fn drop(&mut self) {
        self.exits
            .names
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(std::mem::take(&mut self.name));
        self.exits.changed.notify_all();
    }
}

/// The persistent per-node pool that frees ranges a running guest gives
/// back. Dropping it without [`DiscardPool::shutdown`] stops the workers
/// without waiting for them.
pub struct DiscardPool {
    shared: Option<Arc<Shared>>,
    workers: Vec<(String, JoinHandle<()>)>,
    exits: Arc<Exits>,
}

impl std::fmt::Debug for DiscardPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.workers.iter().map(|w| w.0.as_str()).collect();
        f.debug_struct("DiscardPool")
            .field("workers", &names)
            .finish_non_exhaustive()
    }
}

impl DiscardPool {
    /// Builds the translation table of `memory` and starts
    /// `opts.workers_per_node` workers per node of its slices, named
    /// `discard-n{node}-{i}` and pinned to the node's CPUs that this process
    /// may use (unpinned where there are none, as reclaim workers). The pool
    /// holds a view of `memory` until [`DiscardPool::shutdown`].
    pub fn start(
        memory: &GuestMemory,
        topology: &HostTopology,
        opts: &DiscardOptions,
    ) -> Result<DiscardPool, DiscardError> {
        if opts.workers_per_node == 0 && !opts.serial {
            return Err(DiscardError::InvalidOptions("workers_per_node is 0".into()));
        }
        if opts.queue_depth == 0 {
            return Err(DiscardError::InvalidOptions("queue_depth is 0".into()));
        }
        if opts.min_page_bytes != 0 && !opts.min_page_bytes.is_power_of_two() {
            return Err(DiscardError::InvalidOptions(format!(
                "min_page_bytes {} is not a power of two",
                opts.min_page_bytes
            )));
        }
        let page_bytes = (sys::page_size() as u64)
            .max(memory.hugetlb_page_bytes().unwrap_or(0))
            .max(opts.min_page_bytes);
        let view = memory.view();
        let mut table = Table::new(memory, page_bytes)?;
        table.serial = opts.serial;
        let nodes = table.nodes.clone();
        let shared = Arc::new(Shared {
            queues: nodes.iter().map(|_| NodeQueue::default()).collect(),
            stopping: AtomicBool::new(false),
            counters: Counters {
                bytes: AtomicU64::new(0),
                per_node: nodes.iter().map(|_| AtomicU64::new(0)).collect(),
                ranges: AtomicU64::new(0),
                batches: AtomicU64::new(0),
                calls: AtomicU64::new(0),
                failures: AtomicU64::new(0),
                refused_bytes: AtomicU64::new(0),
                unaligned_bytes: AtomicU64::new(0),
                inline_parts: AtomicU64::new(0),
                worker_parts: AtomicU64::new(0),
            },
            in_flight: Arc::new(InFlight::default()),
            started: Instant::now(),
            inline_threshold_bytes: opts.inline_threshold_bytes,
            queue_depth: opts.queue_depth,
            delay_before_free: opts.delay_before_free,
            failing_tries: opts.failing_tries,
            first_taken: AtomicBool::new(false),
            halt: Mutex::new(()),
            halted: Condvar::new(),
            table,
            _view: view,
        });
        let mut pool = DiscardPool {
            shared: Some(shared.clone()),
            workers: Vec::new(),
            exits: Arc::new(Exits::default()),
        };
        let allowed = sys::get_affinity().unwrap_or_default();
        for (q, &node) in nodes.iter().enumerate() {
            let cpus = node_cpus(topology, node, &allowed);
            let workers = if opts.serial {
                0
            } else {
                opts.workers_per_node
            };
            for i in 0..workers {
                let name = format!("discard-n{node}-{i}");
                let guard = ExitGuard {
                    exits: pool.exits.clone(),
                    name: name.clone(),
                };
                let (mine, cpus, hook) =
                    (shared.clone(), cpus.clone(), opts.on_worker_start.clone());
                let thread_name = name.clone();
                let spawned = std::thread::Builder::new()
                    .name(name.clone())
                    .spawn(move || {
                        // Dropped in reverse order: `mine` (and with it the
                        // view) before the guard reports the exit.
                        let _guard = guard;
                        let mine = mine;
                        pin_current(&thread_name, cpus);
                        if let Some(hook) = hook {
                            hook(&thread_name);
                        }
                        mine.work(q);
                    });
                match spawned {
                    Ok(h) => pool.workers.push((name, h)),
                    Err(source) => {
                        // Stops and joins the ones already started.
                        drop(shared);
                        let _ = pool.shutdown(Instant::now() + SPAWN_FAILURE_JOIN);
                        return Err(DiscardError::Spawn { name, source });
                    }
                }
            }
        }
        Ok(pool)
    }

    fn shared(&self) -> &Shared {
        self.shared_arc()
    }

    fn shared_arc(&self) -> &Arc<Shared> {
        // Only `shutdown` (which consumes the pool) and `Drop` take it.
        self.shared
            .as_ref()
            .expect("discard pool used after shutdown")
    }

    /// The page size discards are aligned to.
    pub fn page_bytes(&self) -> u64 {
        self.shared().table.page_bytes
    }

    /// Frees the guest ranges `(guest_addr, len)` of one batch and calls
    /// `done` once with the outcome when all is freed (or failed): before
    /// this returns for a batch below the inline threshold (or with nothing
    /// to free), else from the worker that ends the last part. Ranges are
    /// clipped to guest RAM (the rest is refused and counted), split at
    /// slice and stripe ends, merged, and aligned inward to whole pages.
    /// A batch that ends with a part not freed (a failed `madvise` or
    /// hole punch; not a stop) is submitted once more before `done` hears
    /// of it, and `done` gets the retry's outcome. Until `done` has
    /// returned, [`DiscardPool::wait_overlapping`] waits for this batch
    /// (and its retry): what `done` submits again is fenced without a gap.
    pub fn discard(&self, ranges: &[(u64, u64)], done: DiscardDone) {
        self.shared_arc()
            .submit(ranges, &[], None, done, Try::First);
    }

    /// As [`DiscardPool::discard`], but `before` runs first, once, and no
    /// part is freed until it has returned: on a worker of the first
    /// part's node where the batch goes to the workers (so the caller
    /// returns at once), else on the caller's thread. Until `done` is
    /// called, [`DiscardPool::wait_overlapping`] waits for the batch's
    /// ranges and for `fence` too (what `before` changes: virtio-mem's
    /// emptied slots). At a shutdown a prelude not yet run is dropped
    /// unrun and its parts end as not freed.
    pub fn discard_after(
        &self,
        ranges: &[(u64, u64)],
        fence: &[(u64, u64)],
        before: DiscardPrelude,
        done: DiscardDone,
    ) {
        self.shared_arc()
            .submit(ranges, fence, Some(before), done, Try::First);
    }

    /// Waits until no batch that frees any of `ranges` is in flight, or
    /// `deadline` passes ([`DiscardError::StillInFlight`]). For a deflate:
    /// pages given back and acknowledged before they were freed must not be
    /// handed to the guest again while a worker may still free them.
    pub fn wait_overlapping(
        &self,
        ranges: &[(u64, u64)],
        deadline: Instant,
    ) -> Result<(), DiscardError> {
        let in_flight = &self.shared().in_flight;
        let mut s = in_flight.lock();
        loop {
            let batches = s
                .batches
                .iter()
                .filter(|(_, b)| ranges.iter().any(|&(a, l)| overlaps(b, a, l)))
                .count();
            if batches == 0 {
                return Ok(());
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(DiscardError::StillInFlight { batches });
            }
            s = in_flight
                .changed
                .wait_timeout(s, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Waits until no batch is in flight, or `deadline` passes.
    pub fn wait_idle(&self, deadline: Instant) -> Result<(), DiscardError> {
        self.wait_overlapping(&[(0, u64::MAX)], deadline)
    }

    /// The counters now.
    pub fn snapshot(&self) -> DiscardSnapshot {
        let shared = self.shared();
        let c = &shared.counters;
        let (in_flight_batches, busy_ns) = {
            let s = shared.in_flight.lock();
            let now = s.busy_since.map_or(0, |t| t.elapsed().as_nanos() as u64);
            (s.batches.len(), s.busy_ns + now)
        };
        let bytes = c.bytes.load(Ordering::Relaxed);
        DiscardSnapshot {
            bytes_discarded: bytes,
            per_node: shared
                .table
                .nodes
                .iter()
                .zip(&c.per_node)
                .map(|(&node, b)| NodeDiscard {
                    node,
                    bytes: b.load(Ordering::Relaxed),
                })
                .collect(),
            ranges: c.ranges.load(Ordering::Relaxed),
            batches: c.batches.load(Ordering::Relaxed),
            calls: c.calls.load(Ordering::Relaxed),
            failures: c.failures.load(Ordering::Relaxed),
            refused_bytes: c.refused_bytes.load(Ordering::Relaxed),
            unaligned_bytes: c.unaligned_bytes.load(Ordering::Relaxed),
            inline_parts: c.inline_parts.load(Ordering::Relaxed),
            worker_parts: c.worker_parts.load(Ordering::Relaxed),
            in_flight_batches,
            busy_ns,
            uptime_ns: shared.started.elapsed().as_nanos() as u64,
            rate_bytes_per_sec: if busy_ns == 0 {
                0.0
            } else {
                bytes as f64 * 1e9 / busy_ns as f64
            },
        }
    }

    /// Stops the pool now, from any thread, without waiting: workers end
    /// after the part they free (a part waiting out `delay_before_free`
    /// gives up), what is queued ends as not freed, and later discards free
    /// nothing. For a shutdown that must not wait behind a discard; call
    /// [`DiscardPool::shutdown`] afterwards to join the workers.
    pub fn cancel(&self) {
        self.shared().stop();
    }

    /// Stops the workers, ends what is still queued as not freed (its
    /// batches' `done` are called, with those parts counted as failed),
    /// joins the workers that end by `deadline` and lets go of the guest
    /// memory view, so `GuestMemory::reclaim` can run. A worker still in
    /// the kernel at the deadline is left behind
    /// ([`DiscardError::WorkersLeftBehind`]): it holds the view until it
    /// ends, so reclaim then refuses and the memory is unmapped when it
    /// ends, never under it.
    pub fn shutdown(mut self, deadline: Instant) -> Result<(), DiscardError> {
        let Some(shared) = self.shared.take() else {
            return Ok(());
        };
        shared.stop();
        drop(shared);
        let expected = self.workers.len();
        {
            let mut names = self.exits.names.lock().unwrap_or_else(|e| e.into_inner());
            while names.len() < expected {
                let now = Instant::now();
                if now >= deadline {
                    break;
                }
                names = self
                    .exits
                    .changed
                    .wait_timeout(names, deadline - now)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
        }
        let ended: Vec<String> = self
            .exits
            .names
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let mut left = Vec::new();
        for (name, handle) in std::mem::take(&mut self.workers) {
            if ended.contains(&name) {
                // It has let go of the shared state; only thread exit is left.
                if handle.join().is_err() {
                    log::warn!("{name} panicked");
                }
            } else {
                left.push(name);
            }
        }
        if left.is_empty() {
            Ok(())
        } else {
            Err(DiscardError::WorkersLeftBehind { names: left })
        }
    }
}

impl Drop for DiscardPool {
    fn drop(&mut self) {
        if let Some(shared) = self.shared.take() {
            shared.stop();
        }
    }
}

#[cfg(test)]
#[path = "discard_tests.rs"]
mod tests;
