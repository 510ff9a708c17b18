//! What the populate and reclaim executors share: per-node chunk queues that
//! workers take from (one atomic index per queue, optional stealing), and
//! scoped worker threads pinned to their node's CPUs that start together.
//!
//! Workers talk only through the queues' atomics and the caller's own
//! (atomic) progress; their errors and panics come back at join.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};

use super::numa::HostTopology;
use super::plan::{Chunk, ReclaimPlan};
use super::sys;

/// The queues of a plan, shared by the workers: one next-chunk index per
/// queue, and the chunks that were taken but not finished (at most one per
/// worker, since a worker stops at its first failure). Its size grows with
/// the nodes and the workers, never with the chunks.
pub(crate) struct ChunkQueues<'a> {
    plan: &'a ReclaimPlan,
    next: Vec<AtomicU64>,
    abandoned: Mutex<Vec<(usize, u64)>>,
}

/// A chunk taken from a queue: `queue`, `index` in it, and the `chunk`.
/// Unless [`Claim::done`] is called, dropping it (an error, a panic, a
/// cancel) records the chunk as abandoned, for [`ChunkQueues::take_left`].
pub(crate) struct Claim<'q, 'a> {
    queues: &'q ChunkQueues<'a>,
    pub queue: usize,
    pub index: u64,
    pub chunk: Chunk,
    finished: bool,
}

impl Claim<'_, '_> {
    /// The chunk is finished.
    pub(crate) fn done(mut self) {
        self.finished = true;
    }

    /// The chunk failed and is not to be retried (the last attempt).
    pub(crate) fn give_up(mut self) {
        self.finished = true;
    }
}

impl Drop for Claim<'_, '_> {
    fn drop(&mut self) {
        if !self.finished {
            self.queues
                .abandoned
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push((self.queue, self.index));
        }
    }
}

impl<'a> ChunkQueues<'a> {
    pub(crate) fn new(plan: &'a ReclaimPlan) -> Self {
        ChunkQueues {
            plan,
            next: plan.queues.iter().map(|_| AtomicU64::new(0)).collect(),
            abandoned: Mutex::new(Vec::new()),
        }
    }

    fn remaining(&self, q: usize) -> u64 {
        self.plan.queues[q]
            .chunk_count
            .saturating_sub(self.next[q].load(Ordering::Relaxed))
    }

    fn take_from(&self, q: usize) -> Option<Claim<'_, 'a>> {
        let queue = &self.plan.queues[q];
        if self.next[q].load(Ordering::Relaxed) >= queue.chunk_count {
            return None;
        }
        let index = self.next[q].fetch_add(1, Ordering::Relaxed);
        self.claim(q, index)
    }

    fn claim(&self, queue: usize, index: u64) -> Option<Claim<'_, 'a>> {
        Some(Claim {
            queues: self,
            queue,
            index,
            chunk: self.plan.queues[queue].chunk(index)?,
            finished: false,
        })
    }

    /// The next chunk for a worker of queue `own`: from its own queue, else
    /// (with `steal`) from the other queue with the most chunks left.
    pub(crate) fn take(&self, own: usize, steal: bool) -> Option<Claim<'_, 'a>> {
        if let Some(c) = self.take_from(own) {
            return Some(c);
        }
        if !steal {
            return None;
        }
        loop {
            let q = (0..self.next.len())
                .filter(|&q| self.remaining(q) > 0)
                .max_by_key(|&q| self.remaining(q))?;
            if let Some(c) = self.take_from(q) {
                return Some(c);
            }
        }
    }

    /// Once no worker runs: the next chunk not finished, first those that
    /// workers abandoned, then those no worker took, queue by queue.
    pub(crate) fn take_left(&self) -> Option<Claim<'_, 'a>> {
        let abandoned = self
            .abandoned
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop();
        if let Some((q, i)) = abandoned {
            return self.claim(q, i);
        }
        (0..self.next.len()).find_map(|q| self.take_from(q))
    }

    /// How many chunks are not finished (abandoned or never taken).
    pub(crate) fn left(&self) -> u64 {
        let abandoned = self
            .abandoned
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len();
        abandoned as u64 + (0..self.next.len()).map(|q| self.remaining(q)).sum::<u64>()
    }
}

/// Who a worker is.
#[derive(Debug, Clone)]
pub(crate) struct Worker {
    /// Its host node.
    pub node: u32,
    /// The queue of that node in the plan.
    pub queue: usize,
    /// Its number within the node.
    pub index: u32,
    /// The thread name, `<prefix>-n{node}-{index}`.
    pub name: String,
    /// The CPUs it was pinned to, if it was pinned.
    pub pinned: Option<Vec<usize>>,
}

/// How a worker ended, when not well.
#[derive(Debug)]
pub(crate) enum WorkerFailure<E> {
    /// The thread could not be started.
    Spawn { name: String, error: std::io::Error },
    /// The work returned an error.
    Failed { name: String, error: E },
    /// The work panicked.
    Panicked { name: String, message: String },
}

