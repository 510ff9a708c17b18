//! The network device: features, configuration space, activation and
//! reset. The queue and tap work is in [`super::queues`]; it runs on the
//! device's thread, never in these calls (a vCPU thread's).

use std::collections::VecDeque;
use std::sync::Arc;

use virtio_queue::{Queue, QueueT};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::features::{MAC, OFFERED};
use super::metrics::NetMetrics;
use super::tap::{tap_offload_for, NetBackend, Tap};
use super::{
    NetError, CONFIG_SPACE_BYTES, MAX_BUFFER_BYTES, QUEUE_SIZE, RX_INDEX, TX_INDEX, VIRTIO_ID_NET,
};
use crate::devices::virtio::{
    ActivateError, DeviceMemory, VirtioDevice, VirtioInterrupt, VIRTIO_F_VERSION_1,
};

/// What the device is made with (the API's `PUT /network-interfaces`,
/// checked; the tap is opened separately by [`super::open_tap`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NetOptions {
    /// The interface's ID (the API's `iface_id`; names the metrics).
    pub iface_id: String,
    /// The guest's MAC; without one the driver picks its own.
    pub guest_mac: Option<[u8; 6]>,
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

/// What exists while the device runs (between `DRIVER_OK` and a reset).
pub(super) struct Active<M: DeviceMemory> {
    pub mem: M,
    pub queues: Vec<Queue>,
    pub interrupt: Arc<dyn VirtioInterrupt>,
    pub acked: u64,
    /// The tap offloads still to set (the device's thread does, before it
    /// reads a frame).
    pub offload: Option<u32>,
    /// Bytes of a frame (with header) in the receive bounce buffer that
    /// wait for buffers.
    pub rx_frame: Option<usize>,
    /// Receive chains taken from the ring for the waiting frame (more than
    /// one only with mergeable buffers).
    pub rx_held: VecDeque<RxChain>,
    /// Queues with work left over from a bounded pass.
    pub pending_tx: bool,
    pub pending_rx: bool,
}

/// A virtio-net device.
pub struct Net<M: DeviceMemory> {
    pub(super) opts: NetOptions,
    avail_features: u64,
    queue_sizes: [u16; 2],
    pub(super) backend: Box<dyn NetBackend>,
    pub(super) metrics: Arc<NetMetrics>,
    pub(super) wake: Arc<EventFd>,
    /// Bounce buffers, [`MAX_BUFFER_BYTES`] each.
    pub(super) tx_buf: Vec<u8>,
    pub(super) rx_buf: Vec<u8>,
    pub(super) active: Option<Active<M>>,
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
        Ok(Net {
            opts,
            avail_features,
            queue_sizes: [QUEUE_SIZE, QUEUE_SIZE],
            backend,
            metrics: Arc::new(NetMetrics::default()),
            wake: Arc::new(EventFd::new(EFD_NONBLOCK).map_err(NetError::EventFd)?),
            tx_buf: vec![0; MAX_BUFFER_BYTES],
            rx_buf: vec![0; MAX_BUFFER_BYTES],
            active: None,
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
        &self.wake
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
        self.active.as_ref().map(|a| a.acked)
    }

    fn config_bytes(&self) -> [u8; CONFIG_SPACE_BYTES] {
        let mut b = [0u8; CONFIG_SPACE_BYTES];
        if let Some(mac) = self.opts.guest_mac {
            b[..6].copy_from_slice(&mac);
        }
        b
    }
}

impl<M: DeviceMemory> VirtioDevice<M> for Net<M> {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_NET
    }

    fn avail_features(&self) -> u64 {
        self.avail_features
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &self.queue_sizes
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        let b = self.config_bytes();
        super::super::read_config_space(&b, offset, data);
    }

    fn write_config(&mut self, _offset: u64, _data: &[u8]) {
        // The MAC is the host's to set (Firecracker refuses driver writes).
        NetMetrics::add(&self.metrics.cfg_fails, 1);
    }

    fn activate(
        &mut self,
        mem: M,
        acked_features: u64,
        queues: Vec<Queue>,
        interrupt: Arc<dyn VirtioInterrupt>,
    ) -> Result<(), ActivateError> {
        if self.active.is_some() {
            NetMetrics::add(&self.metrics.activate_fails, 1);
            return Err(ActivateError::AlreadyActive);
        }
        for i in [RX_INDEX, TX_INDEX] {
            if !queues.get(i).is_some_and(|q| q.ready()) {
                NetMetrics::add(&self.metrics.activate_fails, 1);
                return Err(ActivateError::QueueNotReady(i));
            }
        }
        self.active = Some(Active {
            mem,
            queues,
            interrupt,
            acked: acked_features,
            offload: Some(tap_offload_for(acked_features)),
            rx_frame: None,
            rx_held: VecDeque::new(),
            // Buffers posted before DRIVER_OK, frames already in the tap
            // (whose edge came while the device slept): one pass of each.
            pending_tx: true,
            pending_rx: true,
        });
        self.wake.write(1).map_err(ActivateError::Signal)
    }

    fn reset(&mut self) {
        // Drops the queues, the guest memory and the held chains; a frame
        // that waited for buffers is dropped (counted). Frames still in the
        // tap stay there (bounded by the tap's queue) for the next driver.
        if let Some(a) = self.active.take() {
            if a.rx_frame.is_some() {
                NetMetrics::add(&self.metrics.rx_dropped_frames, 1);
            }
        }
    }
}
