//! Tests of the discard pool on plain mappings (no KVM).

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;

use vm_memory::{Bytes, GuestAddress};

use super::super::numa::HostNode;
use super::super::options::{Backing, MemoryOptions, NumaPolicy, PageSize};
use super::super::progress::ReclaimProgress;
use super::super::reclaim::{ReclaimError, ReclaimOptions};
use super::*;

const KIB: u64 = 1 << 10;
const GIB: u64 = 1 << 30;
/// How long a test waits for what must happen (a failure, never a pace).
const PATIENCE: Duration = Duration::from_secs(30);

fn real() -> HostTopology {
    HostTopology::from_sysfs(Path::new("/sys")).unwrap()
}

/// A fake 2-node host whose nodes' CPUs are real CPUs of this process.
fn two_nodes() -> HostTopology {
    let cpus = sys::get_affinity().unwrap();
    HostTopology {
        nodes: (0..2)
            .map(|id| HostNode {
                id,
                cpus: vec![cpus[id as usize % cpus.len()]],
                mem_total_bytes: GIB,
            })
            .collect(),
        source: crate::memory::numa::TopologySource::Sysfs("(built by a test)".into()),
    }
}

fn memory(mib: u64, backing: Backing, topology: &HostTopology) -> GuestMemory {
    let opts = MemoryOptions {
        mem_bytes: mib << 20,
        page_size: PageSize::Small,
        backing,
        policy: NumaPolicy::None,
        ..MemoryOptions::default()
    };
    GuestMemory::new(&opts, topology).unwrap()
}

/// The host address of guest address `addr`.
fn host(m: &GuestMemory, addr: u64) -> usize {
    let s = m
        .slices()
        .iter()
        .find(|s| s.slice().guest_addr <= addr && addr < s.slice().guest_addr + s.slice().len)
        .unwrap();
    s.host_addr() + (addr - s.slice().guest_addr) as usize
}

/// Resident bytes of guest `addr..addr+len` (inside one slice).
fn resident(m: &GuestMemory, addr: u64, len: u64) -> u64 {
    sys::resident_bytes(host(m, addr), len as usize, &mut Vec::new()).unwrap()
}

/// Writes a non-zero word into every 4 KiB page of guest `addr..addr+len`.
fn touch(m: &GuestMemory, addr: u64, len: u64) {
    let view = m.view();
    for a in (addr..addr + len).step_by(4096) {
        view.write_obj(0xdead_beef_u64, GuestAddress(a)).unwrap();
    }
}

/// Whether every 4 KiB page of guest `addr..addr+len` reads zero.
fn reads_zero(m: &GuestMemory, addr: u64, len: u64) -> bool {
    let view = m.view();
    (addr..addr + len)
        .step_by(4096)
        .all(|a| view.read_obj::<u64>(GuestAddress(a)).unwrap() == 0)
}

/// `discard`, returning the outcome, whether `done` ran before `discard`
/// returned, and the name of the thread that ran it.
fn discard_and_wait(pool: &DiscardPool, ranges: &[GuestRange]) -> (DiscardOutcome, bool, String) {
    let (tx, rx) = mpsc::channel();
    let returned = Arc::new(AtomicBool::new(false));
    let seen = returned.clone();
    pool.discard(
        ranges,
        Box::new(move |o| {
            let name = std::thread::current().name().unwrap_or("").to_string();
            tx.send((o, !seen.load(Ordering::SeqCst), name)).unwrap();
        }),
    );
    returned.store(true, Ordering::SeqCst);
    rx.recv_timeout(PATIENCE).expect("done was called")
}

/// The guest range of `len` bytes at `gpa`.
fn range(gpa: u64, len: u64) -> GuestRange {
    GuestRange::new(gpa, len)
}

fn start(m: &GuestMemory, topology: &HostTopology, opts: DiscardOptions) -> DiscardPool {
    DiscardPool::start(m, topology, &opts).unwrap()
}

