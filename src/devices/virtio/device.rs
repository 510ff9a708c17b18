//! What every virtio device is to the transport ([`VirtioDevice`]) and what
//! it holds while it runs ([`ActiveState`]): written once here, so a device
//! file holds only what is particular to the device.
//!
//! The configuration space: a device says what its bytes are
//! ([`VirtioDevice::config_space`]) and which of them the driver may write
//! ([`VirtioDevice::config_writable`]); the default
//! [`VirtioDevice::read_config`] and [`VirtioDevice::write_config`] do the
//! rest (bytes past the end read 0; writes to other bytes are refused and
//! reported to [`VirtioDevice::config_refused`], Firecracker's
//! `cfg_fails`).
//!
//! The numbers of the virtio spec that every device and the transport share
//! are here too: [`VIRTIO_F_VERSION_1`], which every device offers, and the
//! device status bits the driver writes ([`status`]).

use std::ops::{Deref, DerefMut, Range};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use virtio_queue::{Queue, QueueT};

use super::fence::ResetFence;
use super::interrupt::{VirtioInterrupt, VirtioInterruptType};
use super::memory::DeviceMemory;
use super::metrics::Counter;

/// `VIRTIO_F_VERSION_1`: the device is a virtio 1.x device (bit 32).
pub const VIRTIO_F_VERSION_1: u64 = 1 << virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;

/// Device status bits (virtio 1.x, 2.1).
pub mod status {
    use virtio_bindings::virtio_config as c;
    /// The guest found the device.
    pub const ACKNOWLEDGE: u32 = c::VIRTIO_CONFIG_S_ACKNOWLEDGE;
    /// The guest has a driver for it.
    pub const DRIVER: u32 = c::VIRTIO_CONFIG_S_DRIVER;
    /// The driver is set up and the device is live.
    pub const DRIVER_OK: u32 = c::VIRTIO_CONFIG_S_DRIVER_OK;
    /// Feature negotiation is complete (kept only if the device accepts).
    pub const FEATURES_OK: u32 = c::VIRTIO_CONFIG_S_FEATURES_OK;
    /// The device hit an error it cannot recover from without a reset.
    pub const DEVICE_NEEDS_RESET: u32 = c::VIRTIO_CONFIG_S_NEEDS_RESET;
    /// The driver gave up on the device.
    pub const FAILED: u32 = c::VIRTIO_CONFIG_S_FAILED;
}

/// Why a device refused to start.
#[derive(Debug, thiserror::Error)]
pub enum ActivateError {
    /// A queue the negotiated features need is not ready.
    #[error("queue {0} is needed but the driver did not make it ready")]
    QueueNotReady(usize),
    /// The device cannot start twice without a reset.
    #[error("the device is already active")]
    AlreadyActive,
    /// The reset before has not completed (work of the device may still
    /// touch guest memory).
    #[error("the device's reset has not completed yet")]
    ResetInProgress,
    /// The driver did not accept a feature the device needs (virtio-mem's
    /// `VIRTIO_MEM_F_UNPLUGGED_INACCESSIBLE`).
    #[error("the driver did not accept feature bit {0}, which the device needs")]
    FeatureNotAcked(u32),
    /// An eventfd write failed.
    #[error("cannot signal the device thread: {0}")]
    Signal(std::io::Error),
}

/// Which activation of a device a piece of work began under. Each
/// [`ActiveState`] gets its own, numbered once across the process, so no
/// device keeps a count of its own: work that outlives the lock it began
/// under (a block request in host I/O, a balloon batch or a virtio-mem
/// plug at its sink) keeps the epoch, and when it ends, a device whose
/// running [`ActiveState::epoch`] is another one (or that runs none: a
/// reset came between) drops its answer, for the driver that asked is gone.
/// The default epoch belongs to no activation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Epoch(u64);

impl Epoch {
    /// A new epoch, never given before.
    fn next() -> Epoch {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        Epoch(NEXT.fetch_add(1, Ordering::Relaxed))
    }
}

/// What exists while a device runs (between `DRIVER_OK` and a reset): the
/// guest memory view, the queues and the interrupt (Firecracker's
/// `ActiveState`), and the activation's [`Epoch`]. Dropping it drops the
/// device's hold on guest memory.
pub struct ActiveState<M: DeviceMemory> {
    /// The guest memory, as the transport handed it over.
    pub mem: M,
    /// One per [`VirtioDevice::queue_max_sizes`] entry.
    pub queues: Vec<Queue>,
    /// How the device interrupts the guest.
    pub interrupt: Arc<dyn VirtioInterrupt>,
    /// The features the driver acked.
    pub acked_features: u64,
    epoch: Epoch,
}

