//! CPUID for a Linux guest: what `KVM_GET_SUPPORTED_CPUID` offers (KVM's
//! paravirt leaves 0x4000_0000.. included), with the vCPU topology filled
//! in: one socket of `vcpus` cores, one thread each, APIC id = vCPU index.
//! Leaves 0x1, 0x4 and 0xb/0x1f (Intel), 0x8000_0008, 0x8000_001d and
//! 0x8000_001e (AMD). Pure over the entries, so it is tested without KVM.

use kvm_bindings::kvm_cpuid_entry2;

/// Leaf 1 ECX: running under a hypervisor.
const ECX_HYPERVISOR: u32 = 1 << 31;
/// Leaf 1 EDX: more than one logical processor per package.
const EDX_HTT: u32 = 1 << 28;
/// Leaf 0xb/0x1f level types.
const LEVEL_SMT: u32 = 1;
const LEVEL_CORE: u32 = 2;

/// Bits needed for `n` ids (0 for 1).
fn id_bits(n: u32) -> u32 {
    if n <= 1 {
        0
    } else {
        32 - (n - 1).leading_zeros()
    }
}

/// Fills in the topology of vCPU `index` of `vcpus` in `entries`.
pub fn set_topology(entries: &mut [kvm_cpuid_entry2], index: u8, vcpus: u8) {
    let apic_id = u32::from(index);
    let n = u32::from(vcpus.max(1));
    for e in entries.iter_mut() {
        match e.function {
            0x1 => {
                // APIC id, logical processors per package, CLFLUSH line (64 bytes).
                e.ebx = (apic_id << 24) | ((n & 0xff) << 16) | (8 << 8) | (e.ebx & 0xff);
                e.ecx |= ECX_HYPERVISOR;
                if n > 1 {
                    e.edx |= EDX_HTT;
                } else {
                    e.edx &= !EDX_HTT;
                }
            }
            0x4 | 0x8000_001d => {
                // Cache sharing: L1/L2 per core (one thread), L3 by all cores.
                let level = (e.eax >> 5) & 0x7;
                let sharing = if level >= 3 { n - 1 } else { 0 };
                let mut eax = e.eax & 0x3fff;
                eax |= (sharing & 0xfff) << 14;
                if e.function == 0x4 {
                    eax |= ((n - 1).min(63)) << 26;
                }
                if e.eax & 0x1f != 0 {
                    e.eax = eax;
                }
            }
            0xb | 0x1f => {
                e.edx = apic_id;
                match e.index {
                    0 => {
                        e.eax = 0; // one thread per core: no SMT bits
                        e.ebx = 1;
                        e.ecx = (LEVEL_SMT << 8) | e.index;
                    }
                    1 => {
                        e.eax = id_bits(n);
                        e.ebx = n;
                        e.ecx = (LEVEL_CORE << 8) | e.index;
                    }
                    _ => {
                        e.eax = 0;
                        e.ebx = 0;
                        e.ecx = e.index;
                    }
                }
            }
            0x8000_0008 => {
                // AMD: ApicIdCoreIdSize and NC (cores - 1).
                e.ecx = (e.ecx & !0xf0ff) | (id_bits(n) << 12) | ((n - 1) & 0xff);
            }
            0x8000_001e => {
                // AMD: extended APIC id, core id (one thread per core), node 0.
                e.eax = apic_id;
                e.ebx = apic_id & 0xff;
                e.ecx = 0;
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(function: u32, index: u32, eax: u32) -> kvm_cpuid_entry2 {
        kvm_cpuid_entry2 {
            function,
            index,
            eax,
            ..Default::default()
        }
    }

    fn find(e: &[kvm_cpuid_entry2], function: u32, index: u32) -> kvm_cpuid_entry2 {
        *e.iter()
            .find(|x| x.function == function && x.index == index)
            .unwrap()
    }

    fn sample() -> Vec<kvm_cpuid_entry2> {
        vec![
            kvm_cpuid_entry2 {
                function: 1,
                ebx: 0xff00_0800 | 0x12,
                edx: EDX_HTT,
                ..Default::default()
            },
            entry(4, 0, 0x121), // L1 data
            entry(4, 1, 0x143), // L2 unified
            entry(4, 2, 0x163), // L3 unified
            entry(0xb, 0, 0),
            entry(0xb, 1, 0),
            entry(0xb, 2, 0),
            entry(0x8000_0008, 0, 0),
            entry(0x8000_001d, 2, 0x163),
            entry(0x8000_001e, 0, 0),
            entry(0x4000_0000, 0, 0x4000_0001),
        ]
    }

    #[test]
    fn apic_ids_and_counts() {
        for (index, vcpus) in [(0u8, 1u8), (1, 2), (5, 6), (200, 254)] {
            let mut e = sample();
            set_topology(&mut e, index, vcpus);
            let l1 = find(&e, 1, 0);
            assert_eq!(l1.ebx >> 24, u32::from(index));
            assert_eq!((l1.ebx >> 16) & 0xff, u32::from(vcpus));
            assert_eq!(l1.ebx & 0xff, 0x12, "brand index kept");
            assert_ne!(l1.ecx & ECX_HYPERVISOR, 0);
            assert_eq!(l1.edx & EDX_HTT != 0, vcpus > 1);
            let smt = find(&e, 0xb, 0);
            let core = find(&e, 0xb, 1);
            assert_eq!((smt.eax, smt.ebx, smt.ecx >> 8), (0, 1, LEVEL_SMT));
            assert_eq!(core.ebx, u32::from(vcpus));
            assert_eq!(core.ecx, (LEVEL_CORE << 8) | 1);
            assert!(1u32 << core.eax >= u32::from(vcpus));
            assert_eq!(find(&e, 0xb, 2).ecx >> 8, 0, "no level past cores");
            for sub in 0..3 {
                assert_eq!(find(&e, 0xb, sub).edx, u32::from(index));
            }
            assert_eq!(find(&e, 0x8000_001e, 0).eax, u32::from(index));
            assert_eq!(find(&e, 0x8000_0008, 0).ecx & 0xff, u32::from(vcpus) - 1);
            assert_eq!(
                find(&e, 0x4000_0000, 0).eax,
                0x4000_0001,
                "paravirt leaf kept"
            );
        }
    }

    #[test]
    fn cache_sharing() {
        let mut e = sample();
        set_topology(&mut e, 0, 8);
        let l1 = find(&e, 4, 0);
        let l3 = find(&e, 4, 2);
        assert_eq!((l1.eax >> 14) & 0xfff, 0);
        assert_eq!((l3.eax >> 14) & 0xfff, 7);
        assert_eq!(l1.eax >> 26, 7, "cores per package - 1");
        assert_eq!(l1.eax & 0x3fff, 0x121, "cache type and level kept");
        assert_eq!((find(&e, 0x8000_001d, 2).eax >> 14) & 0xfff, 7);
    }

    #[test]
    fn id_bit_widths() {
        assert_eq!(id_bits(1), 0);
        assert_eq!(id_bits(2), 1);
        assert_eq!(id_bits(3), 2);
        assert_eq!(id_bits(4), 2);
        assert_eq!(id_bits(254), 8);
    }
}
