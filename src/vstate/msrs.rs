//! The MSRs a vCPU gets at boot, beside the CPU setup
//! ([`super::linux::cpu`]) that writes them and the CPU templates
//! ([`super::template`]) that may change them: one list for both.

use kvm_bindings::kvm_msr_entry;

pub(crate) const MSR_IA32_TSC: u32 = 0x10;
pub(crate) const MSR_IA32_SYSENTER_CS: u32 = 0x174;
pub(crate) const MSR_IA32_SYSENTER_ESP: u32 = 0x175;
pub(crate) const MSR_IA32_SYSENTER_EIP: u32 = 0x176;
pub(crate) const MSR_IA32_MISC_ENABLE: u32 = 0x1a0;
pub(crate) const MSR_MTRR_DEF_TYPE: u32 = 0x2ff;
pub(crate) const MSR_STAR: u32 = 0xc000_0081;
pub(crate) const MSR_LSTAR: u32 = 0xc000_0082;
pub(crate) const MSR_CSTAR: u32 = 0xc000_0083;
pub(crate) const MSR_SYSCALL_MASK: u32 = 0xc000_0084;
pub(crate) const MSR_KERNEL_GS_BASE: u32 = 0xc000_0102;
pub(crate) const MISC_ENABLE_FAST_STRING: u64 = 1;
/// MTRRs enabled, default type write-back.
pub(crate) const MTRR_DEF_ENABLE_WB: u64 = (1 << 11) | 6;

/// The MSRs Firecracker sets at boot: SYSENTER/SYSCALL state cleared, the
/// TSC at 0, fast strings on, MTRRs on with write-back default.
pub fn boot_msrs() -> Vec<kvm_msr_entry> {
    [
        (MSR_IA32_SYSENTER_CS, 0),
        (MSR_IA32_SYSENTER_ESP, 0),
        (MSR_IA32_SYSENTER_EIP, 0),
        (MSR_STAR, 0),
        (MSR_CSTAR, 0),
        (MSR_KERNEL_GS_BASE, 0),
        (MSR_SYSCALL_MASK, 0),
        (MSR_LSTAR, 0),
        (MSR_IA32_TSC, 0),
        (MSR_IA32_MISC_ENABLE, MISC_ENABLE_FAST_STRING),
        (MSR_MTRR_DEF_TYPE, MTRR_DEF_ENABLE_WB),
    ]
    .into_iter()
    .map(|(index, data)| kvm_msr_entry {
        index,
        data,
        ..Default::default()
    })
    .collect()
}
