//! The drive's rate limiter: requests refused go back to the avail ring
//! and run when the limiter's timer fires; Firecracker's counting (an op
//! for every request, bytes for IN and OUT only); `PATCH` while running; a
//! guest that floods the queue while blocked does not hold up the thread's
//! exit.

use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use event_manager::EventSet;
use virtio_bindings::virtio_blk as b;
use vm_memory::GuestAddress;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::tests::*;
use super::*;
use crate::devices::virtio::{ActiveState, QueueHandler, VirtioDevice, Worker};
use crate::rate_limiter::{RateLimiterConfig, TokenBucketConfig};

fn bucket(size: u64, refill_time: u64) -> Option<TokenBucketConfig> {
    Some(TokenBucketConfig {
        size,
        one_time_burst: None,
        refill_time,
    })
}

fn limited(name: &str, limiter: RateLimiterConfig) -> (TempFile, Rig) {
    let f = TempFile::new(name, &pattern(64));
    let o = BlockOptions {
        rate_limiter: limiter,
        ..opts(false, CacheType::Writeback)
    };
    let r = Rig::file(o, &f);
    (f, r)
}

/// Queues `n` one-sector reads (table entries 3i..3i+2, all into DATA).
fn reads(m: &vm_memory::GuestMemoryMmap<()>, q: &Mock<'_>, n: u16) {
    for i in 0..n {
        request(m, q, 3 * i, b::VIRTIO_BLK_T_IN, u64::from(i), 512, W);
    }
}

