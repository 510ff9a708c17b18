use super::*;

fn leaf(function: u32, index: u32, eax: u32, ebx: u32, ecx: u32, edx: u32) -> kvm_cpuid_entry2 {
    kvm_cpuid_entry2 {
        function,
        index,
        eax,
        ebx,
        ecx,
        edx,
        ..Default::default()
    }
}

/// Leaf 0 and 1 of a host: `vendor`, leaf 1 EAX `fms`.
fn host(vendor: &[u8; 12], fms: u32) -> Vec<kvm_cpuid_entry2> {
    let w = |i: usize| u32::from_le_bytes(vendor[i..i + 4].try_into().unwrap());
    vec![
        leaf(0, 0, 0x1f, w(0), w(8), w(4)),
        leaf(1, 0, fms, 0, 0, 0),
        leaf(7, 0, 0, 0xffff_ffff, 0, 0),
    ]
}

/// Emerald Rapids (this host): family 6, model 0xcf, stepping 2.
const EMERALD_RAPIDS: u32 = 0x000c_06f2;
/// Cascade Lake: family 6, model 0x55, stepping 7.
const CASCADE_LAKE: u32 = 0x0005_0657;

#[test]
fn bitmaps_parse_as_firecracker_writes_them() {
    let b = Bitmap::parse("0b1x0_x", 32).unwrap();
    assert_eq!((b.filter, b.value), (0b1010, 0b1000));
    assert_eq!(b.apply(0b0111), 0b1101);
    assert!(Bitmap::parse(&format!("0b{}", "x".repeat(33)), 32).is_err());
    assert!(Bitmap::parse(&format!("0b{}", "x".repeat(64)), 64).is_ok());
    let e = Bitmap::parse("0b12", 32).unwrap_err();
    assert!(e.contains("'2'"), "{e}");
}

#[test]
fn static_templates_checked_against_the_host() {
    assert_eq!(
        check_static(CpuTemplate::None, &host(b"GenuineIntel", 0)),
        Ok(())
    );
    let e = check_static(CpuTemplate::T2, &host(b"GenuineIntel", EMERALD_RAPIDS)).unwrap_err();
    assert!(
        matches!(
            e,
            TemplateError::Model {
                family: 6,
                model: 0xcf,
                stepping: 2,
                ..
            }
        ),
        "{e}"
    );
    let m = e.to_string();
    assert!(m.contains("T2") && m.contains("Skylake"), "{m}");
    let e = check_static(CpuTemplate::T2A, &host(b"GenuineIntel", CASCADE_LAKE)).unwrap_err();
    assert!(e.to_string().contains("AuthenticAMD"), "{e}");
    assert_eq!(
        check_static(CpuTemplate::T2CL, &host(b"GenuineIntel", CASCADE_LAKE)),
        Err(TemplateError::NotImplemented("T2CL"))
    );
    let e = check_static(CpuTemplate::T2S, &host(b"AuthenticAMD", CASCADE_LAKE)).unwrap_err();
    assert!(e.to_string().contains("GenuineIntel"), "{e}");
}

#[test]
fn custom_template_masks_cpuid_and_boot_msrs() {
    let t: CustomTemplate = serde_json::from_str(
        r#"{"cpuid_modifiers": [{"leaf": "0x7", "subleaf": "0x0", "flags": 1,
             "modifiers": [{"register": "ebx", "bitmap": "0bxxxxxxxxxxxxxxxxxxxxxxxxxxxx0000"}]}],
            "msr_modifiers": [{"addr": "0x1a0", "bitmap": "0b1xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}]}"#,
    )
    .unwrap();
    let setup = CpuSetup::new(
        CpuId::from_entries(&host(b"GenuineIntel", EMERALD_RAPIDS)).unwrap(),
        false,
        CpuTemplate::None,
        Some(&t),
    )
    .unwrap();
    let l7 = setup
        .cpuid
        .as_slice()
        .iter()
        .find(|e| e.function == 7)
        .copied()
        .unwrap();
    assert_eq!((l7.ebx, l7.flags), (0xffff_fff0, 1));
    let misc = setup.msrs.iter().find(|m| m.index == 0x1a0).unwrap();
    assert_eq!(misc.data >> 63, 1);
    // A leaf the host does not offer.
    let t: CustomTemplate = serde_json::from_str(
        r#"{"cpuid_modifiers": [{"leaf": "0x8000001f", "subleaf": "0x0", "flags": 0, "modifiers": []}]}"#,
    )
    .unwrap();
    let e = CpuSetup::new(
        CpuId::from_entries(&host(b"GenuineIntel", 0)).unwrap(),
        false,
        CpuTemplate::None,
        Some(&t),
    )
    .unwrap_err();
    assert_eq!(e, TemplateError::NoLeaf(0x8000_001f, 0));
}

#[test]
fn what_teravm_does_not_apply_is_refused_with_the_reason() {
    let t: CustomTemplate = serde_json::from_str(r#"{"kvm_capabilities": ["!56"]}"#).unwrap();
    assert!(t
        .validate()
        .unwrap_err()
        .to_string()
        .contains("kvm_capabilities"));
    let t: CustomTemplate =
        serde_json::from_str(r#"{"msr_modifiers": [{"addr": "0x10a", "bitmap": "0b1"}]}"#).unwrap();
    let e = t.validate().unwrap_err().to_string();
    assert!(e.contains("0x10a") && e.contains("boot"), "{e}");
    for bad in [
        r#"{"cpuid_modifiers": [{"leaf": "7", "subleaf": "0x0", "flags": 0, "modifiers": []}]}"#,
        r#"{"cpuid_modifiers": [{"leaf": "0x7", "subleaf": "0x0", "flags": 0,
            "modifiers": [{"register": "ekx", "bitmap": "0b1"}]}]}"#,
        r#"{"reg_modifiers": []}"#,
    ] {
        assert!(
            serde_json::from_str::<CustomTemplate>(bad).is_err(),
            "{bad}"
        );
    }
}
