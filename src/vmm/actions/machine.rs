//! The machine's configuration before the start: `GET`/`PUT`/`PATCH
//! /machine-config`, `GET`/`PUT /memory` (with the populate progress and
//! the slices once they exist) and `PUT /cpu-config`; each is checked whole
//! against the rest of the configuration and this host before it replaces
//! anything, and refused once the microVM has started.

use serde_json::Value;

use super::{bad, misrouted, refused, to_json};
use crate::api::{shapes, ActionResult, VmmAction, VmmActionError, VmmData};
use crate::vmm::{VmState, Vmm};

impl Vmm {
    /// One machine, memory or CPU-template action (the others are not
    /// routed here).
    pub(super) fn machine_action(&mut self, action: VmmAction, state: VmState) -> ActionResult {
        let not_started = state == VmState::NotStarted;
        match action {
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
            VmmAction::PutCpuConfig(t) if not_started => {
                self.config.cpu_config = Some(t);
                Ok(VmmData::Empty)
            }
            VmmAction::PutCpuConfig(_) => refused("PUT /cpu-config", state),
            other => Err(misrouted(&other, "machine_action")),
        }
    }
}
