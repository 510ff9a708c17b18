//! The network device's counters (the metrics' `net` group, one per
//! interface): atomics bumped by the device's thread and read by anyone, as
//! running totals. Firecracker's names; `rx_dropped_frames` is teravm's.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

macro_rules! net_metrics {
    ($($(#[$doc:meta])* $name:ident,)*) => {
        /// Counters of one network interface.
        #[derive(Debug, Default)]
        pub struct NetMetrics {
            $($(#[$doc])* pub $name: AtomicU64,)*
        }

        /// A copy of the counters, for the metrics line and the API.
        #[derive(Debug, Default, Clone, PartialEq, Eq, Serialize)]
        pub struct NetMetricsSnapshot {
            $($(#[$doc])* pub $name: u64,)*
        }

        impl NetMetrics {
            /// The counters now.
            pub fn snapshot(&self) -> NetMetricsSnapshot {
                NetMetricsSnapshot {
                    $($name: self.$name.load(Ordering::Relaxed),)*
                }
            }
        }
    };
}

net_metrics! {
    /// Activations refused, and offloads the tap refused at activation.
    activate_fails,
    /// Guest writes to the (read-only) configuration space.
    cfg_fails,
    /// Queue events that failed (a used ring write, an interrupt, a wake).
    event_fails,
    /// Receive chains refused (read-only, outside RAM, shorter than the
    /// header) and tap read errors.
    rx_fails,
    /// Receive queue notifications.
    rx_queue_event_count,
    /// Tap readable events.
    rx_tap_event_count,
    /// Frame bytes (without the virtio-net header) given to the guest.
    rx_bytes_count,
    /// Frames given to the guest.
    rx_packets_count,
    /// Times a frame waited for the guest to post receive buffers.
    no_rx_avail_buffer,
    /// Tap reads that failed (other than nothing to read).
    tap_read_fails,
    /// Frames read from the tap and dropped: too big for the guest's
    /// buffers, offloads the guest did not ack, runts, or a reset.
    rx_dropped_frames,
    /// Transmit chains the device refused (too short for the header, too
    /// long, write-only or outside guest RAM); returned unsent.
    tx_malformed_frames,
    /// Transmit chains not sent: malformed, or the tap refused them.
    tx_fails,
    /// Transmit queue notifications.
    tx_queue_event_count,
    /// Frame bytes (without the virtio-net header) sent to the tap.
    tx_bytes_count,
    /// Frames sent to the tap.
    tx_packets_count,
    /// Transmit passes that found no chain.
    no_tx_avail_buffer,
    /// Tap writes that failed.
    tap_write_fails,
}

impl NetMetrics {
    /// Adds `n` to a counter.
    pub(crate) fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }
}
