//! Reclaim progress and its report: per-node atomic counters that the
//! reclaim workers add to and any other thread (the API) reads while reclaim
//! runs, and the final report with the one-line summary.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::OnceLock;
use std::time::Instant;

use serde::Serialize;

/// Where a reclaim stands: `"idle"`, `"running"`, `"done"`, `"failed"` in
/// JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ReclaimState {
    /// Not started.
    Idle,
    /// Freeing.
    Running,
    /// Everything freed.
    Done,
    /// Finished with errors (see the error returned by the reclaim).
    Failed,
}

/// Progress and statistics of a reclaim, overall and per node. Its JSON is
/// what `GET /reclaim`, the `Shutdown` replies and the metrics lines show
/// (serialized here, once).
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
    /// Resident memory freed so far, as the kernel reported it (`mincore`).
    pub resident_bytes_freed: u64,
    /// Worker threads (1 when the caller's thread did it all).
    pub workers: u32,
    /// Per host node.
    pub nodes: Vec<NodeReport>,
    /// Guest address space freed but kept reserved (`PROT_NONE`) instead of
    /// unmapped, because a vCPU thread that did not stop may still enter
    /// the guest; 0 normally, and then not shown.
    #[serde(skip_serializing_if = "is_zero")]
    pub reserved_bytes: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Progress of one host node's memory.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NodeReport {
    /// The host node.
    pub node: u32,
    /// Address space of this node's slices, in bytes.
    pub address_bytes: u64,
    /// Of which freed so far.
    pub address_bytes_done: u64,
    /// Resident memory of this node's slices freed so far.
    pub resident_bytes_freed: u64,
    /// Workers of this node (1 when the caller's thread did it all).
    pub workers: u32,
    /// From the start to this node's last chunk freed.
    pub elapsed_ms: u64,
}

impl ReclaimReport {
    /// GiB per second of resident memory freed over the elapsed time
    /// (0 before any time has passed).
    pub fn gib_per_s(&self) -> f64 {
        if self.elapsed_us == 0 {
            return 0.0;
        }
        (self.resident_bytes_freed as f64 / (1u64 << 30) as f64) / (self.elapsed_us as f64 / 1e6)
    }

    /// The report of a reclaim that has not begun: `state` running, nothing
    /// done, the address space of each `(node, bytes)` and the workers the
    /// executor will run. What the VMM shows between a shutdown request and
    /// the start of the executor.
    pub fn planned(nodes: &[(u32, u64)], opts: &super::ReclaimOptions) -> ReclaimReport {
        let address_bytes = nodes.iter().map(|n| n.1).sum();
        let (workers, per_node) = opts.worker_counts(address_bytes, nodes.len());
        ReclaimReport {
            state: ReclaimState::Running,
            elapsed_ms: 0,
            elapsed_us: 0,
            address_bytes,
            address_bytes_done: 0,
            resident_bytes_freed: 0,
            workers,
            nodes: nodes
                .iter()
                .map(|&(node, address_bytes)| NodeReport {
                    node,
                    address_bytes,
                    address_bytes_done: 0,
                    resident_bytes_freed: 0,
                    workers: per_node,
                    elapsed_ms: 0,
                })
                .collect(),
            reserved_bytes: 0,
        }
    }

    /// `teravm: reclaimed <MiB> MiB in <ms> ms (<GiB/s> GiB/s, <w> workers, <n> nodes)`
    /// ("1 worker", "1 node" in the singular).
    pub fn summary_line(&self) -> String {
        format!(
            "teravm: reclaimed {} MiB in {} ms ({:.1} GiB/s, {} worker{}, {} node{})",
            self.resident_bytes_freed >> 20,
            self.elapsed_ms,
            self.gib_per_s(),
            self.workers,
            if self.workers == 1 { "" } else { "s" },
            self.nodes.len(),
            if self.nodes.len() == 1 { "" } else { "s" },
        )
    }
}

struct NodeProgress {
    node: u32,
    address_bytes: u64,
    workers: u32,
    done: AtomicU64,
    freed: AtomicU64,
    elapsed_us: AtomicU64,
}

struct Run {
    start: Instant,
    workers: u32,
    address_bytes: u64,
    nodes: Box<[NodeProgress]>,
}

const IDLE: u8 = 0;
const RUNNING: u8 = 1;
const DONE: u8 = 2;
const FAILED: u8 = 3;

/// Shared, lock-free progress of one reclaim, readable from another thread
/// while it runs. A progress serves one reclaim only.
#[derive(Default)]
pub struct ReclaimProgress {
    state: AtomicU8,
    final_elapsed_us: AtomicU64,
    run: OnceLock<Run>,
}

impl std::fmt::Debug for ReclaimProgress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReclaimProgress")
            .field("report", &self.snapshot())
            .finish()
    }
}

impl ReclaimProgress {
    /// A progress in state idle.
    pub fn new() -> Self {
        Self::default()
    }

    /// Starts the run: `nodes` are `(node, address bytes)` in queue order.
    /// False if this progress was already used.
    pub(crate) fn begin(&self, nodes: &[(u32, u64)], workers: u32, workers_per_node: u32) -> bool {
        let run = Run {
            start: Instant::now(),
            workers,
            address_bytes: nodes.iter().map(|n| n.1).sum(),
            nodes: nodes
                .iter()
                .map(|&(node, address_bytes)| NodeProgress {
                    node,
                    address_bytes,
                    workers: workers_per_node,
                    done: AtomicU64::new(0),
                    freed: AtomicU64::new(0),
                    elapsed_us: AtomicU64::new(0),
                })
                .collect(),
        };
        if self.run.set(run).is_err() {
            return false;
        }
        self.state.store(RUNNING, Ordering::Release);
        true
    }

