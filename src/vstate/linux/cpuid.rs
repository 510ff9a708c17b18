//! CPUID for a Linux guest: what `KVM_GET_SUPPORTED_CPUID` offers (KVM's
//! paravirt leaves 0x4000_0000.. included), with the vCPU topology filled
//! in as Firecracker presents it (its `Cpuid::normalize`): one socket; each
//! core one thread, or two with SMT; APIC id = vCPU index (so with SMT
//! vCPUs 2k and 2k+1 are the threads of core k). Leaves 0x1, 0x4 and
//! 0xb/0x1f (Intel), 0x8000_0008, 0x8000_001d and 0x8000_001e (AMD only).
//! Pure over the entries, so it is tested without KVM.

use kvm_bindings::kvm_cpuid_entry2;

/// `KVM_CPUID_FLAG_SIGNIFICANT_INDEX`: the entry depends on ECX.
const KVM_CPUID_FLAG_SIGNIFICANT_INDEX: u32 = 1;

/// Leaf 1 ECX: running under a hypervisor.
const ECX_HYPERVISOR: u32 = 1 << 31;
/// Leaf 1 EDX: more than one logical processor per package.
const EDX_HTT: u32 = 1 << 28;
/// Leaf 0xb/0x1f level types.
const LEVEL_SMT: u32 = 1;
const LEVEL_CORE: u32 = 2;
/// Leaf 0xb.1 EAX: the x2APIC id shift to the package, as Firecracker sets
/// it: enough bits for its 32 vCPUs whatever the count.
const CORE_SHIFT: u32 = 5;

/// Bits needed for `n` ids (0 for 1).
fn id_bits(n: u32) -> u32 {
    if n <= 1 {
        0
    } else {
        32 - (n - 1).leading_zeros()
    }
}

/// Whether leaf 0 names AMD.
fn is_amd(entries: &[kvm_cpuid_entry2]) -> bool {
    entries
        .iter()
        .find(|e| e.function == 0)
        .is_some_and(|e| (e.ebx, e.edx, e.ecx) == (0x6874_7541, 0x6974_6e65, 0x444d_4163))
}

/// The topology of vCPU `index` of `vcpus` (`smt`: two threads per core,
/// for more than one vCPU) in `entries`; leaf 0xb.1 (which newer KVMs
/// leave out) is added, and leaf 0x1f, where there is one, repeats 0xb.
pub fn set_topology(entries: &mut Vec<kvm_cpuid_entry2>, index: u8, vcpus: u8, smt: bool) {
    let apic_id = u32::from(index);
    let n = u32::from(vcpus.max(1));
    let cpu_bits = u32::from(smt && n > 1);
    let per_core = 1u32 << cpu_bits;
    let cores = n / per_core;
    let amd = is_amd(entries);
    if !entries.iter().any(|e| e.function == 0xb && e.index == 1)
        && entries.iter().any(|e| e.function == 0xb)
    {
        entries.push(kvm_cpuid_entry2 {
            function: 0xb,
            index: 1,
            flags: KVM_CPUID_FLAG_SIGNIFICANT_INDEX,
            ..Default::default()
        });
    }
    let mut leaf4_done = false;
    for e in entries.iter_mut() {
        match e.function {
            0x1 => {
                // CLFLUSH line (64 bytes), addressable ids per package (a
                // power of two), initial APIC id.
                e.ebx = (apic_id << 24)
                    | ((n.next_power_of_two() & 0xff) << 16)
                    | (8 << 8)
                    | (e.ebx & 0xff);
                e.ecx |= ECX_HYPERVISOR;
                if n > 1 {
                    e.edx |= EDX_HTT;
                } else {
                    e.edx &= !EDX_HTT;
                }
            }
            // Cache sharing: L1/L2 by the threads of a core, L3 by all;
            // the cores of the package. Up to the first empty subleaf.
            0x4 if !leaf4_done => {
                if (e.eax, e.ebx, e.ecx, e.edx) == (0, 0, 0, 0) {
                    leaf4_done = true;
                    continue;
                }
                let sharing = match (e.eax >> 5) & 0x7 {
                    1 | 2 => per_core - 1,
                    3 => n - 1,
                    _ => (e.eax >> 14) & 0xfff,
                };
                e.eax = (e.eax & 0x3fff) | ((sharing & 0xfff) << 14) | (((cores - 1) & 0x3f) << 26);
            }
            0x8000_001d if amd && e.eax & 0x1f != 0 => {
                let sharing = if (e.eax >> 5) & 0x7 >= 3 {
                    n - 1
                } else {
                    per_core - 1
                };
                e.eax = (e.eax & !(0xfff << 14)) | ((sharing & 0xfff) << 14);
            }
            0xb => set_level(e, apic_id, n, cpu_bits, per_core),
            0x8000_0008 if amd => {
                // ApicIdCoreIdSize and NC (threads - 1).
                e.ecx = (e.ecx & !0xf0ff) | (id_bits(n) << 12) | ((n - 1) & 0xff);
            }
            0x8000_001e if amd => {
                // Extended APIC id, core id and threads per core - 1, node 0.
                e.eax = apic_id;
                e.ebx = (e.ebx & !0xff_ff) | ((per_core - 1) << 8) | ((apic_id >> cpu_bits) & 0xff);
                e.ecx = 0;
            }
            _ => {}
        }
    }
    if entries.iter().any(|e| e.function == 0x1f) {
        entries.retain(|e| e.function != 0x1f);
        let copies: Vec<kvm_cpuid_entry2> = entries
            .iter()
            .filter(|e| e.function == 0xb)
            .map(|e| kvm_cpuid_entry2 {
                function: 0x1f,
                ..*e
            })
            .collect();
        entries.extend(copies);
    }
}

/// Leaf 0xb subleaf `e.index`: threads per core, then the package.
fn set_level(e: &mut kvm_cpuid_entry2, apic_id: u32, n: u32, cpu_bits: u32, per_core: u32) {
    e.edx = apic_id;
    e.flags |= KVM_CPUID_FLAG_SIGNIFICANT_INDEX;
    match e.index {
        0 => {
            e.eax = cpu_bits;
            e.ebx = per_core;
            e.ecx = LEVEL_SMT << 8;
        }
        1 => {
            e.eax = CORE_SHIFT;
            e.ebx = n;
            e.ecx = (LEVEL_CORE << 8) | 1;
        }
        _ => {
            e.eax = 0;
            e.ebx = 0;
            e.ecx = e.index;
        }
    }
}

#[cfg(test)]
#[path = "cpuid_tests.rs"]
mod tests;
