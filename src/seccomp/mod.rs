//! seccomp: a filter per thread role, built with rust-vmm's `seccompiler`,
//! installed by each thread on itself before it first handles guest or
//! client input, and a SIGSYS handler that reports a forbidden call.
//!
//! Roles ([`Role`]) and their lists live in `filters` as data. A filter
//! allows the role's calls (with `ioctl` narrowed to the request numbers the
//! role uses, `mmap`/`mprotect` never executable, `prctl`, `madvise`,
//! `fcntl`... narrowed where the role's use is narrow) and traps everything
//! else: the kernel sends SIGSYS, the handler writes
//! `teravm: seccomp: thread NAME made a forbidden system call NR (NAME); ...`
//! on stderr and the process exits with [`EXIT_BAD_SYSCALL`].
//!
//! Filters stack: a thread runs under its own filter and those of the
//! threads that spawned it after installing theirs. So a spawner's filter
//! also allows what its children call (see [`Role::syscalls`]); the children
//! narrow it for themselves. Workers (`populate-n*`, `reclaim-n*`) install
//! nothing: the job thread that spawns them (`start`, `reclaim`) has a
//! filter that covers them, so `memory` knows nothing of seccomp.
//!
//! Use: the binary calls [`prepare`] once at startup with the policy from
//! the command line (`--no-seccomp` is [`Policy::Off`]); each thread then
//! calls [`install_thread`] with its role as its first statement.
//! [`install`] is the same with an explicit policy. Without [`prepare`]
//! (library users, unit tests) the policy is [`Policy::Off`].

mod doc;
pub(crate) mod filters;
pub mod open_flags;
mod sigsys;
mod syscall_names;
mod tree;

use std::cell::Cell;
use std::collections::BTreeMap;
use std::sync::OnceLock;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule,
};

pub use doc::describe;
pub use sigsys::{write_stderr_bounded, EXIT_BAD_SYSCALL};

use filters::{Allow, Only};

/// The thread roles, each with its own filter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Role {
    /// The main thread `teravm`: the event loop.
    Vmm,
    /// `api`: accepts connections on the API socket.
    Api,
    /// `api-conn`: serves one API connection.
    ApiConnection,
    /// `vcpu{n}`: the `KVM_RUN` loop and the port I/O devices.
    Vcpu,
    /// `console`: writes the guest console to stdout and the serial file.
    Console,
    /// `start`: the KVM VM, guest memory, memslots, populate workers, vCPUs.
    Start,
    /// `reclaim`: stops the vCPUs, closes the VM, frees guest memory with
    /// the per-node workers.
    Reclaim,
    /// `progress`: redraws the populate or reclaim progress line on a
    /// terminal's stderr.
    Progress,
    /// `output`: writes teravm's own output queue to stderr or the log path.
    Output,
    /// `files`: opens the files a user names (kernel, initrd, log, metrics,
    /// serial file).
    Files,
    /// `balloon`: the virtio-balloon's queue work.
    Balloon,
    /// `discard-n{node}-{i}`: the discard pool's per-node workers, freeing
    /// what the balloon and virtio-mem give back.
    Discard,
    /// `virtio-blk{n}`: a drive's requests and its file's I/O.
    Block,
    /// `virtio-net{n}`: a network interface's frames to and from its tap.
    Net,
    /// `virtio-vsock`: the vsock's packets and its host-side sockets.
    Vsock,
    /// `virtio-rng`: the entropy device's requests.
    Entropy,
    /// `virtio-mem`: a virtio-mem device's plug and unplug requests.
    Mem,
}

impl Role {
    /// Every role.
    pub const ALL: [Role; 17] = [
        Role::Vmm,
        Role::Api,
        Role::ApiConnection,
        Role::Vcpu,
        Role::Console,
        Role::Start,
        Role::Reclaim,
        Role::Progress,
        Role::Output,
        Role::Files,
        Role::Balloon,
        Role::Discard,
        Role::Block,
        Role::Net,
        Role::Vsock,
        Role::Entropy,
        Role::Mem,
    ];