/// A start gate: workers wait at it until the caller has spawned them all,
/// so they start together (unlike a `Barrier`, a failed spawn cannot leave
/// the others waiting forever).
struct Gate {
    open: Mutex<bool>,
    cv: Condvar,
}

impl Gate {
    fn wait(&self) {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        while !*open {
            open = self.cv.wait(open).unwrap_or_else(|e| e.into_inner());
        }
    }
    fn open(&self) {
        *self.open.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.cv.notify_all();
    }
}

/// The CPUs a worker of `node` is pinned to: the node's CPUs that this
/// process may use; `None` (unpinned) where there are none, e.g. a fake
/// topology from a test tree.
pub(crate) fn node_cpus(
    topology: &HostTopology,
    node: u32,
    allowed: &[usize],
) -> Option<Vec<usize>> {
    let cpus: Vec<usize> = topology
        .node(node)
        .map(|n| {
            n.cpus
                .iter()
                .copied()
                .filter(|c| allowed.contains(c))
                .collect()
        })
        .unwrap_or_default();
    (!cpus.is_empty()).then_some(cpus)
}

/// Pins the calling thread (a worker called `name`) to `cpus` (from
/// [`node_cpus`]); returns the CPUs it is pinned to, `None` when it runs
/// unpinned (no CPUs, or `sched_setaffinity` failed, which is logged).
pub(crate) fn pin_current(name: &str, cpus: Option<Vec<usize>>) -> Option<Vec<usize>> {
    let cpus = cpus?;
    match sys::set_affinity(&cpus) {
        Ok(()) => Some(cpus),
        Err(e) => {
            log::warn!("{name}: cannot pin to CPUs {cpus:?}: {e}");
            None
        }
    }
}

/// Runs `work` on `workers_per_node` scoped threads per queue of the plan
/// (`nodes[q]` is the node of queue `q`), named `<prefix>-n{node}-{i}` and
/// pinned to their node's CPUs, all started together. Returns the failures.
pub(crate) fn run_pinned<E, F>(
    prefix: &str,
    nodes: &[u32],
    workers_per_node: u32,
    topology: &HostTopology,
    work: F,
) -> Vec<WorkerFailure<E>>
where
    E: Send,
    F: Fn(&Worker) -> Result<(), E> + Sync,
{
    let allowed = sys::get_affinity().unwrap_or_default();
    let mut logged_unpinned = false;
    let gate = Gate {
        open: Mutex::new(false),
        cv: Condvar::new(),
    };
    let mut failures = Vec::new();
    std::thread::scope(|scope| {
        let mut handles = Vec::new();
        for (queue, &node) in nodes.iter().enumerate() {
            let cpus = node_cpus(topology, node, &allowed);
            if cpus.is_none() && !logged_unpinned {
                log::debug!("{prefix}: node {node} has no CPU this process may use; its workers run unpinned");
                logged_unpinned = true;
            }
            for index in 0..workers_per_node {
                let worker = Worker {
                    node,
                    queue,
                    index,
                    name: format!("{prefix}-n{node}-{index}"),
                    pinned: cpus.clone(),
                };
                let (gate, work) = (&gate, &work);
                let spawned = std::thread::Builder::new()
                    .name(worker.name.clone())
                    .spawn_scoped(scope, move || {
                        let mut worker = worker;
                        worker.pinned = pin_current(&worker.name, worker.pinned.take());
                        gate.wait();
                        work(&worker)
                    });
                match spawned {
                    Ok(h) => handles.push((format!("{prefix}-n{node}-{index}"), h)),
                    Err(error) => failures.push(WorkerFailure::Spawn {
                        name: format!("{prefix}-n{node}-{index}"),
                        error,
                    }),
                }
            }
        }
        gate.open();
        for (name, h) in handles {
            match h.join() {
                Ok(Ok(())) => {}
                Ok(Err(error)) => failures.push(WorkerFailure::Failed { name, error }),
                Err(payload) => {
                    let message = crate::util::panic_text(&*payload).to_string();
                    failures.push(WorkerFailure::Panicked { name, message });
                }
            }
        }
    });
    failures
}

