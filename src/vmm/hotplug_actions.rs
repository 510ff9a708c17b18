//! `PUT`, `PATCH` and `GET /hotplug/memory` on the VMM, as Firecracker
//! answers them: the region is set before the start only (stored in the
//! configuration, which the start path reads); the requested size and the
//! status exist once the microVM runs, through its
//! [`Hotplug`](super::hotplug::Hotplug). Before the start `PATCH` and
//! `GET` answer Firecracker's `OperationNotSupportedPreBoot`.

use super::hotplug::Hotplug;
use super::phase::Phase;
use super::{VmState, Vmm};
use crate::api::{ActionResult, VmmAction, VmmActionError, VmmData};

fn not_configured() -> VmmActionError {
    VmmActionError::BadRequest(
        "memory hotplug is not configured (PUT /hotplug/memory before InstanceStart)".into(),
    )
}

impl Vmm {
    /// One `/hotplug/memory` action (the others are not routed here).
    pub(super) fn hotplug_action(&mut self, action: VmmAction) -> ActionResult {
        let state = self.state();
        let not_started = state == VmState::NotStarted;
        match action {
            VmmAction::PutHotplugMemory(c) if not_started => {
                self.config.memory_hotplug = Some(c);
                Ok(VmmData::Empty)
            }
            VmmAction::PutHotplugMemory(_) => {
                super::actions::refused("configuring memory hotplug (PUT /hotplug/memory)", state)
            }
            VmmAction::PatchHotplugMemory(_) if not_started => {
                super::actions::not_before_start("PATCH /hotplug/memory")
            }
            VmmAction::GetHotplugMemory if not_started => {
                super::actions::not_before_start("GET /hotplug/memory")
            }
            VmmAction::PatchHotplugMemory(u) => {
                let hotplug = self.running_hotplug(state, "changing the hotplugged size")?;
                hotplug
                    .update(u.requested_size_mib)
                    .map(|()| VmmData::Empty)
                    .map_err(|e| VmmActionError::BadRequest(e.to_string()))
            }
            VmmAction::GetHotplugMemory => {
                let status = self
                    .running_hotplug(state, "reading the hotplug status")?
                    .status();
                serde_json::to_value(status)
                    .map(VmmData::Json)
                    .map_err(|e| VmmActionError::Internal(e.to_string()))
            }
            other => Err(VmmActionError::Internal(format!(
                "{:?} reached hotplug_action",
                other.method_and_path()
            ))),
        }
    }

    /// The running microVM's virtio-mem devices: 400 when not running, or
    /// when no region was configured.
    fn running_hotplug(&self, state: VmState, what: &str) -> Result<&Hotplug, VmmActionError> {
        match &self.phase {
            Phase::Running(m) => m.hotplug().ok_or_else(not_configured),
            _ => Err(super::actions::refused(what, state)
                .err()
                .unwrap_or_else(not_configured)),
        }
    }
}
