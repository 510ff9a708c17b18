//! The KVM state of a paused microVM, for snapshots: each vCPU's registers,
//! MSRs, FPU/XSAVE, LAPIC and pending events ([`VcpuState`]), and the VM's
//! in-kernel PIC, IOAPIC, PIT and clock ([`VmState`]). What is saved and
//! the order it is restored in follow Firecracker (its
//! `arch/x86_64/{vcpu,vm,msr}.rs`). A vCPU's state is read on its own
//! thread while paused ([`super::vcpu::Vcpus::save_states`]) and written
//! into a fresh vCPU before its thread starts
//! ([`super::vcpu::restore_vcpu`]).
//!
//! This file is the vCPU's state; beside it: `msr` (which MSRs, read and
//! written in chunks) and `vm` (the VM's state).

use kvm_bindings::{
    kvm_cpuid_entry2, kvm_debugregs, kvm_fpu, kvm_lapic_state, kvm_mp_state, kvm_msr_entry,
    kvm_regs, kvm_sregs, kvm_vcpu_events, kvm_xcrs, kvm_xsave, CpuId, KVM_MAX_CPUID_ENTRIES,
    KVM_MAX_MSR_ENTRIES,
};
use kvm_ioctls::VcpuFd;
use serde::{Deserialize, Serialize};

pub use msr::{msr_should_serialize, msrs_to_save};
pub use vm::{IrqchipState, VmState};

use msr::{fix_zero_tsc_deadline, read_msrs, write_msrs, MSR_IA32_TSC_DEADLINE};

mod msr;
mod vm;

/// Errors of saving and restoring KVM state.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// A vCPU ioctl failed.
    #[error("vCPU {index}: {what} failed: {source}")]
    Vcpu {
        /// vCPU index.
        index: u8,
        /// Which ioctl.
        what: &'static str,
        /// KVM's error.
        source: kvm_ioctls::Error,
    },
    /// `KVM_SET_MSRS` set fewer MSRs than it was given.
    #[error("vCPU {index}: KVM_SET_MSRS set {set} of {given} MSRs (refused: {refused:#x})")]
    MsrsIncomplete {
        /// vCPU index.
        index: u8,
        /// How many it set.
        set: usize,
        /// How many it was given.
        given: usize,
        /// The first MSR it refused.
        refused: u32,
    },
    /// A `kvm_msrs` or `kvm_cpuid2` could not be built.
    #[error("vCPU {index}: {what}: {source}")]
    Fam {
        /// vCPU index.
        index: u8,
        /// What was built.
        what: &'static str,
        /// The wrapper's error.
        source: vmm_sys_util::fam::Error,
    },
    /// A VM ioctl failed.
    #[error("{what} failed: {source}")]
    Vm {
        /// Which ioctl.
        what: &'static str,
        /// KVM's error.
        source: kvm_ioctls::Error,
    },
    /// The state has an irqchip and the VM has none (or the other way round).
    #[error("the VM state {} an in-kernel irqchip and the VM {}", if *.state { "has" } else { "lacks" }, if *.state { "lacks one" } else { "has one" })]
    IrqchipMismatch {
        /// Whether the state has one.
        state: bool,
    },
    /// `KVM_GET_MSR_INDEX_LIST` failed.
    #[error("KVM_GET_MSR_INDEX_LIST failed: {0}")]
    MsrIndexList(kvm_ioctls::Error),
    /// Completing the I/O the vCPU last exited for needed userspace again
    /// (a string I/O instruction part done): its state is not consistent.
    #[error("vCPU {index}: its last I/O exit is not complete; its state cannot be saved now")]
    PendingExit {
        /// vCPU index.
        index: u8,
    },
    /// The vCPUs must be paused for their state to be saved.
    #[error("the vCPUs are not paused: their state is saved only while paused")]
    NotPaused,
    /// Another save of the vCPUs' state is in progress.
    #[error("another save of the vCPUs' state is in progress")]
    SaveInProgress,
    /// A vCPU thread has ended (crashed, or stopped) and cannot answer.
    #[error("vCPU {index} has ended: its state cannot be saved")]
    Ended {
        /// vCPU index.
        index: u8,
    },
    /// The vCPUs are being stopped.
    #[error("the vCPUs were stopped during the save")]
    Stopped,
    /// Some vCPUs did not save their state in time.
    #[error("vCPU(s) {indices:?} did not save their state within {timeout:?}")]
    NoAnswer {
        /// The vCPUs that did not answer.
        indices: Vec<u8>,
        /// How long they were given.
        timeout: std::time::Duration,
    },
}

