//! The walk's cases of Firecracker's `/hotplug/memory` (virtio-mem): the
//! region (`PUT`, before the start only), the requested size (`PATCH`) and
//! the status (`GET`), both only once the microVM runs.

use super::cases::body_cases;
use super::{req, Expect, Walk};

const P: &str = "/hotplug/memory";

/// `GET`, `PUT` (valid, Firecracker's checks, teravm's bound, back to a
/// valid region), `PATCH` (valid, above the total, not whole blocks),
/// `GET` again, and a wrong method. Before the start the last valid `PUT`
/// leaves a 1024 MiB region configured, so after the start the devices
/// exist.
pub fn hotplug_cases(w: &mut Walk) {
    let get = format!("GET {P}");
    w.case(req(&get, "valid", "GET", P, None));
    body_cases(
        w,
        "PUT",
        P,
        r#"{"total_size_mib": 1024, "slot_size_mib": 128, "block_size_mib": 2}"#,
        &[
            (
                "out of range (block_size_mib 1)",
                r#"{"total_size_mib": 1024, "block_size_mib": 1}"#,
            ),
            (
                "out of range (block_size_mib 6, not a power of 2)",
                r#"{"total_size_mib": 1024, "block_size_mib": 6}"#,
            ),
            (
                "out of range (slot_size_mib 64)",
                r#"{"total_size_mib": 1024, "slot_size_mib": 64}"#,
            ),
            (
                "out of range (slot_size_mib 384, not whole 256 MiB blocks)",
                r#"{"total_size_mib": 1536, "block_size_mib": 256, "slot_size_mib": 384}"#,
            ),
            (
                "out of range (total_size_mib 0)",
                r#"{"total_size_mib": 0}"#,
            ),
            (
                "out of range (total_size_mib 1000, not whole slots)",
                r#"{"total_size_mib": 1000}"#,
            ),
            (
                "out of range (total_size_mib over u32)",
                r#"{"total_size_mib": 4294967296}"#,
            ),
            (
                "total_size_mib 4294967168 (above teravm's 64 TiB)",
                r#"{"total_size_mib": 4294967168}"#,
            ),
            (
                "valid with the defaults (total_size_mib only)",
                r#"{"total_size_mib": 1024}"#,
            ),
        ],
    );
    body_cases(
        w,
        "PATCH",
        P,
        r#"{"requested_size_mib": 256}"#,
        &[
            (
                "out of range (requested_size_mib 2048, above total_size_mib)",
                r#"{"requested_size_mib": 2048}"#,
            ),
            (
                "out of range (requested_size_mib 3, not whole blocks)",
                r#"{"requested_size_mib": 3}"#,
            ),
        ],
    );
    w.case(req(&get, "valid (after the PATCH)", "GET", P, None));
    let mut r = req(&format!("DELETE {P}"), "wrong method", "DELETE", P, None);
    r.expect = Expect::Refused;
    w.case(r);
}
