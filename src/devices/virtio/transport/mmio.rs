//! The virtio-mmio transport (virtio 1.x, 4.2.2; MMIO version 2): one
//! device's 4 KiB register window.
//!
//! A vCPU's MMIO exit calls [`MmioTransport::read`] or
//! [`MmioTransport::write`] with the offset inside the window. The transport
//! answers from its own registers (status, feature pages, the selected
//! queue's registers) or the device's configuration space (from 0x100), and
//! never does queue work: a `QueueNotify` write only writes the queue's
//! eventfd ([`MmioTransport::queue_evts`]), which the device thread polls and
//! the VMM may also register with KVM as an ioeventfd for the same address.
//!
//! Rules the guest cannot get around: `FEATURES_OK` is not kept if the
//! driver accepted a feature the device did not offer or lacks
//! `VIRTIO_F_VERSION_1`; queue registers are written only between
//! `FEATURES_OK` and `DRIVER_OK`; at `DRIVER_OK` each ready queue must have a
//! valid size and rings inside guest RAM, aligned (virtio-queue's
//! `is_valid`), and the device must accept it, else the status gets
//! `DEVICE_NEEDS_RESET` and a configuration interrupt. Writing 0 to `Status`
//! resets the transport and the device. Nothing here allocates per access.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::devices::virtio::device::{status, ActivateError, VirtioDevice, VIRTIO_F_VERSION_1};
use crate::devices::virtio::fence::ResetFence;
use crate::devices::virtio::interrupt::{IrqTrigger, VirtioInterrupt, VirtioInterruptType};
use crate::devices::virtio::memory::DeviceMemory;

/// Bytes of MMIO address space each device takes.
pub const MMIO_WINDOW_BYTES: u64 = 0x1000;
/// `MagicValue`: "virt".
pub const MMIO_MAGIC: u32 = 0x7472_6976;
/// `Version`: virtio 1.x over MMIO.
pub const MMIO_VERSION: u32 = 2;
/// `VendorID` (Firecracker's).
pub const MMIO_VENDOR_ID: u32 = 0;
/// Where the configuration space starts in the window.
pub const CONFIG_SPACE_OFFSET: u64 = 0x100;
/// The largest queue a device may declare (the split ring's limit).
pub const MAX_QUEUE_SIZE: u16 = 32768;

/// Register offsets (virtio 1.x, 4.2.2).
pub mod regs {
    /// R: "virt".
    pub const MAGIC_VALUE: u64 = 0x000;
    /// R: 2.
    pub const VERSION: u64 = 0x004;
    /// R: the virtio device ID.
    pub const DEVICE_ID: u64 = 0x008;
    /// R: the vendor ID.
    pub const VENDOR_ID: u64 = 0x00c;
    /// R: 32 bits of the device's features, page `DeviceFeaturesSel`.
    pub const DEVICE_FEATURES: u64 = 0x010;
    /// W: which page `DeviceFeatures` shows.
    pub const DEVICE_FEATURES_SEL: u64 = 0x014;
    /// W: 32 bits of the driver's features, page `DriverFeaturesSel`.
    pub const DRIVER_FEATURES: u64 = 0x020;
    /// W: which page `DriverFeatures` writes.
    pub const DRIVER_FEATURES_SEL: u64 = 0x024;
    /// W: the queue the queue registers address.
    pub const QUEUE_SEL: u64 = 0x030;
    /// R: the selected queue's maximum size (0: no such queue).
    pub const QUEUE_NUM_MAX: u64 = 0x034;
    /// W: the selected queue's size.
    pub const QUEUE_NUM: u64 = 0x038;
    /// RW: the selected queue is ready.
    pub const QUEUE_READY: u64 = 0x044;
    /// W: a queue has new buffers (the value is its index).
    pub const QUEUE_NOTIFY: u64 = 0x050;
    /// R: why the device interrupted.
    pub const INTERRUPT_STATUS: u64 = 0x060;
    /// W: the interrupt bits handled.
    pub const INTERRUPT_ACK: u64 = 0x064;
    /// RW: the device status.
    pub const STATUS: u64 = 0x070;
    /// W: the descriptor table address, low 32 bits.
    pub const QUEUE_DESC_LOW: u64 = 0x080;
    /// W: the descriptor table address, high 32 bits.
    pub const QUEUE_DESC_HIGH: u64 = 0x084;
    /// W: the available (driver) ring address, low 32 bits.
    pub const QUEUE_DRIVER_LOW: u64 = 0x090;
    /// W: the available (driver) ring address, high 32 bits.
    pub const QUEUE_DRIVER_HIGH: u64 = 0x094;
    /// W: the used (device) ring address, low 32 bits.
    pub const QUEUE_DEVICE_LOW: u64 = 0x0a0;
    /// W: the used (device) ring address, high 32 bits.
    pub const QUEUE_DEVICE_HIGH: u64 = 0x0a4;
    /// W: the shared memory region selected.
    pub const SHM_SEL: u64 = 0x0ac;
    /// R: shared memory region length, low (all ones: none).
    pub const SHM_LEN_LOW: u64 = 0x0b0;
    /// R: shared memory region length, high.
    pub const SHM_LEN_HIGH: u64 = 0x0b4;
    /// R: shared memory region base, low.
    pub const SHM_BASE_LOW: u64 = 0x0b8;
    /// R: shared memory region base, high.
    pub const SHM_BASE_HIGH: u64 = 0x0bc;
    /// R: changes whenever the device changes its configuration.
    pub const CONFIG_GENERATION: u64 = 0x0fc;
}

