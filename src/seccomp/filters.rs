//! The system calls each thread role may make, as data: one list per role,
//! each entry a call, an optional condition on its arguments, and the reason
//! the role's code makes it. docs/seccomp.md is generated from these lists
//! ([`super::describe`]) and a test keeps the two in step.
//!
//! Designed from the code each role runs, not traced from a test run. A
//! role's filter is [`BASE`] plus its own list; a role that starts threads
//! after installing its filter also allows [`SPAWN`] and its children's
//! lists (filters stack: a child runs under its spawner's filter too, so it
//! can only narrow it). Only three roles spawn after their filter (`api`,
//! `start`, `reclaim`); the main thread spawns nothing once filtered: every
//! long-lived thread (`api`, `files`, `output`, the `start` and `reclaim`
//! job runners) is started before it installs its own.

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
        kvm_cpuid2, kvm_create_guest_memfd, kvm_fpu, kvm_ioeventfd, kvm_irqfd, kvm_lapic_state,
        kvm_msrs, kvm_pit_config, kvm_regs, kvm_sregs, kvm_userspace_memory_region,
        kvm_userspace_memory_region2,
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
    /// `KVM_SET_USER_MEMORY_REGION2` (guest_memfd memslots).
    pub const SET_USER_MEMORY_REGION2: u64 =
        kvm_ioc(IOC_WRITE, 0x49, size_of::<kvm_userspace_memory_region2>());
    /// `KVM_CREATE_GUEST_MEMFD`.
    pub const CREATE_GUEST_MEMFD: u64 = kvm_ioc(
        IOC_READ | IOC_WRITE,
        0xd4,
        size_of::<kvm_create_guest_memfd>(),
    );
    /// `KVM_RUN`.
    pub const RUN: u64 = kvm_ioc(IOC_NONE, 0x80, 0);
    /// `KVM_SET_REGS`.
    pub const SET_REGS: u64 = kvm_ioc(IOC_WRITE, 0x82, size_of::<kvm_regs>());
    /// `KVM_GET_SREGS`.
    pub const GET_SREGS: u64 = kvm_ioc(IOC_READ, 0x83, size_of::<kvm_sregs>());
    /// `KVM_GET_REGS` (the guest RIP in a crash line).
    pub const GET_REGS: u64 = kvm_ioc(IOC_READ, 0x81, size_of::<kvm_regs>());
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
    /// `KVM_IOEVENTFD` (virtio queue notifications without an exit).
    pub const IOEVENTFD: u64 = kvm_ioc(IOC_WRITE, 0x79, size_of::<kvm_ioeventfd>());
    /// `KVM_CREATE_PIT2` (Linux guests).
    pub const CREATE_PIT2: u64 = kvm_ioc(IOC_WRITE, 0x77, size_of::<kvm_pit_config>());
    /// `KVM_REINJECT_CONTROL` (the `pit` thread: PIT reinjection off).
    pub const REINJECT_CONTROL: u64 = kvm_ioc(IOC_NONE, 0x71, 0);
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
    /// Argument `arg` is one of `values` (compared as 64-bit), each with the
    /// name the docs show.
    OneOf {
        /// Argument index, from 0.
        arg: u8,
        /// The values allowed, with their names.
        values: &'static [(u64, &'static str)],
    },
    /// Argument `arg` is the vCPU kick signal (`SIGRTMIN`, known at run time).
    KickSignal {
        /// Argument index, from 0.
        arg: u8,
    },
    /// `arg & mask == value` for each of the (arg, mask, value) triples; the
    /// text says it in words.
    Masked(&'static [(u8, u64, u64)], &'static str),
}

/// One allowed system call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Allow {
    /// The call's number (`libc::SYS_*`).
    pub nr: i64,
    /// What its arguments may be.
    pub only: Only,
    /// Why the role makes it.
    pub why: &'static str,
}

const fn any(nr: i64, why: &'static str) -> Allow {
    Allow {
        nr,
        only: Only::Any,
        why,
    }
}

