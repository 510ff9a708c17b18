//! `PUT /snapshot/create` and `PUT /snapshot/load`: first the state checks
//! Firecracker makes before doing anything, with its answers
//! ([`Vmm::create_refusal`], [`Vmm::load_refusal`]), then the work, on
//! the event loop's side: a create hands the paused microVM to the create
//! job on the `start` runner ([`crate::vmm::lifecycle::snapshot`]) and
//! takes it back when the job ends; a load has the `files` thread open and
//! check the snapshot ([`crate::vmm::snapshot_opens`]), then takes its
//! configuration and files and restores it on the `start` job
//! ([`crate::vmm::lifecycle::restore`]). A load that fails puts the
//! configuration back as it was (a fresh process), so it may be retried.
//!
//! Firecracker (`rpc_interface.rs`, `persist.rs`, `vstate/vcpu.rs`):
//! - create before `InstanceStart` is its `OperationNotSupportedPreBoot`;
//!   once started, the vCPUs refuse to save their state unless paused
//!   ("save/restore unavailable while running"), so a create answers 400
//!   unless paused.
//! - load once started is its `OperationNotSupportedPostBoot`; before, it
//!   is refused once anything configured the boot (its `boot_path`: see
//!   [`crate::api::VmmAction::configures_boot`]), with
//!   `LoadSnapshotNotAllowed`.

use std::sync::mpsc::Sender;
use std::sync::Arc;

use crate::api::{ActionResult, VmmActionError};
use crate::snapshot::{CreateSnapshotParams, LoadSnapshotParams, SnapshotType};
use crate::vmm::actions::opens::{Opening, Pending};
use crate::vmm::lifecycle::phase::Snapshotting;
use crate::vmm::lifecycle::restore::RestoreSpec;
use crate::vmm::lifecycle::snapshot::{create_job, CreateContext};
use crate::vmm::lifecycle::Phase;
use crate::vmm::snapshot_files::SnapshotFiles;
use crate::vmm::snapshot_opens::{open_snapshot, OpenedSnapshot};
use crate::vmm::{VmState, Vmm};

/// Firecracker's answer to a create while the vCPUs run.
pub const CREATE_WHILE_RUNNING: &str = "Create snapshot error: Cannot save the microVM state: \
                                        Operation not allowed: save/restore unavailable while \
                                        running";
/// Firecracker's answer to a load after the boot was configured.
pub const LOAD_AFTER_CONFIGURING: &str = "Load snapshot error: Loading a microVM snapshot not \
                                          allowed after configuring boot-specific resources.";

impl Vmm {
    /// Why a `PUT /snapshot/create` is refused in the VMM's state, if it
    /// is: it is taken only while the microVM is started and paused.
    pub(in crate::vmm) fn create_refusal(&self) -> Option<String> {
        let what = "PUT /snapshot/create";
        match self.state() {
            VmState::Paused => None,
            VmState::NotStarted | VmState::Starting => Some(format!(
                "{what}: the requested operation is not supported before starting the microVM"
            )),
            VmState::Running => Some(CREATE_WHILE_RUNNING.to_string()),
            state @ (VmState::ShuttingDown | VmState::Reclaiming | VmState::Stopped) => Some(
                format!("{what} is not allowed in state \"{}\"", state.as_str()),
            ),
        }
    }

    /// Why a `PUT /snapshot/load` is refused in the VMM's state, if it is:
    /// it is taken only by a process not started, in which nothing
    /// configured the boot.
    pub(in crate::vmm) fn load_refusal(&self) -> Option<String> {
        match self.state() {
            VmState::NotStarted if self.boot_configured => Some(LOAD_AFTER_CONFIGURING.into()),
            VmState::NotStarted => None,
            _ => Some(
                "PUT /snapshot/load: the requested operation is not supported after starting \
                 the microVM"
                    .into(),
            ),
        }
    }

