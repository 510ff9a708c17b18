//! `PATCH /vm`: pausing and resuming the vCPUs
//! ([`crate::vstate::pause`]), answered as Firecracker answers: before
//! start a 400; a pause while paused and a resume while running do nothing
//! and succeed; while paused `GET /` says `"Paused"`. A shutdown while
//! paused stops the held vCPUs (a stop releases them) and reclaims as ever.

use crate::api::action::{VmStateChange, VmStateWanted};
use crate::api::{VmmActionError, VmmData};
use crate::metrics::{Latency, LatencyLevel};
use crate::vmm::lifecycle::Phase;
use crate::vmm::{VmState, Vmm};
use crate::vstate::vcpu::VCPU_STOP_TIMEOUT;

impl Vmm {
    pub(in crate::vmm) fn patch_vm(
        &mut self,
        change: VmStateChange,
    ) -> Result<VmmData, VmmActionError> {
        let state = self.state();
        let vcpus = match (&self.phase, state) {
            (Phase::Running(m), VmState::Running | VmState::Paused) => m.vcpus(),
            (_, VmState::NotStarted) => {
                return Err(VmmActionError::BadRequest(
                    "PATCH /vm: the requested operation is not supported before starting the \
                     microVM"
                        .into(),
                ))
            }
            _ => None,
        };
        let Some(vcpus) = vcpus else {
            return Err(VmmActionError::BadRequest(format!(
                "PATCH /vm is not allowed in state \"{}\"",
                state.as_str()
            )));
        };
        let started = std::time::Instant::now();
        let latency = match change.state {
            VmStateWanted::Paused => Latency::PauseVm,
            VmStateWanted::Resumed => Latency::ResumeVm,
        };
        match change.state {
            VmStateWanted::Paused => {
                if !vcpus.pause(VCPU_STOP_TIMEOUT) {
                    vcpus.resume();
                    return Err(VmmActionError::Internal(format!(
                        "PATCH /vm: the vCPUs did not leave the guest within {VCPU_STOP_TIMEOUT:?}; \
                         resumed"
                    )));
                }
                log::info!("vCPUs paused");
            }
            VmStateWanted::Resumed => {
                vcpus.resume();
                log::info!("vCPUs resumed");
            }
        }
        // Firecracker's `latencies_us.vmm_pause_vm` / `vmm_resume_vm`.
        let us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
        crate::metrics::record_latency_us(latency, LatencyLevel::Vmm, us);
        Ok(VmmData::Empty)
    }
}