    /// Adds a freed chunk of queue `q`.
    pub(crate) fn add(&self, q: usize, address_bytes: u64, resident_bytes: u64) {
        let Some(run) = self.run.get() else { return };
        let Some(n) = run.nodes.get(q) else { return };
        n.done.fetch_add(address_bytes, Ordering::Relaxed);
        n.freed.fetch_add(resident_bytes, Ordering::Relaxed);
        n.elapsed_us
            .fetch_max(run.start.elapsed().as_micros() as u64, Ordering::Relaxed);
    }

    /// Ends the run.
    pub(crate) fn finish(&self, ok: bool) {
        if let Some(run) = self.run.get() {
            self.final_elapsed_us
                .store(run.start.elapsed().as_micros() as u64, Ordering::Relaxed);
        }
        self.state
            .store(if ok { DONE } else { FAILED }, Ordering::Release);
    }

    /// The progress now: state idle until a reclaim starts.
    pub fn snapshot(&self) -> ReclaimReport {
        let state = match self.state.load(Ordering::Acquire) {
            IDLE => ReclaimState::Idle,
            RUNNING => ReclaimState::Running,
            DONE => ReclaimState::Done,
            _ => ReclaimState::Failed,
        };
        let Some(run) = self.run.get() else {
            // Idle, or failed before the executor began (a panic in the job).
            return ReclaimReport {
                state,
                elapsed_ms: 0,
                elapsed_us: 0,
                address_bytes: 0,
                address_bytes_done: 0,
                resident_bytes_freed: 0,
                workers: 0,
                nodes: Vec::new(),
                reserved_bytes: 0,
            };
        };
        let elapsed_us = match state {
            ReclaimState::Done | ReclaimState::Failed => {
                self.final_elapsed_us.load(Ordering::Relaxed)
            }
            _ => run.start.elapsed().as_micros() as u64,
        };
        let nodes: Vec<NodeReport> = run
            .nodes
            .iter()
            .map(|n| NodeReport {
                node: n.node,
                address_bytes: n.address_bytes,
                address_bytes_done: n.done.load(Ordering::Relaxed),
                resident_bytes_freed: n.freed.load(Ordering::Relaxed),
                workers: n.workers,
                elapsed_ms: n.elapsed_us.load(Ordering::Relaxed) / 1000,
            })
            .collect();
        ReclaimReport {
            state,
            elapsed_ms: elapsed_us / 1000,
            elapsed_us,
            address_bytes: run.address_bytes,
            address_bytes_done: nodes.iter().map(|n| n.address_bytes_done).sum(),
            resident_bytes_freed: nodes.iter().map(|n| n.resident_bytes_freed).sum(),
            workers: run.workers,
            nodes,
            reserved_bytes: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn planned_report_has_nothing_done_and_the_executors_workers() {
        let opts = super::super::ReclaimOptions {
            workers_per_node: 3,
            parallel_threshold_bytes: 1 << 30,
            ..Default::default()
        };
        let r = ReclaimReport::planned(&[(0, 2 << 30), (1, 2 << 30)], &opts);
        assert_eq!(r.state, ReclaimState::Running);
        assert_eq!(
            (r.address_bytes, r.address_bytes_done, r.workers),
            (4 << 30, 0, 6)
        );
        assert!(r
            .nodes
            .iter()
            .all(|n| n.workers == 3 && n.resident_bytes_freed == 0));
        let small = ReclaimReport::planned(&[(0, 256 << 20)], &opts);
        assert_eq!((small.workers, small.nodes[0].workers), (1, 1));
    }

    use super::*;

    #[test]
    fn idle_until_begun_then_counts() {
        let p = ReclaimProgress::new();
        assert_eq!(p.snapshot().state, ReclaimState::Idle);
        assert!(p.begin(&[(0, 100), (3, 50)], 4, 2));
        assert!(!p.begin(&[(0, 1)], 1, 1), "a progress serves one reclaim");
        p.add(1, 50, 40);
        p.add(0, 60, 60);
        p.add(7, 1, 1); // unknown queue: ignored
        let r = p.snapshot();
        assert_eq!(r.state, ReclaimState::Running);
        assert_eq!(
            (
                r.address_bytes,
                r.address_bytes_done,
                r.resident_bytes_freed
            ),
            (150, 110, 100)
        );
        assert_eq!(r.nodes[1].node, 3);
        assert_eq!(r.nodes[1].address_bytes_done, 50);
        assert_eq!(r.workers, 4);
        p.finish(true);
        let r = p.snapshot();
        assert_eq!(r.state, ReclaimState::Done);
        assert_eq!(
            p.snapshot().elapsed_us,
            r.elapsed_us,
            "frozen once finished"
        );
    }

    #[test]
    fn summary_line_and_rate() {
        let r = ReclaimReport {
            state: ReclaimState::Done,
            elapsed_ms: 500,
            elapsed_us: 500_000,
            address_bytes: 4 << 30,
            address_bytes_done: 4 << 30,
            resident_bytes_freed: 3 << 30,
            workers: 4,
            nodes: vec![],
            reserved_bytes: 0,
        };
        assert!((r.gib_per_s() - 6.0).abs() < 1e-9);
        assert_eq!(
            r.summary_line(),
            "teravm: reclaimed 3072 MiB in 500 ms (6.0 GiB/s, 4 workers, 0 nodes)"
        );
        assert_eq!(ReclaimReport { elapsed_us: 0, ..r }.gib_per_s(), 0.0);
    }

    #[test]
    fn progress_is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<ReclaimProgress>();
    }
}
