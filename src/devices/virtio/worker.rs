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
//! Each event's pass is counted ([`quiesce`]): the hotplug sink waits for
//! the passes that may have found a slot of guest memory before it frees
//! what the guest unplugged, as KVM waits out its vCPUs before a memslot
//! is gone.
//!
//! A snapshot holds the loops still with a [`Gate`] ([`Worker::hold_at`]):
//! each pass enters it before it looks at its event, and waits there while
//! it is closed; closing it waits for the passes inside. [`PassWatch`]
//! says whether a loop's pass runs, and [`wait_for`] waits, pass by pass,
//! for a state only passes change (the work a device has in flight).
//!
//! Syscalls of the loop, for the device roles (src/seccomp/filters/devices.rs):
//! `epoll_create1` and `epoll_ctl` in [`Worker::start`] (on the VMM thread
//! that builds the devices), then on the device thread `epoll_wait` and
//! `read`/`write` on eventfds, `futex` for the device's lock.

use std::cell::Cell;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use event_manager::{
    EventManager, EventOps, EventSet, Events, MutEventSubscriber, SubscriberId, SubscriberOps,
};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::hold::Gate;

/// Errors of a device's loop.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// The epoll fd could not be made, or an fd not registered with it.
    #[error("device thread poll: {0}")]
    Poll(event_manager::Error),
}

/// Queues marked pending by a pass cut at its limit (a bit per queue).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PendingQueues(u32);

impl PendingQueues {
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

    /// Whether queue `q` is marked and not yet taken.
    pub fn is_marked(&self, q: usize) -> bool {
        q < 32 && self.pending.load(Ordering::SeqCst) & (1 << q) != 0
    }

    /// Forgets what was marked (a reset).
    pub fn clear(&self) {
        self.pending.store(0, Ordering::SeqCst);
    }

    /// Takes what was marked; the eventfd is read (cleared) first, so a
    /// mark made after this is seen by the next wake.
    pub fn take(&self) -> PendingQueues {
        let _ = self.evt.read();
        PendingQueues(self.pending.swap(0, Ordering::SeqCst))
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
    fn wake_event(&mut self, pending: PendingQueues);
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
    fn wake_event(&mut self, pending: PendingQueues) {
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

/// Every device loop's pass count, for [`quiesce`] (one microVM a process,
/// as in Firecracker: the passes of the process are the microVM's).
static PASSES: Mutex<Vec<Weak<AtomicU64>>> = Mutex::new(Vec::new());
/// Threads in [`quiesce`] now: a pass that ends wakes them only then.
static WAITERS: AtomicUsize = AtomicUsize::new(0);
static PASS_ENDED: Condvar = Condvar::new();
static PASS_LOCK: Mutex<()> = Mutex::new(());
/// Passes ended in the process, for [`wait_for`].
static ENDS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// The address of the count of the pass this thread runs, if any (so
    /// that a pass that quiesces does not wait for itself).
    static MINE: Cell<usize> = const { Cell::new(0) };
}

/// One device loop's passes: the count is odd while a pass runs.
#[derive(Debug)]
struct PassCount(Arc<AtomicU64>);

impl PassCount {
    fn new() -> PassCount {
        let count = Arc::new(AtomicU64::new(0));
        let mut all = lock(&PASSES);
        all.retain(|w| w.strong_count() > 0);
        all.push(Arc::downgrade(&count));
        PassCount(count)
    }

    /// Runs one pass, counted on entry and on exit (a panic included).
    fn run<R>(&self, pass: impl FnOnce() -> R) -> R {
        struct End<'a>(&'a AtomicU64);
        impl Drop for End<'_> {
            fn drop(&mut self) {
                self.0.fetch_add(1, Ordering::SeqCst);
                ENDS.fetch_add(1, Ordering::SeqCst);
                MINE.set(0);
                if WAITERS.load(Ordering::SeqCst) > 0 {
                    let _held = lock(&PASS_LOCK);
                    PASS_ENDED.notify_all();
                }
            }
        }
        MINE.set(Arc::as_ptr(&self.0) as usize);
        // SeqCst: ordered against the store that hides a slot (see
        // `quiesce`).
        self.0.fetch_add(1, Ordering::SeqCst);
        let _end = End(&self.0);
        pass()
    }
}

/// Waits until every device pass that was running when it was called has
/// ended (the calling thread's own excepted), at most until `deadline`;
/// false if one still ran then.
///
/// What it is for: a store (SeqCst) that hides guest memory from devices
/// ([`crate::memory::PluggedSlots::set`]), then `quiesce`. A pass that
/// started after the store finds the memory hidden; one that started
/// before it was running when the counts were read here (its count odd
/// then, since each pass counts itself SeqCst before it looks), and is
/// waited for. After `quiesce` returns true, no device touches that memory.
pub fn quiesce(deadline: Instant) -> bool {
    let mine = MINE.get();
    let running: Vec<(Arc<AtomicU64>, u64)> = lock(&PASSES)
        .iter()
        .filter_map(Weak::upgrade)
        .filter(|c| Arc::as_ptr(c) as usize != mine)
        .filter_map(|c| {
            let n = c.load(Ordering::SeqCst);
            (n % 2 == 1).then_some((c, n))
        })
        .collect();
    if running.is_empty() {
        return true;
    }
    WAITERS.fetch_add(1, Ordering::SeqCst);
    let mut held = lock(&PASS_LOCK);
    let ended = loop {
        if running.iter().all(|(c, n)| c.load(Ordering::SeqCst) != *n) {
            break true;
        }
        let now = Instant::now();
        if now >= deadline {
            break false;
        }
        held = PASS_ENDED
            .wait_timeout(held, deadline - now)
            .unwrap_or_else(PoisonError::into_inner)
            .0;
    };
    drop(held);
    WAITERS.fetch_sub(1, Ordering::SeqCst);
    ended
}

