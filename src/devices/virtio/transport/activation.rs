//! The one path that starts a device: the queues built from their
//! registers and checked against guest memory
//! ([`MmioTransport::queues_from_regs`]), then handed to the device
//! ([`MmioTransport::activate_with`]), at a driver's `DRIVER_OK` and at a
//! snapshot's restore ([`super::persist`]).

use std::sync::Arc;

use virtio_queue::{Queue, QueueT};
use vm_memory::GuestAddress;

use super::mmio::{lock, MmioError, MmioTransport};
use crate::devices::virtio::device::ActiveState;
use crate::devices::virtio::interrupt::VirtioInterrupt;
use crate::devices::virtio::memory::DeviceMemory;

impl<M: DeviceMemory> MmioTransport<M> {
    /// Builds the queues from their registers and checks them against guest
    /// memory (a queue not ready is left unset).
    pub(super) fn queues_from_regs(&self) -> Result<Vec<Queue>, MmioError> {
        let mut queues = Vec::with_capacity(self.queues.len());
        for (index, (regs, &max)) in self.queues.iter().zip(&self.max_sizes).enumerate() {
            let bad = |why| MmioError::BadQueue { index, why };
            let mut q = Queue::new(max).map_err(|_| bad("bad maximum size"))?;
            if regs.ready {
                if !regs.size_ok {
                    return Err(bad("size refused"));
                }
                q.try_set_size(regs.size).map_err(|_| bad("bad size"))?;
                q.try_set_desc_table_address(GuestAddress(regs.desc))
                    .map_err(|_| bad("descriptor table misaligned"))?;
                q.try_set_avail_ring_address(GuestAddress(regs.driver))
                    .map_err(|_| bad("available ring misaligned"))?;
                q.try_set_used_ring_address(GuestAddress(regs.device))
                    .map_err(|_| bad("used ring misaligned"))?;
                q.set_ready(true);
                if !q.is_valid(&*self.mem) {
                    return Err(bad("rings outside guest RAM"));
                }
            }
            queues.push(q);
        }
        Ok(queues)
    }

    /// Starts the device with `queues` (from [`Self::queues_from_regs`]):
    /// the one path of a driver's `DRIVER_OK` and of a restore.
    pub(super) fn activate_with(&self, queues: Vec<Queue>) -> Result<(), MmioError> {
        let interrupt: Arc<dyn VirtioInterrupt> = self.interrupt.clone();
        lock(&self.device)
            .activate(ActiveState::new(
                self.mem.clone(),
                self.driver_features,
                queues,
                interrupt,
            ))
            .map_err(MmioError::Activate)
    }
}
