//! Fault injection for the reliability tests: `TERAVM_FAULT_INJECT` holds a
//! comma-separated list of faults to inject into this process, read once.
//!
//! - `reclaim-worker-panic`: the first reclaim worker to take a chunk panics
//!   (the executor must still free everything and report the failure);
//! - `vcpu-panic`: vCPU 0 panics at its first port I/O exit (the VMM must
//!   shut the microVM down as crashed and still free its memory);
//! - `vcpu-forbidden-syscall`: each vCPU thread, right after installing its
//!   seccomp filter, makes a system call the filter forbids (`socket`): the
//!   process must end with `seccomp::EXIT_BAD_SYSCALL` and a line naming the
//!   call and the thread (with `--no-seccomp` the call just succeeds).
//!
//! - `spurious-job-events`: the start and reclaim jobs' completion events
//!   are written when a start begins and when the microVM runs, though no
//!   job ended (the phase machine must ignore them);
//! - `vcpu-ignores-stop`: vCPU 1's thread ignores stop requests and
//!   kicks and goes on running the guest (the VMM must free guest memory
//!   anyway and keep its address range reserved until exit).
//!
//! - `slow-discard`: every discard of the balloon's pool (and of any later
//!   live-memory device) waits 2 s before it frees
//!   ([`SLOW_DISCARD_DELAY`], per part, on whichever thread frees it, and
//!   once more before a virtio-mem UNPLUG's emptied slots leave KVM; a
//!   pool that stops ends the wait and frees nothing). A guest must not get
//!   a page back while such a discard can still reach it, and no vCPU, API
//!   request or shutdown may wait behind one.
//!
//! - `discard-fails-once`: the discard pool's first batch (a balloon
//!   inflate or report, a virtio-mem UNPLUG) fails without freeing
//!   anything, as a failed `madvise` or hole punch would; its retry frees;
//! - `discard-fails-twice`: the first batch fails, and so does its retry:
//!   the ranges are left as not freed, said (log, metric), and a
//!   virtio-mem PLUG of them frees them first.
//!
//! Failed starts (issue 24: a start that fails undoes itself). Each fires
//! once per process, at the first `InstanceStart` that reaches its step, so
//! the retry after it goes through; several can be named to fail several
//! attempts, each one step later:
//!
//! - `start-fails-at-balloon`, `start-fails-at-drives`, `start-fails-at-net`,
//!   `start-fails-at-vsock`: the device build fails right after that step's
//!   device threads have started (the balloon's with its discard pool; all
//!   the drives'; all the interfaces'; the vsock's); a step with no device
//!   configured is skipped and does not fire;
//! - `first-start-fails-after-devices`: the build fails right after every
//!   configured device's thread has started, as a later step failing would.
//!
//! A start failed so is answered with a 400 whose `fault_message` names
//! the fault; the warning it logs (`<fault>: failing the start here; ...`)
//! names the device threads alive at that point and the process's thread
//! count, which the failed start then takes down.
//!
//! Nothing is injected unless the variable names the fault.

use std::sync::OnceLock;

/// The environment variable that names faults to inject.
pub const FAULT_INJECT_ENV: &str = "TERAVM_FAULT_INJECT";

/// The fault that writes the jobs' completion events when no job ended.
pub const SPURIOUS_JOB_EVENTS: &str = "spurious-job-events";

/// The fault that makes vCPU 1's thread ignore stop requests.
pub const VCPU_IGNORES_STOP: &str = "vcpu-ignores-stop";

/// The fault that makes every discard of a running guest's pages slow.
pub const SLOW_DISCARD: &str = "slow-discard";

/// How long each discard waits under [`SLOW_DISCARD`].
pub const SLOW_DISCARD_DELAY: std::time::Duration = std::time::Duration::from_secs(2);

/// The discard pool's first batch fails, unfreed.
pub const DISCARD_FAILS_ONCE: &str = "discard-fails-once";

/// The discard pool's first batch and its retry fail, unfreed.
pub const DISCARD_FAILS_TWICE: &str = "discard-fails-twice";

/// The fault that makes vCPU threads call a forbidden system call.
pub const VCPU_FORBIDDEN_SYSCALL: &str = "vcpu-forbidden-syscall";

/// Fails the start right after the balloon's thread started.
pub const START_FAILS_AT_BALLOON: &str = "start-fails-at-balloon";
/// Fails the start right after every drive's thread started.
pub const START_FAILS_AT_DRIVES: &str = "start-fails-at-drives";
/// Fails the start right after every network interface's thread started.
pub const START_FAILS_AT_NET: &str = "start-fails-at-net";
/// Fails the start right after the vsock's thread started.
pub const START_FAILS_AT_VSOCK: &str = "start-fails-at-vsock";
/// Fails the start right after every virtio-mem device's thread started.
pub const START_FAILS_AT_HOTPLUG: &str = "start-fails-at-hotplug";
/// Fails the first start right after every device's thread started.
pub const FIRST_START_FAILS_AFTER_DEVICES: &str = "first-start-fails-after-devices";

/// Whether the fault `name` was asked for and has not fired yet; the first
/// call that sees it fires it (later calls answer false).
pub fn fire_once(name: &'static str) -> bool {
    static FIRED: std::sync::Mutex<Vec<&'static str>> = std::sync::Mutex::new(Vec::new());
    if !injected(name) {
        return false;
    }
    let mut fired = FIRED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if fired.contains(&name) {
        return false;
    }
    fired.push(name);
    true
}

/// Makes a system call no vCPU filter allows: `socket(AF_UNIX, SOCK_STREAM)`
/// (closed again if it succeeds, i.e. without a filter).
pub fn forbidden_syscall() {
    // SAFETY: socket() takes no pointers; a returned descriptor is ours.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd >= 0 {
        log::warn!("{VCPU_FORBIDDEN_SYSCALL}: socket() succeeded: no seccomp filter is installed");
        // SAFETY: `fd` was just returned to us and nothing else uses it.
        unsafe { libc::close(fd) };
    }
}

/// Whether the fault `name` was asked for.
pub fn injected(name: &str) -> bool {
    static FAULTS: OnceLock<Vec<String>> = OnceLock::new();
    FAULTS
        .get_or_init(|| {
            let list = std::env::var(FAULT_INJECT_ENV).unwrap_or_default();
            let faults: Vec<String> = list
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(String::from)
                .collect();
            if !faults.is_empty() {
                log::warn!("fault injection on: {faults:?}");
            }
            faults
        })
        .iter()
        .any(|f| f == name)
}
