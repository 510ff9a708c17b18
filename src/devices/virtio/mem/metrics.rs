//! The device's counters (the metrics' `memory_hotplug` group, Firecracker's
//! names, plus teravm's `busy_count`): bumped by the device's thread (and
//! `unplug_discard_fails` by the host's sink, through
//! [`super::VirtioMem::shared_metrics`]), read by anyone, as running totals.

use serde::Serialize;

use crate::devices::virtio::Counter;

/// Counters of one virtio-mem device.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize)]
pub struct MemMetrics {
    /// Activations refused.
    pub activate_fails: Counter,
    /// Chains refused (framing) and used-ring or response-write failures.
    pub queue_event_fails: Counter,
    /// Queue notifications handled.
    pub queue_event_count: Counter,
    /// PLUG requests.
    pub plug_count: Counter,
    /// Bytes plugged.
    pub plug_bytes: Counter,
    /// PLUG requests answered ERROR (invalid, or the sink failed).
    pub plug_fails: Counter,
    /// UNPLUG requests.
    pub unplug_count: Counter,
    /// Bytes unplugged (UNPLUG and UNPLUG_ALL).
    pub unplug_bytes: Counter,
    /// UNPLUG requests answered ERROR.
    pub unplug_fails: Counter,
    /// UNPLUG_ALL requests.
    pub unplug_all_count: Counter,
    /// UNPLUG_ALL requests answered ERROR (none: UNPLUG_ALL always succeeds
    /// here; kept for Firecracker's group).
    pub unplug_all_fails: Counter,
    /// STATE requests.
    pub state_count: Counter,
    /// STATE requests answered ERROR.
    pub state_fails: Counter,
    /// UNPLUGs whose discard failed, its retry included (counted by the
    /// host's sink; the ranges are freed when plugged again).
    pub unplug_discard_fails: Counter,
    /// PLUG requests answered BUSY (a discard of the range still ran).
    pub busy_count: Counter,
}