#[test]
fn a_small_batch_is_freed_inline_and_reads_zero() {
    let topo = real();
    let m = memory(64, Backing::Anonymous, &topo);
    touch(&m, 0, 4 << 20);
    let pool = start(&m, &topo, DiscardOptions::default());
    assert_eq!(pool.page_bytes(), sys::page_size() as u64);
    // 768 KiB in three ranges, two of them adjacent (one call for those).
    let ranges = [
        range(0x10_0000, 0x8_0000),
        range(0x18_0000, 0x2_0000),
        range(0x30_0000, 0x2_0000),
    ];
    let (o, before_return, thread) = discard_and_wait(&pool, &ranges);
    assert!(before_return, "inline: done ran inside discard");
    assert!(!thread.starts_with("discard-"), "{thread}");
    assert_eq!(
        o,
        DiscardOutcome {
            bytes_freed: 0xc_0000,
            ranges: 3,
            failed: 0,
            refused_bytes: 0,
            unaligned_bytes: 0,
        }
    );
    assert_eq!(resident(&m, 0x10_0000, 0xa_0000), 0);
    assert_eq!(resident(&m, 0x30_0000, 0x2_0000), 0);
    assert_eq!(resident(&m, 0, 0x10_0000), 0x10_0000, "the rest is kept");
    assert_eq!(resident(&m, 0x1a_0000, 0x16_0000), 0x16_0000);
    assert!(reads_zero(&m, 0x10_0000, 0xa_0000));
    assert!(reads_zero(&m, 0x30_0000, 0x2_0000));
    assert!(!reads_zero(&m, 0xc_0000, 0x1000));
    let s = pool.snapshot();
    assert_eq!(s.bytes_discarded, 0xc_0000);
    assert_eq!(
        s.per_node,
        vec![NodeDiscard {
            node: 0,
            bytes: 0xc_0000
        }]
    );
    assert_eq!((s.ranges, s.batches, s.calls), (3, 1, 2));
    assert_eq!((s.inline_parts, s.worker_parts, s.failures), (2, 0, 0));
    assert_eq!(s.in_flight_batches, 0);
    assert!(s.busy_ns > 0 && s.rate_bytes_per_sec > 0.0, "{s:?}");
    pool.shutdown(Instant::now() + PATIENCE).unwrap();
}

#[test]
fn a_large_batch_is_freed_by_the_node_workers() {
    let topo = real();
    let m = memory(256, Backing::Anonymous, &topo);
    touch(&m, 0, 200 << 20);
    let pool = start(
        &m,
        &topo,
        DiscardOptions {
            workers_per_node: 2,
            ..DiscardOptions::default()
        },
    );
    let (o, before_return, thread) = discard_and_wait(&pool, &[range(0, 192 << 20)]);
    assert!(thread.starts_with("discard-n0-"), "{thread}");
    let _ = before_return; // a worker may finish before discard returns
    assert_eq!((o.bytes_freed, o.failed), (192 << 20, 0));
    assert_eq!(resident(&m, 0, 192 << 20), 0);
    assert_eq!(resident(&m, 192 << 20, 8 << 20), 8 << 20);
    assert!(reads_zero(&m, 0, 192 << 20));
    let s = pool.snapshot();
    assert_eq!(s.calls, 3, "parts of {PART_BYTES} bytes");
    assert_eq!(s.worker_parts + s.inline_parts, 3);
    assert!(s.worker_parts >= 1, "{s:?}");
    pool.shutdown(Instant::now() + PATIENCE).unwrap();
}

#[test]
fn serial_makes_one_call_per_range_on_the_caller() {
    let topo = real();
    let m = memory(256, Backing::Anonymous, &topo);
    touch(&m, 0, 200 << 20);
    let pool = start(
        &m,
        &topo,
        DiscardOptions {
            workers_per_node: 0,
            serial: true,
            ..DiscardOptions::default()
        },
    );
    // 32 adjacent 4 MiB ranges, top down (as the firmware reports), one of
    // them unaligned at both ends, one half past the end of RAM, and a
    // 100 MiB range larger than a part: 35 ranges, 35 calls, all inline.
    let mut ranges: Vec<GuestRange> = (0..32u64)
        .rev()
        .map(|i| range(i * (4 << 20), 4 << 20))
        .collect();
    ranges.push(range(130 << 20 | 0x800, (1 << 20) - 0x1000));
    ranges.push(range(100 << 20, 100 << 20));
    ranges.push(range(255 << 20, 2 << 20));
    let (o, before_return, thread) = discard_and_wait(&pool, &ranges);
    assert!(before_return, "serial: done ran inside discard");
    assert!(!thread.starts_with("discard-"), "{thread}");
    assert_eq!((o.ranges, o.failed), (35, 0));
    assert_eq!(o.refused_bytes, 1 << 20);
    assert_eq!(o.unaligned_bytes, 0x1000 - 0x800 + 0x800);
    assert_eq!(resident(&m, 0, 200 << 20), 0);
    assert!(reads_zero(&m, 0, 200 << 20));
    let s = pool.snapshot();
    assert_eq!((s.calls, s.inline_parts, s.worker_parts), (35, 35, 0));
    assert_eq!(s.in_flight_batches, 0);
    pool.shutdown(Instant::now() + PATIENCE).unwrap();
    // Not serial: the same ranges merged, cut into parts of PART_BYTES.
    touch(&m, 0, 200 << 20);
    let pool = start(&m, &topo, DiscardOptions::default());
    let (o, _, _) = discard_and_wait(&pool, &ranges);
    assert_eq!(o.failed, 0);
    let s = pool.snapshot();
    assert_eq!(s.calls, 200 / 64 + 1 + 1, "{s:?}");
    pool.shutdown(Instant::now() + PATIENCE).unwrap();
}

