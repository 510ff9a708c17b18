//! A device's thread: one `event-manager` loop with the device as its
//! subscriber, written once for every device.
//!
//! | fd | does |
//! |---|---|
//! | exit eventfd | the loop returns |
//! | the device's wake eventfd ([`Wake`]) | [`QueueHandler::wake_event`] with the queues marked pending |
//! | queue `i`'s eventfd (the transport's, also the ioeventfd) | [`QueueHandler::queue_event`]`(i)` |
//! | the device's own fds ([`QueueHandler::sources`]: a tap, the vsock muxer) | [`QueueHandler::source_event`] |
//! | (poll timeout, [`QueueHandler::next_timeout`]) | [`QueueHandler::timers`] |
//!
//! Every event does one bounded pass: a pass that stops at its limit marks
//! its queue pending and writes the wake eventfd ([`Wake::pass`]), so the
//! rest runs on the next turn of the loop and the exit eventfd is looked at
//! in between. Devices whose work must not take the device's lock (the
//! block device's host I/O) implement [`QueueHandler`] on a worker that owns
//! that work; the others implement it on the device and are run as
//! `Arc<Mutex<Device>>` (locked for each event, as the transport locks it
//! for each register access).
//!
//! Syscalls of the loop, for the device roles (src/seccomp/filters.rs):
//! `epoll_create1` and `epoll_ctl` in [`Worker::start`] (on the VMM thread
//! that builds the devices), then on the device thread `epoll_wait` and
//! `read`/`write` on eventfds, `futex` for the device's lock.

use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use event_manager::{
    EventManager, EventOps, EventSet, Events, MutEventSubscriber, SubscriberId, SubscriberOps,
};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

/// Errors of a device's loop.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// The epoll fd could not be made, or an fd not registered with it.
    #[error("device thread poll: {0}")]
    Poll(event_manager::Error),
}

/// Queues marked pending by a pass cut at its limit (a bit per queue).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Pending(u32);

impl Pending {
    /// Whether queue `q` was marked.
    pub fn has(self, q: usize) -> bool {
        q < 32 && self.0 & (1 << q) != 0
    }
}

/// A device's wake eventfd and its pending flags: how a device asks its own
/// thread for another pass (work left over, an activation, a new backing
/// file).
#[derive(Debug)]
pub struct Wake {
    evt: EventFd,
    pending: AtomicU32,
}

/// How a pass ended ([`Wake::pass`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PassEnd {
    /// Steps run.
    pub steps: usize,
    /// The limit cut the pass and the wake eventfd could not be written.
    pub wake_failed: bool,
}

impl Wake {
    /// A new wake eventfd, nothing pending.
    pub fn new() -> std::io::Result<Wake> {
        Ok(Wake {
            evt: EventFd::new(EFD_NONBLOCK)?,
            pending: AtomicU32::new(0),
        })
    }

    /// The eventfd the device's thread polls.
    pub fn evt(&self) -> &EventFd {
        &self.evt
    }

    /// Marks queue `q` without waking the thread (work that waits for
    /// another event: the next wake runs it).
    pub fn defer(&self, q: usize) {
        if q < 32 {
            self.pending.fetch_or(1 << q, Ordering::SeqCst);
        }
    }

    /// Marks the queues `qs` and wakes the thread.
    pub fn again(&self, qs: &[usize]) -> std::io::Result<()> {
        for &q in qs {
            self.defer(q);
        }
        self.evt.write(1)
    }

    /// Forgets what was marked (a reset).
    pub fn clear(&self) {
        self.pending.store(0, Ordering::SeqCst);
    }

    /// Takes what was marked; the eventfd is read (cleared) first, so a
    /// mark made after this is seen by the next wake.
    pub fn take(&self) -> Pending {
        let _ = self.evt.read();
        Pending(self.pending.swap(0, Ordering::SeqCst))
    }

    /// One bounded pass over queue `q`: runs `step` while it returns true,
    /// at most `limit` times; if the limit cut it, marks `q` and wakes the
    /// thread for the rest.
    pub fn pass(&self, q: usize, limit: usize, mut step: impl FnMut() -> bool) -> PassEnd {
        let mut steps = 0;
        while steps < limit {
            steps += 1;
            if !step() {
                return PassEnd {
                    steps,
                    wake_failed: false,
                };
            }
        }
        PassEnd {
            steps,
            wake_failed: self.again(&[q]).is_err(),
        }
    }
}

/// What a device's thread does for each event (see the module's table).
/// Every call is one bounded pass.
pub trait QueueHandler: Send {
    /// Whether the handler has deadlines ([`Self::next_timeout`],
    /// [`Self::timers`]); when not, the loop never asks.
    const TIMED: bool = false;
    /// The device's wake eventfd and pending flags.
    fn wake(&self) -> Arc<Wake>;
    /// The device's own fds to poll, with their events.
    fn sources(&self) -> Vec<(RawFd, EventSet)> {
        Vec::new()
    }
    /// Queue `index`'s eventfd fired (it was read).
    fn queue_event(&mut self, index: usize);
    /// The wake eventfd fired, with the queues marked since the last one.
    fn wake_event(&mut self, pending: Pending);
    /// Source `index` of [`Self::sources`] is ready.
    fn source_event(&mut self, _index: usize, _events: EventSet) {}
    /// How long the thread may sleep before a deadline (None: none).
    fn next_timeout(&self, _now: Instant) -> Option<Duration> {
        None
    }
    /// Runs the deadlines due at `now` (after every wait).
    fn timers(&mut self, _now: Instant) {}
}