    /// `PUT /snapshot/create`: refused as Firecracker refuses it, and
    /// where teravm cannot write the snapshot yet (a second create under
    /// way, Diff, memory hotplug); else the `files` thread makes the two
    /// files, the paused microVM goes to the create job
    /// ([`crate::vmm::lifecycle::snapshot`]), and `reply` is answered once
    /// the `files` thread has renamed them.
    pub(in crate::vmm) fn create_snapshot(
        &mut self,
        params: CreateSnapshotParams,
        reply: Sender<ActionResult>,
    ) {
        let refusal =
            if matches!(self.phase, Phase::Snapshotting(_)) || self.snapshot_create_pending() {
                Some("PUT /snapshot/create: a snapshot is being created already".to_string())
            } else {
                self.create_refusal()
            };
        let refusal = refusal.or_else(|| {
            (params.snapshot_type == SnapshotType::Diff).then(|| {
                "PUT /snapshot/create: snapshot_type \"Diff\" is not supported by teravm yet \
                 (it writes Full snapshots, sparse: only the memory the guest has)"
                    .to_string()
            })
        });
        let refusal = refusal.or_else(|| {
            self.config.memory_hotplug.is_some().then(|| {
                "PUT /snapshot/create: a snapshot of a microVM with memory hotplug \
                 (virtio-mem) is not supported by teravm yet"
                    .to_string()
            })
        });
        if let Some(why) = refusal {
            crate::metrics::record_failure("PUT", "/snapshot/create");
            let _ = reply.send(Err(VmmActionError::BadRequest(why)));
            return;
        }
        let full = params.snapshot_type == SnapshotType::Full;
        let make = move || Opening::SnapshotFiles(Box::new(SnapshotFiles::create(&params)));
        self.run_then(
            "mem_file_path",
            make,
            Pending::SnapshotCreate { full },
            reply,
        );
    }

    /// `PUT /snapshot/load`: refused as Firecracker refuses it; else the
    /// `files` thread opens the snapshot and the `start` job restores it,
    /// answering `reply` ([`crate::vmm::lifecycle::restore`]).
    pub(in crate::vmm) fn load_snapshot(
        &mut self,
        params: LoadSnapshotParams,
        reply: Sender<ActionResult>,
    ) {
        let refusal = self.load_refusal().or_else(|| {
            self.pending_opens_any().then(|| {
                "PUT /snapshot/load: a configuration or a load is still being opened".to_string()
            })
        });
        if let Some(why) = refusal {
            crate::metrics::record_failure("PUT", "/snapshot/load");
            let _ = reply.send(Err(VmmActionError::BadRequest(why)));
            return;
        }
        self.begin_load(params, reply);
    }
}

impl Vmm {
    /// The snapshot's files were made: hands the paused microVM and them
    /// to the create job; `reply` is answered once the files are renamed.
    pub(in crate::vmm) fn begin_create(
        &mut self,
        full: bool,
        files: SnapshotFiles,
        reply: Sender<ActionResult>,
    ) {
        let refusal = if matches!(self.phase, Phase::Snapshotting(_)) {
            Some("PUT /snapshot/create: a snapshot is being created already".to_string())
        } else {
            self.create_refusal()
        };
        if let Some(why) = refusal {
            // The microVM moved on (resumed, shut down) while the files
            // were made.
            self.opts.files.run(move || files.discard(), |_| {});
            let _ = reply.send(Err(VmmActionError::BadRequest(why)));
            return;
        }
        let Phase::Running(microvm) = std::mem::replace(&mut self.phase, Phase::Configuring) else {
            self.opts.files.run(move || files.discard(), |_| {});
            let _ = reply.send(Err(VmmActionError::Internal(
                "a snapshot create reached a microVM not running".into(),
            )));
            return;
        };
        let ctx = CreateContext {
            full,
            config: self.config.clone(),
            topology: self.topology.clone(),
            workers_per_node: self.config.reclaim.workers_per_node,
            kvm: self.kvm.clone(),
        };
        // A job the runner cannot take drops the microVM with it, in the
        // teardown order: its memory is unmapped, not lost (its temporary
        // files stay, named `.<name>.partial`).
        let work = move || create_job(microvm, ctx, files);
        match self.start_runner.run(&self.start_evt, work) {
            Ok(job) => {
                self.phase = Phase::Snapshotting(Snapshotting {
                    job,
                    reply,
                    full,
                    shutdown: None,
                });
            }
            Err(e) => {
                let _ = reply.send(Err(VmmActionError::Internal(format!(
                    "cannot run the snapshot job: {e}"
                ))));
                log::error!("cannot run the snapshot job: {e}; the microVM was torn down");
                self.stop_unstarted();
            }
        }
    }

