//! The own lists of teravm's threads that are not a device's: the main
//! thread's event loop, the API, the vCPUs, the output threads, the
//! `files` thread and the `start` and `reclaim` job runners.

use super::shared::{
    mmap_no_exec, O_RDONLY_CLOEXEC, PAGEMAP_SCAN, SYS_CACHESTAT, UFFDIO_API, UFFDIO_REGISTER,
    UFFDIO_UNREGISTER, USERFAULTFD_IOC_NEW,
};
use super::{any, kvm, one_of, Allow, Only};

/// `vcpu{n}`: the `KVM_RUN` loop and the port I/O devices. Console bytes go
/// to a bounded buffer and log lines to the output queue (futex, in BASE);
/// parking waits on a futex; the kick is a signal whose handler only sets
/// `immediate_exit`; the vCPU fd and its `kvm_run` mapping are closed and
/// unmapped here at the end (BASE).
pub(super) const VCPU: &[Allow] = &[one_of(
    libc::SYS_ioctl,
    1,
    &[
        named!(kvm::RUN),
        named!(kvm::GET_REGS),
        named!(kvm::GET_MP_STATE),
        named!(kvm::GET_SREGS),
        named!(kvm::GET_XSAVE),
        named!(kvm::GET_XCRS),
        named!(kvm::GET_FPU),
        named!(kvm::GET_DEBUGREGS),
        named!(kvm::GET_LAPIC),
        named!(kvm::GET_TSC_KHZ),
        named!(kvm::GET_CPUID2),
        named!(kvm::GET_MSRS),
        named!(kvm::GET_VCPU_EVENTS),
    ],
    "KVM_RUN; KVM_GET_REGS for the guest RIP in a crash line; the rest: the vCPU's state for a snapshot, read on its thread while paused",
)];

