//! The network device's thread: which fd wakes what.
//!
//! | fd | token | does |
//! |---|---|---|
//! | exit eventfd | 0 | returns |
//! | the device's wake eventfd | 1 | [`Net::process_wake`]: a new activation (tap offloads), left-over passes |
//! | the tap (edge triggered) | 2 | [`Net::process_tap`]: receive |
//! | queue `i`'s eventfd (the transport's, also the ioeventfd) | 3 + i | [`Net::process_queue`]`(i)` |
//!
//! Syscalls it makes, for its seccomp role: `epoll_create1`, `epoll_ctl`
//! (at start, in [`NetWorker::new`]), `epoll_wait`, `read` on eventfds and
//! the tap, `write` on eventfds (its wake, the irqfd) and the tap, `ioctl
//! TUNSETOFFLOAD` on the tap (once per activation), `futex` (the device's
//! lock).

use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex, PoisonError};

use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::EventFd;

use super::{Net, NetError};
use crate::devices::virtio::DeviceMemory;

const EXIT: u64 = 0;
const WAKE: u64 = 1;
const TAP: u64 = 2;
const QUEUE0: u64 = 3;

/// Runs a network device's queue and tap work on the thread that calls
/// [`Self::run`].
pub struct NetWorker<M: DeviceMemory> {
    net: Arc<Mutex<Net<M>>>,
    queue_evts: Vec<EventFd>,
    exit_evt: EventFd,
    epoll: Epoll,
}

impl<M: DeviceMemory> std::fmt::Debug for NetWorker<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NetWorker")
            .field("queues", &self.queue_evts.len())
            .finish_non_exhaustive()
    }
}

impl<M: DeviceMemory> NetWorker<M> {
    /// A worker for `net`, woken by `queue_evts` (clones of the transport's
    /// [`crate::devices::virtio::MmioTransport::queue_evts`]) and the tap,
    /// stopped by a write to `exit_evt`.
    pub fn new(
        net: Arc<Mutex<Net<M>>>,
        queue_evts: Vec<EventFd>,
        exit_evt: EventFd,
    ) -> Result<NetWorker<M>, NetError> {
        let epoll = Epoll::new().map_err(NetError::Poll)?;
        let add = |fd: i32, events: EventSet, token: u64| {
            epoll
                .ctl(ControlOperation::Add, fd, EpollEvent::new(events, token))
                .map_err(NetError::Poll)
        };
        add(exit_evt.as_raw_fd(), EventSet::IN, EXIT)?;
        {
            let n = net.lock().unwrap_or_else(PoisonError::into_inner);
            add(n.wake_evt().as_raw_fd(), EventSet::IN, WAKE)?;
            // Edge triggered: a tap with frames waiting for receive buffers
            // must not wake the thread again and again.
            add(n.backend_fd(), EventSet::IN | EventSet::EDGE_TRIGGERED, TAP)?;
        }
        for (i, e) in queue_evts.iter().enumerate() {
            add(e.as_raw_fd(), EventSet::IN, QUEUE0 + i as u64)?;
        }
        Ok(NetWorker {
            net,
            queue_evts,
            exit_evt,
            epoll,
        })
    }

    /// Serves the device until the exit eventfd is written.
    pub fn run(&self) -> Result<(), NetError> {
        let mut events = vec![EpollEvent::default(); self.queue_evts.len() + 3];
        loop {
            if !self.run_once(&mut events, -1)? {
                return Ok(());
            }
        }
    }

    /// One wait (at most `timeout_ms`, -1: no limit) and what it woke;
    /// false once the exit eventfd fired.
    pub fn run_once(&self, events: &mut [EpollEvent], timeout_ms: i32) -> Result<bool, NetError> {
        let n = match self.epoll.wait(timeout_ms, events) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => 0,
            Err(e) => return Err(NetError::Poll(e)),
        };
        for ev in &events[..n] {
            match ev.data() {
                EXIT => return Ok(false),
                WAKE => {
                    let mut net = self.lock();
                    let _ = net.wake_evt().read();
                    net.process_wake();
                }
                TAP => self.lock().process_tap(),
                t => {
                    let i = (t - QUEUE0) as usize;
                    if let Some(e) = self.queue_evts.get(i) {
                        let _ = e.read();
                        self.lock().process_queue(i);
                    }
                }
            }
        }
        Ok(true)
    }

    /// The exit eventfd (write 1 to stop the thread).
    pub fn exit_evt(&self) -> &EventFd {
        &self.exit_evt
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Net<M>> {
        self.net.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