#[test]
fn two_nodes_count_apart_and_a_range_over_both_counts_in_both() {
    let topo = two_nodes();
    let m = memory(256, Backing::Anonymous, &topo);
    let half = 128u64 << 20;
    assert_eq!(m.slices()[1].slice().guest_addr, half);
    touch(&m, half - (2 << 20), 4 << 20);
    let names = Arc::new(Mutex::new(Vec::new()));
    let seen = names.clone();
    let pool = start(
        &m,
        &topo,
        DiscardOptions {
            workers_per_node: 2,
            on_worker_start: Some(Arc::new(move |n: &str| {
                seen.lock().unwrap().push(n.to_string())
            })),
            ..DiscardOptions::default()
        },
    );
    // Across the slice end (inline), and past the end of RAM.
    let (o, _, _) = discard_and_wait(
        &pool,
        &[
            range(half - (1 << 20), 2 << 20),
            range((256 << 20) - 4096, 8192),
        ],
    );
    assert_eq!((o.bytes_freed, o.refused_bytes), ((2 << 20) + 4096, 4096));
    assert_eq!(resident(&m, half - (1 << 20), 1 << 20), 0);
    assert_eq!(resident(&m, half, 1 << 20), 0);
    assert_eq!(resident(&m, half - (2 << 20), 1 << 20), 1 << 20);
    assert_eq!(resident(&m, half + (1 << 20), 1 << 20), 1 << 20);
    let s = pool.snapshot();
    assert_eq!(
        s.per_node,
        vec![
            NodeDiscard {
                node: 0,
                bytes: 1 << 20
            },
            NodeDiscard {
                node: 1,
                bytes: (1 << 20) + 4096
            },
        ]
    );
    assert_eq!(s.refused_bytes, 4096);
    // A large batch over both nodes goes to both nodes' queues.
    let (o, _, _) = discard_and_wait(&pool, &[range(0, 256 << 20)]);
    assert_eq!(o.bytes_freed, 256 << 20);
    let s = pool.snapshot();
    assert_eq!(s.calls, 3 + 4, "2 parts of 64 MiB per node");
    assert_eq!(
        s.per_node,
        vec![
            NodeDiscard {
                node: 0,
                bytes: (1 << 20) + half
            },
            NodeDiscard {
                node: 1,
                bytes: (1 << 20) + 4096 + half
            },
        ]
    );
    pool.shutdown(Instant::now() + PATIENCE).unwrap();
    // Every worker ran its start hook before it could take a part.
    let mut names = names.lock().unwrap().clone();
    names.sort();
    assert_eq!(
        names,
        [
            "discard-n0-0",
            "discard-n0-1",
            "discard-n1-0",
            "discard-n1-1"
        ]
    );
}

