//! The start: `InstanceStart` (or a config file) hands what the
//! configuration asks for to the `start` job ([`super::builder`]), and its
//! end moves the microVM to running, to the shutdown asked for meanwhile,
//! or back to configuring with the error told.

use std::sync::atomic::AtomicBool;
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::time::Instant;

use super::builder::{start_microvm, StartContext, StartError, Started};
use super::phase::{Phase, ShutdownReason, Starting};
use super::restore::{restore_microvm, RestoreSpec};
use crate::api::{ActionResult, VmmActionError, VmmData};
use crate::devices::ConsoleSink;
use crate::memory::PopulateProgress;
use crate::vmm::devices::{DeviceSpecs, HotplugSpec};
use crate::vmm::{Vmm, EXIT_ERROR};

impl Vmm {
    /// How many host nodes the guest spans: its slices once it runs, else
    /// what its memory configuration selects.
    pub(in crate::vmm) fn guest_nodes(&self) -> usize {
        if !self.slices.is_empty() {
            let mut nodes: Vec<u32> = self.slices.iter().map(|s| s.host_node).collect();
            nodes.sort_unstable();
            nodes.dedup();
            return nodes.len();
        }
        self.config
            .memory
            .host_nodes
            .as_ref()
            .map_or(self.topology.nodes_with_memory().len(), Vec::len)
    }

    /// Starts the `start` job (`InstanceStart`, or a config file). `reply`
    /// is answered when the start ends.
    pub(in crate::vmm) fn start(&mut self, reply: Option<Sender<ActionResult>>) {
        self.start_with(reply, None);
    }

    /// Starts the `start` job, booting or (`restore`) restoring a snapshot.
    pub(in crate::vmm) fn start_with(
        &mut self,
        reply: Option<Sender<ActionResult>>,
        restore: Option<RestoreSpec>,
    ) {
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
            .run(&self.start_evt, move || match restore {
                Some(spec) => restore_microvm(ctx, spec),
                None => start_microvm(ctx),
            }) {
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
        if let Some((config, resources, _)) = self.before_load.take() {
            // A load that failed leaves the process as it found it: fresh.
            self.config = *config;
            self.resources = resources;
        }
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
    pub(in crate::vmm) fn start_done(&mut self) {
        if matches!(self.phase, Phase::Snapshotting(_)) {
            return self.snapshot_done();
        }
        let Some(result) = self.job_result(Phase::start_job, "start") else {
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
            Ok(Started::Running(mut microvm)) => {
                self.uffd_handler = microvm.uffd_handler.take().map(|fd| (fd, false));
                if let Some((_, _, at)) = self.before_load.take() {
                    let us = at.elapsed().as_micros() as u64;
                    log::info!("snapshot loaded in {:.1} ms", us as f64 / 1e3);
                    crate::metrics::record_latency_us(
                        crate::metrics::Latency::LoadSnapshot,
                        crate::metrics::LatencyLevel::Vmm,
                        us,
                    );
                }
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
                // Again here: a log path set through the API (a jail's) was
                // not there for the start's line.
                log::info!("{}", self.host_sources);
                self.slices = microvm.slices.clone();
                self.phase = Phase::Running(Box::new(microvm));
                // A metrics line at once, as Firecracker writes one when
                // the microVM is built (its `PeriodicMetrics::start`):
                // Kata and firecracker-containerd's clients read the
                // metrics FIFO from the start. A failure is logged.
                let _ = self.flush_metrics();
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
    fn hotplug_spec(&self) -> Result<Option<HotplugSpec>, String> {
        let parts = crate::vmm::device_opens::hotplug_parts(&self.config, &self.topology);
        let (Some(h), Some(parts)) = (&self.config.memory_hotplug, parts) else {
            return Ok(None);
        };
        let parts = parts?;
        let mib = |m: u32| u64::from(m) << 20;
        Ok(Some(HotplugSpec {
            total_bytes: mib(h.total_size_mib),
            block_bytes: mib(h.block_size_mib),
            slot_bytes: mib(h.slot_size_mib),
            parts: parts.len(),
            dirty_log: self.config.machine_config.track_dirty_pages,
        }))
    }

    /// The devices the configuration asks for, with the files, taps and
    /// socket opened when they were put (one not open fails the start).
    pub(in crate::vmm) fn device_specs(&self) -> Result<DeviceSpecs, String> {
        let r = &self.resources;
        Ok(DeviceSpecs {
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
