//! Unit tests of the routing of `PUT /snapshot/create` and `PUT
//! /snapshot/load`: Firecracker's bodies, its texts for the memory source,
//! what teravm refuses by name, the other methods and paths.

use super::*;
use crate::snapshot::params::{MISSING_FIELD, TOO_MANY_FIELDS};
use crate::snapshot::{
    LoadSnapshotParams, MemBackend, MemBackendType, MemoryLoad, NetworkOverride, SnapshotType,
};

fn ok(path: &str, body: &str) -> VmmAction {
    route("PUT", path, body.as_bytes()).unwrap_or_else(|e| panic!("PUT {path} {body}: {e}"))
}

/// The 400 message of a request, checked to be one line.
fn bad(method: &str, path: &str, body: &str) -> String {
    match route(method, path, body.as_bytes()) {
        Err(e) if e.status() == 400 => {
            let m = e.to_string();
            assert!(!m.contains(['\n', '\r']), "{m}");
            m
        }
        other => panic!("{method} {path} {body}: expected 400, got {other:?}"),
    }
}

#[test]
fn create_takes_firecrackers_body() {
    match ok(
        "/snapshot/create",
        r#"{"snapshot_type": "Diff", "snapshot_path": "s", "mem_file_path": "m"}"#,
    ) {
        VmmAction::CreateSnapshot(p) => {
            assert_eq!(p.snapshot_type, SnapshotType::Diff);
            assert_eq!(p.snapshot_path, std::path::Path::new("s"));
            assert_eq!(p.mem_file_path, std::path::Path::new("m"));
        }
        other => panic!("{other:?}"),
    }
    match ok(
        "/snapshot/create",
        r#"{"snapshot_path": "s", "mem_file_path": "m"}"#,
    ) {
        VmmAction::CreateSnapshot(p) => assert_eq!(p.snapshot_type, SnapshotType::Full),
        other => panic!("{other:?}"),
    }
    for (body, needle) in [
        (
            r#"{"snapshot_path": "s", "mem_file_path": "m", "x": 1}"#,
            "unknown field `x`",
        ),
        (r#"{"snapshot_path": "s"}"#, "missing field `mem_file_path`"),
        (
            r#"{"snapshot_path": "s", "mem_file_path": "m", "snapshot_type": "Bad"}"#,
            "unknown variant `Bad`",
        ),
        ("", "needs a JSON body"),
        ("[]", "expected a JSON object"),
        ("{ not json }", "snapshot-create"),
    ] {
        let m = bad("PUT", "/snapshot/create", body);
        assert!(m.contains(needle), "{body}: {m}");
    }
}

#[test]
fn load_takes_firecrackers_body() {
    let body = r#"{"snapshot_path": "s", "mem_backend": {"backend_path": "m", "backend_type": "File"},
        "track_dirty_pages": true, "resume_vm": true,
        "network_overrides": [{"iface_id": "eth0", "host_dev_name": "tap1"}],
        "huge_pages": "Snapshot", "clock_realtime": false}"#;
    assert_eq!(
        ok("/snapshot/load", body),
        VmmAction::LoadSnapshot(LoadSnapshotParams {
            snapshot_path: "s".into(),
            mem_backend: MemBackend {
                backend_path: "m".into(),
                backend_type: MemBackendType::File,
            },
            track_dirty_pages: true,
            resume_vm: true,
            network_overrides: vec![NetworkOverride {
                iface_id: "eth0".into(),
                host_dev_name: "tap1".into(),
            }],
            memory_load: MemoryLoad::Lazy,
        })
    );
    // The deprecated fields: mem_file_path is a File backend,
    // enable_diff_snapshots is track_dirty_pages.
    match ok(
        "/snapshot/load",
        r#"{"snapshot_path": "s", "mem_file_path": "m", "enable_diff_snapshots": true}"#,
    ) {
        VmmAction::LoadSnapshot(p) => {
            assert_eq!(p.mem_backend.backend_type, MemBackendType::File);
            assert_eq!(p.mem_backend.backend_path, std::path::Path::new("m"));
            assert!(p.track_dirty_pages);
        }
        other => panic!("{other:?}"),
    }
    match ok(
        "/snapshot/load",
        r#"{"snapshot_path": "s", "mem_file_path": "m", "memory_load": "Eager"}"#,
    ) {
        VmmAction::LoadSnapshot(p) => assert_eq!(p.memory_load, MemoryLoad::Eager),
        other => panic!("{other:?}"),
    }
}