#[test]
fn ranges_outside_ram_and_in_the_mmio_gap_are_refused() {
    let topo = real();
    // RAM to 3 GiB, then 64 MiB from 4 GiB: nothing is touched but these.
    let m = memory(3 * 1024 + 64, Backing::Anonymous, &topo);
    let (gap, high) = (3 * GIB, 4 * GIB);
    let end = high + (64 << 20);
    for a in [gap - 8192, high, end - 8192] {
        touch(&m, a, 8192);
    }
    let pool = start(&m, &topo, DiscardOptions::default());
    let ranges = [
        range(gap - 4096, GIB + 8192), // the last page below the gap, the gap, the first above
        range(end - 4096, 1 << 20),    // the last page of RAM, then beyond
        range(gap + 4096, 4096),       // in the gap only
        range(u64::MAX - 4095, 8192),  // wraps around the address space
        range(1 << 50, 1 << 40),       // far beyond
    ];
    let (o, _, _) = discard_and_wait(&pool, &ranges);
    assert_eq!(o.bytes_freed, 3 * 4096);
    assert_eq!(
        o.refused_bytes,
        GIB + ((1 << 20) - 4096) + 4096 + 8192 + (1 << 40)
    );
    assert_eq!(resident(&m, gap - 4096, 4096), 0);
    assert_eq!(
        resident(&m, gap - 8192, 4096),
        4096,
        "its neighbour is kept"
    );
    assert_eq!(resident(&m, high, 4096), 0, "the first page above the gap");
    assert_eq!(
        resident(&m, high + 4096, 4096),
        4096,
        "its neighbour is kept"
    );
    assert_eq!(resident(&m, end - 4096, 4096), 0);
    assert_eq!(resident(&m, end - 8192, 4096), 4096);
    // Nothing in the translation ever leaves guest RAM.
    let t = pool.shared().table.translate(&ranges);
    for p in &t.pieces {
        let GuestRange { gpa: a, len: l } = pool.shared().table.guest_range(p);
        let e = &pool.shared().table.entries[p.entry];
        assert!(a >= e.guest_addr && a + l <= e.guest_end());
        assert!(!(a < high && a + l > gap), "{a:#x}+{l:#x} in the gap");
    }
    pool.shutdown(Instant::now() + PATIENCE).unwrap();
}

#[test]
fn huge_page_size_frees_only_whole_pages() {
    let topo = real();
    let m = memory(64, Backing::Anonymous, &topo);
    touch(&m, 0, 16 << 20);
    let pool = start(
        &m,
        &topo,
        DiscardOptions {
            min_page_bytes: 2 << 20,
            ..DiscardOptions::default()
        },
    );
    assert_eq!(pool.page_bytes(), 2 << 20);
    let mib = 1u64 << 20;
    // 1..5 MiB holds one whole 2 MiB page (2..4); 6..7 and 7..8 together
    // make the page 6..8; 9..10.5 holds none.
    let ranges = [
        range(mib, 4 * mib),
        range(6 * mib, mib),
        range(7 * mib, mib),
        range(9 * mib, 3 * mib / 2),
    ];
    let (o, _, _) = discard_and_wait(&pool, &ranges);
    assert_eq!(o.bytes_freed, 4 * mib);
    assert_eq!(o.unaligned_bytes, 2 * mib + 3 * mib / 2);
    assert_eq!(resident(&m, 2 * mib, 2 * mib), 0);
    assert_eq!(resident(&m, 6 * mib, 2 * mib), 0);
    assert_eq!(resident(&m, 0, 2 * mib), 2 * mib, "partial page kept");
    assert_eq!(resident(&m, 4 * mib, 2 * mib), 2 * mib, "partial page kept");
    assert_eq!(
        resident(&m, 8 * mib, 4 * mib),
        4 * mib,
        "partial pages kept"
    );
    assert!(!reads_zero(&m, mib, 4096));
    assert_eq!(pool.snapshot().unaligned_bytes, o.unaligned_bytes);
    let e = DiscardPool::start(
        &m,
        &topo,
        &DiscardOptions {
            min_page_bytes: 3 * mib,
            ..DiscardOptions::default()
        },
    )
    .unwrap_err();
    assert!(matches!(e, DiscardError::InvalidOptions(_)), "{e}");
    pool.shutdown(Instant::now() + PATIENCE).unwrap();
}

#[test]
fn memfd_backing_punches_holes_split_at_stripes() {
    use std::os::unix::fs::MetadataExt;
    let topo = real();
    // 17 stripes: 16 of 128 MiB, one of 64 MiB; 1 GiB is the boundary
    // between the eighth (7) and the ninth (8).
    let m = memory(2048 + 64, Backing::Memfd, &topo);
    let stripes = m.slices()[0].stripes();
    assert_eq!(stripes.len(), 17);
    let blocks = |i: usize| stripes[i + 7].file.metadata().unwrap().blocks() * 512;
    let mib = 1u64 << 20;
    touch(&m, GIB - 4 * mib, 8 * mib);
    assert_eq!((blocks(0), blocks(1)), (4 * mib, 4 * mib));
    // Below the threshold (inline), then above it (workers), each over the
    // stripe boundary.
    let pool = pool_for(&m, &topo);
    let (o, inline, _) = discard_and_wait(&pool, &[range(GIB - mib / 4, mib / 2)]);
    assert!(inline);
    assert_eq!(o.bytes_freed, mib / 2);
    assert_eq!(
        (blocks(0), blocks(1)),
        (4 * mib - mib / 4, 4 * mib - mib / 4)
    );
    let (o, _, thread) = discard_and_wait(&pool, &[range(GIB - 4 * mib, 8 * mib)]);
    // The worker half: 8 MiB is above the threshold, so both stripes'
    // parts went to the node's worker, which ended the batch.
    assert!(thread.starts_with("discard-n"), "{thread}");
    let s = pool.snapshot();
    assert_eq!((s.inline_parts, s.worker_parts), (2, 2), "{s:?}");
    assert_eq!(o.bytes_freed, 8 * mib);
    assert_eq!((blocks(0), blocks(1)), (0, 0));
    assert_eq!(pool.snapshot().calls, 4, "one hole per stripe and batch");
    assert!(reads_zero(&m, GIB - 4 * mib, 8 * mib));
    assert_eq!(
        stripes[7].file.metadata().unwrap().len(),
        128 * mib,
        "size kept"
    );
    pool.shutdown(Instant::now() + PATIENCE).unwrap();
}

