//! The benchmark's vocabulary, shared by every other module and depending on
//! none of them: its error, the page sizes, backings, peer VMMs and methods, a
//! case (page size and backing) and one timed run ([`Sample`]).

use std::fmt;

use teravm::config::Backing;

use teravm_client::host::HostError;

/// Errors of the benchmark.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// A command-line value is wrong.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The requested size does not fit in the host's available memory.
    #[error(
        "--size-gib {size_gib} is too large: the host has {available_mib} MiB available \
         (MemAvailable), of which at most {usable_mib} MiB may be used (a margin of \
         {margin_mib} MiB is kept)"
    )]
    TooLarge {
        /// The requested size.
        size_gib: u64,
        /// MemAvailable of /proc/meminfo.
        available_mib: u64,
        /// The margin kept free.
        margin_mib: u64,
        /// What may be used.
        usable_mib: u64,
    },
    /// `/proc/meminfo` could not be read or has no MemAvailable line.
    #[error(transparent)]
    Host(#[from] HostError),
    /// The host topology could not be read.
    #[error("cannot read the host topology: {0}")]
    Topology(String),
    /// Mapping, populating or reclaiming guest memory failed.
    #[error("guest memory: {0}")]
    Memory(String),
    /// The child process of the `exit` or `mrelease` baseline failed.
    #[error("baseline child: {0}")]
    Child(String),
    /// `pidfd_open` or `process_mrelease` failed on a process being reaped.
    #[error("{0}")]
    Mrelease(String),
    /// An output file could not be written.
    #[error("cannot write {path}: {source}")]
    Write {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// `--vm` cannot run here (no teravm binary, no /dev/kvm).
    #[error("{0}")]
    VmUnavailable(String),
    /// A `--vm` run failed.
    #[error("--vm: {0}")]
    Vm(String),
    /// `--peers` cannot run here: none of the peers asked for was found.
    #[error("{0}")]
    PeersUnavailable(String),
    /// A `--peers` run of a peer VMM failed.
    #[error("--peers: {0}")]
    Peer(String),
}

impl BenchError {
    /// The process exit status for this error: 2 for an unavailable `--vm`
    /// or `--peers`, 1 otherwise.
    pub fn exit_code(&self) -> u8 {
        match self {
            BenchError::VmUnavailable(_) | BenchError::PeersUnavailable(_) => 2,
            _ => 1,
        }
    }
}

/// The page size backing guest memory in a benchmark case.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, clap::ValueEnum)]
pub enum Pages {
    /// 4 KiB pages (`huge_pages: "None"`).
    #[value(name = "4k")]
    FourK,
    /// Transparent huge pages (`huge_pages: "Transparent"`).
    #[value(name = "thp")]
    Thp,
}

impl Pages {
    /// The name used on the command line and in outputs.
    pub fn name(self) -> &'static str {
        match self {
            Pages::FourK => "4k",
            Pages::Thp => "thp",
        }
    }
}

impl fmt::Display for Pages {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The name of a backing, as on the command line and in outputs.
pub fn backing_name(backing: Backing) -> &'static str {
    match backing {
        Backing::Anonymous => "anonymous",
        Backing::Memfd => "memfd",
        Backing::GuestMemfd => "guest_memfd",
    }
}

/// Parses a backing name (`anonymous`, `memfd` or `guest_memfd`).
pub fn parse_backing(text: &str) -> Result<Backing, String> {
    match text {
        "anonymous" | "anon" => Ok(Backing::Anonymous),
        "memfd" => Ok(Backing::Memfd),
        "guest_memfd" | "gmem" => Ok(Backing::GuestMemfd),
        _ => Err(format!(
            "unknown backing {text:?}; expected anonymous, memfd or guest_memfd"
        )),
    }
}

