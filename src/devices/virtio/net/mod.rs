//! virtio-net (virtio 1.x, 5.1) over a host tap, as Firecracker 1.x offers
//! it: one receive and one transmit queue, the guest's MAC in the
//! configuration space, checksum and segmentation offloads passed through
//! the tap's virtio-net header, mergeable receive buffers. No control
//! queue, no multiqueue; Firecracker's receive and transmit rate limiters
//! ([`device::limits`]).
//!
//! What it owns, and how its threads talk:
//! - [`open_tap`] opens a tap by name (or a macvtap node by path) (`IFF_TAP | IFF_NO_PI |
//!   IFF_VNET_HDR`, a 12-byte header, no offloads yet). It is separate from
//!   the device so that the VMM opens it where it opens files, and a
//!   missing tap is an error naming it before any device exists.
//! - [`Net`] ([`device`]): features, the configuration space (the MAC),
//!   activation and reset; the transport calls it from vCPU threads.
//!   Activation only records the queues and wakes the device's thread.
//! - All tap I/O and queue work ([`queues`]) runs on the device's own
//!   thread (the shared loop of
//!   [`crate::devices::virtio::worker`] with the device as its handler):
//!   it polls the tap (edge triggered), the queue eventfds and the device's
//!   wake eventfd, and locks the device for one bounded pass per event. It applies the tap's
//!   offloads (`TUNSETOFFLOAD`) from the acked features before it reads a
//!   frame for a new activation.
//! - The tap side is a [`NetBackend`], so tests and the fuzz target drive
//!   the device with a recording backend.
//! - Counters: [`metrics::NetMetrics`] (Firecracker's `net` group names).

pub mod device;
#[cfg(test)]
mod limits_tests;
pub mod macvtap;
pub mod metrics;
pub mod mmds;
pub mod persist;
#[cfg(test)]
mod persist_tests;
pub mod queues;
pub mod tap;
#[cfg(test)]
mod tap_tests;
#[cfg(test)]
mod test_backend;
#[cfg(test)]
mod tests;

pub use device::{Net, NetOptions};
pub use metrics::NetMetrics;
pub use persist::NetState;
pub use tap::{NetBackend, Tap};

/// Opens a network interface's host side: a tap by name
/// ([`tap::open_named`]), or a macvtap or ipvtap node by absolute path
/// ([`macvtap::open_macvtap`]), as `host_dev_name` says.
pub fn open_tap(host_dev_name: &str) -> Result<Tap, NetError> {
    if host_dev_name.starts_with('/') {
        macvtap::open_macvtap(host_dev_name)
    } else {
        tap::open_named(host_dev_name)
    }
}

/// The virtio device ID of a network card.
pub const VIRTIO_ID_NET: u32 = virtio_bindings::virtio_ids::VIRTIO_ID_NET;

/// Feature bits (virtio 5.1.3) teravm offers or refers to.
pub mod features {
    use virtio_bindings::virtio_net as n;
    /// The device takes frames with a partial checksum (guest → host).
    pub const CSUM: u64 = 1 << n::VIRTIO_NET_F_CSUM;
    /// The driver takes frames with a partial checksum (host → guest).
    pub const GUEST_CSUM: u64 = 1 << n::VIRTIO_NET_F_GUEST_CSUM;
    /// The configuration space holds the MAC.
    pub const MAC: u64 = 1 << n::VIRTIO_NET_F_MAC;
    /// The driver takes TCPv4 segmentation offload frames.
    pub const GUEST_TSO4: u64 = 1 << n::VIRTIO_NET_F_GUEST_TSO4;
    /// The driver takes TCPv6 segmentation offload frames.
    pub const GUEST_TSO6: u64 = 1 << n::VIRTIO_NET_F_GUEST_TSO6;
    /// The driver takes UDP fragmentation offload frames.
    pub const GUEST_UFO: u64 = 1 << n::VIRTIO_NET_F_GUEST_UFO;
    /// The device takes TCPv4 segmentation offload frames.
    pub const HOST_TSO4: u64 = 1 << n::VIRTIO_NET_F_HOST_TSO4;
    /// The device takes TCPv6 segmentation offload frames.
    pub const HOST_TSO6: u64 = 1 << n::VIRTIO_NET_F_HOST_TSO6;
    /// The device takes UDP fragmentation offload frames.
    pub const HOST_UFO: u64 = 1 << n::VIRTIO_NET_F_HOST_UFO;
    /// A received frame may span several receive chains.
    pub const MRG_RXBUF: u64 = 1 << n::VIRTIO_NET_F_MRG_RXBUF;
    /// What teravm offers besides `VERSION_1` and `MAC` (Firecracker 1.x's
    /// offloads and mergeable receive buffers; its `EVENT_IDX` is not
    /// offered: the queues here always interrupt, which is correct without
    /// it).
    pub const OFFERED: u64 = CSUM
        | GUEST_CSUM
        | GUEST_TSO4
        | GUEST_TSO6
        | GUEST_UFO
        | HOST_TSO4
        | HOST_TSO6
        | HOST_UFO
        | MRG_RXBUF;
}