fn pool_for(m: &GuestMemory, topo: &HostTopology) -> DiscardPool {
    start(m, topo, DiscardOptions::default())
}

/// Options whose workers wait at start until `release` is sent to.
fn held_workers() -> (DiscardOptions, mpsc::Sender<()>) {
    let (tx, rx) = mpsc::channel::<()>();
    let rx = Mutex::new(rx);
    let opts = DiscardOptions {
        on_worker_start: Some(Arc::new(move |_: &str| {
            let _ = rx.lock().unwrap().recv();
        })),
        ..DiscardOptions::default()
    };
    (opts, tx)
}

#[test]
fn a_deflate_waits_for_pages_still_being_freed() {
    let topo = real();
    let m = memory(64, Backing::Anonymous, &topo);
    touch(&m, 0, 32 << 20);
    let (opts, release) = held_workers();
    let pool = start(&m, &topo, opts);
    let (tx, rx) = mpsc::channel();
    // Acknowledged at once (an inflate), freed behind by the held worker.
    pool.discard(
        &[range(0, 16 << 20)],
        Box::new(move |o| tx.send(o).unwrap()),
    );
    assert!(rx.try_recv().is_err(), "queued, not freed yet");
    let soon = Instant::now() + Duration::from_millis(20);
    let e = pool
        .wait_overlapping(&[range(8 << 20, 4096)], soon)
        .unwrap_err();
    assert!(
        matches!(e, DiscardError::StillInFlight { batches: 1 }),
        "{e}"
    );
    assert!(pool.wait_idle(soon).is_err());
    assert_eq!(pool.snapshot().in_flight_batches, 1);
    // Other pages are not waited for.
    pool.wait_overlapping(&[range(16 << 20, 4 << 20)], Instant::now())
        .unwrap();
    release.send(()).unwrap();
    pool.wait_overlapping(&[range(8 << 20, 4096)], Instant::now() + PATIENCE)
        .unwrap();
    // Freed before the wait returned (`done` may run just after).
    assert_eq!(resident(&m, 0, 16 << 20), 0);
    assert_eq!(rx.recv_timeout(PATIENCE).unwrap().bytes_freed, 16 << 20);
    pool.wait_idle(Instant::now()).unwrap();
    pool.shutdown(Instant::now() + PATIENCE).unwrap();
}

#[test]
fn shutdown_releases_the_view_so_reclaim_runs() {
    let topo = real();
    let m = memory(128, Backing::Anonymous, &topo);
    touch(&m, 0, 64 << 20);
    let pool = pool_for(&m, &topo);
    let (o, _, _) = discard_and_wait(&pool, &[range(0, 32 << 20)]);
    assert_eq!(o.bytes_freed, 32 << 20);
    pool.shutdown(Instant::now() + PATIENCE).unwrap();
    let r = m
        .reclaim(&ReclaimOptions::default(), &topo, &ReclaimProgress::new())
        .unwrap();
    assert_eq!(r.resident_bytes_freed, 32 << 20, "what was left");
}