#[test]
fn load_memory_source_answers_with_firecrackers_texts() {
    let both = r#"{"snapshot_path": "s", "mem_file_path": "m", "mem_backend": {"backend_path": "m", "backend_type": "Uffd"}}"#;
    let m = bad("PUT", "/snapshot/load", both);
    assert!(m.contains(TOO_MANY_FIELDS), "{m}");
    let m = bad("PUT", "/snapshot/load", r#"{"snapshot_path": "s"}"#);
    assert!(m.contains(MISSING_FIELD), "{m}");
    let eager = r#"{"snapshot_path": "s", "mem_backend": {"backend_path": "u", "backend_type": "Uffd"}, "memory_load": "Eager"}"#;
    let m = bad("PUT", "/snapshot/load", eager);
    assert!(m.contains("memory_load") && m.contains("File"), "{m}");
}

#[test]
fn load_refuses_what_teravm_cannot_honour_by_name() {
    for (extra, field) in [
        (r#""vsock_override": {"uds_path": "v"}"#, "vsock_override"),
        (r#""huge_pages": "2M""#, "huge_pages"),
        (r#""clock_realtime": true"#, "clock_realtime"),
    ] {
        let body = format!(r#"{{"snapshot_path": "s", "mem_file_path": "m", {extra}}}"#);
        let m = bad("PUT", "/snapshot/load", &body);
        assert!(
            m.starts_with("PUT /snapshot/load: ")
                && m.contains(field)
                && m.contains("not supported by teravm"),
            "{m}"
        );
    }
}

#[test]
fn load_refuses_unknown_fields_as_firecracker_does() {
    for (body, needle) in [
        (
            r#"{"snapshot_path": "s", "mem_file_path": "m", "x": 1}"#,
            "unknown field `x`",
        ),
        (
            r#"{"snapshot_path": "s", "mem_backend": {"backend_path": "m", "backend_type": "File", "x": 1}}"#,
            "unknown field `x`",
        ),
        (
            r#"{"snapshot_path": "s", "mem_backend": {"backend_path": "m"}}"#,
            "missing field `backend_type`",
        ),
        (
            r#"{"snapshot_path": "s", "mem_file_path": "m", "huge_pages": "1M"}"#,
            "unknown variant `1M`",
        ),
        (r#"{"mem_file_path": "m"}"#, "missing field `snapshot_path`"),
        ("", "needs a JSON body"),
        ("[]", "expected a JSON object"),
    ] {
        let m = bad("PUT", "/snapshot/load", body);
        assert!(m.contains(needle), "{body}: {m}");
    }
    // Inside network_overrides Firecracker takes unknown fields: so does
    // teravm.
    ok(
        "/snapshot/load",
        r#"{"snapshot_path": "s", "mem_file_path": "m", "network_overrides": [{"iface_id": "eth0", "host_dev_name": "tap1", "x": 1}]}"#,
    );
}

#[test]
fn other_methods_and_paths() {
    for path in ["/snapshot/create", "/snapshot/load"] {
        for method in ["GET", "PATCH", "DELETE"] {
            let e = route(method, path, b"{}").unwrap_err();
            assert_eq!(e.status(), 405, "{method} {path}");
            assert!(matches!(
                e,
                RouteError::MethodNotAllowed { allow: "PUT", .. }
            ));
        }
    }
    // Firecracker's answer to a PUT without the operation.
    for path in ["/snapshot", "/snapshot/"] {
        let m = bad("PUT", path, "{}");
        assert!(m.contains("missing snapshot operation type"), "{m}");
    }
    for (method, path) in [
        ("GET", "/snapshot"),
        ("PUT", "/snapshot/foo"),
        ("PUT", "/snapshot/create/x"),
    ] {
        assert_eq!(
            route(method, path, b"{}").unwrap_err().status(),
            404,
            "{method} {path}"
        );
    }
}

#[test]
fn the_actions_name_their_request() {
    let create = ok(
        "/snapshot/create",
        r#"{"snapshot_path": "s", "mem_file_path": "m"}"#,
    );
    assert_eq!(create.method_and_path(), ("PUT", "/snapshot/create"));
    assert_eq!(
        create.latency(),
        Some(crate::metrics::Latency::FullCreateSnapshot)
    );
    assert!(!create.configures_boot());
    let load = ok(
        "/snapshot/load",
        r#"{"snapshot_path": "s", "mem_file_path": "m"}"#,
    );
    assert_eq!(load.method_and_path(), ("PUT", "/snapshot/load"));
    assert_eq!(load.latency(), Some(crate::metrics::Latency::LoadSnapshot));
    assert!(!load.configures_boot());
    // Firecracker's boot_path: these configure the boot, these do not.
    assert!(ok("/boot-source", r#"{"kernel_image_path": "k"}"#).configures_boot());
    assert!(ok(
        "/machine-config",
        r#"{"vcpu_count": 1, "mem_size_mib": 128}"#
    )
    .configures_boot());
    assert!(!ok("/logger", r#"{"level": "Info"}"#).configures_boot());
    assert!(!ok("/mmds", r#"{"a": 1}"#).configures_boot());
    assert!(!ok("/metrics", r#"{"metrics_path": "/tmp/m"}"#).configures_boot());
}
