//! The block device's counters (the metrics' `block` group, Firecracker's
//! names where it has the counter): counters bumped by the device thread
//! (and the transport, for activation and configuration), read by anyone,
//! as running totals.

use serde::Serialize;

use crate::devices::virtio::Counter;

/// Counters of one block device.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize)]
pub struct BlockMetrics {
    /// Activations refused.
    pub activate_fails: Counter,
    /// Configuration space writes (it is read-only) and reads past its end.
    pub cfg_fails: Counter,
    /// Queue events that found no chain.
    pub no_avail_buffer: Counter,
    /// Eventfd, interrupt or used ring failures.
    pub event_fails: Counter,
    /// Requests whose host I/O failed (answered IOERR).
    pub execute_fails: Counter,
    /// Malformed requests: answered IOERR or UNSUPP, or dropped.
    pub invalid_reqs_count: Counter,
    /// Chains returned without a status (no usable status descriptor, a cut or overlong chain); teravm's own.
    pub dropped_reqs_count: Counter,
    /// Requests whose device was reset while they were in host I/O (nothing written back); teravm's own.
    pub abandoned_reqs_count: Counter,
    /// FLUSH requests answered OK.
    pub flush_count: Counter,
    /// Queue notifications handled.
    pub queue_event_count: Counter,
    /// Backing files swapped in (`PATCH /drives`).
    pub update_count: Counter,
    /// Backing files refused at the swap (size unreadable; the old file stays).
    pub update_fails: Counter,
    /// Bytes read from the file into the guest.
    pub read_bytes: Counter,
    /// Bytes written from the guest to the file.
    pub write_bytes: Counter,
    /// IN requests answered OK.
    pub read_count: Counter,
    /// OUT requests answered OK.
    pub write_count: Counter,
    /// GET_ID requests answered OK; teravm's own.
    pub get_id_count: Counter,
    /// Requests put back because the rate limiter refused them, and queue
    /// notifications that came while it was blocked (Firecracker's).
    pub rate_limiter_throttled_events: Counter,
    /// Times the rate limiter's timer fired (Firecracker's).
    pub rate_limiter_event_count: Counter,
    /// Requests that waited because the io_uring engine had no free slot
    /// (Firecracker's name; `io_engine: "Async"` only).
    pub io_engine_throttled_events: Counter,
}

impl BlockMetrics {
    /// The counters now (a copy).
    pub fn snapshot(&self) -> BlockMetrics {
        self.clone()
    }
}
