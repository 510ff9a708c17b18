//! Pure planning, no memory touched: the partition of guest RAM into one
//! contiguous slice per host node, and the cutting of those slices into
//! chunks, one queue per node, for the populate and reclaim executors.

use super::layout::RamRegion;

/// Errors of [`partition`].
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PlanError {
    /// No node to place memory on.
    #[error("no host node selected for guest memory")]
    NoNodes,
    /// A node appears twice in the selection.
    #[error("host node {0} is selected twice")]
    DuplicateNode(u32),
    /// The alignment is zero or not a power of two.
    #[error("alignment {0:#x} is not a power of two")]
    BadAlign(u64),
    /// The RAM sizes overflow.
    #[error("guest RAM size overflows")]
    Overflow,
    /// Less RAM than one aligned unit per node.
    #[error("{total} bytes of guest RAM cannot give each of {nodes} nodes a share aligned to {align:#x} bytes")]
    TooSmall {
        /// Total RAM in bytes.
        total: u64,
        /// Number of nodes.
        nodes: usize,
        /// Alignment asked for.
        align: u64,
    },
}

/// A contiguous piece of guest RAM placed on one host node; it never crosses
/// the MMIO gap, and is backed by one mapping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeSlice {
    /// The host node.
    pub node: u32,
    /// First guest physical address.
    pub guest_addr: u64,
    /// Length in bytes.
    pub len: u64,
}

/// Splits RAM into one contiguous share per node: equal shares in `nodes`
/// order, boundaries aligned to `align`, the last node taking the remainder.
/// A share that spans two regions (crosses the MMIO gap) becomes two
/// [`NodeSlice`]s, so no slice crosses the gap.
pub fn partition(
    regions: &[RamRegion],
    nodes: &[u32],
    align: u64,
) -> Result<Vec<NodeSlice>, PlanError> {
    if nodes.is_empty() {
        return Err(PlanError::NoNodes);
    }
    let mut seen = nodes.to_vec();
    seen.sort_unstable();
    if let Some(w) = seen.windows(2).find(|w| w[0] == w[1]) {
        return Err(PlanError::DuplicateNode(w[0]));
    }
    if align == 0 || !align.is_power_of_two() {
        return Err(PlanError::BadAlign(align));
    }
    let total = regions
        .iter()
        .try_fold(0u64, |acc, r| acc.checked_add(r.len))
        .ok_or(PlanError::Overflow)?;
    let n = nodes.len() as u64;
    let share = total / n / align * align;
    if share == 0 {
        return Err(PlanError::TooSmall {
            total,
            nodes: nodes.len(),
            align,
        });
    }
    let mut slices = Vec::with_capacity(nodes.len() + 1);
    for (i, &node) in nodes.iter().enumerate() {
        let start = i as u64 * share;
        let end = if i + 1 == nodes.len() {
            total
        } else {
            start + share
        };
        // Map the RAM offsets start..end through the regions.
        let mut base = 0u64;
        for r in regions {
            let (lo, hi) = (start.max(base), end.min(base + r.len));
            if lo < hi {
                slices.push(NodeSlice {
                    node,
                    guest_addr: r.guest_addr + (lo - base),
                    len: hi - lo,
                });
            }
            base += r.len;
        }
    }
    Ok(slices)
}

/// A piece of one range, the unit of work of a worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunk {
    /// Index into the ranges given to [`plan_chunks`].
    pub range: usize,
    /// Offset into that range, in bytes.
    pub offset: u64,
    /// Length in bytes.
    pub len: u64,
}

/// One range of a node's queue: its chunks are numbered from `first_chunk`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueRange {
    /// Index into the ranges given to [`plan_chunks`].
    pub range: usize,
    /// Length in bytes (never 0: empty ranges have no chunk and are left out).
    pub len: u64,
    /// The queue index of this range's first chunk.
    pub first_chunk: u64,
}

/// The chunks of one node, in the order its workers take them: its ranges
/// in the order given, each cut into chunks of the plan's size. Chunks are
/// computed from their index ([`NodeQueue::chunk`]), never stored, so a
/// queue costs one entry per range however small the chunks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeQueue {
    /// The host node.
    pub node: u32,
    /// Its non-empty ranges, in order.
    pub ranges: Vec<QueueRange>,
    /// How many chunks it has in all.
    pub chunk_count: u64,
    /// Bytes of all its chunks.
    pub bytes: u64,
    /// The chunk size (0: one chunk per range).
    chunk_bytes: u64,
}

