//! The vsock's counters (the metrics' `vsock` group): atomics bumped by the
//! device's thread and read by anyone, as running totals. Firecracker's
//! names where it has the counter (its `killq_resync` has no counterpart:
//! teravm has no kill queue), teravm's own after them.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

macro_rules! vsock_metrics {
    ($($(#[doc = $doc:literal])* $name:ident,)*) => {
        /// Counters of one vsock device.
        #[derive(Debug, Default)]
        pub struct VsockMetrics {
            $($(#[doc = $doc])* pub $name: AtomicU64,)*
        }

        /// A copy of the counters, for the metrics line and the API.
        #[derive(Debug, Default, Clone, PartialEq, Eq, Serialize)]
        pub struct VsockMetricsSnapshot {
            $($(#[doc = $doc])* pub $name: u64,)*
        }

        impl VsockMetrics {
            /// The counters now.
            pub fn snapshot(&self) -> VsockMetricsSnapshot {
                VsockMetricsSnapshot {
                    $($name: self.$name.load(Ordering::Relaxed),)*
                }
            }
        }
    };
}

vsock_metrics! {
    /// Activations refused.
    activate_fails,
    /// Configuration space writes refused (all of it is read-only).
    cfg_fails,
    /// RX passes that failed (a used ring write, the interrupt).
    rx_queue_event_fails,
    /// TX passes that failed.
    tx_queue_event_fails,
    /// Event queue notifications that failed.
    ev_queue_event_fails,
    /// Muxer epoll waits that failed, or events for unknown tokens.
    muxer_event_fails,
    /// Host stream events that failed (accept, the `CONNECT` line).
    conn_event_fails,
    /// RX queue notifications.
    rx_queue_event_count,
    /// TX queue notifications.
    tx_queue_event_count,
    /// Payload bytes given to the guest.
    rx_bytes_count,
    /// Payload bytes taken from the guest.
    tx_bytes_count,
    /// Packets given to the guest.
    rx_packets_count,
    /// Packets taken from the guest.
    tx_packets_count,
    /// Connections made (either side).
    conns_added,
    /// Connections torn down with a reset.
    conns_killed,
    /// Connections forgotten.
    conns_removed,
    /// Flushes of buffered guest data to the host that failed.
    tx_flush_fails,
    /// Writes to the host that failed.
    tx_write_fails,
    /// Reads from the host that failed.
    rx_read_fails,
    /// Guest packets dropped: a bad header (CIDs, length), a chain outside
    /// guest memory or too short.
    tx_packets_dropped,
    /// RX chains returned unused: no writable room for a header, or outside
    /// guest memory.
    rx_chains_dropped,
    /// Guest packets past the credit given (the connection is reset).
    credit_violations,
    /// Connections refused: the limit, a port nobody listens on, a bad
    /// `CONNECT` line or its deadline.
    conns_refused,
}

impl VsockMetrics {
    /// Adds `n` to a counter.
    pub(crate) fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }
}
