//! The MSRs of a vCPU's snapshot state: which ones (Firecracker's list),
//! read past those this host refuses, and written back all or an error.

use std::sync::Once;

use kvm_bindings::{kvm_msr_entry, Msrs, KVM_MAX_MSR_ENTRIES};
use kvm_ioctls::{Kvm, VcpuFd};

use super::StateError;

/// `MSR_IA32_TSC`.
const MSR_IA32_TSC: u32 = 0x10;
/// `MSR_IA32_TSC_DEADLINE`: restored after the TSC (and the LAPIC), as
/// Firecracker does, or KVM may miss a timer that was due.
pub(super) const MSR_IA32_TSC_DEADLINE: u32 = 0x6e0;
/// `MSR_IA32_MCG_CTL`: in a serialized range, but not exported by Linux.
const MSR_IA32_MCG_CTL: u32 = 0x17b;

/// The MSR ranges Firecracker saves (`SERIALIZABLE_MSR_RANGES`), as
/// (first, count); the others KVM lists are host or PMU state.
const SERIALIZABLE_MSR_RANGES: &[(u32, u32)] = &[
    (0x0, 2),             // P5_MC_ADDR, P5_MC_TYPE
    (0x10, 1),            // TSC
    (0x17, 1),            // PLATFORM_ID
    (0x1b, 1),            // APICBASE
    (0x2a, 1),            // EBL_CR_POWERON
    (0x2c, 1),            // EBC_FREQUENCY_ID
    (0x34, 1),            // SMI_COUNT
    (0x3a, 2),            // FEAT_CTL, TSC_ADJUST
    (0x48, 2),            // SPEC_CTRL, PRED_CMD
    (0x79, 1),            // UCODE_WRITE
    (0x8b, 1),            // UCODE_REV
    (0x9e, 1),            // SMBASE
    (0xcd, 2),            // FSB_FREQ, PLATFORM_INFO
    (0xe2, 1),            // PKG_CST_CONFIG_CONTROL
    (0xe7, 2),            // MPERF, APERF
    (0xfe, 1),            // MTRRcap
    (0x11e, 1),           // BBL_CR_CTL3
    (0x122, 1),           // TSX_CTRL
    (0x140, 1),           // MISC_FEATURES_ENABLES
    (0x174, 3),           // SYSENTER_CS, _ESP, _EIP
    (0x179, 3),           // MCG_CAP, MCG_STATUS, MCG_CTL
    (0x198, 1),           // PERF_STATUS
    (0x1a0, 1),           // MISC_ENABLE
    (0x1a4, 1),           // MISC_FEATURE_CONTROL
    (0x1aa, 1),           // MISC_PWR_MGMT
    (0x1ad, 2),           // TURBO_RATIO_LIMIT, _LIMIT1
    (0x1d9, 1),           // DEBUGCTL
    (0x1db, 4),           // LASTBRANCH/LASTINT FROM/TO IP
    (0x1fc, 1),           // POWER_CTL
    (0x200, 0x100),       // MTRRs
    (0x3fc, 3),           // CORE_C3/C6/C7_RESIDENCY
    (0x400, 0x80),        // MCi_CTL...
    (0x606, 1),           // RAPL_POWER_UNIT
    (0x60a, 3),           // PKGC3/6/7_IRTL
    (0x610, 2),           // PKG_POWER_LIMIT, PKG_ENERGY_STATUS
    (0x613, 2),           // PKG_PERF_STATUS, PKG_POWER_INFO
    (0x618, 2),           // DRAM_POWER_LIMIT, DRAM_ENERGY_STATUS
    (0x61b, 2),           // DRAM_PERF_STATUS, DRAM_POWER_INFO
    (0x648, 5),           // CONFIG_TDP_*, TURBO_ACTIVATION_RATIO
    (0x6e0, 1),           // TSC_DEADLINE
    (0x800, 0x400),       // x2APIC
    (0xda0, 1),           // XSS
    (0xc000_0080, 5),     // EFER, STAR, LSTAR, CSTAR, SYSCALL_MASK
    (0xc000_0100, 4),     // FS_BASE, GS_BASE, KERNEL_GS_BASE, TSC_AUX
    (0xc001_0015, 1),     // K7_HWCR
    (0x4b56_4d00, 0x100), // KVM's own (kvmclock, steal time, async PF...)
];

