//! The network device's counters (the metrics' `net` group, one per
//! interface): counters bumped by the device's thread and read by anyone, as
//! running totals. Firecracker's names; `rx_dropped_frames` is teravm's.

use serde::Serialize;

use crate::devices::virtio::Counter;

/// Counters of one network interface.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize)]
pub struct NetMetrics {
    /// Activations refused, and offloads the tap refused at activation.
    pub activate_fails: Counter,
    /// Guest writes to the (read-only) configuration space.
    pub cfg_fails: Counter,
    /// Queue events that failed (a used ring write, an interrupt, a wake).
    pub event_fails: Counter,
    /// Receive chains refused (read-only, outside RAM, shorter than the
    /// header) and tap read errors.
    pub rx_fails: Counter,
    /// Receive queue notifications.
    pub rx_queue_event_count: Counter,
    /// Tap readable events.
    pub rx_tap_event_count: Counter,
    /// Frame bytes (without the virtio-net header) given to the guest.
    pub rx_bytes_count: Counter,
    /// Frames given to the guest.
    pub rx_packets_count: Counter,
    /// Times a frame waited for the guest to post receive buffers.
    pub no_rx_avail_buffer: Counter,
    /// Tap reads that failed (other than nothing to read).
    pub tap_read_fails: Counter,
    /// Frames read from the tap and dropped: too big for the guest's
    /// buffers, offloads the guest did not ack, runts, or a reset.
    pub rx_dropped_frames: Counter,
    /// Transmit chains the device refused (too short for the header, too
    /// long, write-only or outside guest RAM); returned unsent.
    pub tx_malformed_frames: Counter,
    /// Transmit chains not sent: malformed, or the tap refused them.
    pub tx_fails: Counter,
    /// Transmit queue notifications.
    pub tx_queue_event_count: Counter,
    /// Frame bytes (without the virtio-net header) sent to the tap.
    pub tx_bytes_count: Counter,
    /// Frames sent to the tap.
    pub tx_packets_count: Counter,
    /// Transmit passes that found no chain.
    pub no_tx_avail_buffer: Counter,
    /// Tap writes that failed.
    pub tap_write_fails: Counter,
    /// Receive rate limiter timer fires.
    pub rx_event_rate_limiter_count: Counter,
    /// Received frames held by the receive limiter, and receive events
    /// while it blocked.
    pub rx_rate_limiter_throttled: Counter,
    /// Transmit rate limiter timer fires.
    pub tx_rate_limiter_event_count: Counter,
    /// Transmit chains held by the transmit limiter, and transmit passes
    /// while it blocked.
    pub tx_rate_limiter_throttled: Counter,
}

impl NetMetrics {
    /// The counters now (a copy).
    pub fn snapshot(&self) -> NetMetrics {
        self.clone()
    }
}
