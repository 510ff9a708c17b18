//! A vCPU's registers before its first entry: CPUID, FPU, special and
//! general registers for the built-in firmware; a Linux kernel's are set
//! by [`crate::vstate::linux::cpu`].

use kvm_bindings::kvm_fpu;
use kvm_ioctls::VcpuFd;

use super::VcpuError;
use crate::vstate::boot::{initial_regs, setup_sregs, BootLayout};
use crate::vstate::linux::LinuxEntry;
use crate::vstate::snapshot::VcpuState;
use crate::vstate::template::CpuSetup;

/// What a vCPU starts: the built-in firmware at CPL3, or a Linux kernel at
/// its 64-bit or PVH entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GuestEntry {
    /// The firmware, with its boot layout.
    Firmware(BootLayout),
    /// A Linux kernel.
    Linux(LinuxEntry),
}

/// Sets CPUID, FPU, special and general registers of vCPU `index`.
pub fn configure_vcpu(
    fd: &VcpuFd,
    index: u8,
    cpu: &CpuSetup,
    entry: &GuestEntry,
) -> Result<(), VcpuError> {
    let layout = match entry {
        GuestEntry::Firmware(layout) => layout,
        GuestEntry::Linux(linux) => {
            return Ok(crate::vstate::linux::cpu::configure(fd, index, cpu, linux)?)
        }
    };
    let cpuid = &cpu.cpuid;
    let setup = |what: &'static str, r: Result<(), kvm_ioctls::Error>| {
        r.map_err(|source| VcpuError::Setup {
            index,
            what,
            source,
        })
    };
    setup("KVM_SET_CPUID2", fd.set_cpuid2(cpuid))?;
    let fpu = kvm_fpu {
        fcw: 0x37f,
        mxcsr: 0x1f80,
        ..Default::default()
    };
    setup("KVM_SET_FPU", fd.set_fpu(&fpu))?;
    let mut sregs = fd.get_sregs().map_err(|source| VcpuError::Setup {
        index,
        what: "KVM_GET_SREGS",
        source,
    })?;
    setup_sregs(&mut sregs, layout);
    setup("KVM_SET_SREGS", fd.set_sregs(&sregs))?;
    setup(
        "KVM_SET_REGS",
        fd.set_regs(&initial_regs(usize::from(index), layout)),
    )
}

/// Writes a snapshot's `state` into vCPU `index` (`fd`), instead of
/// [`configure_vcpu`], before its thread starts: the vCPU goes on where it
/// was saved ([`crate::vstate::snapshot::VcpuState::restore`]).
pub fn restore_vcpu(fd: &VcpuFd, index: u8, state: &VcpuState) -> Result<(), VcpuError> {
    Ok(state.restore(fd, index)?)
}