impl NodeQueue {
    /// Chunk `i` of the queue, `None` past the end. O(log ranges).
    pub fn chunk(&self, i: u64) -> Option<Chunk> {
        if i >= self.chunk_count {
            return None;
        }
        // The last range whose first chunk is at or before `i`.
        let at = self.ranges.partition_point(|r| r.first_chunk <= i) - 1;
        let r = &self.ranges[at];
        if self.chunk_bytes == 0 {
            return Some(Chunk {
                range: r.range,
                offset: 0,
                len: r.len,
            });
        }
        let offset = (i - r.first_chunk) * self.chunk_bytes;
        Some(Chunk {
            range: r.range,
            offset,
            len: self.chunk_bytes.min(r.len - offset),
        })
    }

    /// All its chunks in order, computed one by one.
    pub fn chunks(&self) -> impl Iterator<Item = Chunk> + '_ {
        (0..self.chunk_count).map_while(|i| self.chunk(i))
    }
}

/// One queue per node; its size grows with the nodes and their ranges, not
/// with the chunks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReclaimPlan {
    /// The queues, by ascending node number.
    pub queues: Vec<NodeQueue>,
}

impl ReclaimPlan {
    /// Total bytes of all chunks.
    pub fn total_bytes(&self) -> u64 {
        self.queues.iter().map(|q| q.bytes).sum()
    }

    /// Total number of chunks.
    pub fn chunk_count(&self) -> u64 {
        self.queues.iter().map(|q| q.chunk_count).sum()
    }
}

/// Cuts each range `(node, len)` into chunks of at most `chunk_bytes` (a
/// `chunk_bytes` of 0 means one chunk per range); one queue per node, in
/// ascending node order, with each node's ranges in the order given. Only
/// counts are computed: O(ranges) time and memory, whatever the chunk size.
pub fn plan_chunks(ranges: &[(u32, u64)], chunk_bytes: u64) -> ReclaimPlan {
    let mut nodes: Vec<u32> = ranges.iter().map(|r| r.0).collect();
    nodes.sort_unstable();
    nodes.dedup();
    let queues = nodes
        .into_iter()
        .map(|node| {
            let mut queue = NodeQueue {
                node,
                ranges: Vec::new(),
                chunk_count: 0,
                bytes: 0,
                chunk_bytes,
            };
            for (range, &(_, len)) in ranges.iter().enumerate().filter(|(_, r)| r.0 == node) {
                if len == 0 {
                    continue;
                }
                queue.ranges.push(QueueRange {
                    range,
                    len,
                    first_chunk: queue.chunk_count,
                });
                queue.chunk_count += if chunk_bytes == 0 {
                    1
                } else {
                    len.div_ceil(chunk_bytes)
                };
                queue.bytes += len;
            }
            queue
        })
        .collect();
    ReclaimPlan { queues }
}

/// Chunks each worker of a node gets, at least, when the chunk is sized by
/// default: more than one, so that a worker that ends early still finds
/// work to steal while the others finish theirs.
pub const CHUNKS_PER_WORKER: u64 = 4;
/// The largest default chunk: 1 GiB (the measured default on large guests,
/// see the config's `reclaim` section; it keeps a terabyte guest's queues
/// short).
pub const MAX_DEFAULT_CHUNK_BYTES: u64 = 1 << 30;
/// The smallest default chunk, and its granule: 2 MiB, one transparent huge
/// page, so that a default chunk never splits one.
pub const MIN_DEFAULT_CHUNK_BYTES: u64 = 2 << 20;

/// The bytes of the node that holds the most of `ranges` (`(node, bytes)`
/// each): what [`default_chunk_bytes`] is given for a whole plan.
pub fn largest_node_bytes(ranges: impl IntoIterator<Item = (u32, u64)>) -> u64 {
    let mut per_node: Vec<(u32, u64)> = Vec::new();
    for (node, len) in ranges {
        match per_node.iter_mut().find(|(n, _)| *n == node) {
            Some((_, b)) => *b = b.saturating_add(len),
            None => per_node.push((node, len)),
        }
    }
    per_node.iter().map(|&(_, b)| b).max().unwrap_or(0)
}

