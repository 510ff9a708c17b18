//! API actions on the VMM: each checked against the VMM's state, done, and
//! answered on the request's own reply channel. This file is the one
//! dispatch (`Vmm::handle_request`): the actions that open a path or a
//! tap go to the `files` thread first ([`opens`]) and are answered when it
//! is done; a sync `Shutdown` is answered when reclaim is done
//! (`shutdown`); every other action is done here or in the file of its
//! subject, one per subject: `machine` (machine, memory, CPU template),
//! `balloon`, `drive`, `hotplug` (virtio-mem), `net`, `mmds`, `pause`
//! (`PATCH /vm`), `shutdown` (and `/reclaim`), `metrics`, `snapshot`
//! (`PUT /snapshot/create` and `/snapshot/load`). Failed
//! actions are counted in [`crate::metrics`].

mod balloon;
mod drive;
mod hotplug;
mod machine;
mod metrics;
mod mmds;
mod net;
pub mod opens;
mod pause;
mod shutdown;
mod snapshot;

use serde_json::json;

use crate::api::{ActionResult, ApiRequest, VmmAction, VmmActionError, VmmData};
use crate::config::DriveConfig;
use crate::vmm::device_opens::{check_count_with, drive_request, listener_for, tap_for};
use crate::vmm::lifecycle::Phase;
use crate::vmm::{VmState, Vmm};
use opens::{boot_requests, output_request, Opening, Pending};

fn to_json<T: serde::Serialize>(value: &T) -> ActionResult {
    serde_json::to_value(value)
        .map(VmmData::Json)
        .map_err(|e| VmmActionError::Internal(e.to_string()))
}

fn bad(e: impl std::fmt::Display) -> VmmActionError {
    VmmActionError::BadRequest(e.to_string())
}

fn no_balloon() -> VmmActionError {
    VmmActionError::BadRequest("the balloon device is not configured (PUT /balloon first)".into())
}

fn lock<T: ?Sized>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn refused(what: &str, state: VmState) -> ActionResult {
    Err(VmmActionError::BadRequest(format!(
        "{what} is not allowed in state \"{}\"",
        state.as_str()
    )))
}

/// What Firecracker answers for the operations it allows only once the
/// microVM runs ([`VmmAction::only_once_started`]'s, `PATCH
/// /hotplug/memory`): its `OperationNotSupportedPreBoot`.
fn not_before_start(what: &str) -> ActionResult {
    Err(VmmActionError::BadRequest(format!(
        "{what}: the requested operation is not supported before starting the microVM"
    )))
}

/// An action handed to a subject's function that does not serve it: a
/// dispatch bug, answered as an internal error rather than a panic.
fn misrouted(action: &VmmAction, to: &str) -> VmmActionError {
    VmmActionError::Internal(format!("{:?} reached {to}", action.method_and_path()))
}

impl Vmm {
    /// Takes one API request: does it, or starts what answers it later.
    pub(in crate::vmm) fn handle_request(&mut self, request: ApiRequest) {
        let ApiRequest { action, reply } = request;
        let state = self.state();
        // As Firecracker's `boot_path`: set by the request, whatever its
        // outcome.
        if state == VmState::NotStarted && action.configures_boot() {
            self.boot_configured = true;
        }
        match action {
            // Answered when the start ends.
            VmmAction::InstanceStart
                if state == VmState::NotStarted && !self.boot_source_opening() =>
            {
                return self.start(Some(reply));
            }
            // Answered when the `files` thread has opened the paths.
            VmmAction::PutBootSource(b) if state == VmState::NotStarted => {
                return self.open_then(boot_requests(&b), Pending::BootSource(b), reply);
            }
            VmmAction::PutLogger(c) => {
                let requests = c
                    .log_path
                    .iter()
                    .map(|p| output_request("logger.log_path", p, false))
                    .collect();
                return self.open_then(requests, Pending::Logger(c), reply);
            }
            VmmAction::PutDrive(d) if state == VmState::NotStarted => {
                let request = drive_request(&d);
                return self.open_then(vec![request], Pending::Drive(d), reply);
            }
            // Before the start: refused in `do_action`, as Firecracker does.
            VmmAction::PatchDrive(u)
                if u.path_on_host.is_some()
                    && matches!(state, VmState::Running | VmState::Paused) =>
            {
                let Some(d) = self.config.drives.iter().find(|d| d.drive_id == u.drive_id) else {
                    let _ = reply.send(Err(bad(format!(
                        "drives: no drive {:?} (PUT it first)",
                        u.drive_id
                    ))));
                    return;
                };
                let request = drive_request(&DriveConfig {
                    path_on_host: u.path_on_host.clone().unwrap_or_default(),
                    ..d.clone()
                });
                return self.open_then(vec![request], Pending::DrivePatch(u), reply);
            }
            VmmAction::PutNetworkInterface(n) if state == VmState::NotStarted => {
                let section = Pending::Net(n.clone());
                let open = move || Opening::Tap(tap_for(&n));
                let what = "network-interfaces.host_dev_name";
                return self.run_then(what, open, section, reply);
            }
            VmmAction::PutVsock(v) if state == VmState::NotStarted => {
                let section = Pending::Vsock(v.clone());
                let open = move || Opening::Listener(listener_for(&v));
                return self.run_then("vsock.uds_path", open, section, reply);
            }
            VmmAction::PutSerial(c) if state == VmState::NotStarted => {
                let request = output_request("serial.serial_out_path", &c.serial_out_path, false);
                return self.open_then(vec![request], Pending::Serial, reply);
            }
            VmmAction::PutMetrics(c) if !crate::metrics::is_configured() => {
                let request = output_request("metrics.metrics_path", &c.metrics_path, false);
                return self.open_then(vec![request], Pending::Metrics(c), reply);
            }
            VmmAction::Shutdown(mode) => return self.shutdown(mode, reply),
            // Answered when the create job hands the microVM back, or the
            // load's start ends.
            VmmAction::CreateSnapshot(params) => return self.create_snapshot(params, reply),
            VmmAction::LoadSnapshot(params) => return self.load_snapshot(params, reply),
            _ => {}
        }
        let (method, path) = action.method_and_path();
        let result = self.do_action(action);
        if result.is_err() {
            crate::metrics::record_failure(method, path);
        }
        // The client may have gone away: nothing to do about it.
        let _ = reply.send(result);
    }