#[test]
fn a_worker_left_behind_at_shutdown_keeps_the_memory_mapped() {
    let topo = real();
    let m = memory(64, Backing::Anonymous, &topo);
    touch(&m, 0, 8 << 20);
    let addr = m.slices()[0].host_addr();
    let (opts, release) = held_workers();
    let pool = start(&m, &topo, opts);
    let (tx, rx) = mpsc::channel();
    pool.discard(&[range(0, 8 << 20)], Box::new(move |o| tx.send(o).unwrap()));
    let e = pool
        .shutdown(Instant::now() + Duration::from_millis(20))
        .unwrap_err();
    assert!(
        matches!(&e, DiscardError::WorkersLeftBehind { names } if names == &["discard-n0-0"]),
        "{e}"
    );
    // What was queued ends as not freed, and is acknowledged as such.
    let o = rx.try_recv().unwrap();
    assert_eq!((o.bytes_freed, o.failed), (0, 1));
    // The worker still holds the view: reclaim refuses, nothing is unmapped.
    let e = m
        .reclaim(&ReclaimOptions::default(), &topo, &ReclaimProgress::new())
        .unwrap_err();
    assert!(matches!(e, ReclaimError::ViewStillHeld { .. }), "{e}");
    assert!(sys::resident_bytes(addr, 4096, &mut Vec::new()).is_ok());
    // Let it go: it finds the pool stopped and ends (unmapping the memory).
    release.send(()).unwrap();
}

#[test]
fn bad_options_are_refused() {
    let topo = real();
    let m = memory(16, Backing::Anonymous, &topo);
    for opts in [
        DiscardOptions {
            workers_per_node: 0,
            ..DiscardOptions::default()
        },
        DiscardOptions {
            queue_depth: 0,
            ..DiscardOptions::default()
        },
    ] {
        let e = DiscardPool::start(&m, &topo, &opts).unwrap_err();
        assert!(matches!(e, DiscardError::InvalidOptions(_)), "{e}");
    }
}

#[test]
fn a_full_queue_frees_on_the_caller() {
    let topo = real();
    let m = memory(512, Backing::Anonymous, &topo);
    touch(&m, 0, 256 << 20);
    let (mut opts, release) = held_workers();
    opts.queue_depth = 1;
    let pool = start(&m, &topo, opts);
    let (tx, rx) = mpsc::channel();
    // Four parts: one is queued, three are freed here.
    pool.discard(
        &[range(0, 256 << 20)],
        Box::new(move |o| tx.send(o).unwrap()),
    );
    let s = pool.snapshot();
    assert_eq!((s.inline_parts, s.worker_parts), (3, 0));
    assert_eq!(resident(&m, 64 << 20, 192 << 20), 0);
    assert!(rx.try_recv().is_err(), "one part still queued");
    release.send(()).unwrap();
    assert_eq!(rx.recv_timeout(PATIENCE).unwrap().bytes_freed, 256 << 20);
    assert_eq!(resident(&m, 0, 64 << 20), 0);
    pool.shutdown(Instant::now() + PATIENCE).unwrap();
}

/// The measurement behind [`INLINE_THRESHOLD_BYTES`]: one
/// `madvise(MADV_DONTNEED)` of touched 4 KiB pages per size, against a
/// hand-off to a parked worker and back. Run with
/// `cargo test --release --lib inline_threshold_measurement -- --ignored --nocapture`.
#[test]
#[ignore]
fn inline_threshold_measurement() {
    let topo = real();
    let m = memory(64, Backing::Anonymous, &topo);
    let host = m.slices()[0].host_addr();
    for kib in [4u64, 64, 256, 1024, 2048, 4096, 16384] {
        let len = kib * KIB;
        let mut best = Duration::MAX;
        for _ in 0..20 {
            touch(&m, 0, len);
            let t = Instant::now();
            // SAFETY: our own test guest, nothing else uses it.
            unsafe { sys::madvise(host, len as usize, libc::MADV_DONTNEED) }.unwrap();
            best = best.min(t.elapsed());
        }
        eprintln!("madvise(MADV_DONTNEED) of {kib} KiB touched: {best:?}");
    }
    // A hand-off: queue a 4 KiB part to a parked worker, wait for done.
    let pool = start(
        &m,
        &topo,
        DiscardOptions {
            inline_threshold_bytes: 0,
            ..DiscardOptions::default()
        },
    );
    let mut times = Vec::new();
    for _ in 0..50 {
        let t = Instant::now();
        let (tx, rx) = mpsc::channel();
        pool.discard(&[range(0, 4096)], Box::new(move |_| tx.send(()).unwrap()));
        rx.recv().unwrap();
        times.push(t.elapsed());
    }
    times.sort();
    eprintln!(
        "hand-off of a 4 KiB part and back: median {:?}, best {:?}",
        times[times.len() / 2],
        times[0]
    );
    pool.shutdown(Instant::now() + PATIENCE).unwrap();
}

#[test]
fn the_pool_is_shared_between_threads() {
    fn check<T: Send + Sync>() {}
    check::<DiscardPool>();
    check::<DiscardOptions>();
}

