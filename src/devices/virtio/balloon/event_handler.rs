//! The balloon's thread: which fd wakes what.
//!
//! | fd | token | does |
//! |---|---|---|
//! | exit eventfd | 0 | returns |
//! | the balloon's wake eventfd | 1 | [`Balloon::process_wake`]: sink completions, left-over passes |
//! | queue `i`'s eventfd (the transport's, also the ioeventfd) | 2 + i | [`Balloon::process_queue`]`(i)` |
//! | (poll timeout) | | [`Balloon::process_stats_timer`] at the statistics deadline |
//!
//! Syscalls it makes, for its seccomp role: `epoll_create1`, `epoll_ctl`
//! (at start), `epoll_wait`, `read` and `write` on eventfds, `futex` (the
//! balloon's lock, the completion channel), and whatever the sink does
//! inline in [`super::DiscardSink::discard`], which it calls with the
//! balloon's lock let go ([`super::SinkWork`]): a slow discard never stalls
//! a vCPU, the API or a shutdown behind that lock.

use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::EventFd;

use super::{Balloon, BalloonError};
use crate::devices::virtio::DeviceMemory;

const EXIT: u64 = 0;
const WAKE: u64 = 1;
const QUEUE0: u64 = 2;

/// Runs a balloon's queue work on the thread that calls [`Self::run`].
pub struct BalloonWorker<M: DeviceMemory> {
    balloon: Arc<Mutex<Balloon<M>>>,
    queue_evts: Vec<EventFd>,
    exit_evt: EventFd,
    epoll: Epoll,
}

impl<M: DeviceMemory> std::fmt::Debug for BalloonWorker<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BalloonWorker")
            .field("queues", &self.queue_evts.len())
            .finish_non_exhaustive()
    }
}

impl<M: DeviceMemory> BalloonWorker<M> {
    /// A worker for `balloon`, woken by `queue_evts` (clones of the
    /// transport's [`crate::devices::virtio::MmioTransport::queue_evts`]),
    /// stopped by a write to `exit_evt`.
    pub fn new(
        balloon: Arc<Mutex<Balloon<M>>>,
        queue_evts: Vec<EventFd>,
        exit_evt: EventFd,
    ) -> Result<BalloonWorker<M>, BalloonError> {
        let epoll = Epoll::new().map_err(BalloonError::Poll)?;
        let add = |fd: i32, token: u64| {
            epoll
                .ctl(
                    ControlOperation::Add,
                    fd,
                    EpollEvent::new(EventSet::IN, token),
                )
                .map_err(BalloonError::Poll)
        };
        add(exit_evt.as_raw_fd(), EXIT)?;
        {
            let b = balloon.lock().unwrap_or_else(PoisonError::into_inner);
            add(b.wake_evt().as_raw_fd(), WAKE)?;
        }
        for (i, e) in queue_evts.iter().enumerate() {
            add(e.as_raw_fd(), QUEUE0 + i as u64)?;
        }
        Ok(BalloonWorker {
            balloon,
            queue_evts,
            exit_evt,
            epoll,
        })
    }

    /// Serves the balloon until the exit eventfd is written.
    pub fn run(&self) -> Result<(), BalloonError> {
        let mut events = vec![EpollEvent::default(); self.queue_evts.len() + 2];
        loop {
            if !self.run_once(&mut events)? {
                return Ok(());
            }
        }
    }

    /// One wait and what it woke; false once the exit eventfd fired.
    pub fn run_once(&self, events: &mut [EpollEvent]) -> Result<bool, BalloonError> {
        let timeout_ms = {
            let b = self.lock();
            b.stats_timeout(Instant::now()).map_or(-1, |d| {
                i32::try_from(d.as_millis().max(1)).unwrap_or(i32::MAX)
            })
        };
        let n = match self.epoll.wait(timeout_ms, events) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => 0,
            Err(e) => return Err(BalloonError::Poll(e)),
        };
        for ev in &events[..n] {
            match ev.data() {
                EXIT => return Ok(false),
                WAKE => {
                    let mut b = self.lock();
                    let _ = b.wake_evt().read();
                    b.process_wake();
                    let work = b.take_sink_work();
                    drop(b);
                    work.send();
                }
                t => {
                    let i = (t - QUEUE0) as usize;
                    if let Some(e) = self.queue_evts.get(i) {
                        let _ = e.read();
                        let mut b = self.lock();
                        b.process_queue(i);
                        let work = b.take_sink_work();
                        drop(b);
                        work.send();
                    }
                }
            }
        }
        self.lock().process_stats_timer(Instant::now());
        Ok(true)
    }

    /// The exit eventfd (write 1 to stop the thread).
    pub fn exit_evt(&self) -> &EventFd {
        &self.exit_evt
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Balloon<M>> {
        self.balloon.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
