//! How a device interrupts the guest ([`VirtioInterrupt`]) and the
//! transport's interrupt that does it ([`IrqTrigger`]): the
//! `InterruptStatus` bits ([`INT_VRING`], [`INT_CONFIG`]), shared with the
//! register window, and the eventfd the VMM registers as the device's irqfd.
//! A trigger also tells the VM's [`WakeHub`], so a vCPU waiting for this
//! device on the firmware's wait port wakes.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};

use vmm_sys_util::eventfd::EventFd;

use crate::devices::wake::WakeHub;

/// `InterruptStatus` bit: a used ring was updated.
pub const INT_VRING: u32 = virtio_bindings::virtio_mmio::VIRTIO_MMIO_INT_VRING;
/// `InterruptStatus` bit: the configuration space changed.
pub const INT_CONFIG: u32 = virtio_bindings::virtio_mmio::VIRTIO_MMIO_INT_CONFIG;

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
    hub: OnceLock<Arc<WakeHub>>,
}

impl IrqTrigger {
    /// An interrupt signalling `irq_evt`.
    pub fn new(irq_evt: EventFd) -> IrqTrigger {
        IrqTrigger {
            status: Arc::new(AtomicU32::new(0)),
            irq_evt,
            hub: OnceLock::new(),
        }
    }

    /// Lets vCPUs wait on this interrupt, the one of MMIO slot `slot`, in
    /// `hub`, which is notified after each trigger (one hub: a second is
    /// ignored).
    pub fn wake_on(&self, hub: &Arc<WakeHub>, slot: usize) {
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

    /// Puts `InterruptStatus` back as a snapshot saved it and signals the
    /// guest again for each bit set (as Firecracker re-notifies), so that a
    /// driver that had not handled it yet does.
    pub fn restore(&self, bits: u32) -> std::io::Result<()> {
        let bits = bits & (INT_VRING | INT_CONFIG);
        self.status.store(0, Ordering::SeqCst);
        if bits & INT_VRING != 0 {
            self.trigger(VirtioInterruptType::Queue(0))?;
        }
        if bits & INT_CONFIG != 0 {
            self.trigger(VirtioInterruptType::Config)?;
        }
        Ok(())
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
