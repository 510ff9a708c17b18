//! The fuzz targets' harnesses (fuzz_targets/*.rs call them) and the checks
//! they share. The device harnesses build guest memory and queues from the
//! input, as Cloud Hypervisor's do, outside the shipped library:
//! [`balloon`] (the balloon's queues and the virtio-mmio transport),
//! [`mem`] (virtio-mem's queue),
//! [`block`], [`net`], [`vsock`], over the ring builder in [`driver`].
//! Their committed seeds replay as this crate's tests (`seeds`).
//! Here: what must hold of every answer of `teravm::api::routing::route`,
//! beyond "it did not panic".

pub mod balloon;
pub mod block;
pub mod driver;
pub mod mem;
pub mod net;
mod seeds;
pub mod vsock;

use teravm::api::routing::{route, RouteError};
use teravm::api::{ReclaimMode, VmmAction};

/// The resources that take a `PUT` body, in the order `api_body` picks them.
pub const PUT_PATHS: [&str; 5] = [
    "/machine-config",
    "/boot-source",
    "/memory",
    "/reclaim",
    "/actions",
];

/// Calls `route` and checks its answer:
/// - an error maps to 400, 404 or 405, and a body error is one line;
/// - an action is the one the method and path name, its config validates,
///   and the config serialized back to JSON routes to the same action.
pub fn route_and_check(method: &str, path: &str, body: &[u8]) {
    match route(method, path, body) {
        Err(e) => {
            let status = e.status();
            assert!(matches!(status, 400 | 404 | 405), "{e:?} -> {status}");
            if let RouteError::BadBody(msg)
            | RouteError::BadId(msg)
            | RouteError::Refused { reason: msg, .. } = &e
            {
                assert!(
                    !msg.contains(['\r', '\n']),
                    "a body error is not one line: {msg:?}"
                );
            }
            if let RouteError::MethodNotAllowed { allow, .. } = &e {
                assert!(!allow.split(", ").any(|m| m == method), "{e:?}");
            }
        }
        Ok(action) => {
            let resent = match (&action, method, path) {
                (VmmAction::GetInstanceInfo, "GET", "/")
                | (VmmAction::GetMachineConfig, "GET", "/machine-config")
                | (VmmAction::GetMemory, "GET", "/memory")
                | (VmmAction::GetReclaim, "GET", "/reclaim")
                | (VmmAction::GetVmConfig, "GET", "/vm/config")
                | (VmmAction::GetVersion, "GET", "/version")
                | (VmmAction::GetBalloon, "GET", "/balloon")
                | (VmmAction::GetBalloonStatistics, "GET", "/balloon/statistics")
                | (VmmAction::GetMmds, "GET", "/mmds")
                | (VmmAction::GetHotplugMemory, "GET", "/hotplug/memory") => {
                    assert!(body.is_empty(), "GET with a body: {action:?}");
                    return;
                }
                // Issue 26's and 27's bodies: routed to their own path is
                // what is checked; they are not re-sent (a CPU template and
                // the VM state are not serialized back).
                (VmmAction::PutMmds(_), "PUT", "/mmds")
                | (VmmAction::PatchMmds(_), "PATCH", "/mmds")
                | (VmmAction::PutMmdsConfig(_), "PUT", "/mmds/config")
                | (VmmAction::PatchVm(_), "PATCH", "/vm")
                | (VmmAction::PutCpuConfig(_), "PUT", "/cpu-config")
                | (VmmAction::PutEntropy(_), "PUT", "/entropy")
                | (VmmAction::PutSerial(_), "PUT", "/serial")
                | (VmmAction::PutHotplugMemory(_), "PUT", "/hotplug/memory")
                | (VmmAction::PatchHotplugMemory(_), "PATCH", "/hotplug/memory") => return,
                (VmmAction::PutMachineConfig(c), "PUT", "/machine-config") => {
                    c.validate().expect("routed machine-config validates");
                    serde_json::to_vec(c).unwrap()
                }
                (VmmAction::PutBootSource(c), "PUT", "/boot-source") => {
                    c.validate().expect("routed boot-source validates");
                    serde_json::to_vec(c).unwrap()
                }
                (VmmAction::PutMemory(c), "PUT", "/memory") => {
                    c.validate().expect("routed memory validates");
                    serde_json::to_vec(c).unwrap()
                }
                (VmmAction::PutReclaim(c), "PUT", "/reclaim") => {
                    c.validate().expect("routed reclaim validates");
                    serde_json::to_vec(c).unwrap()
                }
                (VmmAction::PatchMachineConfig(c), "PATCH", "/machine-config") => {
                    serde_json::to_vec(c).unwrap()
                }
                (VmmAction::PutLogger(c), "PUT", "/logger") => {
                    c.validate().expect("routed logger validates");
                    serde_json::to_vec(c).unwrap()
                }
                (VmmAction::PutMetrics(c), "PUT", "/metrics") => {
                    c.validate().expect("routed metrics validates");
                    serde_json::to_vec(c).unwrap()
                }
                (VmmAction::PutBalloon(c), "PUT", "/balloon") => {
                    c.validate().expect("routed balloon validates");
                    serde_json::to_vec(c).unwrap()
                }
                (VmmAction::PatchBalloon(c), "PATCH", "/balloon") => {
                    c.validate().expect("routed balloon update validates");
                    serde_json::to_vec(c).unwrap()
                }
                (VmmAction::PatchBalloonStatistics(c), "PATCH", "/balloon/statistics") => {
                    serde_json::to_vec(c).unwrap()
                }
                (VmmAction::PutDrive(c), "PUT", p) if p == format!("/drives/{}", c.drive_id) => {
                    c.validate().expect("routed drive validates");
                    serde_json::to_vec(c).unwrap()
                }
                (VmmAction::PatchDrive(c), "PATCH", p)
                    if p == format!("/drives/{}", c.drive_id) =>
                {
                    c.validate().expect("routed drive update validates");
                    serde_json::to_vec(c).unwrap()
                }
                (VmmAction::PutNetworkInterface(c), "PUT", p)
                    if p == format!("/network-interfaces/{}", c.iface_id) =>
                {
                    c.validate().expect("routed network interface validates");
                    serde_json::to_vec(c).unwrap()
                }
                (VmmAction::PatchNetworkInterface(c), "PATCH", p)
                    if p == format!("/network-interfaces/{}", c.iface_id) =>
                {
                    c.validate()
                        .expect("routed network interface update validates");
                    serde_json::to_vec(c).unwrap()
                }
                (VmmAction::PutVsock(c), "PUT", "/vsock") => {
                    c.validate().expect("routed vsock validates");
                    serde_json::to_vec(c).unwrap()
                }
                (VmmAction::FlushMetrics, "PUT", "/actions") => {
                    br#"{"action_type":"FlushMetrics"}"#.to_vec()
                }
                (VmmAction::InstanceStart, "PUT", "/actions") => {
                    br#"{"action_type":"InstanceStart"}"#.to_vec()
                }
                (VmmAction::SendCtrlAltDel, "PUT", "/actions") => {
                    br#"{"action_type":"SendCtrlAltDel"}"#.to_vec()
                }
                (VmmAction::Shutdown(mode), "PUT", "/actions") => {
                    let mode = match mode {
                        ReclaimMode::Sync => "sync",
                        ReclaimMode::Async => "async",
                    };
                    format!(r#"{{"action_type":"Shutdown","reclaim":"{mode}"}}"#).into_bytes()
                }
                _ => panic!("{method} {path} routed to {action:?}"),
            };
            assert_eq!(
                route(method, path, &resent).as_ref(),
                Ok(&action),
                "the action's own JSON does not route back to it: {}",
                String::from_utf8_lossy(&resent)
            );
        }
    }
}
