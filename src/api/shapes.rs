//! The API's JSON shapes of the memory module's reports and of a shutdown:
//! `memory` and `vmm` define no JSON, so the layers that answer clients
//! convert their reports here. Field names and layout are the ones clients
//! have always seen; the sync `Shutdown` reply adds the shutdown's phases.

use serde::Serialize;

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
}