impl<M: DeviceMemory> ActiveState<M> {
    /// What the transport hands a device at `DRIVER_OK`, with an epoch of
    /// its own.
    pub fn new(
        mem: M,
        acked_features: u64,
        queues: Vec<Queue>,
        interrupt: Arc<dyn VirtioInterrupt>,
    ) -> ActiveState<M> {
        ActiveState {
            mem,
            queues,
            interrupt,
            acked_features,
            epoch: Epoch::next(),
        }
    }

    /// This activation's epoch.
    pub fn epoch(&self) -> Epoch {
        self.epoch
    }

    /// Whether the device may start with it: not while `running` (an
    /// activation without a reset), and only with the queues `needed`
    /// ready.
    pub fn check(
        &self,
        running: bool,
        needed: impl IntoIterator<Item = usize>,
    ) -> Result<(), ActivateError> {
        if running {
            return Err(ActivateError::AlreadyActive);
        }
        match needed
            .into_iter()
            .find(|&i| !self.queues.get(i).is_some_and(|q| q.ready()))
        {
            Some(i) => Err(ActivateError::QueueNotReady(i)),
            None => Ok(()),
        }
    }

    /// Where each queue stands ([`QueuePosition`]), for a snapshot.
    pub fn positions(&self) -> Vec<QueuePosition> {
        self.queues.iter().map(QueuePosition::of).collect()
    }

    /// Interrupts the guest for queue `q`'s used ring; false if that failed.
    pub fn signal_used(&self, q: usize) -> bool {
        let q = u16::try_from(q).unwrap_or(u16::MAX);
        self.interrupt
            .trigger(VirtioInterruptType::Queue(q))
            .is_ok()
    }
}

/// Where a running queue stands: what a snapshot keeps of it beside its
/// registers, and a restore puts back before the device starts again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QueuePosition {
    /// The next available-ring entry the device takes.
    pub next_avail: u16,
    /// The next used-ring entry the device writes.
    pub next_used: u16,
    /// Whether `VIRTIO_RING_F_EVENT_IDX` rules its notifications.
    pub event_idx: bool,
}

impl QueuePosition {
    /// Where `q` stands.
    pub fn of(q: &Queue) -> QueuePosition {
        QueuePosition {
            next_avail: q.next_avail(),
            next_used: q.next_used(),
            event_idx: q.event_idx_enabled(),
        }
    }

    /// Puts `q` there.
    pub fn apply(&self, q: &mut Queue) {
        q.set_next_avail(self.next_avail);
        q.set_next_used(self.next_used);
        q.set_event_idx(self.event_idx);
    }
}

/// Most bytes of a configuration space ([`ConfigSpace`]): virtio-mem's 56
/// are the most of teravm's devices.
pub const MAX_CONFIG_SPACE_BYTES: usize = 64;

/// A device's configuration space as the guest sees it now: a few bytes on
/// the stack (the transport reads it on a vCPU thread, without
/// allocating).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConfigSpace {
    bytes: [u8; MAX_CONFIG_SPACE_BYTES],
    len: usize,
}

/// An empty space (arrays past 32 bytes have no derived `Default`).
impl Default for ConfigSpace {
    fn default() -> ConfigSpace {
        ConfigSpace {
            bytes: [0; MAX_CONFIG_SPACE_BYTES],
            len: 0,
        }
    }
}

impl ConfigSpace {
    /// The space holding `bytes` (at most [`MAX_CONFIG_SPACE_BYTES`]; more
    /// is cut off).
    pub fn new(bytes: &[u8]) -> ConfigSpace {
        debug_assert!(bytes.len() <= MAX_CONFIG_SPACE_BYTES);
        let len = bytes.len().min(MAX_CONFIG_SPACE_BYTES);
        let mut c = ConfigSpace {
            bytes: [0; MAX_CONFIG_SPACE_BYTES],
            len,
        };
        c.bytes[..len].copy_from_slice(&bytes[..len]);
        c
    }
}

impl Deref for ConfigSpace {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

impl DerefMut for ConfigSpace {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.bytes[..self.len]
    }
}

/// A guest access to the configuration space that the device refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigAccess {
    /// A read with bytes past the end (they read 0).
    ReadPastEnd,
    /// A write with bytes the driver may not write (they are ignored).
    Write,
}

impl ConfigAccess {
    /// Counts the access on `cfg_fails` if it is a refused write (reads past
    /// the end are not counted): the policy of net and vsock, whose
    /// configuration space is the host's to set.
    pub fn count_write(self, cfg_fails: &Counter) {
        if self == ConfigAccess::Write {
            cfg_fails.inc();
        }
    }
}

/// Copies the config space `config` from `offset` into `data`, as a guest
/// read of it sees it: bytes past the end read 0. Returns whether any byte
/// was past the end.
pub fn read_config_space(config: &[u8], offset: u64, data: &mut [u8]) -> bool {
    let mut past_end = false;
    for (i, d) in data.iter_mut().enumerate() {
        let byte = usize::try_from(offset)
            .ok()
            .and_then(|o| o.checked_add(i))
            .and_then(|o| config.get(o));
        past_end |= byte.is_none();
        *d = byte.copied().unwrap_or(0);
    }
    past_end
}