/// A VMM in use today that `--peers` runs beside teravm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, clap::ValueEnum)]
pub enum Peer {
    /// QEMU (`qemu-system-x86_64`), stopped with QMP `quit`.
    #[value(name = "qemu")]
    Qemu,
    /// Firecracker (`firecracker`).
    #[value(name = "firecracker")]
    Firecracker,
    /// Cloud Hypervisor (`cloud-hypervisor`).
    #[value(name = "cloud-hypervisor")]
    CloudHypervisor,
}

impl Peer {
    /// Every peer, in the order of the table's columns.
    pub const ALL: [Peer; 3] = [Peer::Qemu, Peer::Firecracker, Peer::CloudHypervisor];

    /// The name used on the command line and in outputs.
    pub fn name(self) -> &'static str {
        match self {
            Peer::Qemu => "qemu",
            Peer::Firecracker => "firecracker",
            Peer::CloudHypervisor => "cloud-hypervisor",
        }
    }

    /// The name of its graceful stop in the rows' names: QEMU's is QMP
    /// `quit`, Firecracker's `SendCtrlAltDel` (the guest takes it and
    /// resets, and Firecracker exits), Cloud Hypervisor's its API's stop.
    pub fn graceful_name(self) -> &'static str {
        match self {
            Peer::Qemu => "quit",
            Peer::Firecracker => "ctrlaltdel",
            Peer::CloudHypervisor => "stop",
        }
    }

    /// Its index in [`Peer::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for Peer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How a peer VMM is stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Stop {
    /// Its graceful stop (QEMU: QMP `quit`; Firecracker: `SendCtrlAltDel`),
    /// timed until `waitpid`.
    Graceful,
    /// `SIGKILL`, timed until `waitpid`.
    Kill,
}

/// How guest memory is given back to the host. The order of the variants is
/// the order of the table's rows within a case.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Method {
    /// One thread unmaps the region (and closes the memfd).
    Munmap,
    /// A process holding the memory is killed, timed until `waitpid`.
    Exit,
    /// A process holding the memory is killed and reaped from the parent
    /// with `process_mrelease(pidfd)`, timed until `waitpid`.
    Mrelease,
    /// teravm's reclaim executor with this many workers per node, then unmap.
    Teravm(u32),
    /// `--peers`: a peer VMM with all of its guest RAM resident (preallocated,
    /// the guest paused and never run), stopped as [`Stop`] says, timed from
    /// the request until `waitpid` returns (`<peer>-prealloc-<stop>`).
    Peer(Peer, Stop),
    /// `--peers`: teravm beside the peers: all RAM populated before boot, the
    /// firmware touching nothing (`touch=0`), stopped with `SIGTERM` (teravm
    /// reclaims with `w` workers per node, then exits), timed until `waitpid`.
    VmPrealloc(u32),
    /// `--peers`: a peer VMM booting the test guest (`teravm-guest`,
    /// `touch=all`), which wrote all of its RAM itself, stopped as [`Stop`]
    /// says once its `touched` line came, timed from the request until
    /// `waitpid` returns (`<peer>-guest-<stop>`).
    PeerGuest(Peer, Stop),
    /// `--peers`: teravm booting the same test guest, stopped with its API's
    /// `Shutdown` (`w` workers per node), timed from the request until
    /// `waitpid` returns.
    VmGuestShutdown(u32),
    /// `--peers`: the same, stopped with `SIGTERM`, until `waitpid`.
    VmGuestSigterm(u32),
    /// `--vm`: a teravm microVM killed with `SIGKILL`, timed until `waitpid`.
    VmKill,
    /// `--vm`: the same microVM killed and reaped with `process_mrelease`.
    VmMrelease,
    /// `--vm`: a teravm microVM shut down through its API (sync), with `w`
    /// workers per node, timed until the reply.
    VmShutdown(u32),
    /// `--vm`: the same with `"reclaim": "async"`, timed from the request
    /// until the process is gone (`waitpid`); the reply's latency is kept
    /// apart.
    VmAsync(u32),
    /// `--live`: a running microVM's guest reports `--size-gib` as free
    /// (free page reporting); teravm frees it serially (`reclaim`'s
    /// `discard_workers_per_node` 0: the balloon thread, one `madvise` per
    /// range, before each ack, as Firecracker does). Timed by the guest
    /// from its first report to the last acknowledged.
    ReportSerial,
    /// `--live`: the same, freed by teravm's per-node discard pool with `w`
    /// workers per node.
    ReportTeravm(u32),
    /// `--live`: a running microVM's guest (the firmware's virtio-mem
    /// driver) has plugged and touched `--size-gib`; the host asks for 0 and
    /// the clock runs until `plugged_size_mib` is 0 and the resident size
    /// has fallen (`live_unplug`); freed serially (`discard_workers_per_node`
    /// 0: one `madvise` per UNPLUG before its answer, as Firecracker does).
    UnplugSerial,
    /// `--live`: the same, freed by teravm's per-node discard pool with `w`
    /// workers per node.
    UnplugTeravm(u32),
    /// `--live`: the same, the guest sending UNPLUG_ALL (`mem=unplug-all`).
    UnplugAllTeravm(u32),
}

