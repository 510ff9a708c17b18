//! The VMM: one microVM's life, driven by an `event-manager` loop on the main
//! thread that only moves between phases ([`lifecycle`]) and never waits on
//! a guest, a client or the host.
//!
//! The loop (this file) waits on `EventFd`-like sources: vCPU events (a
//! vCPU ended the VM: reset, crash), SIGTERM/SIGINT/SIGHUP (a signalfd,
//! [`signals`]), API requests (an mpsc channel plus an `EventFd`, each
//! request with its own reply channel), the end of the `start` and
//! `reclaim` jobs ([`jobs`]), the `files` thread's opens and stdin
//! ([`stdin`]). Every way of shutting down (guest reset, signal, API
//! `Shutdown` sync or async, guest crash) takes the same path: the microVM
//! goes to the `reclaim` job, which takes it apart in the one order of
//! [`lifecycle::teardown`] (vCPUs, devices, console, VM fd) and frees guest
//! memory with per-node workers while the API keeps answering (`GET
//! /reclaim` shows live progress); then the summary goes to stderr and the
//! process exits. A start that fails drops what it built in that same
//! order.
//!
//! Where to look:
//! - [`lifecycle`]: the phases and their moves: `phase.rs`, `start.rs`
//!   (and the `builder.rs` its job runs), `shutdown.rs` (and the
//!   `teardown.rs` its job runs), the shutdown's `report.rs`.
//! - [`actions`]: the one dispatch of API requests (`mod.rs`) and one file
//!   per subject (machine, balloon, hotplug, net, mmds, pause, shutdown,
//!   metrics; `opens.rs` for the ones that open a path first).
//! - [`devices`]: the device manager (every device built through one path,
//!   `build.rs`; their metrics groups, `metrics.rs`), the [`sinks`] that
//!   the balloon and virtio-mem give memory back through, and
//!   [`device_opens`], the devices' host files, taps and sockets opened
//!   when their section is put.
//!
//! Inside `vmm`, no two modules import each other: `actions` →
//! `lifecycle` → `devices` → `sinks`; `actions` → `device_opens` →
//! `devices` (the submodules' `impl Vmm` blocks name their parent's
//! `Vmm`).
//!
//! Module graph: `main` → `vmm` → (`api` contract, `config`, `vstate`,
//! `devices`, `memory`); `api` → `config`; `vstate` → `devices`; `memory`
//! uses only `util` and `faults` (and its tests `vstate`); `devices` uses
//! `memory` (guest views) and `seccomp` (the console writer installs its
//! own filter), nothing of `vmm`, `api` or `config`.

pub mod actions;
pub mod device_opens;
pub mod devices;
pub mod jobs;
pub mod lifecycle;
pub mod signals;
pub mod sinks;
pub mod snapshot_files;
pub mod snapshot_opens;
pub mod snapshot_state;
pub mod stdin;

use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use event_manager::{EventManager, EventOps, EventSet, Events, MutEventSubscriber, SubscriberOps};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::api::{ActionResult, ApiRequest, ApiServer, ApiServerError};
use crate::config::VmConfig;
use crate::memory::{HostTopology, NumaError, PopulateProgress, ReclaimProgress};
use crate::vstate::vcpu::VcpuEvent;
use actions::opens;
use lifecycle::builder::{self, SliceInfo};
use lifecycle::report::{self, ShutdownReport};
pub use lifecycle::VmState;
use lifecycle::{Phase, ShutdownReason};
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

const TOKEN_VCPU: u32 = 1;
const TOKEN_SIGNAL: u32 = 2;
const TOKEN_API: u32 = 3;
const TOKEN_RECLAIM: u32 = 4;
const TOKEN_START: u32 = 5;
const TOKEN_METRICS: u32 = 6;
const TOKEN_STDIN: u32 = 7;
const TOKEN_STDIN_RETRY: u32 = 8;
const TOKEN_FILES: u32 = 9;
const TOKEN_UFFD: u32 = 10;

