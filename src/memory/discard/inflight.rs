//! The discard pool's batches in flight: the registry of their guest
//! ranges (one lock and a `Condvar`, which the fence waits on) with the busy
//! time, a batch counting its parts down to its `done`, and the part that
//! ends as failed from its drop guard if nothing ends it (a panic, a
//! shutdown), so every batch completes and leaves the registry.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Instant;

use crate::memory::range::{overlaps_any, GuestRange};

use super::table::HostPiece;
use super::{DiscardDone, DiscardOutcome};

/// Batches in flight, with their (freed) guest ranges, and the busy time.
#[derive(Debug, Default)]
struct InFlightState {
    next_id: u64,
    /// (batch id, its guest ranges sorted by address).
    batches: Vec<(u64, Vec<GuestRange>)>,
    busy_since: Option<Instant>,
    busy_ns: u64,
}

/// The registry of batches in flight.
#[derive(Debug, Default)]
pub(super) struct InFlight {
    state: Mutex<InFlightState>,
    changed: Condvar,
}

impl InFlight {
    fn lock(&self) -> MutexGuard<'_, InFlightState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn register(&self, ranges: Vec<GuestRange>) -> u64 {
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

    /// A batch of `parts` parts, its guest ranges `ranges` (sorted by
    /// address) listed in flight until its last part ends.
    pub(super) fn batch(
        self: &Arc<Self>,
        ranges: Vec<GuestRange>,
        parts: usize,
        fails: bool,
        outcome: DiscardOutcome,
        done: DiscardDone,
    ) -> Arc<Batch> {
        Arc::new(Batch {
            id: self.register(ranges),
            fails,
            remaining: AtomicUsize::new(parts),
            freed: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            outcome,
            done: Mutex::new(Some(done)),
            in_flight: self.clone(),
        })
    }

    /// Waits until no batch that frees any of `ranges` is in flight, or
    /// `deadline` passes: then how many still do.
    pub(super) fn wait_overlapping(
        &self,
        ranges: &[GuestRange],
        deadline: Instant,
    ) -> Result<(), usize> {
        let mut s = self.lock();
        loop {
            let batches = s
                .batches
                .iter()
                .filter(|(_, b)| ranges.iter().any(|r| overlaps_any(b, r)))
                .count();
            if batches == 0 {
                return Ok(());
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(batches);
            }
            s = self
                .changed
                .wait_timeout(s, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Batches in flight now, and the wall time so far with at least one
    /// in flight, in nanoseconds.
    pub(super) fn load(&self) -> (usize, u64) {
        let s = self.lock();
        let now = s.busy_since.map_or(0, |t| t.elapsed().as_nanos() as u64);
        (s.batches.len(), s.busy_ns + now)
    }
}

/// Which try of a batch a submission is.
#[derive(Debug, Clone, Copy)]
pub(super) enum Try {
    /// The caller's: retried once if it fails.
    First,
    /// The retry of a failed one; `fails`: injected to fail too.
    Retry { fails: bool },
}

/// One batch: counts its parts down and calls `done` when the last ends.
pub(super) struct Batch {
    id: u64,
    /// Its parts fail unfreed ([`DiscardOptions::failing_tries`](super::DiscardOptions::failing_tries)).
    pub(super) fails: bool,
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
pub(super) struct Part {
    pub(super) piece: HostPiece,
    pub(super) batch: Arc<Batch>,
    ended: bool,
}

impl Part {
    pub(super) fn new(piece: HostPiece, batch: Arc<Batch>) -> Part {
        Part {
            piece,
            batch,
            ended: false,
        }
    }

    pub(super) fn finish(mut self, freed: bool) {
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