/// A vCPU's floating point and vector state: the XSAVE area, or where the
/// host has no XSAVE, the legacy FPU and SSE registers.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub enum FpuState {
    /// `KVM_GET_XSAVE`, and `KVM_GET_XCRS` where the host has them.
    Xsave {
        /// The XSAVE area (4 KiB).
        xsave: XsaveArea,
        /// XCR0 and the other extended control registers.
        xcrs: Option<kvm_xcrs>,
    },
    /// `KVM_GET_FPU`.
    Legacy(FpuRegs),
}

/// A `kvm_xsave` (which is neither `Clone` nor `PartialEq` in
/// kvm-bindings), boxed: 4 KiB.
#[derive(Serialize, Deserialize, Debug)]
#[serde(transparent)]
pub struct XsaveArea(pub Box<kvm_xsave>);

impl Clone for XsaveArea {
    fn clone(&self) -> Self {
        XsaveArea(Box::new(kvm_xsave {
            region: self.0.region,
            ..Default::default()
        }))
    }
}

impl PartialEq for XsaveArea {
    fn eq(&self, other: &Self) -> bool {
        self.0.region == other.0.region
    }
}

/// The fields of a `kvm_fpu` (which has no serde in kvm-bindings).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct FpuRegs {
    /// x87 registers.
    pub fpr: [[u8; 16]; 8],
    /// Control word.
    pub fcw: u16,
    /// Status word.
    pub fsw: u16,
    /// Abridged tag word.
    pub ftwx: u8,
    /// Last opcode.
    pub last_opcode: u16,
    /// Last instruction pointer.
    pub last_ip: u64,
    /// Last data pointer.
    pub last_dp: u64,
    /// XMM registers.
    pub xmm: [[u8; 16]; 16],
    /// MXCSR.
    pub mxcsr: u32,
}

impl From<&kvm_fpu> for FpuRegs {
    fn from(f: &kvm_fpu) -> Self {
        FpuRegs {
            fpr: f.fpr,
            fcw: f.fcw,
            fsw: f.fsw,
            ftwx: f.ftwx,
            last_opcode: f.last_opcode,
            last_ip: f.last_ip,
            last_dp: f.last_dp,
            xmm: f.xmm,
            mxcsr: f.mxcsr,
        }
    }
}

impl From<&FpuRegs> for kvm_fpu {
    fn from(f: &FpuRegs) -> Self {
        kvm_fpu {
            fpr: f.fpr,
            fcw: f.fcw,
            fsw: f.fsw,
            ftwx: f.ftwx,
            last_opcode: f.last_opcode,
            last_ip: f.last_ip,
            last_dp: f.last_dp,
            xmm: f.xmm,
            mxcsr: f.mxcsr,
            ..Default::default()
        }
    }
}

/// The KVM state of one vCPU.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct VcpuState {
    /// `KVM_GET_CPUID2`, without the zeroed entries past the real ones.
    pub cpuid: Vec<kvm_cpuid_entry2>,
    /// The MSRs that could be read, of those asked for.
    pub msrs: Vec<kvm_msr_entry>,
    /// General registers.
    pub regs: kvm_regs,
    /// Special registers.
    pub sregs: kvm_sregs,
    /// FPU, SSE, AVX... state.
    pub fpu: FpuState,
    /// Debug registers.
    pub debug_regs: kvm_debugregs,
    /// The local APIC, where the VM has the in-kernel irqchip (the
    /// built-in firmware runs without one).
    pub lapic: Option<kvm_lapic_state>,
    /// Runnable, halted, waiting for SIPI...
    pub mp_state: kvm_mp_state,
    /// Pending exceptions, interrupts, NMIs and SMIs.
    pub vcpu_events: kvm_vcpu_events,
    /// The vCPU's TSC frequency, where KVM tells it.
    pub tsc_khz: Option<u32>,
}

