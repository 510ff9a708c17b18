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

use crate::api::{VmmActionError, VmmData};
use crate::snapshot::{CreateSnapshotParams, LoadSnapshotParams};
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

    pub(in crate::vmm) fn create_snapshot(
        &mut self,
        params: CreateSnapshotParams,
    ) -> Result<VmmData, VmmActionError> {
        if let Some(why) = self.create_refusal() {
            return Err(VmmActionError::BadRequest(why));
        }
        let _ = params;
        Err(VmmActionError::BadRequest(
            "PUT /snapshot/create: not implemented yet".into(),
        ))
    }

    pub(in crate::vmm) fn load_snapshot(
        &mut self,
        params: LoadSnapshotParams,
    ) -> Result<VmmData, VmmActionError> {
        if let Some(why) = self.load_refusal() {
            return Err(VmmActionError::BadRequest(why));
        }
        let _ = params;
        Err(VmmActionError::BadRequest(
            "PUT /snapshot/load: not implemented yet".into(),
        ))
    }
}
