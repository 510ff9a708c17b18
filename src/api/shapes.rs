//! The API's JSON shapes that are not a report serialized as it is: the
//! reclaim report serializes itself ([`memory::ReclaimReport`], the same
//! JSON in `GET /reclaim`, the `Shutdown` replies and the metrics lines);
//! here are the populate progress (a snapshot of its atomic counters), the
//! sync `Shutdown` reply (the report with the shutdown's phases beside it)
//! and the balloon's. The balloon's are Firecracker's (`GET /balloon`,
//! `GET /balloon/statistics`), with teravm's own counters under `teravm`.

use serde::Serialize;

use crate::config::BalloonConfig;
use crate::devices::virtio::balloon::{BalloonOptions, BalloonStats};
use crate::memory;

/// A populate under way, as the memory resource shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct PopulateProgress {
    /// Bytes populated so far.
    pub bytes_done: u64,
    /// Bytes to populate in all.
    pub total_bytes: u64,
}

impl From<&memory::PopulateProgress> for PopulateProgress {
    fn from(p: &memory::PopulateProgress) -> Self {
        PopulateProgress {
            bytes_done: p.bytes_done(),
            total_bytes: p.total_bytes(),
        }
    }
}

/// How long each phase of a shutdown took, in milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct ShutdownPhases {
    /// From the shutdown request to the `reclaim` job's start.
    pub accept_ms: f64,
    /// Stopping and joining the vCPUs.
    pub stop_vcpus_ms: f64,
    /// Draining the console.
    pub console_ms: f64,
    /// Closing the VM fd (KVM's memslots and MMU).
    pub close_vm_ms: f64,
    /// Freeing guest memory with the per-node workers (the executor).
    pub reclaim_ms: f64,
    /// Unmapping the emptied mappings and closing their memfds.
    pub unmap_ms: f64,
    /// From the shutdown request to the memory being back.
    pub total_ms: f64,
}

/// The sync `Shutdown` reply: the final reclaim report (the same fields as
/// `GET /reclaim`), the shutdown's phases, and what did not go cleanly.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ShutdownStats {
    /// The reclaim report.
    #[serde(flatten)]
    pub reclaim: memory::ReclaimReport,
    /// Phase timings.
    pub phases: ShutdownPhases,
    /// vCPU threads that did not stop in time.
    pub vcpus_stuck: u64,
    /// Guest console bytes that reached no sink.
    pub console_dropped_bytes: u64,
    /// teravm's own output lines stderr did not take (dropped, counted).
    pub stderr_dropped_lines: u64,
}

/// `GET /balloon`: Firecracker's `Balloon`, the configuration with the
/// target in force.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct BalloonShape {
    /// Target balloon size in MiB.
    pub amount_mib: u64,
    /// Whether the guest may deflate when it runs out of memory.
    pub deflate_on_oom: bool,
    /// Seconds between statistics updates (0: none).
    pub stats_polling_interval_s: u16,
    /// Whether free page reporting is offered.
    pub free_page_reporting: bool,
    /// Whether free page hinting is offered (never, in teravm).
    pub free_page_hinting: bool,
}

impl From<&BalloonConfig> for BalloonShape {
    fn from(c: &BalloonConfig) -> Self {
        BalloonShape {
            amount_mib: u64::from(c.amount_mib),
            deflate_on_oom: c.deflate_on_oom,
            stats_polling_interval_s: c.stats_polling_interval_s,
            free_page_reporting: c.free_page_reporting,
            free_page_hinting: c.free_page_hinting,
        }
    }
}

impl From<&BalloonOptions> for BalloonShape {
    /// From the device's options (`Balloon::options()`, whose `amount_mib`
    /// follows `PATCH /balloon`).
    fn from(o: &BalloonOptions) -> Self {
        BalloonShape {
            amount_mib: o.amount_mib,
            deflate_on_oom: o.deflate_on_oom,
            stats_polling_interval_s: o.stats_polling_interval_s,
            free_page_reporting: o.free_page_reporting,
            free_page_hinting: o.free_page_hinting,
        }
    }
}

