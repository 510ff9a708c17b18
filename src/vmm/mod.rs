//! The VMM: one microVM's life, driven by an `event-manager` loop on the main
//! thread.
//!
//! The loop waits on four `EventFd`-like sources: vCPU events (a vCPU ended
//! the VM: reset, crash), SIGTERM/SIGINT (a signalfd), API requests (an mpsc
//! channel plus an `EventFd`, each request with its own reply channel) and
//! the end of reclaim. Every way of shutting down (guest reset, signal, API
//! `Shutdown`, guest crash) takes the same path: stop and join the vCPUs,
//! hand guest memory to a `reclaim` thread that frees it with per-node
//! workers, keep answering the API (`GET /reclaim` shows live progress)
//! while it runs, then print the summary and exit.

mod actions;
pub mod builder;
pub mod signals;

use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use event_manager::{EventManager, EventOps, EventSet, Events, MutEventSubscriber, SubscriberOps};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::api::{ActionResult, ApiRequest, ApiServer, ApiServerError, VmmActionError, VmmData};
use crate::config::VmConfig;
use crate::devices::SerialOut;
use crate::memory::{
    HostTopology, NumaError, ReclaimError, ReclaimOptions, ReclaimProgress, ReclaimReport,
};
use crate::vstate::vcpu::VcpuEvent;
use builder::{start_microvm, MicroVm, SliceInfo, StartError};
use signals::{signal_name, ShutdownSignals, SignalError};

/// Exit code: the microVM shut down normally (reset, signal, API).
pub const EXIT_OK: i32 = 0;
/// Exit code: bad configuration or the microVM could not start.
pub const EXIT_ERROR: i32 = 1;
/// Exit code: the guest crashed (triple fault, firmware error, KVM error).
pub const EXIT_GUEST_CRASHED: i32 = 3;
/// Exit code: reclaim reported errors (the memory was still freed).
pub const EXIT_RECLAIM_FAILED: i32 = 4;
/// Exit code: a thread made a system call its seccomp filter forbids.
pub const EXIT_BAD_SYSCALL: i32 = crate::seccomp::EXIT_BAD_SYSCALL;

/// When the KVM VM (its memslots and MMU) is torn down relative to freeing
/// guest memory. While memslots exist, every `madvise` of guest memory goes
/// through KVM's MMU notifier, which zaps the range's shadow/EPT entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum KvmTeardown {
    /// Close the VM fd first, then free memory: measured ~4x faster for a
    /// 1 TiB sparse guest (each `madvise` otherwise walks the memslot in KVM's
    /// MMU notifier) and equal for a 4 GiB one; see CHANGELOG.
    #[default]
    BeforeReclaim,
    /// Free memory with the VM still alive, then close it.
    AfterReclaim,
}

const TOKEN_VCPU: u32 = 1;
const TOKEN_SIGNAL: u32 = 2;
const TOKEN_API: u32 = 3;
const TOKEN_RECLAIM: u32 = 4;