/// TSC frequencies within 250 parts per million are the same (they differ
/// that much by calibration alone), as Firecracker takes them.
fn tsc_scaling_required(current: u32, saved: u32) -> bool {
    (i64::from(current) - i64::from(saved)).abs() > i64::from(saved) * 250 / 1_000_000
}

/// Completes the I/O or MMIO operation vCPU `index` (`fd`) last left
/// `KVM_RUN` for, without entering the guest: KVM's state of an exit (an
/// `IN`'s value bound for RAX, an MMIO read's register) is consistent only
/// once userspace has re-entered `KVM_RUN`, here with `immediate_exit` set
/// so that KVM returns at once. Before [`VcpuState::save`] on a vCPU that
/// has run.
pub fn complete_pending_io(fd: &mut VcpuFd, index: u8) -> Result<(), StateError> {
    fd.set_kvm_immediate_exit(1);
    let run = fd.run().map(|_| ());
    fd.set_kvm_immediate_exit(0);
    match run {
        Err(e) if e.errno() == libc::EINTR => Ok(()),
        Ok(()) => Err(StateError::PendingExit { index }),
        Err(source) => Err(StateError::Vcpu {
            index,
            what: "KVM_RUN (immediate exit, completing the last I/O)",
            source,
        }),
    }
}