/// Whether the MSR `index` is one a snapshot keeps (Firecracker's
/// `msr_should_serialize`).
pub fn msr_should_serialize(index: u32) -> bool {
    index != MSR_IA32_MCG_CTL
        && SERIALIZABLE_MSR_RANGES
            .iter()
            .any(|&(first, count)| index >= first && index - first < count)
}

/// The MSRs a snapshot saves on this host: `KVM_GET_MSR_INDEX_LIST`,
/// those [`msr_should_serialize`] keeps, in KVM's order.
pub fn msrs_to_save(kvm: &Kvm) -> Result<Vec<u32>, StateError> {
    let list = kvm.get_msr_index_list().map_err(StateError::MsrIndexList)?;
    Ok(list
        .as_slice()
        .iter()
        .copied()
        .filter(|&i| msr_should_serialize(i))
        .collect())
}

/// `KVM_GET_MSRS` of `indices`, in chunks KVM takes. KVM stops at the first
/// MSR it cannot read and says how many it read: the rest are read past it.
pub(super) fn read_msrs(
    fd: &VcpuFd,
    index: u8,
    indices: &[u32],
) -> Result<Vec<kvm_msr_entry>, StateError> {
    let mut out = Vec::with_capacity(indices.len());
    let mut skipped = Vec::new();
    let mut rest = indices;
    while !rest.is_empty() {
        let n = rest.len().min(KVM_MAX_MSR_ENTRIES);
        let mut msrs = Msrs::new(n).map_err(|source| StateError::Fam {
            index,
            what: "the MSR list",
            source,
        })?;
        for (entry, &i) in msrs.as_mut_slice().iter_mut().zip(rest) {
            entry.index = i;
        }
        let read = fd.get_msrs(&mut msrs).map_err(|source| StateError::Vcpu {
            index,
            what: "KVM_GET_MSRS",
            source,
        })?;
        let read = read.min(n);
        out.extend_from_slice(&msrs.as_slice()[..read]);
        if read < n {
            skipped.push(rest[read]);
            rest = &rest[read + 1..];
        } else {
            rest = &rest[n..];
        }
    }
    if !skipped.is_empty() {
        static LOGGED: Once = Once::new();
        LOGGED.call_once(|| {
            log::debug!("KVM_GET_MSRS cannot read these MSRs here, not saved: {skipped:#x?}");
        });
    }
    Ok(out)
}

/// `KVM_SET_MSRS` of `msrs`, all of them or an error.
pub(super) fn write_msrs(fd: &VcpuFd, index: u8, msrs: &[kvm_msr_entry]) -> Result<(), StateError> {
    if msrs.is_empty() {
        return Ok(());
    }
    let list = Msrs::from_entries(msrs).map_err(|source| StateError::Fam {
        index,
        what: "the MSR list",
        source,
    })?;
    let set = fd.set_msrs(&list).map_err(|source| StateError::Vcpu {
        index,
        what: "KVM_SET_MSRS",
        source,
    })?;
    if set < msrs.len() {
        return Err(StateError::MsrsIncomplete {
            index,
            set,
            given: msrs.len(),
            refused: msrs[set].index,
        });
    }
    Ok(())
}

/// A TSC deadline of 0 is replaced by the TSC (Firecracker's
/// `fix_zero_tsc_deadline_msr`): restored as 0, the timer would never fire
/// again if the deadline was cleared by a timer already due.
pub(super) fn fix_zero_tsc_deadline(msrs: &mut [kvm_msr_entry]) {
    let Some(tsc) = msrs
        .iter()
        .filter(|m| m.index == MSR_IA32_TSC)
        .map(|m| m.data)
        .max()
    else {
        return;
    };
    for m in msrs
        .iter_mut()
        .filter(|m| m.index == MSR_IA32_TSC_DEADLINE && m.data == 0)
    {
        m.data = tsc;
    }
}
