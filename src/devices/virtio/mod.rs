//! Virtio devices on the virtio-mmio transport (virtio 1.x, MMIO version 2).
//!
//! What this module owns, and how its threads talk:
//! - [`mmio::MmioTransport`]: one device's 4 KiB register window. vCPU
//!   threads call [`mmio::MmioTransport::read`] / [`mmio::MmioTransport::write`]
//!   from their MMIO exits; the transport keeps the virtio status, the
//!   feature pages and each queue's registers, and at `DRIVER_OK` checks the
//!   queues against guest memory and hands them to the device
//!   ([`VirtioDevice::activate`]).
//! - Queue notifications never run device work on a vCPU: a `QueueNotify`
//!   write only writes the queue's [`EventFd`] (the same one the VMM
//!   registers with KVM as an ioeventfd, so both paths reach the device
//!   alike); the device's own thread polls those fds and does the queue work.
//! - Interrupts: the transport's [`IrqTrigger`] sets `InterruptStatus` bits
//!   and writes an [`EventFd`] (registered as an irqfd); devices see it as a
//!   [`VirtioInterrupt`].
//! - Devices ([`balloon`]) reach guest memory only through the memory handle
//!   given at activation (`GuestView` in production) and drop it on reset.

pub mod balloon;
pub mod block;
pub mod fuzz_block;
pub mod fuzz_driver;
pub mod fuzz_net;
pub mod fuzz_vsock;
pub mod fuzzing;
pub mod mmio;
#[cfg(test)]
mod mmio_tests;
pub mod net;
pub mod vsock;

use std::ops::Deref;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use virtio_queue::Queue;
use vm_memory::GuestMemoryBackend;
use vmm_sys_util::eventfd::EventFd;

pub use mmio::{MmioError, MmioTransport};

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

/// `InterruptStatus` bit: a used ring was updated.
pub const INT_VRING: u32 = virtio_bindings::virtio_mmio::VIRTIO_MMIO_INT_VRING;
/// `InterruptStatus` bit: the configuration space changed.
pub const INT_CONFIG: u32 = virtio_bindings::virtio_mmio::VIRTIO_MMIO_INT_CONFIG;

/// The memory handle a device is given: something cheap to clone that
/// derefs to vm-memory guest memory with regions ([`GuestMemoryBackend`]:
/// `GuestView` in production, an `Arc<GuestMemoryMmap>` in tests).
pub trait DeviceMemory: Deref<Target = Self::Mem> + Clone + Send + Sync + 'static {
    /// The guest memory behind the handle.
    type Mem: GuestMemoryBackend + Send + Sync;
}

impl<T> DeviceMemory for T
where
    T: Deref + Clone + Send + Sync + 'static,
    T::Target: GuestMemoryBackend + Send + Sync + Sized,
{
    type Mem = T::Target;
}

/// What an interrupt is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VirtioInterruptType {
    /// A used ring was updated (the queue's index, for devices that care).
    Queue(u16),
    /// The configuration space changed.
    Config,
}

/// How a device interrupts the guest.
pub trait VirtioInterrupt: Send + Sync {
    /// Sets the matching `InterruptStatus` bit and signals the guest. Never
    /// blocks (an eventfd write).
    fn trigger(&self, int_type: VirtioInterruptType) -> std::io::Result<()>;
}

/// The transport's interrupt: `InterruptStatus` (shared with the register
/// window) and the eventfd the VMM registers as the device's irqfd.
#[derive(Debug)]
pub struct IrqTrigger {
    status: Arc<AtomicU32>,
    irq_evt: EventFd,
}

impl IrqTrigger {
    /// An interrupt signalling `irq_evt`.
    pub fn new(irq_evt: EventFd) -> IrqTrigger {
        IrqTrigger {
            status: Arc::new(AtomicU32::new(0)),
            irq_evt,
        }
    }

    /// The eventfd to register as the irqfd.
    pub fn irq_evt(&self) -> &EventFd {
        &self.irq_evt
    }

    /// The current `InterruptStatus`.
    pub fn status(&self) -> u32 {
        self.status.load(Ordering::SeqCst)
    }

    /// `InterruptACK`: clears the bits given.
    pub fn ack(&self, bits: u32) {
        self.status.fetch_and(!bits, Ordering::SeqCst);
    }

    /// Clears every bit (a device reset).
    pub fn clear(&self) {
        self.status.store(0, Ordering::SeqCst);
    }
}

impl VirtioInterrupt for IrqTrigger {
    fn trigger(&self, int_type: VirtioInterruptType) -> std::io::Result<()> {
        let bit = match int_type {
            VirtioInterruptType::Queue(_) => INT_VRING,
            VirtioInterruptType::Config => INT_CONFIG,
        };
        self.status.fetch_or(bit, Ordering::SeqCst);
        self.irq_evt.write(1)
    }
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
    /// An eventfd write failed.
    #[error("cannot signal the device thread: {0}")]
    Signal(std::io::Error),
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

/// A virtio device behind a transport (Firecracker's and Cloud Hypervisor's
/// shape). The transport calls these from a vCPU thread, with the device's
/// lock held: each returns promptly and does no queue work.
pub trait VirtioDevice<M: DeviceMemory>: Send {
    /// The virtio device ID (`VIRTIO_ID_*`).
    fn device_type(&self) -> u32;
    /// The features the device offers.
    fn avail_features(&self) -> u64;
    /// The maximum size of each of the device's queues (all it may use).
    fn queue_max_sizes(&self) -> &[u16];
    /// Reads the configuration space at `offset`; bytes past its end read 0.
    fn read_config(&self, offset: u64, data: &mut [u8]);
    /// Writes the configuration space at `offset`; read-only fields and
    /// bytes past its end are ignored.
    fn write_config(&mut self, offset: u64, data: &[u8]);
    /// The configuration generation: changes whenever the device changes its
    /// configuration space.
    fn config_generation(&self) -> u32 {
        0
    }
    /// Starts the device with the negotiated features and the queues (one
    /// per [`VirtioDevice::queue_max_sizes`] entry, checked against guest
    /// memory when ready; a queue the driver did not make ready has
    /// `ready() == false`).
    fn activate(
        &mut self,
        mem: M,
        acked_features: u64,
        queues: Vec<Queue>,
        interrupt: Arc<dyn VirtioInterrupt>,
    ) -> Result<(), ActivateError>;
    /// Stops the device and forgets the queues and the guest memory.
    fn reset(&mut self);
    /// After [`VirtioDevice::reset`]: whether work the device started may
    /// still touch guest memory (a discard in flight). The transport reports
    /// the reset complete (Status reads 0, virtio 1.2, 2.4) and lets the
    /// driver start again only once this is false; it must return promptly.
    fn reset_in_progress(&mut self) -> bool {
        false
    }
}
