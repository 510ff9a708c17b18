//! The io_uring engine (`io_engine: "Async"`): many requests in flight,
//! answered as they complete, back-pressure when every slot is taken, a
//! reset while requests are in flight (nothing written to the guest), the
//! thread's exit with requests in flight, FLUSH as an fsync SQE, and the
//! engine under a rate limiter. (The request flows of `tests` run under
//! both engines: `both_engines!`.)

use std::os::fd::AsRawFd;
use std::time::Duration;

use event_manager::EventSet;
use virtio_bindings::virtio_blk as b;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::tests::*;
use super::worker::uring::{self, DEPTH};
use super::*;
use crate::devices::virtio::{QueueHandler, VirtioDevice};
use crate::rate_limiter::{RateLimiterConfig, TokenBucketConfig};

fn uring_opts(cache_type: CacheType) -> BlockOptions {
    BlockOptions {
        io_engine: IoEngine::Async,
        ..opts(false, cache_type)
    }
}

/// Queues `n` one-sector requests of `kind`, each its own header, data
/// sector and status byte (request `i`: sector `i`, data at DATA + 512 i,
/// status at STATUS + i preset to 0xff; table entries 3i..3i+2).
fn many(m: &GuestMemoryMmap<()>, q: &Mock<'_>, n: u16, kind: u32) {
    let dflags = if kind == b::VIRTIO_BLK_T_IN { W } else { R };
    let mut descs = Vec::new();
    for i in 0..n {
        let (hdr, data, st) = (
            HDR + 16 * u64::from(i),
            DATA + 512 * u64::from(i),
            STATUS + u64::from(i),
        );
        header(m, hdr, kind, u64::from(i));
        m.write_obj(0xffu8, GuestAddress(st)).unwrap();
        let at = 3 * i;
        descs.extend([
            desc(hdr, 16, R | N, at + 1),
            desc(data, 512, dflags | N, at + 2),
            desc(st, 1, W, 0),
        ]);
    }
    q.add_desc_chains(&descs, 0).unwrap();
}

/// Runs the worker as its loop does (a pass, then completions, each
/// running a pass) until `n` chains are used, with a deadline.
fn run_until_used(r: &mut Rig, q: &Mock<'_>, n: u16) {
    r.worker.process_queue(true);
    let end = std::time::Instant::now() + Duration::from_secs(10);
    while used_idx(q) < n {
        assert!(std::time::Instant::now() < end, "only {} used", used_idx(q));
        assert!(r.worker.settle(Duration::from_secs(5)));
        r.worker.process_queue(false);
    }
}

#[test]
fn more_requests_than_slots_are_all_answered_with_back_pressure() {
    // 80 one-sector reads (the queue's table holds 85 three-descriptor
    // chains), more than DEPTH in flight: the engine stops popping when
    // full and goes on as completions come; every read gets its sector.
    let n = 80u16;
    assert!(usize::from(n) > DEPTH);
    let f = TempFile::new("uring-many", &pattern(128));
    let mut r = Rig::file(uring_opts(CacheType::Unsafe), &f);
    let m = r.mem.clone();
    let q = r.start(&m, 256);
    many(&m, &q, n, b::VIRTIO_BLK_T_IN);
    r.worker.process_queue(true);
    // One pass took at most DEPTH requests: the rest wait for completions.
    assert!(r.worker.in_flight() <= DEPTH);
    assert!(used_idx(&q) < n);
    run_until_used(&mut r, &q, n);
    assert_eq!(used_idx(&q), n);
    let mut heads: Vec<u32> = (0..n).map(|i| used(&q, i).0).collect();
    for i in 0..n {
        assert_eq!(used(&q, i).1, 513, "used length of entry {i}");
    }
    heads.sort_unstable();
    assert_eq!(heads, (0..n).map(|i| 3 * u32::from(i)).collect::<Vec<_>>());
    for i in 0..u64::from(n) {
        let mut d = [0u8; 512];
        m.read_slice(&mut d, GuestAddress(DATA + 512 * i)).unwrap();
        assert_eq!(d, [(i + 1) as u8; 512], "sector {i}");
        let st: u8 = m.read_obj(GuestAddress(STATUS + i)).unwrap();
        assert_eq!(st, status::OK, "status {i}");
    }
    let s = r.metrics();
    assert_eq!((s.read_count.get(), s.read_bytes.get()), (80, 80 * 512));
    assert!(s.io_engine_throttled_events.get() > 0, "no back-pressure");
    assert_eq!(r.worker.in_flight(), 0);
}