const fn one_of(
    nr: i64,
    arg: u8,
    values: &'static [(u64, &'static str)],
    why: &'static str,
) -> Allow {
    Allow {
        nr,
        only: Only::OneOf { arg, values },
        why,
    }
}

/// A `(value, "NAME")` pair for [`Only::OneOf`].
macro_rules! named {
    ($($path:ident)::+) => {
        ($($path)::+ as u64, stringify!($($path)::+))
    };
}

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
const fn mmap_no_exec(why: &'static str) -> Allow {
    Allow {
        nr: libc::SYS_mmap,
        only: Only::Masked(&[(2, PROT_EXEC, 0)], "never PROT_EXEC"),
        why,
    }
}

/// `cachestat` (Linux 6.5), not in libc's list yet.
const SYS_CACHESTAT: i64 = 451;

/// `PAGEMAP_SCAN` (Linux 6.7), `_IOWR('f', 16, struct pm_scan_arg)`; the
/// same as `crate::memory::pagemap::PAGEMAP_SCAN` (a unit test says so).
pub(crate) const PAGEMAP_SCAN: u64 = 0xc060_6610;

const O_RDONLY_CLOEXEC: u64 = (libc::O_RDONLY | libc::O_CLOEXEC) as u64;

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

/// `vcpu{n}`: the `KVM_RUN` loop and the port I/O devices. Console bytes go
/// to a bounded buffer and log lines to the output queue (futex, in BASE);
/// parking waits on a futex; the kick is a signal whose handler only sets
/// `immediate_exit`; the vCPU fd and its `kvm_run` mapping are closed and
/// unmapped here at the end (BASE).
const VCPU: &[Allow] = &[one_of(
    libc::SYS_ioctl,
    1,
    &[named!(kvm::RUN), named!(kvm::GET_REGS)],
    "KVM_RUN; KVM_GET_REGS for the guest RIP in a crash line",
)];

/// `api`: accepts connections and starts an `api-conn` thread for each.
const API: &[Allow] = &[
    any(libc::SYS_accept4, "take a connection"),
    any(libc::SYS_clock_nanosleep, "back off after a failed accept"),
    one_of(
        libc::SYS_getsockopt,
        2,
        &[named!(libc::SO_PEERCRED)],
        "the peer's uid, checked against teravm's own on accept",
    ),
    any(libc::SYS_geteuid, "teravm's own uid, for that check"),
    one_of(
        libc::SYS_ioctl,
        1,
        &[named!(libc::FIONBIO)],
        "refused clients get a non-blocking reply",
    ),
    any(libc::SYS_sendto, "the reply to a refused client (503, 403)"),
    any(
        libc::SYS_recvfrom,
        "read what a refused client sent while it lingers",
    ),
    any(
        libc::SYS_shutdown,
        "take a slot back from a connection that lost it",
    ),
    one_of(
        libc::SYS_fcntl,
        1,
        &[named!(libc::F_DUPFD_CLOEXEC)],
        "the slot table keeps a clone of each connection's stream",
    ),
];

/// `api-conn`: one client connection: read requests, hand them to the VMM
/// (a channel and an eventfd `write`), write replies. It opens nothing: a
/// path in a request is opened by the `files` thread.
const API_CONNECTION: &[Allow] = &[
    any(
        libc::SYS_poll,
        "wait for bytes, a timeout or the stop event",
    ),
    any(libc::SYS_recvfrom, "read the request (UnixStream::read)"),
    any(libc::SYS_sendto, "write the reply (send with MSG_NOSIGNAL)"),
    one_of(
        libc::SYS_ioctl,
        1,
        &[named!(libc::FIONBIO)],
        "set_nonblocking",
    ),
    one_of(
        libc::SYS_setsockopt,
        1,
        &[named!(libc::SOL_SOCKET)],
        "set_read_timeout, set_write_timeout (SO_RCVTIMEO, SO_SNDTIMEO)",
    ),
    one_of(
        libc::SYS_getsockopt,
        2,
        &[named!(libc::SO_PEERCRED)],
        "the peer's credentials",
    ),
    any(
        libc::SYS_shutdown,
        "a connection that lost its slot gives up its reading side",
    ),
];

