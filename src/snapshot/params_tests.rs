use super::*;

fn load(body: &str) -> Result<LoadSnapshotParams, LoadBodyError> {
    serde_json::from_str::<LoadSnapshotConfig>(body)
        .unwrap_or_else(|e| panic!("{body}: {e}"))
        .resolve()
}

#[test]
fn create_body_is_firecrackers() {
    let c: CreateSnapshotParams =
        serde_json::from_str(r#"{"snapshot_path": "s", "mem_file_path": "m"}"#).unwrap();
    assert_eq!(c.snapshot_type, SnapshotType::Full);
    let c: CreateSnapshotParams = serde_json::from_str(
        r#"{"snapshot_type": "Diff", "snapshot_path": "s", "mem_file_path": "m"}"#,
    )
    .unwrap();
    assert_eq!(c.snapshot_type, SnapshotType::Diff);
    for bad in [
        r#"{"snapshot_path": "s"}"#,
        r#"{"snapshot_path": "s", "mem_file_path": "m", "x": 1}"#,
        r#"{"snapshot_path": "s", "mem_file_path": "m", "snapshot_type": "Bad"}"#,
    ] {
        assert!(
            serde_json::from_str::<CreateSnapshotParams>(bad).is_err(),
            "{bad}"
        );
    }
}

#[test]
fn mem_file_path_is_a_file_backend_and_deprecated() {
    let body = r#"{"snapshot_path": "s", "mem_file_path": "m", "resume_vm": true}"#;
    let c: LoadSnapshotConfig = serde_json::from_str(body).unwrap();
    assert!(c.is_deprecated());
    let p = c.resolve().unwrap();
    assert_eq!(
        p,
        LoadSnapshotParams {
            snapshot_path: "s".into(),
            mem_backend: MemBackend {
                backend_path: "m".into(),
                backend_type: MemBackendType::File,
            },
            track_dirty_pages: false,
            resume_vm: true,
            network_overrides: vec![],
            memory_load: MemoryLoad::Lazy,
        }
    );
}

#[test]
fn mem_backend_and_track_dirty_pages() {
    let body = r#"{"snapshot_path": "s", "mem_backend": {"backend_path": "u.sock", "backend_type": "Uffd"}, "track_dirty_pages": true}"#;
    let c: LoadSnapshotConfig = serde_json::from_str(body).unwrap();
    assert!(!c.is_deprecated());
    let p = c.resolve().unwrap();
    assert_eq!(p.mem_backend.backend_type, MemBackendType::Uffd);
    assert!(p.track_dirty_pages);
    // The deprecated spelling, alone, means the same and is deprecated.
    let body = r#"{"snapshot_path": "s", "mem_backend": {"backend_path": "m", "backend_type": "File"}, "enable_diff_snapshots": true}"#;
    let c: LoadSnapshotConfig = serde_json::from_str(body).unwrap();
    assert!(c.is_deprecated());
    assert!(c.resolve().unwrap().track_dirty_pages);
}

#[test]
fn exactly_one_memory_source() {
    let both = r#"{"snapshot_path": "s", "mem_file_path": "m", "mem_backend": {"backend_path": "m", "backend_type": "File"}}"#;
    assert_eq!(load(both), Err(LoadBodyError::TooManyFields));
    assert_eq!(
        load(r#"{"snapshot_path": "s"}"#),
        Err(LoadBodyError::MissingField)
    );
    // Firecracker's texts, for clients that match them.
    assert_eq!(LoadBodyError::TooManyFields.to_string(), TOO_MANY_FIELDS);
    assert_eq!(LoadBodyError::MissingField.to_string(), MISSING_FIELD);
}

#[test]
fn what_teravm_cannot_honour_is_refused_by_name() {
    let base = r#""snapshot_path": "s", "mem_file_path": "m""#;
    for (extra, field) in [
        (
            r#""vsock_override": {"uds_path": "v.sock"}"#,
            "vsock_override",
        ),
        (r#""huge_pages": "2M""#, "huge_pages"),
        (r#""huge_pages": "None""#, "huge_pages"),
        (r#""huge_pages": "Transparent""#, "huge_pages"),
        (r#""clock_realtime": true"#, "clock_realtime"),
    ] {
        let e = load(&format!("{{{base}, {extra}}}")).unwrap_err();
        assert!(
            matches!(e, LoadBodyError::NotSupported(_)) && e.to_string().contains(field),
            "{extra}: {e}"
        );
        assert!(e.to_string().contains("not supported by teravm"), "{e}");
    }
    // The defaults are taken.
    load(&format!(
        r#"{{{base}, "huge_pages": "Snapshot", "clock_realtime": false}}"#
    ))
    .unwrap();
}

#[test]
fn memory_load_eager_needs_a_file() {
    let p =
        load(r#"{"snapshot_path": "s", "mem_file_path": "m", "memory_load": "Eager"}"#).unwrap();
    assert_eq!(p.memory_load, MemoryLoad::Eager);
    let uffd = r#"{"snapshot_path": "s", "mem_backend": {"backend_path": "u", "backend_type": "Uffd"}, "memory_load": "Eager"}"#;
    let e = load(uffd).unwrap_err();
    assert_eq!(e, LoadBodyError::EagerNeedsFile);
    assert!(e.to_string().contains("File"), "{e}");
    let lazy = uffd.replace("Eager", "Lazy");
    assert_eq!(load(&lazy).unwrap().memory_load, MemoryLoad::Lazy);
}

#[test]
fn unknown_fields_refused_as_firecracker_refuses_them() {
    for bad in [
        r#"{"snapshot_path": "s", "mem_file_path": "m", "x": 1}"#,
        r#"{"snapshot_path": "s", "mem_backend": {"backend_path": "m", "backend_type": "File", "x": 1}}"#,
        r#"{"snapshot_path": "s", "mem_backend": {"backend_path": "m", "backend_type": "Foo"}}"#,
        r#"{"snapshot_path": "s", "mem_file_path": "m", "huge_pages": "1M"}"#,
        r#"{"mem_file_path": "m"}"#,
    ] {
        assert!(
            serde_json::from_str::<LoadSnapshotConfig>(bad).is_err(),
            "{bad}"
        );
    }
    // Inside network_overrides and vsock_override Firecracker takes them.
    let p = load(
        r#"{"snapshot_path": "s", "mem_file_path": "m", "network_overrides": [{"iface_id": "eth0", "host_dev_name": "tap1", "x": 1}]}"#,
    )
    .unwrap();
    assert_eq!(
        p.network_overrides,
        vec![NetworkOverride {
            iface_id: "eth0".into(),
            host_dev_name: "tap1".into()
        }]
    );
    let c: LoadSnapshotConfig = serde_json::from_str(
        r#"{"snapshot_path": "s", "mem_file_path": "m", "vsock_override": {"uds_path": "v", "x": 1}}"#,
    )
    .unwrap();
    assert!(c.vsock_override.is_some());
}