/// One device loop's pass count, watched from another thread
/// ([`Worker::pass_watch`]): whether a pass of that loop runs now.
#[derive(Debug, Clone)]
pub struct PassWatch(Arc<AtomicU64>);

impl PassWatch {
    /// Whether a pass of the loop runs now.
    pub fn running(&self) -> bool {
        self.0.load(Ordering::SeqCst) % 2 == 1
    }

    /// Waits until the pass running now (if any) has ended, at most until
    /// `deadline`; false if it still ran then.
    pub fn wait_pass_end(&self, deadline: Instant) -> bool {
        let n = self.0.load(Ordering::SeqCst);
        n % 2 == 0 || wait_for(deadline, || self.0.load(Ordering::SeqCst) != n)
    }
}

/// Waits until `done` holds, looking again after each device pass that
/// ends (in any loop of the process), at most until `deadline`; false if it
/// did not hold then. For a state that only a device pass changes (work in
/// flight that a pass completes): `done` must read it with `SeqCst`
/// atomics or under the lock the pass changes it under, and must not block
/// on a pass.
pub fn wait_for(deadline: Instant, mut done: impl FnMut() -> bool) -> bool {
    WAITERS.fetch_add(1, Ordering::SeqCst);
    let held = loop {
        // A pass that ends after this read bumps ENDS, and (seeing this
        // waiter) notifies under PASS_LOCK: the wait below cannot miss it.
        let seen = ENDS.load(Ordering::SeqCst);
        if done() {
            break true;
        }
        let mut guard = lock(&PASS_LOCK);
        loop {
            if ENDS.load(Ordering::SeqCst) != seen {
                break;
            }
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            guard = PASS_ENDED
                .wait_timeout(guard, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        drop(guard);
        if Instant::now() >= deadline {
            break done();
        }
    };
    WAITERS.fetch_sub(1, Ordering::SeqCst);
    held
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
    passes: PassCount,
    /// Where passes wait while the devices are held ([`Gate`]).
    gate: Option<Arc<Gate>>,
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
        let Subscriber {
            handler,
            wake,
            queue_evts,
            exited,
            passes,
            gate,
            ..
        } = self;
        if events.data() == EXIT {
            *exited = true;
            return;
        }
        if *exited {
            return;
        }
        // Waits here while the devices are held; inside until the pass ends.
        let _inside = gate.as_deref().map(Gate::enter);
        match events.data() {
            WAKE => {
                let pending = wake.take();
                passes.run(|| handler.wake_event(pending));
            }
            d if d >= SOURCE0 => {
                passes.run(|| handler.source_event((d - SOURCE0) as usize, events.event_set()))
            }
            d => {
                let i = (d - QUEUE0) as usize;
                if let Some(e) = queue_evts.get(i) {
                    let _ = e.read();
                    passes.run(|| handler.queue_event(i));
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
            passes: PassCount::new(),
            gate: None,
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

    /// Makes every pass of this loop enter `gate` ([`Gate::enter`]: before
    /// it looks at the event that woke it, so nothing is lost).
    pub fn hold_at(&mut self, gate: Arc<Gate>) {
        self.subscriber().gate = Some(gate);
    }

    /// A watch on this loop's passes.
    pub fn pass_watch(&mut self) -> PassWatch {
        PassWatch(self.subscriber().passes.0.clone())
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
            let _inside = s.gate.as_deref().map(Gate::enter);
            let (handler, passes) = (&mut s.handler, &s.passes);
            passes.run(|| handler.timers(Instant::now()));
        }
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;

    use super::*;

    /// A device whose wake pass blocks until released, and quiesces from
    /// inside its own pass first.
    struct Blocker {
        wake: Arc<Wake>,
        entered: mpsc::Sender<bool>,
        release: mpsc::Receiver<()>,
    }

    impl QueueHandler for Blocker {
        fn wake(&self) -> Arc<Wake> {
            self.wake.clone()
        }
        fn queue_event(&mut self, _index: usize) {}
        fn wake_event(&mut self, _pending: PendingQueues) {
            // A pass that quiesces (an inline UNPLUG prelude) does not wait
            // for itself.
            let own = quiesce(Instant::now() + Duration::from_secs(10));
            self.entered.send(own).unwrap();
            let _ = self.release.recv();
        }
    }

    #[test]
    fn quiesce_waits_for_the_passes_running_when_called_and_not_for_its_own() {
        let (entered_tx, entered) = mpsc::channel();
        let (release, release_rx) = mpsc::channel();
        let wake = Arc::new(Wake::new().unwrap());
        let exit = EventFd::new(EFD_NONBLOCK).unwrap();
        let exit_clone = exit.try_clone().unwrap();
        let handler = Blocker {
            wake: wake.clone(),
            entered: entered_tx,
            release: release_rx,
        };
        let mut worker = Worker::start(handler, Vec::new(), exit_clone).unwrap();
        let thread = std::thread::spawn(move || worker.run_once(None).unwrap());
        wake.again(&[]).unwrap();
        assert!(entered.recv().unwrap(), "the pass waited for itself");
        // The pass is blocked: a quiesce cannot end before its deadline.
        assert!(!quiesce(Instant::now() + Duration::from_millis(50)));
        let waiter = std::thread::spawn(|| quiesce(Instant::now() + Duration::from_secs(10)));
        release.send(()).unwrap();
        assert!(waiter.join().unwrap(), "the pass ended and woke the waiter");
        assert!(thread.join().unwrap());
        drop(exit);
        // No pass of this loop runs now.
        assert!(quiesce(Instant::now() + Duration::from_secs(10)));
    }
}
