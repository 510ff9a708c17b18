//! The balloon's thread: the shared loop ([`crate::devices::virtio::worker`])
//! with a [`BalloonWorker`] as its handler.
//!
//! | event | does |
//! |---|---|
//! | the balloon's wake eventfd | [`Balloon::process_wake`]: sink completions, left-over passes |
//! | queue `i`'s eventfd (the transport's, also the ioeventfd) | [`Balloon::process_queue`]`(i)` |
//! | (poll timeout) | [`Balloon::process_stats_timer`] at the statistics deadline |
//!
//! Each event locks the balloon for its pass, takes the work for the sink
//! ([`Balloon::take_sink_work`]) and lets go of the lock before it hands
//! that work to the sink ([`super::SinkWork::send`]): a slow discard never
//! stalls a vCPU, the API or a shutdown behind that lock.
//!
//! Syscalls it makes, for its seccomp role: the loop's (`epoll_wait`,
//! `read` and `write` on eventfds), `futex` (the balloon's lock, the
//! completion channel), and whatever the sink does inline in
//! [`super::DiscardSink::discard`].

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use super::Balloon;
use crate::devices::virtio::{DeviceMemory, PendingQueues, QueueHandler, Wake};

/// Runs a balloon's queue work: the handler of its thread's loop.
pub struct BalloonWorker<M: DeviceMemory> {
    balloon: Arc<Mutex<Balloon<M>>>,
    wake: Arc<Wake>,
}

impl<M: DeviceMemory> std::fmt::Debug for BalloonWorker<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BalloonWorker").finish_non_exhaustive()
    }
}

impl<M: DeviceMemory> BalloonWorker<M> {
    /// The handler for `balloon`, for its thread's loop
    /// ([`crate::devices::virtio::Worker::start`]): woken by the queue
    /// eventfds, its wake eventfd and the statistics deadline.
    pub fn new(balloon: &Arc<Mutex<Balloon<M>>>) -> BalloonWorker<M> {
        let wake = lock(balloon).wake.clone();
        BalloonWorker {
            balloon: balloon.clone(),
            wake,
        }
    }
}

fn lock<M: DeviceMemory>(b: &Mutex<Balloon<M>>) -> MutexGuard<'_, Balloon<M>> {
    b.lock().unwrap_or_else(PoisonError::into_inner)
}

impl<M: DeviceMemory> BalloonWorker<M> {
    /// Runs `pass` under the balloon's lock, then hands its sink work over
    /// with the lock let go.
    fn pass(&self, pass: impl FnOnce(&mut Balloon<M>)) {
        let mut b = lock(&self.balloon);
        pass(&mut b);
        let work = b.take_sink_work();
        drop(b);
        work.send();
    }
}

impl<M: DeviceMemory> QueueHandler for BalloonWorker<M> {
    const TIMED: bool = true;

    fn wake(&self) -> Arc<Wake> {
        self.wake.clone()
    }

    fn queue_event(&mut self, index: usize) {
        self.pass(|b| b.process_queue(index));
    }

    fn wake_event(&mut self, pending: PendingQueues) {
        self.pass(|b| b.process_wake(pending));
    }

    fn next_timeout(&self, now: Instant) -> Option<Duration> {
        lock(&self.balloon).stats_timeout(now)
    }

    fn timers(&mut self, now: Instant) {
        lock(&self.balloon).process_stats_timer(now);
    }
}