/// Errors that end the VMM before or outside the microVM's life.
#[derive(Debug, thiserror::Error)]
pub enum VmmError {
    /// Signals could not be set up.
    #[error(transparent)]
    Signals(#[from] SignalError),
    /// The host topology could not be read.
    #[error("host topology: {0}")]
    Topology(#[from] NumaError),
    /// The API socket could not be served.
    #[error("API socket: {0}")]
    Api(#[from] ApiServerError),
    /// An `EventFd` could not be made.
    #[error("cannot create an eventfd: {0}")]
    EventFd(std::io::Error),
    /// The event loop failed.
    #[error("event loop: {0:?}")]
    EventLoop(event_manager::Error),
    /// The serial output file could not be opened.
    #[error("cannot open the serial output file {path}: {source}")]
    SerialFile {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The microVM could not start.
    #[error("cannot start the microVM: {0}")]
    Start(#[from] StartError),
}

/// Where the microVM is in its life, as `GET /` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VmState {
    /// Configured (or not yet), waiting for `InstanceStart`.
    NotStarted,
    /// vCPUs running.
    Running,
    /// Stopping the vCPUs.
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
            VmState::Running => "Running",
            VmState::ShuttingDown => "Shutting down",
            VmState::Reclaiming => "Reclaiming",
            VmState::Stopped => "Stopped",
        }
    }
}

/// Why the microVM is shutting down.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ShutdownReason {
    /// The guest asked for a reset.
    GuestReset,
    /// SIGTERM or SIGINT.
    Signal(i32),
    /// The API's `Shutdown` action.
    Api,
    /// The guest or its vCPU failed.
    GuestCrashed(String),
}

/// How to run the VMM, from the command line.
#[derive(Debug, Clone)]
pub struct VmmOptions {
    /// The instance id, shown by `GET /`.
    pub id: String,
    /// Where the host topology is read from (`/sys` normally).
    pub sysfs_root: PathBuf,
    /// Serve the API on this socket.
    pub api_sock: Option<PathBuf>,
    /// Also write the serial console to this file.
    pub serial_file: Option<PathBuf>,
    /// With an API socket: how long the final state is served after reclaim.
    pub linger: Duration,
    /// Start the microVM at once (`--no-api`), without waiting for `InstanceStart`.
    pub start_at_once: bool,
    /// When KVM is torn down relative to reclaim.
    pub kvm_teardown: KvmTeardown,
}

/// How a reclaim ended: its report (also when it had failures, since the
/// memory is freed all the same) and its error, if any.
type ReclaimOutcome = (Option<ReclaimReport>, Option<String>);

struct ReclaimJob {
    thread: JoinHandle<ReclaimOutcome>,
}

/// The VMM of one microVM.
pub struct Vmm {
    opts: VmmOptions,
    serial_file: Option<std::fs::File>,
    config: VmConfig,
    topology: HostTopology,
    state: VmState,
    microvm: Option<MicroVm>,
    slices: Vec<SliceInfo>,
    vcpu_tx: Sender<VcpuEvent>,
    vcpu_rx: Receiver<VcpuEvent>,
    vcpu_evt: EventFd,
    signals: ShutdownSignals,
    api_rx: Option<Receiver<ApiRequest>>,
    api_evt: EventFd,
    progress: Arc<ReclaimProgress>,
    reclaim: Option<ReclaimJob>,
    reclaim_evt: EventFd,
    sync_waiters: Vec<Sender<ActionResult>>,
    exit_code: i32,
    finished_at: Option<Instant>,
}

impl Vmm {
    /// Starts the microVM now.
    fn start(&mut self) -> Result<(), StartError> {
        // The file was opened by `run`, so a bad path failed before anything
        // started; a clone shares its append offset.
        let serial = match self.serial_file.as_ref().map(std::fs::File::try_clone) {
            Some(Ok(f)) => SerialOut::StdoutAndFile(f),
            Some(Err(e)) => {
                log::warn!("serial file: {e}; writing to stdout only");
                SerialOut::Stdout
            }
            None => SerialOut::Stdout,
        };
        let microvm = start_microvm(
            &self.config,
            &self.topology,
            serial,
            self.vcpu_tx.clone(),
            &self.vcpu_evt,
        )?;
        self.slices = microvm.slices.clone();
        log::info!(
            "microVM {} started: {} vCPUs, {} MiB over {} slices",
            self.opts.id,
            self.config.machine_config.vcpu_count,
            self.config.machine_config.mem_size_mib,
            self.slices.len()
        );
        self.microvm = Some(microvm);
        self.state = VmState::Running;
        Ok(())
    }

    /// Stops the vCPUs and starts reclaiming guest memory on a `reclaim`
    /// thread. Does nothing unless the microVM is running.
    fn begin_shutdown(&mut self, reason: ShutdownReason) {
        if self.state != VmState::Running {
            return;
        }
        match &reason {
            ShutdownReason::GuestCrashed(why) => {
                log::error!("guest crashed: {why}; shutting down");
                self.exit_code = EXIT_GUEST_CRASHED;
            }
            other => log::info!("shutting down: {other:?}"),
        }
        self.state = VmState::ShuttingDown;
        let Some(mut microvm) = self.microvm.take() else {
            return;
        };
        let panicked = microvm.stop_vcpus();
        if panicked > 0 {
            log::error!("{panicked} vCPU threads panicked");
            self.exit_code = EXIT_GUEST_CRASHED;
        }
        self.state = VmState::Reclaiming;
        let opts = ReclaimOptions::from(&self.config.reclaim);
        let topology = self.topology.clone();
        let progress = self.progress.clone();
        let done = self.reclaim_evt.try_clone();
        let teardown = self.opts.kvm_teardown;
        let job = move || {
            crate::seccomp::install_thread(crate::seccomp::Role::Reclaim);
            let start = Instant::now();
            let MicroVm { vm, memory, .. } = microvm;
            let vm = match teardown {
                KvmTeardown::BeforeReclaim => {
                    drop(vm);
                    None
                }
                KvmTeardown::AfterReclaim => Some(vm),
            };
            let kvm_closed = start.elapsed();
            let result = match memory.reclaim(&opts, &topology, &progress) {
                Ok(report) => (Some(report), None),
                Err(ReclaimError::Failed { failures, report }) => {
                    (Some(*report), Some(failures.join("; ")))
                }
                Err(e) => (None, Some(e.to_string())),
            };
            drop(vm);
            log::info!(
                "teardown ({teardown:?}): {} ms in all, of which {} ms closing KVM before reclaim",
                start.elapsed().as_millis(),
                kvm_closed.as_millis()
            );
            if let Ok(done) = done {
                let _ = done.write(1);
            }
            result
        };
        match std::thread::Builder::new()
            .name("reclaim".into())
            .spawn(job)
        {
            Ok(thread) => self.reclaim = Some(ReclaimJob { thread }),
            Err(e) => {
                // The job was moved into the failed spawn and dropped with it:
                // dropping guest memory unmaps it, so nothing leaks.
                log::error!(
                    "cannot spawn the reclaim thread ({e}); memory was unmapped in one thread"
                );
                self.exit_code = self.exit_code.max(EXIT_RECLAIM_FAILED);
                self.finish((None, Some(format!("cannot spawn the reclaim thread: {e}"))));
            }
        }
    }