    fn do_action(&mut self, action: VmmAction) -> ActionResult {
        let state = self.state();
        let not_started = state == VmState::NotStarted;
        if let Some(what) = action.only_once_started().filter(|_| not_started) {
            return not_before_start(what);
        }
        match action {
            VmmAction::GetInstanceInfo => Ok(VmmData::Json(json!({
                "id": self.opts.id,
                "state": state.as_str(),
                "vmm_version": env!("CARGO_PKG_VERSION"),
                "app_name": "teravm",
            }))),
            a @ (VmmAction::GetMachineConfig
            | VmmAction::PutMachineConfig(_)
            | VmmAction::PatchMachineConfig(_)
            | VmmAction::GetMemory
            | VmmAction::PutMemory(_)
            | VmmAction::PutCpuConfig(_)) => self.machine_action(a, state),
            VmmAction::PutBootSource(_) => refused("changing the boot source", state),
            a @ (VmmAction::GetReclaim | VmmAction::PutReclaim(_)) => self.reclaim_action(a, state),
            VmmAction::PatchVm(change) => self.patch_vm(change),
            VmmAction::InstanceStart if state == VmState::NotStarted => Err(
                VmmActionError::BadRequest(
                    "InstanceStart: a PUT /boot-source is still opening its files; retry when it has been answered".into(),
                ),
            ),
            VmmAction::InstanceStart => refused("InstanceStart", state),
            VmmAction::SendCtrlAltDel => match &self.phase {
                Phase::Running(microvm) => {
                    let queued = microvm
                        .i8042
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .send_ctrl_alt_del();
                    if !queued {
                        log::info!("SendCtrlAltDel: the guest has not read the ones before; not queued again");
                    }
                    if let Some(vcpus) = microvm.vcpus() {
                        vcpus.control().wake_all();
                    }
                    Ok(VmmData::Empty)
                }
                _ => refused("SendCtrlAltDel", state),
            },
            // Answered by [`Vmm::shutdown`], before this match.
            VmmAction::Shutdown(_) => Err(VmmActionError::Internal(
                "Shutdown reached do_action".into(),
            )),
            VmmAction::GetVmConfig => to_json(&self.config),
            VmmAction::GetVersion => Ok(VmmData::Json(json!({
                "firecracker_version": env!("CARGO_PKG_VERSION"),
            }))),
            VmmAction::PutLogger(_) => Err(VmmActionError::Internal(
                "PUT /logger is handled with its files".into(),
            )),
            VmmAction::PutMetrics(_) => Err(VmmActionError::BadRequest(
                "the metrics are already being written (PUT /metrics works once)".into(),
            )),
            // As in Firecracker, a flush without a metrics path does nothing.
            VmmAction::FlushMetrics => self
                .flush_metrics()
                .map(|_| VmmData::Empty)
                .map_err(|e| VmmActionError::Internal(e.to_string())),
            a @ (VmmAction::PutBalloon(_)
            | VmmAction::PatchBalloon(_)
            | VmmAction::GetBalloon
            | VmmAction::GetBalloonStatistics
            | VmmAction::PatchBalloonStatistics(_)) => self.balloon_action(a, state),
            // The region before the start, its size and status while running
            // (`vmm::hotplug_actions`).
            a @ (VmmAction::PutHotplugMemory(_)
            | VmmAction::PatchHotplugMemory(_)
            | VmmAction::GetHotplugMemory) => self.hotplug_action(a, state),
            VmmAction::PutDrive(_) => refused("adding a drive", state),
            VmmAction::PatchDrive(u) => {
                if !self.config.drives.iter().any(|d| d.drive_id == u.drive_id) {
                    return Err(bad(format!(
                        "drives: no drive {:?} (PUT it first)",
                        u.drive_id
                    )));
                }
                self.patch_drive_limiter(&u.drive_id, &u.rate_limiter)
            }
            VmmAction::PutNetworkInterface(_) => refused("adding a network interface", state),
            VmmAction::PatchNetworkInterface(u) => self.patch_net(u),
            VmmAction::PutVsock(_) => refused("adding a vsock", state),
            a @ (VmmAction::GetMmds
            | VmmAction::PutMmds(_)
            | VmmAction::PatchMmds(_)
            | VmmAction::PutMmdsConfig(_)) => self.mmds_action(a),
            VmmAction::PutEntropy(e) if not_started => {
                check_count_with(&self.config, &self.topology, |c| c.entropy = Some(e)).map_err(bad)?;
                self.config.entropy = Some(e);
                Ok(VmmData::Empty)
            }
            VmmAction::PutEntropy(_) => refused("adding the entropy device", state),
            VmmAction::PutSerial(_) => refused("configuring the serial output", state),
            VmmAction::CreateSnapshot(_) | VmmAction::LoadSnapshot(_) => {
                Err(misrouted(&action, "do_action"))
            }
        }
    }
}