/// What a device offers its driver, fixed when the device is made: its
/// type, its features and its queues.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceOffer {
    /// The virtio device ID (`VIRTIO_ID_*`).
    pub device_type: u32,
    /// The features the device offers.
    pub avail_features: u64,
    /// The maximum size of each of the device's queues (all it may use).
    pub queue_sizes: &'static [u16],
}

/// A virtio device behind a transport (Firecracker's and Cloud Hypervisor's
/// shape). The transport calls these from a vCPU thread, with the device's
/// lock held: each returns promptly and does no queue work.
pub trait VirtioDevice<M: DeviceMemory>: Send {
    /// What the device offers (type, features, queues).
    fn offer(&self) -> DeviceOffer;
    /// The virtio device ID (`VIRTIO_ID_*`).
    fn device_type(&self) -> u32 {
        self.offer().device_type
    }
    /// The features the device offers.
    fn avail_features(&self) -> u64 {
        self.offer().avail_features
    }
    /// The maximum size of each of the device's queues (all it may use).
    fn queue_max_sizes(&self) -> &[u16] {
        self.offer().queue_sizes
    }
    /// The configuration space's bytes now.
    fn config_space(&self) -> ConfigSpace {
        ConfigSpace::default()
    }
    /// The bytes of the configuration space the driver may write (none by
    /// default).
    fn config_writable(&self) -> Range<usize> {
        0..0
    }
    /// The driver wrote some of [`Self::config_writable`]: `config` is the
    /// whole space with the write applied.
    fn config_written(&mut self, _config: &[u8]) {}
    /// Counts an access the configuration space refused.
    fn config_refused(&self, _access: ConfigAccess) {}
    /// Reads the configuration space at `offset`; bytes past its end read 0.
    fn read_config(&self, offset: u64, data: &mut [u8]) {
        if read_config_space(&self.config_space(), offset, data) {
            self.config_refused(ConfigAccess::ReadPastEnd);
        }
    }
    /// Writes the configuration space at `offset`; bytes the driver may not
    /// write, and bytes past its end, are ignored.
    fn write_config(&mut self, offset: u64, data: &[u8]) {
        let writable = self.config_writable();
        let mut config = self.config_space();
        let mut refused = false;
        for (i, &d) in data.iter().enumerate() {
            match usize::try_from(offset).ok().and_then(|o| o.checked_add(i)) {
                Some(o) if writable.contains(&o) && o < config.len() => config[o] = d,
                _ => refused = true,
            }
        }
        if refused {
            self.config_refused(ConfigAccess::Write);
        }
        if !writable.is_empty() {
            self.config_written(&config);
        }
    }
    /// The configuration generation: changes whenever the device changes its
    /// configuration space.
    fn config_generation(&self) -> u32 {
        0
    }
    /// Starts the device with the negotiated features and the queues (one
    /// per [`VirtioDevice::queue_max_sizes`] entry, checked against guest
    /// memory when ready; a queue the driver did not make ready has
    /// `ready() == false`): see [`ActiveState::check`].
    fn activate(&mut self, active: ActiveState<M>) -> Result<(), ActivateError>;
    /// Stops the device and forgets the queues and the guest memory.
    fn reset(&mut self);
    /// While it runs, where each of its queues stands, as the guest would
    /// be served again after a restore (a device that holds chains it took
    /// and will give back, as net's receive chains, counts them as not
    /// taken); `None` while it does not run. Asked only with the device
    /// held still ([`crate::devices::virtio::Gate`]).
    fn queue_positions(&self) -> Option<Vec<QueuePosition>> {
        None
    }
    /// After [`VirtioDevice::reset`]: whether work the device started may
    /// still touch guest memory (a discard in flight). The transport reports
    /// the reset complete (Status reads 0, virtio 1.2, 2.4) and lets the
    /// driver start again only once this is false; it must return promptly.
    fn reset_in_progress(&mut self) -> bool {
        false
    }
    /// What a reset that left work in flight ([`VirtioDevice::reset_in_progress`])
    /// waits for before the Status write returns to the guest (a driver
    /// that never polls Status, as Linux's): `None` for a device whose
    /// reset completes at once.
    fn reset_fence(&self) -> Option<Arc<ResetFence>> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::virtio::test_utils::{guest_memory, Irq};

    #[test]
    fn each_activation_has_an_epoch_of_its_own_and_none_is_the_default() {
        let mem = guest_memory(&[(0, 0x1000)]);
        let activate = || ActiveState::new(mem.clone(), 0, Vec::new(), Arc::new(Irq::default()));
        let (a, b) = (activate(), activate());
        assert_ne!(a.epoch(), b.epoch());
        assert_ne!(a.epoch(), Epoch::default());
        assert_ne!(b.epoch(), Epoch::default());
    }
}