#[test]
fn writes_in_flight_reach_the_file_and_flush_is_an_fsync() {
    let n = 40u16;
    let f = TempFile::new("uring-writes", &pattern(64));
    let mut r = Rig::file(uring_opts(CacheType::Writeback), &f);
    let m = r.mem.clone();
    let q = r.start(&m, 256);
    for i in 0..u64::from(n) {
        m.write_slice(
            &[0xc0 | (i as u8 & 0x3f); 512],
            GuestAddress(DATA + 512 * i),
        )
        .unwrap();
    }
    many(&m, &q, n, b::VIRTIO_BLK_T_OUT);
    run_until_used(&mut r, &q, n);
    let mut want = pattern(64);
    for i in 0..usize::from(n) {
        want[i * 512..(i + 1) * 512].fill(0xc0 | (i as u8 & 0x3f));
    }
    assert!(f.bytes() == want, "the file differs from what was written");
    for i in 0..n {
        assert_eq!(used(&q, i).1, 1);
    }
    // FLUSH: submitted (one in flight until its completion), then OK.
    header(&m, HDR, b::VIRTIO_BLK_T_FLUSH, 0);
    m.write_obj(0xffu8, GuestAddress(STATUS)).unwrap();
    q.add_desc_chains(&[desc(HDR, 16, R | N, 241), desc(STATUS, 1, W, 0)], 240)
        .unwrap();
    r.worker.process_queue(true);
    assert!(r.worker.settle(Duration::from_secs(5)));
    assert_eq!(used_idx(&q), n + 1);
    assert_eq!(used(&q, n), (240, 1));
    assert_eq!(status_byte(&m), status::OK);
    let s = r.metrics();
    assert_eq!((s.write_count.get(), s.flush_count.get()), (40, 1));
}

#[test]
fn a_reset_with_requests_in_flight_writes_nothing_to_the_guest() {
    let n = 20u16;
    let f = TempFile::new("uring-reset", &pattern(64));
    let mut r = Rig::file(uring_opts(CacheType::Unsafe), &f);
    let m = r.mem.clone();
    let q = r.start(&m, 256);
    m.write_slice(&vec![0x11; 512 * usize::from(n)], GuestAddress(DATA))
        .unwrap();
    many(&m, &q, n, b::VIRTIO_BLK_T_IN);
    r.worker.process_queue(true);
    assert_eq!(r.worker.in_flight(), usize::from(n));
    // The guest resets while the reads are in flight (completed or not in
    // the kernel: none is answered yet).
    r.block.lock().unwrap().reset();
    assert!(r.worker.settle(Duration::from_secs(5)));
    let mut d = vec![0u8; 512 * usize::from(n)];
    m.read_slice(&mut d, GuestAddress(DATA)).unwrap();
    assert!(
        d.iter().all(|&b| b == 0x11),
        "a read landed after the reset"
    );
    assert_eq!(used_idx(&q), 0);
    let s = r.metrics();
    assert_eq!(
        (s.abandoned_reqs_count.get(), s.read_count.get()),
        (u64::from(n), 0)
    );
}

