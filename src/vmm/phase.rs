//! The microVM's life as phases, and the one place where it moves between
//! them: `Configuring → Starting(job) → Running(MicroVm) → Reclaiming(job)
//! → Stopped`. Each phase owns what it needs (a running microVM cannot be
//! written without its vCPUs and memory); the long steps run as jobs, so
//! the event loop only ever moves between phases and never waits.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::builder::{start_microvm, MicroVm, StartContext, StartError, Started};
use super::jobs::Job;
use super::progress_line::{self, ProgressLine};
use super::report::{ms, PhaseTimes, ShutdownReport};
use super::teardown::Teardown;
use super::{Vmm, EXIT_ERROR, EXIT_GUEST_CRASHED, EXIT_RECLAIM_FAILED};

use crate::api::{ActionResult, VmmActionError, VmmData};
use crate::devices::ConsoleSink;
use crate::memory::{
    PopulateProgress, ReclaimError, ReclaimOptions, ReclaimProgress, ReclaimState,
};

/// How long the console may take to write out what the guest printed last.
const CONSOLE_DRAIN_WAIT: Duration = Duration::from_millis(500);

/// Why the microVM is shutting down.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ShutdownReason {
    /// The guest asked for a reset.
    GuestReset,
    /// SIGTERM, SIGINT or SIGHUP.
    Signal(i32),
    /// The API's `Shutdown` action.
    Api,
    /// The guest or its vCPU failed.
    GuestCrashed(String),
}

/// A start under way.
pub struct Starting {
    pub(super) job: Job<Result<Started, StartError>>,
    pub(super) cancel: Arc<AtomicBool>,
    /// `InstanceStart` replies, sent when the start ends.
    pub(super) waiters: Vec<Sender<ActionResult>>,
    /// A shutdown asked for during the start.
    pub(super) shutdown: Option<(ShutdownReason, Instant)>,
}

/// A shutdown under way.
pub struct Reclaiming {
    pub(super) job: Job<ShutdownReport>,
}

/// Where the microVM is in its life.
pub enum Phase {
    /// Being configured; waits for `InstanceStart`.
    Configuring,
    /// The `start` job builds it.
    Starting(Starting),
    /// vCPUs run.
    Running(Box<MicroVm>),
    /// The `reclaim` job stops and frees it.
    Reclaiming(Reclaiming),
    /// Memory freed; the process exits (after a linger, for API shutdowns).
    Stopped,
}

/// Where the microVM is in its life, as `GET /` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VmState {
    /// Configured (or not yet), waiting for `InstanceStart`.
    NotStarted,
    /// Building the microVM (memory, memslots, populate, vCPUs).
    Starting,
    /// vCPUs running.
    Running,
    /// vCPUs held out of the guest (`PATCH /vm`).
    Paused,
    /// Stopping the vCPUs and closing KVM.
    ShuttingDown,
    /// Freeing guest memory.
    Reclaiming,
    /// Memory freed; the process is about to exit.
    Stopped,
}

impl VmState {
    /// The API's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            VmState::NotStarted => "Not started",
            VmState::Starting => "Starting",
            VmState::Running => "Running",
            VmState::Paused => "Paused",
            VmState::ShuttingDown => "Shutting down",
            VmState::Reclaiming => "Reclaiming",
            VmState::Stopped => "Stopped",
        }
    }
}

impl Vmm {
    /// The state `GET /` shows.
    pub(super) fn state(&self) -> VmState {
        match &self.phase {
            Phase::Configuring => VmState::NotStarted,
            Phase::Starting(_) => VmState::Starting,
            Phase::Running(m) if m.vcpus().is_some_and(|v| v.paused()) => VmState::Paused,
            Phase::Running(_) => VmState::Running,
            Phase::Reclaiming(_) if self.progress.snapshot().state == ReclaimState::Idle => {
                VmState::ShuttingDown
            }
            Phase::Reclaiming(_) => VmState::Reclaiming,
            Phase::Stopped => VmState::Stopped,
        }
    }

