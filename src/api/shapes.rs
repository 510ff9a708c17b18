//! The API's JSON shapes of the memory module's reports, of a shutdown and
//! of the balloon: `memory` and `vmm` define no JSON, so the layers that
//! answer clients convert their reports here. Field names and layout are the
//! ones clients have always seen; the sync `Shutdown` reply adds the
//! shutdown's phases. The balloon's are Firecracker's (`GET /balloon`,
//! `GET /balloon/statistics`), with teravm's own counters under `teravm`.

use serde::Serialize;

use crate::config::BalloonConfig;
use crate::devices::virtio::balloon::{BalloonOptions, BalloonStats};
use crate::memory;

/// Where a reclaim stands: `"idle"`, `"running"`, `"done"`, `"failed"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ReclaimState {
    /// Not started.
    Idle,
    /// Freeing.
    Running,
    /// Everything freed.
    Done,
    /// Finished with errors.
    Failed,
}

impl From<memory::ReclaimState> for ReclaimState {
    fn from(s: memory::ReclaimState) -> Self {
        match s {
            memory::ReclaimState::Idle => ReclaimState::Idle,
            memory::ReclaimState::Running => ReclaimState::Running,
            memory::ReclaimState::Done => ReclaimState::Done,
            memory::ReclaimState::Failed => ReclaimState::Failed,
        }
    }
}

/// `GET /reclaim`, the sync `Shutdown` reply and the async one's plan.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReclaimReport {
    /// Where the reclaim stands.
    pub state: ReclaimState,
    /// Time since the start, or the whole reclaim once finished.
    pub elapsed_ms: u64,
    /// The same in microseconds.
    pub elapsed_us: u64,
    /// Guest address space to free, in bytes.
    pub address_bytes: u64,
    /// Address space freed so far.
    pub address_bytes_done: u64,
    /// Resident memory freed so far, as the kernel reported it.
    pub resident_bytes_freed: u64,
    /// Worker threads.
    pub workers: u32,
    /// Per host node.
    pub nodes: Vec<NodeReport>,
    /// Address space freed but kept reserved until exit (a vCPU thread did
    /// not stop); shown only when not 0.
    #[serde(skip_serializing_if = "is_zero")]
    pub reserved_bytes: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// One host node's part of a [`ReclaimReport`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NodeReport {
    /// The host node.
    pub node: u32,
    /// Address space of this node's slices, in bytes.
    pub address_bytes: u64,
    /// Of which freed so far.
    pub address_bytes_done: u64,
    /// Resident memory of this node's slices freed so far.
    pub resident_bytes_freed: u64,
    /// Workers of this node.
    pub workers: u32,
    /// From the start to this node's last chunk freed.
    pub elapsed_ms: u64,
}

impl From<&memory::NodeReport> for NodeReport {
    fn from(n: &memory::NodeReport) -> Self {
        NodeReport {
            node: n.node,
            address_bytes: n.address_bytes,
            address_bytes_done: n.address_bytes_done,
            resident_bytes_freed: n.resident_bytes_freed,
            workers: n.workers,
            elapsed_ms: n.elapsed_ms,
        }
    }
}

impl From<&memory::ReclaimReport> for ReclaimReport {
    fn from(r: &memory::ReclaimReport) -> Self {
        ReclaimReport {
            state: r.state.into(),
            elapsed_ms: r.elapsed_ms,
            elapsed_us: r.elapsed_us,
            address_bytes: r.address_bytes,
            address_bytes_done: r.address_bytes_done,
            resident_bytes_freed: r.resident_bytes_freed,
            workers: r.workers,
            nodes: r.nodes.iter().map(NodeReport::from).collect(),
            reserved_bytes: r.reserved_bytes,
        }
    }
}

/// What a populate did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PopulateStats {
    /// Wall time.
    pub elapsed_ms: u64,
    /// Address space populated, in bytes.
    pub bytes: u64,
    /// Worker threads.
    pub workers: u32,
    /// Host nodes.
    pub nodes: u32,
    /// Stopped early by a shutdown.
    pub cancelled: bool,
}

impl From<&memory::PopulateStats> for PopulateStats {
    fn from(s: &memory::PopulateStats) -> Self {
        PopulateStats {
            elapsed_ms: s.elapsed_ms,
            bytes: s.bytes,
            workers: s.workers,
            nodes: s.nodes,
            cancelled: s.cancelled,
        }
    }
}

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
    pub reclaim: ReclaimReport,
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
        let json = serde_json::to_value(ReclaimReport::from(&r)).unwrap();
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
        for (s, text) in [
            (memory::ReclaimState::Idle, "idle"),
            (memory::ReclaimState::Running, "running"),
            (memory::ReclaimState::Failed, "failed"),
        ] {
            assert_eq!(serde_json::to_value(ReclaimState::from(s)).unwrap(), text);
        }
    }

    #[test]
    fn populate_shapes() {
        let s = memory::PopulateStats {
            elapsed_ms: 3,
            bytes: 1 << 20,
            workers: 2,
            nodes: 1,
            cancelled: true,
        };
        let json = serde_json::to_value(PopulateStats::from(&s)).unwrap();
        assert_eq!(json["cancelled"], true);
        assert_eq!(json["bytes"], 1 << 20);
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