/// The receive queue's index.
pub const RX_INDEX: usize = 0;
/// The transmit queue's index.
pub const TX_INDEX: usize = 1;
/// Each queue's size (Firecracker's).
pub const QUEUE_SIZE: u16 = 256;
/// Bytes of the virtio-net header on every frame (`virtio_net_hdr_v1`),
/// also the tap's `TUNSETVNETHDRSZ`.
pub const VNET_HDR_BYTES: usize = 12;
/// Most bytes of one frame with its header, either way (Firecracker's
/// `MAX_BUFFER_SIZE`: a 64 KiB segmentation offload frame, its Ethernet
/// header and the virtio-net header). Longer transmit chains are refused;
/// the tap never reads longer frames.
pub const MAX_BUFFER_BYTES: usize = 65562;
/// Bytes of the configuration space (`mac`, `status`,
/// `max_virtqueue_pairs`, `mtu`; only `mac` is offered).
pub const CONFIG_SPACE_BYTES: usize = 12;
/// Most transmit chains taken in one pass, and most frames received in one
/// pass; what is left waits for the next pass (the device wakes its own
/// thread), so one event is bounded work.
pub const MAX_FRAMES_PER_PASS: usize = 64;

/// Errors of the network device and its tap.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    /// A tap name the kernel cannot take.
    #[error("invalid tap name {0:?}: it must be 1 to 15 bytes without NUL, '/' or whitespace")]
    TapName(String),
    /// No network interface of that name (in the VMM's network namespace).
    #[error(
        "the tap device {0:?} does not exist; create it first (ip tuntap add dev {0} mode tap)"
    )]
    TapMissing(String),
    /// A `host_dev_name` path that is not a macvtap or ipvtap device node,
    /// or one that could not be opened.
    #[error("host device {path:?} {why}")]
    Macvtap {
        /// The path asked for.
        path: String,
        /// What it is not, or why it could not be opened.
        why: String,
    },
    /// `/dev/net/tun` could not be opened.
    #[error("cannot open /dev/net/tun for tap {name:?}: {source}")]
    TunOpen {
        /// The tap asked for.
        name: String,
        /// Why.
        source: std::io::Error,
    },
    /// The interface exists but could not be attached as a tap.
    #[error(
        "cannot attach tap {name:?}: {source} (is it a tap, not in use by another \
         process, not multiqueue?)"
    )]
    TapAttach {
        /// The tap asked for.
        name: String,
        /// Why.
        source: std::io::Error,
    },
    /// A tap ioctl failed.
    #[error("tap {name:?}: {what} failed: {source}")]
    TapIoctl {
        /// The tap.
        name: String,
        /// Which ioctl.
        what: &'static str,
        /// Why.
        source: std::io::Error,
    },
    /// An eventfd could not be made.
    #[error("cannot create the network device's eventfd: {0}")]
    EventFd(std::io::Error),
    /// A rate limiter could not be made or changed.
    #[error("network device rate limiter: {0}")]
    RateLimiter(#[from] crate::rate_limiter::RateLimiterError),
    /// A snapshot's state that does not fit the interface as configured.
    #[error("the saved network interface state does not fit: {0}")]
    BadState(String),
}
