//! Unit tests of config parsing and validation.
use super::*;

fn parse(text: &str) -> Result<VmConfig, ConfigError> {
    VmConfig::from_json(text, Path::new("t.json"))
}

#[test]
fn full_example_parses() {
    let c = parse(
        r#"{
         "machine-config": {"vcpu_count": 2, "mem_size_mib": 4096, "huge_pages": "Transparent"},
         "boot-source": {"boot_args": "touch=all then=reset"},
         "memory": {"backing": "anonymous", "host_nodes": null, "numa_policy": "bind", "populate": false},
         "reclaim": {"workers_per_node": 1, "chunk_mib": 1024, "parallel_threshold_mib": 1024, "steal": true}
       }"#,
    )
    .unwrap();
    assert_eq!(c.machine_config.vcpu_count, 2);
    assert_eq!(c.machine_config.mem_bytes(), 4 << 30);
    assert_eq!(c.boot_source.boot_args, "touch=all then=reset");
    assert_eq!(c.reclaim.workers_per_node, 1);
    assert_eq!(c.memory.numa_policy, NumaPolicy::Bind);
}

#[test]
fn sections_default() {
    let c = parse(r#"{"machine-config": {"vcpu_count": 1, "mem_size_mib": 128}}"#).unwrap();
    assert_eq!(c.machine_config.huge_pages, HugePages::Transparent);
    assert_eq!(c.memory, MemoryConfig::default());
    assert_eq!(c.reclaim, ReclaimConfig::default());
    let m: MachineConfig =
        serde_json::from_str(r#"{"vcpu_count":1,"mem_size_mib":64,"huge_pages":"2M"}"#).unwrap();
    assert_eq!(m.huge_pages, HugePages::Huge2M);
}

#[test]
fn unknown_fields_are_refused() {
    let e = parse(r#"{"machine-config": {"vcpu_count": 1, "mem_size_mib": 128, "vcpus": 2}}"#)
        .unwrap_err();
    assert!(e.to_string().contains("unknown field `vcpus`"), "{e}");
    let e = parse(r#"{"network": {}}"#).unwrap_err();
    assert!(e.to_string().contains("unknown field `network`"), "{e}");
}

#[test]
fn wrong_types_are_refused() {
    let e = parse(r#"{"machine-config": {"vcpu_count": "two", "mem_size_mib": 128}}"#).unwrap_err();
    assert!(matches!(e, ConfigError::Parse { .. }), "{e}");
    let e = parse(r#"{"machine-config": {"vcpu_count": 1, "mem_size_mib": -1}}"#).unwrap_err();
    assert!(matches!(e, ConfigError::Parse { .. }), "{e}");
    let e =
        parse(r#"{"machine-config": {"vcpu_count": 1, "mem_size_mib": 128, "huge_pages": "4K"}}"#)
            .unwrap_err();
    assert!(
        e.to_string().contains("huge_pages") || e.to_string().contains("4K"),
        "{e}"
    );
}

#[test]
fn ranges_are_checked_and_named() {
    let cases = [
        (
            r#"{"machine-config": {"vcpu_count": 0, "mem_size_mib": 128}}"#,
            "machine-config.vcpu_count",
        ),
        (
            r#"{"machine-config": {"vcpu_count": 255, "mem_size_mib": 128}}"#,
            "machine-config.vcpu_count",
        ),
        (
            r#"{"machine-config": {"vcpu_count": 1, "mem_size_mib": 0}}"#,
            "machine-config.mem_size_mib",
        ),
        (
            r#"{"machine-config": {"vcpu_count": 1, "mem_size_mib": 1099511627776}}"#,
            "machine-config.mem_size_mib",
        ),
        (
            r#"{"machine-config": {"vcpu_count": 1, "mem_size_mib": 1025, "huge_pages": "1G"}}"#,
            "machine-config.mem_size_mib",
        ),
        (
            r#"{"boot-source": {"kernel_image_path": "/vmlinux"}}"#,
            "boot-source.kernel_image_path",
        ),
        (
            r#"{"boot-source": {"boot_args": "a\u0000b"}}"#,
            "boot-source.boot_args",
        ),
        (r#"{"memory": {"host_nodes": []}}"#, "memory.host_nodes"),
        (
            r#"{"memory": {"host_nodes": [0, 1, 0]}}"#,
            "memory.host_nodes",
        ),
        (
            r#"{"reclaim": {"workers_per_node": 0}}"#,
            "reclaim.workers_per_node",
        ),
        (r#"{"reclaim": {"chunk_mib": 0}}"#, "reclaim.chunk_mib"),
        (r#"{"reclaim": {"chunk_mib": 3}}"#, "reclaim.chunk_mib"),
    ];
    for (text, field) in cases {
        match parse(text) {
            Err(ConfigError::InvalidField { field: f, .. }) => assert_eq!(f, field, "{text}"),
            other => panic!("{text}: expected an invalid {field}, got {other:?}"),
        }
    }
}

#[test]
fn errors_are_one_line() {
    let e = parse("{\n\"machine-config\": [1,\n2]}").unwrap_err();
    assert!(!e.to_string().contains('\n'), "{e}");
    // Found by fuzzing (config_file): serde echoes an unknown variant or
    // field name as written, so an escaped newline in it made a
    // multi-line error.
    let e = parse(r#"{"machine-config": {"vcpu_count": 1, "mem_size_mib": 256, "huge_pages": "Tr\nsparent"}}"#)
        .unwrap_err();
    assert!(matches!(e, ConfigError::Parse { .. }), "{e}");
    assert!(!e.to_string().contains(['\r', '\n']), "{e}");
    let e = parse("{\"reclaim\": {\"a\\r\\nb\": 1}}").unwrap_err();
    assert!(e.to_string().contains("unknown field `a  b`"), "{e}");
    let e = VmConfig::from_file(Path::new("/nonexistent/teravm.json")).unwrap_err();
    assert!(matches!(e, ConfigError::Read { .. }));
    assert!(!e.to_string().contains('\n'));
}

#[test]
fn round_trips() {
    let c = VmConfig::default();
    let text = serde_json::to_string(&c).unwrap();
    assert_eq!(parse(&text).unwrap(), c);
    assert!(text.contains("\"machine-config\""));
}
