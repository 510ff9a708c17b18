//! The wire-independent contract between the API server and the VMM: what a
//! client asks for ([`VmmAction`]), what the VMM answers ([`VmmData`] or
//! [`VmmActionError`]), and the envelope that carries one request to the VMM
//! with its own reply channel ([`ApiRequest`]).
//!
//! Nothing here knows about HTTP; the server maps these to status codes
//! (`Empty` → 204, `Json` → 200, `Accepted` → 202, `BadRequest` → 400,
//! `Internal` → 500).

use std::sync::mpsc::Sender;

use serde::{Deserialize, Serialize};

use crate::config::{
    BalloonConfig, BalloonStatsUpdate, BalloonUpdate, BootSource, DriveConfig, DriveUpdate,
    LoggerConfig, MachineConfig, MachineConfigPatch, MemoryConfig, MetricsConfig, NetConfig,
    NetUpdate, ReclaimConfig, VsockConfig,
};

/// When a `Shutdown` action replies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ReclaimMode {
    /// Reply once guest memory is back, with the reclaim statistics.
    #[default]
    Sync,
    /// Reply at once; the process lingers until reclaim is done.
    Async,
}

/// One thing a client asks the VMM to do (or to tell).
#[derive(Debug, Clone, PartialEq)]
pub enum VmmAction {
    /// `GET /`: instance id, state and version.
    GetInstanceInfo,
    /// `GET /machine-config`.
    GetMachineConfig,
    /// `PUT /machine-config` (already validated).
    PutMachineConfig(MachineConfig),
    /// `PUT /boot-source` (already validated).
    PutBootSource(BootSource),
    /// `GET /memory`: the memory section and, once running, its slices.
    GetMemory,
    /// `PUT /memory` (already validated).
    PutMemory(MemoryConfig),
    /// `GET /reclaim`: reclaim state and progress.
    GetReclaim,
    /// `PUT /reclaim` (already validated).
    PutReclaim(ReclaimConfig),
    /// `PUT /actions` `{"action_type": "InstanceStart"}`.
    InstanceStart,
    /// `PUT /actions` `{"action_type": "SendCtrlAltDel"}`.
    SendCtrlAltDel,
    /// `PUT /actions` `{"action_type": "Shutdown", "reclaim": "sync"|"async"}`.
    Shutdown(ReclaimMode),
    /// `GET /vm/config`: the whole configuration.
    GetVmConfig,
    /// `GET /version`: Firecracker's `{"firecracker_version": ...}`.
    GetVersion,
    /// `PATCH /machine-config` (fields checked alone; checked as a whole
    /// against the configuration in force by the VMM).
    PatchMachineConfig(MachineConfigPatch),
    /// `PUT /logger` (already validated).
    PutLogger(LoggerConfig),
    /// `PUT /metrics` (already validated).
    PutMetrics(MetricsConfig),
    /// `PUT /actions` `{"action_type": "FlushMetrics"}`.
    FlushMetrics,
    /// `PUT /balloon` (fields checked alone; the target against the guest's
    /// RAM, and the state, by the VMM).
    PutBalloon(BalloonConfig),
    /// `PATCH /balloon`: a new target (checked alone; against the guest's
    /// RAM by the VMM).
    PatchBalloon(BalloonUpdate),
    /// `GET /balloon`: the balloon's configuration, with the target in force.
    GetBalloon,
    /// `GET /balloon/statistics`: sizes, the guest's counters, teravm's.
    GetBalloonStatistics,
    /// `PATCH /balloon/statistics`: a new polling interval.
    PatchBalloonStatistics(BalloonStatsUpdate),
    /// `PUT /drives/{drive_id}` (fields checked alone, the path's id equal
    /// to the body's; the other drives, the file and the state by the VMM,
    /// with [`crate::config::check_drives`]).
    PutDrive(DriveConfig),
    /// `PATCH /drives/{drive_id}`: a new backing file (checked alone; the
    /// drive, the file and the state by the VMM).
    PatchDrive(DriveUpdate),
    /// `PUT /network-interfaces/{iface_id}` (fields checked alone, the
    /// path's id equal to the body's; the other interfaces, the TAP device
    /// and the state by the VMM, with [`crate::config::check_nets`]).
    PutNetworkInterface(NetConfig),
    /// `PATCH /network-interfaces/{iface_id}`: new rate limiters for a
    /// started microVM's interface (both absent: a no-op); before the
    /// start refused, as Firecracker refuses it.
    PatchNetworkInterface(NetUpdate),
    /// `PUT /vsock` (fields checked alone; the socket and the state by the
    /// VMM).
    PutVsock(VsockConfig),
    /// `GET /mmds`: the MMDS contents.
    GetMmds,
    /// `PUT /mmds`: new MMDS contents (any JSON value).
    PutMmds(serde_json::Value),
    /// `PATCH /mmds`: a JSON merge patch of the contents.
    PatchMmds(serde_json::Value),
    /// `PUT /mmds/config` (checked alone; the interfaces and the state by
    /// the VMM).
    PutMmdsConfig(crate::mmds::MmdsConfig),
    /// `PATCH /vm`: pause or resume the vCPUs.
    PatchVm(VmStateChange),
    /// `PUT /cpu-config`: a custom CPU template (before start).
    PutCpuConfig(crate::vstate::template::CustomTemplate),
    /// `PUT /entropy` (before the start).
    PutEntropy(crate::config::entropy::EntropyConfig),
    /// `PUT /serial` (before the start).
    PutSerial(crate::config::serial::SerialConfig),
    /// `PUT /hotplug/memory` (already validated; before the start).
    PutHotplugMemory(crate::config::MemoryHotplugConfig),
    /// `PATCH /hotplug/memory`: the size the guest is asked to plug (once
    /// running; checked against the region by the devices).
    PatchHotplugMemory(crate::config::MemoryHotplugSizeUpdate),
    /// `GET /hotplug/memory`: the region and what is plugged (once
    /// running).
    GetHotplugMemory,
    /// `PUT /snapshot/create` (parsed; the state is checked by the VMM:
    /// started and paused).
    CreateSnapshot(crate::snapshot::CreateSnapshotParams),
    /// `PUT /snapshot/load` (parsed and resolved; the state is checked by
    /// the VMM: not started, nothing configured).
    LoadSnapshot(crate::snapshot::LoadSnapshotParams),
}