/// What the transport refused or could not do. None of these reaches the
/// guest (it sees the status register); the VMM logs them, rate-limited.
#[derive(Debug, thiserror::Error)]
pub enum MmioError {
    /// A device declared a queue size virtio cannot have.
    #[error("queue {index} has maximum size {size}: not a power of two in 1..=32768")]
    BadMaxQueueSize {
        /// The queue.
        index: usize,
        /// Its declared maximum size.
        size: u16,
    },
    /// A queue eventfd could not be made or signalled.
    #[error("queue eventfd: {0}")]
    QueueEvent(std::io::Error),
    /// The interrupt eventfd could not be signalled.
    #[error("interrupt eventfd: {0}")]
    Interrupt(std::io::Error),
    /// A register access that is not 4 bytes at a 4-byte-aligned offset, or
    /// outside the window.
    #[error("{len}-byte access at {offset:#x} refused")]
    BadAccess {
        /// Offset in the window.
        offset: u64,
        /// Access size.
        len: usize,
    },
    /// A write to a read-only or unknown register.
    #[error("write to read-only or unknown register {0:#x}")]
    ReadOnly(u64),
    /// A status write before the reset completed (Status still reads the
    /// status it had).
    #[error("status {0:#x} written before the device's reset completed")]
    ResetInProgress(u32),
    /// A feature write outside `DRIVER` .. `FEATURES_OK`.
    #[error("driver features written outside feature negotiation (status {0:#x})")]
    FeaturesNotNegotiating(u32),
    /// A queue register written outside `FEATURES_OK` .. `DRIVER_OK`.
    #[error("queue register {offset:#x} written in status {status:#x}")]
    QueueSetupNotAllowed {
        /// The register.
        offset: u64,
        /// The status then.
        status: u32,
    },
    /// `QueueNum` not a power of two in 1..=QueueNumMax.
    #[error("queue {index}: size {size} refused (maximum {max})")]
    BadQueueSize {
        /// The queue.
        index: u32,
        /// The size written.
        size: u32,
        /// The queue's maximum.
        max: u16,
    },
    /// A queue register or notification for a queue the device does not have.
    #[error("queue {0} does not exist")]
    NoSuchQueue(u32),
    /// A status write that clears bits or skips a step.
    #[error("status {from:#x} -> {to:#x} refused")]
    StatusTransition {
        /// The status before.
        from: u32,
        /// The value written.
        to: u32,
    },
    /// `FEATURES_OK` not kept.
    #[error("features {driver:#x} refused (device offers {device:#x}, VERSION_1 needed)")]
    FeaturesRefused {
        /// What the driver accepted.
        driver: u64,
        /// What the device offers.
        device: u64,
    },
    /// A ready queue is set up wrong: the device needs a reset.
    #[error("queue {index} refused at DRIVER_OK: {why}")]
    BadQueue {
        /// The queue.
        index: usize,
        /// What was wrong.
        why: &'static str,
    },
    /// The device refused to start: it needs a reset.
    #[error("device refused to start: {0}")]
    Activate(ActivateError),
    /// A saved state that does not fit this transport or its device (a
    /// snapshot's; see [`super::persist`]).
    #[error("the saved transport state does not fit the device: {0}")]
    BadState(String),
}

