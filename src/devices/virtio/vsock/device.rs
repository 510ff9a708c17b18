//! The vsock device: features, configuration space, activation and reset,
//! and the queue passes its thread runs ([`Vsock::process_queue`],
//! [`Vsock::process_host`], [`Vsock::process_timers`],
//! [`Vsock::process_wake`]). Every guest buffer is checked against guest
//! memory before it is touched and read or written through vm-memory;
//! every chain taken goes back to the guest.

use std::os::fd::RawFd;
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use event_manager::EventSet;
use virtio_queue::{DescriptorChain, QueueOwnedT, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemory, Permissions};
use vmm_sys_util::eventfd::EventFd;

use super::metrics::VsockMetrics;
use super::muxer::Muxer;
use super::packet::{VsockHeader, HEADER_BYTES};
use super::{
    VsockError, CONFIG_SPACE_BYTES, EVQ, MAX_CHAINS_PER_PASS, MAX_PKT_PAYLOAD, MIN_GUEST_CID,
    QUEUE_SIZE, RXQ, TXQ, VIRTIO_ID_VSOCK,
};
use crate::devices::virtio::{
    ActivateError, ActiveState, ConfigAccess, ConfigSpace, DeviceMemory, DeviceOffer,
    PendingQueues, QueueHandler, VirtioDevice, Wake, VIRTIO_F_VERSION_1,
};

/// What the vsock is made with (the API's `PUT /vsock`, checked by
/// [`Vsock::new`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VsockOptions {
    /// The guest's CID (3 or more).
    pub guest_cid: u64,
    /// Where the listener is bound; guest connections to port P go to
    /// `<uds_path>_<P>`.
    pub uds_path: PathBuf,
}

/// A virtio-vsock.
pub struct Vsock<M: DeviceMemory> {
    pub(super) opts: VsockOptions,
    pub(super) muxer: Muxer,
    pub(super) active: Option<ActiveState<M>>,
    pub(super) metrics: Arc<VsockMetrics>,
    /// Passes left over (bounded passes, a stalled TX queue).
    pub(super) wake: Arc<Wake>,
    /// The TX queue waits for RX to drain the resets owed.
    stalled_tx: bool,
    bounce: Vec<u8>,
}

impl<M: DeviceMemory> std::fmt::Debug for Vsock<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Vsock")
            .field("opts", &self.opts)
            .field("active", &self.active.is_some())
            .finish_non_exhaustive()
    }
}

/// A chain's buffers of one direction, each inside guest memory.
pub(super) fn buffers<G: GuestMemory>(
    mem: &G,
    chain: DescriptorChain<&G>,
    writable: bool,
    cap: usize,
) -> Option<(Vec<(GuestAddress, usize)>, usize)> {
    let mut segs = Vec::new();
    let (mut total, mut all) = (0usize, 0u64);
    let descs: Vec<_> = if writable {
        chain.writable().collect()
    } else {
        chain.readable().collect()
    };
    for d in descs {
        all += u64::from(d.len());
        let take = (d.len() as usize).min(cap - total);
        if take == 0 {
            continue;
        }
        if !mem.check_range(d.addr(), take, Permissions::ReadWrite) {
            return None;
        }
        segs.push((d.addr(), take));
        total += take;
    }
    Some((segs, usize::try_from(all).unwrap_or(usize::MAX)))
}

impl<M: DeviceMemory> Vsock<M> {
    /// A vsock for `opts`, accepting host connections on `listener` (bound
    /// by [`super::bind_uds`] at `opts.uds_path`).
    pub fn new(opts: VsockOptions, listener: UnixListener) -> Result<Vsock<M>, VsockError> {
        // 0 is what firecracker-containerd sends (config::vsock's
        // `UNSET_GUEST_CID`); 1 and 2 stay refused.
        if opts.guest_cid != 0 && opts.guest_cid < MIN_GUEST_CID {
            return Err(VsockError::ReservedCid(opts.guest_cid));
        }
        if opts.guest_cid > u64::from(u32::MAX) {
            return Err(VsockError::CidTooLarge(opts.guest_cid));
        }
        let metrics = Arc::new(VsockMetrics::default());
        let muxer = Muxer::new(
            opts.guest_cid,
            opts.uds_path.clone(),
            listener,
            metrics.clone(),
        )?;
        Ok(Vsock {
            opts,
            muxer,
            active: None,
            metrics,
            wake: Arc::new(Wake::new().map_err(VsockError::EventFd)?),
            stalled_tx: false,
            bounce: vec![0; HEADER_BYTES + MAX_PKT_PAYLOAD as usize],
        })
    }

    /// The options.
    pub fn options(&self) -> &VsockOptions {
        &self.opts
    }

    /// The counters.
    pub fn metrics(&self) -> &Arc<VsockMetrics> {
        &self.metrics
    }

    /// The eventfd the thread polls for left-over passes.
    pub fn wake_evt(&self) -> &EventFd {
        self.wake.evt()
    }

