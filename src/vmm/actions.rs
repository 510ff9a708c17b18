//! API actions on the VMM: each checked against the VMM's state, done, and
//! answered on the request's own reply channel. A sync `Shutdown` is
//! answered later, when reclaim is done. Failed actions are counted in
//! [`crate::metrics`]; `FlushMetrics` writes a metrics line.

use std::time::Instant;

use serde_json::{json, Value};

use crate::config::check_balloon_target;
use crate::memory::{ReclaimOptions, ReclaimReport, ReclaimState};

use super::device_opens::{check_count_with, drive_request, listener_for, tap_for};
use super::opens::{boot_requests, output_request, Opening, Pending};
use super::phase::Phase;
use super::{ShutdownReason, VmState, Vmm};
use crate::api::{
    shapes, ActionResult, ApiRequest, ReclaimMode, VmmAction, VmmActionError, VmmData,
};
use crate::config::DriveConfig;

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

pub(super) fn refused(what: &str, state: VmState) -> ActionResult {
    Err(VmmActionError::BadRequest(format!(
        "{what} is not allowed in state \"{}\"",
        state.as_str()
    )))
}

/// What Firecracker answers for the operations it allows only once the
/// microVM runs ([`VmmAction::only_once_started`]'s, `PATCH
/// /hotplug/memory`): its `OperationNotSupportedPreBoot`.
pub(super) fn not_before_start(what: &str) -> ActionResult {
    Err(VmmActionError::BadRequest(format!(
        "{what}: the requested operation is not supported before starting the microVM"
    )))
}

