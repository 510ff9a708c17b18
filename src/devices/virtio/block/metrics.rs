//! The block device's counters (the metrics' `block` group, Firecracker's
//! names where it has the counter): atomics bumped by the device thread
//! (and the transport, for activation and configuration), read by anyone,
//! as running totals.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

/// Counters of one block device.
#[derive(Debug, Default)]
pub struct BlockMetrics {
    /// Activations refused.
    pub activate_fails: AtomicU64,
    /// Configuration space writes (it is read-only) and reads past its end.
    pub cfg_fails: AtomicU64,
    /// Queue events that found no chain.
    pub no_avail_buffer: AtomicU64,
    /// Eventfd, interrupt or used ring failures.
    pub event_fails: AtomicU64,
    /// Requests whose host I/O failed (answered IOERR).
    pub execute_fails: AtomicU64,
    /// Malformed requests: answered IOERR or UNSUPP, or dropped.
    pub invalid_reqs_count: AtomicU64,
    /// Chains returned without a status (no usable status descriptor, a cut or overlong chain); teravm's own.
    pub dropped_reqs_count: AtomicU64,
    /// Requests whose device was reset while they were in host I/O (nothing written back); teravm's own.
    pub abandoned_reqs_count: AtomicU64,
    /// FLUSH requests answered OK.
    pub flush_count: AtomicU64,
    /// Queue notifications handled.
    pub queue_event_count: AtomicU64,
    /// Backing files swapped in (`PATCH /drives`).
    pub update_count: AtomicU64,
    /// Backing files refused at the swap (size unreadable; the old file stays).
    pub update_fails: AtomicU64,
    /// Bytes read from the file into the guest.
    pub read_bytes: AtomicU64,
    /// Bytes written from the guest to the file.
    pub write_bytes: AtomicU64,
    /// IN requests answered OK.
    pub read_count: AtomicU64,
    /// OUT requests answered OK.
    pub write_count: AtomicU64,
    /// GET_ID requests answered OK; teravm's own.
    pub get_id_count: AtomicU64,
}

/// A copy of the counters, for the metrics line and the API.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize)]
pub struct BlockMetricsSnapshot {
    /// See [`BlockMetrics::activate_fails`].
    pub activate_fails: u64,
    /// See [`BlockMetrics::cfg_fails`].
    pub cfg_fails: u64,
    /// See [`BlockMetrics::no_avail_buffer`].
    pub no_avail_buffer: u64,
    /// See [`BlockMetrics::event_fails`].
    pub event_fails: u64,
    /// See [`BlockMetrics::execute_fails`].
    pub execute_fails: u64,
    /// See [`BlockMetrics::invalid_reqs_count`].
    pub invalid_reqs_count: u64,
    /// See [`BlockMetrics::dropped_reqs_count`].
    pub dropped_reqs_count: u64,
    /// See [`BlockMetrics::abandoned_reqs_count`].
    pub abandoned_reqs_count: u64,
    /// See [`BlockMetrics::flush_count`].
    pub flush_count: u64,
    /// See [`BlockMetrics::queue_event_count`].
    pub queue_event_count: u64,
    /// See [`BlockMetrics::update_count`].
    pub update_count: u64,
    /// See [`BlockMetrics::update_fails`].
    pub update_fails: u64,
    /// See [`BlockMetrics::read_bytes`].
    pub read_bytes: u64,
    /// See [`BlockMetrics::write_bytes`].
    pub write_bytes: u64,
    /// See [`BlockMetrics::read_count`].
    pub read_count: u64,
    /// See [`BlockMetrics::write_count`].
    pub write_count: u64,
    /// See [`BlockMetrics::get_id_count`].
    pub get_id_count: u64,
}

impl BlockMetrics {
    /// Adds `n` to a counter.
    pub(crate) fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }

    /// The counters now.
    pub fn snapshot(&self) -> BlockMetricsSnapshot {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        BlockMetricsSnapshot {
            activate_fails: g(&self.activate_fails),
            cfg_fails: g(&self.cfg_fails),
            no_avail_buffer: g(&self.no_avail_buffer),
            event_fails: g(&self.event_fails),
            execute_fails: g(&self.execute_fails),
            invalid_reqs_count: g(&self.invalid_reqs_count),
            dropped_reqs_count: g(&self.dropped_reqs_count),
            abandoned_reqs_count: g(&self.abandoned_reqs_count),
            flush_count: g(&self.flush_count),
            queue_event_count: g(&self.queue_event_count),
            update_count: g(&self.update_count),
            update_fails: g(&self.update_fails),
            read_bytes: g(&self.read_bytes),
            write_bytes: g(&self.write_bytes),
            read_count: g(&self.read_count),
            write_count: g(&self.write_count),
            get_id_count: g(&self.get_id_count),
        }
    }
}