/// `console`: drains the guest console buffer to stdout and the serial
/// file: `write` and `futex` (BASE), and the process CPU time for the boot
/// timer (`clock_gettime`, BASE).
const CONSOLE: &[Allow] = &[];

/// `progress`: renders the populate or reclaim progress line into the
/// output queue every tick and waits on a channel with a timeout (BASE).
const PROGRESS: &[Allow] = &[];

/// `output`: drains teravm's own output queue to stderr or the log path
/// (`write`, `futex`: BASE).
const OUTPUT: &[Allow] = &[];

/// `files`: opens the paths a user names (src/files.rs), with exactly these
/// flag sets, and checks what it opened.
const FILES: &[Allow] = &[
    one_of(
        libc::SYS_openat,
        2,
        &[
            (super::open_flags::READ_IMAGE as u64, "O_RDONLY|O_NONBLOCK|O_CLOEXEC"),
            (
                super::open_flags::OUTPUT_WRITE as u64,
                "O_WRONLY|O_APPEND|O_CREAT|O_NOFOLLOW|O_NONBLOCK|O_CLOEXEC",
            ),
            (
                super::open_flags::OUTPUT_FIFO as u64,
                "O_RDWR|O_APPEND|O_CREAT|O_NOFOLLOW|O_NONBLOCK|O_CLOEXEC",
            ),
            (
                super::open_flags::DRIVE_RW as u64,
                "O_RDWR|O_NONBLOCK|O_CLOEXEC",
            ),
        ],
        "the kernel, initrd and read-only drives read-only; log, metrics and serial files append-only, created 0600, no symlink followed; read-write drives, never created",
    ),
    any(libc::SYS_statx, "the opened file's type and size (File::metadata)"),
    any(libc::SYS_fstat, "File::metadata where statx is missing"),
    any(libc::SYS_newfstatat, "glibc's fstat"),
    any(libc::SYS_read, "an image's first bytes (ELF or bzImage header)"),
    any(libc::SYS_fstatfs, "output on procfs or sysfs is refused (/proc/self/mem)"),
    one_of(
        libc::SYS_fcntl,
        1,
        &[named!(libc::F_GETFL), named!(libc::F_SETFL)],
        "clear O_NONBLOCK of the serial file once open",
    ),
    one_of(
        libc::SYS_ioctl,
        1,
        &[
            named!(libc::TCGETS),
            named!(libc::SIOCGIFINDEX),
            named!(libc::TUNSETIFF),
            named!(libc::TUNSETVNETHDRSZ),
            named!(libc::TUNSETOFFLOAD),
        ],
        "is an output device a terminal?; a tap: does the interface exist, attach to it, its virtio-net header size, no offloads yet",
    ),
    one_of(
        libc::SYS_socket,
        0,
        &[named!(libc::AF_INET), named!(libc::AF_UNIX)],
        "a datagram socket for SIOCGIFINDEX (a tap that does not exist is refused, never created); the vsock's uds_path",
    ),
    any(libc::SYS_bind, "those sockets"),
    any(libc::SYS_listen, "the vsock's uds_path"),
    any(libc::SYS_fchmod, "the vsock's socket 0600 before it is bound"),
];

/// `balloon`: the virtio-balloon's queue work (its epoll was built by the
/// `start` job): waits for queue notifications, its wake eventfd and the
/// statistics deadline, reads guest memory through its view (no call),
/// acknowledges by eventfd (`write`, BASE), and hands ranges to the discard
/// pool, which frees small batches inline on this thread.
const BALLOON: &[Allow] = &[
    any(
        libc::SYS_epoll_wait,
        "wait for the queues, the wake eventfd, the statistics deadline",
    ),
    any(libc::SYS_read, "clear the eventfds"),
    PUNCH_HOLE,
];