impl Method {
    /// Worker threads per node the method uses (1 for the baselines, 0 for
    /// `report-serial`: no discard workers).
    pub fn workers(self) -> u32 {
        match self {
            Method::Teravm(w)
            | Method::VmShutdown(w)
            | Method::VmAsync(w)
            | Method::ReportTeravm(w)
            | Method::UnplugTeravm(w)
            | Method::UnplugAllTeravm(w)
            | Method::VmPrealloc(w)
            | Method::VmGuestShutdown(w)
            | Method::VmGuestSigterm(w) => w,
            Method::ReportSerial | Method::UnplugSerial => 0,
            _ => 1,
        }
    }

    /// The chunk, in MiB, the method frees `size_gib` in: `--chunk-mib`, or
    /// teravm's default for that size, backing and the method's workers
    /// (the bench's guests are on one node, or bound to none): a memory
    /// file's stripe, or for anonymous memory the rule of
    /// `plan::default_chunk_bytes`; `None` where it frees in no chunks.
    pub fn chunk_mib(self, chunk_mib: Option<u64>, size_gib: u64, backing: Backing) -> Option<u64> {
        self.uses_chunks().then(|| {
            chunk_mib.unwrap_or_else(|| match backing {
                Backing::Anonymous => {
                    teravm::memory::plan::default_chunk_bytes(size_gib << 30, self.workers()) >> 20
                }
                Backing::Memfd | Backing::GuestMemfd => {
                    teravm::memory::mapping::stripe_bytes(size_gib << 30, 0) >> 20
                }
            })
        })
    }

    /// Whether the method frees in `--chunk-mib` chunks (teravm's shutdown
    /// reclaim; the live discards are cut into parts of their own).
    pub fn uses_chunks(self) -> bool {
        matches!(
            self,
            Method::Teravm(_)
                | Method::VmShutdown(_)
                | Method::VmAsync(_)
                | Method::VmPrealloc(_)
                | Method::VmGuestShutdown(_)
                | Method::VmGuestSigterm(_)
        )
    }

    /// Whether this is a live reclaim of a running microVM (`--live`).
    pub fn is_live(self) -> bool {
        matches!(self, Method::ReportSerial | Method::ReportTeravm(_)) || self.is_unplug()
    }

    /// Whether this is a live unplug (virtio-mem) of a running microVM.
    pub fn is_unplug(self) -> bool {
        matches!(
            self,
            Method::UnplugSerial | Method::UnplugTeravm(_) | Method::UnplugAllTeravm(_)
        )
    }

    /// The serial row a `--live` row is compared with (`vs serial`).
    pub fn live_baseline(self) -> Option<Method> {
        if self.is_unplug() {
            Some(Method::UnplugSerial)
        } else {
            self.is_live().then_some(Method::ReportSerial)
        }
    }