/// `api`: accepts connections and starts an `api-conn` thread for each.
pub(super) const API: &[Allow] = &[
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
pub(super) const API_CONNECTION: &[Allow] = &[
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
pub(super) const CONSOLE: &[Allow] = &[];

/// `progress`: renders the populate or reclaim progress line into the
/// output queue every tick and waits on a channel with a timeout (BASE).
pub(super) const PROGRESS: &[Allow] = &[];

/// `output`: drains teravm's own output queue to stderr or the log path
/// (`write`, `futex`: BASE).
pub(super) const OUTPUT: &[Allow] = &[];

/// `files`: opens the paths a user names (src/files.rs), with exactly these
/// flag sets, and checks what it opened.
pub(super) const FILES: &[Allow] = &[
    one_of(
        libc::SYS_openat,
        2,
        &[
            (crate::seccomp::open_flags::READ_IMAGE as u64, "O_RDONLY|O_NONBLOCK|O_CLOEXEC"),
            (
                crate::seccomp::open_flags::OUTPUT_WRITE as u64,
                "O_WRONLY|O_APPEND|O_CREAT|O_NOFOLLOW|O_NONBLOCK|O_CLOEXEC",
            ),
            (
                crate::seccomp::open_flags::OUTPUT_FIFO as u64,
                "O_RDWR|O_APPEND|O_CREAT|O_NOFOLLOW|O_NONBLOCK|O_CLOEXEC",
            ),
            (
                crate::seccomp::open_flags::DRIVE_RW as u64,
                "O_RDWR|O_NONBLOCK|O_CLOEXEC",
            ),
            (
                crate::seccomp::open_flags::SNAPSHOT_NEW as u64,
                "O_WRONLY|O_CREAT|O_EXCL|O_NOFOLLOW|O_CLOEXEC",
            ),
        ],
        "the kernel, initrd and read-only drives read-only; log, metrics and serial files append-only, created 0600, no symlink followed; read-write drives and /dev/userfaultfd, never created; a snapshot's files, made new (0600) under a temporary name, never an existing file or through a symlink",
    ),
    any(
        libc::SYS_rename,
        "a snapshot's files to their names, once the create job wrote and synced them",
    ),
    any(
        libc::SYS_unlink,
        "a snapshot's temporary files after a failed create (and a leftover of one killed)",
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

/// `start` (a job runner thread): the KVM VM (on the `/dev/kvm` descriptor
/// opened at start-up), guest memory (anonymous, memfd or hugetlb mappings;
/// THP advice; NUMA binding), memslots, the kernel and initrd (already
/// open), the vCPUs' fds and registers, the console writer, and the
/// `populate-n{node}-{i}` workers (pinned, `MADV_POPULATE_WRITE`), which run
/// under this filter. A restored guest's memory is built here too: the
/// memory file mapped private (Lazy), a userfaultfd and the connection to
/// its page fault handler (Uffd), or the `memload-n{node}-{i}` workers'
/// reads (Eager).
pub(super) const START: &[Allow] = &[
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
    any(
        libc::SYS_sysinfo,
        "the memory admission's host memory where there is no /proc/meminfo (a jail): freeram, bufferram, totalram",
    ),
    any(
        libc::SYS_pwrite64,
        "a snapshot's memory file, by the `memsave-n{node}-{i}` workers",
    ),
    any(
        libc::SYS_write,
        "a snapshot's state file (made and renamed by the `files` thread)",
    ),
    any(
        libc::SYS_fsync,
        "a snapshot's files, whole before the `files` thread renames them",
    ),
    any(
        libc::SYS_mincore,
        "the resident pages of a snapshot's memory where PAGEMAP_SCAN is missing (and of hugetlb and guest_memfd memory)",
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
            named!(kvm::GET_MSR_INDEX_LIST),
            named!(kvm::SET_MP_STATE),
            named!(kvm::SET_XSAVE),
            named!(kvm::SET_XCRS),
            named!(kvm::SET_DEBUGREGS),
            named!(kvm::SET_VCPU_EVENTS),
            named!(kvm::GET_TSC_KHZ),
            named!(kvm::SET_TSC_KHZ),
            named!(kvm::KVMCLOCK_CTRL),
            named!(kvm::GET_IRQCHIP),
            named!(kvm::SET_IRQCHIP),
            named!(kvm::GET_PIT2),
            named!(kvm::SET_PIT2),
            named!(kvm::GET_CLOCK),
            named!(kvm::SET_CLOCK),
            named!(libc::TCGETS),
            named!(libc::FIONBIO),
            (UFFDIO_API, "UFFDIO_API"),
            (UFFDIO_REGISTER, "UFFDIO_REGISTER"),
            (USERFAULTFD_IOC_NEW, "USERFAULTFD_IOC_NEW"),
            (PAGEMAP_SCAN, "PAGEMAP_SCAN"),
        ],
        "the VM, its memslots (guest_memfd ones too) and guest_memfds, irqchip and PIT (the `pit` thread it spawns turns the PIT's reinjection off), the devices' irqfds and ioeventfds, the vCPUs' setup; a snapshot's: the host's MSR list, the vCPUs' state restored, the VM's irqchip, PIT and clock saved and restored; TCGETS: is stderr a terminal (progress line); FIONBIO: the vsock's listener; USERFAULTFD_IOC_NEW: a restored guest's userfaultfd from /dev/userfaultfd (opened by the `files` thread; a jail's); UFFDIO_API, UFFDIO_REGISTER: that userfaultfd (Firecracker's features) and its slices registered for missing pages; PAGEMAP_SCAN: the guest's own pages, for a snapshot's memory file",
    ),
    one_of(
        libc::SYS_userfaultfd,
        0,
        &[(
            (libc::O_CLOEXEC | libc::O_NONBLOCK) as u64,
            "O_CLOEXEC|O_NONBLOCK",
        )],
        "a guest restored with the Uffd memory backend: its page fault handler's userfaultfd",
    ),
    one_of(
        libc::SYS_socket,
        0,
        &[named!(libc::AF_UNIX)],
        "the connection to a restored guest's page fault handler (the Uffd backend_path)",
    ),
    one_of(
        libc::SYS_setsockopt,
        2,
        &[named!(libc::SO_SNDTIMEO)],
        "that connection's connect and sendmsg wait at most 10 s",
    ),
    any(libc::SYS_connect, "that connection"),
    any(
        libc::SYS_sendmsg,
        "the handler's message: the regions' JSON and the userfaultfd (SCM_RIGHTS)",
    ),
    any(
        libc::SYS_pread64,
        "the eager load of a snapshot's memory file (memory_load Eager), by the `memload-n{node}-{i}` workers",
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
pub(super) const RECLAIM: &[Allow] = &[
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
            (UFFDIO_UNREGISTER, "UFFDIO_UNREGISTER"),
        ],
        "is stderr a terminal (progress line); the guest's own pages of each anonymous chunk (/proc/self/pagemap, opened at the start); a restored guest's slices leave its userfaultfd before they are freed (a MADV_DONTNEED of a registered range waits for the handler)",
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
pub(super) const VMM: &[Allow] = &[
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
