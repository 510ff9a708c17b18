//! Where inflated and reported guest ranges go to be freed, and how the
//! sink says they are.
//!
//! The balloon hands each batch to a [`DiscardSink`] with a [`DiscardAck`].
//! The sink frees the ranges (production: the per-node discard pool, on its
//! own threads; small batches may be freed inline) and then calls
//! [`DiscardAck::freed`], or [`DiscardAck::failed`]. Dropping the ack without
//! either counts as failed: the ack is a drop guard, so a sink that panics
//! still hands the guest its descriptors back. The ack's completion travels
//! over a channel and wakes the balloon's thread through an eventfd; only
//! that thread touches the queues.
//!
//! An ack completes only once its discard has ended (freed, failed, or
//! abandoned by a stopping pool): the balloon lists each batch as in flight
//! until then, and no page of it goes back to the guest (a deflate, a
//! report's chain, a reset) while it is listed. The sink is called with no
//! lock of the balloon held ([`SinkWork`]): a sink that frees inline, or
//! slowly, stalls only the balloon's thread.

use std::sync::mpsc::Sender;
use std::sync::Arc;

use crate::devices::virtio::{ResetFence, Wake};
use crate::memory::GuestRange;

/// Why the guest gave the ranges back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiscardKind {
    /// Inflated balloon pages: already acknowledged to the guest, which will
    /// not touch them until it deflates them.
    Inflate,
    /// Free page reporting: the guest waits for the acknowledgement, which
    /// comes only after the sink says the ranges are freed.
    Report,
}

/// Frees guest ranges. Every range it is given lies inside guest RAM (one
/// region each) and is aligned to the balloon's discard page size.
pub trait DiscardSink: Send + Sync {
    /// Frees `ranges`, then completes `ack` (from any thread) once nothing
    /// of the discard can reach the ranges any more. The balloon's thread
    /// calls it, holding no lock of the balloon.
    fn discard(&self, kind: DiscardKind, ranges: Vec<GuestRange>, ack: DiscardAck);
}

/// Batches a pass of the balloon made, to hand to the sink once the
/// balloon's lock is let go ([`super::Balloon::take_sink_work`]).
#[must_use = "the batches are listed as in flight until the sink completes them"]
pub struct SinkWork {
    pub(crate) sink: Arc<dyn DiscardSink>,
    pub(crate) batches: Vec<(DiscardKind, Vec<GuestRange>, DiscardAck)>,
}

impl std::fmt::Debug for SinkWork {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SinkWork")
            .field("batches", &self.batches.len())
            .finish_non_exhaustive()
    }
}

impl SinkWork {
    /// Hands every batch to the sink (call with no lock of the balloon held).
    pub fn send(self) {
        for (kind, ranges, ack) in self.batches {
            self.sink.discard(kind, ranges, ack);
        }
    }
}

/// What a completed ack tells the balloon's thread.
#[derive(Debug)]
pub(crate) struct Completion {
    /// The batch (listed in flight until this arrives).
    pub batch: u64,
    /// The activation the batch belongs to (a reset in between makes it
    /// stale: its heads are not returned to the new queues).
    pub epoch: crate::devices::virtio::Epoch,
    pub kind: DiscardKind,
    /// The queue and the chain heads to return to the guest now.
    pub queue: usize,
    pub heads: Vec<u16>,
    pub bytes: u64,
    pub ranges: u64,
    pub freed: bool,
}

/// The sink's promise to say when a batch is freed. Call [`Self::freed`] or
/// [`Self::failed`]; a drop without either is a failure.
#[derive(Debug)]
pub struct DiscardAck {
    done: Option<(Completion, Sender<Completion>, Arc<Wake>)>,
    /// Counts the ack from its making to its completion: a reset waits
    /// for it ([`ResetFence`]).
    fence: Arc<ResetFence>,
}

impl DiscardAck {
    pub(crate) fn new(
        c: Completion,
        tx: Sender<Completion>,
        wake: Arc<Wake>,
        fence: Arc<ResetFence>,
    ) -> DiscardAck {
        fence.begin();
        DiscardAck {
            done: Some((c, tx, wake)),
            fence,
        }
    }

    /// Bytes in the batch.
    pub fn bytes(&self) -> u64 {
        self.done.as_ref().map_or(0, |(c, _, _)| c.bytes)
    }

    /// The ranges are freed.
    pub fn freed(mut self) {
        self.complete(true);
    }

    /// The ranges could not be freed (they stay the guest's, untouched).
    pub fn failed(mut self) {
        self.complete(false);
    }

    fn complete(&mut self, freed: bool) {
        if let Some((mut c, tx, wake)) = self.done.take() {
            c.freed = freed;
            // The balloon may be gone (shutdown): nothing to tell then.
            if tx.send(c).is_ok() {
                let _ = wake.again(&[]);
            }
            // The discard has ended: a reset waiting for it may return.
            self.fence.end();
        }
    }
}

impl Drop for DiscardAck {
    fn drop(&mut self) {
        self.complete(false);
    }
}
