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

/// Leaf 0 of `vendor` (12 bytes, EBX EDX ECX).
fn leaf0(vendor: &[u8; 12]) -> kvm_cpuid_entry2 {
    let w = |i: usize| u32::from_le_bytes(vendor[i..i + 4].try_into().unwrap());
    kvm_cpuid_entry2 {
        function: 0,
        eax: 0x1f,
        ebx: w(0),
        edx: w(4),
        ecx: w(8),
        ..Default::default()
    }
}

fn sample(vendor: &[u8; 12]) -> Vec<kvm_cpuid_entry2> {
    vec![
        leaf0(vendor),
        kvm_cpuid_entry2 {
            function: 1,
            ebx: 0xff00_0800 | 0x12,
            edx: EDX_HTT,
            ..Default::default()
        },
        entry(4, 0, 0x121), // L1 data
        entry(4, 1, 0x143), // L2 unified
        entry(4, 2, 0x163), // L3 unified
        entry(4, 3, 0),     // the end
        entry(0xb, 0, 0),
        entry(0x1f, 0, 0),
        entry(0x8000_0008, 0, 0),
        entry(0x8000_001d, 2, 0x163),
        entry(0x8000_001e, 0, 0),
        entry(0x4000_0000, 0, 0x4000_0001),
    ]
}

#[test]
fn apic_ids_and_counts() {
    for smt in [false, true] {
        for (index, vcpus) in [(0u8, 1u8), (1, 2), (5, 6), (31, 32)] {
            let mut e = sample(b"GenuineIntel");
            set_topology(&mut e, index, vcpus, smt);
            let per_core = if smt && vcpus > 1 { 2 } else { 1 };
            let l1 = find(&e, 1, 0);
            assert_eq!(l1.ebx >> 24, u32::from(index));
            assert_eq!((l1.ebx >> 16) & 0xff, u32::from(vcpus).next_power_of_two());
            assert_eq!(l1.ebx & 0xff, 0x12, "brand index kept");
            assert_ne!(l1.ecx & ECX_HYPERVISOR, 0);
            assert_eq!(l1.edx & EDX_HTT != 0, vcpus > 1);
            for leaf in [0xb, 0x1f] {
                let thread = find(&e, leaf, 0);
                let core = find(&e, leaf, 1);
                assert_eq!(
                    (thread.eax, thread.ebx, thread.ecx),
                    (per_core - 1, per_core, LEVEL_SMT << 8),
                    "{leaf:#x} smt={smt}"
                );
                assert_eq!(
                    (core.eax, core.ebx, core.ecx),
                    (CORE_SHIFT, u32::from(vcpus), (LEVEL_CORE << 8) | 1)
                );
                assert_eq!((thread.edx, core.edx), (index.into(), index.into()));
                assert_ne!(core.flags & KVM_CPUID_FLAG_SIGNIFICANT_INDEX, 0);
            }
            assert_eq!(
                find(&e, 0x8000_0008, 0).ecx,
                0,
                "AMD leaves left alone on Intel"
            );
            assert_eq!(
                find(&e, 0x4000_0000, 0).eax,
                0x4000_0001,
                "paravirt leaf kept"
            );
        }
    }
}

#[test]
fn cache_sharing() {
    for (smt, l1_sharing, cores) in [(false, 0, 8), (true, 1, 4)] {
        let mut e = sample(b"GenuineIntel");
        set_topology(&mut e, 0, 8, smt);
        let l1 = find(&e, 4, 0);
        let l3 = find(&e, 4, 2);
        assert_eq!((l1.eax >> 14) & 0xfff, l1_sharing);
        assert_eq!((find(&e, 4, 1).eax >> 14) & 0xfff, l1_sharing);
        assert_eq!((l3.eax >> 14) & 0xfff, 7);
        assert_eq!(l1.eax >> 26, cores - 1, "cores per package - 1");
        assert_eq!(l1.eax & 0x3fff, 0x121, "cache type and level kept");
        assert_eq!(find(&e, 4, 3).eax, 0, "the empty subleaf stays empty");
    }
}

#[test]
fn amd_leaves() {
    let mut e = sample(b"AuthenticAMD");
    set_topology(&mut e, 5, 8, true);
    assert_eq!(find(&e, 0x8000_0008, 0).ecx & 0xff, 7);
    let ext = find(&e, 0x8000_001e, 0);
    assert_eq!(ext.eax, 5);
    assert_eq!(ext.ebx & 0xff, 2, "core id: vCPU 5 is thread 1 of core 2");
    assert_eq!((ext.ebx >> 8) & 0xff, 1, "two threads per core");
    assert_eq!((find(&e, 0x8000_001d, 2).eax >> 14) & 0xfff, 7);
}

#[test]
fn subleaf_1_of_0xb_added() {
    let mut e = sample(b"GenuineIntel");
    e.retain(|x| x.function != 0x1f);
    set_topology(&mut e, 0, 2, true);
    assert_eq!(find(&e, 0xb, 1).ebx, 2);
    assert!(
        !e.iter().any(|x| x.function == 0x1f),
        "no 0x1f where KVM has none"
    );
}

#[test]
fn id_bit_widths() {
    assert_eq!(id_bits(1), 0);
    assert_eq!(id_bits(2), 1);
    assert_eq!(id_bits(3), 2);
    assert_eq!(id_bits(4), 2);
    assert_eq!(id_bits(254), 8);
}