/// A device that takes its lock for each event.
impl<T: QueueHandler> QueueHandler for Arc<Mutex<T>> {
    const TIMED: bool = T::TIMED;
    fn wake(&self) -> Arc<Wake> {
        lock(self).wake()
    }
    fn sources(&self) -> Vec<(RawFd, EventSet)> {
        lock(self).sources()
    }
    fn queue_event(&mut self, index: usize) {
        lock(self).queue_event(index)
    }
    fn wake_event(&mut self, pending: Pending) {
        lock(self).wake_event(pending)
    }
    fn source_event(&mut self, index: usize, events: EventSet) {
        lock(self).source_event(index, events)
    }
    fn next_timeout(&self, now: Instant) -> Option<Duration> {
        lock(self).next_timeout(now)
    }
    fn timers(&mut self, now: Instant) {
        lock(self).timers(now)
    }
}

fn lock<T: ?Sized>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

// Event data: which fd fired.
const EXIT: u32 = 0;
const WAKE: u32 = 1;
const QUEUE0: u32 = 2;
const SOURCE0: u32 = 1 << 16;

/// The loop's subscriber: the handler and the fds that drive it.
struct Subscriber<H> {
    handler: H,
    wake: Arc<Wake>,
    queue_evts: Vec<EventFd>,
    sources: Vec<(RawFd, EventSet)>,
    exit_evt: EventFd,
    exited: bool,
    /// The first fd `init` could not register.
    init_error: Option<event_manager::Error>,
}

impl<H: QueueHandler> MutEventSubscriber for Subscriber<H> {
    fn init(&mut self, ops: &mut EventOps) {
        let mut failed = None;
        let mut add = |fd: RawFd, data: u32, set: EventSet| {
            if let Err(e) = ops.add(Events::with_data_raw(fd, data, set)) {
                failed.get_or_insert(e);
            }
        };
        add(self.exit_evt.as_raw_fd(), EXIT, EventSet::IN);
        add(self.wake.evt().as_raw_fd(), WAKE, EventSet::IN);
        for (i, e) in self.queue_evts.iter().enumerate() {
            add(e.as_raw_fd(), QUEUE0 + i as u32, EventSet::IN);
        }
        for (i, &(fd, set)) in self.sources.iter().enumerate() {
            add(fd, SOURCE0 + i as u32, set);
        }
        // Seen by Worker::start.
        self.init_error = failed;
    }

    fn process(&mut self, events: Events, _ops: &mut EventOps) {
        match events.data() {
            EXIT => self.exited = true,
            _ if self.exited => {}
            WAKE => {
                let pending = self.wake.take();
                self.handler.wake_event(pending);
            }
            d if d >= SOURCE0 => self
                .handler
                .source_event((d - SOURCE0) as usize, events.event_set()),
            d => {
                let i = (d - QUEUE0) as usize;
                if let Some(e) = self.queue_evts.get(i) {
                    let _ = e.read();
                    self.handler.queue_event(i);
                }
            }
        }
    }
}

/// A device's loop: runs `H` on the thread that calls [`Worker::run`].
pub struct Worker<H: QueueHandler> {
    manager: EventManager<Subscriber<H>>,
    id: SubscriberId,
}

impl<H: QueueHandler> std::fmt::Debug for Worker<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker").finish_non_exhaustive()
    }
}

impl<H: QueueHandler> Worker<H> {
    /// A loop for `handler`, woken by `queue_evts` (clones of the
    /// transport's [`crate::devices::virtio::MmioTransport::queue_evts`]),
    /// its wake eventfd and its sources, stopped by a write to `exit_evt`.
    pub fn start(
        handler: H,
        queue_evts: Vec<EventFd>,
        exit_evt: EventFd,
    ) -> Result<Worker<H>, WorkerError> {
        let mut manager = EventManager::new().map_err(WorkerError::Poll)?;
        let id = manager.add_subscriber(Subscriber {
            wake: handler.wake(),
            sources: handler.sources(),
            handler,
            queue_evts,
            exit_evt,
            exited: false,
            init_error: None,
        });
        let mut w = Worker { manager, id };
        match w.subscriber().init_error.take() {
            Some(e) => Err(WorkerError::Poll(e)),
            None => Ok(w),
        }
    }

    fn subscriber(&mut self) -> &mut Subscriber<H> {
        self.manager
            .subscriber_mut(self.id)
            .expect("the worker's own subscriber")
    }

    /// The handler (tests).
    pub fn handler(&mut self) -> &mut H {
        &mut self.subscriber().handler
    }

    /// Serves the device until the exit eventfd is written.
    pub fn run(mut self) -> Result<(), WorkerError> {
        while self.run_once(None)? {}
        Ok(())
    }

    /// One wait (at most `limit`, and no longer than the handler's next
    /// deadline) and what it woke; false once the exit eventfd fired.
    pub fn run_once(&mut self, limit: Option<Duration>) -> Result<bool, WorkerError> {
        let deadline = if H::TIMED {
            self.subscriber().handler.next_timeout(Instant::now())
        } else {
            None
        };
        let wait = match (deadline, limit) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let ms = wait.map_or(-1, |d| {
            // At least 1 ms: a deadline due now is not a busy loop.
            let ms = d.as_micros().div_ceil(1000).max(1);
            i32::try_from(ms).unwrap_or(i32::MAX)
        });
        self.manager
            .run_with_timeout(ms)
            .map_err(WorkerError::Poll)?;
        let s = self.subscriber();
        if s.exited {
            return Ok(false);
        }
        if H::TIMED {
            s.handler.timers(Instant::now());
        }
        Ok(true)
    }
}
