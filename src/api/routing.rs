//! From a method, a path and a body to a [`VmmAction`]: the routing table,
//! and the parsing and validation of request bodies (in the API thread, so a
//! malformed body never reaches the VMM).
//!
//! Every body error is one line that names the field or the problem, e.g.
//! `invalid machine-config body: machine-config.vcpu_count: invalid type: ...`.
//!
//! The resources of one device among several take its id as the last path
//! segment (`/drives/{drive_id}`, `/network-interfaces/{iface_id}`); the id
//! must be a valid id ([`check_id`]) and equal the body's, as in
//! Firecracker, or the answer is 400 ([`RouteError::BadId`]).
//!
//! `PUT /snapshot/create` and `PUT /snapshot/load` take Firecracker's
//! bodies ([`crate::snapshot::params`]: the load body's memory source
//! resolved, with Firecracker's texts for both and neither); a load body
//! field teravm cannot honour answers 400 naming it ([`RouteError::NotSupported`]),
//! and a deprecated one is logged and counted as Firecracker does. `PUT
//! /snapshot` without the operation answers 400 as Firecracker does. The
//! balloon's free page hinting endpoints
//! (`/balloon/hinting/*`) answer 400 with the reason teravm refuses hinting
//! (the device's [`BalloonError::HintingNotSupported`]). Every request is
//! counted in [`crate::metrics`].

use serde::de::DeserializeOwned;
use serde::Deserialize;

use super::action::{ReclaimMode, VmmAction};
use crate::config::{
    check_id, BalloonConfig, BalloonStatsUpdate, BalloonUpdate, BootSource, ConfigError,
    DriveConfig, DriveUpdate, LoggerConfig, MachineConfig, MachineConfigPatch, MemoryConfig,
    MemoryHotplugConfig, MetricsConfig, NetConfig, NetUpdate, ReclaimConfig, VsockConfig,
};
use crate::devices::virtio::balloon::BalloonError;
use crate::snapshot::params::LOAD_DEPRECATION_MESSAGE;
use crate::snapshot::{CreateSnapshotParams, LoadBodyError, LoadSnapshotConfig};

/// Why a request does not make an action.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RouteError {
    /// No such resource (404).
    #[error("no resource at {0}")]
    NotFound(String),
    /// The resource exists but not with this method (405).
    #[error("{method} is not allowed on {path}; allowed: {allow}")]
    MethodNotAllowed {
        /// The method asked for.
        method: String,
        /// The resource.
        path: String,
        /// The methods it takes, for the `Allow` header.
        allow: &'static str,
    },
    /// The body is missing, malformed or invalid (400).
    #[error("{0}")]
    BadBody(String),
    /// The id in the path (`/drives/{drive_id}`) is missing or invalid, or
    /// differs from the body's; or the path lacks the snapshot operation
    /// (`PUT /snapshot`) (400).
    #[error("{0}")]
    BadId(String),
    /// A value of a Firecracker body that teravm cannot honour (400).
    #[error("{method} {path}: {feature} is not supported by teravm")]
    NotSupported {
        /// The method asked for.
        method: String,
        /// The resource.
        path: String,
        /// The field and value, e.g. "vsock_override".
        feature: &'static str,
    },
    /// A Firecracker resource teravm knows and refuses, with the reason
    /// (400): the balloon's free page hinting.
    #[error("{method} {path}: {reason}")]
    Refused {
        /// The method asked for.
        method: String,
        /// The resource.
        path: String,
        /// Why, and what to use instead.
        reason: String,
    },
}

impl RouteError {
    /// The HTTP status code to answer with.
    pub fn status(&self) -> u16 {
        match self {
            RouteError::NotFound(_) => 404,
            RouteError::MethodNotAllowed { .. } => 405,
            RouteError::BadBody(_)
            | RouteError::BadId(_)
            | RouteError::NotSupported { .. }
            | RouteError::Refused { .. } => 400,
        }
    }
}

/// The body of `PUT /actions`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ActionBody {
    action_type: ActionType,
    #[serde(default)]
    reclaim: Option<ReclaimMode>,
}