/// `discard-n{node}-{i}`: frees the ranges of its node's queue, pinned to
/// the node's CPUs before its filter: `madvise(MADV_DONTNEED)` (BASE) or a
/// hole punch; waits on its queue (futex, BASE). Before it frees a
/// virtio-mem UNPLUG that emptied slots, it takes them out of KVM (the
/// UNPLUG was answered at once; src/vmm/sinks/hotplug_slots.rs).
const DISCARD: &[Allow] = &[
    PUNCH_HOLE,
    one_of(
        libc::SYS_ioctl,
        1,
        &[
            named!(kvm::SET_USER_MEMORY_REGION),
            named!(kvm::SET_USER_MEMORY_REGION2),
        ],
        "an UNPLUG's emptied slot leaves KVM before its blocks are freed (guest_memfd ones by REGION2)",
    ),
];

/// `virtio-blk{n}`: a drive's queue work and its file's I/O, on its own
/// thread (a file that stalls stops this device only). The file was opened
/// by the `files` thread; a `PATCH /drives` swaps in another one.
const BLOCK: &[Allow] = &[
    any(
        libc::SYS_epoll_wait,
        "wait for the queue, the wake and exit eventfds, the rate limiter's timer",
    ),
    any(
        libc::SYS_read,
        "clear the eventfds; the rate limiter's timer (a block ends)",
    ),
    any(
        libc::SYS_timerfd_settime,
        "arm the rate limiter's timer when it refuses a request (a block begins)",
    ),
    any(
        libc::SYS_pread64,
        "IN requests: read the drive into the bounce buffer",
    ),
    any(
        libc::SYS_pwrite64,
        "OUT requests: write the bounce buffer to the drive",
    ),
    any(libc::SYS_fdatasync, "FLUSH with cache_type Writeback"),
    any(
        libc::SYS_lseek,
        "the size of a file swapped in by PATCH /drives",
    ),
    any(
        libc::SYS_io_uring_enter,
        "io_engine Async: submit reads, writes and fsyncs; wait for those in flight at exit (the operations are the kernel's: not checked by this filter)",
    ),
];

/// `virtio-net{n}`: frames between the guest's queues and its tap (opened
/// by the `files` thread), one `read` or `write` a frame.
const NET: &[Allow] = &[
    any(
        libc::SYS_epoll_wait,
        "wait for the tap, the queues, the wake and exit eventfds",
    ),
    any(libc::SYS_read, "frames from the tap; clear the eventfds"),
    one_of(
        libc::SYS_ioctl,
        1,
        &[named!(libc::TUNSETOFFLOAD)],
        "the offloads the guest acked, set once per activation (never on a vCPU)",
    ),
    any(
        libc::SYS_timerfd_settime,
        "a rate limiter arms its timer when it blocks (rx_rate_limiter, tx_rate_limiter)",
    ),
];

/// `virtio-rng`: the entropy device's requests (src/devices/virtio/rng).
const ENTROPY: &[Allow] = &[
    any(
        libc::SYS_epoll_wait,
        "wait for the queue, the limiter's timer, the wake and exit eventfds",
    ),
    any(libc::SYS_read, "clear the eventfds; the limiter's timer"),
    any(
        libc::SYS_timerfd_settime,
        "the rate limiter arms its timer when it blocks",
    ),
    // getrandom is in BASE (std's HashMap keys); here it also fills the
    // guest's requests, as Firecracker's entropy device does.
];

/// `virtio-mem{n}`: a virtio-mem device's requests (src/devices/virtio/mem)
/// and its sink (src/vmm/sinks/hotplug_slots.rs): a PLUG's memslots enter KVM here, an
/// UNPLUG's leave it, and the unplugged blocks go to the discard pool,
/// which frees small batches inline on this thread (`madvise(MADV_DONTNEED)`
/// is in BASE; a hole punch for memfd and guest_memfd).
const MEM: &[Allow] = &[
    any(
        libc::SYS_epoll_wait,
        "wait for the queue, the wake and exit eventfds",
    ),
    any(libc::SYS_read, "clear the eventfds"),
    one_of(
        libc::SYS_ioctl,
        1,
        &[
            named!(kvm::SET_USER_MEMORY_REGION),
            named!(kvm::SET_USER_MEMORY_REGION2),
        ],
        "a plugged slot enters KVM (guest_memfd ones by REGION2); an emptied one leaves it here when the pool is serial or the batch small (else on a discard worker)",
    ),
    PUNCH_HOLE,
    // write (the irqfd, the wake eventfd) and futex (the device's lock,
    // held by the API and vCPU threads too; the PLUG fence's wait) are in
    // BASE.
];

