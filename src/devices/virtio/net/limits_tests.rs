//! The rate limiters on the network device's two paths, over the recording
//! backend: what is held, what is counted, what the timer resumes, and a
//! `PATCH` on a running device.

use std::os::fd::RawFd;
use std::time::{Duration, Instant};

use vm_memory::GuestAddress;

use super::device::limits::{RX_TIMER_SOURCE, TX_TIMER_SOURCE};
use super::test_backend::RecordingBackend;
use super::tests::{desc, frame, mem, start, used_idx, Rig, BUF, W};
use super::*;
use crate::devices::virtio::VIRTIO_F_VERSION_1;
use crate::rate_limiter::{RateLimiterConfig, TokenBucketConfig};

/// One op per 100 ms.
fn one_op_per_100ms() -> RateLimiterConfig {
    RateLimiterConfig {
        ops: Some(TokenBucketConfig {
            size: 1,
            one_time_burst: None,
            refill_time: 100,
        }),
        bandwidth: None,
    }
}

fn rig_with(rx: RateLimiterConfig, tx: RateLimiterConfig) -> Rig {
    let tap = RecordingBackend::new();
    let opts = NetOptions {
        iface_id: "eth0".into(),
        rx_rate_limiter: rx,
        tx_rate_limiter: tx,
        ..Default::default()
    };
    Rig {
        mem: mem(),
        net: Net::with_backend(opts, Box::new(tap.clone())).unwrap(),
        tap,
        irq: Default::default(),
    }
}

/// Waits (with a deadline) for a limiter's timer fd to become readable.
fn wait_readable(fd: RawFd) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one pollfd on our stack.
        if unsafe { libc::poll(&mut p, 1, 100) } == 1 {
            return;
        }
        assert!(Instant::now() < deadline, "the limiter's timer never fired");
    }
}

fn timer_fd(r: &Rig, source: usize) -> RawFd {
    r.net.limits.fds()[source - 1]
}

#[test]
fn tx_holds_frames_on_the_ring_until_the_timer() {
    let mut r = rig_with(RateLimiterConfig::default(), one_op_per_100ms());
    let mem = r.mem.clone();
    let qs = start(&mut r, &mem, VIRTIO_F_VERSION_1, 16);
    for i in 0..3u16 {
        qs[TX_INDEX]
            .add_desc_chains(&[desc(BUF + u64::from(i) * 0x1000, 60, 0, 0)], i)
            .unwrap();
    }
    r.net.process_queue(TX_INDEX);
    assert_eq!(r.tap.lock().sent.len(), 1);
    assert_eq!(used_idx(&qs[TX_INDEX]), 1);
    let s = r.net.metrics().snapshot();
    assert_eq!(s.tx_rate_limiter_throttled.get(), 1);
    assert_eq!(s.tx_malformed_frames.get(), 0);
    // Blocked: another notification sends nothing, and is counted.
    r.net.process_queue(TX_INDEX);
    assert_eq!(r.tap.lock().sent.len(), 1);
    assert_eq!(
        r.net.metrics().snapshot().tx_rate_limiter_throttled.get(),
        2
    );
    // The timer resumes: the next frame (not lost, not sent twice) goes.
    for want in [2, 3] {
        wait_readable(timer_fd(&r, TX_TIMER_SOURCE));
        r.net.process_limiter(TX_TIMER_SOURCE);
        assert_eq!(r.tap.lock().sent.len(), want);
        assert_eq!(used_idx(&qs[TX_INDEX]), want as u16);
    }
    assert_eq!(
        r.net.metrics().snapshot().tx_rate_limiter_event_count.get(),
        2
    );
    // A spurious wake (the timer has not fired) changes nothing.
    r.net.process_limiter(TX_TIMER_SOURCE);
    assert_eq!(r.tap.lock().sent.len(), 3);
}

#[test]
fn rx_holds_the_frame_and_stops_reading_the_tap_until_the_timer() {
    let mut r = rig_with(one_op_per_100ms(), RateLimiterConfig::default());
    let mem = r.mem.clone();
    let qs = start(&mut r, &mem, VIRTIO_F_VERSION_1, 16);
    for i in 0..4u16 {
        qs[RX_INDEX]
            .add_desc_chains(&[desc(BUF + u64::from(i) * 0x1000, 2000, W, 0)], i)
            .unwrap();
    }
    for i in 0..3 {
        r.tap.push(frame(100, i));
    }
    r.net.process_tap();
    assert_eq!(used_idx(&qs[RX_INDEX]), 1);
    // The second frame was read and is held; the third stays in the tap.
    assert_eq!(r.tap.lock().reads, 2);
    for _ in 0..10 {
        r.net.process_tap();
    }
    assert_eq!(r.tap.lock().reads, 2);
    let s = r.net.metrics().snapshot();
    assert_eq!(s.rx_rate_limiter_throttled.get(), 11);
    assert_eq!(s.rx_dropped_frames.get(), 0);
    wait_readable(timer_fd(&r, RX_TIMER_SOURCE));
    r.net.process_limiter(RX_TIMER_SOURCE);
    assert_eq!(used_idx(&qs[RX_INDEX]), 2);
    // The held frame is the second one, whole.
    let mut b = [0u8; 1];
    vm_memory::Bytes::read_slice(&*mem, &mut b, GuestAddress(BUF + 0x1000 + 12)).unwrap();
    assert_eq!(b[0], 1);
    assert_eq!(r.net.metrics().snapshot().rx_packets_count.get(), 2);
}

#[test]
fn a_patch_on_a_running_device_takes_effect() {
    let mut r = rig_with(RateLimiterConfig::default(), one_op_per_100ms());
    let mem = r.mem.clone();
    let qs = start(&mut r, &mem, VIRTIO_F_VERSION_1, 64);
    for i in 0..20u16 {
        qs[TX_INDEX]
            .add_desc_chains(&[desc(BUF + u64::from(i) * 0x1000, 60, 0, 0)], i)
            .unwrap();
    }
    r.net.process_queue(TX_INDEX);
    assert_eq!(r.tap.lock().sent.len(), 1);
    // Remove the ops bucket: after the block in progress ends, nothing is
    // held.
    let off = RateLimiterConfig {
        ops: Some(TokenBucketConfig::default()),
        bandwidth: None,
    };
    r.net.update_limiters(None, Some(&off)).unwrap();
    assert_eq!(r.net.limiter_configs().1, RateLimiterConfig::default());
    wait_readable(timer_fd(&r, TX_TIMER_SOURCE));
    r.net.process_limiter(TX_TIMER_SOURCE);
    assert_eq!(r.tap.lock().sent.len(), 20);
    // A bandwidth bucket put in: kept, and shown.
    let bw = RateLimiterConfig {
        bandwidth: Some(TokenBucketConfig {
            size: 1000,
            one_time_burst: None,
            refill_time: 100,
        }),
        ops: None,
    };
    r.net.update_limiters(Some(&bw), None).unwrap();
    assert_eq!(r.net.limiter_configs().0, bw);
    // A refill time that overflows is refused, and changes nothing.
    let huge = RateLimiterConfig {
        bandwidth: Some(TokenBucketConfig {
            size: 1,
            one_time_burst: None,
            refill_time: u64::MAX,
        }),
        ops: None,
    };
    assert!(r.net.update_limiters(Some(&huge), Some(&huge)).is_err());
    assert_eq!(r.net.limiter_configs(), (bw, RateLimiterConfig::default()));
}