/// The queue registers of one queue, as the driver wrote them.
#[derive(Debug, Clone, Copy)]
pub(super) struct QueueRegs {
    pub(super) size: u16,
    pub(super) size_ok: bool,
    pub(super) ready: bool,
    /// The driver wrote QueueReady 0 while the device ran ([`MmioTransport::stop_queue`]).
    pub(super) stopped: bool,
    pub(super) desc: u64,
    pub(super) driver: u64,
    pub(super) device: u64,
}

impl QueueRegs {
    pub(super) fn new(max: u16) -> QueueRegs {
        QueueRegs {
            size: max,
            size_ok: true,
            ready: false,
            stopped: false,
            desc: 0,
            driver: 0,
            device: 0,
        }
    }
}

/// Replaces the low or high 32 bits of `reg`.
fn set_half(reg: &mut u64, high: bool, v: u32) {
    *reg = if high {
        (*reg & 0xffff_ffff) | (u64::from(v) << 32)
    } else {
        (*reg & !0xffff_ffff) | u64::from(v)
    };
}

/// A device's virtio-mmio register window.
pub struct MmioTransport<M: DeviceMemory> {
    pub(super) device: Arc<Mutex<dyn VirtioDevice<M>>>,
    pub(super) mem: M,
    pub(super) interrupt: Arc<IrqTrigger>,
    pub(super) queue_evts: Vec<EventFd>,
    pub(super) max_sizes: Vec<u16>,
    pub(super) queues: Vec<QueueRegs>,
    pub(super) device_features: u64,
    pub(super) status: u32,
    pub(super) device_features_sel: u32,
    pub(super) driver_features_sel: u32,
    pub(super) driver_features: u64,
    /// The driver set a bit in a feature page past the second (never offered).
    pub(super) driver_features_beyond: bool,
    pub(super) queue_sel: u32,
    /// The status before the last reset: what Status reads until the device
    /// says the reset completed ([`VirtioDevice::reset_in_progress`]).
    pub(super) status_before_reset: u32,
    /// Set by a reset that left work in flight: what the bus waits for,
    /// off the lock, before the Status write returns to the guest.
    pub(super) reset_wait: Option<Arc<ResetFence>>,
}

impl<M: DeviceMemory> std::fmt::Debug for MmioTransport<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MmioTransport")
            .field("status", &self.status)
            .field("driver_features", &self.driver_features)
            .field("queues", &self.queues)
            .finish_non_exhaustive()
    }
}