/// The chunk size when none is given, for a node holding `node_bytes` freed
/// by `workers_per_node` workers: the node's bytes cut into
/// [`CHUNKS_PER_WORKER`] chunks per worker, rounded up to 2 MiB, between
/// 2 MiB and 1 GiB. So every worker has chunks to take at every size (a
/// fixed 1 GiB chunk gave a 1 GiB guest one chunk, and all its workers but
/// one nothing), and from `workers * 4` GiB per node up the chunk is the
/// measured 1 GiB. Pass the largest node's bytes: one chunk size serves a
/// whole plan.
pub fn default_chunk_bytes(node_bytes: u64, workers_per_node: u32) -> u64 {
    let parts = u64::from(workers_per_node.max(1)).saturating_mul(CHUNKS_PER_WORKER);
    node_bytes
        .div_ceil(parts)
        .div_ceil(MIN_DEFAULT_CHUNK_BYTES)
        .saturating_mul(MIN_DEFAULT_CHUNK_BYTES)
        .clamp(MIN_DEFAULT_CHUNK_BYTES, MAX_DEFAULT_CHUNK_BYTES)
}

#[cfg(test)]
mod tests {
    use super::super::layout::{ram_regions, MMIO_GAP_END, MMIO_GAP_START};
    use super::*;

    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;

    /// A tiny deterministic PRNG (xorshift64*).
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    fn check_partition(mem: u64, nodes: &[u32], align: u64, slices: &[NodeSlice]) {
        let regions = ram_regions(mem);
        // Cover RAM exactly, in order, never overlapping, never crossing the gap.
        let mut sorted = slices.to_vec();
        sorted.sort_by_key(|s| s.guest_addr);
        assert_eq!(sorted, slices, "slices are in address order");
        let total: u64 = slices.iter().map(|s| s.len).sum();
        assert_eq!(total, mem);
        for w in slices.windows(2) {
            assert!(w[0].guest_addr + w[0].len <= w[1].guest_addr);
        }
        for s in slices {
            assert!(s.len > 0);
            assert_eq!(s.guest_addr % align, 0, "{s:?} aligned to {align:#x}");
            let inside = regions
                .iter()
                .any(|r| s.guest_addr >= r.guest_addr && s.guest_addr + s.len <= r.end());
            assert!(inside, "{s:?} lies inside one RAM region");
            assert!(!(s.guest_addr < MMIO_GAP_END && s.guest_addr + s.len > MMIO_GAP_START));
        }
        // Each node's share is contiguous in RAM and in `nodes` order.
        let order: Vec<u32> = slices.iter().map(|s| s.node).collect();
        let mut dedup = order.clone();
        dedup.dedup();
        assert_eq!(dedup, nodes, "one contiguous share per node, in order");
        // Equal shares except the last.
        let share = |n: u32| -> u64 { slices.iter().filter(|s| s.node == n).map(|s| s.len).sum() };
        let first = share(nodes[0]);
        for &n in &nodes[..nodes.len() - 1] {
            assert_eq!(share(n), first);
            assert_eq!(share(n) % align, 0);
        }
        assert!(share(*nodes.last().unwrap()) >= first);
    }