/// The body of `PATCH /vm`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VmStateChange {
    /// What the vCPUs are to be.
    pub state: VmStateWanted,
}

/// `Paused` or `Resumed`, as Firecracker spells them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum VmStateWanted {
    /// Out of the guest until resumed.
    Paused,
    /// Running again.
    Resumed,
}

impl VmmAction {
    /// Where Firecracker refuses this action before `InstanceStart` (its
    /// `OperationNotSupportedPreBoot`, whatever the body), the words the
    /// refusal names it by: the VMM answers it so while not started.
    /// `None` for the others, some of which the VMM refuses before the
    /// start for reasons of their own.
    pub fn only_once_started(&self) -> Option<&'static str> {
        match self {
            VmmAction::FlushMetrics => Some("FlushMetrics"),
            VmmAction::PatchBalloon(_) => Some("PATCH /balloon"),
            VmmAction::PatchBalloonStatistics(_) => Some("PATCH /balloon/statistics"),
            VmmAction::PatchDrive(_) => Some("PATCH /drives"),
            VmmAction::PatchNetworkInterface(_) => Some("PATCH /network-interfaces"),
            _ => None,
        }
    }

    /// Whether Firecracker counts this action as configuring the microVM
    /// for a boot (its `PrebootApiController::boot_path`, set by the
    /// action even when it fails): a `PUT /snapshot/load` is refused after
    /// one. The boot source, the machine configuration (PUT and PATCH),
    /// drives, network interfaces, the balloon, the vsock, the entropy
    /// device, the MMDS configuration and the memory hotplug region; not
    /// the logger, the metrics, the serial output, the CPU template, the
    /// MMDS contents, nor teravm's own `/memory` and `/reclaim` (how the
    /// host backs and frees memory, which a load honours as a boot does).
    pub fn configures_boot(&self) -> bool {
        matches!(
            self,
            VmmAction::PutBootSource(_)
                | VmmAction::PutMachineConfig(_)
                | VmmAction::PatchMachineConfig(_)
                | VmmAction::PutDrive(_)
                | VmmAction::PutNetworkInterface(_)
                | VmmAction::PutBalloon(_)
                | VmmAction::PutVsock(_)
                | VmmAction::PutEntropy(_)
                | VmmAction::PutMmdsConfig(_)
                | VmmAction::PutHotplugMemory(_)
        )
    }

    /// The `latencies_us` field of Firecracker's metrics that a success of
    /// this action sets (the API-level time, request to answer).
    pub fn latency(&self) -> Option<crate::metrics::Latency> {
        use crate::metrics::Latency;
        use crate::snapshot::SnapshotType;
        match self {
            VmmAction::CreateSnapshot(p) => Some(match p.snapshot_type {
                SnapshotType::Full => Latency::FullCreateSnapshot,
                SnapshotType::Diff => Latency::DiffCreateSnapshot,
            }),
            VmmAction::LoadSnapshot(_) => Some(Latency::LoadSnapshot),
            VmmAction::PatchVm(c) => Some(match c.state {
                VmStateWanted::Paused => Latency::PauseVm,
                VmStateWanted::Resumed => Latency::ResumeVm,
            }),
            _ => None,
        }
    }

    /// The method and resource of the request that makes this action, for
    /// the per-resource API metrics.
    pub fn method_and_path(&self) -> (&'static str, &'static str) {
        match self {
            VmmAction::GetInstanceInfo => ("GET", "/"),
            VmmAction::GetMachineConfig => ("GET", "/machine-config"),
            VmmAction::PutMachineConfig(_) => ("PUT", "/machine-config"),
            VmmAction::PatchMachineConfig(_) => ("PATCH", "/machine-config"),
            VmmAction::PutBootSource(_) => ("PUT", "/boot-source"),
            VmmAction::GetMemory => ("GET", "/memory"),
            VmmAction::PutMemory(_) => ("PUT", "/memory"),
            VmmAction::GetReclaim => ("GET", "/reclaim"),
            VmmAction::PutReclaim(_) => ("PUT", "/reclaim"),
            VmmAction::InstanceStart
            | VmmAction::SendCtrlAltDel
            | VmmAction::Shutdown(_)
            | VmmAction::FlushMetrics => ("PUT", "/actions"),
            VmmAction::GetVmConfig => ("GET", "/vm/config"),
            VmmAction::GetVersion => ("GET", "/version"),
            VmmAction::PutLogger(_) => ("PUT", "/logger"),
            VmmAction::PutMetrics(_) => ("PUT", "/metrics"),
            VmmAction::PutBalloon(_) => ("PUT", "/balloon"),
            VmmAction::PatchBalloon(_) => ("PATCH", "/balloon"),
            VmmAction::GetBalloon => ("GET", "/balloon"),
            VmmAction::GetBalloonStatistics => ("GET", "/balloon/statistics"),
            VmmAction::PatchBalloonStatistics(_) => ("PATCH", "/balloon/statistics"),
            VmmAction::PutDrive(_) => ("PUT", "/drives"),
            VmmAction::PatchDrive(_) => ("PATCH", "/drives"),
            VmmAction::PutNetworkInterface(_) => ("PUT", "/network-interfaces"),
            VmmAction::PatchNetworkInterface(_) => ("PATCH", "/network-interfaces"),
            VmmAction::PutVsock(_) => ("PUT", "/vsock"),
            VmmAction::GetMmds => ("GET", "/mmds"),
            VmmAction::PutMmds(_) => ("PUT", "/mmds"),
            VmmAction::PatchMmds(_) => ("PATCH", "/mmds"),
            VmmAction::PutMmdsConfig(_) => ("PUT", "/mmds/config"),
            VmmAction::PatchVm(_) => ("PATCH", "/vm"),
            VmmAction::PutCpuConfig(_) => ("PUT", "/cpu-config"),
            VmmAction::PutEntropy(_) => ("PUT", "/entropy"),
            VmmAction::PutSerial(_) => ("PUT", "/serial"),
            VmmAction::PutHotplugMemory(_) => ("PUT", "/hotplug/memory"),
            VmmAction::PatchHotplugMemory(_) => ("PATCH", "/hotplug/memory"),
            VmmAction::GetHotplugMemory => ("GET", "/hotplug/memory"),
            VmmAction::CreateSnapshot(_) => ("PUT", "/snapshot/create"),
            VmmAction::LoadSnapshot(_) => ("PUT", "/snapshot/load"),
        }
    }
}

