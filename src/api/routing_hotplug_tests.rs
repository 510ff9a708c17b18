//! Unit tests of the routing of Firecracker's `/hotplug/memory` on raw
//! JSON: `PUT` with Firecracker's checks and defaults (and teravm's bound),
//! `PATCH` with the requested size, `GET`, and bad bodies (400 with one
//! line, never a panic).

use super::*;
use crate::config::MemoryHotplugSizeUpdate;

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

const P: &str = "/hotplug/memory";

#[test]
fn put_hotplug_memory() {
    assert_eq!(
        ok(
            "PUT",
            P,
            r#"{"total_size_mib": 1024, "slot_size_mib": 128, "block_size_mib": 2}"#
        ),
        VmmAction::PutHotplugMemory(MemoryHotplugConfig {
            total_size_mib: 1024,
            block_size_mib: 2,
            slot_size_mib: 128,
        })
    );
    // Firecracker's defaults: 2 MiB blocks, 128 MiB slots.
    assert_eq!(
        ok("PUT", P, r#"{"total_size_mib": 2048}"#),
        VmmAction::PutHotplugMemory(MemoryHotplugConfig {
            total_size_mib: 2048,
            block_size_mib: 2,
            slot_size_mib: 128,
        })
    );
    for (body, says) in [
        (
            r#"{"total_size_mib": 1024, "block_size_mib": 1}"#,
            "Block size must not be lower than 2 MiB",
        ),
        (
            r#"{"total_size_mib": 1024, "block_size_mib": 6}"#,
            "Block size must be a power of 2",
        ),
        (
            r#"{"total_size_mib": 1024, "slot_size_mib": 64}"#,
            "Slot size must not be lower than 128 MiB",
        ),
        (
            r#"{"total_size_mib": 1024, "block_size_mib": 128, "slot_size_mib": 192}"#,
            "Slot size must be a multiple of block size (128 MiB)",
        ),
        (
            r#"{"total_size_mib": 0}"#,
            "Total size must not be lower than slot size (128 MiB)",
        ),
        (
            r#"{"total_size_mib": 1000}"#,
            "Total size must be a multiple of slot size (128 MiB)",
        ),
        (r#"{"total_size_mib": 4294967168}"#, "64 TiB"),
        (
            r#"{"total_size_mib": 4294967296}"#,
            "memory-hotplug.total_size_mib",
        ),
        (
            r#"{"total_size_mib": -128}"#,
            "memory-hotplug.total_size_mib",
        ),
        (
            r#"{"total_size_mib": "1024"}"#,
            "memory-hotplug.total_size_mib",
        ),
        (
            r#"{"total_size_mib": 1024, "requested_size_mib": 0}"#,
            "unknown field `requested_size_mib`",
        ),
        (r#"{}"#, "missing field `total_size_mib`"),
        ("", "needs a JSON body"),
        ("[1024, 2, 128]", "expected a JSON object"),
        ("{ not json }", "invalid memory-hotplug body"),
        (
            "{\"total_size_mib\": 1024,\n\"x\n\": 1}",
            "invalid memory-hotplug body",
        ),
    ] {
        let m = bad("PUT", P, body);
        assert!(m.contains(says), "{body}: {m}");
    }
}

#[test]
fn patch_and_get_hotplug_memory() {
    assert_eq!(
        ok("PATCH", P, r#"{"requested_size_mib": 256}"#),
        VmmAction::PatchHotplugMemory(MemoryHotplugSizeUpdate {
            requested_size_mib: 256
        })
    );
    // Against the region only the devices can check (above the total,
    // not whole blocks): routed, refused by the VMM.
    assert_eq!(
        ok("PATCH", P, r#"{"requested_size_mib": 3}"#),
        VmmAction::PatchHotplugMemory(MemoryHotplugSizeUpdate {
            requested_size_mib: 3
        })
    );
    for (body, says) in [
        (
            r#"{"requested_size_mib": -1}"#,
            "memory-hotplug.requested_size_mib",
        ),
        (
            r#"{"requested_size_mib": 1.5}"#,
            "memory-hotplug.requested_size_mib",
        ),
        (
            r#"{"requested_size_mib": 1, "total_size_mib": 1024}"#,
            "unknown field",
        ),
        ("{}", "missing field `requested_size_mib`"),
        ("", "needs a JSON body"),
        ("null", "expected a JSON object"),
    ] {
        let m = bad("PATCH", P, body);
        assert!(m.contains(says), "{body}: {m}");
    }
    assert_eq!(ok("GET", P, ""), VmmAction::GetHotplugMemory);
    assert!(bad("GET", P, "{}").contains("takes no body"));
}

#[test]
fn hotplug_memory_methods_and_paths() {
    let e = route("DELETE", P, b"").unwrap_err();
    assert_eq!(e.status(), 405);
    assert!(
        matches!(
            e,
            RouteError::MethodNotAllowed {
                allow: "GET, PUT, PATCH",
                ..
            }
        ),
        "{e:?}"
    );
    for path in [
        "/hotplug",
        "/hotplug/memoryx",
        "/hotplug/memory/0",
        "/hotplug/cpu",
    ] {
        assert_eq!(
            route("PUT", path, b"{}").unwrap_err().status(),
            404,
            "{path}"
        );
    }
    let (req0, fail0) = crate::metrics::counts("PATCH", P);
    let _ = route("PATCH", P, b"{}");
    let (req1, fail1) = crate::metrics::counts("PATCH", P);
    assert!(req1 > req0 && fail1 > fail0);
    for a in [
        VmmAction::GetHotplugMemory,
        VmmAction::PatchHotplugMemory(MemoryHotplugSizeUpdate {
            requested_size_mib: 0,
        }),
    ] {
        assert_eq!(a.method_and_path().1, P);
    }
}