    fn reclaim_done(&mut self) {
        let Some(job) = self.reclaim.take() else {
            return;
        };
        let outcome = job.thread.join().unwrap_or_else(|_| {
            // Guest memory was dropped (unmapped) while the thread unwound.
            (None, Some("the reclaim thread panicked".to_string()))
        });
        self.finish(outcome);
    }

    fn finish(&mut self, (report, error): ReclaimOutcome) {
        if let Some(report) = &report {
            if crate::devices::serial::stdout_mid_line() {
                // The guest stopped mid-line: start the summary on a fresh one.
                println!();
            }
            println!("{}", report.summary_line());
            log::info!("{}", report.summary_line());
        }
        let reply: ActionResult = match (&report, &error) {
            (Some(report), None) => serde_json::to_value(report)
                .map(VmmData::Json)
                .map_err(|e| VmmActionError::Internal(e.to_string())),
            (_, Some(e)) => {
                log::error!("reclaim failed: {e} (what the workers left was freed on the reclaim thread, then unmapped)");
                if self.exit_code == EXIT_OK {
                    self.exit_code = EXIT_RECLAIM_FAILED;
                }
                Err(VmmActionError::Internal(format!("reclaim failed: {e}")))
            }
            (None, None) => Err(VmmActionError::Internal(
                "reclaim ended without a report".into(),
            )),
        };
        for waiter in self.sync_waiters.drain(..) {
            let _ = waiter.send(reply.clone());
        }
        self.state = VmState::Stopped;
        self.finished_at = Some(Instant::now());
    }

    fn on_vcpu_event(&mut self, event: VcpuEvent) {
        let reason = match event {
            VcpuEvent::Reset { index } => {
                log::info!("vcpu{index}: the guest asked for a reset");
                ShutdownReason::GuestReset
            }
            VcpuEvent::Crashed { index, reason } => {
                ShutdownReason::GuestCrashed(format!("vcpu{index}: {reason}"))
            }
            VcpuEvent::FirmwareError { index, code } => ShutdownReason::GuestCrashed(format!(
                "vcpu{index}: the firmware reported error {code}"
            )),
            VcpuEvent::RunFailed { index, error } => {
                ShutdownReason::GuestCrashed(format!("vcpu{index}: {error}"))
            }
        };
        self.begin_shutdown(reason);
    }

    fn on_signal(&mut self, signo: i32) {
        match self.state {
            VmState::Running => {
                log::info!("{} received", signal_name(signo));
                self.begin_shutdown(ShutdownReason::Signal(signo));
            }
            VmState::NotStarted => {
                log::info!("{} received before start; exiting", signal_name(signo));
                self.state = VmState::Stopped;
                self.finished_at = Some(Instant::now());
            }
            VmState::Stopped => {
                log::info!("{} received after reclaim; exiting now", signal_name(signo));
                self.opts.linger = Duration::ZERO;
            }
            state => log::warn!(
                "{} received while {}: reclaim continues, the process exits when memory is back",
                signal_name(signo),
                state.as_str()
            ),
        }
    }