    /// The role's name, as in the thread names and docs/seccomp.md.
    pub fn name(self) -> &'static str {
        match self {
            Role::Vmm => "teravm",
            Role::Api => "api",
            Role::ApiConnection => "api-conn",
            Role::Vcpu => "vcpu",
            Role::Console => "console",
            Role::Start => "start",
            Role::Reclaim => "reclaim",
            Role::Progress => "progress",
            Role::Output => "output",
            Role::Files => "files",
            Role::Balloon => "balloon",
            Role::Discard => "discard",
            Role::Block => "virtio-blk",
            Role::Net => "virtio-net",
            Role::Vsock => "virtio-vsock",
            Role::Entropy => "virtio-rng",
            Role::Mem => "virtio-mem",
        }
    }

    /// The system call numbers this role's filter allows (for any
    /// arguments or some), sorted.
    pub fn syscalls(self) -> Vec<i64> {
        let mut nrs: Vec<i64> = self.allowed().iter().map(|a| a.nr).collect();
        nrs.sort_unstable();
        nrs.dedup();
        nrs
    }

    /// The names of [`Role::syscalls`].
    pub fn syscall_names(self) -> Vec<&'static str> {
        self.syscalls()
            .into_iter()
            .map(syscall_names::name)
            .collect()
    }
}

/// Whether filters are installed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Policy {
    /// Each thread installs its role's filter (the default of the binary).
    #[default]
    Enforce,
    /// No filters (`--no-seccomp`).
    Off,
}

impl Policy {
    /// [`Policy::Enforce`] if `enabled` (`VmmOptions::seccomp`), else [`Policy::Off`].
    pub fn from_enabled(enabled: bool) -> Policy {
        if enabled {
            Policy::Enforce
        } else {
            Policy::Off
        }
    }
}

/// Errors of building and installing filters.
#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    /// A filter could not be built (a bug in the lists).
    #[error("cannot build the seccomp filter of role {role}: {source}")]
    Build {
        /// The role.
        role: &'static str,
        /// seccompiler's error.
        source: seccompiler::BackendError,
    },
    /// The filter could not be installed (`prctl` or `seccomp` failed).
    #[error("cannot install the seccomp filter of role {role}: {source}")]
    Install {
        /// The role.
        role: &'static str,
        /// seccompiler's error.
        source: seccompiler::Error,
    },
    /// The filters could not be built (as [`SeccompError::Build`], kept as text).
    #[error("cannot build the seccomp filters: {0}")]
    Filters(String),
    /// The SIGSYS handler could not be installed.
    #[error("cannot install the SIGSYS handler: {0}")]
    SigsysHandler(std::io::Error),
    /// [`prepare`] was called twice with different policies.
    #[error("the seccomp policy was already set to {0:?}")]
    PolicyAlreadySet(Policy),
}

/// The policy for [`install_thread`], set once by [`prepare`].
static PROCESS_POLICY: OnceLock<Policy> = OnceLock::new();
/// Each role's compiled filter, built the first time a thread of that role
/// installs it (or [`program`] is asked for it), then shared.
static PROGRAMS: [OnceLock<Result<BpfProgram, String>>; Role::ALL.len()] =
    [const { OnceLock::new() }; Role::ALL.len()];

thread_local! {
    /// Whether this thread installed its own filter.
    static FILTERED: Cell<bool> = const { Cell::new(false) };
}

/// Builds the BPF program of `role`: its rules ([`rules_of`]) with the call
/// number found by binary search ([`tree`]).
fn build(role: Role) -> Result<BpfProgram, SeccompError> {
    let err = |source| SeccompError::Build {
        role: role.name(),
        source,
    };
    let arch = std::env::consts::ARCH.try_into().map_err(err)?;
    tree::build(
        rules_of(role)?,
        SeccompAction::Trap,
        SeccompAction::Allow,
        arch,
    )
    .map_err(err)
}

