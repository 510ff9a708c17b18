//! The vsock's thread: which fd wakes what.
//!
//! | fd | token | does |
//! |---|---|---|
//! | exit eventfd | 0 | returns |
//! | the device's wake eventfd | 1 | [`Vsock::process_wake`]: left-over passes |
//! | the muxer's epoll fd | 2 | [`Vsock::process_host`]: accepts, `CONNECT` lines, host stream I/O |
//! | queue `i`'s eventfd (the transport's, also the ioeventfd) | 3 + i | [`Vsock::process_queue`]`(i)` |
//! | (poll timeout) | | [`Vsock::process_timers`]: `CONNECT` and shutdown deadlines |
//!
//! Syscalls it makes, for its seccomp role: `epoll_create1`, `epoll_ctl`,
//! `epoll_wait` (two epoll fds: its own and the muxer's, nested);
//! `read`/`write` on eventfds; `accept4` on the listener; `ioctl(FIONBIO)`
//! on accepted streams (`set_nonblocking`); `socket(AF_UNIX, SOCK_STREAM |
//! SOCK_NONBLOCK | SOCK_CLOEXEC, 0)` and `connect` for guest-initiated
//! connections; `read`/`recvfrom` and `write`/`sendto` on Unix streams
//! (std's `Read`/`Write` are `read`/`write`); `shutdown(SHUT_WR)`; `close`;
//! `futex` (the device's lock); `clock_gettime` (vDSO, usually no syscall).

use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::EventFd;

use super::{Vsock, VsockError};
use crate::devices::virtio::DeviceMemory;

const EXIT: u64 = 0;
const WAKE: u64 = 1;
const HOST: u64 = 2;
const QUEUE0: u64 = 3;

/// Runs a vsock's queue and host work on the thread that calls [`Self::run`].
pub struct VsockWorker<M: DeviceMemory> {
    vsock: Arc<Mutex<Vsock<M>>>,
    queue_evts: Vec<EventFd>,
    exit_evt: EventFd,
    epoll: Epoll,
}

impl<M: DeviceMemory> std::fmt::Debug for VsockWorker<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VsockWorker")
            .field("queues", &self.queue_evts.len())
            .finish_non_exhaustive()
    }
}

impl<M: DeviceMemory> VsockWorker<M> {
    /// A worker for `vsock`, woken by `queue_evts` (clones of the
    /// transport's queue eventfds), stopped by a write to `exit_evt`.
    pub fn new(
        vsock: Arc<Mutex<Vsock<M>>>,
        queue_evts: Vec<EventFd>,
        exit_evt: EventFd,
    ) -> Result<VsockWorker<M>, VsockError> {
        let epoll = Epoll::new().map_err(VsockError::Poll)?;
        let add = |fd: i32, token: u64| {
            epoll
                .ctl(
                    ControlOperation::Add,
                    fd,
                    EpollEvent::new(EventSet::IN, token),
                )
                .map_err(VsockError::Poll)
        };
        add(exit_evt.as_raw_fd(), EXIT)?;
        {
            let v = vsock.lock().unwrap_or_else(PoisonError::into_inner);
            add(v.wake_evt().as_raw_fd(), WAKE)?;
            add(v.host_fd(), HOST)?;
        }
        for (i, e) in queue_evts.iter().enumerate() {
            add(e.as_raw_fd(), QUEUE0 + i as u64)?;
        }
        Ok(VsockWorker {
            vsock,
            queue_evts,
            exit_evt,
            epoll,
        })
    }

    /// Serves the vsock until the exit eventfd is written.
    pub fn run(&self) -> Result<(), VsockError> {
        let mut events = vec![EpollEvent::default(); self.queue_evts.len() + 3];
        while self.run_once(&mut events)? {}
        Ok(())
    }

    /// One wait and what it woke; false once the exit eventfd fired.
    pub fn run_once(&self, events: &mut [EpollEvent]) -> Result<bool, VsockError> {
        let timeout_ms = self.lock().next_timeout(Instant::now()).map_or(-1, |d| {
            i32::try_from(d.as_millis().max(1)).unwrap_or(i32::MAX)
        });
        let n = match self.epoll.wait(timeout_ms, events) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => 0,
            Err(e) => return Err(VsockError::Poll(e)),
        };
        for ev in &events[..n] {
            match ev.data() {
                EXIT => return Ok(false),
                WAKE => {
                    let mut v = self.lock();
                    let _ = v.wake_evt().read();
                    v.process_wake();
                }
                HOST => self.lock().process_host(),
                t => {
                    let i = (t - QUEUE0) as usize;
                    if let Some(e) = self.queue_evts.get(i) {
                        let _ = e.read();
                        self.lock().process_queue(i);
                    }
                }
            }
        }
        self.lock().process_timers(Instant::now());
        Ok(true)
    }

    /// The exit eventfd (write 1 to stop the thread).
    pub fn exit_evt(&self) -> &EventFd {
        &self.exit_evt
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vsock<M>> {
        self.vsock.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
