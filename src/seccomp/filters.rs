//! The system calls each thread role may make, as data: one list per role,
//! each entry a call with an optional condition on one argument.
//!
//! Derived from `strace -f` of teravm under the launch, API, API-process
//! and reliability tests plus memfd and populate runs (grouped by thread
//! name and by the filters a thread ran under; see docs/seccomp.md), not
//! copied from another VMM. A role's filter is [`BASE`] plus its own list
//! plus the lists of the roles it spawns after installing its filter
//! (filters stack: a child runs under its spawner's filter too).

use super::Role;

/// `_IOC(dir, 0xAE, nr, size)`: a KVM ioctl request number.
const fn kvm_ioc(dir: u64, nr: u64, size: usize) -> u64 {
    (dir << 30) | ((size as u64) << 16) | (0xAE << 8) | nr
}
const IOC_NONE: u64 = 0;
const IOC_WRITE: u64 = 1;
const IOC_READ: u64 = 2;

/// KVM ioctls teravm makes (numbers as in `linux/kvm.h`).
pub(crate) mod kvm {
    use super::{kvm_ioc, IOC_NONE, IOC_READ, IOC_WRITE};
    use kvm_bindings::{
        kvm_cpuid2, kvm_fpu, kvm_irqfd, kvm_lapic_state, kvm_msrs, kvm_pit_config, kvm_regs,
        kvm_sregs, kvm_userspace_memory_region,
    };
    use std::mem::size_of;

    /// `KVM_CREATE_VM` (on `/dev/kvm`).
    pub const CREATE_VM: u64 = kvm_ioc(IOC_NONE, 0x01, 0);
    /// `KVM_CHECK_EXTENSION` (memslot count).
    pub const CHECK_EXTENSION: u64 = kvm_ioc(IOC_NONE, 0x03, 0);
    /// `KVM_GET_VCPU_MMAP_SIZE` (the `kvm_run` mapping).
    pub const GET_VCPU_MMAP_SIZE: u64 = kvm_ioc(IOC_NONE, 0x04, 0);
    /// `KVM_GET_SUPPORTED_CPUID`.
    pub const GET_SUPPORTED_CPUID: u64 =
        kvm_ioc(IOC_READ | IOC_WRITE, 0x05, size_of::<kvm_cpuid2>());
    /// `KVM_CREATE_VCPU`.
    pub const CREATE_VCPU: u64 = kvm_ioc(IOC_NONE, 0x41, 0);
    /// `KVM_SET_USER_MEMORY_REGION`.
    pub const SET_USER_MEMORY_REGION: u64 =
        kvm_ioc(IOC_WRITE, 0x46, size_of::<kvm_userspace_memory_region>());
    /// `KVM_RUN`.
    pub const RUN: u64 = kvm_ioc(IOC_NONE, 0x80, 0);
    /// `KVM_SET_REGS`.
    pub const SET_REGS: u64 = kvm_ioc(IOC_WRITE, 0x82, size_of::<kvm_regs>());
    /// `KVM_GET_SREGS`.
    pub const GET_SREGS: u64 = kvm_ioc(IOC_READ, 0x83, size_of::<kvm_sregs>());
    /// `KVM_SET_SREGS`.
    pub const SET_SREGS: u64 = kvm_ioc(IOC_WRITE, 0x84, size_of::<kvm_sregs>());
    /// `KVM_SET_FPU`.
    pub const SET_FPU: u64 = kvm_ioc(IOC_WRITE, 0x8d, size_of::<kvm_fpu>());
    /// `KVM_SET_CPUID2`.
    pub const SET_CPUID2: u64 = kvm_ioc(IOC_WRITE, 0x90, size_of::<kvm_cpuid2>());
    /// `KVM_SET_TSS_ADDR` (Linux guests).
    pub const SET_TSS_ADDR: u64 = kvm_ioc(IOC_NONE, 0x47, 0);
    /// `KVM_CREATE_IRQCHIP` (Linux guests).
    pub const CREATE_IRQCHIP: u64 = kvm_ioc(IOC_NONE, 0x60, 0);
    /// `KVM_IRQFD` (`Vm::register_irqfd`, for Linux guests' interrupts).
    pub const IRQFD: u64 = kvm_ioc(IOC_WRITE, 0x76, size_of::<kvm_irqfd>());
    /// `KVM_CREATE_PIT2` (Linux guests).
    pub const CREATE_PIT2: u64 = kvm_ioc(IOC_WRITE, 0x77, size_of::<kvm_pit_config>());
    /// `KVM_SET_MSRS` (Linux guests' boot MSRs).
    pub const SET_MSRS: u64 = kvm_ioc(IOC_WRITE, 0x89, size_of::<kvm_msrs>());
    /// `KVM_GET_LAPIC` (Linux guests).
    pub const GET_LAPIC: u64 = kvm_ioc(IOC_READ, 0x8e, size_of::<kvm_lapic_state>());
    /// `KVM_SET_LAPIC` (Linux guests).
    pub const SET_LAPIC: u64 = kvm_ioc(IOC_WRITE, 0x8f, size_of::<kvm_lapic_state>());
}