/// `role`'s calls and their argument rules, as seccompiler takes them.
fn rules_of(role: Role) -> Result<BTreeMap<i64, Vec<SeccompRule>>, SeccompError> {
    let err = |source| SeccompError::Build {
        role: role.name(),
        source,
    };
    let cond = |arg: u8, op: SeccompCmpOp, value: u64| {
        SeccompCondition::new(arg, SeccompCmpArgLen::Dword, op, value).map_err(err)
    };
    // A call allowed for any arguments maps to no rules (matched always).
    let mut unconditional: Vec<i64> = Vec::new();
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for Allow { nr, only, .. } in role.allowed() {
        match only {
            Only::Any => unconditional.push(nr),
            Only::OneOf { arg, values } => {
                for &(v, _) in values {
                    let rule = SeccompRule::new(vec![cond(arg, SeccompCmpOp::Eq, v)?]);
                    rules.entry(nr).or_default().push(rule.map_err(err)?);
                }
            }
            Only::KickSignal { arg } => {
                let signo = vmm_sys_util::signal::SIGRTMIN() as u64;
                let rule = SeccompRule::new(vec![cond(arg, SeccompCmpOp::Eq, signo)?]);
                rules.entry(nr).or_default().push(rule.map_err(err)?);
            }
            Only::Masked(checks, _) => {
                let conditions = checks
                    .iter()
                    .map(|&(arg, mask, value)| cond(arg, SeccompCmpOp::MaskedEq(mask), value))
                    .collect::<Result<Vec<_>, _>>()?;
                rules
                    .entry(nr)
                    .or_default()
                    .push(SeccompRule::new(conditions).map_err(err)?);
            }
        }
    }
    for nr in unconditional {
        rules.insert(nr, Vec::new());
    }
    for chain in rules.values_mut() {
        chain.dedup();
    }
    Ok(rules)
}

/// The filter every spawning role stacks under its own: `clone3` fails
/// with `ENOSYS`, so glibc starts threads with `clone`, whose flags the
/// role's filter checks (a filter cannot read `clone3`'s flags, which are
/// behind a pointer). Everything else passes to the role's filter.
fn build_no_clone3() -> Result<BpfProgram, SeccompError> {
    let err = |source| SeccompError::Build {
        role: "clone3-enosys",
        source,
    };
    let arch = std::env::consts::ARCH.try_into().map_err(err)?;
    let rules = BTreeMap::from([(libc::SYS_clone3, Vec::new())]);
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        arch,
    )
    .map_err(err)?;
    filter.try_into().map_err(err)
}

/// The `clone3` filter, built once.
fn no_clone3() -> Result<&'static BpfProgram, SeccompError> {
    static PROGRAM: OnceLock<Result<BpfProgram, String>> = OnceLock::new();
    PROGRAM
        .get_or_init(|| build_no_clone3().map_err(|e| e.to_string()))
        .as_ref()
        .map_err(|e| SeccompError::Filters(e.clone()))
}

/// `role`'s program, built once, by the first thread that needs it.
/// Built on demand, not all at [`prepare`]: compiling the 15 lists took
/// 0.33 ms of the main thread before anything else could start (measured
/// on the 1 vCPU 256 MiB firmware start, docs in /work/notes/perf.md),
/// while a firmware start uses 7 roles, each compiled on its own thread.
/// `every_role_builds` (tests.rs) builds them all, so a list that does not
/// compile fails the tests, not a user's start.
fn program(role: Role) -> Result<&'static BpfProgram, SeccompError> {
    let index = Role::ALL
        .iter()
        .position(|&r| r == role)
        .ok_or_else(|| SeccompError::Filters(format!("no filter for role {}", role.name())))?;
    PROGRAMS[index]
        .get_or_init(|| build(role).map_err(|e| e.to_string()))
        .as_ref()
        .map_err(|e| SeccompError::Filters(e.clone()))
}

/// Sets the process's policy for [`install_thread`]; with
/// [`Policy::Enforce`] also builds the `clone3` filter, installs the SIGSYS
/// handler, and makes a panic print its message without a backtrace
/// (resolving one reads files that no filter allows).
/// Call it once at startup, before any thread is spawned.
pub fn prepare(policy: Policy) -> Result<(), SeccompError> {
    let set = *PROCESS_POLICY.get_or_init(|| policy);
    if set != policy {
        return Err(SeccompError::PolicyAlreadySet(set));
    }
    if policy == Policy::Off {
        return Ok(());
    }
    no_clone3()?;
    fix_malloc_arenas();
    // SAFETY: tzset reads the TZ variable and /etc/localtime into libc's
    // own state; no memory of ours is touched.
    unsafe { tzset() };
    sigsys::install_handler()?;
    install_panic_hook();
    Ok(())
}

extern "C" {
    /// POSIX `tzset(3)`: loads the local time zone (the libc crate lacks it).
    /// Called before any filter: otherwise the first `localtime_r` (the
    /// logger's timestamps) opens /etc/localtime in whichever thread logs
    /// first, as the strace of the main thread showed.
    fn tzset();
}