    /// Whether this runs a real teravm microVM (`--vm`, and the
    /// `vm-prealloc-teravm-<w>` and `vm-guest-*` rows of `--peers`).
    pub fn is_vm(self) -> bool {
        matches!(
            self,
            Method::VmKill
                | Method::VmMrelease
                | Method::VmShutdown(_)
                | Method::VmAsync(_)
                | Method::VmPrealloc(_)
                | Method::VmGuestShutdown(_)
                | Method::VmGuestSigterm(_)
        )
    }

    /// Whether this boots the test guest, which touches its own RAM (the
    /// `--peers` rows `<peer>-guest-*` and `vm-guest-*`): its `vs <peer>`
    /// is against the peer's guest row, not its preallocated one.
    pub fn is_guest(self) -> bool {
        matches!(
            self,
            Method::PeerGuest(..) | Method::VmGuestShutdown(_) | Method::VmGuestSigterm(_)
        )
    }

    /// Why the method cannot run for `case`, if it cannot: guest_memfd
    /// files are made by KVM for a VM, so only the rows of a real microVM
    /// (`vm-*`) have them; the guest's free page reports read each page
    /// back, which allocates it again in a guest_memfd (`--live` skips it);
    /// and this kernel offers no huge pages for guest_memfd.
    pub fn unsupported(self, case: Case) -> Option<&'static str> {
        if case.backing != Backing::GuestMemfd
            || matches!(self, Method::Peer(..) | Method::PeerGuest(..))
        {
            // A peer says for itself which backings it has.
            return None;
        }
        if matches!(self, Method::VmGuestShutdown(_) | Method::VmGuestSigterm(_)) {
            return Some("the guest rows stand beside the peers', and no peer has guest_memfd");
        }
        if case.pages == Pages::Thp {
            return Some("this kernel offers no huge pages for guest_memfd (4k only)");
        }
        if self.is_live() && !self.is_unplug() {
            return Some("the guest reads each reported page back, which allocates it again in a guest_memfd");
        }
        (!self.is_vm()).then_some(
            "guest_memfd files are made by KVM for a VM: only a real microVM's rows (vm-*) have them",
        )
    }

    /// Whether the table shows `-` for its workers (a kill, or a peer VMM:
    /// the kernel frees its memory in the exiting process).
    pub fn has_no_workers(self) -> bool {
        matches!(
            self,
            Method::Exit
                | Method::Mrelease
                | Method::VmKill
                | Method::VmMrelease
                | Method::Peer(..)
                | Method::PeerGuest(..)
        )
    }
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Method::Munmap => f.write_str("munmap"),
            Method::Exit => f.write_str("exit"),
            Method::Mrelease => f.write_str("mrelease"),
            Method::Teravm(w) => write!(f, "teravm-{w}"),
            Method::Peer(peer, Stop::Graceful) => {
                write!(f, "{peer}-prealloc-{}", peer.graceful_name())
            }
            Method::Peer(peer, Stop::Kill) => write!(f, "{peer}-prealloc-kill"),
            Method::VmPrealloc(w) => write!(f, "vm-prealloc-teravm-{w}"),
            Method::PeerGuest(peer, Stop::Graceful) => {
                write!(f, "{peer}-guest-{}", peer.graceful_name())
            }
            Method::PeerGuest(peer, Stop::Kill) => write!(f, "{peer}-guest-kill"),
            Method::VmGuestShutdown(w) => write!(f, "vm-guest-teravm-{w}"),
            Method::VmGuestSigterm(w) => write!(f, "vm-guest-sigterm-{w}"),
            Method::VmKill => f.write_str("vm-kill"),
            Method::VmMrelease => f.write_str("vm-mrelease"),
            Method::VmShutdown(w) => write!(f, "vm-teravm-{w}"),
            Method::VmAsync(w) => write!(f, "vm-async-{w}"),
            Method::ReportSerial => f.write_str("report-serial"),
            Method::ReportTeravm(w) => write!(f, "report-teravm-{w}"),
            Method::UnplugSerial => f.write_str("unplug-serial"),
            Method::UnplugTeravm(w) => write!(f, "unplug-teravm-{w}"),
            Method::UnplugAllTeravm(w) => write!(f, "unplug-all-teravm-{w}"),
        }
    }
}

