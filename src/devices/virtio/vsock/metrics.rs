//! The vsock's counters (the metrics' `vsock` group): counters bumped by the
//! device's thread and read by anyone, as running totals. Firecracker's
//! names where it has the counter (its `killq_resync` has no counterpart:
//! teravm has no kill queue), teravm's own after them.

use serde::Serialize;

use crate::devices::virtio::Counter;

/// Counters of one vsock device.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize)]
pub struct VsockMetrics {
    /// Activations refused.
    pub activate_fails: Counter,
    /// Configuration space writes refused (all of it is read-only).
    pub cfg_fails: Counter,
    /// RX passes that failed (a used ring write, the interrupt).
    pub rx_queue_event_fails: Counter,
    /// TX passes that failed.
    pub tx_queue_event_fails: Counter,
    /// Event queue notifications that failed.
    pub ev_queue_event_fails: Counter,
    /// Muxer epoll waits that failed, or events for unknown tokens.
    pub muxer_event_fails: Counter,
    /// Host stream events that failed (accept, the `CONNECT` line).
    pub conn_event_fails: Counter,
    /// RX queue notifications.
    pub rx_queue_event_count: Counter,
    /// TX queue notifications.
    pub tx_queue_event_count: Counter,
    /// Payload bytes given to the guest.
    pub rx_bytes_count: Counter,
    /// Payload bytes taken from the guest.
    pub tx_bytes_count: Counter,
    /// Packets given to the guest.
    pub rx_packets_count: Counter,
    /// Packets taken from the guest.
    pub tx_packets_count: Counter,
    /// Connections made (either side).
    pub conns_added: Counter,
    /// Connections torn down with a reset.
    pub conns_killed: Counter,
    /// Connections forgotten.
    pub conns_removed: Counter,
    /// Flushes of buffered guest data to the host that failed.
    pub tx_flush_fails: Counter,
    /// Writes to the host that failed.
    pub tx_write_fails: Counter,
    /// Reads from the host that failed.
    pub rx_read_fails: Counter,
    /// Guest packets dropped: a bad header (CIDs, length), a chain outside
    /// guest memory or too short.
    pub tx_packets_dropped: Counter,
    /// RX chains returned unused: no writable room for a header, or outside
    /// guest memory.
    pub rx_chains_dropped: Counter,
    /// Guest packets past the credit given (the connection is reset).
    pub credit_violations: Counter,
    /// Connections refused: the limit, a port nobody listens on, a bad
    /// `CONNECT` line or its deadline.
    pub conns_refused: Counter,
}

impl VsockMetrics {
    /// The counters now (a copy).
    pub fn snapshot(&self) -> VsockMetrics {
        self.clone()
    }
}
