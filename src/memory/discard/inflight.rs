//! The discard pool's batches in flight: the registry of their guest
//! ranges (one lock and a `Condvar`, which the fence waits on) with the busy
//! time, a batch counting its parts down to its `done`, and the part that
//! ends as failed from its drop guard if nothing ends it (a panic, a
//! shutdown), so every batch completes and leaves the registry.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Instant;

use crate::memory::range::GuestRange;

use super::table::HostPiece;
use super::{DiscardDone, DiscardOutcome};

/// Batches in flight, with their (freed) guest ranges, and the busy time.
#[derive(Debug, Default)]
pub(super) struct InFlightState {
    next_id: u64,
    /// (batch id, its guest ranges sorted by address).
    pub(super) batches: Vec<(u64, Vec<GuestRange>)>,
    pub(super) busy_since: Option<Instant>,
    pub(super) busy_ns: u64,
}

/// The registry of batches in flight.
#[derive(Debug, Default)]
pub(super) struct InFlight {
    state: Mutex<InFlightState>,
    pub(super) changed: Condvar,
}

impl InFlight {
    pub(super) fn lock(&self) -> MutexGuard<'_, InFlightState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn register(&self, ranges: Vec<GuestRange>) -> u64 {
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
    pub(super) id: u64,
    /// Its parts fail unfreed ([`DiscardOptions::failing_tries`](super::DiscardOptions::failing_tries)).
    pub(super) fails: bool,
    pub(super) remaining: AtomicUsize,
    pub(super) freed: AtomicU64,
    pub(super) failed: AtomicU64,
    pub(super) outcome: DiscardOutcome,
    pub(super) done: Mutex<Option<DiscardDone>>,
    pub(super) in_flight: Arc<InFlight>,
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
    pub(super) ended: bool,
}

impl Part {
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