    #[test]
    fn partition_properties() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let aligns = [2 * MIB, GIB];
        for _ in 0..2000 {
            let align = aligns[rng.below(2) as usize];
            let count = 1 + rng.below(8) as usize;
            let mem = match rng.below(3) {
                0 => (1 + rng.below(64 * 1024)) * MIB,
                1 => (1 + rng.below(2048)) * GIB,
                _ => (1 + rng.below(1 << 26)) * 4096,
            };
            // Node ids: a random increasing sequence with gaps, sometimes reversed.
            let mut nodes: Vec<u32> = Vec::new();
            let mut id = rng.below(3) as u32;
            for _ in 0..count {
                nodes.push(id);
                id += 1 + rng.below(3) as u32;
            }
            if rng.below(2) == 0 {
                nodes.reverse();
            }
            match partition(&ram_regions(mem), &nodes, align) {
                Ok(slices) => check_partition(mem, &nodes, align, &slices),
                Err(PlanError::TooSmall { .. }) => assert!(mem / count as u64 / align == 0),
                Err(e) => panic!("{mem} {nodes:?} {align}: {e}"),
            }
        }
    }

    #[test]
    fn four_gib_on_two_nodes_splits_at_the_gap() {
        let s = partition(&ram_regions(4 * GIB), &[0, 1], GIB).unwrap();
        assert_eq!(
            s,
            vec![
                NodeSlice {
                    node: 0,
                    guest_addr: 0,
                    len: 2 * GIB
                },
                NodeSlice {
                    node: 1,
                    guest_addr: 2 * GIB,
                    len: GIB
                },
                NodeSlice {
                    node: 1,
                    guest_addr: 4 * GIB,
                    len: GIB
                },
            ]
        );
    }

    #[test]
    fn six_gib_on_four_nodes() {
        let s = partition(&ram_regions(6 * GIB), &[0, 1, 2, 3], GIB).unwrap();
        assert_eq!(
            s,
            vec![
                NodeSlice {
                    node: 0,
                    guest_addr: 0,
                    len: GIB
                },
                NodeSlice {
                    node: 1,
                    guest_addr: GIB,
                    len: GIB
                },
                NodeSlice {
                    node: 2,
                    guest_addr: 2 * GIB,
                    len: GIB
                },
                NodeSlice {
                    node: 3,
                    guest_addr: 4 * GIB,
                    len: 3 * GIB
                },
            ]
        );
        check_partition(6 * GIB, &[0, 1, 2, 3], GIB, &s);
    }

    #[test]
    fn partition_errors() {
        let r = ram_regions(GIB);
        assert_eq!(partition(&r, &[], GIB), Err(PlanError::NoNodes));
        assert_eq!(
            partition(&r, &[1, 1], GIB),
            Err(PlanError::DuplicateNode(1))
        );
        assert_eq!(
            partition(&r, &[0], 3 * MIB),
            Err(PlanError::BadAlign(3 * MIB))
        );
        assert_eq!(partition(&r, &[0], 0), Err(PlanError::BadAlign(0)));
        assert!(matches!(
            partition(&r, &[0, 1], GIB),
            Err(PlanError::TooSmall { .. })
        ));
        assert!(partition(&r, &[0, 1], 2 * MIB).is_ok());
        let huge = [
            RamRegion {
                guest_addr: 0,
                len: u64::MAX,
            },
            RamRegion {
                guest_addr: 0,
                len: 1,
            },
        ];
        assert_eq!(partition(&huge, &[0], GIB), Err(PlanError::Overflow));
        assert!(partition(&[], &[0], GIB).is_err());
    }

    #[test]
    fn chunk_properties() {
        let mut rng = Rng(42);
        for _ in 0..2000 {
            let count = rng.below(10) as usize;
            let ranges: Vec<(u32, u64)> = (0..count)
                .map(|_| {
                    (
                        rng.below(4) as u32,
                        rng.below(64) * MIB + rng.below(4) * 4096,
                    )
                })
                .collect();
            let chunk = (1 + rng.below(16)) * MIB;
            let plan = plan_chunks(&ranges, chunk);
            let ids: Vec<u32> = plan.queues.iter().map(|q| q.node).collect();
            let mut want: Vec<u32> = ranges.iter().map(|r| r.0).collect();
            want.sort_unstable();
            want.dedup();
            assert_eq!(ids, want);
            for (i, &(node, len)) in ranges.iter().enumerate() {
                let q = plan.queues.iter().find(|q| q.node == node).unwrap();
                let mut next = 0;
                for c in q.chunks().filter(|c| c.range == i) {
                    assert_eq!(c.offset, next, "contiguous, no overlap");
                    assert!(c.len > 0 && c.len <= chunk);
                    next += c.len;
                }
                assert_eq!(next, len, "range {i} covered exactly");
            }
            let total: u64 = ranges.iter().map(|r| r.1).sum();
            assert_eq!(plan.total_bytes(), total);
            let counted: u64 = plan.queues.iter().map(|q| q.chunks().count() as u64).sum();
            assert_eq!(plan.chunk_count(), counted);
            for q in &plan.queues {
                assert_eq!(q.chunk(q.chunk_count), None, "nothing past the end");
                assert_eq!(q.bytes, q.chunks().map(|c| c.len).sum::<u64>());
            }
        }
    }

    /// Heap bytes a plan holds: its vectors' capacities.
    fn heap_bytes(plan: &ReclaimPlan) -> usize {
        plan.queues.capacity() * std::mem::size_of::<NodeQueue>()
            + plan
                .queues
                .iter()
                .map(|q| q.ranges.capacity() * std::mem::size_of::<QueueRange>())
                .sum::<usize>()
    }

    #[test]
    fn a_64_tib_plan_of_2_mib_chunks_grows_with_nodes_not_chunks() {
        const TIB: u64 = 1 << 40;
        let slices = partition(&ram_regions(64 * TIB), &[0, 1, 2, 3, 4, 5, 6, 7], GIB).unwrap();
        let ranges: Vec<(u32, u64)> = slices.iter().map(|s| (s.node, s.len)).collect();
        // A per-chunk plan would hold 33.5 M entries (~0.8 GB); this one holds
        // one entry per range.
        let plan = plan_chunks(&ranges, 2 * MIB);
        assert_eq!(plan.chunk_count(), 64 * TIB / (2 * MIB));
        assert_eq!(plan.chunk_count(), 33_554_432);
        assert_eq!(plan.total_bytes(), 64 * TIB);
        assert_eq!(plan.queues.len(), 8);
        assert_eq!(
            plan.queues.iter().map(|q| q.ranges.len()).sum::<usize>(),
            slices.len()
        );
        assert!(heap_bytes(&plan) < 2048, "{} bytes", heap_bytes(&plan));
        // Node 0's slice crosses the MMIO gap: two ranges, chunks continue
        // from one to the next.
        let q0 = &plan.queues[0];
        assert_eq!(q0.ranges.len(), 2);
        let first_of_second = q0.ranges[1].first_chunk;
        assert_eq!(first_of_second, 3 * GIB / (2 * MIB));
        assert_eq!(
            q0.chunk(first_of_second - 1),
            Some(Chunk {
                range: 0,
                offset: 3 * GIB - 2 * MIB,
                len: 2 * MIB
            })
        );
        assert_eq!(
            q0.chunk(first_of_second),
            Some(Chunk {
                range: 1,
                offset: 0,
                len: 2 * MIB
            })
        );
        let last = plan.queues[7]
            .chunk(plan.queues[7].chunk_count - 1)
            .unwrap();
        assert_eq!(last.offset + last.len, ranges[last.range].1);
        // With 4 KiB chunks (2^34 of them, 400 GB as a list) the plan is
        // the same size: planning never walks the chunks.
        let plan = plan_chunks(&ranges, 4096);
        assert_eq!(plan.chunk_count(), 64 * TIB / 4096);
        assert!(heap_bytes(&plan) < 2048);
    }

    #[test]
    fn zero_chunk_size_is_one_chunk_per_range() {
        let plan = plan_chunks(&[(0, 5 * MIB), (0, 0)], 0);
        assert_eq!(
            plan.queues[0].ranges.len(),
            1,
            "the empty range is left out"
        );
        assert_eq!(
            plan.queues[0].chunks().collect::<Vec<_>>(),
            vec![Chunk {
                range: 0,
                offset: 0,
                len: 5 * MIB
            }]
        );
    }

    #[test]
    fn the_default_chunk_gives_every_worker_chunks_at_every_size() {
        // Written out: a 1 GiB node freed by 1, 2, 4 workers.
        assert_eq!(default_chunk_bytes(GIB, 1), 256 * MIB);
        assert_eq!(default_chunk_bytes(GIB, 2), 128 * MIB);
        assert_eq!(default_chunk_bytes(GIB, 4), 64 * MIB);
        // From 8 GiB with 2 workers up, the measured 1 GiB, and no more.
        assert_eq!(default_chunk_bytes(8 * GIB, 2), GIB);
        assert_eq!(default_chunk_bytes(64 << 40, 2), GIB);
        // Tiny nodes: 2 MiB, never 0; rounded up to 2 MiB.
        assert_eq!(default_chunk_bytes(0, 4), 2 * MIB);
        assert_eq!(default_chunk_bytes(MIB, 4), 2 * MIB);
        assert_eq!(default_chunk_bytes(3 * GIB, 8), 96 * MIB);
        assert_eq!(default_chunk_bytes(100 * MIB, 1), 26 * MIB);
        // No workers is taken as one, and huge counts do not overflow.
        assert_eq!(default_chunk_bytes(GIB, 0), 256 * MIB);
        assert_eq!(default_chunk_bytes(u64::MAX, u32::MAX), GIB);

        let mut rng = Rng(7);
        for _ in 0..5000 {
            let node_bytes = rng.below(1 << 20) * MIB / (1 + rng.below(64));
            let workers = 1 + rng.below(64) as u32;
            let chunk = default_chunk_bytes(node_bytes, workers);
            assert_eq!(chunk % (2 * MIB), 0, "{node_bytes} {workers}");
            assert!((2 * MIB..=GIB).contains(&chunk), "{node_bytes} {workers}");
            let chunks = plan_chunks(&[(0, node_bytes)], chunk).chunk_count();
            if node_bytes >= u64::from(workers) * CHUNKS_PER_WORKER * 2 * MIB && chunk < GIB {
                // Each worker has chunks to spare (rounding up to 2 MiB
                // can halve the count, no more).
                assert!(
                    chunks >= u64::from(workers) * CHUNKS_PER_WORKER / 2,
                    "{node_bytes} {workers}: {chunks} chunks of {chunk}"
                );
            }
            if node_bytes >= u64::from(workers) * 2 * MIB {
                assert!(chunks >= u64::from(workers), "{node_bytes} {workers}");
            }
        }
    }
}
