//! `Shutdown` (sync or async) and `/reclaim`: the reclaim's configuration
//! (`PUT`, before the start or while running), its progress (`GET`: the
//! executor's numbers, or the plan until it begins), and the plan the async
//! `Shutdown` answers with at once.

use std::time::Instant;

use super::{misrouted, refused, to_json};
use crate::api::{ActionResult, ReclaimMode, VmmAction, VmmActionError, VmmData};
use crate::memory::{ReclaimOptions, ReclaimReport, ReclaimState};
use crate::vmm::{ShutdownReason, VmState, Vmm};

impl Vmm {
    /// `Shutdown`, sync or async: refused unless the microVM starts or
    /// runs; otherwise the one shutdown path ([`Vmm::begin_shutdown`]).
    /// The async reply goes at once, before the vCPUs stop, with the plan
    /// the `reclaim` job will run; the sync one when the memory is back.
    pub(in crate::vmm) fn shutdown(
        &mut self,
        mode: ReclaimMode,
        reply: std::sync::mpsc::Sender<ActionResult>,
    ) {
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
                let plan = self.planned_report();
                let _ = reply.send(to_json(&plan).map(|d| match d {
                    VmmData::Json(v) => VmmData::Accepted(v),
                    other => other,
                }));
            }
        }
        self.begin_shutdown(ShutdownReason::Api, accepted);
    }

    /// `GET` or `PUT /reclaim` (the others are not routed here).
    pub(super) fn reclaim_action(&mut self, action: VmmAction, state: VmState) -> ActionResult {
        match action {
            VmmAction::GetReclaim => to_json(&self.reclaim_report()),
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
            other => Err(misrouted(&other, "reclaim_action")),
        }
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
