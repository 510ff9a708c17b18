//! One sink for the balloon and virtio-mem ([`PoolSink`]): the ranges a
//! running guest gives back (inflated pages, free page reports, unplugged
//! blocks) go to the memory layer's per-node discard pool
//! ([`crate::memory::DiscardPool`]), which frees them in parallel on
//! workers pinned to each node, with the reclaim executor's free path. The
//! device layer knows nothing of nodes or host addresses; the memory layer
//! nothing of virtio: this adapter is the boundary. It is the balloon's
//! [`DiscardSink`]; virtio-mem's sink
//! ([`super::hotplug_slots::HotplugSlots`]) frees through it.

use std::sync::{PoisonError, RwLock, RwLockReadGuard};
use std::time::{Duration, Instant};

use crate::faults;

use crate::devices::virtio::balloon::{DiscardAck, DiscardKind, DiscardSink};
use crate::memory::{
    DiscardOptions, DiscardPool, DiscardSnapshot, GuestMemory, GuestRange, HostTopology,
};

/// The discard pool behind the balloon and virtio-mem; gone once shut
/// down. Read-locked by every use (the devices' threads, the API's
/// counters), write-locked only to shut it down. Nothing waits on the pool here: the balloon parks a
/// deflate of pages still being freed until their batch's ack comes back.
pub struct PoolSink {
    pool: RwLock<Option<DiscardPool>>,
}

impl PoolSink {
    /// Starts the pool over `memory`'s slices: `workers_per_node` workers
    /// per node (each installs the `discard` filter once pinned), freeing
    /// whole pages of at least `page_bytes`; 0 workers is serial (every
    /// batch freed on the balloon's thread, one call per range, as
    /// Firecracker does).
    pub fn start(
        memory: &GuestMemory,
        topology: &HostTopology,
        workers_per_node: u32,
        page_bytes: u64,
    ) -> Result<PoolSink, String> {
        let opts = DiscardOptions {
            workers_per_node,
            serial: workers_per_node == 0,
            min_page_bytes: page_bytes,
            on_worker_start: Some(std::sync::Arc::new(|_name: &str| {
                crate::seccomp::install_thread(crate::seccomp::Role::Discard)
            })),
            delay_before_free: if faults::injected(faults::SLOW_DISCARD) {
                faults::SLOW_DISCARD_DELAY
            } else {
                Duration::ZERO
            },
            failing_tries: if faults::injected(faults::DISCARD_FAILS_TWICE) {
                2
            } else {
                u8::from(faults::injected(faults::DISCARD_FAILS_ONCE))
            },
            ..DiscardOptions::default()
        };
        let pool = DiscardPool::start(memory, topology, &opts).map_err(|e| e.to_string())?;
        Ok(PoolSink {
            pool: RwLock::new(Some(pool)),
        })
    }

    fn lock(&self) -> RwLockReadGuard<'_, Option<DiscardPool>> {
        self.pool.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// Stops the pool at once, without waiting (a shutdown's first step,
    /// before the device threads are joined): a discard waiting or queued
    /// ends as not freed, so no device thread waits behind one.
    pub fn cancel(&self) {
        if let Some(pool) = self.lock().as_ref() {
            pool.cancel();
        }
    }

    /// Stops the workers and lets go of guest memory (before reclaim). A
    /// device thread the stop gave up on may still hold the pool (an inline
    /// discard, a fence wait): past `deadline` the pool is cancelled and
    /// left to it (its workers end; the memory view they share is let go
    /// when that thread does), never waited for.
    pub fn shutdown(&self, deadline: Instant) {
        let pool = loop {
            match self.pool.try_write() {
                Ok(mut g) => break g.take(),
                Err(std::sync::TryLockError::Poisoned(p)) => break p.into_inner().take(),
                Err(std::sync::TryLockError::WouldBlock) => {
                    if Instant::now() >= deadline {
                        self.cancel();
                        log::error!(
                            "the discard pool is still in use at the stop's deadline; cancelled \
                             and left to the thread that holds it"
                        );
                        return;
                    }
                    // std's RwLock has no timed lock.
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        };
        if let Some(pool) = pool {
            if let Err(e) = pool.shutdown(deadline) {
                log::error!("balloon discard pool: {e}");
            }
        }
    }

    /// Waits until no discard overlapping `ranges` is in flight, or
    /// `deadline`: false if one still was (the virtio-mem PLUG fence). A
    /// pool shut down has nothing in flight.
    pub fn wait_overlapping(&self, ranges: &[GuestRange], deadline: Instant) -> bool {
        match self.lock().as_ref() {
            Some(pool) => pool.wait_overlapping(ranges, deadline).is_ok(),
            None => true,
        }
    }

    /// Frees the guest ranges of one batch behind (virtio-mem UNPLUG),
    /// `done` called with the outcome; with `after`, its prelude runs first
    /// (on a worker) and the fence is held over its ranges too
    /// ([`crate::memory::DiscardPool::discard_after`]: an UNPLUG's emptied
    /// slots leave KVM there). A pool shut down frees nothing, runs no
    /// prelude (the VM is stopping) and calls `done` with the ranges failed.
    pub fn discard_ranges(
        &self,
        ranges: &[GuestRange],
        after: Option<(&[GuestRange], crate::memory::DiscardPrelude)>,
        done: crate::memory::DiscardDone,
    ) {
        match (self.lock().as_ref(), after) {
            (Some(pool), None) => pool.discard(ranges, done),
            (Some(pool), Some((fence, before))) => pool.discard_after(ranges, fence, before, done),
            (None, _) => done(crate::memory::DiscardOutcome {
                ranges: ranges.len() as u64,
                failed: ranges.len() as u64,
                ..Default::default()
            }),
        }
    }

    /// The pool's counters (zeros once shut down).
    pub fn snapshot(&self) -> Option<DiscardSnapshot> {
        self.lock().as_ref().map(DiscardPool::snapshot)
    }
}

impl DiscardSink for PoolSink {
    fn discard(&self, kind: DiscardKind, ranges: Vec<GuestRange>, ack: DiscardAck) {
        let pool = self.lock();
        let Some(pool) = pool.as_ref() else {
            // Shut down: nothing is freed, the guest keeps its pages.
            ack.failed();
            return;
        };
        log::trace!(
            "balloon {kind:?}: {} ranges to the discard pool",
            ranges.len()
        );
        pool.discard(
            &ranges,
            Box::new(move |outcome| {
                if outcome.failed == 0 {
                    ack.freed();
                } else {
                    // The pool retried it once already.
                    log::error!(
                        "balloon {kind:?}: a discard failed twice ({} part(s)); those pages stay \
                         taken by teravm though the guest gave them (the balloon's actual counts \
                         them; discard_fails says so)",
                        outcome.failed
                    );
                    ack.failed();
                }
            }),
        );
    }
}
