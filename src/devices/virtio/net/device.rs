//! The network device: features, configuration space, activation and
//! reset. The queue and tap work is in [`super::queues`]; it runs on the
//! device's thread, never in these calls (a vCPU thread's).

pub mod limits;

use std::collections::VecDeque;
use std::sync::Arc;

use std::os::fd::RawFd;

use event_manager::EventSet;
use vmm_sys_util::eventfd::EventFd;

use super::features::{MAC, OFFERED};
use super::metrics::NetMetrics;
use super::tap::{tap_offload_for, NetBackend, Tap};
use super::{
    NetError, CONFIG_SPACE_BYTES, MAX_BUFFER_BYTES, QUEUE_SIZE, RX_INDEX, TX_INDEX, VIRTIO_ID_NET,
};
use crate::devices::virtio::{
    ActivateError, ActiveState, ConfigAccess, ConfigSpace, DeviceMemory, DeviceOffer,
    PendingQueues, QueueHandler, VirtioDevice, Wake, VIRTIO_F_VERSION_1,
};
use crate::rate_limiter::RateLimiterConfig;
use limits::NetLimits;

/// What the device is made with (the API's `PUT /network-interfaces`,
/// checked; the tap is opened separately by [`super::open_tap`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NetOptions {
    /// The interface's ID (the API's `iface_id`; names the metrics).
    pub iface_id: String,
    /// The guest's MAC; without one the driver picks its own.
    pub guest_mac: Option<[u8; 6]>,
    /// The receive rate limiter ([`limits`]; empty: no limit).
    pub rx_rate_limiter: RateLimiterConfig,
    /// The transmit rate limiter.
    pub tx_rate_limiter: RateLimiterConfig,
}

/// A receive chain the device holds, checked: every descriptor writable
/// and inside guest RAM.
#[derive(Debug, Clone)]
pub(super) struct RxChain {
    pub head: u16,
    /// (guest address, bytes) of each descriptor, in order.
    pub bufs: Vec<(u64, usize)>,
    /// Their total, capped at [`MAX_BUFFER_BYTES`].
    pub capacity: usize,
}

/// A virtio-net device.
pub struct Net<M: DeviceMemory> {
    pub(super) opts: NetOptions,
    offer: DeviceOffer,
    pub(super) backend: Box<dyn NetBackend>,
    pub(super) metrics: Arc<NetMetrics>,
    pub(super) wake: Arc<Wake>,
    /// Bounce buffers, [`MAX_BUFFER_BYTES`] each.
    pub(super) tx_buf: Vec<u8>,
    pub(super) rx_buf: Vec<u8>,
    pub(super) active: Option<ActiveState<M>>,
    /// The tap offloads of the activation, still to set (the device's
    /// thread does, before it reads a frame).
    pub(super) offload: Option<u32>,
    /// Bytes of a frame (with header) in the receive bounce buffer that
    /// wait for buffers.
    pub(super) rx_frame: Option<usize>,
    /// Receive chains taken from the ring for the waiting frame (more than
    /// one only with mergeable buffers).
    pub(super) rx_held: VecDeque<RxChain>,
    /// The MMDS stack, when the MMDS configuration names this interface.
    pub(super) mmds: Option<Box<super::mmds::MmdsDetour>>,
    /// The receive and transmit rate limiters.
    pub(super) limits: NetLimits,
}

impl<M: DeviceMemory> std::fmt::Debug for Net<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Net")
            .field("opts", &self.opts)
            .field("active", &self.active.is_some())
            .finish_non_exhaustive()
    }
}

impl<M: DeviceMemory> Net<M> {
    /// A network device over `tap` (from [`super::open_tap`]).
    pub fn new(opts: NetOptions, tap: Tap) -> Result<Net<M>, NetError> {
        Self::with_backend(opts, Box::new(tap))
    }

    /// A network device over any backend (tests, fuzzing).
    pub fn with_backend(
        opts: NetOptions,
        backend: Box<dyn NetBackend>,
    ) -> Result<Net<M>, NetError> {
        let mut avail_features = VIRTIO_F_VERSION_1 | OFFERED;
        if opts.guest_mac.is_some() {
            avail_features |= MAC;
        }
        let limits = NetLimits::new(&opts.rx_rate_limiter, &opts.tx_rate_limiter)?;
        Ok(Net {
            limits,
            opts,
            offer: DeviceOffer {
                device_type: VIRTIO_ID_NET,
                avail_features,
                queue_sizes: &[QUEUE_SIZE, QUEUE_SIZE],
            },
            backend,
            metrics: Arc::new(NetMetrics::default()),
            wake: Arc::new(Wake::new().map_err(NetError::EventFd)?),
            tx_buf: vec![0; MAX_BUFFER_BYTES],
            rx_buf: vec![0; MAX_BUFFER_BYTES],
            active: None,
            offload: None,
            rx_frame: None,
            rx_held: VecDeque::new(),
            mmds: None,
        })
    }