/// A successful answer of the VMM.
#[derive(Debug, Clone, PartialEq)]
pub enum VmmData {
    /// Done, nothing to say (HTTP 204).
    Empty,
    /// Done, with a JSON body (HTTP 200).
    Json(serde_json::Value),
    /// Accepted and still going on, with a JSON body (HTTP 202).
    Accepted(serde_json::Value),
}

/// A failed action.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VmmActionError {
    /// The request cannot be done in the VMM's state or with these values
    /// (HTTP 400).
    #[error("{0}")]
    BadRequest(String),
    /// The VMM failed doing it (HTTP 500).
    #[error("{0}")]
    Internal(String),
    /// The request would make something larger than its limit (HTTP 413,
    /// as Firecracker answers an MMDS write past `--mmds-size-limit`).
    #[error("{0}")]
    TooLarge(String),
}

/// What the VMM sends back for one [`ApiRequest`].
pub type ActionResult = Result<VmmData, VmmActionError>;

/// One request on its way to the VMM, with its own reply channel (so two
/// clients never get each other's answers).
#[derive(Debug)]
pub struct ApiRequest {
    /// What to do.
    pub action: VmmAction,
    /// Where to send the one answer.
    pub reply: Sender<ActionResult>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reclaim_mode_spelling() {
        assert_eq!(
            serde_json::from_str::<ReclaimMode>("\"sync\"").unwrap(),
            ReclaimMode::Sync
        );
        assert_eq!(
            serde_json::from_str::<ReclaimMode>("\"async\"").unwrap(),
            ReclaimMode::Async
        );
        assert!(serde_json::from_str::<ReclaimMode>("\"Sync\"").is_err());
        assert_eq!(ReclaimMode::default(), ReclaimMode::Sync);
        assert_eq!(
            serde_json::to_string(&ReclaimMode::Async).unwrap(),
            "\"async\""
        );
    }

    #[test]
    fn errors_display_their_message() {
        assert_eq!(VmmActionError::BadRequest("no".into()).to_string(), "no");
        assert_eq!(VmmActionError::Internal("boom".into()).to_string(), "boom");
    }
}
