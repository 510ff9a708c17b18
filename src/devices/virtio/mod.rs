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
//! - The devices: [`balloon`], [`block`], [`mem`], [`net`], [`vsock`], one folder
//!   each. What they share is written once here: the [`VirtioDevice`] trait
//!   with its default configuration-space access and the [`ActiveState`]
//!   (guest memory view, queues, interrupt) a device holds while it runs
//!   ([`device`]); the device thread's loop, an `event-manager` loop with
//!   the device as its subscriber, and the wake eventfd with pending flags
//!   and bounded passes ([`worker`]); counters that serialize themselves
//!   ([`metrics`]). Each device thread has its own seccomp role.
//! - Devices reach guest memory only through the memory handle given at
//!   activation (`GuestView` in production) and drop it on reset.
//! - Fuzzing: the harnesses live in the fuzz crate (fuzz/src/), outside
//!   the library; nothing here exists for them.

pub mod balloon;
pub mod block;
pub mod chains;
pub mod device;
pub mod fence;
pub mod mem;
pub mod metrics;
pub mod mmio;
#[cfg(test)]
mod mmio_tests;
pub mod net;
pub mod rng;
#[cfg(test)]
mod test_utils;
pub mod vsock;
pub mod worker;

use std::ops::Deref;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use vm_memory::GuestMemoryBackend;
use vmm_sys_util::eventfd::EventFd;

pub use device::{
    read_config_space, ActivateError, ActiveState, ConfigAccess, ConfigSpace, DeviceOffer,
    VirtioDevice,
};
pub use fence::ResetFence;
pub use metrics::Counter;
pub use mmio::{MmioError, MmioTransport};
pub use worker::{quiesce, Pending, QueueHandler, Wake, Worker, WorkerError};

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
    /// Told after each trigger: vCPUs waiting on port 0xf0c wake.
    hub: std::sync::OnceLock<Arc<crate::devices::wake::WakeHub>>,
}

impl IrqTrigger {
    /// An interrupt signalling `irq_evt`.
    pub fn new(irq_evt: EventFd) -> IrqTrigger {
        IrqTrigger {
            status: Arc::new(AtomicU32::new(0)),
            irq_evt,
            hub: std::sync::OnceLock::new(),
        }
    }

    /// Lets vCPUs wait on this interrupt, the one of MMIO slot `slot`, in
    /// `hub`, which is notified after each trigger (one hub: a second is
    /// ignored).
    pub fn wake_on(&self, hub: &Arc<crate::devices::wake::WakeHub>, slot: usize) {
        hub.watch(slot, self.status.clone());
        let _ = self.hub.set(hub.clone());
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
        if let Some(hub) = self.hub.get() {
            hub.notify();
        }
        self.irq_evt.write(1)
    }
}