    /// Whether the process should exit now; `Some(wait)` while lingering.
    fn exit_in(&self) -> Option<Duration> {
        let finished = self.finished_at?;
        if self.api_rx.is_none() {
            return Some(Duration::ZERO);
        }
        Some(self.opts.linger.saturating_sub(finished.elapsed()))
    }
}

impl MutEventSubscriber for Vmm {
    fn process(&mut self, events: Events, _ops: &mut EventOps) {
        match events.data() {
            TOKEN_VCPU => {
                let _ = self.vcpu_evt.read();
                while let Ok(event) = self.vcpu_rx.try_recv() {
                    self.on_vcpu_event(event);
                }
            }
            TOKEN_SIGNAL => {
                while let Some(signo) = self.signals.read() {
                    self.on_signal(signo);
                }
            }
            TOKEN_API => {
                let _ = self.api_evt.read();
                loop {
                    let Some(request) = self.api_rx.as_ref().and_then(|rx| rx.try_recv().ok())
                    else {
                        break;
                    };
                    self.handle_request(request);
                }
            }
            TOKEN_RECLAIM => {
                let _ = self.reclaim_evt.read();
                self.reclaim_done();
            }
            other => log::warn!("event for unknown token {other}"),
        }
    }

    fn init(&mut self, ops: &mut EventOps) {
        let sources: [(i32, u32); 4] = [
            (self.vcpu_evt.as_raw_fd(), TOKEN_VCPU),
            (self.signals.as_raw_fd(), TOKEN_SIGNAL),
            (self.api_evt.as_raw_fd(), TOKEN_API),
            (self.reclaim_evt.as_raw_fd(), TOKEN_RECLAIM),
        ];
        for (fd, token) in sources {
            if let Err(e) = ops.add(Events::with_data_raw(fd, token, EventSet::IN)) {
                log::error!("cannot watch event source {token}: {e:?}");
            }
        }
    }
}

/// Runs one microVM to its end and returns the process exit code.
pub fn run(config: VmConfig, opts: VmmOptions) -> Result<i32, VmmError> {
    // Before any thread exists, so that every thread inherits the mask.
    let signals = ShutdownSignals::new()?;
    let topology = HostTopology::from_sysfs(&opts.sysfs_root)?;
    let serial_file = match &opts.serial_file {
        Some(path) => Some(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .map_err(|source| VmmError::SerialFile {
                    path: path.clone(),
                    source,
                })?,
        ),
        None => None,
    };
    let new_evt = || EventFd::new(EFD_NONBLOCK).map_err(VmmError::EventFd);
    let api_evt = new_evt()?;
    let (api, api_rx) = match &opts.api_sock {
        Some(path) => {
            let (tx, rx) = channel();
            let wake = api_evt.try_clone().map_err(VmmError::EventFd)?;
            (Some(ApiServer::start(path, tx, wake)?), Some(rx))
        }
        None => (None, None),
    };
    let (vcpu_tx, vcpu_rx) = channel();
    let mut vmm = Vmm {
        opts,
        serial_file,
        config,
        topology,
        state: VmState::NotStarted,
        microvm: None,
        slices: Vec::new(),
        vcpu_tx,
        vcpu_rx,
        vcpu_evt: new_evt()?,
        signals,
        api_rx,
        api_evt,
        progress: Arc::new(ReclaimProgress::new()),
        reclaim: None,
        reclaim_evt: new_evt()?,
        sync_waiters: Vec::new(),
        exit_code: EXIT_OK,
        finished_at: None,
    };
    if vmm.opts.start_at_once {
        vmm.start()?;
    }
    let vmm = Arc::new(std::sync::Mutex::new(vmm));
    let mut manager: EventManager<Arc<std::sync::Mutex<Vmm>>> =
        EventManager::new().map_err(VmmError::EventLoop)?;
    manager.add_subscriber(vmm.clone());
    crate::seccomp::install_thread(crate::seccomp::Role::Vmm);
    loop {
        let wait = vmm.lock().unwrap_or_else(|p| p.into_inner()).exit_in();
        let timeout_ms = match wait {
            Some(d) if d.is_zero() => break,
            Some(d) => i32::try_from(d.as_millis().max(1)).unwrap_or(i32::MAX),
            None => -1,
        };
        match manager.run_with_timeout(timeout_ms) {
            Ok(_) => {}
            Err(event_manager::Error::Epoll(e)) if e.errno() == libc::EINTR => {}
            Err(e) => return Err(VmmError::EventLoop(e)),
        }
    }
    let code = vmm.lock().unwrap_or_else(|p| p.into_inner()).exit_code;
    // The VMM first, so that requests it never took are answered 503 at
    // once; then the server, which waits for replies under way to be written.
    drop(manager);
    drop(vmm);
    drop(api);
    Ok(code)
}
