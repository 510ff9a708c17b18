//! The `reclaim` section (teravm's own): how guest memory is freed at
//! shutdown (workers per node, chunk size, the parallel threshold, work
//! stealing) and by the live discard pool; the cap on worker threads in
//! all, and the conversion to `memory`'s [`crate::memory::ReclaimOptions`].

use serde::{Deserialize, Serialize};

use super::machine::MAX_MEM_SIZE_MIB;
use super::{invalid, ConfigError};

/// Most reclaim workers per NUMA node.
pub const MAX_WORKERS_PER_NODE: u32 = 256;
/// Most reclaim (or populate) worker threads in all: `workers_per_node`
/// times the nodes the guest spans. A host with 8 nodes can still run 128
/// per node; 256 per node on 8 nodes is refused.
pub const MAX_WORKER_THREADS: u64 = 1024;

/// Checks the total of worker threads a reclaim (or populate) of a guest
/// spanning `nodes` host nodes would start.
pub fn check_worker_threads(workers_per_node: u32, nodes: usize) -> Result<(), ConfigError> {
    let total = u64::from(workers_per_node) * nodes as u64;
    if total > MAX_WORKER_THREADS {
        return Err(invalid(
            "reclaim.workers_per_node",
            format!(
                "{workers_per_node} per node on {nodes} nodes is {total} threads, more than \
                 {MAX_WORKER_THREADS}"
            ),
        ));
    }
    Ok(())
}

/// The `reclaim` section: how guest memory is freed at shutdown.
///
/// The defaults come from `teravm-bench` on this project's machines (2 cores,
/// one node; 8 GiB of touched 4 KiB pages, 5 runs, see `docs/bench/`):
/// - `workers_per_node` 2: 2 workers freed 8 GiB 1.9x faster than one
///   `munmap`; 4 were no better than 2 on 2 cores, and 1 is no faster than
///   `munmap`. The rule: one worker per core of the node, starting from 2;
///   on bigger nodes raise it towards the node's core count (the background
///   measurements gained up to 4 workers per node, where the zone lock
///   saturates).
/// - `chunk_mib` absent: sized from the guest, the largest node's bytes cut
///   into 4 chunks per worker, rounded up to 2 MiB, between 2 MiB and 1 GiB
///   (`memory::plan::default_chunk_bytes`). 64, 256, 1024 and 2048 MiB chunks
///   gave the same time for 8 GiB with 2 workers (0.26–0.27 s), where the
///   rule gives 1 GiB, which keeps the queues short on terabyte guests; a
///   fixed 1 GiB gave a 1 GiB guest one chunk, so its second worker had
///   nothing to do (77 ms with 1, 2 or 4 workers, 1.97x faster with 256 MiB
///   chunks). A `chunk_mib` given is used as given.
/// - `parallel_threshold_mib` 1024: below 1 GiB a reclaim takes a few
///   milliseconds, less than starting pinned workers is worth.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReclaimConfig {
    /// Worker threads per host node.
    #[serde(default = "ReclaimConfig::default_workers_per_node")]
    pub workers_per_node: u32,
    /// Size of the unit of work a worker takes from its node's queue;
    /// absent: sized from the guest and the workers (see above).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chunk_mib: Option<u64>,
    /// Below this much guest RAM, one thread frees it all.
    #[serde(default = "ReclaimConfig::default_parallel_threshold_mib")]
    pub parallel_threshold_mib: u64,
    /// Workers whose queue is empty take chunks from the fullest other queue.
    #[serde(default = "ReclaimConfig::default_steal")]
    pub steal: bool,
    /// Discard workers per host node for the balloon's live reclaim (freed
    /// ranges of a running guest). Absent: `workers_per_node`. `0`: serial,
    /// as Firecracker does: every batch freed on the balloon's thread, one
    /// free call per range, adjacent ranges not merged, before its ack.
    /// Read when the microVM starts (the pool is built then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub discard_workers_per_node: Option<u32>,
}

impl ReclaimConfig {
    fn default_workers_per_node() -> u32 {
        2
    }
    fn default_parallel_threshold_mib() -> u64 {
        1024
    }
    fn default_steal() -> bool {
        true
    }

    /// Discard workers per node in force: `discard_workers_per_node`, or
    /// `workers_per_node` when absent; 0 is serial.
    pub fn discard_workers(&self) -> u32 {
        self.discard_workers_per_node
            .unwrap_or(self.workers_per_node)
    }

    /// Checks every field.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.workers_per_node == 0 || self.workers_per_node > MAX_WORKERS_PER_NODE {
            return Err(invalid(
                "reclaim.workers_per_node",
                format!(
                    "{} is not in 1..={MAX_WORKERS_PER_NODE}",
                    self.workers_per_node
                ),
            ));
        }
        if let Some(n) = self
            .discard_workers_per_node
            .filter(|&n| n > MAX_WORKERS_PER_NODE)
        {
            return Err(invalid(
                "reclaim.discard_workers_per_node",
                format!("{n} is not in 0..={MAX_WORKERS_PER_NODE}"),
            ));
        }
        if let Some(chunk_mib) = self.chunk_mib {
            if !(2..=(1 << 20)).contains(&chunk_mib) {
                return Err(invalid(
                    "reclaim.chunk_mib",
                    format!("{chunk_mib} is not in 2..=1048576"),
                ));
            }
            if chunk_mib % 2 != 0 {
                return Err(invalid(
                    "reclaim.chunk_mib",
                    format!("{chunk_mib} is not a multiple of 2 (the huge page size)"),
                ));
            }
        }
        if self.parallel_threshold_mib > MAX_MEM_SIZE_MIB {
            return Err(invalid(
                "reclaim.parallel_threshold_mib",
                format!(
                    "{} is larger than the largest guest ({MAX_MEM_SIZE_MIB})",
                    self.parallel_threshold_mib
                ),
            ));
        }
        Ok(())
    }
}

impl Default for ReclaimConfig {
    fn default() -> Self {
        ReclaimConfig {
            workers_per_node: Self::default_workers_per_node(),
            chunk_mib: None,
            parallel_threshold_mib: Self::default_parallel_threshold_mib(),
            steal: Self::default_steal(),
            discard_workers_per_node: None,
        }
    }
}

impl From<&ReclaimConfig> for crate::memory::ReclaimOptions {
    fn from(c: &ReclaimConfig) -> Self {
        crate::memory::ReclaimOptions {
            workers_per_node: c.workers_per_node,
            chunk_bytes: c.chunk_mib.map(|m| m.saturating_mul(1 << 20)),
            parallel_threshold_bytes: c.parallel_threshold_mib.saturating_mul(1 << 20),
            steal: c.steal,
        }
    }
}
