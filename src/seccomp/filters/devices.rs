//! The own lists of the device threads: each virtio device's worker and
//! the discard pool's per-node workers (which free what the balloon and
//! virtio-mem give back).

use super::shared::PUNCH_HOLE;
use super::{any, kvm, one_of, Allow};

/// `balloon`: the virtio-balloon's queue work (its epoll was built by the
/// `start` job): waits for queue notifications, its wake eventfd and the
/// statistics deadline, reads guest memory through its view (no call),
/// acknowledges by eventfd (`write`, BASE), and hands ranges to the discard
/// pool, which frees small batches inline on this thread.
pub(super) const BALLOON: &[Allow] = &[
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
pub(super) const DISCARD: &[Allow] = &[
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
pub(super) const BLOCK: &[Allow] = &[
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
pub(super) const NET: &[Allow] = &[
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
pub(super) const ENTROPY: &[Allow] = &[
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
/// and its sink (src/vmm/sinks/hotplug_slots.rs): a PLUG's memslots enter KVM
/// here, an
/// UNPLUG's leave it, and the unplugged blocks go to the discard pool,
/// which frees small batches inline on this thread (`madvise(MADV_DONTNEED)`
/// is in BASE; a hole punch for memfd and guest_memfd).
pub(super) const MEM: &[Allow] = &[
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
pub(super) const VSOCK: &[Allow] = &[
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
