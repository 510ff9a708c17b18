//! The VM's part of a snapshot's KVM state: the in-kernel PICs, IOAPIC
//! and PIT, and the clock.

use kvm_bindings::{
    kvm_clock_data, kvm_irqchip, kvm_pit_state2, KVM_IRQCHIP_IOAPIC, KVM_IRQCHIP_PIC_MASTER,
    KVM_IRQCHIP_PIC_SLAVE,
};
use serde::{Deserialize, Serialize};

use super::StateError;
use crate::vstate::vm::Vm;

/// The in-kernel interrupt controllers of a VM with an irqchip.
#[derive(Serialize, Deserialize, Clone, Copy)]
pub struct IrqchipState {
    /// The master PIC (IRQs 0-7).
    pub pic_master: kvm_irqchip,
    /// The slave PIC (IRQs 8-15).
    pub pic_slave: kvm_irqchip,
    /// The IOAPIC.
    pub ioapic: kvm_irqchip,
}

impl std::fmt::Debug for IrqchipState {
    /// `kvm_irqchip` (a union) has no `Debug`: the chip ids only.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IrqchipState")
            .field("pic_master", &self.pic_master.chip_id)
            .field("pic_slave", &self.pic_slave.chip_id)
            .field("ioapic", &self.ioapic.chip_id)
            .finish()
    }
}

/// The KVM state of the VM (as Firecracker's `VmState`, less what is not
/// KVM's).
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct VmState {
    /// PICs and IOAPIC, where the VM has the in-kernel irqchip.
    pub irqchip: Option<IrqchipState>,
    /// The PIT, with the irqchip.
    pub pit: Option<kvm_pit_state2>,
    /// The kvmclock.
    pub clock: kvm_clock_data,
}

impl Vm {
    /// Reads the VM's irqchip, PIT (where it has them) and clock. The vCPUs
    /// must be paused.
    pub fn save_state(&self) -> Result<VmState, StateError> {
        let vm = |what: &'static str| move |source| StateError::Vm { what, source };
        let fd = self.vm_fd();
        let (irqchip, pit) = if self.has_irqchip() {
            let chip = |chip_id: u32| {
                let mut chip = kvm_irqchip {
                    chip_id,
                    ..Default::default()
                };
                fd.get_irqchip(&mut chip)
                    .map(|()| chip)
                    .map_err(vm("KVM_GET_IRQCHIP"))
            };
            let irqchip = IrqchipState {
                pic_master: chip(KVM_IRQCHIP_PIC_MASTER)?,
                pic_slave: chip(KVM_IRQCHIP_PIC_SLAVE)?,
                ioapic: chip(KVM_IRQCHIP_IOAPIC)?,
            };
            let pit = fd.get_pit2().map_err(vm("KVM_GET_PIT2"))?;
            (Some(irqchip), Some(pit))
        } else {
            (None, None)
        };
        let clock = fd.get_clock().map_err(vm("KVM_GET_CLOCK"))?;
        Ok(VmState {
            irqchip,
            pit,
            clock,
        })
    }

    /// Writes `state` into this VM, in Firecracker's order (PIT, clock,
    /// PICs, IOAPIC): after [`Vm::setup_irqchip`] where the state has an
    /// irqchip, and as Firecracker does, after the vCPUs' states were
    /// restored ([`crate::vstate::vcpu::restore_vcpu`]), before they run. The clock goes in with its flags
    /// cleared, as Firecracker's does (no `KVM_CLOCK_REALTIME`: the guest's
    /// clock goes on from where it was saved).
    pub fn restore_state(&mut self, state: &VmState) -> Result<(), StateError> {
        let vm = |what: &'static str| move |source| StateError::Vm { what, source };
        if state.irqchip.is_some() != self.has_irqchip() {
            return Err(StateError::IrqchipMismatch {
                state: state.irqchip.is_some(),
            });
        }
        let fd = self.vm_fd();
        if let Some(pit) = &state.pit {
            fd.set_pit2(pit).map_err(vm("KVM_SET_PIT2"))?;
        }
        let clock = kvm_clock_data {
            flags: 0,
            ..state.clock
        };
        fd.set_clock(&clock).map_err(vm("KVM_SET_CLOCK"))?;
        if let Some(chips) = &state.irqchip {
            for chip in [&chips.pic_master, &chips.pic_slave, &chips.ioapic] {
                fd.set_irqchip(chip).map_err(vm("KVM_SET_IRQCHIP"))?;
            }
        }
        Ok(())
    }
}

impl crate::vstate::vm::KvmDevice {
    /// The MSRs a snapshot saves on this host
    /// ([`super::msrs_to_save`]): asked once, handed to
    /// the vCPUs with each save.
    pub fn msr_index_list(&self) -> Result<Vec<u32>, StateError> {
        let kvm = self.kvm().map_err(|e| {
            StateError::MsrIndexList(match e {
                crate::vstate::vm::VmError::OpenKvm(e) => e,
                _ => kvm_ioctls::Error::new(libc::EBADF),
            })
        })?;
        super::msrs_to_save(&kvm)
    }
}

impl Vm {
    /// The MSRs a snapshot saves on this host (as
    /// [`crate::vstate::vm::KvmDevice::msr_index_list`], for a VM made by [`Vm::new`]).
    pub fn msr_index_list(&self) -> Result<Vec<u32>, StateError> {
        super::msrs_to_save(self.kvm_handle())
    }
}