impl Vmm {
    pub(super) fn handle_request(&mut self, request: ApiRequest) {
        let ApiRequest { action, reply } = request;
        let state = self.state();
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
                let n2 = n.clone();
                return self.run_then(
                    "network-interfaces.host_dev_name",
                    move || Opening::Tap(tap_for(&n2)),
                    Pending::Net(n),
                    reply,
                );
            }
            VmmAction::PutVsock(v) if state == VmState::NotStarted => {
                let v2 = v.clone();
                return self.run_then(
                    "vsock.uds_path",
                    move || Opening::Listener(listener_for(&v2)),
                    Pending::Vsock(v),
                    reply,
                );
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

    /// `Shutdown`, sync or async: refused unless the microVM starts or
    /// runs; otherwise the one shutdown path ([`Vmm::begin_shutdown`]).
    /// The async reply goes at once, before the vCPUs stop, with the plan
    /// the `reclaim` job will run; the sync one when the memory is back.
    fn shutdown(&mut self, mode: ReclaimMode, reply: std::sync::mpsc::Sender<ActionResult>) {
        let state = self.state();
        if !matches!(
            state,
            VmState::Starting | VmState::Running | VmState::Paused
        ) {
            let (method, path) = VmmAction::Shutdown(mode).method_and_path();
            crate::metrics::record_failure(method, path);
            let _ = reply.send(refused("Shutdown", state));
            return;
        }
        let accepted = Instant::now();
        match mode {
            ReclaimMode::Sync => self.sync_waiters.push(reply),
            // Answered before the teardown is handed to its job, so the reply
            // does not wait for that thread's wake-up; the event loop takes
            // the next request only after this returns, when the phase has
            // already moved on.
            ReclaimMode::Async => {
                let plan = shapes::ReclaimReport::from(&self.planned_report());
                let _ = reply.send(to_json(&plan).map(|d| match d {
                    VmmData::Json(v) => VmmData::Accepted(v),
                    other => other,
                }));
            }
        }
        self.begin_shutdown(ShutdownReason::Api, accepted);
    }

    /// Writes a metrics line (if metrics are set up) with the VM's state and
    /// its reclaim report; a failure is logged, never fatal.
    pub(super) fn flush_metrics(&self) -> Result<bool, crate::metrics::MetricsError> {
        let report = self.reclaim_report();
        let console_dropped_bytes = match &self.phase {
            super::phase::Phase::Running(m) => {
                m.console().map_or(0, |c| c.buffer().stats().dropped_bytes)
            }
            _ => self
                .last_report
                .as_ref()
                .map_or(0, |r| r.console.dropped_bytes),
        };
        let result = crate::metrics::flush(&crate::metrics::VmmSnapshot {
            state: self.state().as_str(),
            reclaim: &report,
            console_dropped_bytes,
            device_groups: self.device_metrics(),
        });
        if let Err(e) = &result {
            log::warn!("metrics: {e}");
        }
        result
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
            VmmAction::GetMachineConfig => to_json(&self.config.machine_config),
            VmmAction::PutMachineConfig(m) if not_started => {
                crate::config::check_backing_pages(&m, &self.config.memory).map_err(bad)?;
                crate::config::check_hotplug_pages(&m, self.config.memory_hotplug.as_ref())
                    .map_err(bad)?;
                self.config.machine_config = m;
                Ok(VmmData::Empty)
            }
            VmmAction::PatchMachineConfig(p) if not_started => {
                let m = p.apply(&self.config.machine_config).map_err(bad)?;
                crate::config::check_backing_pages(&m, &self.config.memory).map_err(bad)?;
                crate::config::check_hotplug_pages(&m, self.config.memory_hotplug.as_ref())
                    .map_err(bad)?;
                self.config.machine_config = m;
                Ok(VmmData::Empty)
            }
            VmmAction::PutMachineConfig(_) | VmmAction::PatchMachineConfig(_) => {
                refused("changing the machine configuration", state)
            }
            VmmAction::PutBootSource(_) => refused("changing the boot source", state),
            VmmAction::GetMemory => {
                let mut value = serde_json::to_value(&self.config.memory)
                    .map_err(|e| VmmActionError::Internal(e.to_string()))?;
                if let Value::Object(map) = &mut value {
                    let slices = serde_json::to_value(&self.slices)
                        .map_err(|e| VmmActionError::Internal(e.to_string()))?;
                    map.insert("slices".into(), slices);
                    if self.config.memory.populate && state != VmState::NotStarted {
                        let progress = serde_json::to_value(shapes::PopulateProgress::from(
                            self.populate.as_ref(),
                        ))
                        .map_err(|e| VmmActionError::Internal(e.to_string()))?;
                        map.insert("populate_progress".into(), progress);
                    }
                }
                Ok(VmmData::Json(value))
            }
            VmmAction::PutMemory(m) if not_started => {
                if let Some(bad) = m
                    .host_nodes
                    .iter()
                    .flatten()
                    .find(|&&n| self.topology.node(n).is_none())
                {
                    return Err(VmmActionError::BadRequest(format!(
                        "memory.host_nodes: node {bad} does not exist on this host"
                    )));
                }
                let nodes = m
                    .host_nodes
                    .as_ref()
                    .map_or(self.topology.nodes_with_memory().len(), Vec::len);
                crate::config::check_worker_threads(self.config.reclaim.workers_per_node, nodes)
                    .map_err(|e| VmmActionError::BadRequest(e.to_string()))?;
                crate::config::check_guest_memfd(&m, &self.gmem_support).map_err(bad)?;
                crate::config::check_backing_pages(&self.config.machine_config, &m).map_err(bad)?;
                self.config.memory = m;
                Ok(VmmData::Empty)
            }
            VmmAction::PutMemory(_) => refused("changing the memory configuration", state),
            VmmAction::GetReclaim => to_json(&shapes::ReclaimReport::from(&self.reclaim_report())),
            VmmAction::PutReclaim(r)
                if matches!(
                    state,
                    VmState::NotStarted | VmState::Running | VmState::Paused
                ) =>
            {
                crate::config::check_worker_threads(r.workers_per_node, self.guest_nodes())
                    .map_err(|e| VmmActionError::BadRequest(e.to_string()))?;
                self.config.reclaim = r;
                Ok(VmmData::Empty)
            }
            VmmAction::PutReclaim(_) => refused("changing the reclaim configuration", state),
            VmmAction::PatchVm(change) => self.patch_vm(change),
            VmmAction::PutCpuConfig(t) if not_started => {
                self.config.cpu_config = Some(t);
                Ok(VmmData::Empty)
            }
            VmmAction::PutCpuConfig(_) => refused("PUT /cpu-config", state),
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
            VmmAction::PutBalloon(b) if not_started => {
                check_balloon_target(b.amount_mib, self.config.machine_config.mem_size_mib)
                    .map_err(bad)?;
                check_count_with(&self.config, &self.topology, |c| c.balloon = Some(b)).map_err(bad)?;
                self.config.balloon = Some(b);
                Ok(VmmData::Empty)
            }
            VmmAction::PutBalloon(_) => refused("configuring the balloon (PUT /balloon)", state),
            VmmAction::PatchBalloon(u) => self.patch_balloon(u.amount_mib),
            VmmAction::GetBalloon => match (&self.phase, &self.config.balloon) {
                (Phase::Running(m), _) if m.balloon().is_some() => {
                    let b = m.balloon().map(|b| lock(&b.device).options());
                    to_json(&b.as_ref().map(shapes::BalloonShape::from))
                }
                (_, Some(b)) => to_json(&shapes::BalloonShape::from(b)),
                (_, None) => Err(no_balloon()),
            },
            VmmAction::GetBalloonStatistics => self.balloon_statistics(),
            VmmAction::PatchBalloonStatistics(u) => {
                let Some(config) = self.config.balloon.as_mut() else {
                    return Err(no_balloon());
                };
                match &self.phase {
                    Phase::Running(m) => {
                        if let Some(b) = m.balloon() {
                            lock(&b.device)
                                .set_stats_polling_interval(u.stats_polling_interval_s)
                                .map_err(bad)?;
                        }
                    }
                    Phase::Configuring => {}
                    _ => return refused("changing the balloon statistics", state),
                }
                config.stats_polling_interval_s = u.stats_polling_interval_s;
                Ok(VmmData::Empty)
            }
            // The region before the start, its size and status while running
            // (`vmm::hotplug_actions`).
            a @ (VmmAction::PutHotplugMemory(_)
            | VmmAction::PatchHotplugMemory(_)
            | VmmAction::GetHotplugMemory) => self.hotplug_action(a),
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
        }
    }