/// `virtio-vsock`: the vsock's packets, the host connections to
/// `uds_path` (accepted) and the guest's to `<uds_path>_<port>` (made
/// here), all non-blocking on this thread's epoll.
const VSOCK: &[Allow] = &[
    any(
        libc::SYS_epoll_wait,
        "wait for the queues, the sockets, the deadlines",
    ),
    one_of(
        libc::SYS_epoll_ctl,
        1,
        &[
            named!(libc::EPOLL_CTL_ADD),
            named!(libc::EPOLL_CTL_DEL),
            named!(libc::EPOLL_CTL_MOD),
        ],
        "connections come and go",
    ),
    any(libc::SYS_read, "clear the eventfds"),
    any(libc::SYS_accept4, "a host connection to uds_path"),
    one_of(
        libc::SYS_ioctl,
        1,
        &[named!(libc::FIONBIO)],
        "accepted streams non-blocking",
    ),
    one_of(
        libc::SYS_socket,
        0,
        &[named!(libc::AF_UNIX)],
        "a guest connection to <uds_path>_<port>",
    ),
    any(
        libc::SYS_connect,
        "that connection (the path is uds_path's, the port the guest's)",
    ),
    any(libc::SYS_recvfrom, "bytes from a host connection"),
    any(libc::SYS_sendto, "bytes to a host connection; OK <port>"),
    any(
        libc::SYS_shutdown,
        "a connection's writing side when the guest shuts it",
    ),
];

/// `fallocate` that only punches holes (memfd and hugetlb slices).
const PUNCH_HOLE: Allow = one_of(
    libc::SYS_fallocate,
    1,
    &[(
        (libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE) as u64,
        "FALLOC_FL_PUNCH_HOLE|FALLOC_FL_KEEP_SIZE",
    )],
    "free memfd and hugetlb slices",
);