#[derive(Debug, Deserialize)]
enum ActionType {
    InstanceStart,
    SendCtrlAltDel,
    Shutdown,
    FlushMetrics,
}

/// The methods each resource takes.
fn allowed(path: &str) -> Option<&'static str> {
    Some(match path {
        "/" | "/vm/config" | "/version" => "GET",
        "/memory" | "/reclaim" => "GET, PUT",
        "/machine-config" | "/balloon" | "/hotplug/memory" => "GET, PUT, PATCH",
        "/balloon/statistics" => "GET, PATCH",
        "/balloon/hinting/start" | "/balloon/hinting/stop" => "PATCH",
        "/balloon/hinting/status" => "GET",
        "/boot-source" | "/actions" | "/logger" | "/metrics" | "/vsock" | "/cpu-config"
        | "/entropy" | "/serial" => "PUT",
        "/vm" => "PATCH",
        "/drives" | "/network-interfaces" => "PUT, PATCH",
        "/mmds" => "GET, PUT, PATCH",
        "/mmds/config" => "PUT",
        "/snapshot/create" | "/snapshot/load" => "PUT",
        _ => return None,
    })
}

/// The resources that take a device's id as the last path segment.
const WITH_ID: [&str; 2] = ["/drives", "/network-interfaces"];

/// Splits `/drives/{id}` into the resource and the id (empty for `/drives`
/// and `/drives/`); `None` for every other path, deeper ones included.
fn split_id(path: &str) -> Option<(&'static str, &str)> {
    WITH_ID.iter().find_map(|&resource| {
        let rest = path.strip_prefix(resource)?;
        if rest.is_empty() {
            return Some((resource, ""));
        }
        let id = rest.strip_prefix('/')?;
        (!id.contains('/')).then_some((resource, id))
    })
}

/// The id in the path, checked: present and a valid id.
fn path_id<'a>(
    method: &str,
    path: &str,
    resource: &str,
    id: &'a str,
) -> Result<&'a str, RouteError> {
    let what = if resource == "/drives" {
        "drive_id"
    } else {
        "iface_id"
    };
    if id.is_empty() {
        return Err(RouteError::BadId(one_line(&format!(
            "{method} {path}: the path needs the device's id: {resource}/{{{what}}}"
        ))));
    }
    check_id("id", id).map_err(|e| {
        let reason = match e {
            ConfigError::InvalidField { reason, .. } => reason,
            other => other.to_string(),
        };
        RouteError::BadId(one_line(&format!(
            "{method} {path}: the id in the path is not valid: {reason}"
        )))
    })?;
    Ok(id)
}

/// The id in the path must be the body's, as in Firecracker.
fn same_id(
    method: &str,
    path: &str,
    path_id: &str,
    field: &str,
    body_id: &str,
) -> Result<(), RouteError> {
    if path_id != body_id {
        return Err(RouteError::BadId(one_line(&format!(
            "{method} {path}: the id in the path ({path_id:?}) differs from {field} in the body \
             ({body_id:?})"
        ))));
    }
    Ok(())
}

/// Maps one request to its action (and counts it in the API metrics). See
/// the module doc.
pub fn route(method: &str, path: &str, body: &[u8]) -> Result<VmmAction, RouteError> {
    crate::metrics::record_request(method, path);
    let result = route_request(method, path, body);
    if result.is_err() {
        crate::metrics::record_failure(method, path);
    }
    result
}