    /// Starts the `start` job (`InstanceStart`, or a config file). `reply`
    /// is answered when the start ends.
    pub(super) fn start(&mut self, reply: Option<Sender<ActionResult>>) {
        let replies: Vec<_> = reply.into_iter().collect();
        if let Err(e) = crate::config::check_worker_threads(
            self.config.reclaim.workers_per_node,
            self.guest_nodes(),
        ) {
            return self.start_failed(e.to_string(), replies);
        }
        let boot_timer: Option<Box<dyn FnOnce(Instant) + Send>> = if self.opts.boot_timer {
            Some(Box::new(log_boot_time))
        } else {
            None
        };
        let console_sinks = match self.console_sinks() {
            Ok(c) => c,
            Err(e) => return self.start_failed(e, replies),
        };
        let events_ready = match self.vcpu_evt.try_clone() {
            Ok(e) => e,
            Err(e) => return self.start_failed(format!("cannot clone an eventfd: {e}"), replies),
        };
        let devices = match self.device_specs() {
            Ok(d) => d,
            Err(e) => return self.start_failed(e, replies),
        };
        let cancel = Arc::new(AtomicBool::new(false));
        self.populate = Arc::new(PopulateProgress::new());
        let ctx = StartContext {
            config: self.config.clone(),
            boot_files: self.boot_files.clone(),
            kvm: self.kvm.clone(),
            topology: self.topology.clone(),
            console_sinks,
            on_first_output: boot_timer,
            events: self.vcpu_tx.clone(),
            events_ready,
            cancel: cancel.clone(),
            populate: self.populate.clone(),
            devices,
        };
        match self
            .start_runner
            .run(&self.start_evt, move || start_microvm(ctx))
        {
            Ok(job) => {
                self.phase = Phase::Starting(Starting {
                    job,
                    cancel,
                    waiters: replies,
                    shutdown: None,
                });
                self.inject_spurious_job_events();
            }
            Err(e) => self.start_failed(e.to_string(), replies),
        }
    }

    fn console_sinks(&self) -> Result<Vec<ConsoleSink>, String> {
        let mut sinks = Vec::new();
        if !self.serial_replaces_stdout {
            sinks.push(ConsoleSink::new(
                "stdout",
                Box::new(std::io::stdout()),
                None,
            ));
        }
        if let Some(file) = &self.serial_file {
            let file = file
                .try_clone()
                .map_err(|e| format!("cannot use the serial file: {e}"))?;
            sinks.push(ConsoleSink::new(
                "the serial file",
                Box::new(file),
                self.opts.serial_file_max_bytes,
            ));
        }
        Ok(sinks)
    }

    /// A start failed: the API clients are told and may fix the
    /// configuration and retry; a start from the config file ends the
    /// process with exit code 1.
    fn start_failed(&mut self, e: String, replies: Vec<Sender<ActionResult>>) {
        let had_clients = !replies.is_empty();
        for r in replies {
            let _ = r.send(Err(VmmActionError::BadRequest(format!(
                "cannot start the microVM: {e}"
            ))));
        }
        if had_clients {
            log::error!("cannot start the microVM: {e}");
            self.phase = Phase::Configuring;
        } else {
            self.say(&format!("teravm: cannot start the microVM: {e}"));
            self.exit_code = EXIT_ERROR;
            self.stop_unstarted();
        }
    }

    /// The `start` job ended: run the microVM, or go on to the shutdown
    /// asked for meanwhile, or report the error.
    pub(super) fn start_done(&mut self) {
        let result = match &self.phase {
            Phase::Starting(s) => s.job.try_join(),
            _ => None,
        };
        let Some(result) = result else {
            log::warn!(
                "a start-job completion event while {} with no result: ignored",
                self.state().as_str()
            );
            return;
        };
        let Phase::Starting(starting) = std::mem::replace(&mut self.phase, Phase::Configuring)
        else {
            unreachable!("the phase was Starting just above");
        };
        let Starting {
            waiters, shutdown, ..
        } = starting;
        match result.unwrap_or_else(|panic| Err(StartError::Panicked(panic))) {
            Ok(Started::Running(microvm)) => {
                for w in waiters {
                    let _ = w.send(Ok(VmmData::Empty));
                }
                log::info!(
                    "microVM {} started: {} vCPUs, {} MiB over {} slices",
                    self.opts.id,
                    self.config.machine_config.vcpu_count,
                    self.config.machine_config.mem_size_mib,
                    microvm.slices.len()
                );
                self.slices = microvm.slices.clone();
                self.phase = Phase::Running(Box::new(microvm));
                self.inject_spurious_job_events();
                if let Some((reason, at)) = shutdown {
                    self.begin_shutdown(reason, at);
                }
            }
            Ok(Started::Cancelled(teardown)) => {
                for w in waiters {
                    let _ = w.send(Err(VmmActionError::BadRequest(
                        "the microVM was shut down while it started".into(),
                    )));
                }
                let (reason, at) = shutdown.unwrap_or((ShutdownReason::Api, Instant::now()));
                self.reclaim(teardown, reason, at);
            }
            Err(e) => {
                self.start_failed(e.to_string(), waiters);
                if shutdown.is_some() {
                    self.stop_unstarted();
                }
            }
        }
    }