/// What the VMM knows of the balloon's discards, as plain numbers (the
/// input of [`BalloonTeravmShape`]; the API does not reach into the
/// memory module).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct BalloonTeravmCounters {
    /// Bytes freed on the host.
    pub discarded_bytes: u64,
    /// Of which per host node: `(node, bytes)`.
    pub discarded_bytes_per_node: Vec<(u32, u64)>,
    /// Ranges freed.
    pub ranges: u64,
    /// Bytes refused (outside guest RAM, partial pages).
    pub refused_bytes: u64,
    /// Discards that failed.
    pub failures: u64,
    /// Recent discard rate, bytes per second.
    pub discard_bytes_per_s: u64,
}

/// One host node's bytes in [`BalloonTeravmShape`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct BalloonNodeBytes {
    /// The host node.
    pub node: u32,
    /// Bytes freed on it.
    pub bytes: u64,
}

/// teravm's own counters in `GET /balloon/statistics`, under `teravm`.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize)]
pub struct BalloonTeravmShape {
    /// Bytes freed on the host.
    pub discarded_bytes: u64,
    /// Of which per host node.
    pub discarded_bytes_per_node: Vec<BalloonNodeBytes>,
    /// Ranges freed.
    pub ranges: u64,
    /// Bytes refused.
    pub refused_bytes: u64,
    /// Discards that failed.
    pub failures: u64,
    /// Recent discard rate, bytes per second.
    pub discard_bytes_per_s: u64,
}

impl From<&BalloonTeravmCounters> for BalloonTeravmShape {
    fn from(c: &BalloonTeravmCounters) -> Self {
        BalloonTeravmShape {
            discarded_bytes: c.discarded_bytes,
            discarded_bytes_per_node: c
                .discarded_bytes_per_node
                .iter()
                .map(|&(node, bytes)| BalloonNodeBytes { node, bytes })
                .collect(),
            ranges: c.ranges,
            refused_bytes: c.refused_bytes,
            failures: c.failures,
            discard_bytes_per_s: c.discard_bytes_per_s,
        }
    }
}

/// `GET /balloon/statistics`: Firecracker's `BalloonStats` (the sizes and
/// the guest's counters at the top level) and teravm's counters under
/// `teravm`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BalloonStatisticsShape {
    /// The target, in 4 KiB pages.
    pub target_pages: u32,
    /// What the guest has inflated, in 4 KiB pages.
    pub actual_pages: u32,
    /// The target, in MiB.
    pub target_mib: u64,
    /// What the guest has inflated, in MiB.
    pub actual_mib: u64,
    /// The guest's latest counters, in Firecracker's names (the device's
    /// own type serializes them so; a counter not sent is left out).
    #[serde(flatten)]
    pub guest: BalloonStats,
    /// teravm's own.
    pub teravm: BalloonTeravmShape,
}

/// The balloon's sizes, as the device reports them (`Balloon::target_pages`,
/// `actual_pages`, `target_mib`, `actual_mib`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct BalloonSizes {
    /// The target, in 4 KiB pages.
    pub target_pages: u32,
    /// What the guest has inflated, in 4 KiB pages.
    pub actual_pages: u32,
    /// The target, in MiB.
    pub target_mib: u64,
    /// What the guest has inflated, in MiB.
    pub actual_mib: u64,
}