fn route_request(method: &str, path: &str, body: &[u8]) -> Result<VmmAction, RouteError> {
    // Firecracker's answer to a PUT without the operation.
    if method == "PUT" && (path == "/snapshot" || path == "/snapshot/") {
        return Err(RouteError::BadId(format!(
            "PUT {path}: missing snapshot operation type (PUT /snapshot/create or \
             /snapshot/load)"
        )));
    }
    let (resource, id): (&str, &str) = match split_id(path) {
        Some(split) => split,
        None => (path, ""),
    };
    let allow = allowed(resource).ok_or_else(|| RouteError::NotFound(path.to_string()))?;
    let not_allowed = || RouteError::MethodNotAllowed {
        method: method.to_string(),
        path: path.to_string(),
        allow,
    };
    if !allow.split(", ").any(|m| m == method) {
        return Err(not_allowed());
    }
    if path.starts_with("/balloon/hinting/") {
        return Err(RouteError::Refused {
            method: method.to_string(),
            path: path.to_string(),
            reason: BalloonError::HintingNotSupported.to_string(),
        });
    }
    match method {
        "GET" => {
            if !body.is_empty() {
                return Err(RouteError::BadBody(format!("GET {path} takes no body")));
            }
            Ok(match path {
                "/" => VmmAction::GetInstanceInfo,
                "/machine-config" => VmmAction::GetMachineConfig,
                "/memory" => VmmAction::GetMemory,
                "/reclaim" => VmmAction::GetReclaim,
                "/vm/config" => VmmAction::GetVmConfig,
                "/version" => VmmAction::GetVersion,
                "/balloon" => VmmAction::GetBalloon,
                "/balloon/statistics" => VmmAction::GetBalloonStatistics,
                "/mmds" => VmmAction::GetMmds,
                "/hotplug/memory" => VmmAction::GetHotplugMemory,
                _ => return Err(not_allowed()),
            })
        }
        "PUT" => match resource {
            "/machine-config" => {
                let c: MachineConfig = section(body, "machine-config")?;
                checked(c.validate())?;
                Ok(VmmAction::PutMachineConfig(c))
            }
            "/boot-source" => {
                let c: BootSource = section(body, "boot-source")?;
                checked(c.validate())?;
                Ok(VmmAction::PutBootSource(c))
            }
            "/memory" => {
                let c: MemoryConfig = section(body, "memory")?;
                checked(c.validate())?;
                Ok(VmmAction::PutMemory(c))
            }
            "/reclaim" => {
                let c: ReclaimConfig = section(body, "reclaim")?;
                checked(c.validate())?;
                Ok(VmmAction::PutReclaim(c))
            }
            "/actions" => action(body),
            "/balloon" => {
                let c: BalloonConfig = section(body, "balloon")?;
                checked(c.validate())?;
                Ok(VmmAction::PutBalloon(c))
            }
            "/logger" => {
                let c: LoggerConfig = section(body, "logger")?;
                checked(c.validate())?;
                Ok(VmmAction::PutLogger(c))
            }
            "/metrics" => {
                let c: MetricsConfig = section(body, "metrics")?;
                checked(c.validate())?;
                Ok(VmmAction::PutMetrics(c))
            }
            "/drives" => {
                let id = path_id(method, path, resource, id)?;
                let c: DriveConfig = section(body, "drives")?;
                same_id(method, path, id, "drives.drive_id", &c.drive_id)?;
                checked(c.validate())?;
                Ok(VmmAction::PutDrive(c))
            }
            "/network-interfaces" => {
                let id = path_id(method, path, resource, id)?;
                let c: NetConfig = section(body, "network-interfaces")?;
                same_id(method, path, id, "network-interfaces.iface_id", &c.iface_id)?;
                checked(c.validate())?;
                Ok(VmmAction::PutNetworkInterface(c))
            }
            "/vsock" => {
                let c: VsockConfig = section(body, "vsock")?;
                checked(c.validate())?;
                Ok(VmmAction::PutVsock(c))
            }
            "/mmds" => Ok(VmmAction::PutMmds(mmds_body(body)?)),
            "/mmds/config" => {
                let c: crate::mmds::MmdsConfig = section(body, "mmds-config")?;
                c.validate()
                    .map_err(|e| RouteError::BadBody(e.to_string()))?;
                Ok(VmmAction::PutMmdsConfig(c))
            }
            "/cpu-config" => {
                let t: crate::vstate::template::CustomTemplate = section(body, "cpu-config")?;
                t.validate()
                    .map_err(|e| RouteError::BadBody(one_line(&e.to_string())))?;
                Ok(VmmAction::PutCpuConfig(t))
            }
            "/entropy" => {
                let c: crate::config::entropy::EntropyConfig = section(body, "entropy")?;
                checked(c.validate())?;
                Ok(VmmAction::PutEntropy(c))
            }
            "/serial" => {
                let c: crate::config::serial::SerialConfig = section(body, "serial")?;
                checked(c.validate())?;
                Ok(VmmAction::PutSerial(c))
            }
            "/hotplug/memory" => {
                let c: MemoryHotplugConfig = section(body, "memory-hotplug")?;
                c.validate().map_err(|e| {
                    RouteError::BadBody(one_line(&format!("invalid memory-hotplug body: {e}")))
                })?;
                Ok(VmmAction::PutHotplugMemory(c))
            }
            "/snapshot/create" => {
                let c: CreateSnapshotParams = section(body, "snapshot-create")?;
                Ok(VmmAction::CreateSnapshot(c))
            }
            "/snapshot/load" => snapshot_load(method, path, body),
            _ => Err(not_allowed()),
        },
        "PATCH" => match resource {
            "/vm" => Ok(VmmAction::PatchVm(section(body, "vm")?)),
            "/machine-config" => {
                let p: MachineConfigPatch = section(body, "machine-config")?;
                if p.is_empty() {
                    return Err(RouteError::BadBody(
                        "the machine-config PATCH changes nothing: give at least one field".into(),
                    ));
                }
                checked(p.validate())?;
                Ok(VmmAction::PatchMachineConfig(p))
            }
            "/balloon" => {
                let u: BalloonUpdate = section(body, "balloon")?;
                checked(u.validate())?;
                Ok(VmmAction::PatchBalloon(u))
            }
            "/balloon/statistics" => {
                let u: BalloonStatsUpdate = section(body, "balloon")?;
                checked(u.validate())?;
                Ok(VmmAction::PatchBalloonStatistics(u))
            }
            "/drives" => {
                let id = path_id(method, path, resource, id)?;
                let u: DriveUpdate = section(body, "drives")?;
                same_id(method, path, id, "drives.drive_id", &u.drive_id)?;
                checked(u.validate())?;
                Ok(VmmAction::PatchDrive(u))
            }
            "/network-interfaces" => {
                let id = path_id(method, path, resource, id)?;
                let u: NetUpdate = section(body, "network-interfaces")?;
                same_id(method, path, id, "network-interfaces.iface_id", &u.iface_id)?;
                checked(u.validate())?;
                Ok(VmmAction::PatchNetworkInterface(u))
            }
            "/mmds" => Ok(VmmAction::PatchMmds(mmds_body(body)?)),
            "/hotplug/memory" => Ok(VmmAction::PatchHotplugMemory(section(
                body,
                "memory-hotplug",
            )?)),
            _ => Err(not_allowed()),
        },
        _ => Err(not_allowed()),
    }
}