#[test]
fn a_slow_discard_frees_after_its_delay_and_a_cancel_ends_it_unfreed() {
    let topo = real();
    let m = memory(64, Backing::Anonymous, &topo);
    touch(&m, 0, 8 << 20);
    let delay = Duration::from_millis(300);
    let opts = DiscardOptions {
        delay_before_free: delay,
        ..DiscardOptions::default()
    };
    let pool = start(&m, &topo, opts);
    // Inline (64 KiB) and on a worker (4 MiB): each waits, then frees.
    for (addr, len) in [(0, 64 * KIB), (4 << 20, 4 << 20)] {
        let t = Instant::now();
        let (o, _, _) = discard_and_wait(&pool, &[range(addr, len)]);
        assert!(t.elapsed() >= delay, "{:?}", t.elapsed());
        assert_eq!((o.bytes_freed, o.failed), (len, 0));
        assert!(reads_zero(&m, addr, len));
    }
    // A worker waiting out its delay: cancelled, it gives up at once and
    // frees nothing, and the batch ends (failed).
    touch(&m, 16 << 20, 4 << 20);
    let (tx, rx) = mpsc::channel();
    pool.discard(
        &[range(16 << 20, 4 << 20)],
        Box::new(move |o| tx.send(o).unwrap()),
    );
    let t = Instant::now();
    pool.cancel();
    let o = rx.recv_timeout(PATIENCE).unwrap();
    assert!(t.elapsed() < delay, "{:?}", t.elapsed());
    assert_eq!((o.bytes_freed, o.failed), (0, 1));
    assert_eq!(resident(&m, 16 << 20, 4 << 20), 4 << 20, "not freed");
    // Later discards free nothing either; the shutdown is prompt.
    let (o, _, _) = discard_and_wait(&pool, &[range(16 << 20, 64 * KIB)]);
    assert_eq!(o.bytes_freed, 0);
    let t = Instant::now();
    pool.shutdown(Instant::now() + PATIENCE).unwrap();
    assert!(t.elapsed() < delay, "{:?}", t.elapsed());
}

#[test]
fn a_prelude_runs_on_a_worker_before_any_part_and_its_fence_holds_until_done() {
    let topo = real();
    let m = memory(64, Backing::Anonymous, &topo);
    touch(&m, 0, 32 << 20);
    let (opts, release) = held_workers();
    let pool = start(&m, &topo, opts);
    let (tx, rx) = mpsc::channel();
    // What the prelude saw: its thread, and whether the batch's pages were
    // still there (nothing freed before it).
    let (ptx, prx) = mpsc::channel();
    let view = m.view();
    pool.discard_after(
        &[range(0, 16 << 20)],
        // The fence: a range the batch does not free (an emptied slot).
        &[range(16 << 20, 16 << 20)],
        Box::new(move || {
            let name = std::thread::current().name().unwrap_or("").to_string();
            let untouched = (0..16u64 << 20)
                .step_by(4096)
                .all(|a| view.read_obj::<u64>(GuestAddress(a)).unwrap() == 0xdead_beef);
            ptx.send((name, untouched)).unwrap();
        }),
        Box::new(move |o| tx.send(o).unwrap()),
    );
    // The caller returned with the workers held: the prelude has not run.
    assert!(prx.try_recv().is_err(), "the prelude ran on the caller");
    let soon = Instant::now() + Duration::from_millis(20);
    assert!(
        pool.wait_overlapping(&[range(20 << 20, 4096)], soon)
            .is_err(),
        "the fence covers a range the batch does not free"
    );
    pool.wait_overlapping(&[range(32 << 20, 4 << 20)], Instant::now())
        .unwrap();
    release.send(()).unwrap();
    let (thread, untouched) = prx.recv_timeout(PATIENCE).unwrap();
    assert!(thread.starts_with("discard-"), "{thread}");
    assert!(untouched, "a part was freed before the prelude ran");
    assert_eq!(rx.recv_timeout(PATIENCE).unwrap().bytes_freed, 16 << 20);
    pool.wait_overlapping(&[range(20 << 20, 4096)], Instant::now() + PATIENCE)
        .unwrap();
    assert!(reads_zero(&m, 0, 16 << 20));
    assert_eq!(resident(&m, 16 << 20, 16 << 20), 16 << 20, "the fence only");
    // Serial, or a batch below the inline threshold: the prelude runs on
    // the caller, before the free.
    let (ptx, prx) = mpsc::channel();
    let view = m.view();
    pool.discard_after(
        &[range(16 << 20, 64 * KIB)],
        &[],
        Box::new(move || {
            let kept = view.read_obj::<u64>(GuestAddress(16 << 20)).unwrap() == 0xdead_beef;
            ptx.send(kept).unwrap();
        }),
        Box::new(|_| ()),
    );
    assert_eq!(prx.try_recv(), Ok(true), "inline, before the free");
    assert!(reads_zero(&m, 16 << 20, 64 * KIB));
    // A prelude queued at a shutdown is dropped unrun; its batch ends.
    let (opts, _held) = held_workers();
    let pool2 = start(&m, &topo, opts);
    let (tx, rx) = mpsc::channel();
    let ran = Arc::new(AtomicBool::new(false));
    let r = ran.clone();
    pool2.discard_after(
        &[range(24 << 20, 4 << 20)],
        &[],
        Box::new(move || r.store(true, Ordering::SeqCst)),
        Box::new(move |o| tx.send(o).unwrap()),
    );
    pool2.cancel();
    let o = rx.recv_timeout(PATIENCE).unwrap();
    assert_eq!((o.bytes_freed, o.failed), (0, 1));
    assert!(!ran.load(Ordering::SeqCst));
    drop(_held);
    pool2.shutdown(Instant::now() + PATIENCE).unwrap();
    pool.shutdown(Instant::now() + PATIENCE).unwrap();
}

