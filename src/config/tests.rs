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
            r#"{"boot-source": {"kernel_image_path": ""}}"#,
            "boot-source.kernel_image_path",
        ),
        (
            r#"{"boot-source": {"initrd_path": "Cargo.toml"}}"#,
            "boot-source.initrd_path",
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
        (
            r#"{"reclaim": {"discard_workers_per_node": 257}}"#,
            "reclaim.discard_workers_per_node",
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

#[test]
fn firecracker_sections_are_accepted_when_empty() {
    // flintlock's config file, less the root drive it always adds.
    let c = parse(
        r#"{"boot-source": {"boot_args": "touch=8 then=idle", "initrd_path": null},
            "drives": [], "machine-config": {"vcpu_count": 2, "mem_size_mib": 256,
            "smt": false, "track_dirty_pages": false}, "balloon": null,
            "network-interfaces": [], "vsock": null, "mmds-config": null, "entropy": {},
            "logger": {"log_path": "/tmp/fc.log", "level": "Debug", "show_level": true,
                       "show_log_origin": true},
            "metrics": {"metrics_path": "/tmp/fc.metrics"}}"#,
    )
    .unwrap();
    assert_eq!(c.machine_config.vcpu_count, 2);
    // `"entropy": {}` is an entropy device with no limiter, as Firecracker
    // takes it.
    assert_eq!(c.entropy, Some(Default::default()));
    assert_eq!(c.logger.unwrap().show_log_origin, Some(true));
    assert_eq!(
        c.metrics.unwrap().metrics_path,
        Path::new("/tmp/fc.metrics")
    );
    // mmds-config is taken (issue 26), for interfaces that exist.
    let e = parse(r#"{"mmds-config": {"network_interfaces": ["eth0"]}}"#).unwrap_err();
    assert!(e.to_string().contains("mmds-config"), "{e}");
    let c = parse(
        r#"{"network-interfaces": [{"iface_id": "eth0", "host_dev_name": "tap0"}],
            "mmds-config": {"network_interfaces": ["eth0"], "version": "V2"}}"#,
    )
    .unwrap();
    assert_eq!(
        c.mmds_config.map(|m| m.version),
        Some(crate::mmds::MmdsVersion::V2)
    );
    // memory-hotplug is taken (issue 27), with Firecracker's defaults and
    // checks; a bad section is one line naming it.
    let c = parse(r#"{"memory-hotplug": {"total_size_mib": 1024}}"#).unwrap();
    assert_eq!(
        c.memory_hotplug,
        Some(MemoryHotplugConfig {
            total_size_mib: 1024,
            block_size_mib: 2,
            slot_size_mib: 128
        })
    );
    assert_eq!(
        parse(r#"{"memory-hotplug": null}"#).unwrap().memory_hotplug,
        None
    );
    for (bad, says) in [
        (r#"{"total_size_mib": 1000}"#, "multiple of slot size"),
        (
            r#"{"total_size_mib": 1024, "block_size_mib": 3}"#,
            "power of 2",
        ),
        (
            r#"{"total_size_mib": 1024, "slot_size_mib": 64}"#,
            "Slot size",
        ),
        (r#"{"total_size_mib": 4294967168}"#, "64 TiB"),
        (r#"{}"#, "total_size_mib"),
        (
            r#"{"total_size_mib": 1024, "requested_size_mib": 0}"#,
            "requested_size_mib",
        ),
    ] {
        let e = parse(&format!(r#"{{"memory-hotplug": {bad}}}"#)).unwrap_err();
        let text = e.to_string();
        assert!(text.contains(says), "{bad}: {text}");
        assert!(!text.contains('\n'), "{text}");
    }
    let sections = [("pmem", r#"[{"id": "p0", "path_on_host": "/dev/null"}]"#)];
    for (name, value) in sections {
        let e = parse(&format!(r#"{{"{name}": {value}}}"#)).unwrap_err();
        assert_eq!(e, ConfigError::NotSupported(name));
        assert!(
            e.to_string()
                .contains(&format!("not supported yet: {name}")),
            "{e}"
        );
    }
    let e = parse(r#"{"logger": {"level": "Chatty"}}"#).unwrap_err();
    assert!(e.to_string().contains("Chatty"), "{e}");
    let e = parse(r#"{"metrics": {}}"#).unwrap_err();
    assert!(e.to_string().contains("metrics_path"), "{e}");
}

#[test]
fn machine_config_shows_every_field_in_force() {
    let v = serde_json::to_value(MachineConfig::default()).unwrap();
    assert_eq!(
        v,
        serde_json::json!({"vcpu_count": 1, "mem_size_mib": 128, "smt": false,
            "track_dirty_pages": false, "huge_pages": "Transparent", "cpu_template": "None"})
    );
    let c = parse(
        r#"{"machine-config": {"vcpu_count": 2, "mem_size_mib": 256, "smt": true,
            "track_dirty_pages": true, "cpu_template": "C3"}}"#,
    )
    .unwrap();
    let v = serde_json::to_value(&c.machine_config).unwrap();
    assert_eq!(
        (&v["smt"], &v["track_dirty_pages"], &v["cpu_template"]),
        (&true.into(), &true.into(), &"C3".into()),
        "echoed as taken: {v}"
    );
    let e = parse(r#"{"machine-config": {"vcpu_count": 3, "mem_size_mib": 256, "smt": true}}"#)
        .unwrap_err();
    assert!(e.to_string().contains("machine-config.vcpu_count"), "{e}");
    // GET /vm/config shows the device lists (empty), as Firecracker does,
    // leaves absent sections out, and round-trips.
    let v = serde_json::to_value(VmConfig::default()).unwrap();
    assert_eq!(v["drives"], serde_json::json!([]));
    assert_eq!(v["network-interfaces"], serde_json::json!([]));
    for absent in ["vsock", "logger", "balloon", "mmds-config", "entropy"] {
        assert!(v.get(absent).is_none(), "{absent}: {v}");
    }
    assert_eq!(parse(&v.to_string()).unwrap(), VmConfig::default());
}

#[test]
fn the_config_file_is_read_with_a_size_limit() {
    let e = VmConfig::from_file(Path::new("/dev/zero")).unwrap_err();
    assert!(e.to_string().contains("larger than 1048576 bytes"), "{e}");
    assert!(!e.to_string().contains('\n'));
    let dir = std::env::temp_dir().join(format!("teravm-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let big = dir.join("big.json");
    let mut text = String::from(r#"{"boot-source": {"boot_args": ""#);
    text.push_str(&" ".repeat(MAX_CONFIG_FILE_BYTES as usize));
    text.push_str(r#""}}"#);
    std::fs::write(&big, text).unwrap();
    let e = VmConfig::from_file(&big).unwrap_err();
    assert!(matches!(e, ConfigError::Read { .. }), "{e}");
    let ok = dir.join("ok.json");
    std::fs::write(
        &ok,
        r#"{"machine-config": {"vcpu_count": 1, "mem_size_mib": 64}}"#,
    )
    .unwrap();
    assert_eq!(
        VmConfig::from_file(&ok)
            .unwrap()
            .machine_config
            .mem_size_mib,
        64
    );
    std::fs::write(&ok, b"{\xff}").unwrap();
    assert!(VmConfig::from_file(&ok)
        .unwrap_err()
        .to_string()
        .contains("UTF-8"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn discard_workers_default_to_the_reclaim_workers_and_0_is_serial() {
    let c = parse(r#"{"reclaim": {"workers_per_node": 3}}"#).unwrap();
    assert_eq!(c.reclaim.discard_workers_per_node, None);
    assert_eq!(c.reclaim.discard_workers(), 3);
    // Absent: not shown (GET /vm/config), and it reads back the same.
    let v = serde_json::to_value(&c).unwrap();
    assert!(
        v["reclaim"].get("discard_workers_per_node").is_none(),
        "{v}"
    );
    for n in [0, 1, 256] {
        let text = format!(r#"{{"reclaim": {{"discard_workers_per_node": {n}}}}}"#);
        let c = parse(&text).unwrap();
        assert_eq!(c.reclaim.discard_workers(), n);
        let v = serde_json::to_value(&c).unwrap();
        assert_eq!(v["reclaim"]["discard_workers_per_node"], n, "{v}");
        assert_eq!(parse(&v.to_string()).unwrap(), c);
    }
}

#[test]
fn worker_threads_are_capped_in_all() {
    assert!(check_worker_threads(256, 4).is_ok());
    assert!(check_worker_threads(128, 8).is_ok());
    let e = check_worker_threads(256, 8).unwrap_err().to_string();
    assert!(
        e.contains("reclaim.workers_per_node") && e.contains("2048 threads"),
        "{e}"
    );
}

#[test]
fn balloon_section() {
    let c = parse(
        r#"{"machine-config": {"vcpu_count": 1, "mem_size_mib": 256},
            "balloon": {"amount_mib": 64, "deflate_on_oom": true,
                        "stats_polling_interval_s": 1, "free_page_reporting": true}}"#,
    )
    .unwrap();
    assert_eq!(
        c.balloon,
        Some(BalloonConfig {
            amount_mib: 64,
            deflate_on_oom: true,
            stats_polling_interval_s: 1,
            free_page_reporting: true,
            free_page_hinting: false,
        })
    );
    // GET /vm/config shows it, with every field, and reads back the same.
    let v = serde_json::to_value(&c).unwrap();
    assert_eq!(
        v["balloon"],
        serde_json::json!({"amount_mib": 64, "deflate_on_oom": true,
            "stats_polling_interval_s": 1, "free_page_reporting": true,
            "free_page_hinting": false})
    );
    assert_eq!(parse(&v.to_string()).unwrap(), c);
    // Absent or null: no balloon, and none shown.
    for text in ["{}", r#"{"balloon": null}"#] {
        let c = parse(text).unwrap();
        assert_eq!(c.balloon, None);
        assert!(serde_json::to_value(&c).unwrap().get("balloon").is_none());
    }
    let cases = [
        (r#"{}"#, "missing field `amount_mib`"),
        (r#"{"amount_mib": 1}"#, "missing field `deflate_on_oom`"),
        (
            r#"{"amount_mib": 1, "deflate_on_oom": true, "must_tell_host": true}"#,
            "unknown field `must_tell_host`",
        ),
        (
            r#"{"amount_mib": "1", "deflate_on_oom": true}"#,
            "invalid type",
        ),
        (
            r#"{"amount_mib": 1, "deflate_on_oom": true, "free_page_hinting": true}"#,
            "balloon.free_page_hinting",
        ),
        (
            r#"{"amount_mib": 129, "deflate_on_oom": true}"#,
            "invalid value for balloon.amount_mib: the balloon target 129 MiB is above the \
             guest's RAM (128 MiB)",
        ),
        (
            r#"{"amount_mib": 16777216, "deflate_on_oom": true}"#,
            "balloon.amount_mib",
        ),
    ];
    for (section, needle) in cases {
        let e = parse(&format!(r#"{{"balloon": {section}}}"#))
            .unwrap_err()
            .to_string();
        assert!(e.contains(needle) && !e.contains('\n'), "{section}: {e}");
    }
    let e = parse(
        r#"{"balloon": {"amount_mib": 1, "deflate_on_oom": true, "free_page_hinting": true}}"#,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("use free_page_reporting"), "{e}");
}

/// flintlock's config file with its root drive and a TAP interface, and a
/// vsock: every device section of Firecracker's config file.
const DEVICES: &str = r#"{
    "machine-config": {"vcpu_count": 1, "mem_size_mib": 256},
    "drives": [
        {"drive_id": "root", "path_on_host": "/img/root.ext4", "is_root_device": true,
         "is_read_only": false, "cache_type": "Unsafe", "io_engine": "Sync",
         "partuuid": null, "rate_limiter": null},
        {"drive_id": "data", "path_on_host": "data.img", "is_root_device": false,
         "is_read_only": true}
    ],
    "network-interfaces": [
        {"iface_id": "eth0", "host_dev_name": "tap0", "guest_mac": "06:00:AC:10:00:02"},
        {"iface_id": "eth1", "host_dev_name": "tap1"}
    ],
    "vsock": {"guest_cid": 3, "uds_path": "/tmp/v.sock"}
}"#;

#[test]
fn device_sections_parse_validate_and_round_trip() {
    let c = parse(DEVICES).unwrap();
    assert_eq!(c.drives.len(), 2);
    assert_eq!(c.drives[0].drive_id, "root");
    assert!(c.drives[0].is_root_device && !c.drives[0].is_read_only);
    assert!(c.drives[1].is_read_only && c.drives[1].cache_type == CacheType::Unsafe);
    assert_eq!(c.network_interfaces.len(), 2);
    assert_eq!(
        c.network_interfaces[0].guest_mac.unwrap().bytes(),
        [6, 0, 0xac, 0x10, 0, 2]
    );
    assert_eq!(
        c.vsock,
        Some(VsockConfig {
            guest_cid: 3,
            uds_path: "/tmp/v.sock".into(),
            vsock_id: None
        })
    );
    // GET /vm/config: Firecracker's shape, every field in force, and it
    // reads back the same.
    let v = serde_json::to_value(&c).unwrap();
    assert_eq!(
        v["drives"][0],
        serde_json::json!({"drive_id": "root", "path_on_host": "/img/root.ext4",
            "is_root_device": true, "is_read_only": false, "cache_type": "Unsafe",
            "io_engine": "Sync"})
    );
    assert_eq!(
        v["network-interfaces"][0],
        serde_json::json!({"iface_id": "eth0", "host_dev_name": "tap0",
            "guest_mac": "06:00:ac:10:00:02"})
    );
    assert_eq!(
        v["vsock"],
        serde_json::json!({"guest_cid": 3, "uds_path": "/tmp/v.sock"})
    );
    assert_eq!(parse(&v.to_string()).unwrap(), c);
    // null lists are no devices.
    let c = parse(r#"{"drives": null, "network-interfaces": null, "vsock": null}"#).unwrap();
    assert!(c.drives.is_empty() && c.network_interfaces.is_empty() && c.vsock.is_none());
}

/// A change to a config's JSON.
type Change = dyn Fn(&mut serde_json::Value);

#[test]
fn device_sections_are_checked_and_named() {
    let v: serde_json::Value = serde_json::from_str(DEVICES).unwrap();
    let with = |f: &dyn Fn(&mut serde_json::Value)| {
        let mut v = v.clone();
        f(&mut v);
        parse(&v.to_string())
    };
    let cases: [(&Change, &str); 9] = [
        (
            &|v| v["drives"][1]["is_root_device"] = true.into(),
            "invalid value for drives.is_root_device: drives \"root\" and \"data\" are both root devices",
        ),
        (
            &|v| v["drives"][1]["drive_id"] = "root".into(),
            "invalid value for drives.drive_id: drive \"root\" is listed twice",
        ),
        (
            &|v| v["drives"][0]["rate_limiter"] = serde_json::json!({"ops": {"size": 1, "refill_time": u64::MAX}}),
            "invalid value for drives.rate_limiter: refill_time 18446744073709551615 ms is too large",
        ),
        (
            &|v| v["drives"][0]["path_on_host"] = "".into(),
            "drives.path_on_host",
        ),
        (
            &|v| v["network-interfaces"][1]["guest_mac"] = "06:00:ac:10:00:02".into(),
            "invalid value for network-interfaces.guest_mac",
        ),
        (
            &|v| v["network-interfaces"][1]["host_dev_name"] = "tap0".into(),
            "invalid value for network-interfaces.host_dev_name",
        ),
        (
            &|v| v["network-interfaces"][0]["tx_rate_limiter"] = serde_json::json!({"bandwidth": {"size": 1, "refill_time": u64::MAX}}),
            "invalid value for network-interfaces.tx_rate_limiter",
        ),
        (&|v| v["vsock"]["guest_cid"] = 2.into(), "invalid value for vsock.guest_cid"),
        (
            &|v| v["vsock"]["uds_path"] = "".into(),
            "invalid value for vsock.uds_path",
        ),
    ];
    for (change, needle) in cases {
        let e = with(change).unwrap_err().to_string();
        assert!(e.contains(needle) && !e.contains('\n'), "{needle}: {e}");
    }
    for (section, value, needle) in [
        (
            "drives",
            r#"[{"drive_id": "rootfs"}]"#,
            "missing field `is_root_device`",
        ),
        ("drives", "true", "invalid type"),
        ("drives", "{}", "invalid type"),
        (
            "network-interfaces",
            r#"[{"iface_id": "eth0"}]"#,
            "missing field `host_dev_name`",
        ),
        (
            "network-interfaces",
            r#"[{"iface_id": "eth0", "host_dev_name": "tap0", "guest_mac": "01:00:5e:00:00:01"}]"#,
            "multicast",
        ),
        ("vsock", r#"{"guest_cid": 3}"#, "missing field `uds_path`"),
        ("vsock", "1", "invalid type"),
    ] {
        let e = parse(&format!(r#"{{"{section}": {value}}}"#)).unwrap_err();
        assert!(
            matches!(e, ConfigError::Parse { .. }),
            "{section} {value}: {e}"
        );
        assert!(e.to_string().contains(needle), "{section} {value}: {e}");
    }
}

#[test]
fn cpu_config_is_taken_inline_or_from_a_file_as_firecracker_takes_it() {
    let template = r#"{"cpuid_modifiers": [{"leaf": "0x1", "subleaf": "0x0", "flags": 0,
        "modifiers": [{"register": "ecx", "bitmap": "0bxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx0"}]}]}"#;
    let inline = parse(&format!(r#"{{"cpu-config": {template}}}"#)).unwrap();
    assert!(inline.cpu_config.is_some());
    let dir = std::env::temp_dir().join(format!("teravm-cpu-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("t.json");
    std::fs::write(&file, template).unwrap();
    let by_path = parse(&format!(r#"{{"cpu-config": "{}"}}"#, file.display())).unwrap();
    assert_eq!(by_path.cpu_config, inline.cpu_config);
    assert!(parse(r#"{"cpu-config": null}"#)
        .unwrap()
        .cpu_config
        .is_none());
    let missing = dir.join("none.json");
    let e = parse(&format!(r#"{{"cpu-config": "{}"}}"#, missing.display())).unwrap_err();
    assert!(e.to_string().contains("cpu-config: cannot read"), "{e}");
    std::fs::write(&file, "{not json").unwrap();
    let e = parse(&format!(r#"{{"cpu-config": "{}"}}"#, file.display())).unwrap_err();
    assert!(e.to_string().contains("cpu-config \""), "{e}");
    assert!(!e.to_string().contains('\n'), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_hotplug_block_below_the_huge_page_is_refused_naming_both() {
    let with = |pages: &str, block: u32| {
        parse(&format!(
            r#"{{"machine-config": {{"vcpu_count": 1, "mem_size_mib": 2048, "huge_pages": "{pages}"}},
                "memory-hotplug": {{"total_size_mib": 4096, "block_size_mib": {block}, "slot_size_mib": 1024}}}}"#
        ))
    };
    let e = with("1G", 2).unwrap_err().to_string();
    assert!(
        e.contains("block_size_mib 2") && e.contains("1024 MiB") && e.contains("huge_pages"),
        "{e}"
    );
    with("1G", 1024).unwrap();
    with("2M", 2).unwrap();
    with("None", 2).unwrap();
    let m: MachineConfig =
        serde_json::from_str(r#"{"vcpu_count":1,"mem_size_mib":2048,"huge_pages":"1G"}"#).unwrap();
    assert!(super::check_hotplug_pages(&m, None).is_ok());
}