pub(super) fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl<M: DeviceMemory> MmioTransport<M> {
    /// A transport for `device` over guest memory `mem`, interrupting through
    /// `irq_evt` (the VMM registers it as the device's irqfd). One
    /// non-blocking eventfd per queue is made here ([`Self::queue_evts`]).
    pub fn new(
        device: Arc<Mutex<dyn VirtioDevice<M>>>,
        mem: M,
        irq_evt: EventFd,
    ) -> Result<MmioTransport<M>, MmioError> {
        let (max_sizes, device_features) = {
            let d = lock(&device);
            (d.queue_max_sizes().to_vec(), d.avail_features())
        };
        for (index, &size) in max_sizes.iter().enumerate() {
            if size == 0 || size > MAX_QUEUE_SIZE || !size.is_power_of_two() {
                return Err(MmioError::BadMaxQueueSize { index, size });
            }
        }
        let queue_evts = max_sizes
            .iter()
            .map(|_| EventFd::new(EFD_NONBLOCK))
            .collect::<Result<Vec<_>, _>>()
            .map_err(MmioError::QueueEvent)?;
        Ok(MmioTransport {
            device,
            mem,
            interrupt: Arc::new(IrqTrigger::new(irq_evt)),
            queue_evts,
            queues: max_sizes.iter().map(|&m| QueueRegs::new(m)).collect(),
            max_sizes,
            device_features,
            status: 0,
            device_features_sel: 0,
            driver_features_sel: 0,
            driver_features: 0,
            driver_features_beyond: false,
            queue_sel: 0,
            status_before_reset: 0,
            reset_wait: None,
        })
    }

    /// One eventfd per queue, written on `QueueNotify`: the device thread
    /// polls them (clone them with `try_clone`), and the VMM may register
    /// them with KVM as ioeventfds on [`regs::QUEUE_NOTIFY`] with the
    /// queue's index as datamatch.
    pub fn queue_evts(&self) -> &[EventFd] {
        &self.queue_evts
    }

    /// The interrupt (its eventfd is the irqfd; its bits are
    /// `InterruptStatus`).
    pub fn interrupt(&self) -> &Arc<IrqTrigger> {
        &self.interrupt
    }

    /// The device behind the window.
    pub fn device(&self) -> &Arc<Mutex<dyn VirtioDevice<M>>> {
        &self.device
    }

    /// The device status register.
    pub fn status(&self) -> u32 {
        self.status
    }

    /// Reads `data.len()` bytes at `offset` in the window. A refused access
    /// reads zeros and returns why.
    pub fn read(&self, offset: u64, data: &mut [u8]) -> Result<(), MmioError> {
        data.fill(0);
        if offset >= CONFIG_SPACE_OFFSET {
            if offset.saturating_add(data.len() as u64) > MMIO_WINDOW_BYTES || data.len() > 8 {
                return Err(MmioError::BadAccess {
                    offset,
                    len: data.len(),
                });
            }
            lock(&self.device).read_config(offset - CONFIG_SPACE_OFFSET, data);
            return Ok(());
        }
        if data.len() != 4 || offset % 4 != 0 {
            return Err(MmioError::BadAccess {
                offset,
                len: data.len(),
            });
        }
        let q = self.selected();
        let v = match offset {
            regs::MAGIC_VALUE => MMIO_MAGIC,
            regs::VERSION => MMIO_VERSION,
            regs::DEVICE_ID => lock(&self.device).device_type(),
            regs::VENDOR_ID => MMIO_VENDOR_ID,
            regs::DEVICE_FEATURES => match self.device_features_sel {
                0 => self.device_features as u32,
                1 => (self.device_features >> 32) as u32,
                _ => 0,
            },
            regs::QUEUE_NUM_MAX => q.map_or(0, |i| u32::from(self.max_sizes[i])),
            // A stopped queue reads 0 once the device no longer uses it.
            regs::QUEUE_READY => q.map_or(0, |i| {
                let q = &self.queues[i];
                u32::from(q.ready || (q.stopped && lock(&self.device).reset_in_progress()))
            }),
            regs::INTERRUPT_STATUS => self.interrupt.status(),
            regs::STATUS if self.status == 0 && lock(&self.device).reset_in_progress() => {
                self.status_before_reset | status::ACKNOWLEDGE
            }
            regs::STATUS => self.status,
            regs::SHM_LEN_LOW | regs::SHM_LEN_HIGH | regs::SHM_BASE_LOW | regs::SHM_BASE_HIGH => {
                u32::MAX
            }
            regs::CONFIG_GENERATION => lock(&self.device).config_generation(),
            _ => 0, // write-only and reserved registers read 0
        };
        data.copy_from_slice(&v.to_le_bytes());
        Ok(())
    }

    /// Writes `data` at `offset` in the window. A refused write changes
    /// nothing (or, at `DRIVER_OK`, sets `DEVICE_NEEDS_RESET`) and returns
    /// why.
    pub fn write(&mut self, offset: u64, data: &[u8]) -> Result<(), MmioError> {
        if offset >= CONFIG_SPACE_OFFSET {
            if offset.saturating_add(data.len() as u64) > MMIO_WINDOW_BYTES || data.len() > 8 {
                return Err(MmioError::BadAccess {
                    offset,
                    len: data.len(),
                });
            }
            lock(&self.device).write_config(offset - CONFIG_SPACE_OFFSET, data);
            return Ok(());
        }
        let v = match <[u8; 4]>::try_from(data) {
            Ok(b) if offset % 4 == 0 => u32::from_le_bytes(b),
            _ => {
                return Err(MmioError::BadAccess {
                    offset,
                    len: data.len(),
                })
            }
        };
        match offset {
            regs::DEVICE_FEATURES_SEL => self.device_features_sel = v,
            regs::DRIVER_FEATURES_SEL => self.driver_features_sel = v,
            regs::DRIVER_FEATURES => self.write_driver_features(v)?,
            regs::QUEUE_SEL => self.queue_sel = v,
            regs::QUEUE_NOTIFY => {
                let evt = self
                    .queue_evts
                    .get(v as usize)
                    .ok_or(MmioError::NoSuchQueue(v))?;
                evt.write(1).map_err(MmioError::QueueEvent)?;
            }
            regs::INTERRUPT_ACK => self.interrupt.ack(v),
            regs::STATUS => self.write_status(v)?,
            regs::SHM_SEL => {}
            regs::QUEUE_NUM
            | regs::QUEUE_READY
            | regs::QUEUE_DESC_LOW
            | regs::QUEUE_DESC_HIGH
            | regs::QUEUE_DRIVER_LOW
            | regs::QUEUE_DRIVER_HIGH
            | regs::QUEUE_DEVICE_LOW
            | regs::QUEUE_DEVICE_HIGH => self.write_queue_reg(offset, v)?,
            _ => return Err(MmioError::ReadOnly(offset)),
        }
        Ok(())
    }

    /// The selected queue, if the device has it.
    fn selected(&self) -> Option<usize> {
        let i = self.queue_sel as usize;
        (i < self.queues.len()).then_some(i)
    }

    fn write_driver_features(&mut self, v: u32) -> Result<(), MmioError> {
        if self.status & status::DRIVER == 0 || self.status & status::FEATURES_OK != 0 {
            return Err(MmioError::FeaturesNotNegotiating(self.status));
        }
        match self.driver_features_sel {
            0 => set_half(&mut self.driver_features, false, v),
            1 => set_half(&mut self.driver_features, true, v),
            _ => self.driver_features_beyond |= v != 0,
        }
        Ok(())
    }

    fn write_queue_reg(&mut self, offset: u64, v: u32) -> Result<(), MmioError> {
        if offset == regs::QUEUE_READY && v == 0 && self.status & status::DRIVER_OK != 0 {
            return self.stop_queue();
        }
        let setting_up = status::FEATURES_OK;
        let stop = status::DRIVER_OK | status::FAILED | status::DEVICE_NEEDS_RESET;
        if self.status & setting_up == 0 || self.status & stop != 0 {
            return Err(MmioError::QueueSetupNotAllowed {
                offset,
                status: self.status,
            });
        }
        let i = self
            .selected()
            .ok_or(MmioError::NoSuchQueue(self.queue_sel))?;
        let max = self.max_sizes[i];
        let q = &mut self.queues[i];
        match offset {
            regs::QUEUE_NUM => {
                let ok = v != 0 && v <= u32::from(max) && v.is_power_of_two();
                q.size_ok = ok;
                if !ok {
                    return Err(MmioError::BadQueueSize {
                        index: self.queue_sel,
                        size: v,
                        max,
                    });
                }
                q.size = v as u16;
            }
            regs::QUEUE_READY => q.ready = v == 1,
            regs::QUEUE_DESC_LOW => set_half(&mut q.desc, false, v),
            regs::QUEUE_DESC_HIGH => set_half(&mut q.desc, true, v),
            regs::QUEUE_DRIVER_LOW => set_half(&mut q.driver, false, v),
            regs::QUEUE_DRIVER_HIGH => set_half(&mut q.driver, true, v),
            regs::QUEUE_DEVICE_LOW => set_half(&mut q.device, false, v),
            regs::QUEUE_DEVICE_HIGH => set_half(&mut q.device, true, v),
            _ => return Err(MmioError::ReadOnly(offset)),
        }
        Ok(())
    }

    /// The fence a reset just left behind, if any: the caller waits on it
    /// with no lock held ([`crate::devices::bus::mmio::MmioBus::write`]).
    pub fn take_reset_wait(&mut self) -> Option<Arc<ResetFence>> {
        self.reset_wait.take()
    }

    fn write_status(&mut self, v: u32) -> Result<(), MmioError> {
        if v == 0 {
            self.reset();
            let mut d = lock(&self.device);
            self.reset_wait = if d.reset_in_progress() {
                d.reset_fence()
            } else {
                None
            };
            return Ok(());
        }
        if self.status == 0 && lock(&self.device).reset_in_progress() {
            return Err(MmioError::ResetInProgress(v));
        }
        let keep = self.status & !status::DEVICE_NEEDS_RESET;
        let refuse = MmioError::StatusTransition {
            from: self.status,
            to: v,
        };
        // The driver only ever adds bits; NEEDS_RESET is the device's.
        let v = v & !status::DEVICE_NEEDS_RESET;
        if v & keep != keep {
            return Err(refuse);
        }
        let new = v & !keep;
        if new & status::FAILED != 0 {
            self.status |= status::FAILED;
        }
        if new & status::ACKNOWLEDGE != 0 {
            self.status |= status::ACKNOWLEDGE;
        }
        if new & status::DRIVER != 0 {
            if self.status & status::ACKNOWLEDGE == 0 {
                return Err(refuse);
            }
            self.status |= status::DRIVER;
        }
        if new & status::FEATURES_OK != 0 {
            if self.status & status::DRIVER == 0 {
                return Err(refuse);
            }
            let (driver, device) = (self.driver_features, self.device_features);
            if self.driver_features_beyond
                || driver & !device != 0
                || driver & VIRTIO_F_VERSION_1 == 0
            {
                return Err(MmioError::FeaturesRefused { driver, device });
            }
            self.status |= status::FEATURES_OK;
        }
        if new & status::DRIVER_OK != 0 {
            if self.status & status::FEATURES_OK == 0
                || self.status & (status::FAILED | status::DEVICE_NEEDS_RESET) != 0
            {
                return Err(refuse);
            }
            if let Err(e) = self.activate() {
                self.status |= status::DEVICE_NEEDS_RESET;
                self.interrupt
                    .trigger(VirtioInterruptType::Config)
                    .map_err(MmioError::Interrupt)?;
                return Err(e);
            }
            self.status |= status::DRIVER_OK;
        }
        Ok(())
    }

    /// QueueReady 0 while the device runs: the driver stops using the
    /// queue, and reads the register back until it is 0 (virtio 1.2,
    /// 4.2.2.2; the register "returns the last value written to it"). A
    /// device here runs all its queues or none, so it stops as a reset
    /// stops it (no ring is used after this returns; the balloon's
    /// discards in flight are waited for by the read) and sets
    /// DEVICE_NEEDS_RESET, with a configuration interrupt: it runs again
    /// only after a reset. Drivers that give a device up this way
    /// (`virtio-drivers`' `Drop`) spun forever here before, as they do on
    /// Firecracker, which ignores the write.
    fn stop_queue(&mut self) -> Result<(), MmioError> {
        let i = self
            .selected()
            .ok_or(MmioError::NoSuchQueue(self.queue_sel))?;
        let q = &mut self.queues[i];
        if !q.ready {
            return Ok(());
        }
        q.ready = false;
        q.stopped = true;
        if self.status & status::DEVICE_NEEDS_RESET == 0 {
            lock(&self.device).reset();
            self.status |= status::DEVICE_NEEDS_RESET;
            self.interrupt
                .trigger(VirtioInterruptType::Config)
                .map_err(MmioError::Interrupt)?;
        }
        Ok(())
    }

    /// Builds the queues from their registers, checks them against guest
    /// memory and starts the device.
    fn activate(&mut self) -> Result<(), MmioError> {
        let queues = self.queues_from_regs()?;
        self.activate_with(queues)
    }

    /// Status 0: forgets everything the driver set and resets the device.
    fn reset(&mut self) {
        if self.status != 0 {
            self.status_before_reset = self.status;
        }
        self.status = 0;
        self.device_features_sel = 0;
        self.driver_features_sel = 0;
        self.driver_features = 0;
        self.driver_features_beyond = false;
        self.queue_sel = 0;
        for (q, &max) in self.queues.iter_mut().zip(&self.max_sizes) {
            *q = QueueRegs::new(max);
        }
        self.interrupt.clear();
        lock(&self.device).reset();
    }
}
