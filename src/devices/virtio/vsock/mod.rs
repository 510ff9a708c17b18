//! virtio-vsock (virtio 1.x, 5.10) with Firecracker's host side: guest
//! streams are forwarded to Unix sockets.
//!
//! - A host process connects to `uds_path`, writes `CONNECT <port>\n` and
//!   reads `OK <host_port>\n` once the guest accepted (or sees the socket
//!   closed if it refused); from then on the stream is the connection.
//! - A guest connection to host port P is forwarded to a listener at
//!   `<uds_path>_<P>` (refused with a reset if nothing listens there).
//!
//! What it owns, and how its threads talk:
//! - [`Vsock`] ([`device`]): features, the configuration space
//!   (`guest_cid`), the queues while the device runs, and the [`muxer`]:
//!   the host listener, the connections and their Unix streams, all under
//!   one nested epoll fd. The transport calls it from vCPU threads (config
//!   reads, activation, reset: none does I/O); everything else runs on the
//!   device's own thread (the shared loop of
//!   [`crate::devices::virtio::worker`] with the device as its handler),
//!   which polls the queue eventfds, the wake eventfd and the muxer's epoll
//!   fd and locks the device for one bounded pass per event.
//! - Bounds: at most [`MAX_CONNECTIONS`] connections and
//!   [`MAX_HANDSHAKES`] host streams still sending their `CONNECT` line;
//!   each connection buffers at most [`CONN_TX_BUF_BYTES`] of guest data the
//!   host has not read yet (that is the credit the guest is given, so a
//!   guest that sends past it is reset); host data is read only when the
//!   guest has credit and an RX buffer for it, so a slow guest slows the
//!   host writer (its socket fills), never teravm's memory.
//! - Counters: [`metrics::VsockMetrics`] (Firecracker's `vsock` group).

pub mod connection;
pub mod device;
pub mod metrics;
pub mod muxer;
pub mod packet;
pub mod persist;
#[cfg(test)]
mod tests;
pub mod uds;

pub use device::{Vsock, VsockOptions};
pub use metrics::VsockMetrics;
pub use packet::{VsockHeader, HEADER_BYTES};
pub use persist::VsockState;
pub use uds::bind_uds;

/// The virtio device ID of a socket device.
pub const VIRTIO_ID_VSOCK: u32 = 19;
/// The host's CID (every packet from the guest must be addressed to it).
pub const HOST_CID: u64 = 2;
/// The lowest CID a guest may have (1 and 2 are reserved; 0 is taken as
/// Firecracker takes it, see `Vsock::new`).
pub const MIN_GUEST_CID: u64 = 3;
/// Queue indices (virtio 5.10.2).
pub const RXQ: usize = 0;
/// The TX queue.
pub const TXQ: usize = 1;
/// The event queue (teravm sends one event: the transport reset after a
/// snapshot is restored, [`Vsock::restore_state`]).
pub const EVQ: usize = 2;
/// Each queue's size (Firecracker's).
pub const QUEUE_SIZE: u16 = 256;
/// Bytes of the configuration space (`guest_cid`, le64).
pub const CONFIG_SPACE_BYTES: usize = 8;

/// Most connections at once (Firecracker's `MAX_CONNECTIONS`); past it, a
/// guest request is reset and a host connection closed.
pub const MAX_CONNECTIONS: usize = 1023;
/// Most accepted host streams still sending their `CONNECT` line.
pub const MAX_HANDSHAKES: usize = 64;
/// Longest `CONNECT <port>\n` line read (Firecracker reads 32 bytes).
pub const MAX_CONNECT_LINE: usize = 32;
/// Guest data buffered per connection that the host has not read yet; the
/// buffer allocation advertised to the guest (Firecracker's
/// `CONN_TX_BUF_SIZE`).
pub const CONN_TX_BUF_BYTES: u32 = 64 * 1024;
/// Once the guest may think it has used this much of the buffer, the device
/// tells it what was freed (Firecracker's `CONN_CREDIT_UPDATE_THRESHOLD`).
pub const CREDIT_UPDATE_THRESHOLD: u32 = CONN_TX_BUF_BYTES - 16 * 1024;
/// Largest payload of one packet either way (Firecracker's
/// `MAX_PKT_BUF_SIZE`); a longer guest packet is dropped.
pub const MAX_PKT_PAYLOAD: u32 = 64 * 1024;
/// How long a host stream may take to send its `CONNECT` line, and the guest
/// to answer a request (the host stream is closed after).
pub const CONNECT_TIMEOUT_MS: u64 = 2000;
/// How long a closing connection waits for the guest's reset (Firecracker's
/// `CONN_SHUTDOWN_TIMEOUT_MS`), then it is reset.
pub const SHUTDOWN_TIMEOUT_MS: u64 = 2000;
/// Resets of unknown connections waiting for an RX buffer; while full the TX
/// queue waits (a flood of stray packets is slowed, never buffered).
pub const MAX_PENDING_RESETS: usize = 256;
/// Most chains taken from a queue in one pass; the rest waits for the next
/// pass (the device wakes its own thread).
pub const MAX_CHAINS_PER_PASS: usize = 256;
/// Most host connections accepted in one pass.
pub const MAX_ACCEPTS_PER_PASS: usize = 32;
/// Host-side ports given to host-initiated connections: `[1 << 30, 1 << 31)`,
/// round robin (Firecracker's range).
pub const LOCAL_PORT_FIRST: u32 = 1 << 30;

/// Errors of the vsock device.
#[derive(Debug, thiserror::Error)]
pub enum VsockError {
    /// A CID of 1 or 2.
    #[error("guest_cid {0} is reserved: it must be 0 or 3 or more")]
    ReservedCid(u64),
    /// A CID above `u32::MAX` (Linux's `AF_VSOCK` addresses are 32 bits).
    #[error("guest_cid {0} does not fit in 32 bits")]
    CidTooLarge(u64),
    /// `uds_path` empty or too long for a Unix socket address with a port.
    #[error("uds_path {0:?} is not usable: {1}")]
    BadPath(std::path::PathBuf, &'static str),
    /// `uds_path` exists (a stale socket too: remove it first, as with
    /// Firecracker).
    #[error("uds_path {0:?} exists (refused, never replaced: remove a stale socket first)")]
    PathExists(std::path::PathBuf),
    /// The listening socket was already given to a device (a start that
    /// failed after taking it).
    #[error("the vsock's socket was already used by an earlier start: put the vsock again")]
    NoListener,
    /// Creating, binding or listening on the socket failed.
    #[error("cannot create the vsock socket {0:?}: {1}")]
    Bind(std::path::PathBuf, std::io::Error),
    /// An eventfd or the epoll fd could not be made.
    #[error("cannot create the vsock's eventfd or epoll fd: {0}")]
    EventFd(std::io::Error),
    /// A snapshot's state that does not fit the vsock as configured.
    #[error("the saved vsock state does not fit: {0}")]
    BadState(String),
}