/// What an allowed call may be given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Only {
    /// Any arguments.
    Any,
    /// Argument `arg` is one of `values` (compared as 64-bit).
    OneOf {
        /// Argument index, from 0.
        arg: u8,
        /// The values allowed.
        values: &'static [u64],
    },
    /// Argument `arg` is the vCPU kick signal (`SIGRTMIN`, known at run time).
    KickSignal {
        /// Argument index, from 0.
        arg: u8,
    },
    /// `arg & mask == value` for each of the (arg, mask, value) triples.
    Masked(&'static [(u8, u64, u64)]),
}

/// One allowed system call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Allow {
    /// The call's number (`libc::SYS_*`).
    pub nr: i64,
    /// What its arguments may be.
    pub only: Only,
}

const fn any(nr: i64) -> Allow {
    Allow {
        nr,
        only: Only::Any,
    }
}

const fn one_of(nr: i64, arg: u8, values: &'static [u64]) -> Allow {
    Allow {
        nr,
        only: Only::OneOf { arg, values },
    }
}

const PROT_EXEC: u64 = libc::PROT_EXEC as u64;
/// `MAP_SHARED | MAP_PRIVATE` (both bits: `MAP_SHARED_VALIDATE`) and `MAP_ANONYMOUS`.
const MAP_KIND: u64 = (libc::MAP_SHARED | libc::MAP_PRIVATE | libc::MAP_ANONYMOUS) as u64;
const MAP_PRIVATE_ANON: u64 = (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS) as u64;

/// `mmap` of private anonymous memory, never executable (malloc, stacks).
const MMAP_ANON: Allow = Allow {
    nr: libc::SYS_mmap,
    only: Only::Masked(&[(2, PROT_EXEC, 0), (3, MAP_KIND, MAP_PRIVATE_ANON)]),
};
/// `mmap` of anything (guest memory, memfd, `kvm_run`), never executable.
const MMAP_NO_EXEC: Allow = Allow {
    nr: libc::SYS_mmap,
    only: Only::Masked(&[(2, PROT_EXEC, 0)]),
};
/// `mprotect` that never makes memory executable.
const MPROTECT_NO_EXEC: Allow = Allow {
    nr: libc::SYS_mprotect,
    only: Only::Masked(&[(2, PROT_EXEC, 0)]),
};

/// Every teravm thread, whatever its role: what Rust's runtime and glibc do
/// at any moment (locks, allocation, logging to stderr, panics, signal
/// returns, thread and process exit), and what the SIGSYS handler needs
/// (`write`, `exit_group`).
pub(crate) const BASE: &[Allow] = &[
    any(libc::SYS_futex),          // Mutex, Condvar, Once, join, channels
    any(libc::SYS_write),          // log lines and panics on stderr; eventfd wakes
    any(libc::SYS_close),          // dropping any descriptor
    any(libc::SYS_exit),           // thread exit
    any(libc::SYS_exit_group),     // process exit (also the SIGSYS handler's _exit)
    any(libc::SYS_gettid),         // panic messages name the thread id
    any(libc::SYS_getrandom),      // a thread's first HashMap (RandomState keys)
    any(libc::SYS_clock_gettime),  // Instant::now where the vDSO falls back
    any(libc::SYS_sched_yield),    // spin loops in locks
    any(libc::SYS_rt_sigreturn),   // return from a signal handler (vCPU kick)
    any(libc::SYS_rt_sigprocmask), // glibc blocks signals around thread exit
    any(libc::SYS_sigaltstack),    // Rust's stack-overflow stack, freed at exit
    any(libc::SYS_munmap),         // free(), thread stacks, guest memory
    any(libc::SYS_mremap),         // realloc of large buffers
    any(libc::SYS_brk),            // malloc's main arena
    one_of(libc::SYS_madvise, 2, &[libc::MADV_DONTNEED as u64]), // free(), stacks
    // The SIGSYS handler reads the name of a thread that installed no filter
    // of its own (a worker).
    one_of(libc::SYS_prctl, 0, &[libc::PR_GET_NAME as u64]),
    // The SIGSYS handler (and a failed filter install) waits a bounded time
    // for room on stderr before writing, so a full stderr cannot hang it.
    any(libc::SYS_poll),
    MMAP_ANON,
    MPROTECT_NO_EXEC,
];