/// `start` (a job runner thread): the KVM VM (on the `/dev/kvm` descriptor
/// opened at start-up), guest memory (anonymous, memfd or hugetlb mappings;
/// THP advice; NUMA binding), memslots, the kernel and initrd (already
/// open), the vCPUs' fds and registers, the console writer, and the
/// `populate-n{node}-{i}` workers (pinned, `MADV_POPULATE_WRITE`), which run
/// under this filter.
const START: &[Allow] = &[
    any(
        libc::SYS_io_uring_setup,
        "a drive's io_uring (io_engine Async), made with its device's thread",
    ),
    any(
        libc::SYS_io_uring_register,
        "register the completion eventfd of a drive's io_uring (io_engine Async)",
    ),
    any(
        libc::SYS_eventfd2,
        "COM1's interrupt line for a Linux guest (an irqfd); the virtio devices' queue and interrupt eventfds",
    ),
    any(libc::SYS_epoll_create1, "a device thread's epoll, built before it starts"),
    one_of(
        libc::SYS_epoll_ctl,
        1,
        &[named!(libc::EPOLL_CTL_ADD)],
        "the device thread's event sources, added as its epoll is built",
    ),
    any(
        libc::SYS_timerfd_create,
        "the block, net and entropy devices' rate limiter timers, made with each device's thread",
    ),
    one_of(
        libc::SYS_openat,
        2,
        &[(O_RDONLY_CLOEXEC, "O_RDONLY|O_CLOEXEC")],
        "read-only /proc and sysfs: the memory admission's cgroup limits, the host's NUMA distances; the thread count a start-fails-at fault reports (/proc/self/status)",
    ),
    any(libc::SYS_read, "those files; the kernel and initrd"),
    any(libc::SYS_lseek, "the kernel loader seeks in the image; a drive's size"),
    any(libc::SYS_statx, "std's read_to_string sizes its buffer"),
    one_of(
        libc::SYS_ioctl,
        1,
        &[
            named!(kvm::CREATE_VM),
            named!(kvm::CHECK_EXTENSION),
            named!(kvm::GET_VCPU_MMAP_SIZE),
            named!(kvm::GET_SUPPORTED_CPUID),
            named!(kvm::SET_USER_MEMORY_REGION),
            named!(kvm::SET_USER_MEMORY_REGION2),
            named!(kvm::CREATE_GUEST_MEMFD),
            named!(kvm::CREATE_VCPU),
            named!(kvm::SET_CPUID2),
            named!(kvm::SET_FPU),
            named!(kvm::GET_SREGS),
            named!(kvm::SET_SREGS),
            named!(kvm::SET_REGS),
            named!(kvm::SET_TSS_ADDR),
            named!(kvm::CREATE_IRQCHIP),
            named!(kvm::IRQFD),
            named!(kvm::IOEVENTFD),
            named!(kvm::CREATE_PIT2),
            named!(kvm::REINJECT_CONTROL),
            named!(kvm::SET_MSRS),
            named!(kvm::GET_LAPIC),
            named!(kvm::SET_LAPIC),
            named!(libc::TCGETS),
            named!(libc::FIONBIO),
        ],
        "the VM, its memslots (guest_memfd ones too) and guest_memfds, irqchip and PIT (the `pit` thread it spawns turns the PIT's reinjection off), the devices' irqfds and ioeventfds, the vCPUs' setup; TCGETS: is stderr a terminal (progress line); FIONBIO: the vsock's listener",
    ),
    mmap_no_exec("guest memory, memfd and guest_memfd slices, each vCPU's kvm_run; one page of a guest_memfd again, to ask for its policy"),
    any(libc::SYS_memfd_create, "memfd backing"),
    any(libc::SYS_ftruncate, "a memfd's size"),
    any(libc::SYS_mbind, "NUMA binding of each slice"),
    any(
        libc::SYS_get_mempolicy,
        "the binding as the kernel took it (does a guest_memfd keep it for the file)",
    ),
    any(
        libc::SYS_move_pages,
        "where sampled pages landed after a populate (no targets: nothing moves)",
    ),
    one_of(
        libc::SYS_fallocate,
        1,
        &[(
            libc::FALLOC_FL_KEEP_SIZE as u64,
            "FALLOC_FL_KEEP_SIZE",
        )],
        "populate of guest_memfd slices (allocate, never resize or punch)",
    ),
    one_of(
        libc::SYS_madvise,
        2,
        &[
            named!(libc::MADV_HUGEPAGE),
            named!(libc::MADV_NOHUGEPAGE),
            named!(libc::MADV_DONTDUMP),
            named!(libc::MADV_POPULATE_WRITE),
        ],
        "THP advice, guest memory out of core dumps, populate",
    ),
    any(libc::SYS_sched_setaffinity, "populate workers pin themselves to their node"),
    one_of(
        libc::SYS_fcntl,
        1,
        &[named!(libc::F_DUPFD_CLOEXEC)],
        "EventFd and File clones; the /dev/kvm descriptor",
    ),
    Allow {
        nr: libc::SYS_rt_sigaction,
        only: Only::KickSignal { arg: 0 },
        why: "the vCPU kick handler",
    },
];

/// `reclaim` (a job runner thread): stops the vCPUs, closes the VM, frees
/// guest memory with the `reclaim-n{node}-{i}` workers (which run under
/// this filter), unmaps it (or keeps its range reserved while a vCPU thread
/// lives on) and signals the event loop.
const RECLAIM: &[Allow] = &[
    any(libc::SYS_mincore, "resident bytes of each chunk"),
    one_of(
        libc::SYS_madvise,
        2,
        &[named!(libc::MADV_RANDOM)],
        "file-backed slices lose their recency before they are freed (no LRU activation while unmapping)",
    ),
    any(
        SYS_CACHESTAT,
        "allocated bytes of each guest_memfd chunk (its page cache)",
    ),
    any(
        libc::SYS_sched_setaffinity,
        "workers pin themselves to their node",
    ),
    any(libc::SYS_getpid, "the kick: tgkill's process id"),
    Allow {
        nr: libc::SYS_tgkill,
        only: Only::KickSignal { arg: 2 },
        why: "kick the vCPUs out of KVM_RUN",
    },
    one_of(
        libc::SYS_ioctl,
        1,
        &[
            named!(libc::TCGETS),
            (PAGEMAP_SCAN, "PAGEMAP_SCAN"),
        ],
        "is stderr a terminal (progress line); the guest's own pages of each anonymous chunk (/proc/self/pagemap, opened at the start)",
    ),
    one_of(
        libc::SYS_fallocate,
        1,
        &[(
            (libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE) as u64,
            "FALLOC_FL_PUNCH_HOLE|FALLOC_FL_KEEP_SIZE",
        )],
        "free memfd and hugetlb slices",
    ),
];

