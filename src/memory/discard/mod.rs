//! The discard pool: frees the guest ranges a running guest gives back
//! (virtio-balloon inflate, free page reporting) with long-lived worker
//! threads per host node, through the reclaim executor's free path
//! (`reclaim::free_part`: `MADV_DONTNEED`, or a hole punch in the memfd
//! stripe) and its pinning (`workers::node_cpus`, `workers::pin_current`).
//!
//! What it owns: a translation table built once from the slices' mappings
//! (one entry per anonymous slice or memfd stripe: guest range, host range,
//! node, free method) and a [`GuestView`](crate::memory::GuestView) that keeps those mappings alive.
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
//!
//! Where each part lives: this file holds the pool's public API, its
//! options, outcome and snapshot types, and the workers' life cycle
//! (start, cancel, shutdown); `table.rs` the translation, `inflight.rs` the batches
//! in flight and their parts, `queues.rs` what the pool and its workers
//! share and the path a batch takes through it (submit, node queues, the
//! worker's loop, the free, the stop).

mod inflight;
mod queues;
mod table;

use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::guest::GuestMemory;
use super::numa::HostTopology;
use super::range::GuestRange;
use super::sys;
use super::workers::{node_cpus, pin_current};

use inflight::Try;
use queues::Shared;
use table::Table;

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
        let shared = Arc::new(Shared::new(table, opts, view));
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

    /// Frees the guest ranges of one batch and calls `done` once with the
    /// outcome when all is freed (or failed): before this returns for a
    /// batch below the inline threshold (or with nothing to free), else
    /// from the worker that ends the last part. Ranges are
    /// clipped to guest RAM (the rest is refused and counted), split at
    /// slice and stripe ends, merged, and aligned inward to whole pages.
    /// A batch that ends with a part not freed (a failed `madvise` or
    /// hole punch; not a stop) is submitted once more before `done` hears
    /// of it, and `done` gets the retry's outcome. Until `done` has
    /// returned, [`DiscardPool::wait_overlapping`] waits for this batch
    /// (and its retry): what `done` submits again is fenced without a gap.
    pub fn discard(&self, ranges: &[GuestRange], done: DiscardDone) {
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
        ranges: &[GuestRange],
        fence: &[GuestRange],
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
        ranges: &[GuestRange],
        deadline: Instant,
    ) -> Result<(), DiscardError> {
        self.shared()
            .in_flight
            .wait_overlapping(ranges, deadline)
            .map_err(|batches| DiscardError::StillInFlight { batches })
    }

    /// Waits until no batch is in flight, or `deadline` passes.
    pub fn wait_idle(&self, deadline: Instant) -> Result<(), DiscardError> {
        self.wait_overlapping(&[GuestRange::new(0, u64::MAX)], deadline)
    }

    /// The counters now.
    pub fn snapshot(&self) -> DiscardSnapshot {
        self.shared().snapshot()
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
mod tests;