/// A thread that starts threads: `clone3` here, and what the new thread
/// does before it installs its own filter, which runs under this one:
/// glibc's start (`rseq`, `set_robust_list`, signal mask), Rust's guard
/// and alternate stack, the name (`PR_SET_NAME`), and the install itself
/// (`PR_SET_NO_NEW_PRIVS`, `seccomp`).
const SPAWN: &[Allow] = &[
    any(libc::SYS_clone3),
    any(libc::SYS_rseq),
    any(libc::SYS_set_robust_list),
    any(libc::SYS_sched_getaffinity), // pthread_getattr_np (Rust's stack guard)
    one_of(
        libc::SYS_prctl,
        0,
        &[libc::PR_SET_NAME as u64, libc::PR_SET_NO_NEW_PRIVS as u64],
    ),
    one_of(
        libc::SYS_seccomp,
        0,
        &[libc::SECCOMP_SET_MODE_FILTER as u64],
    ),
];

/// `vcpu{n}`: the `KVM_RUN` loop and its devices. Guest port I/O is
/// answered in place (serial bytes written to stdout and the serial file
/// with `write`); parking waits on a futex; the kick is a signal whose
/// handler returns with `rt_sigreturn` (all in [`BASE`]). The vCPU fd and its
/// `kvm_run` mapping are closed and unmapped here at the end.
const VCPU: &[Allow] = &[one_of(libc::SYS_ioctl, 1, &[kvm::RUN])];

/// `api`: accepts connections and starts an `api-conn` thread for each.
const API: &[Allow] = &[
    any(libc::SYS_poll),            // wait for a client or the stop event
    any(libc::SYS_accept4),         // take the connection
    any(libc::SYS_clock_nanosleep), // back off after a failed accept
    // The peer's credentials (SO_PEERCRED), checked on accept against
    // teravm's own uid.
    one_of(libc::SYS_getsockopt, 2, &[libc::SO_PEERCRED as u64]),
    any(libc::SYS_geteuid),
    // Refused clients (503, 403): a non-blocking reply, read what they
    // sent while they linger, and the slot taken from a connection that
    // lost it (`shutdown` of its reading side).
    one_of(libc::SYS_ioctl, 1, &[libc::FIONBIO]),
    any(libc::SYS_sendto),
    any(libc::SYS_recvfrom),
    any(libc::SYS_shutdown),
    // The slot table keeps a clone of each connection's stream (to shut it
    // down when the slot goes to another client).
    one_of(libc::SYS_fcntl, 1, &[libc::F_DUPFD_CLOEXEC as u64]),
];

/// `api-conn`: one client connection: read requests, hand them to the VMM
/// (channel + `write` of an eventfd), write replies.
const API_CONNECTION: &[Allow] = &[
    any(libc::SYS_poll),     // wait for bytes, a timeout or the stop event
    any(libc::SYS_recvfrom), // UnixStream reads (recv)
    any(libc::SYS_sendto),   // UnixStream writes (send with MSG_NOSIGNAL)
    one_of(libc::SYS_ioctl, 1, &[libc::FIONBIO]), // set_nonblocking
    // set_write_timeout / set_read_timeout: SO_SNDTIMEO, SO_RCVTIMEO.
    one_of(libc::SYS_setsockopt, 1, &[libc::SOL_SOCKET as u64]),
    one_of(libc::SYS_getsockopt, 2, &[libc::SO_PEERCRED as u64]),
    // A connection that lost its slot gives up its reading side.
    any(libc::SYS_shutdown),
];

