//! What the roles share: [`BASE`] (every thread), [`SPAWN`] (a thread that
//! starts threads), and the argument conditions and numbers the lists are
//! written with (`mmap` never executable, a hole-punching `fallocate`, flag
//! masks, call and ioctl numbers libc lacks).

use super::{any, one_of, Allow, Only};

const PROT_EXEC: u64 = libc::PROT_EXEC as u64;
/// `MAP_SHARED | MAP_PRIVATE` (both bits: `MAP_SHARED_VALIDATE`) and `MAP_ANONYMOUS`.
const MAP_KIND: u64 = (libc::MAP_SHARED | libc::MAP_PRIVATE | libc::MAP_ANONYMOUS) as u64;
const MAP_PRIVATE_ANON: u64 = (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS) as u64;
/// The `clone` flags every thread start has; a new process lacks `CLONE_THREAD`.
const CLONE_AS_THREAD: u64 = (libc::CLONE_THREAD | libc::CLONE_VM | libc::CLONE_SIGHAND) as u64;

/// `mmap` of private anonymous memory, never executable.
const fn mmap_anon(why: &'static str) -> Allow {
    Allow {
        nr: libc::SYS_mmap,
        only: Only::Masked(
            &[(2, PROT_EXEC, 0), (3, MAP_KIND, MAP_PRIVATE_ANON)],
            "private anonymous, never PROT_EXEC",
        ),
        why,
    }
}

/// `mmap` of anything (guest memory, memfd, `kvm_run`), never executable.
pub(super) const fn mmap_no_exec(why: &'static str) -> Allow {
    Allow {
        nr: libc::SYS_mmap,
        only: Only::Masked(&[(2, PROT_EXEC, 0)], "never PROT_EXEC"),
        why,
    }
}

/// `cachestat` (Linux 6.5), not in libc's list yet.
pub(super) const SYS_CACHESTAT: i64 = 451;

/// `PAGEMAP_SCAN` (Linux 6.7), `_IOWR('f', 16, struct pm_scan_arg)`; the
/// same as `crate::memory::pagemap::PAGEMAP_SCAN` (a unit test says so).
pub(crate) const PAGEMAP_SCAN: u64 = 0xc060_6610;

/// userfaultfd's ioctls (linux/userfaultfd.h); the same as
/// `crate::memory::uffd`'s (a unit test says so).
pub(crate) const UFFDIO_API: u64 = 0xc018_aa3f;
/// `UFFDIO_REGISTER`.
pub(crate) const UFFDIO_REGISTER: u64 = 0xc020_aa00;
/// `UFFDIO_UNREGISTER`.
pub(crate) const UFFDIO_UNREGISTER: u64 = 0x8010_aa01;
/// `USERFAULTFD_IOC_NEW`: a userfaultfd from `/dev/userfaultfd`.
pub(crate) const USERFAULTFD_IOC_NEW: u64 = 0xaa00;

pub(super) const O_RDONLY_CLOEXEC: u64 = (libc::O_RDONLY | libc::O_CLOEXEC) as u64;

/// Every teravm thread, whatever its role: what Rust's runtime and glibc do
/// at any moment, and what the SIGSYS handler needs.
pub(crate) const BASE: &[Allow] = &[
    any(
        libc::SYS_futex,
        "Mutex, Condvar, Once, channels, thread join",
    ),
    any(
        libc::SYS_write,
        "eventfd wakes; the console and output threads' writes; the SIGSYS line",
    ),
    any(
        libc::SYS_poll,
        "the SIGSYS handler waits (briefly) for room on stderr before its line",
    ),
    any(libc::SYS_close, "dropping any descriptor"),
    any(libc::SYS_exit, "thread exit"),
    any(
        libc::SYS_exit_group,
        "process exit (also the SIGSYS handler's _exit)",
    ),
    any(libc::SYS_gettid, "the panic message names the thread"),
    any(
        libc::SYS_getrandom,
        "a thread's first HashMap (RandomState keys)",
    ),
    any(
        libc::SYS_clock_gettime,
        "Instant::now where the vDSO falls back; process CPU time",
    ),
    any(libc::SYS_sched_yield, "spinning locks"),
    any(
        libc::SYS_rt_sigreturn,
        "return from a signal handler (the vCPU kick)",
    ),
    any(
        libc::SYS_rt_sigprocmask,
        "glibc blocks signals around thread exit",
    ),
    any(
        libc::SYS_sigaltstack,
        "Rust's stack-overflow stack, freed at thread exit",
    ),
    any(
        libc::SYS_munmap,
        "free() of large blocks, thread stacks, guest memory",
    ),
    any(libc::SYS_mremap, "realloc of large blocks"),
    any(
        libc::SYS_brk,
        "malloc's main arena (the only arena: M_ARENA_MAX 1)",
    ),
    one_of(
        libc::SYS_madvise,
        2,
        &[named!(libc::MADV_DONTNEED)],
        "free() trimming; thread stacks",
    ),
    one_of(
        libc::SYS_prctl,
        0,
        &[named!(libc::PR_GET_NAME)],
        "the SIGSYS handler names a worker thread",
    ),
    mmap_anon("malloc of large blocks, thread stacks"),
    Allow {
        nr: libc::SYS_mprotect,
        only: Only::Masked(&[(2, PROT_EXEC, 0)], "never PROT_EXEC"),
        why: "glibc's guard pages of thread stacks, malloc heaps",
    },
];

/// A thread that starts threads, and what the new thread does before it
/// installs its own filter (it runs under this one meanwhile).
pub(crate) const SPAWN: &[Allow] = &[
    Allow {
        nr: libc::SYS_clone,
        only: Only::Masked(
            &[(0, CLONE_AS_THREAD, CLONE_AS_THREAD)],
            "flags include CLONE_THREAD | CLONE_VM | CLONE_SIGHAND: a thread, never a process",
        ),
        why: "pthread_create (glibc falls back to clone when clone3 says ENOSYS)",
    },
    any(
        libc::SYS_clone3,
        "answered ENOSYS by a second filter (its flags are behind a pointer, which a filter cannot check)",
    ),
    any(libc::SYS_rseq, "glibc registers the new thread's rseq area"),
    any(libc::SYS_set_robust_list, "glibc's start of the new thread"),
    any(libc::SYS_sched_getaffinity, "pthread_getattr_np (Rust's stack guard)"),
    one_of(
        libc::SYS_prctl,
        0,
        &[named!(libc::PR_SET_NAME), named!(libc::PR_SET_NO_NEW_PRIVS)],
        "the new thread's name; no_new_privs before its filter",
    ),
    one_of(
        libc::SYS_seccomp,
        0,
        &[named!(libc::SECCOMP_SET_MODE_FILTER)],
        "the new thread installs its own filter",
    ),
];

/// `fallocate` that only punches holes (memfd and hugetlb slices).
pub(super) const PUNCH_HOLE: Allow = one_of(
    libc::SYS_fallocate,
    1,
    &[(
        (libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE) as u64,
        "FALLOC_FL_PUNCH_HOLE|FALLOC_FL_KEEP_SIZE",
    )],
    "free memfd and hugetlb slices",
);
