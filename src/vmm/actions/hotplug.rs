//! `PUT`, `PATCH` and `GET /hotplug/memory` on the VMM, as Firecracker
//! answers them: the region is set before the start only (stored in the
//! configuration, which the start path reads); the requested size and the
//! status exist once the microVM runs, through its
//! [`Hotplug`](crate::vmm::devices::Hotplug). Before the start `PATCH` and
//! `GET` answer Firecracker's `OperationNotSupportedPreBoot`; once running
//! without a region, 400 saying none is configured.

use super::{misrouted, not_before_start, refused};
use crate::api::{ActionResult, VmmAction, VmmActionError, VmmData};
use crate::vmm::lifecycle::Phase;
use crate::vmm::{VmState, Vmm};

fn not_configured() -> VmmActionError {
    VmmActionError::BadRequest(
        "memory hotplug is not configured (PUT /hotplug/memory before InstanceStart)".into(),
    )
}

impl Vmm {
    /// One `/hotplug/memory` action (the others are not routed here).
    pub(super) fn hotplug_action(&mut self, action: VmmAction, state: VmState) -> ActionResult {
        let not_started = state == VmState::NotStarted;
        match action {
            VmmAction::PutHotplugMemory(c) if not_started => {
                crate::config::check_hotplug_pages(&self.config.machine_config, Some(&c))
                    .map_err(|e| VmmActionError::BadRequest(e.to_string()))?;
                crate::vmm::device_opens::check_count_with(&self.config, &self.topology, |n| {
                    n.memory_hotplug = Some(c)
                })
                .map_err(VmmActionError::BadRequest)?;
                self.config.memory_hotplug = Some(c);
                Ok(VmmData::Empty)
            }
            VmmAction::PutHotplugMemory(_) => {
                refused("configuring memory hotplug (PUT /hotplug/memory)", state)
            }
            VmmAction::PatchHotplugMemory(_) if not_started => {
                not_before_start("PATCH /hotplug/memory")
            }
            VmmAction::GetHotplugMemory if not_started => not_before_start("GET /hotplug/memory"),
            VmmAction::PatchHotplugMemory(u) => match &self.phase {
                Phase::Running(m) => m
                    .hotplug()
                    .ok_or_else(not_configured)?
                    .update(u.requested_size_mib)
                    .map(|()| VmmData::Empty)
                    .map_err(|e| VmmActionError::BadRequest(e.to_string())),
                _ => refused("changing the hotplugged size", state),
            },
            VmmAction::GetHotplugMemory => match &self.phase {
                Phase::Running(m) => {
                    serde_json::to_value(m.hotplug().ok_or_else(not_configured)?.status())
                        .map(VmmData::Json)
                        .map_err(|e| VmmActionError::Internal(e.to_string()))
                }
                _ => refused("reading the hotplug status", state),
            },
            other => Err(misrouted(&other, "hotplug_action")),
        }
    }
}