    /// The create job handed the microVM back: running (paused) again; the
    /// files are renamed (or removed) on the `files` thread, and the client
    /// is answered then; a shutdown asked for meanwhile is begun.
    pub(in crate::vmm) fn snapshot_done(&mut self) {
        let Some(result) = self.job_result(Phase::snapshot_job, "snapshot") else {
            return;
        };
        let Phase::Snapshotting(Snapshotting {
            reply,
            full,
            shutdown,
            ..
        }) = std::mem::replace(&mut self.phase, Phase::Configuring)
        else {
            unreachable!("the phase was Snapshotting just above");
        };
        let (microvm, files, created) = match result {
            Ok(outcome) => outcome,
            Err(panic) => {
                // The job unwound with the microVM: what it held was
                // dropped in the teardown order; nothing is left to run.
                let _ = reply.send(Err(VmmActionError::Internal(format!(
                    "the snapshot job panicked: {panic}"
                ))));
                self.stop_unstarted();
                return;
            }
        };
        self.phase = Phase::Running(microvm);
        match created {
            Ok(c) => {
                log::info!(
                    "snapshot written: {} MiB of {} MiB by {} workers in {:.1} ms, state {} bytes",
                    c.memory.copied_bytes >> 20,
                    c.memory.file_bytes >> 20,
                    c.memory.workers,
                    c.elapsed.as_secs_f64() * 1e3,
                    c.state_bytes
                );
                let section = Pending::SnapshotCommit {
                    full,
                    started: std::time::Instant::now() - c.elapsed,
                };
                let commit = move || Opening::SnapshotCommitted(files.commit());
                self.run_then("snapshot_path", commit, section, reply);
            }
            Err(e) => {
                log::error!("snapshot create failed: {e}");
                crate::metrics::record_failure("PUT", "/snapshot/create");
                self.opts.files.run(move || files.discard(), |_| {});
                let _ = reply.send(Err(VmmActionError::BadRequest(format!(
                    "cannot create the snapshot: {e}; the microVM stays paused"
                ))));
            }
        }
        if let Some((reason, at)) = shutdown {
            self.begin_shutdown(reason, at);
        }
    }

    /// The `files` thread renamed the files (or could not).
    pub(in crate::vmm) fn snapshot_committed(
        &mut self,
        full: bool,
        started: std::time::Instant,
        result: Result<(), String>,
    ) -> ActionResult {
        match result {
            Ok(()) => {
                let which = if full {
                    crate::metrics::Latency::FullCreateSnapshot
                } else {
                    crate::metrics::Latency::DiffCreateSnapshot
                };
                let us = started.elapsed().as_micros() as u64;
                crate::metrics::record_latency_us(which, crate::metrics::LatencyLevel::Vmm, us);
                log::info!("snapshot created in {:.1} ms", us as f64 / 1e3);
                Ok(crate::api::VmmData::Empty)
            }
            Err(e) => Err(VmmActionError::BadRequest(format!(
                "cannot create the snapshot: {e}; the microVM stays paused"
            ))),
        }
    }
}

impl Vmm {
    /// Sends the load's opens to the `files` thread (the caller checked the
    /// process may load).
    pub(in crate::vmm) fn begin_load(
        &mut self,
        params: LoadSnapshotParams,
        reply: Sender<ActionResult>,
    ) {
        let workers = self.config.reclaim.workers_per_node;
        let p = params.clone();
        let open = move || Opening::Snapshot(Box::new(open_snapshot(&p, workers)));
        self.run_then("snapshot_path", open, Pending::Snapshot(params), reply);
    }

    /// The snapshot is open: take its configuration and files, then
    /// restore it on the `start` job.
    pub(in crate::vmm) fn begin_restore(
        &mut self,
        opened: OpenedSnapshot,
        params: &LoadSnapshotParams,
        reply: Sender<ActionResult>,
    ) {
        if let Some(why) = self.load_refusal() {
            // Something was configured while the files were opened.
            let _ = reply.send(Err(VmmActionError::BadRequest(why)));
            return;
        }
        let OpenedSnapshot {
            state,
            memory,
            resources,
        } = opened;
        let mut config = state.config.clone();
        config.machine_config.track_dirty_pages = params.track_dirty_pages;
        // The loading process's own logger, metrics and reclaim settings.
        config.logger = self.config.logger.clone();
        config.metrics = self.config.metrics.clone();
        config.reclaim = self.config.reclaim.clone();
        let before = std::mem::replace(&mut self.config, config);
        let resources = std::mem::replace(&mut self.resources, resources);
        self.before_load = Some((Box::new(before), resources, std::time::Instant::now()));
        self.boot_files = None;
        log::info!(
            "loading the snapshot {} ({} vCPUs, {} MiB)",
            params.snapshot_path.display(),
            self.config.machine_config.vcpu_count,
            self.config.machine_config.mem_size_mib
        );
        self.start_with(
            Some(reply),
            Some(RestoreSpec {
                state: Arc::new(state),
                memory,
                resume: params.resume_vm,
            }),
        );
    }
}