/// Waits (with a deadline) for the limiter's timer fd to be readable, then
/// runs the loop's event for it, as the worker's thread does.
fn timer_fires(r: &mut Rig) {
    let mut p = libc::pollfd {
        fd: r.worker.limiter().as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, for the call only.
    let n = unsafe { libc::poll(&mut p, 1, 5_000) };
    assert_eq!(n, 1, "the limiter's timer did not fire within 5 s");
    r.worker.source_event(0, EventSet::IN);
}

#[test]
fn an_ops_limit_puts_requests_back_and_its_timer_runs_them() {
    let (_f, mut r) = limited(
        "ops",
        RateLimiterConfig {
            ops: bucket(2, 100),
            ..Default::default()
        },
    );
    let m = r.mem.clone();
    let q = r.start(&m, 64);
    reads(&m, &q, 4);
    r.worker.process_queue(true);
    // Two taken, the third put back (not answered, not lost).
    assert_eq!(used_idx(&q), 2);
    assert!(r.worker.limiter().is_blocked());
    assert_eq!(r.metrics().rate_limiter_throttled_events.get(), 1);
    // A notification while blocked is only counted.
    r.worker.queue_event(0);
    assert_eq!(used_idx(&q), 2);
    assert_eq!(r.metrics().rate_limiter_throttled_events.get(), 2);
    // The timer ends the block; the rest are served, in order.
    let deadline = Instant::now() + Duration::from_secs(10);
    while used_idx(&q) < 4 {
        assert!(Instant::now() < deadline, "the put-back requests never ran");
        timer_fires(&mut r);
    }
    for i in 0..4 {
        assert_eq!(used(&q, i), (3 * u32::from(i), 513));
    }
    let s = r.metrics();
    assert_eq!(s.read_count.get(), 4);
    assert!(s.rate_limiter_event_count.get() >= 1);
}

#[test]
fn bytes_are_taken_for_in_and_out_only() {
    let (_f, mut r) = limited(
        "bytes",
        RateLimiterConfig {
            bandwidth: bucket(1024, 1000),
            ..Default::default()
        },
    );
    let m = r.mem.clone();
    let q = r.start(&m, 64);
    // Each its own header (the shared helper writes them all at HDR).
    let chain = |at: u16, kind: u32, len: u32| {
        let h = HDR + 64 * u64::from(at);
        header(&m, h, kind, 0);
        q.add_desc_chains(
            &[
                desc(h, 16, R | N, at + 1),
                desc(DATA, len, W | N, at + 2),
                desc(STATUS, 1, W, 0),
            ],
            at,
        )
        .unwrap();
    };
    chain(0, b::VIRTIO_BLK_T_IN, 1024);
    // GET_ID takes an op token only: the empty bytes bucket lets it
    // through; the next read is refused.
    chain(3, b::VIRTIO_BLK_T_GET_ID, 20);
    chain(6, b::VIRTIO_BLK_T_IN, 512);
    chain(9, b::VIRTIO_BLK_T_GET_ID, 20);
    r.worker.process_queue(true);
    assert_eq!(used_idx(&q), 2);
    assert!(r.worker.limiter().is_blocked());
    let s = r.metrics();
    assert_eq!(s.read_count.get(), 1);
    assert_eq!(s.get_id_count.get(), 1);
    assert_eq!(s.rate_limiter_throttled_events.get(), 1);
}

#[test]
fn a_patch_while_running_takes_effect_between_requests() {
    let (_f, mut r) = limited(
        "patch",
        RateLimiterConfig {
            ops: bucket(1, 60_000),
            ..Default::default()
        },
    );
    let m = r.mem.clone();
    let q = r.start(&m, 64);
    reads(&m, &q, 4);
    r.worker.process_queue(true);
    assert_eq!(used_idx(&q), 1);
    // A zero-size bucket removes the limit; the block in progress ends
    // with its timer, then everything runs.
    r.block
        .lock()
        .unwrap()
        .update_rate_limiter(&RateLimiterConfig {
            ops: bucket(0, 0),
            ..Default::default()
        })
        .unwrap();
    timer_fires(&mut r);
    assert_eq!(used_idx(&q), 4);
    assert!(!r.worker.limiter().limits());
    // A new bucket, full: one more request, then blocked again.
    r.block
        .lock()
        .unwrap()
        .update_rate_limiter(&RateLimiterConfig {
            ops: bucket(1, 60_000),
            ..Default::default()
        })
        .unwrap();
    request(&m, &q, 12, b::VIRTIO_BLK_T_IN, 0, 512, W);
    request(&m, &q, 15, b::VIRTIO_BLK_T_IN, 0, 512, W);
    r.worker.process_queue(false);
    assert_eq!(used_idx(&q), 5);
    assert_eq!(r.worker.limiter().config().ops, bucket(1, 60_000));
    // What cannot be held is refused at the hand-over, changing nothing.
    let bad = RateLimiterConfig {
        ops: bucket(1, u64::MAX),
        ..Default::default()
    };
    assert!(matches!(
        r.block.lock().unwrap().update_rate_limiter(&bad),
        Err(BlockError::RateLimiter(_))
    ));
}

#[test]
fn a_flood_while_blocked_does_not_hold_up_the_exit() {
    let f = TempFile::new("flood", &pattern(64));
    let mem = mem();
    let o = BlockOptions {
        rate_limiter: RateLimiterConfig {
            ops: bucket(1, 60_000),
            bandwidth: bucket(512, 60_000),
        },
        ..opts(false, CacheType::Unsafe)
    };
    let block = Arc::new(Mutex::new(Block::<Mem>::new(o, f.open(false)).unwrap()));
    let qevt = EventFd::new(EFD_NONBLOCK).unwrap();
    let exit = EventFd::new(EFD_NONBLOCK).unwrap();
    let worker = Worker::start(
        BlockWorker::new(&block).unwrap(),
        vec![qevt.try_clone().unwrap()],
        exit.try_clone().unwrap(),
    )
    .unwrap();
    let h = std::thread::spawn(move || worker.run());
    let q = virtio_queue::mock::MockSplitQueue::create(&*mem, GuestAddress(MIB), 64);
    block
        .lock()
        .unwrap()
        .activate(ActiveState::new(
            mem.clone(),
            0,
            vec![q.create_queue().unwrap()],
            Arc::new(Irq::default()),
        ))
        .unwrap();
    reads(&mem, &q, 20);
    let deadline = Instant::now() + Duration::from_secs(10);
    while block
        .lock()
        .unwrap()
        .metrics()
        .rate_limiter_throttled_events
        .get()
        == 0
    {
        qevt.write(1).unwrap();
        assert!(Instant::now() < deadline, "never throttled");
        std::thread::yield_now();
    }
    for _ in 0..10_000 {
        qevt.write(1).unwrap();
    }
    let t = Instant::now();
    exit.write(1).unwrap();
    h.join().unwrap().unwrap();
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "exit took {:?}",
        t.elapsed()
    );
    // One request ran; the rest wait on the avail ring, none answered.
    assert_eq!(used_idx(&q), 1);
}
