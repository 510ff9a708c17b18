//! The balloon's counters (the metrics' `balloon` group): atomics bumped by
//! the balloon's thread and read by anyone, as running totals.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

/// Counters of one balloon. Firecracker's names where it has the counter,
/// teravm's own (bytes and ranges discarded, refused) beside them.
#[derive(Debug, Default)]
pub struct BalloonMetrics {
    /// Activations refused.
    pub activate_fails: AtomicU64,
    /// Inflate chains handled.
    pub inflate_count: AtomicU64,
    /// Deflate chains handled.
    pub deflate_count: AtomicU64,
    /// Statistics buffers received.
    pub stats_updates_count: AtomicU64,
    /// Statistics buffers refused.
    pub stats_update_fails: AtomicU64,
    /// Free page report chains handled.
    pub free_page_report_count: AtomicU64,
    /// Free page report chains refused in whole or part.
    pub free_page_report_fails: AtomicU64,
    /// Queue events that failed (a chain unreadable, a used ring write).
    pub event_fails: AtomicU64,
    /// 4 KiB pages inflated (as the guest listed them).
    pub inflated_pages: AtomicU64,
    /// 4 KiB pages deflated.
    pub deflated_pages: AtomicU64,
    /// Bytes the sink freed.
    pub discarded_bytes: AtomicU64,
    /// Ranges the sink freed.
    pub discarded_ranges: AtomicU64,
    /// Batches the sink could not free.
    pub discard_fails: AtomicU64,
    /// Ranges refused in whole or in part (outside RAM, partial pages).
    pub refused_ranges: AtomicU64,
    /// Bytes refused.
    pub refused_bytes: AtomicU64,
}

/// A copy of the counters, for the metrics line and the API.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize)]
pub struct BalloonMetricsSnapshot {
    /// See [`BalloonMetrics::activate_fails`].
    pub activate_fails: u64,
    /// See [`BalloonMetrics::inflate_count`].
    pub inflate_count: u64,
    /// See [`BalloonMetrics::deflate_count`].
    pub deflate_count: u64,
    /// See [`BalloonMetrics::stats_updates_count`].
    pub stats_updates_count: u64,
    /// See [`BalloonMetrics::stats_update_fails`].
    pub stats_update_fails: u64,
    /// See [`BalloonMetrics::free_page_report_count`].
    pub free_page_report_count: u64,
    /// See [`BalloonMetrics::free_page_report_fails`].
    pub free_page_report_fails: u64,
    /// See [`BalloonMetrics::event_fails`].
    pub event_fails: u64,
    /// See [`BalloonMetrics::inflated_pages`].
    pub inflated_pages: u64,
    /// See [`BalloonMetrics::deflated_pages`].
    pub deflated_pages: u64,
    /// See [`BalloonMetrics::discarded_bytes`].
    pub discarded_bytes: u64,
    /// See [`BalloonMetrics::discarded_ranges`].
    pub discarded_ranges: u64,
    /// See [`BalloonMetrics::discard_fails`].
    pub discard_fails: u64,
    /// See [`BalloonMetrics::refused_ranges`].
    pub refused_ranges: u64,
    /// See [`BalloonMetrics::refused_bytes`].
    pub refused_bytes: u64,
}

impl BalloonMetrics {
    /// Adds `n` to a counter.
    pub(crate) fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }

    /// The counters now.
    pub fn snapshot(&self) -> BalloonMetricsSnapshot {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        BalloonMetricsSnapshot {
            activate_fails: g(&self.activate_fails),
            inflate_count: g(&self.inflate_count),
            deflate_count: g(&self.deflate_count),
            stats_updates_count: g(&self.stats_updates_count),
            stats_update_fails: g(&self.stats_update_fails),
            free_page_report_count: g(&self.free_page_report_count),
            free_page_report_fails: g(&self.free_page_report_fails),
            event_fails: g(&self.event_fails),
            inflated_pages: g(&self.inflated_pages),
            deflated_pages: g(&self.deflated_pages),
            discarded_bytes: g(&self.discarded_bytes),
            discarded_ranges: g(&self.discarded_ranges),
            discard_fails: g(&self.discard_fails),
            refused_ranges: g(&self.refused_ranges),
            refused_bytes: g(&self.refused_bytes),
        }
    }
}