/// Errors that end the VMM before or outside the microVM's life.
#[derive(Debug, thiserror::Error)]
pub enum VmmError {
    /// The seccomp filters could not be prepared.
    #[error("seccomp: {0}")]
    Seccomp(#[from] crate::seccomp::SeccompError),
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
    /// The metrics timer could not be made.
    #[error(transparent)]
    Metrics(#[from] crate::metrics::MetricsError),
    /// The event loop failed.
    #[error("event loop: {0:?}")]
    EventLoop(event_manager::Error),
    /// A file named by the command line or the config file could not be
    /// opened (the serial file, the kernel, the initrd).
    #[error(transparent)]
    Files(#[from] crate::files::FilesError),
    /// `/dev/kvm` could not be opened.
    #[error(transparent)]
    Kvm(#[from] crate::vstate::vm::VmError),
    /// A job runner could not be started.
    #[error(transparent)]
    Job(#[from] jobs::JobError),
    /// A device's host side (a tap, a vsock socket) could not be opened.
    #[error("{0}")]
    Device(String),
    /// The configuration asks for what this host cannot give (guest_memfd
    /// on a kernel without it).
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
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
    /// Start the microVM at once, without waiting for `InstanceStart`: a
    /// config file was given, as Firecracker does.
    pub start_at_once: bool,
    /// At most this many bytes go to the serial file.
    pub serial_file_max_bytes: Option<u64>,
    /// Firecracker's `--boot-timer`: log the guest's boot time.
    pub boot_timer: bool,
    /// Seccomp filters on (default); `--no-seccomp` turns them off.
    pub seccomp: bool,
    /// Firecracker's `--http-api-max-payload-size`: the most bytes a request
    /// body may have (for `ServerLimits`).
    pub api_max_payload_bytes: usize,
    /// The metadata service's store (`--metadata`, `--mmds-size-limit`).
    pub mmds: crate::mmds::SharedMmds,
    /// The `files` thread, which opens every path a user names.
    pub files: crate::files::FileOpener,
}

/// The VMM of one microVM.
pub struct Vmm {
    opts: VmmOptions,
    serial_file: Option<std::fs::File>,
    /// `PUT /serial` set the serial file: the guest's output goes there
    /// only, not to stdout (Firecracker's `serial_out_path`).
    serial_replaces_stdout: bool,
    config: VmConfig,
    /// The boot source's kernel and initrd, opened when it was put.
    boot_files: Option<builder::BootFiles>,
    /// The devices' files, taps and sockets, opened when they were put.
    resources: device_opens::DeviceResources,
    /// The configuration and files a snapshot load replaced, put back if
    /// the load fails.
    before_load: Option<(Box<VmConfig>, device_opens::DeviceResources, Instant)>,
    /// A restored guest's uffd handler connection (a clone, kept until the
    /// process exits, so the handler never sees teravm hang up first), and
    /// whether the event loop watches it.
    uffd_handler: Option<(std::os::fd::OwnedFd, bool)>,
    /// `/dev/kvm`, opened at start-up.
    kvm: Arc<crate::vstate::vm::KvmDevice>,
    /// What KVM offers for guest_memfd here, read at start-up.
    gmem_support: crate::memory::GuestMemfdSupport,
    /// The job runners (started before the main thread's filter).
    start_runner: jobs::JobRunner,
    reclaim_runner: jobs::JobRunner,
    /// Opens under way on the `files` thread, and their results.
    pending_opens: Vec<opens::PendingOpen>,
    next_open_id: u64,
    files_tx: Sender<opens::OpenDone>,
    files_rx: Receiver<opens::OpenDone>,
    files_evt: EventFd,
    topology: HostTopology,
    /// Where the topology and the memory limit were read, for the summary
    /// ([`report::host_sources`]).
    host_sources: String,
    phase: Phase,
    slices: Vec<SliceInfo>,
    vcpu_tx: Sender<VcpuEvent>,
    vcpu_rx: Receiver<VcpuEvent>,
    vcpu_evt: EventFd,
    signals: ShutdownSignals,
    api_rx: Option<Receiver<ApiRequest>>,
    api_evt: EventFd,
    start_evt: EventFd,
    metrics_timer: crate::metrics::FlushTimer,
    populate: Arc<PopulateProgress>,
    progress: Arc<ReclaimProgress>,
    reclaim_evt: EventFd,
    sync_waiters: Vec<Sender<ActionResult>>,
    last_report: Option<ShutdownReport>,
    exit_code: i32,
    /// Whether the final state is served for `opts.linger` after reclaim.
    linger: bool,
    finished_at: Option<Instant>,
    /// stdin feeding a running Linux guest's ttyS0 ([`stdin`]).
    console_input: Option<stdin::ConsoleInput>,
    /// Whether stdin was looked at already (it is attached at most once).
    console_input_tried: bool,
    /// Whether the microVM was configured for a boot (Firecracker's
    /// `boot_path`: [`crate::api::VmmAction::configures_boot`], or a config
    /// file): a `PUT /snapshot/load` is refused after that.
    boot_configured: bool,
}

impl Vmm {
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
        self.begin_shutdown(reason, Instant::now());
    }

    fn on_signal(&mut self, signo: i32) {
        let name = signal_name(signo);
        match self.state() {
            VmState::Stopped => {
                log::info!("{name} received after reclaim; exiting now");
                self.linger = false;
            }
            VmState::ShuttingDown | VmState::Reclaiming => {
                log::warn!("{name} received during reclaim: the process exits when memory is back");
                self.linger = false;
            }
            state => {
                log::info!("{name} received while {}", state.as_str());
                self.begin_shutdown(ShutdownReason::Signal(signo), Instant::now());
            }
        }
    }

    /// How long the event loop may wait: until the exit ([`Vmm::exit_in`])
    /// or the next open's deadline, whichever comes first; `None` to break.
    fn wait_for(&self) -> Option<Option<Duration>> {
        let exit = self.exit_in();
        if exit.is_some_and(|d| d.is_zero()) {
            return None;
        }
        let open = self
            .next_open_deadline()
            .map(|d| d.saturating_duration_since(Instant::now()));
        Some(match (exit, open) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        })
    }

    /// Whether the process should exit now; `Some(wait)` while lingering.
    fn exit_in(&self) -> Option<Duration> {
        let finished = self.finished_at?;
        if self.api_rx.is_none() || !self.linger {
            return Some(Duration::ZERO);
        }
        Some(self.opts.linger.saturating_sub(finished.elapsed()))
    }
}

impl MutEventSubscriber for Vmm {
    fn process(&mut self, events: Events, ops: &mut EventOps) {
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
            TOKEN_START => {
                let _ = self.start_evt.read();
                self.start_done();
            }
            TOKEN_METRICS => {
                self.metrics_timer.ack();
                let _ = self.flush_metrics();
            }
            TOKEN_FILES => {
                let _ = self.files_evt.read();
                self.on_files_done();
            }
            token @ (TOKEN_STDIN | TOKEN_STDIN_RETRY) => self.on_console_input(token, ops),
            TOKEN_UFFD => self.on_uffd_handler_gone(ops),
            other => log::warn!("event for unknown token {other}"),
        }
        self.expire_opens(Instant::now());
        self.sync_console_input(ops);
        self.watch_uffd_handler(ops);
    }

    fn init(&mut self, ops: &mut EventOps) {
        let sources: [(i32, u32); 7] = [
            (self.files_evt.as_raw_fd(), TOKEN_FILES),
            (self.vcpu_evt.as_raw_fd(), TOKEN_VCPU),
            (self.signals.as_raw_fd(), TOKEN_SIGNAL),
            (self.api_evt.as_raw_fd(), TOKEN_API),
            (self.reclaim_evt.as_raw_fd(), TOKEN_RECLAIM),
            (self.start_evt.as_raw_fd(), TOKEN_START),
            (self.metrics_timer.as_raw_fd(), TOKEN_METRICS),
        ];
        for (fd, token) in sources {
            if let Err(e) = ops.add(Events::with_data_raw(fd, token, EventSet::IN)) {
                log::error!("cannot watch event source {token}: {e:?}");
            }
        }
    }
}

impl Vmm {
    /// Watches a restored guest's uffd handler connection (once).
    fn watch_uffd_handler(&mut self, ops: &mut EventOps) {
        let Some((fd, watched)) = &mut self.uffd_handler else {
            return;
        };
        if *watched {
            return;
        }
        let set = EventSet::IN | EventSet::READ_HANG_UP | EventSet::HANG_UP;
        match ops.add(Events::with_data_raw(fd.as_raw_fd(), TOKEN_UFFD, set)) {
            Ok(()) => *watched = true,
            Err(e) => {
                log::warn!("cannot watch the uffd handler's connection: {e:?}");
                *watched = true;
            }
        }
    }

    /// The uffd handler hung up (or wrote, which Firecracker's protocol
    /// never does): the pages it had not served can never come, and any
    /// thread that touches one would wait forever. The microVM is ended
    /// and its memory reclaimed, rather than left frozen.
    fn on_uffd_handler_gone(&mut self, ops: &mut EventOps) {
        if let Some((fd, _)) = &self.uffd_handler {
            let _ = ops.remove(Events::with_data_raw(
                fd.as_raw_fd(),
                TOKEN_UFFD,
                EventSet::IN,
            ));
        }
        if matches!(self.phase, Phase::Running(_) | Phase::Snapshotting(_)) {
            let why = "the uffd page fault handler hung up: guest memory it had not served \
                       can never come"
                .to_string();
            log::error!("{why}");
            self.begin_shutdown(ShutdownReason::GuestCrashed(why), Instant::now());
        }
    }
}

/// Runs one microVM to its end and returns the process exit code.
pub fn run(config: VmConfig, opts: VmmOptions) -> Result<i32, VmmError> {
    crate::seccomp::prepare(crate::seccomp::Policy::from_enabled(opts.seccomp))?;
    // Before any thread exists, so that every thread inherits the mask.
    let signals = ShutdownSignals::new()?;
    // Once for the process, before any start: the reclaim's count of what
    // the guest owned reads it (a failed start leaves no fd of its own).
    crate::memory::pagemap::open();
    // Before any filter: without sysfs it asks the kernel, from a thread.
    let topology = HostTopology::from_sysfs(&opts.sysfs_root)?;
    let host_sources = report::host_sources(&topology);
    log::info!("{host_sources}");
    // A config file's devices, virtio-mem counted per guest node on this
    // host (its own validation counts it as one: it knows no host).
    device_opens::check_count_with(&config, &topology, |_| {}).map_err(VmmError::Device)?;
    let serial_file = match &opts.serial_file {
        Some(path) => Some(
            opts.files
                .open_one(
                    opens::output_request("--serial-file", path, true),
                    crate::files::OPEN_TIMEOUT,
                )?
                .file,
        ),
        None => None,
    };
    let boot_files = match opens::boot_requests(&config.boot_source) {
        r if r.is_empty() => None,
        r => opens::boot_files(
            &config.boot_source,
            opts.files.open_now(r, crate::files::OPEN_TIMEOUT)?,
        ),
    };
    let resources = device_opens::DeviceResources::open_for_config(
        &opts.files,
        &config.drives,
        &config.network_interfaces,
        config.vsock.as_ref(),
    )?;
    let kvm = Arc::new(crate::vstate::vm::KvmDevice::open()?);
    let gmem_support = kvm.guest_memfd_support();
    crate::config::check_guest_memfd(&config.memory, &gmem_support)?;
    // Every thread that outlives this function's set-up is started before
    // the main thread's filter: that filter need not allow what they do.
    let start_runner = jobs::JobRunner::spawn("start", crate::seccomp::Role::Start)?;
    let reclaim_runner = jobs::JobRunner::spawn("reclaim", crate::seccomp::Role::Reclaim)?;
    let (files_tx, files_rx) = channel();
    let new_evt = || EventFd::new(EFD_NONBLOCK).map_err(VmmError::EventFd);
    let api_evt = new_evt()?;
    let (api, api_rx) = match &opts.api_sock {
        Some(path) => {
            let (tx, rx) = channel();
            let wake = api_evt.try_clone().map_err(VmmError::EventFd)?;
            let limits = crate::api::ServerLimits {
                max_body_bytes: opts.api_max_payload_bytes,
                ..crate::api::ServerLimits::default()
            };
            (
                Some(ApiServer::start_with_limits(path, tx, wake, limits)?),
                Some(rx),
            )
        }
        None => (None, None),
    };
    let (vcpu_tx, vcpu_rx) = channel();
    let mut vmm = Vmm {
        opts,
        serial_file,
        serial_replaces_stdout: false,
        config,
        boot_files,
        resources,
        before_load: None,
        uffd_handler: None,
        kvm,
        gmem_support,
        start_runner,
        reclaim_runner,
        pending_opens: Vec::new(),
        next_open_id: 0,
        files_tx,
        files_rx,
        files_evt: new_evt()?,
        topology,
        host_sources,
        phase: Phase::Configuring,
        slices: Vec::new(),
        vcpu_tx,
        vcpu_rx,
        vcpu_evt: new_evt()?,
        signals,
        api_rx,
        api_evt,
        start_evt: new_evt()?,
        metrics_timer: crate::metrics::FlushTimer::new(crate::metrics::FLUSH_PERIOD)?,
        populate: Arc::new(PopulateProgress::new()),
        progress: Arc::new(ReclaimProgress::new()),
        reclaim_evt: new_evt()?,
        sync_waiters: Vec::new(),
        last_report: None,
        exit_code: EXIT_OK,
        linger: false,
        finished_at: None,
        console_input: None,
        console_input_tried: false,
        boot_configured: false,
    };
    // A config file configures the boot (and starts it at once).
    vmm.boot_configured = vmm.opts.start_at_once;
    if vmm.opts.start_at_once {
        vmm.start(None);
    }
    let vmm = Arc::new(std::sync::Mutex::new(vmm));
    let mut manager: EventManager<Arc<std::sync::Mutex<Vmm>>> =
        EventManager::new().map_err(VmmError::EventLoop)?;
    manager.add_subscriber(vmm.clone());
    crate::seccomp::install_thread(crate::seccomp::Role::Vmm);
    loop {
        let wait = vmm.lock().unwrap_or_else(|p| p.into_inner()).wait_for();
        let timeout_ms = match wait {
            None => break,
            Some(left) => crate::util::poll_timeout_ms(left),
        };
        let ran = manager.run_with_timeout(timeout_ms);
        vmm.lock()
            .unwrap_or_else(|p| p.into_inner())
            .expire_opens(Instant::now());
        match ran {
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