impl BalloonStatisticsShape {
    /// The reply from the device's sizes and latest statistics and the
    /// VMM's discard counters.
    pub fn new(sizes: BalloonSizes, guest: &BalloonStats, teravm: &BalloonTeravmCounters) -> Self {
        BalloonStatisticsShape {
            target_pages: sizes.target_pages,
            actual_pages: sizes.actual_pages,
            target_mib: sizes.target_mib,
            actual_mib: sizes.actual_mib,
            guest: guest.clone(),
            teravm: teravm.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reclaim_report_json_is_unchanged() {
        let r = memory::ReclaimReport {
            state: memory::ReclaimState::Done,
            elapsed_ms: 500,
            elapsed_us: 500_000,
            address_bytes: 4 << 30,
            address_bytes_done: 4 << 30,
            resident_bytes_freed: 3 << 30,
            workers: 4,
            nodes: vec![memory::NodeReport {
                node: 1,
                address_bytes: 4 << 30,
                address_bytes_done: 4 << 30,
                resident_bytes_freed: 3 << 30,
                workers: 4,
                elapsed_ms: 499,
            }],
            reserved_bytes: 0,
        };
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "state": "done", "elapsed_ms": 500, "elapsed_us": 500000,
                "address_bytes": 4u64 << 30, "address_bytes_done": 4u64 << 30,
                "resident_bytes_freed": 3u64 << 30, "workers": 4,
                "nodes": [{"node": 1, "address_bytes": 4u64 << 30,
                           "address_bytes_done": 4u64 << 30,
                           "resident_bytes_freed": 3u64 << 30,
                           "workers": 4, "elapsed_ms": 499}]
            })
        );
        let mut r = r;
        r.reserved_bytes = 4096;
        assert_eq!(serde_json::to_value(&r).unwrap()["reserved_bytes"], 4096);
        for (s, text) in [
            (memory::ReclaimState::Idle, "idle"),
            (memory::ReclaimState::Running, "running"),
            (memory::ReclaimState::Failed, "failed"),
        ] {
            assert_eq!(serde_json::to_value(s).unwrap(), text);
        }
    }

    #[test]
    fn populate_shapes() {
        let p = memory::PopulateProgress::new();
        let json = serde_json::to_value(PopulateProgress::from(&p)).unwrap();
        assert_eq!(json, serde_json::json!({"bytes_done": 0, "total_bytes": 0}));
    }

    #[test]
    fn balloon_shape_is_firecrackers() {
        let c = BalloonConfig {
            amount_mib: 64,
            deflate_on_oom: true,
            stats_polling_interval_s: 1,
            free_page_reporting: true,
            free_page_hinting: false,
        };
        let want = serde_json::json!({"amount_mib": 64, "deflate_on_oom": true,
            "stats_polling_interval_s": 1, "free_page_reporting": true,
            "free_page_hinting": false});
        assert_eq!(serde_json::to_value(BalloonShape::from(&c)).unwrap(), want);
        let o = BalloonOptions::from(&c);
        assert_eq!(serde_json::to_value(BalloonShape::from(&o)).unwrap(), want);
        // The config's own JSON (GET /vm/config) is the same shape.
        assert_eq!(serde_json::to_value(c).unwrap(), want);
    }

    #[test]
    fn balloon_statistics_shape() {
        let mut guest = BalloonStats::default();
        guest.set(4, 100 << 20);
        guest.set(5, 256 << 20);
        guest.set(10, 0);
        let teravm = BalloonTeravmCounters {
            discarded_bytes: 3 << 20,
            discarded_bytes_per_node: vec![(0, 1 << 20), (1, 2 << 20)],
            ranges: 7,
            refused_bytes: 4096,
            failures: 1,
            discard_bytes_per_s: 1 << 30,
        };
        let sizes = BalloonSizes {
            target_pages: 16384,
            actual_pages: 768,
            target_mib: 64,
            actual_mib: 3,
        };
        let json =
            serde_json::to_value(BalloonStatisticsShape::new(sizes, &guest, &teravm)).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "target_pages": 16384, "actual_pages": 768, "target_mib": 64, "actual_mib": 3,
                "free_memory": 100u64 << 20, "total_memory": 256u64 << 20, "oom_kill": 0,
                "teravm": {"discarded_bytes": 3u64 << 20,
                           "discarded_bytes_per_node": [{"node": 0, "bytes": 1u64 << 20},
                                                        {"node": 1, "bytes": 2u64 << 20}],
                           "ranges": 7, "refused_bytes": 4096, "failures": 1,
                           "discard_bytes_per_s": 1u64 << 30}
            })
        );
        // Every counter, by Firecracker's name, once the guest sent them all.
        let mut all = BalloonStats::default();
        for tag in 0..16 {
            all.set(tag, u64::from(tag));
        }
        let json = serde_json::to_value(BalloonStatisticsShape::new(
            BalloonSizes::default(),
            &all,
            &BalloonTeravmCounters::default(),
        ))
        .unwrap();
        let names = [
            "swap_in",
            "swap_out",
            "major_faults",
            "minor_faults",
            "free_memory",
            "total_memory",
            "available_memory",
            "disk_caches",
            "hugetlb_allocations",
            "hugetlb_failures",
            "oom_kill",
            "alloc_stall",
            "async_scan",
            "direct_scan",
            "async_reclaim",
            "sync_reclaim",
        ];
        for (tag, name) in names.iter().enumerate() {
            assert_eq!(json[name], tag, "{name}");
        }
        assert_eq!(json.as_object().unwrap().len(), 4 + 16 + 1);
        assert_eq!(
            json["teravm"]["discarded_bytes_per_node"],
            serde_json::json!([])
        );
    }
}
