//! The shutdown: every way of ending (guest reset or crash, signal, API
//! `Shutdown`, a shutdown during the start) comes to
//! [`Vmm::begin_shutdown`], which hands the microVM to the `reclaim` job
//! ([`reclaim_job`]: the one teardown order, then guest memory freed by the
//! per-node workers); its end writes the summary and answers the sync
//! `Shutdown`s.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::phase::{Phase, Reclaiming, ShutdownReason};
use super::progress_line::{self, ProgressLine};
use super::report::{ms, PhaseTimes, ShutdownReport};
use super::teardown::Teardown;
use crate::api::{ActionResult, VmmActionError, VmmData};
use crate::memory::{ReclaimError, ReclaimOptions, ReclaimProgress};
use crate::vmm::{Vmm, EXIT_GUEST_CRASHED, EXIT_RECLAIM_FAILED};

/// How long the console may take to write out what the guest printed last.
const CONSOLE_DRAIN_WAIT: Duration = Duration::from_millis(500);

impl Vmm {
    /// A shutdown before anything runs: nothing to free.
    pub(in crate::vmm) fn stop_unstarted(&mut self) {
        self.phase = Phase::Stopped;
        self.finished_at = Some(Instant::now());
        self.linger = false;
    }

    /// Starts a shutdown, from whatever phase: during a start it cancels the
    /// start and reclaims what was built; while running it hands the
    /// microVM to the `reclaim` job. Every way of shutting down comes here.
    pub(in crate::vmm) fn begin_shutdown(&mut self, reason: ShutdownReason, at: Instant) {
        match &mut self.phase {
            Phase::Configuring => self.stop_unstarted(),
            Phase::Starting(starting) => {
                if starting.shutdown.is_none() {
                    log::info!("shutting down during start: {reason:?}");
                    starting.cancel.store(true, Ordering::Release);
                    starting.shutdown = Some((reason, at));
                }
            }
            Phase::Running(_) => {
                let Phase::Running(microvm) =
                    std::mem::replace(&mut self.phase, Phase::Configuring)
                else {
                    unreachable!("matched Running above");
                };
                self.reclaim(Teardown::from(*microvm), reason, at);
            }
            Phase::Snapshotting(snapshotting) => {
                if snapshotting.shutdown.is_none() {
                    log::info!("shutting down once the snapshot is written: {reason:?}");
                    snapshotting.shutdown = Some((reason, at));
                }
            }
            Phase::Reclaiming(_) | Phase::Stopped => {}
        }
    }

    /// Hands `teardown` to the `reclaim` job: stop the vCPUs, drain the
    /// console, close the VM fd, free guest memory with the per-node workers,
    /// timing each step.
    pub(super) fn reclaim(
        &mut self,
        teardown: Teardown,
        reason: ShutdownReason,
        accepted: Instant,
    ) {
        match &reason {
            ShutdownReason::GuestCrashed(why) => {
                log::error!("guest crashed: {why}; shutting down");
                self.exit_code = EXIT_GUEST_CRASHED;
            }
            other => log::info!("shutting down: {other:?}"),
        }
        // Only an API shutdown lingers: a poller may still want the final
        // `GET /reclaim`. After a signal or the guest's own end, exit as
        // soon as the memory is back.
        self.linger = reason == ShutdownReason::Api;
        let opts = ReclaimOptions::from(&self.config.reclaim);
        let topology = self.topology.clone();
        let progress = self.progress.clone();
        let work = move || reclaim_job(teardown, &opts, &topology, progress, accepted);
        match self.reclaim_runner.run(&self.reclaim_evt, work) {
            Ok(job) => self.phase = Phase::Reclaiming(Reclaiming { job }),
            Err(e) => {
                // The work (and the guest memory it owned) was dropped: the
                // vCPUs were stopped and the memory unmapped in this thread.
                let report = ShutdownReport {
                    error: Some(format!("{e}; memory was unmapped in one thread")),
                    ..ShutdownReport::default()
                };
                self.finish(report);
            }
        }
    }

    /// The `reclaim` job ended (or panicked: its memory was unmapped as it
    /// unwound).
    pub(in crate::vmm) fn reclaim_done(&mut self) {
        let Some(result) = self.job_result(Phase::reclaim_job, "reclaim") else {
            return;
        };
        let report = result.unwrap_or_else(|panic| {
            self.progress.finish(false);
            ShutdownReport {
                error: Some(panic),
                ..ShutdownReport::default()
            }
        });
        self.finish(report);
    }

