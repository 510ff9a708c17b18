//! The balloon's counters (the metrics' `balloon` group): counters bumped by
//! the balloon's thread and read by anyone, as running totals.

use serde::Serialize;

use crate::devices::virtio::Counter;

/// Counters of one balloon. Firecracker's names where it has the counter,
/// teravm's own (bytes and ranges discarded, refused) beside them.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize)]
pub struct BalloonMetrics {
    /// Activations refused.
    pub activate_fails: Counter,
    /// Inflate chains handled.
    pub inflate_count: Counter,
    /// Deflate chains handled.
    pub deflate_count: Counter,
    /// Statistics buffers received.
    pub stats_updates_count: Counter,
    /// Statistics buffers refused.
    pub stats_update_fails: Counter,
    /// Free page report chains handled.
    pub free_page_report_count: Counter,
    /// Free page report chains refused in whole or part.
    pub free_page_report_fails: Counter,
    /// Queue events that failed (a chain unreadable, a used ring write).
    pub event_fails: Counter,
    /// 4 KiB pages inflated (as the guest listed them).
    pub inflated_pages: Counter,
    /// 4 KiB pages deflated.
    pub deflated_pages: Counter,
    /// Bytes the sink freed.
    pub discarded_bytes: Counter,
    /// Ranges the sink freed.
    pub discarded_ranges: Counter,
    /// Batches the sink could not free.
    pub discard_fails: Counter,
    /// Ranges refused in whole or in part (outside RAM, partial pages).
    pub refused_ranges: Counter,
    /// Bytes refused.
    pub refused_bytes: Counter,
}

impl BalloonMetrics {
    /// The counters now (a copy).
    pub fn snapshot(&self) -> BalloonMetrics {
        self.clone()
    }
}