    /// The muxer's epoll fd (readable when a host fd is ready).
    pub fn host_fd(&self) -> RawFd {
        self.muxer.epoll_fd()
    }

    /// Whether the device runs.
    pub fn is_active(&self) -> bool {
        self.active.is_some()
    }

    /// Connections now.
    pub fn connections(&self) -> usize {
        self.muxer.connections()
    }

    /// Guest data buffered for host readers, all connections.
    pub fn buffered_bytes(&self) -> usize {
        self.muxer.buffered()
    }

    fn again(&self, q: usize) {
        if self.wake.again(&[q]).is_err() {
            self.metrics.rx_queue_event_fails.inc();
        }
    }

    /// How long the thread may sleep before a deadline (None: none).
    pub fn next_timeout(&self, now: Instant) -> Option<Duration> {
        Some(self.muxer.next_deadline()?.saturating_duration_since(now))
    }

    /// Queue `index`'s eventfd fired.
    pub fn process_queue(&mut self, index: usize) {
        match index {
            RXQ => {
                self.metrics.rx_queue_event_count.inc();
                self.process_rx();
            }
            TXQ => {
                self.metrics.tx_queue_event_count.inc();
                self.process_tx();
            }
            // teravm sends no events; the guest's buffers stay with it.
            EVQ => {}
            _ => {}
        }
    }

    /// The muxer's epoll fd is readable: host fds to serve, then RX.
    pub fn process_host(&mut self) {
        self.muxer.process_host(Instant::now());
        self.process_rx();
    }

    /// Deadlines at `now`, then RX (resets may be owed).
    pub fn process_timers(&mut self, now: Instant) {
        self.muxer.expire(now);
        self.process_rx();
    }

    /// The wake eventfd fired: the passes left over.
    pub fn process_wake(&mut self, pending: PendingQueues) {
        if pending.has(TXQ) {
            self.process_tx();
        }
        if pending.has(RXQ) {
            self.process_rx();
        }
    }

    fn interrupt(&self, q: usize) {
        if let Some(a) = &self.active {
            if !a.signal_used(q) {
                let c = if q == RXQ {
                    &self.metrics.rx_queue_event_fails
                } else {
                    &self.metrics.tx_queue_event_fails
                };
                c.inc();
            }
        }
    }

    /// One bounded pass over the TX queue: each packet checked, handed to
    /// the muxer, its chain returned.
    fn process_tx(&mut self) {
        let now = Instant::now();
        let Some(a) = self.active.as_mut() else {
            return;
        };
        let (muxer, bounce, m) = (&mut self.muxer, &mut self.bounce, &*self.metrics);
        let cid = self.opts.guest_cid;
        let (mut used, mut stalled) = (false, false);
        let end = self.wake.pass(TXQ, MAX_CHAINS_PER_PASS, || {
            if muxer.tx_stalled() {
                // Resumed once RX drains the resets.
                stalled = true;
                return false;
            }
            let Some(chain) = crate::devices::virtio::chains::pop_direct(
                &mut a.queues[TXQ],
                &*a.mem,
                &m.tx_queue_event_fails,
            ) else {
                return false;
            };
            let head = chain.head_index();
            let got = buffers(&*a.mem, chain, false, bounce.len());
            let mut n = 0;
            let mut ok = got.is_some();
            if let Some((segs, _)) = &got {
                for (addr, len) in segs {
                    ok &= a.mem.read_slice(&mut bounce[n..n + len], *addr).is_ok();
                    n += len;
                }
            }
            if a.queues[TXQ].add_used(&*a.mem, head, 0).is_err() {
                m.tx_queue_event_fails.inc();
            }
            used = true;
            let all = got.map_or(0, |(_, all)| all);
            let hdr = VsockHeader::parse(&bounce[..n]).filter(|_| ok);
            let Some(hdr) = hdr.filter(|h| h.check_from_guest(cid, all).is_ok()) else {
                m.tx_packets_dropped.inc();
                return true;
            };
            let len = hdr.len as usize;
            m.tx_packets_count.inc();
            m.tx_bytes_count.add(len as u64);
            muxer.from_guest(&hdr, &bounce[HEADER_BYTES..HEADER_BYTES + len], now);
            true
        });
        self.stalled_tx |= stalled;
        if end.wake_failed {
            m.rx_queue_event_fails.inc();
        }
        if used {
            self.interrupt(TXQ);
        }
        self.process_rx();
    }