    fn finish(&mut self, mut report: ShutdownReport) {
        report.stderr_dropped_lines = crate::output::dropped_lines();
        report.host = Some(self.host_sources.clone());
        if let Some(line) = report.summary_line() {
            self.say(&line);
            // The log path's copy (stderr has the line already).
            log::info!(target: crate::logger::SUMMARY_TARGET, "{line}");
        }
        if report.vcpus.panicked > 0 {
            log::error!("{} vCPU threads panicked", report.vcpus.panicked);
            self.exit_code = self.exit_code.max(EXIT_GUEST_CRASHED);
        }
        let reply: ActionResult = match &report.error {
            None => serde_json::to_value(report.to_shape())
                .map(VmmData::Json)
                .map_err(|e| VmmActionError::Internal(e.to_string())),
            Some(e) => {
                log::error!("reclaim failed: {e} (the memory was still freed)");
                if self.exit_code != EXIT_GUEST_CRASHED {
                    self.exit_code = EXIT_RECLAIM_FAILED;
                }
                Err(VmmActionError::Internal(format!("reclaim failed: {e}")))
            }
        };
        for waiter in self.sync_waiters.drain(..) {
            let _ = waiter.send(reply.clone());
        }
        self.last_report = Some(report);
        self.phase = Phase::Stopped;
        self.finished_at = Some(Instant::now());
        // The last metrics line, with the final reclaim report.
        let _ = self.flush_metrics();
    }

    /// Queues one of teravm's own lines for stderr ([`crate::output`]): a
    /// full, closed or failing stderr drops and counts it, never blocks.
    pub(in crate::vmm) fn say(&self, line: &str) {
        crate::output::line(line);
    }
}

/// The `reclaim` job: tear down in order, timing each step.
fn reclaim_job(
    teardown: Teardown,
    opts: &ReclaimOptions,
    topology: &crate::memory::HostTopology,
    progress: Arc<ReclaimProgress>,
    accepted: Instant,
) -> ShutdownReport {
    let mut teardown = teardown;
    let mut report = ShutdownReport::default();
    let mut phases = PhaseTimes {
        accept_ms: ms(accepted.elapsed()),
        ..PhaseTimes::default()
    };
    // The one order: vCPUs, devices, console, VM fd; then memory below.
    let stopped = teardown.stop(CONSOLE_DRAIN_WAIT);
    report.vcpus = stopped.vcpus;
    report.devices = stopped.devices;
    report.console = stopped.console;
    phases.stop_vcpus_ms = stopped.stop_ms;
    phases.console_ms = stopped.console_ms;
    phases.close_vm_ms = stopped.close_vm_ms;
    let mut step = Instant::now();
    let mut lap = |slot: &mut f64| {
        *slot = ms(step.elapsed());
        step = Instant::now();
    };
    if crate::faults::injected("reclaim-thread-panic") {
        panic!(
            "injected reclaim job panic ({})",
            crate::faults::FAULT_INJECT_ENV
        );
    }
    let shown = progress.clone();
    let line = ProgressLine::spawn(move |t| progress_line::reclaim_text(&shown.snapshot(), t));
    let result = teardown
        .take_memory()
        .map(|memory| memory.reclaim(opts, topology, &progress));
    drop(line);
    match result {
        Some(Ok(r)) => report.reclaim = Some(r),
        Some(Err(ReclaimError::Failed {
            failures,
            report: r,
        })) => {
            report.reclaim = Some(*r);
            report.error = Some(failures.to_string());
        }
        Some(Err(e)) => report.error = Some(e.to_string()),
        None => report.error = Some("no guest memory to reclaim (a bug)".into()),
    }
    // `reclaim` frees with the executor, then unmaps: the executor's own
    // clock splits the two.
    let mut memory_ms = 0.0;
    lap(&mut memory_ms);
    phases.reclaim_ms = report
        .reclaim
        .as_ref()
        .map_or(memory_ms, |r| (r.elapsed_us as f64 / 1000.0).min(memory_ms));
    phases.unmap_ms = ((memory_ms - phases.reclaim_ms) * 1000.0).round() / 1000.0;
    phases.total_ms = ms(accepted.elapsed());
    report.phases = phases;
    log::info!("shutdown phases: {phases:?}");
    report
}