impl<E: std::fmt::Display> std::fmt::Display for WorkerFailure<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WorkerFailure::Spawn { name, error } => write!(f, "cannot start {name}: {error}"),
            WorkerFailure::Failed { name, error } => write!(f, "{name}: {error}"),
            WorkerFailure::Panicked { name, message } => write!(f, "{name} panicked: {message}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::numa::HostNode;
    use super::super::plan::plan_chunks;
    use super::*;

    #[test]
    fn queues_hand_out_each_chunk_once_with_stealing() {
        let plan = plan_chunks(&[(0, 10), (1, 100)], 1);
        let queues = ChunkQueues::new(&plan);
        let mut seen = Vec::new();
        // A worker of queue 0 drains its own queue, then steals.
        while let Some(c) = queues.take(0, true) {
            seen.push((c.queue, c.index));
            c.done();
        }
        assert_eq!(seen.len(), 110);
        assert!(
            seen[..10].iter().all(|&(q, _)| q == 0),
            "its own queue first"
        );
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), 110);
        assert_eq!(queues.left(), 0);
        assert!(queues.take_left().is_none());
        assert!(queues.take(1, true).is_none());
    }

    #[test]
    fn a_thief_takes_from_the_queue_with_most_left() {
        let plan = plan_chunks(&[(0, 3), (1, 0), (2, 7), (3, 5)], 1);
        let queues = ChunkQueues::new(&plan);
        // Queue 1 (node 1) is empty: its worker steals from queue 2 (7 left),
        // until queue 2 has no more left than queue 3.
        let stolen: Vec<usize> = (0..4)
            .map(|_| {
                let c = queues.take(1, true).unwrap();
                let q = c.queue;
                c.done();
                q
            })
            .collect();
        assert_eq!(&stolen[..2], &[2, 2]);
        assert_eq!(queues.left(), 15 - 4);
    }

    #[test]
    fn without_stealing_a_worker_keeps_to_its_queue() {
        let plan = plan_chunks(&[(0, 2), (1, 5)], 1);
        let queues = ChunkQueues::new(&plan);
        queues.take(0, false).unwrap().done();
        queues.take(0, false).unwrap().done();
        assert!(queues.take(0, false).is_none());
        assert_eq!(queues.left(), 5);
    }

    #[test]
    fn an_unfinished_claim_is_left_for_the_caller_once() {
        let plan = plan_chunks(&[(0, 4)], 1);
        let queues = ChunkQueues::new(&plan);
        queues.take(0, false).unwrap().done();
        let dropped = queues.take(0, false).unwrap();
        assert_eq!(dropped.index, 1);
        drop(dropped); // an error or a panic
        assert_eq!(queues.left(), 3);
        // The caller gets the abandoned chunk first, then the untaken ones.
        let order: Vec<u64> = std::iter::from_fn(|| {
            let c = queues.take_left()?;
            let i = c.index;
            if i == 2 {
                c.give_up(); // fails again: not retried
            } else {
                c.done();
            }
            Some(i)
        })
        .collect();
        assert_eq!(order, vec![1, 2, 3]);
        assert_eq!(queues.left(), 0);
    }

    #[test]
    fn queues_of_a_64_tib_plan_of_2_mib_chunks_are_small() {
        let plan = plan_chunks(&[(0, 32 << 40), (1, 32 << 40)], 2 << 20);
        let queues = ChunkQueues::new(&plan);
        assert_eq!(queues.next.len(), 2);
        assert_eq!(queues.left(), 1 << 25);
        let c = queues.take(1, false).unwrap();
        assert_eq!((c.queue, c.index, c.chunk.range), (1, 0, 1));
        c.done();
        assert_eq!(queues.left(), (1 << 25) - 1);
    }

    #[test]
    fn workers_are_named_pinned_and_failures_collected() {
        let cpus = sys::get_affinity().unwrap();
        let topo = HostTopology {
            nodes: vec![
                HostNode {
                    id: 0,
                    cpus: vec![cpus[0]],
                    mem_total_bytes: 1,
                },
                HostNode {
                    id: 5,
                    cpus: vec![],
                    mem_total_bytes: 1,
                },
            ],
            source: crate::memory::numa::TopologySource::Sysfs("(built by a test)".into()),
        };
        let seen = Mutex::new(Vec::new());
        let failures = run_pinned("test", &[0, 5], 2, &topo, |w| {
            let name = std::thread::current().name().unwrap().to_string();
            seen.lock()
                .unwrap()
                .push((name, w.pinned.clone(), sys::get_affinity().unwrap()));
            match (w.node, w.index) {
                (5, 0) => Err("boom"),
                (5, 1) => panic!("injected"),
                _ => Ok(()),
            }
        });
        let mut seen = seen.into_inner().unwrap();
        seen.sort();
        assert_eq!(seen.len(), 4);
        assert_eq!(seen[0].0, "test-n0-0");
        assert_eq!(seen[0].2, vec![cpus[0]]);
        assert_eq!(seen[3].0, "test-n5-1");
        assert_eq!(seen[3].1, None);
        assert_eq!(seen[3].2, cpus, "unpinned keeps the process's CPUs");
        let text: Vec<String> = failures.iter().map(|f| f.to_string()).collect();
        assert_eq!(text.len(), 2);
        assert!(text.contains(&"test-n5-0: boom".to_string()), "{text:?}");
        assert!(
            text.contains(&"test-n5-1 panicked: injected".to_string()),
            "{text:?}"
        );
    }
}