    /// The options it was made with.
    pub fn options(&self) -> &NetOptions {
        &self.opts
    }

    /// The interface's ID.
    pub fn iface_id(&self) -> &str {
        &self.opts.iface_id
    }

    /// The counters.
    pub fn metrics(&self) -> &Arc<NetMetrics> {
        &self.metrics
    }

    /// The eventfd the device's thread polls besides the tap and the queue
    /// eventfds: activation and left-over work.
    pub fn wake_evt(&self) -> &EventFd {
        self.wake.evt()
    }

    /// The backend's fd (the tap), for the device's thread to poll.
    pub fn backend_fd(&self) -> std::os::fd::RawFd {
        self.backend.as_raw_fd()
    }

    /// Whether the device runs (between `DRIVER_OK` and a reset).
    pub fn is_active(&self) -> bool {
        self.active.is_some()
    }

    /// The features the driver acked, while the device runs.
    pub fn acked_features(&self) -> Option<u64> {
        self.active.as_ref().map(|a| a.acked_features)
    }
}

/// The device's thread: which event runs which pass ([`super::queues`]).
///
/// Syscalls it makes, for its seccomp role: the loop's
/// ([`crate::devices::virtio::worker`]), `read` on the tap, `write` on the
/// tap and the irqfd, `ioctl TUNSETOFFLOAD` on the tap (once per
/// activation), `futex` (the device's lock), the rate limiters' timers
/// ([`limits`]).
impl<M: DeviceMemory> QueueHandler for Net<M> {
    fn wake(&self) -> Arc<Wake> {
        self.wake.clone()
    }

    fn sources(&self) -> Vec<(RawFd, EventSet)> {
        // Edge triggered: a tap with frames waiting for receive buffers
        // must not wake the thread again and again.
        // Then the rate limiters' timers (super::limits).
        let [rx, tx] = self.limits.fds();
        vec![
            (self.backend_fd(), EventSet::IN | EventSet::EDGE_TRIGGERED),
            (rx, EventSet::IN),
            (tx, EventSet::IN),
        ]
    }

    fn queue_event(&mut self, index: usize) {
        self.process_queue(index);
    }

    fn wake_event(&mut self, pending: PendingQueues) {
        self.process_wake(pending);
    }

    fn source_event(&mut self, index: usize, _events: EventSet) {
        match index {
            0 => self.process_tap(),
            i => self.process_limiter(i),
        }
    }
}

impl<M: DeviceMemory> VirtioDevice<M> for Net<M> {
    fn offer(&self) -> DeviceOffer {
        self.offer
    }

    fn config_space(&self) -> ConfigSpace {
        // `mac`, then `status`, `max_virtqueue_pairs` and `mtu` (not
        // offered: 0).
        let mut b = [0u8; CONFIG_SPACE_BYTES];
        if let Some(mac) = self.opts.guest_mac {
            b[..6].copy_from_slice(&mac);
        }
        ConfigSpace::new(&b)
    }

    fn config_refused(&self, access: ConfigAccess) {
        // The MAC is the host's to set (Firecracker refuses driver writes).
        access.count_write(&self.metrics.cfg_fails);
    }

    fn activate(&mut self, active: ActiveState<M>) -> Result<(), ActivateError> {
        active
            .check(self.active.is_some(), [RX_INDEX, TX_INDEX])
            .inspect_err(|_| self.metrics.activate_fails.inc())?;
        self.offload = Some(tap_offload_for(active.acked_features));
        self.active = Some(active);
        self.rx_frame = None;
        self.rx_held.clear();
        // Buffers posted before DRIVER_OK, frames already in the tap
        // (whose edge came while the device slept): one pass of each.
        self.wake
            .again(&[TX_INDEX, RX_INDEX])
            .map_err(ActivateError::Signal)
    }

    fn queue_positions(&self) -> Option<Vec<crate::devices::virtio::QueuePosition>> {
        self.positions()
    }

    fn reset(&mut self) {
        // Drops the queues, the guest memory and the held chains; a frame
        // that waited for buffers is dropped (counted). Frames still in the
        // tap stay there (bounded by the tap's queue) for the next driver.
        self.active = None;
        self.offload = None;
        self.rx_held.clear();
        self.wake.clear();
        if self.rx_frame.take().is_some() {
            self.metrics.rx_dropped_frames.inc();
        }
    }
}
