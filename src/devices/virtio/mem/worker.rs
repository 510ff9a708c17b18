//! The device's thread: the shared loop ([`crate::devices::virtio::worker`])
//! with a [`MemWorker`] as its handler.
//!
//! | event | does |
//! |---|---|
//! | the queue's eventfd (the transport's, also the ioeventfd) | [`MemWorker::process_queue`] |
//! | the wake eventfd (an activation, a pass cut at its limit) | [`MemWorker::process_queue`] |
//!
//! Each request is taken and checked under the device's lock
//! ([`VirtioMem::next_step`]); if it needs the sink, the lock is let go
//! (after signalling the responses written so far) while the sink works,
//! then taken again to commit and answer ([`VirtioMem::finish_plug`],
//! [`VirtioMem::finish_unplug`]). Only this thread takes requests, so one
//! request is outside the lock at a time and the next waits for it.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use super::device::{Step, VirtioMem};
use super::{HotplugSink, MemMetrics};
use crate::devices::virtio::{DeviceMemory, PendingQueues, QueueHandler, Wake};

/// Most requests answered in one pass (then the wake eventfd runs the rest,
/// so the exit eventfd is looked at in between).
pub const MAX_REQUESTS_PER_PASS: usize = 64;

/// Runs a virtio-mem device's queue: the handler of its thread's loop.
pub struct MemWorker<M: DeviceMemory> {
    device: Arc<Mutex<VirtioMem<M>>>,
    sink: Arc<dyn HotplugSink>,
    wake: Arc<Wake>,
    metrics: Arc<MemMetrics>,
}

impl<M: DeviceMemory> std::fmt::Debug for MemWorker<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemWorker").finish_non_exhaustive()
    }
}

fn lock<M: DeviceMemory>(d: &Mutex<VirtioMem<M>>) -> MutexGuard<'_, VirtioMem<M>> {
    d.lock().unwrap_or_else(PoisonError::into_inner)
}

impl<M: DeviceMemory> MemWorker<M> {
    /// The handler for `device`, for its thread's loop
    /// ([`crate::devices::virtio::Worker::start`]).
    pub fn new(device: &Arc<Mutex<VirtioMem<M>>>) -> MemWorker<M> {
        let d = lock(device);
        MemWorker {
            sink: d.sink.clone(),
            wake: d.wake.clone(),
            metrics: d.shared_metrics(),
            device: device.clone(),
        }
    }

    /// One bounded pass over the queue.
    pub fn process_queue(&self) {
        for _ in 0..MAX_REQUESTS_PER_PASS {
            let mut d = lock(&self.device);
            match d.next_step() {
                Step::Idle => {
                    d.flush_used();
                    return;
                }
                Step::Done => {}
                Step::Plug(p) => {
                    d.flush_used();
                    drop(d);
                    let result = self.sink.plug(p.range, &p.map_slots);
                    let undo = lock(&self.device).finish_plug(p, result);
                    // A PLUG that crossed a reset: its slots go out again.
                    if let Some(u) = undo {
                        self.sink.unplug(&u.ranges, &u.unmap_slots);
                    }
                }
                Step::Unplug(u) => {
                    d.flush_used();
                    drop(d);
                    self.sink.unplug(&u.ranges, &u.unmap_slots);
                    lock(&self.device).finish_unplug(u);
                }
            }
        }
        lock(&self.device).flush_used();
        if self.wake.again(&[0]).is_err() {
            self.metrics.queue_event_fails.inc();
        }
    }
}

impl<M: DeviceMemory> QueueHandler for MemWorker<M> {
    fn wake(&self) -> Arc<Wake> {
        self.wake.clone()
    }

    fn queue_event(&mut self, _index: usize) {
        self.metrics.queue_event_count.inc();
        self.process_queue();
    }

    fn wake_event(&mut self, _pending: PendingQueues) {
        self.process_queue();
    }
}
