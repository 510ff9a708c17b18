//! What the discard pool and its workers share, and the path a batch takes
//! through it: translated by the table, registered in flight, freed on the
//! caller's thread or cut into parts pushed onto their node's bounded queue
//! (a `Mutex<VecDeque>` and a `Condvar`), taken by the node's workers
//! (`discard-n{node}-{i}`, their loop is [`Shared::work`]) and freed through
//! the reclaim executor's free path; a failed batch retried once; the stop
//! that ends what is queued as not freed. The counters are atomics.

use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::memory::range::{sorted_merged, GuestRange};
use crate::memory::reclaim;
use crate::memory::view::GuestView;

use super::inflight::{InFlight, Part, Try};
use super::table::Table;
use super::{
    DiscardDone, DiscardOptions, DiscardOutcome, DiscardPrelude, DiscardSnapshot, NodeDiscard,
    LOGGED_FAILURES,
};

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
pub(super) struct Shared {
    // Its raw host addresses and fds are valid while `_view` is.
    pub(super) table: Table,
    queues: Vec<NodeQueue>,
    stopping: AtomicBool,
    counters: Counters,
    pub(super) in_flight: Arc<InFlight>,
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
    /// The state of a pool over `table` (one queue per node of it), whose
    /// mappings `view` keeps alive.
    pub(super) fn new(table: Table, opts: &DiscardOptions, view: GuestView) -> Shared {
        let nodes = table.nodes.len();
        Shared {
            queues: (0..nodes).map(|_| NodeQueue::default()).collect(),
            stopping: AtomicBool::new(false),
            counters: Counters {
                bytes: AtomicU64::new(0),
                per_node: (0..nodes).map(|_| AtomicU64::new(0)).collect(),
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
        }
    }

    /// The counters now.
    pub(super) fn snapshot(&self) -> DiscardSnapshot {
        let c = &self.counters;
        let (in_flight_batches, busy_ns) = self.in_flight.load();
        let bytes = c.bytes.load(Ordering::Relaxed);
        DiscardSnapshot {
            bytes_discarded: bytes,
            per_node: self
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
            uptime_ns: self.started.elapsed().as_nanos() as u64,
            rate_bytes_per_sec: if busy_ns == 0 {
                0.0
            } else {
                bytes as f64 * 1e9 / busy_ns as f64
            },
        }
    }

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

    /// [`DiscardPool::discard_after`](super::DiscardPool::discard_after)'s work. On a first `try_`, a batch
    /// with a part not freed is submitted once more (its own ranges, no
    /// prelude), from its `done` while it is still in flight, before the
    /// caller's `done` hears of it.
    pub(super) fn submit(
        self: &Arc<Self>,
        ranges: &[GuestRange],
        fence: &[GuestRange],
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
        let mut guest: Vec<GuestRange> = t.pieces.iter().map(|p| table.guest_range(p)).collect();
        if table.serial || !fence.is_empty() {
            // Listed sorted and merged, as `overlaps_any` needs (serial pieces
            // come in the order given; the fence is the caller's).
            guest.extend_from_slice(fence);
            guest = sorted_merged(guest);
        }
        let batch = shared
            .in_flight
            .batch(guest, t.pieces.len(), fails, outcome, done);
        let first_node = table.node_index(&t.pieces[0]);
        let parts: Vec<Part> = t
            .pieces
            .into_iter()
            .map(|piece| Part::new(piece, batch.clone()))
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
        ranges: &[GuestRange],
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
    pub(super) fn work(&self, q: usize) {
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
    pub(super) fn stop(&self) {
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