/// Makes every thread allocate from glibc's main arena (`M_ARENA_MAX` 1).
/// With per-thread arenas, glibc opens files from whichever thread happens
/// to malloc or free, which no thread's filter allows: the first time a
/// thread needs a ninth arena it reads `/sys/devices/system/cpu/online`
/// (seen in the strace of a reclaim worker), and the first time a
/// per-thread heap shrinks it reads `/proc/sys/vm/overcommit_memory` (seen
/// as a SIGSYS of an `api-conn` thread, once in a few runs). The main arena
/// grows and trims with `brk` and opens nothing. teravm's threads allocate
/// little (requests, log lines), so one arena costs no measurable contention.
fn fix_malloc_arenas() {
    // SAFETY: mallopt changes a malloc parameter; no memory of ours is
    // touched. A failure (0) leaves glibc's default.
    if unsafe { libc::mallopt(libc::M_ARENA_MAX, 1) } == 0 {
        log::warn!(
            "mallopt(M_ARENA_MAX) failed: a thread's malloc may open files under its filter"
        );
    }
}

/// Under a filter, the default panic hook's backtrace (RUST_BACKTRACE)
/// would open and map the binary's debug info, which no filter allows: the
/// panic would end as a forbidden call instead of being reported. So with
/// [`Policy::Enforce`] every thread's panic prints the default hook's first
/// line only (workers cannot tell that they inherited a filter).
fn install_panic_hook() {
    std::panic::set_hook(Box::new(|info| {
        let thread = std::thread::current();
        let name = thread.name().unwrap_or("<unnamed>");
        eprintln!("\n{}", panic_lines(name, info.location(), info.payload()));
    }));
}

/// What the hook prints: the default hook's first lines (`thread 'NAME'
/// panicked at FILE:LINE:COL:` and the message), and why there is no
/// backtrace. Not `PanicHookInfo`'s own `Display`, which begins with
/// "panicked at" itself.
fn panic_lines(
    thread: &str,
    location: Option<&std::panic::Location<'_>>,
    payload: &(dyn std::any::Any + Send),
) -> String {
    let message = payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("Box<dyn Any>");
    let at = location.map_or_else(|| "<unknown>".to_string(), ToString::to_string);
    format!(
        "thread '{thread}' panicked at {at}:\n{message}\n(no backtrace under seccomp; run with --no-seccomp for one)"
    )
}

/// The policy [`prepare`] set ([`Policy::Off`] if it was never called).
pub fn process_policy() -> Policy {
    PROCESS_POLICY.get().copied().unwrap_or(Policy::Off)
}

/// Installs `role`'s filter on the calling thread (nothing with
/// [`Policy::Off`]). Sets `no_new_privs` first, as seccomp requires.
pub fn install(role: Role, policy: Policy) -> Result<(), SeccompError> {
    if policy == Policy::Off {
        return Ok(());
    }
    let own = program(role)?;
    sigsys::install_handler()?;
    sigsys::remember_thread_name();
    let apply = |program| {
        seccompiler::apply_filter(program).map_err(|source| SeccompError::Install {
            role: role.name(),
            source,
        })
    };
    if role.spawns() {
        apply(no_clone3()?)?;
    }
    apply(own)?;
    FILTERED.with(|f| f.set(true));
    // The `api` thread starts an `api-conn` thread per client: its program
    // is built now, off the path of the first request (and its reply).
    if role == Role::Api {
        program(Role::ApiConnection)?;
    }
    Ok(())
}

/// The call at the start of each teravm thread: installs `role`'s filter
/// under the process's policy ([`prepare`]). A filter that cannot be
/// installed ends the process (exit 1, one line on stderr): a thread must
/// not serve a guest or a client unconfined when confinement was asked for.
/// With the fault `vcpu-forbidden-syscall` injected, a vCPU thread then
/// makes a forbidden call (see [`crate::faults`]).
pub fn install_thread(role: Role) {
    if let Err(e) = install(role, process_policy()) {
        eprintln!("teravm: {e}");
        // SAFETY: _exit ends the process at once; no Rust state is relied on
        // afterwards. Not `process::exit`: other threads may hold the stdio
        // locks that its flush would wait on.
        unsafe { libc::_exit(1) };
    }
    if role == Role::Vcpu && crate::faults::injected(crate::faults::VCPU_FORBIDDEN_SYSCALL) {
        crate::faults::forbidden_syscall();
    }
}

#[cfg(test)]
#[path = "tests.rs"]
mod tests;