fn action(body: &[u8]) -> Result<VmmAction, RouteError> {
    let a: ActionBody = section(body, "actions")?;
    match (a.action_type, a.reclaim) {
        (ActionType::Shutdown, mode) => Ok(VmmAction::Shutdown(mode.unwrap_or_default())),
        (_, Some(_)) => Err(RouteError::BadBody(
            "actions.reclaim is only allowed with \"action_type\": \"Shutdown\"".into(),
        )),
        (ActionType::InstanceStart, None) => Ok(VmmAction::InstanceStart),
        (ActionType::SendCtrlAltDel, None) => Ok(VmmAction::SendCtrlAltDel),
        (ActionType::FlushMetrics, None) => Ok(VmmAction::FlushMetrics),
    }
}

/// `PUT /snapshot/load`: Firecracker's body, resolved
/// ([`LoadSnapshotConfig::resolve`]).
fn snapshot_load(method: &str, path: &str, body: &[u8]) -> Result<VmmAction, RouteError> {
    let name = "snapshot-load";
    let c: LoadSnapshotConfig = section(body, name)?;
    let deprecated = c.is_deprecated();
    let params = c.resolve().map_err(|e| match e {
        LoadBodyError::NotSupported(feature) => RouteError::NotSupported {
            method: method.to_string(),
            path: path.to_string(),
            feature,
        },
        other => RouteError::BadBody(format!("invalid {name} body: {other}")),
    })?;
    if deprecated {
        log::warn!("{LOAD_DEPRECATION_MESSAGE}");
        crate::metrics::record_deprecated_api_call();
    }
    Ok(VmmAction::LoadSnapshot(params))
}