impl VcpuState {
    /// Reads the state of vCPU `index` through `fd` (on its own thread, out
    /// of `KVM_RUN`), with the MSRs of `msr_indices` ([`msrs_to_save`]) that
    /// it can read: those `KVM_GET_MSRS` refuses here are left out (logged
    /// once, at debug level).
    ///
    /// The order is Firecracker's: `KVM_GET_MP_STATE` first (it may change
    /// the LAPIC), `KVM_GET_VCPU_EVENTS` last.
    pub fn save(fd: &VcpuFd, index: u8, msr_indices: &[u32]) -> Result<VcpuState, StateError> {
        let vcpu = |what: &'static str| {
            move |source| StateError::Vcpu {
                index,
                what,
                source,
            }
        };
        let mp_state = fd.get_mp_state().map_err(vcpu("KVM_GET_MP_STATE"))?;
        let regs = fd.get_regs().map_err(vcpu("KVM_GET_REGS"))?;
        let sregs = fd.get_sregs().map_err(vcpu("KVM_GET_SREGS"))?;
        let fpu = match fd.get_xsave() {
            Ok(xsave) => FpuState::Xsave {
                xsave: XsaveArea(Box::new(xsave)),
                xcrs: match fd.get_xcrs() {
                    Ok(xcrs) => Some(xcrs),
                    // A host without XSAVE has no XCRs to give.
                    Err(e) if e.errno() == libc::EINVAL => None,
                    Err(e) => return Err(vcpu("KVM_GET_XCRS")(e)),
                },
            },
            Err(e) if e.errno() == libc::EINVAL => {
                FpuState::Legacy(FpuRegs::from(&fd.get_fpu().map_err(vcpu("KVM_GET_FPU"))?))
            }
            Err(e) => return Err(vcpu("KVM_GET_XSAVE")(e)),
        };
        let debug_regs = fd.get_debug_regs().map_err(vcpu("KVM_GET_DEBUGREGS"))?;
        let lapic = match fd.get_lapic() {
            Ok(lapic) => Some(lapic),
            // No in-kernel irqchip, so no LAPIC in KVM.
            Err(e) if e.errno() == libc::EINVAL || e.errno() == libc::ENXIO => None,
            Err(e) => return Err(vcpu("KVM_GET_LAPIC")(e)),
        };
        let tsc_khz = fd
            .get_tsc_khz()
            .map_err(|e| log::debug!("vcpu{index}: KVM_GET_TSC_KHZ: {e} (no TSC frequency saved)"))
            .ok();
        let mut cpuid = fd
            .get_cpuid2(KVM_MAX_CPUID_ENTRIES)
            .map_err(vcpu("KVM_GET_CPUID2"))?
            .as_slice()
            .to_vec();
        // KVM_GET_CPUID2 leaves `nent` as asked: the zeroed entries past the
        // real ones go (Firecracker's test: leaf 0, subleaf 0, no flags, EAX 0).
        cpuid.retain(|e| !(e.function == 0 && e.index == 0 && e.flags == 0 && e.eax == 0));
        let mut msrs = read_msrs(fd, index, msr_indices)?;
        fix_zero_tsc_deadline(&mut msrs);
        let vcpu_events = fd.get_vcpu_events().map_err(vcpu("KVM_GET_VCPU_EVENTS"))?;
        Ok(VcpuState {
            cpuid,
            msrs,
            regs,
            sregs,
            fpu,
            debug_regs,
            lapic,
            mp_state,
            vcpu_events,
            tsc_khz,
        })
    }

    /// Writes this state into vCPU `index` through `fd`, before it first
    /// runs, in Firecracker's order: CPUID, MP state, registers, special
    /// registers, XSAVE (or FPU), XCRs, debug registers, LAPIC, MSRs (the
    /// TSC deadline last), events. The TSC frequency is set first if it
    /// differs from this vCPU's (a failure is logged: the guest then runs
    /// with the host's frequency, as in Firecracker).
    pub fn restore(&self, fd: &VcpuFd, index: u8) -> Result<(), StateError> {
        let vcpu = |what: &'static str| {
            move |source| StateError::Vcpu {
                index,
                what,
                source,
            }
        };
        if let Some(saved) = self.tsc_khz {
            match fd.get_tsc_khz() {
                Ok(current) if !tsc_scaling_required(current, saved) => {}
                Ok(current) => {
                    if let Err(e) = fd.set_tsc_khz(saved) {
                        log::warn!(
                            "vcpu{index}: cannot scale the TSC from {current} kHz to the snapshot's {saved} kHz: {e}"
                        );
                    }
                }
                Err(e) => log::warn!("vcpu{index}: KVM_GET_TSC_KHZ: {e} (TSC not scaled)"),
            }
        }
        let cpuid = CpuId::from_entries(&self.cpuid).map_err(|source| StateError::Fam {
            index,
            what: "the CPUID entries",
            source,
        })?;
        fd.set_cpuid2(&cpuid).map_err(vcpu("KVM_SET_CPUID2"))?;
        fd.set_mp_state(self.mp_state)
            .map_err(vcpu("KVM_SET_MP_STATE"))?;
        fd.set_regs(&self.regs).map_err(vcpu("KVM_SET_REGS"))?;
        fd.set_sregs(&self.sregs).map_err(vcpu("KVM_SET_SREGS"))?;
        match &self.fpu {
            FpuState::Xsave { xsave, xcrs } => {
                // SAFETY: KVM_SET_XSAVE copies the vCPU's XSAVE buffer
                // size (its guest FPU's user ABI size) from `xsave`, a
                // 4096-byte `kvm_xsave` that lives for the call; that size
                // is above 4096 only in a process that asked for
                // dynamically enabled XSTATE features (arch_prctl
                // ARCH_REQ_XCOMP_GUEST_PERM, AMX), which teravm never does.
                unsafe { fd.set_xsave(&xsave.0) }.map_err(vcpu("KVM_SET_XSAVE"))?;
                if let Some(xcrs) = xcrs {
                    fd.set_xcrs(xcrs).map_err(vcpu("KVM_SET_XCRS"))?;
                }
            }
            FpuState::Legacy(regs) => fd
                .set_fpu(&kvm_fpu::from(regs))
                .map_err(vcpu("KVM_SET_FPU"))?,
        }
        fd.set_debug_regs(&self.debug_regs)
            .map_err(vcpu("KVM_SET_DEBUGREGS"))?;
        if let Some(lapic) = &self.lapic {
            fd.set_lapic(lapic).map_err(vcpu("KVM_SET_LAPIC"))?;
        }
        let (deadline, first): (Vec<_>, Vec<_>) = self
            .msrs
            .iter()
            .partition(|m| m.index == MSR_IA32_TSC_DEADLINE);
        for chunk in first.chunks(KVM_MAX_MSR_ENTRIES).chain([&deadline[..]]) {
            write_msrs(fd, index, chunk)?;
        }
        fd.set_vcpu_events(&self.vcpu_events)
            .map_err(vcpu("KVM_SET_VCPU_EVENTS"))?;
        // Tells a kvmclock guest it was paused (no soft lockup warnings);
        // refused where the guest does not use kvmclock.
        if let Err(e) = fd.kvmclock_ctrl() {
            log::debug!("vcpu{index}: KVM_KVMCLOCK_CTRL: {e} (ignored)");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