    /// The devices' metrics groups while they run
    /// ([`Devices::metrics_groups`](super::devices::Devices::metrics_groups)),
    /// the MMDS's among them.
    fn device_metrics(&self) -> Vec<(String, Value)> {
        match &self.phase {
            Phase::Running(m) => m
                .devices()
                .map_or_else(Vec::new, |d| d.metrics_groups(self.mmds_metrics(&d.nets))),
            _ => Vec::new(),
        }
    }

    /// `PATCH /balloon`: a new target, before start in the configuration,
    /// while running on the device (the guest is told by a configuration
    /// interrupt).
    fn patch_balloon(&mut self, amount_mib: u32) -> ActionResult {
        check_balloon_target(amount_mib, self.config.machine_config.mem_size_mib).map_err(bad)?;
        let state = self.state();
        let Some(config) = self.config.balloon.as_mut() else {
            return Err(no_balloon());
        };
        match &self.phase {
            Phase::Running(m) => {
                let Some(b) = m.balloon() else {
                    return Err(no_balloon());
                };
                lock(&b.device)
                    .set_target(u64::from(amount_mib))
                    .map_err(bad)?;
            }
            Phase::Configuring => {}
            _ => return refused("changing the balloon target", state),
        }
        config.amount_mib = amount_mib;
        Ok(VmmData::Empty)
    }

    /// `GET /balloon/statistics`: the target and actual size, the guest's
    /// counters (when its statistics queue is on) and teravm's own discard
    /// counters.
    fn balloon_statistics(&self) -> ActionResult {
        let Phase::Running(m) = &self.phase else {
            return match self.config.balloon {
                Some(_) => Err(VmmActionError::BadRequest(format!(
                    "the balloon's statistics exist while the microVM runs; it is \"{}\"",
                    self.state().as_str()
                ))),
                None => Err(no_balloon()),
            };
        };
        let Some(b) = m.balloon() else {
            return Err(no_balloon());
        };
        let teravm = b
            .discard
            .snapshot()
            .map(|s| shapes::BalloonTeravmCounters {
                discarded_bytes: s.bytes_discarded,
                discarded_bytes_per_node: s.per_node.iter().map(|n| (n.node, n.bytes)).collect(),
                ranges: s.ranges,
                refused_bytes: s.refused_bytes,
                failures: s.failures,
                discard_bytes_per_s: s.rate_bytes_per_sec as u64,
            })
            .unwrap_or_default();
        let device = lock(&b.device);
        let sizes = shapes::BalloonSizes {
            target_pages: device.target_pages(),
            actual_pages: device.actual_pages(),
            target_mib: device.target_mib(),
            actual_mib: device.actual_mib(),
        };
        let none = crate::devices::virtio::balloon::BalloonStats::default();
        let guest = device.latest_stats().unwrap_or(&none);
        to_json(&shapes::BalloonStatisticsShape::new(sizes, guest, &teravm))
    }

    /// How many host nodes the guest spans: its slices once it runs, else
    /// what its memory configuration selects.
    pub(super) fn guest_nodes(&self) -> usize {
        if !self.slices.is_empty() {
            let mut nodes: Vec<u32> = self.slices.iter().map(|s| s.host_node).collect();
            nodes.sort_unstable();
            nodes.dedup();
            return nodes.len();
        }
        self.config
            .memory
            .host_nodes
            .as_ref()
            .map_or(self.topology.nodes_with_memory().len(), Vec::len)
    }

    /// What a reclaim of the microVM will do, as a report of nothing done
    /// yet: the async `Shutdown` reply, and `GET /reclaim` between the
    /// shutdown and the start of the executor (while the vCPUs stop and KVM
    /// closes). The executor's own numbers take over once it begins.
    pub(super) fn planned_report(&self) -> ReclaimReport {
        // Before the start job has mapped the slices (a shutdown during
        // start), the plan of the configuration says what will be freed.
        let slices: Vec<(u32, u64)> = if self.slices.is_empty() {
            crate::memory::GuestMemory::plan(
                &crate::memory::MemoryOptions::from(&self.config),
                &self.topology,
            )
            .map(|p| p.iter().map(|s| (s.node, s.len)).collect())
            .unwrap_or_default()
        } else {
            self.slices
                .iter()
                .map(|s| (s.host_node, s.size_bytes))
                .collect()
        };
        let mut nodes: Vec<(u32, u64)> = Vec::new();
        for (node, len) in slices {
            match nodes.iter_mut().find(|n| n.0 == node) {
                Some(n) => n.1 += len,
                None => nodes.push((node, len)),
            }
        }
        nodes.sort_unstable();
        ReclaimReport::planned(&nodes, &ReclaimOptions::from(&self.config.reclaim))
    }

    /// `GET /reclaim`: the executor's progress, or the plan while it has not
    /// begun yet during a shutdown.
    pub(super) fn reclaim_report(&self) -> ReclaimReport {
        let report = self.progress.snapshot();
        let shutting_down = matches!(self.state(), VmState::ShuttingDown | VmState::Reclaiming);
        if report.state == ReclaimState::Idle && shutting_down {
            self.planned_report()
        } else {
            report
        }
    }
}
