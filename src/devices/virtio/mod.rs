//! Virtio devices on the virtio-mmio transport (virtio 1.x, MMIO version 2).
//!
//! What this module owns, and how its threads talk:
//! - [`MmioTransport`] ([`transport::mmio`]): one device's 4 KiB register
//!   window. vCPU threads call [`MmioTransport::read`] / [`MmioTransport::write`]
//!   from their MMIO exits; the transport keeps the virtio status, the
//!   feature pages and each queue's registers, and at `DRIVER_OK` checks the
//!   queues against guest memory and hands them to the device
//!   ([`VirtioDevice::activate`]).
//! - Queue notifications never run device work on a vCPU: a `QueueNotify`
//!   write only writes the queue's eventfd (the same one the VMM
//!   registers with KVM as an ioeventfd, so both paths reach the device
//!   alike); the device's own thread polls those fds and does the queue work.
//! - Interrupts ([`interrupt`]): the transport's [`IrqTrigger`] sets
//!   `InterruptStatus` bits and writes an eventfd (registered as an irqfd);
//!   devices see it as a [`VirtioInterrupt`].
//! - The devices: [`balloon`], [`block`], [`mem`], [`net`], [`rng`],
//!   [`vsock`], one folder each. What they share is written once beside
//!   them: the [`VirtioDevice`] trait with its default configuration-space
//!   access and the [`ActiveState`] (guest memory view, queues, interrupt,
//!   and the activation's [`Epoch`], which tells work begun before a reset
//!   from work of this activation) a device holds while it runs
//!   ([`device`]); the device thread's loop, an `event-manager` loop with
//!   the device as its subscriber, and the wake eventfd with its pending
//!   queues and bounded passes ([`worker`]); counters that serialize
//!   themselves ([`metrics`]). Each device thread has its own seccomp role.
//! - Devices reach guest memory only through the memory handle given at
//!   activation ([`DeviceMemory`], [`memory`]: `GuestView` in production)
//!   and drop it on reset.
//! - Fuzzing: the harnesses live in the fuzz crate (fuzz/src/), outside
//!   the library; nothing here exists for them.
//!
//! This module only declares its children and re-exports what the devices
//! use; each item is defined in the child that owns it.

pub mod balloon;
pub mod block;
pub mod chains;
pub mod device;
pub mod fence;
pub mod hold;
pub mod interrupt;
pub mod mem;
pub mod memory;
pub mod metrics;
pub mod net;
pub mod rng;
#[cfg(test)]
mod test_utils;
pub mod transport;
pub mod vsock;
pub mod worker;

pub use device::{
    read_config_space, status, ActivateError, ActiveState, ConfigAccess, ConfigSpace, DeviceOffer,
    Epoch, QueuePosition, VirtioDevice, VIRTIO_F_VERSION_1,
};
pub use fence::ResetFence;
pub use hold::Gate;
pub use interrupt::{IrqTrigger, VirtioInterrupt, VirtioInterruptType, INT_CONFIG, INT_VRING};
pub use memory::DeviceMemory;
pub use metrics::Counter;
pub use transport::mmio::{MmioError, MmioTransport};
pub use transport::persist::{QueueState, TransportState};
pub use worker::{
    quiesce, wait_for, PassWatch, PendingQueues, QueueHandler, Wake, Worker, WorkerError,
};
