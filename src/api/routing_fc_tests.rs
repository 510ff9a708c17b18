//! Unit tests of the routing of Firecracker's resources: `/version`,
//! `PATCH /machine-config`, `/logger`, `/metrics`, `FlushMetrics`, the
//! Firecracker-only machine-config fields, and the resources of devices
//! teravm lacks. The snapshot resources: `routing_snapshot_tests.rs`.

use std::path::PathBuf;

use super::*;
use crate::config::HugePages;
use crate::config::LogLevel;

fn ok(method: &str, path: &str, body: &str) -> VmmAction {
    route(method, path, body.as_bytes()).unwrap_or_else(|e| panic!("{method} {path} {body}: {e}"))
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
fn version() {
    assert_eq!(ok("GET", "/version", ""), VmmAction::GetVersion);
    assert!(bad("GET", "/version", "{}").contains("takes no body"));
    assert_eq!(route("PUT", "/version", b"{}").unwrap_err().status(), 405);
}

#[test]
fn machine_config_takes_firecrackers_fields() {
    // firecracker-go-sdk's body: smt and track_dirty_pages always sent.
    let a = ok(
        "PUT",
        "/machine-config",
        r#"{"vcpu_count": 2, "mem_size_mib": 512, "smt": false, "track_dirty_pages": false}"#,
    );
    assert_eq!(
        a,
        VmmAction::PutMachineConfig(MachineConfig {
            vcpu_count: 2,
            mem_size_mib: 512,
            huge_pages: HugePages::Transparent,
            ..MachineConfig::default()
        })
    );
    for body in [
        r#"{"vcpu_count": 1, "mem_size_mib": 256, "cpu_template": "None"}"#,
        r#"{"vcpu_count": 1, "mem_size_mib": 256, "cpu_template": null}"#,
        r#"{"vcpu_count": 1, "mem_size_mib": 256, "huge_pages": "None", "smt": false}"#,
    ] {
        assert!(matches!(
            ok("PUT", "/machine-config", body),
            VmmAction::PutMachineConfig(_)
        ));
    }
}

#[test]
fn firecracker_fields_are_taken_and_bounded_as_firecracker_bounds_them() {
    match ok(
        "PUT",
        "/machine-config",
        r#"{"vcpu_count": 2, "mem_size_mib": 512, "smt": true, "track_dirty_pages": true,
            "cpu_template": "T2"}"#,
    ) {
        VmmAction::PutMachineConfig(m) => {
            assert!(m.smt && m.track_dirty_pages);
            assert_eq!(m.cpu_template, crate::config::CpuTemplate::T2);
        }
        other => panic!("{other:?}"),
    }
    let cases = [
        (
            r#""mem_size_mib": 1, "vcpu_count": 33"#,
            "machine-config.vcpu_count",
            "1..=32",
        ),
        (
            r#""mem_size_mib": 1, "vcpu_count": 3, "smt": true"#,
            "machine-config.vcpu_count",
            "smt",
        ),
        (r#""cpu_template": "T3""#, "cpu_template", "unknown variant"),
        (r#""smt": "yes""#, "smt", "invalid type"),
        (r#""cpu_template": 3"#, "machine-config.cpu_template", ""),
    ];
    for (field, names, reason) in cases {
        let body = if field.contains("vcpu_count") {
            format!(
                "{{{}}}",
                field.replace(r#""mem_size_mib": 1"#, r#""mem_size_mib": 512"#)
            )
        } else {
            format!(r#"{{"vcpu_count": 2, "mem_size_mib": 512, {field}}}"#)
        };
        let m = bad("PUT", "/machine-config", &body);
        assert!(m.contains(names) && m.contains(reason), "{body}: {m}");
    }
    // PATCH: validated against the configuration in force.
    match ok("PATCH", "/machine-config", r#"{"smt": true}"#) {
        VmmAction::PatchMachineConfig(p) => {
            let three = MachineConfig {
                vcpu_count: 3,
                ..MachineConfig::default()
            };
            let e = p.apply(&three).unwrap_err().to_string();
            assert!(e.contains("vcpu_count") && e.contains("smt"), "{e}");
            assert!(p.apply(&MachineConfig::default()).unwrap().smt);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn patch_machine_config() {
    match ok("PATCH", "/machine-config", r#"{"mem_size_mib": 1024}"#) {
        VmmAction::PatchMachineConfig(p) => {
            assert_eq!(p.mem_size_mib, Some(1024));
            assert_eq!(p.vcpu_count, None);
            let cur = MachineConfig::default();
            let next = p.apply(&cur).unwrap();
            assert_eq!((next.vcpu_count, next.mem_size_mib), (cur.vcpu_count, 1024));
        }
        other => panic!("{other:?}"),
    }
    // Validated as a whole: 2M pages need a size that is a multiple of 2 MiB.
    match ok("PATCH", "/machine-config", r#"{"huge_pages": "2M"}"#) {
        VmmAction::PatchMachineConfig(p) => {
            let odd = MachineConfig {
                mem_size_mib: 129,
                ..MachineConfig::default()
            };
            let e = p.apply(&odd).unwrap_err().to_string();
            assert!(e.contains("machine-config.mem_size_mib"), "{e}");
            assert!(p.apply(&MachineConfig::default()).is_ok());
        }
        other => panic!("{other:?}"),
    }
    assert!(bad("PATCH", "/machine-config", "{}").contains("changes nothing"));
    assert!(bad("PATCH", "/machine-config", "").contains("needs a JSON body"));
    assert!(bad("PATCH", "/machine-config", r#"{"vcpus": 2}"#).contains("unknown field `vcpus`"));
    assert!(bad("PATCH", "/machine-config", r#"{"vcpu_count": -1}"#).contains("vcpu_count"));
    assert!(bad("PATCH", "/machine-config", "[1]").contains("expected a JSON object"));
    assert_eq!(
        route("PATCH", "/boot-source", b"{}").unwrap_err().status(),
        405
    );
}

#[test]
fn logger() {
    // firecracker-go-sdk's setupLogging body.
    match ok(
        "PUT",
        "/logger",
        r#"{"log_path": "/tmp/fc.log", "level": "Debug", "show_level": true, "show_log_origin": false}"#,
    ) {
        VmmAction::PutLogger(c) => {
            assert_eq!(c.log_path, Some(PathBuf::from("/tmp/fc.log")));
            assert_eq!(c.level, Some(LogLevel(log::LevelFilter::Debug)));
            assert_eq!((c.show_level, c.show_log_origin), (Some(true), Some(false)));
        }
        other => panic!("{other:?}"),
    }
    for level in ["Warning", "WARN", "info", "Off", "TRACE"] {
        let body = format!(r#"{{"level": "{level}"}}"#);
        assert!(matches!(
            ok("PUT", "/logger", &body),
            VmmAction::PutLogger(_)
        ));
    }
    match ok("PUT", "/logger", r#"{"module": "teravm::vmm"}"#) {
        VmmAction::PutLogger(c) => assert_eq!(c.module.as_deref(), Some("teravm::vmm")),
        other => panic!("{other:?}"),
    }
    let cases = [
        (r#"{"level": "Loud"}"#, "not a log level"),
        (r#"{"level": 3}"#, "invalid type"),
        (r#"{"log_path": ""}"#, "logger.log_path"),
        (r#"{"module": "a b"}"#, "logger.module"),
        (r#"{"show_level": "yes"}"#, "show_level"),
        (r#"{"colour": true}"#, "unknown field `colour`"),
        ("", "needs a JSON body"),
    ];
    for (body, needle) in cases {
        let m = bad("PUT", "/logger", body);
        assert!(m.contains(needle), "{body}: {m}");
    }
    assert_eq!(route("GET", "/logger", b"").unwrap_err().status(), 405);
}

#[test]
fn metrics_and_flush() {
    assert_eq!(
        ok("PUT", "/metrics", r#"{"metrics_path": "/tmp/m.fifo"}"#),
        VmmAction::PutMetrics(crate::config::MetricsConfig {
            metrics_path: "/tmp/m.fifo".into()
        })
    );
    for (body, needle) in [
        ("{}", "missing field `metrics_path`"),
        (r#"{"metrics_path": ""}"#, "metrics.metrics_path"),
        (r#"{"metrics_path": 1}"#, "invalid type"),
        (r#"{"metrics_path": "/m", "x": 1}"#, "unknown field `x`"),
    ] {
        let m = bad("PUT", "/metrics", body);
        assert!(m.contains(needle), "{body}: {m}");
    }
    assert_eq!(
        ok("PUT", "/actions", r#"{"action_type": "FlushMetrics"}"#),
        VmmAction::FlushMetrics
    );
    let m = bad(
        "PUT",
        "/actions",
        r#"{"action_type": "FlushMetrics", "reclaim": "sync"}"#,
    );
    assert!(m.contains("only allowed with"), "{m}");
}

#[test]
fn only_whole_path_segments_are_resources() {
    // Plain unknown resources.
    for path in ["/drivesx", "/vsockx", "/mmdsx", "/vmx", "/snapshotx"] {
        assert_eq!(
            route("PUT", path, b"{}").unwrap_err().status(),
            404,
            "{path}"
        );
    }
}

#[test]
fn requests_and_failures_are_counted() {
    let (req0, fail0) = crate::metrics::counts("PUT", "/drives");
    let _ = route("PUT", "/drives/x", b"{}");
    let _ = route("PUT", "/drives/y", b"{}");
    let (req1, fail1) = crate::metrics::counts("PUT", "/drives");
    // Other tests run at the same time and may add to them, never less.
    assert!(req1 >= req0 + 2 && fail1 >= fail0 + 2);
    let (v0, f0) = crate::metrics::counts("GET", "/version");
    let _ = route("GET", "/version", b"");
    let (v1, f1) = crate::metrics::counts("GET", "/version");
    assert!(v1 > v0);
    let _ = (f0, f1);
}

#[test]
fn patch_vm_and_put_cpu_config() {
    use crate::api::action::{VmStateChange, VmStateWanted};
    assert_eq!(
        ok("PATCH", "/vm", r#"{"state": "Paused"}"#),
        VmmAction::PatchVm(VmStateChange {
            state: VmStateWanted::Paused
        })
    );
    assert_eq!(
        ok("PATCH", "/vm", r#"{"state": "Resumed"}"#),
        VmmAction::PatchVm(VmStateChange {
            state: VmStateWanted::Resumed
        })
    );
    for body in [
        r#"{"state": "Running"}"#,
        "{}",
        r#"{"state": "Paused", "x": 1}"#,
        "",
    ] {
        assert!(bad("PATCH", "/vm", body).contains("vm"), "{body}");
    }
    assert_eq!(route("PUT", "/vm", b"{}").unwrap_err().status(), 405);
    assert_eq!(route("GET", "/vm", b"").unwrap_err().status(), 405);
    match ok(
        "PUT",
        "/cpu-config",
        r#"{"cpuid_modifiers": [{"leaf": "0x1", "subleaf": "0x0", "flags": 0,
            "modifiers": [{"register": "ecx", "bitmap": "0bx0xxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}]}]}"#,
    ) {
        VmmAction::PutCpuConfig(t) => assert_eq!(t.cpuid_modifiers[0].leaf, 1),
        other => panic!("{other:?}"),
    }
    let m = bad("PUT", "/cpu-config", r#"{"kvm_capabilities": ["171"]}"#);
    assert!(m.contains("kvm_capabilities"), "{m}");
    let m = bad("PUT", "/cpu-config", r#"{"reg_modifiers": []}"#);
    assert!(m.contains("reg_modifiers"), "{m}");
}
