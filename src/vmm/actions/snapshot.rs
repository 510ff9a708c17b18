//! `PUT /snapshot/create` and `PUT /snapshot/load`: first the state checks
//! Firecracker makes before doing anything, with its answers
//! ([`Vmm::create_refusal`], [`Vmm::load_refusal`]), then the work.
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

use crate::api::{ActionResult, VmmActionError};
use crate::snapshot::{CreateSnapshotParams, LoadSnapshotParams, SnapshotType};
use crate::vmm::lifecycle::Phase;
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
    /// way, Diff, memory hotplug); else the paused microVM goes to the
    /// create job, which answers `reply` ([`crate::vmm::lifecycle::snapshot`]).
    pub(in crate::vmm) fn create_snapshot(
        &mut self,
        params: CreateSnapshotParams,
        reply: Sender<ActionResult>,
    ) {
        let refusal = if matches!(self.phase, Phase::Snapshotting(_)) {
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
        self.begin_create(params, reply);
    }

    /// `PUT /snapshot/load`: refused as Firecracker refuses it; else the
    /// `files` thread opens the snapshot and the `start` job restores it,
    /// answering `reply` ([`crate::vmm::lifecycle`]'s `load`).
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