/// `console`: drains the guest console buffer to stdout and the serial file
/// and waits for more: `write`, `futex`, and `clock_gettime` of the process
/// CPU time for the boot timer, all in [`BASE`].
const CONSOLE: &[Allow] = &[];

/// `progress`: writes a line to stderr every tick and waits on a channel
/// with a timeout (`write`, `futex` in [`BASE`]).
const PROGRESS: &[Allow] = &[];

/// `output`: writes teravm's queued output to stderr and the log path's
/// sink and waits for more (`write`, `futex` in [`BASE`]).
const OUTPUT: &[Allow] = &[];

/// `start` (and the main thread while the start runs on it): the KVM VM,
/// guest memory (anonymous, memfd or hugetlb mappings; THP advice; NUMA
/// binding), memslots, the vCPUs' fds and registers, the vCPU kick handler,
/// and the `populate-n{node}-{i}` workers (pinned, `MADV_POPULATE_WRITE`),
/// which run under this filter.
const START: &[Allow] = &[
    // COM1's interrupt line for a Linux guest: an eventfd registered as an
    // irqfd.
    any(libc::SYS_eventfd2),
    // /dev/kvm read-write; /proc and sysfs read-only (the memory admission
    // of issue 12 reads the cgroup's limits), never created, never written.
    one_of(
        libc::SYS_openat,
        2,
        &[
            (libc::O_RDWR | libc::O_CLOEXEC) as u64,
            (libc::O_RDONLY | libc::O_CLOEXEC) as u64,
        ],
    ),
    // Those files, and the kernel image and initrd of a Linux guest.
    any(libc::SYS_read),
    any(libc::SYS_lseek),
    any(libc::SYS_statx), // std's read_to_string sizes its buffer
    one_of(
        libc::SYS_ioctl,
        1,
        &[
            kvm::CREATE_VM,
            kvm::CHECK_EXTENSION,
            kvm::GET_VCPU_MMAP_SIZE,
            kvm::GET_SUPPORTED_CPUID,
            kvm::SET_USER_MEMORY_REGION,
            kvm::CREATE_VCPU,
            kvm::SET_CPUID2,
            kvm::SET_FPU,
            kvm::GET_SREGS,
            kvm::SET_SREGS,
            kvm::SET_REGS,
            kvm::SET_TSS_ADDR,
            kvm::CREATE_IRQCHIP,
            kvm::IRQFD,
            kvm::CREATE_PIT2,
            kvm::SET_MSRS,
            kvm::GET_LAPIC,
            kvm::SET_LAPIC,
            libc::TCGETS, // the progress line: is stderr a terminal?
        ],
    ),
    MMAP_NO_EXEC,                 // guest memory, memfd slices, kvm_run
    any(libc::SYS_memfd_create),  // memfd backing
    any(libc::SYS_ftruncate),     // its size
    any(libc::SYS_mbind),         // NUMA binding of each slice
    any(libc::SYS_get_mempolicy), // the binding as the kernel took it
    one_of(
        libc::SYS_madvise,
        2,
        &[
            libc::MADV_HUGEPAGE as u64,
            libc::MADV_NOHUGEPAGE as u64,
            libc::MADV_DONTDUMP as u64, // guest memory out of core dumps (issue 12)
            libc::MADV_POPULATE_WRITE as u64,
        ],
    ),
    any(libc::SYS_sched_setaffinity), // populate workers pin themselves
    one_of(libc::SYS_fcntl, 1, &[libc::F_DUPFD_CLOEXEC as u64]), // EventFd/File clones
    // The vCPU kick handler.
    Allow {
        nr: libc::SYS_rt_sigaction,
        only: Only::KickSignal { arg: 0 },
    },
];