/// The main thread `teravm` once its event loop runs: wait on the event
/// sources and read them, answer the API, feed console input, kick the
/// vCPUs, and at exit remove the API socket. It opens nothing and starts
/// no thread.
const VMM: &[Allow] = &[
    any(libc::SYS_epoll_wait, "the event loop"),
    one_of(
        libc::SYS_epoll_ctl,
        1,
        &[
            named!(libc::EPOLL_CTL_ADD),
            named!(libc::EPOLL_CTL_DEL),
            named!(libc::EPOLL_CTL_MOD),
        ],
        "event sources come and go (stdin, its retry timer)",
    ),
    any(libc::SYS_read, "eventfds, the signalfd, the timers, stdin"),
    any(
        libc::SYS_clock_nanosleep,
        "waits for in-flight API replies at exit",
    ),
    any(
        libc::SYS_statx,
        "the API socket is still ours before unlink",
    ),
    any(libc::SYS_unlink, "remove the API socket at exit"),
    one_of(
        libc::SYS_fcntl,
        1,
        &[named!(libc::F_DUPFD_CLOEXEC)],
        "EventFd and File clones for the jobs",
    ),
    any(libc::SYS_fstat, "what stdin is (console input)"),
    any(libc::SYS_newfstatat, "glibc's fstat"),
    any(libc::SYS_getpgrp, "is stdin's terminal in the foreground"),
    one_of(
        libc::SYS_ioctl,
        1,
        &[
            named!(libc::TCGETS),
            named!(libc::TCSETS),
            named!(libc::TIOCGPGRP),
            named!(libc::FIONREAD),
        ],
        "stdin: a foreground terminal in raw mode and back; how many bytes it has",
    ),
    any(
        libc::SYS_timerfd_create,
        "the metrics timer, the console input retry timer",
    ),
    any(libc::SYS_timerfd_settime, "arming them"),
    any(libc::SYS_getpid, "the kick: tgkill's process id"),
    Allow {
        nr: libc::SYS_tgkill,
        only: Only::KickSignal { arg: 2 },
        why: "kick the vCPUs (a microVM dropped on an error path stops them)",
    },
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
            Role::Files => FILES,
            Role::Balloon => BALLOON,
            Role::Discard => DISCARD,
            Role::Block => BLOCK,
            Role::Net => NET,
            Role::Vsock => VSOCK,
            Role::Entropy => ENTROPY,
            Role::Mem => MEM,
        }
    }

    /// The roles of the threads this role spawns after installing its
    /// filter: they run under it, so it must allow what they call. A role
    /// with children also allows [`SPAWN`].
    pub(crate) fn children(self) -> &'static [Role] {
        match self {
            Role::Api => &[Role::ApiConnection],
            Role::Start => &[
                Role::Vcpu,
                Role::Progress,
                Role::Console,
                Role::Balloon,
                Role::Discard,
                Role::Block,
                Role::Net,
                Role::Vsock,
                Role::Entropy,
                Role::Mem,
            ],
            Role::Reclaim => &[Role::Progress],
            _ => &[],
        }
    }

    /// Whether threads of this role start other threads (after their filter).
    pub(crate) fn spawns(self) -> bool {
        !self.children().is_empty()
    }

    /// Every call this role's filter allows: [`BASE`], its own list, and if
    /// it spawns, [`SPAWN`] and its children's lists.
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