/// The body of `PUT`/`PATCH /mmds`: any JSON value.
fn mmds_body(body: &[u8]) -> Result<serde_json::Value, RouteError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(RouteError::BadBody(
            "the mmds request needs a JSON body".into(),
        ));
    }
    serde_json::from_slice(body)
        .map_err(|e| RouteError::BadBody(one_line(&format!("invalid mmds body: {e}"))))
}

fn checked(r: Result<(), ConfigError>) -> Result<(), RouteError> {
    r.map_err(|e| RouteError::BadBody(one_line(&e.to_string())))
}

fn one_line(s: &str) -> String {
    s.replace(['\r', '\n'], " ")
}

/// Parses a JSON body into a section, with an error that names the field.
fn section<T: DeserializeOwned>(body: &[u8], name: &str) -> Result<T, RouteError> {
    let Some(first) = body.iter().find(|b| !b.is_ascii_whitespace()) else {
        return Err(RouteError::BadBody(format!(
            "the {name} request needs a JSON body"
        )));
    };
    // serde would also take a struct from an array of its fields: refuse it.
    if *first != b'{' {
        return Err(RouteError::BadBody(format!(
            "invalid {name} body: expected a JSON object"
        )));
    }
    serde_json::from_slice(body).map_err(|e| {
        let msg = e.to_string();
        // serde names the field in "unknown field" and "missing field", and
        // a section's own parse errors name it (`network-interfaces.guest_mac:
        // ...`); for a wrong type or value, find the key being parsed where
        // it failed.
        let key = if msg.contains("field `") || msg.starts_with(&format!("{name}.")) {
            None
        } else {
            key_at(body, e.line(), e.column())
        };
        let msg = match key {
            Some(key) => format!("invalid {name} body: {name}.{key}: {msg}"),
            None => format!("invalid {name} body: {msg}"),
        };
        RouteError::BadBody(one_line(&msg))
    })
}

/// The top-level object key whose value holds the 1-based `line`/`column`
/// of a JSON text (serde_json's error position), if any.
pub(crate) fn key_at(text: &[u8], line: usize, column: usize) -> Option<String> {
    if line == 0 {
        return None;
    }
    // Byte offset of the position.
    let mut offset = 0;
    for _ in 1..line {
        offset += text.get(offset..)?.iter().position(|&b| b == b'\n')? + 1;
    }
    let end = (offset + column).min(text.len());
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    let (mut string_start, mut last_string, mut key) = (0, None, None);
    for (i, &b) in text[..end].iter().enumerate() {
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
                if depth == 1 {
                    last_string = Some(&text[string_start..i]);
                }
            }
            continue;
        }
        match b {
            b'"' => {
                in_string = true;
                string_start = i + 1;
            }
            b'{' | b'[' => depth += 1,
            b'}' | b']' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    key = None;
                }
            }
            b':' if depth == 1 => key = last_string.take(),
            b',' if depth == 1 => (last_string, key) = (None, None),
            _ => {}
        }
    }
    key.map(|k| String::from_utf8_lossy(k).into_owned())
}

#[cfg(test)]
#[path = "routing_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "routing_fc_tests.rs"]
mod fc_tests;

#[cfg(test)]
#[path = "routing_balloon_tests.rs"]
mod balloon_tests;

#[cfg(test)]
#[path = "routing_device_tests.rs"]
mod device_tests;

#[cfg(test)]
#[path = "routing_hotplug_tests.rs"]
mod hotplug_tests;

#[cfg(test)]
#[path = "routing_snapshot_tests.rs"]
mod snapshot_tests;
