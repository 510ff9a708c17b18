//! The vsock device: features, configuration space, activation and reset,
//! and the queue passes its thread runs ([`Vsock::process_queue`],
//! [`Vsock::process_host`], [`Vsock::process_timers`],
//! [`Vsock::process_wake`]). Every guest buffer is checked against guest
//! memory before it is touched and read or written through vm-memory;
//! every chain taken goes back to the guest.

use std::os::fd::RawFd;
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use virtio_queue::{DescriptorChain, Queue, QueueOwnedT, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemory, Permissions};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::metrics::VsockMetrics;
use super::muxer::Muxer;
use super::packet::{VsockHeader, HEADER_BYTES};
use super::{
    VsockError, CONFIG_SPACE_BYTES, EVQ, MAX_CHAINS_PER_PASS, MAX_PKT_PAYLOAD, MIN_GUEST_CID,
    QUEUE_SIZE, RXQ, TXQ, VIRTIO_ID_VSOCK,
};
use crate::devices::virtio::{
    ActivateError, DeviceMemory, VirtioDevice, VirtioInterrupt, VirtioInterruptType,
    VIRTIO_F_VERSION_1,
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

/// Guest memory accesses, for the fuzz target: (address, bytes).
pub type AccessLog = Arc<Mutex<Vec<(u64, usize)>>>;

/// What exists while the device runs.
struct Active<M: DeviceMemory> {
    mem: M,
    queues: Vec<Queue>,
    interrupt: Arc<dyn VirtioInterrupt>,
}

/// A virtio-vsock.
pub struct Vsock<M: DeviceMemory> {
    opts: VsockOptions,
    pub(super) muxer: Muxer,
    active: Option<Active<M>>,
    metrics: Arc<VsockMetrics>,
    wake: EventFd,
    /// Queues with a pass left over (bounded passes, a stalled TX queue).
    pending: [bool; 2],
    bounce: Vec<u8>,
    log: Option<AccessLog>,
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
fn buffers<G: GuestMemory>(
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
        if opts.guest_cid < MIN_GUEST_CID {
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
            wake: EventFd::new(EFD_NONBLOCK).map_err(VsockError::EventFd)?,
            pending: [false; 2],
            bounce: vec![0; HEADER_BYTES + MAX_PKT_PAYLOAD as usize],
            log: None,
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
        &self.wake
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

    /// Records every guest memory access (the fuzz target's check).
    #[doc(hidden)]
    pub fn log_accesses(&mut self, log: AccessLog) {
        self.log = Some(log);
    }

    fn note(&self, segs: &[(GuestAddress, usize)]) {
        if let Some(l) = &self.log {
            let mut l = l.lock().unwrap_or_else(|e| e.into_inner());
            l.extend(segs.iter().map(|(a, n)| (a.0, *n)));
        }
    }

    fn again(&mut self, q: usize) {
        self.pending[q] = true;
        if self.wake.write(1).is_err() {
            VsockMetrics::add(&self.metrics.rx_queue_event_fails, 1);
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
                VsockMetrics::add(&self.metrics.rx_queue_event_count, 1);
                self.process_rx();
            }
            TXQ => {
                VsockMetrics::add(&self.metrics.tx_queue_event_count, 1);
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
    pub fn process_wake(&mut self) {
        let [rx, tx] = std::mem::take(&mut self.pending);
        if tx {
            self.process_tx();
        }
        if rx {
            self.process_rx();
        }
    }

    fn interrupt(&self, q: usize) {
        if let Some(a) = &self.active {
            if a.interrupt
                .trigger(VirtioInterruptType::Queue(q as u16))
                .is_err()
            {
                let c = if q == RXQ {
                    &self.metrics.rx_queue_event_fails
                } else {
                    &self.metrics.tx_queue_event_fails
                };
                VsockMetrics::add(c, 1);
            }
        }
    }

    /// One bounded pass over the TX queue: each packet checked, handed to
    /// the muxer, its chain returned.
    fn process_tx(&mut self) {
        let now = Instant::now();
        let (mut used, mut taken) = (false, 0);
        loop {
            if taken == MAX_CHAINS_PER_PASS {
                self.again(TXQ);
                break;
            }
            if self.muxer.tx_stalled() {
                // Resumed once RX drains the resets.
                self.pending[TXQ] = true;
                break;
            }
            let Some(a) = self.active.as_mut() else {
                return;
            };
            let Some(chain) = a.queues[TXQ].pop_descriptor_chain(&*a.mem) else {
                break;
            };
            taken += 1;
            let head = chain.head_index();
            let got = buffers(&*a.mem, chain, false, self.bounce.len());
            let mut n = 0;
            let mut ok = got.is_some();
            if let Some((segs, _)) = &got {
                for (addr, len) in segs {
                    ok &= a
                        .mem
                        .read_slice(&mut self.bounce[n..n + len], *addr)
                        .is_ok();
                    n += len;
                }
            }
            if a.queues[TXQ].add_used(&*a.mem, head, 0).is_err() {
                VsockMetrics::add(&self.metrics.tx_queue_event_fails, 1);
            }
            used = true;
            if let Some((segs, _)) = &got {
                self.note(segs);
            }
            let all = got.map_or(0, |(_, all)| all);
            let hdr = VsockHeader::parse(&self.bounce[..n]).filter(|_| ok);
            let Some(hdr) = hdr.filter(|h| h.check_from_guest(self.opts.guest_cid, all).is_ok())
            else {
                VsockMetrics::add(&self.metrics.tx_packets_dropped, 1);
                continue;
            };
            let len = hdr.len as usize;
            VsockMetrics::add(&self.metrics.tx_packets_count, 1);
            VsockMetrics::add(&self.metrics.tx_bytes_count, len as u64);
            let payload = &self.bounce[HEADER_BYTES..HEADER_BYTES + len];
            self.muxer.from_guest(&hdr, payload, now);
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
        let (mut used, mut taken) = (false, 0);
        while self.muxer.has_rx() {
            if taken == MAX_CHAINS_PER_PASS {
                self.again(RXQ);
                break;
            }
            let Some(a) = self.active.as_mut() else {
                return;
            };
            let Some(chain) = a.queues[RXQ].pop_descriptor_chain(&*a.mem) else {
                break;
            };
            taken += 1;
            let head = chain.head_index();
            let segs = buffers(&*a.mem, chain, true, self.bounce.len())
                .map(|(s, _)| s)
                .filter(|s| s.iter().map(|(_, n)| n).sum::<usize>() >= HEADER_BYTES);
            let Some(segs) = segs else {
                VsockMetrics::add(&self.metrics.rx_chains_dropped, 1);
                if a.queues[RXQ].add_used(&*a.mem, head, 0).is_err() {
                    VsockMetrics::add(&self.metrics.rx_queue_event_fails, 1);
                }
                used = true;
                continue;
            };
            let room: usize = segs.iter().map(|(_, n)| n).sum::<usize>() - HEADER_BYTES;
            let Some((hdr, n)) = self
                .muxer
                .next_rx(room, &mut self.bounce[HEADER_BYTES..], now)
            else {
                a.queues[RXQ].go_to_previous_position();
                break;
            };
            self.bounce[..HEADER_BYTES].copy_from_slice(&hdr.to_bytes());
            let (mut off, end) = (0, HEADER_BYTES + n);
            let mut wrote = Vec::new();
            for (addr, len) in segs {
                let k = len.min(end - off);
                if k == 0 {
                    break;
                }
                if a.mem.write_slice(&self.bounce[off..off + k], addr).is_err() {
                    VsockMetrics::add(&self.metrics.rx_queue_event_fails, 1);
                }
                wrote.push((addr, k));
                off += k;
            }
            if a.queues[RXQ].add_used(&*a.mem, head, end as u32).is_err() {
                VsockMetrics::add(&self.metrics.rx_queue_event_fails, 1);
            }
            used = true;
            self.note(&wrote);
            VsockMetrics::add(&self.metrics.rx_packets_count, 1);
            VsockMetrics::add(&self.metrics.rx_bytes_count, n as u64);
        }
        if used {
            self.interrupt(RXQ);
        }
        if self.pending[TXQ] && !self.muxer.tx_stalled() {
            self.again(TXQ);
        }
    }
}

impl<M: DeviceMemory> VirtioDevice<M> for Vsock<M> {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_VSOCK
    }

    fn avail_features(&self) -> u64 {
        VIRTIO_F_VERSION_1
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &[QUEUE_SIZE; 3]
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        let b: [u8; CONFIG_SPACE_BYTES] = self.opts.guest_cid.to_le_bytes();
        super::super::read_config_space(&b, offset, data);
    }

    fn write_config(&mut self, _offset: u64, _data: &[u8]) {
        VsockMetrics::add(&self.metrics.cfg_fails, 1);
    }

    fn activate(
        &mut self,
        mem: M,
        _acked_features: u64,
        queues: Vec<Queue>,
        interrupt: Arc<dyn VirtioInterrupt>,
    ) -> Result<(), ActivateError> {
        if self.active.is_some() {
            VsockMetrics::add(&self.metrics.activate_fails, 1);
            return Err(ActivateError::AlreadyActive);
        }
        for i in [RXQ, TXQ, EVQ] {
            if !queues.get(i).is_some_and(|q| q.ready()) {
                VsockMetrics::add(&self.metrics.activate_fails, 1);
                return Err(ActivateError::QueueNotReady(i));
            }
        }
        self.active = Some(Active {
            mem,
            queues,
            interrupt,
        });
        // Requests of host connections made before the driver was up, and
        // buffers the driver added before DRIVER_OK.
        self.pending = [true; 2];
        self.wake.write(1).map_err(ActivateError::Signal)
    }

    fn reset(&mut self) {
        // Drops the queues, the guest memory and every connection (their
        // host streams close); the listener stays.
        self.active = None;
        self.pending = [false; 2];
        self.muxer.reset();
    }
}