/// `reclaim`: closes the VM, frees guest memory with the
/// `reclaim-n{node}-{i}` workers (which run under this filter), unmaps it
/// and signals the event loop.
const RECLAIM: &[Allow] = &[
    any(libc::SYS_mincore),           // resident bytes of each chunk
    any(libc::SYS_sched_setaffinity), // workers pin themselves
    // Stop the vCPUs first: the kick signal, then join.
    any(libc::SYS_getpid),
    Allow {
        nr: libc::SYS_tgkill,
        only: Only::KickSignal { arg: 2 },
    },
    one_of(libc::SYS_ioctl, 1, &[libc::TCGETS]), // the progress line
    // Hole punch of memfd/hugetlb slices: PUNCH_HOLE | KEEP_SIZE only.
    one_of(
        libc::SYS_fallocate,
        1,
        &[(libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE) as u64],
    ),
];

/// `LineSink::open`'s flags besides the access mode.
const LINE_SINK: i32 = libc::O_CREAT | libc::O_APPEND | libc::O_NONBLOCK | libc::O_CLOEXEC;

/// The main thread `teravm` once its event loop runs: wait on the event
/// sources, read them, answer the API, kick the vCPUs (`tgkill`), start the
/// `reclaim` job, and at exit remove the API socket.
const VMM: &[Allow] = &[
    any(libc::SYS_epoll_wait),
    one_of(
        libc::SYS_epoll_ctl,
        1,
        &[
            libc::EPOLL_CTL_ADD as u64,
            libc::EPOLL_CTL_DEL as u64,
            libc::EPOLL_CTL_MOD as u64,
        ],
    ),
    any(libc::SYS_read), // eventfds, the signalfd, the metrics timerfd
    // PUT /logger, PUT /metrics: LineSink::open of a file (created 0600) or
    // a FIFO (read-write when it has no reader yet), appending, non-blocking.
    one_of(
        libc::SYS_openat,
        2,
        &[
            (libc::O_WRONLY | LINE_SINK) as u64,
            (libc::O_RDWR | LINE_SINK) as u64,
        ],
    ),
    any(libc::SYS_clock_nanosleep), // waits for in-flight API replies at exit
    any(libc::SYS_statx),           // the socket is still ours before unlink
    any(libc::SYS_unlink),          // remove the API socket
    one_of(libc::SYS_fcntl, 1, &[libc::F_DUPFD_CLOEXEC as u64]),
    // Console input for Linux guests (src/vmm/stdin.rs): what stdin is, a
    // foreground terminal put in raw mode and restored, and the retry timer.
    any(libc::SYS_fstat),
    any(libc::SYS_newfstatat), // glibc's fstat
    any(libc::SYS_getpgrp),
    one_of(
        libc::SYS_ioctl,
        1,
        &[libc::TCGETS, libc::TCSETS, libc::TIOCGPGRP],
    ),
    any(libc::SYS_timerfd_create),
    any(libc::SYS_timerfd_settime),
];

impl Role {
    /// The role's own calls, beyond [`BASE`].
    pub(crate) fn own(self) -> &'static [Allow] {
        match self {
            Role::Vmm => VMM,
            Role::Api => API,
            Role::ApiConnection => API_CONNECTION,
            Role::Vcpu => VCPU,
            Role::Console => CONSOLE,
            Role::Start => START,
            Role::Reclaim => RECLAIM,
            Role::Progress => PROGRESS,
            Role::Output => OUTPUT,
        }
    }

    /// Whether threads of this role start other threads.
    fn spawns(self) -> bool {
        matches!(self, Role::Vmm | Role::Api | Role::Start | Role::Reclaim)
    }

    /// The roles of the threads this role spawns after installing its
    /// filter: they run under it, so it must allow what they call.
    pub(crate) fn children(self) -> &'static [Role] {
        match self {
            Role::Vmm => &[Role::Console, Role::Start, Role::Reclaim],
            Role::Api => &[Role::ApiConnection],
            Role::Start => &[Role::Vcpu, Role::Progress],
            Role::Reclaim => &[Role::Progress],
            _ => &[],
        }
    }

    /// Every call this role's filter allows: [`BASE`], its own list, the
    /// thread-start calls if it spawns, and its children's lists.
    pub(crate) fn allowed(self) -> Vec<Allow> {
        let mut all: Vec<Allow> = BASE.to_vec();
        all.extend_from_slice(self.own());
        if self.spawns() {
            all.extend_from_slice(SPAWN);
        }
        for child in self.children() {
            all.extend(child.allowed());
        }
        all
    }
}