    /// One bounded pass over the RX queue: a packet per chain while the
    /// muxer owes any.
    fn process_rx(&mut self) {
        let now = Instant::now();
        let Some(a) = self.active.as_mut() else {
            return;
        };
        let (muxer, bounce, m) = (&mut self.muxer, &mut self.bounce, &*self.metrics);
        let mut used = false;
        let end = self.wake.pass(RXQ, MAX_CHAINS_PER_PASS, || {
            if !muxer.has_rx() {
                return false;
            }
            let Some(chain) = crate::devices::virtio::chains::pop_direct(
                &mut a.queues[RXQ],
                &*a.mem,
                &m.rx_queue_event_fails,
            ) else {
                return false;
            };
            let head = chain.head_index();
            let segs = buffers(&*a.mem, chain, true, bounce.len())
                .map(|(s, _)| s)
                .filter(|s| s.iter().map(|(_, n)| n).sum::<usize>() >= HEADER_BYTES);
            let Some(segs) = segs else {
                m.rx_chains_dropped.inc();
                if a.queues[RXQ].add_used(&*a.mem, head, 0).is_err() {
                    m.rx_queue_event_fails.inc();
                }
                used = true;
                return true;
            };
            let room: usize = segs.iter().map(|(_, n)| n).sum::<usize>() - HEADER_BYTES;
            let Some((hdr, n)) = muxer.next_rx(room, &mut bounce[HEADER_BYTES..], now) else {
                a.queues[RXQ].go_to_previous_position();
                return false;
            };
            bounce[..HEADER_BYTES].copy_from_slice(&hdr.to_bytes());
            let (mut off, end) = (0, HEADER_BYTES + n);
            for (addr, len) in segs {
                let k = len.min(end - off);
                if k == 0 {
                    break;
                }
                if a.mem.write_slice(&bounce[off..off + k], addr).is_err() {
                    m.rx_queue_event_fails.inc();
                }
                off += k;
            }
            if a.queues[RXQ].add_used(&*a.mem, head, end as u32).is_err() {
                m.rx_queue_event_fails.inc();
            }
            used = true;
            m.rx_packets_count.inc();
            m.rx_bytes_count.add(n as u64);
            true
        });
        if end.wake_failed {
            m.rx_queue_event_fails.inc();
        }
        if used {
            self.interrupt(RXQ);
        }
        if self.stalled_tx && !self.muxer.tx_stalled() {
            self.stalled_tx = false;
            self.again(TXQ);
        }
    }
}

impl<M: DeviceMemory> VirtioDevice<M> for Vsock<M> {
    fn offer(&self) -> DeviceOffer {
        DeviceOffer {
            device_type: VIRTIO_ID_VSOCK,
            avail_features: VIRTIO_F_VERSION_1,
            queue_sizes: &[QUEUE_SIZE; 3],
        }
    }

    fn config_space(&self) -> ConfigSpace {
        // `guest_cid`, le64.
        let b: [u8; CONFIG_SPACE_BYTES] = self.opts.guest_cid.to_le_bytes();
        ConfigSpace::new(&b)
    }

    fn config_refused(&self, access: ConfigAccess) {
        access.count_write(&self.metrics.cfg_fails);
    }

    fn activate(&mut self, active: ActiveState<M>) -> Result<(), ActivateError> {
        active
            .check(self.active.is_some(), [RXQ, TXQ, EVQ])
            .inspect_err(|_| self.metrics.activate_fails.inc())?;
        self.active = Some(active);
        // Requests of host connections made before the driver was up, and
        // buffers the driver added before DRIVER_OK.
        self.stalled_tx = false;
        self.wake.again(&[RXQ, TXQ]).map_err(ActivateError::Signal)
    }

    fn queue_positions(&self) -> Option<Vec<crate::devices::virtio::QueuePosition>> {
        self.active.as_ref().map(ActiveState::positions)
    }

    fn reset(&mut self) {
        // Drops the queues, the guest memory and every connection (their
        // host streams close); the listener stays.
        self.active = None;
        self.stalled_tx = false;
        self.wake.clear();
        self.muxer.reset();
    }
}

/// The device's thread: which event runs which pass.
///
/// Syscalls it makes, for its seccomp role: the loop's
/// ([`crate::devices::virtio::worker`]), `epoll_wait` on the muxer's epoll
/// fd (nested in the loop's); `accept4` on the listener; `ioctl(FIONBIO)`
/// on accepted streams (`set_nonblocking`); `socket(AF_UNIX, SOCK_STREAM |
/// SOCK_NONBLOCK | SOCK_CLOEXEC, 0)` and `connect` for guest-initiated
/// connections; `read`/`recvfrom` and `write`/`sendto` on Unix streams;
/// `shutdown(SHUT_WR)`; `close`; `futex` (the device's lock);
/// `clock_gettime` (vDSO, usually no syscall).
impl<M: DeviceMemory> QueueHandler for Vsock<M> {
    const TIMED: bool = true;

    fn wake(&self) -> Arc<Wake> {
        self.wake.clone()
    }

    fn sources(&self) -> Vec<(RawFd, EventSet)> {
        vec![(self.host_fd(), EventSet::IN)]
    }

    fn queue_event(&mut self, index: usize) {
        self.process_queue(index);
    }

    fn wake_event(&mut self, pending: PendingQueues) {
        self.process_wake(pending);
    }

    fn source_event(&mut self, _index: usize, _events: EventSet) {
        self.process_host();
    }

    fn next_timeout(&self, now: Instant) -> Option<Duration> {
        Vsock::next_timeout(self, now)
    }

    fn timers(&mut self, now: Instant) {
        self.process_timers(now);
    }
}