#[test]
fn dropping_the_worker_with_requests_in_flight_waits_for_them() {
    let f = TempFile::new("uring-drop", &pattern(64));
    let mut r = Rig::file(uring_opts(CacheType::Unsafe), &f);
    let m = r.mem.clone();
    let q = r.start(&m, 256);
    many(&m, &q, 30, b::VIRTIO_BLK_T_IN);
    r.worker.process_queue(true);
    assert_eq!(r.worker.in_flight(), 30);
    let t = std::time::Instant::now();
    drop(r.worker);
    // Regular-file reads complete at once: no wait near the deadline.
    assert!(t.elapsed() < uring::DRAIN_DEADLINE, "{:?}", t.elapsed());
}

#[test]
fn a_completion_event_runs_the_next_pass() {
    // As the loop sees it: source 1 is the completion eventfd.
    let f = TempFile::new("uring-evt", &pattern(64));
    let mut r = Rig::file(uring_opts(CacheType::Unsafe), &f);
    assert_eq!(r.worker.sources().len(), 2);
    let evt = r.worker.sources()[1].0;
    let m = r.mem.clone();
    let q = r.start(&m, 256);
    many(&m, &q, 3, b::VIRTIO_BLK_T_IN);
    r.worker.process_queue(true);
    let mut p = libc::pollfd {
        fd: evt,
        events: libc::POLLIN,
        revents: 0,
    };
    let end = std::time::Instant::now() + Duration::from_secs(5);
    while used_idx(&q) < 3 {
        assert!(std::time::Instant::now() < end, "completions not signalled");
        // SAFETY: one valid pollfd, for the call only.
        let n = unsafe { libc::poll(&mut p, 1, 1_000) };
        if n == 1 {
            r.worker.source_event(1, EventSet::IN);
        }
    }
    assert_eq!(r.metrics().read_count.get(), 3);
}

#[test]
fn the_rate_limiter_holds_async_requests_too() {
    let f = TempFile::new("uring-limit", &pattern(64));
    let o = BlockOptions {
        rate_limiter: RateLimiterConfig {
            ops: Some(TokenBucketConfig {
                size: 4,
                one_time_burst: None,
                refill_time: 100,
            }),
            ..Default::default()
        },
        ..uring_opts(CacheType::Unsafe)
    };
    let mut r = Rig::file(o, &f);
    let m = r.mem.clone();
    let q = r.start(&m, 256);
    many(&m, &q, 10, b::VIRTIO_BLK_T_IN);
    r.worker.process_queue(true);
    assert_eq!(r.worker.in_flight(), 4);
    assert!(r.worker.settle(Duration::from_secs(5)));
    assert_eq!(used_idx(&q), 4);
    assert!(r.metrics().rate_limiter_throttled_events.get() > 0);
    // The limiter's timer runs the rest, 4 at a time.
    let end = std::time::Instant::now() + Duration::from_secs(10);
    while used_idx(&q) < 10 {
        assert!(std::time::Instant::now() < end);
        let mut p = libc::pollfd {
            fd: r.worker.limiter().as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, for the call only.
        if unsafe { libc::poll(&mut p, 1, 2_000) } == 1 {
            r.worker.source_event(0, EventSet::IN);
        }
        assert!(r.worker.settle(Duration::from_secs(5)));
    }
    for i in 0..10u64 {
        let mut d = [0u8; 512];
        m.read_slice(&mut d, GuestAddress(DATA + 512 * i)).unwrap();
        assert_eq!(d, [(i + 1) as u8; 512]);
    }
}

#[test]
fn async_over_a_store_that_is_not_a_file_is_refused() {
    let (disk, _log) = test_disk::RecordingDisk::new(pattern(8));
    let block = std::sync::Arc::new(std::sync::Mutex::new(
        Block::<Mem>::with_disk(uring_opts(CacheType::Unsafe), Box::new(disk)).unwrap(),
    ));
    let e = BlockWorker::new(&block).unwrap_err();
    assert!(matches!(e, BlockError::NoFd), "{e}");
}