/// `discard` with an `Arc` of the pool, returning the outcome and the
/// batches in flight seen from inside `done`.
fn discard_seen_from_done(
    pool: &Arc<DiscardPool>,
    ranges: &[GuestRange],
) -> (DiscardOutcome, usize) {
    let (tx, rx) = mpsc::channel();
    let p = pool.clone();
    pool.discard(
        ranges,
        Box::new(move |o| {
            tx.send((o, p.snapshot().in_flight_batches)).unwrap();
        }),
    );
    rx.recv_timeout(PATIENCE).expect("done was called")
}

/// A batch whose free fails is submitted once more before `done` hears of
/// it, and `done` runs while that retry is still in flight (so a fence
/// wait never slips between the two); inline and on the workers alike.
#[test]
fn a_failed_batch_is_retried_once_and_stays_fenced_until_done_returns() {
    let topo = real();
    let m = memory(256, Backing::Anonymous, &topo);
    for (len, what) in [(2 << 20, "inline"), (64 << 20, "on the workers")] {
        touch(&m, 0, len);
        let pool = Arc::new(start(
            &m,
            &topo,
            DiscardOptions {
                failing_tries: 1,
                ..DiscardOptions::default()
            },
        ));
        let (o, in_flight) = discard_seen_from_done(&pool, &[range(0, len)]);
        assert_eq!((o.failed, o.bytes_freed), (0, len), "{what}: {o:?}");
        assert_eq!(in_flight, 1, "{what}: the retry is fenced while done runs");
        assert_eq!(resident(&m, 0, len), 0, "{what}");
        assert!(reads_zero(&m, 0, len), "{what}");
        // The retry leaves the fence once `done` has returned.
        pool.wait_overlapping(&[range(0, len)], Instant::now() + PATIENCE)
            .unwrap();
        let s = pool.snapshot();
        assert!(
            s.failures >= 1,
            "{what}: the first try's failure is counted: {s:?}"
        );
        assert_eq!((s.batches, s.in_flight_batches), (2, 0), "{what}: {s:?}");
    }
}

/// Two failures in a row (a batch and its retry) reach `done`: nothing of
/// the range was freed, and no third try is made.
#[test]
fn a_batch_that_fails_twice_is_said_and_frees_nothing() {
    let topo = real();
    let m = memory(64, Backing::Anonymous, &topo);
    touch(&m, 0, 2 << 20);
    let pool = Arc::new(start(
        &m,
        &topo,
        DiscardOptions {
            failing_tries: 2,
            ..DiscardOptions::default()
        },
    ));
    let (o, _) = discard_seen_from_done(&pool, &[range(0, 2 << 20)]);
    assert!(o.failed > 0 && o.bytes_freed == 0, "{o:?}");
    assert_eq!(resident(&m, 0, 2 << 20), 2 << 20);
    assert!(!reads_zero(&m, 0, 4096));
    assert_eq!(pool.snapshot().batches, 2, "one retry, no more");
    // The next batch frees as usual.
    let (o, _) = discard_seen_from_done(&pool, &[range(0, 2 << 20)]);
    assert_eq!((o.failed, o.bytes_freed), (0, 2 << 20), "{o:?}");
}