/// One page size and backing: the memory a series of runs is made on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Case {
    /// Page size.
    pub pages: Pages,
    /// Backing.
    pub backing: Backing,
}

impl fmt::Display for Case {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.pages, backing_name(self.backing))
    }
}

/// One timed run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    /// What was freed and how.
    pub case: Case,
    /// The method.
    pub method: Method,
    /// Guest memory size in GiB.
    pub size_gib: u64,
    /// Reclaim chunk size in MiB (teravm runs only).
    pub chunk_mib: Option<u64>,
    /// Run number, from 1.
    pub run: u32,
    /// Seconds the method took.
    pub seconds: f64,
    /// `vm-async`: milliseconds from sending the `Shutdown` request until its
    /// reply (202) arrived.
    pub reply_ms: Option<f64>,
    /// `vm-teravm`: the shutdown's phases, as teravm's sync reply gave them.
    pub phases: Phases,
    /// `--live`: what teravm and the host said of the memory reported.
    pub live: Option<Live>,
    /// `--peers` rows (the peers' and `vm-prealloc-teravm`): what the VMM
    /// held resident when the clock started.
    pub resident: Option<Resident>,
    /// teravm microVMs: how long teravm's populate took, milliseconds.
    pub populate_ms: Option<f64>,
    /// Rows with the test guest: the MiB its `touched` line said it wrote.
    pub touched_mib: Option<u64>,
}

/// One timed run of a peer row.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PeerRun {
    /// Seconds from the stop request until `waitpid` returned.
    pub seconds: f64,
    /// What the peer held resident when the clock started.
    pub resident: Resident,
    /// With the test guest: the MiB its `touched` line said it wrote.
    pub touched_mib: Option<u64>,
}

/// What a VMM process held resident just before it was stopped
/// (`/proc/<pid>/status` and `smaps_rollup`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resident {
    /// Its resident size (VmRSS: anonymous, file and shared memory).
    pub bytes: u64,
    /// Of it, in transparent huge pages (AnonHugePages + ShmemPmdMapped).
    pub huge_bytes: u64,
}

/// What a `--live` run saw besides its time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Live {
    /// teravm's discard rate (`GET /balloon/statistics`,
    /// `teravm.discard_bytes_per_s`: bytes over the pool's busy time).
    pub discard_bytes_per_s: u64,
    /// teravm's `teravm.discarded_bytes`.
    pub discarded_bytes: u64,
    /// teravm's resident size at its peak (populated, touched).
    pub rss_before_bytes: u64,
    /// Its lowest resident size sampled once reporting began (memfd pages
    /// the guest reads back are allocated again, so the end is not it).
    pub rss_after_bytes: u64,
    /// CPU time of teravm's vCPU, discard and balloon threads from the
    /// balloon's device line (the report starts) to the report's end.
    pub cpu: crate::cputime::CpuSplit,
}

/// The names of a shutdown's phases in teravm's sync `Shutdown` reply
/// (`"phases": {"stop_vcpus_ms": .., ...}`), in the order they run.
pub const PHASE_NAMES: [&str; 4] = ["stop_vcpus_ms", "close_vm_ms", "reclaim_ms", "unmap_ms"];

/// A shutdown's phase timings in milliseconds, in the order of
/// [`PHASE_NAMES`]; `None` where teravm's reply has no such phase (teravm
/// versions before the phases were reported have none).
pub type Phases = [Option<f64>; 4];

/// A method this host cannot run (e.g. `process_mrelease` on a kernel
/// without it), shown in the table rather than silently left out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unavailable {
    /// The method.
    pub method: Method,
    /// The one case it cannot run (a peer without that backing); `None`:
    /// none.
    pub case: Option<Case>,
    /// Why, in a few words.
    pub reason: String,
}