    /// With the fault `spurious-job-events`: both jobs' completion events
    /// are written though no job ended (a phase that does not await one
    /// must ignore it, and one that does must not take a result that is not
    /// there).
    fn inject_spurious_job_events(&self) {
        if crate::faults::injected(crate::faults::SPURIOUS_JOB_EVENTS) {
            let _ = self.start_evt.write(1);
            let _ = self.reclaim_evt.write(1);
        }
    }

    /// Memory hotplug as the configuration asks for it, with the number of
    /// node parts (devices) the plan gives it.
    fn hotplug_spec(&self) -> Result<Option<super::devices::HotplugSpec>, String> {
        let parts = super::device_opens::hotplug_parts(&self.config, &self.topology);
        let (Some(h), Some(parts)) = (&self.config.memory_hotplug, parts) else {
            return Ok(None);
        };
        let parts = parts?;
        let mib = |m: u32| u64::from(m) << 20;
        Ok(Some(super::devices::HotplugSpec {
            total_bytes: mib(h.total_size_mib),
            block_bytes: mib(h.block_size_mib),
            slot_bytes: mib(h.slot_size_mib),
            parts: parts.len(),
            dirty_log: self.config.machine_config.track_dirty_pages,
        }))
    }

    /// The devices the configuration asks for, with the files, taps and
    /// socket opened when they were put (one not open fails the start).
    pub(super) fn device_specs(&self) -> Result<super::devices::DeviceSpecs, String> {
        let r = &self.resources;
        Ok(super::devices::DeviceSpecs {
            balloon: self
                .config
                .balloon
                .as_ref()
                .map(crate::devices::virtio::balloon::BalloonOptions::from),
            discard_workers_per_node: self.config.reclaim.discard_workers(),
            drives: r.drive_specs(&self.config.drives)?,
            nets: self.with_mmds(r.net_specs(&self.config.network_interfaces)?),
            vsock: r.vsock_spec(self.config.vsock.as_ref())?,
            entropy: self
                .config
                .entropy
                .map(|e| e.rate_limiter.unwrap_or_default()),
            hotplug: self.hotplug_spec()?,
        })
    }

    /// A shutdown before anything runs: nothing to free.
    pub(super) fn stop_unstarted(&mut self) {
        self.phase = Phase::Stopped;
        self.finished_at = Some(Instant::now());
        self.linger = false;
    }

    /// Starts a shutdown, from whatever phase: during a start it cancels the
    /// start and reclaims what was built; while running it hands the
    /// microVM to the `reclaim` job. Every way of shutting down comes here.
    pub(super) fn begin_shutdown(&mut self, reason: ShutdownReason, at: Instant) {
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
            Phase::Reclaiming(_) | Phase::Stopped => {}
        }
    }

    /// Hands `teardown` to the `reclaim` job: stop the vCPUs, drain the
    /// console, close the VM fd, free guest memory with the per-node workers,
    /// timing each step.
    fn reclaim(&mut self, teardown: Teardown, reason: ShutdownReason, accepted: Instant) {
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
    pub(super) fn reclaim_done(&mut self) {
        let result = match &self.phase {
            Phase::Reclaiming(r) => r.job.try_join(),
            _ => None,
        };
        let Some(result) = result else {
            log::warn!(
                "a reclaim-job completion event while {} with no result: ignored",
                self.state().as_str()
            );
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
    fn say(&self, line: &str) {
        crate::output::line(line);
    }
}

/// `--boot-timer`: the guest's first console output marks the end of its
/// boot (the firmware's first line; a kernel's first message), logged in
/// Firecracker's words.
fn log_boot_time(at: Instant) {
    let since_start = at.saturating_duration_since(crate::logger::process_start());
    let cpu_us = crate::util::process_cpu_us();
    log::info!(
        "Guest-boot-time = {:>6} us {} ms, {:>6} CPU us {} CPU ms",
        since_start.as_micros(),
        since_start.as_millis(),
        cpu_us,
        cpu_us / 1000
    );
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
