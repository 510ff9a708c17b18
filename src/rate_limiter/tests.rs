use std::time::{Duration, Instant};

use super::*;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[test]
fn zero_size_or_refill_time_is_no_bucket() {
    let now = Instant::now();
    assert!(TokenBucket::new_at(0, 0, 100, now).is_none());
    assert!(TokenBucket::new_at(100, 0, 0, now).is_none());
    assert!(TokenBucket::new_at(100, 0, u64::MAX, now).is_none());
    assert!(TokenBucket::new_at(100, 0, 100, now).is_some());
}

#[test]
fn starts_full_and_refills_at_its_rate() {
    let t0 = Instant::now();
    // 1000 tokens per 100 ms.
    let mut b = TokenBucket::new_at(1000, 0, 100, t0).unwrap();
    assert_eq!(b.reduce_at(1000, t0), BucketReduction::Success);
    assert_eq!(b.reduce_at(1, t0), BucketReduction::Failure);
    // 10 ms later: 100 tokens.
    assert_eq!(b.reduce_at(101, t0 + ms(10)), BucketReduction::Failure);
    assert_eq!(b.budget(), 100);
    assert_eq!(b.reduce_at(100, t0 + ms(10)), BucketReduction::Success);
    // A whole refill time fills it, never beyond its size.
    assert_eq!(
        b.reduce_at(1001, t0 + ms(500)),
        BucketReduction::OverConsumption(0.001)
    );
    assert_eq!(b.budget(), 0);
}

#[test]
fn fractions_of_a_token_carry_over() {
    let t0 = Instant::now();
    // 3 tokens per second: one every 333.33 ms.
    let mut b = TokenBucket::new_at(3, 0, 1000, t0).unwrap();
    assert_eq!(b.reduce_at(3, t0), BucketReduction::Success);
    let mut taken = 0;
    // 130 steps of 10 ms: 1.3 s, so exactly 3 more tokens (the third at
    // 1 s and 2 ns, the fourth not before 1.33 s), none lost to rounding
    // and none made twice.
    for i in 1..=130 {
        if b.reduce_at(1, t0 + ms(10 * i)) == BucketReduction::Success {
            taken += 1;
        }
    }
    assert_eq!(taken, 3);
}

#[test]
fn one_time_burst_is_spent_first_and_once() {
    let t0 = Instant::now();
    let mut b = TokenBucket::new_at(100, 50, 1000, t0).unwrap();
    assert_eq!(b.reduce_at(30, t0), BucketReduction::Success);
    assert_eq!(b.one_time_burst(), 20);
    assert_eq!(b.budget(), 100);
    // 20 from the burst, 80 from the bucket.
    assert_eq!(b.reduce_at(100, t0), BucketReduction::Success);
    assert_eq!((b.one_time_burst(), b.budget()), (0, 20));
    assert_eq!(b.config().one_time_burst, Some(50));
}

#[test]
fn replenish_never_exceeds_size_or_burst() {
    let t0 = Instant::now();
    let mut b = TokenBucket::new_at(100, 10, 1000, t0).unwrap();
    b.replenish(5);
    assert_eq!(b.one_time_burst(), 10);
    assert_eq!(b.reduce_at(10, t0), BucketReduction::Success);
    assert_eq!(b.reduce_at(40, t0), BucketReduction::Success);
    b.replenish(1000);
    assert_eq!(b.budget(), 100);
}

#[test]
fn config_shape_is_firecrackers() {
    let c: RateLimiterConfig = serde_json::from_str(
        r#"{"bandwidth": {"size": 1048576, "one_time_burst": 0, "refill_time": 1000},
            "ops": {"size": 100, "refill_time": 1000}}"#,
    )
    .unwrap();
    assert!(c.limits());
    assert_eq!(c.ops.unwrap().one_time_burst, None);
    assert!(serde_json::from_str::<RateLimiterConfig>(r#"{"bandwith": null}"#).is_err());
    // An array is not a limiter (serde would take `[]` for a struct whose
    // fields all have defaults).
    assert!(serde_json::from_str::<RateLimiterConfig>("[]").is_err());
    assert!(serde_json::from_str::<TokenBucketConfig>("[1]").is_err());
    // Echoed as Firecracker echoes it: no burst (absent or 0) is null.
    assert_eq!(
        serde_json::to_value(c).unwrap(),
        serde_json::json!({
            "bandwidth": {"size": 1048576, "one_time_burst": null, "refill_time": 1000},
            "ops": {"size": 100, "one_time_burst": null, "refill_time": 1000}
        })
    );
    let none: RateLimiterConfig = serde_json::from_str("{}").unwrap();
    assert!(!none.limits());
    let zero: RateLimiterConfig =
        serde_json::from_str(r#"{"bandwidth": {"size": 0, "refill_time": 100}}"#).unwrap();
    assert!(!zero.limits());
    assert_eq!(zero.effective(), RateLimiterConfig::default());
    let huge = RateLimiterConfig {
        ops: Some(TokenBucketConfig {
            size: 1,
            one_time_burst: None,
            refill_time: u64::MAX,
        }),
        ..Default::default()
    };
    assert!(matches!(huge.check(), Err(RateLimiterError::RefillTime(_))));
    assert!(RateLimiter::new(&huge).is_err());
}

#[test]
fn patch_replaces_named_buckets_and_removes_zero_ones() {
    let bw = TokenBucketConfig {
        size: 10,
        one_time_burst: None,
        refill_time: 10,
    };
    let ops = TokenBucketConfig {
        size: 5,
        one_time_burst: None,
        refill_time: 10,
    };
    let old = RateLimiterConfig {
        bandwidth: Some(bw),
        ops: Some(ops),
    };
    let new_bw = TokenBucketConfig { size: 20, ..bw };
    let p = old.patched(&RateLimiterConfig {
        bandwidth: Some(new_bw),
        ops: None,
    });
    assert_eq!(
        p,
        RateLimiterConfig {
            bandwidth: Some(new_bw),
            ops: Some(ops)
        }
    );
    let off = TokenBucketConfig { size: 0, ..bw };
    let p = old.patched(&RateLimiterConfig {
        bandwidth: None,
        ops: Some(off),
    });
    assert_eq!(
        p,
        RateLimiterConfig {
            bandwidth: Some(bw),
            ops: None
        }
    );

    let mut rl = RateLimiter::new(&old).unwrap();
    rl.update(&RateLimiterConfig {
        bandwidth: Some(new_bw),
        ops: Some(off),
    })
    .unwrap();
    assert_eq!(
        rl.config(),
        RateLimiterConfig {
            bandwidth: Some(new_bw),
            ops: None
        }
    );
}

/// Waits for the limiter's fd to be readable, up to `timeout`.
fn readable(rl: &RateLimiter, timeout: Duration) -> bool {
    let mut p = libc::pollfd {
        fd: rl.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd for the duration of the call.
    let n = unsafe { libc::poll(&mut p, 1, timeout.as_millis() as i32) };
    n == 1
}

#[test]
fn an_empty_bucket_blocks_until_the_timer_fires() {
    let c = RateLimiterConfig {
        bandwidth: Some(TokenBucketConfig {
            size: 1000,
            one_time_burst: None,
            refill_time: 100,
        }),
        ops: None,
    };
    let mut rl = RateLimiter::new(&c).unwrap();
    assert!(
        !rl.event_handler(),
        "a spurious wake changes nothing and does not block"
    );
    assert!(rl.consume_op(1000));
    assert!(!rl.consume(1000, TokenType::Bytes));
    assert!(rl.is_blocked());
    assert_eq!(rl.throttled(), 1);
    // Blocked: even a free bucket refuses.
    assert!(!rl.consume(1, TokenType::Ops));
    let t = Instant::now();
    assert!(
        readable(&rl, Duration::from_secs(5)),
        "the timer never fired"
    );
    assert!(
        t.elapsed() >= Duration::from_millis(90),
        "{:?}",
        t.elapsed()
    );
    assert!(rl.event_handler());
    assert!(!rl.is_blocked());
    // 100 ms refilled the whole bucket.
    assert!(rl.consume(1000, TokenType::Bytes));
}

#[test]
fn an_operation_larger_than_the_bucket_passes_then_blocks_for_the_excess() {
    let c = RateLimiterConfig {
        bandwidth: Some(TokenBucketConfig {
            size: 100,
            one_time_burst: None,
            refill_time: 100,
        }),
        ops: None,
    };
    let mut rl = RateLimiter::new(&c).unwrap();
    // 300 bytes: 200 beyond the full bucket, two refill times (200 ms).
    let t = Instant::now();
    assert!(rl.consume(300, TokenType::Bytes));
    assert!(rl.is_blocked());
    assert!(readable(&rl, Duration::from_secs(5)));
    assert!(
        t.elapsed() >= Duration::from_millis(190),
        "{:?}",
        t.elapsed()
    );
    assert!(rl.event_handler());
}

#[test]
fn consume_op_gives_the_op_back_when_the_bytes_are_refused() {
    let c = RateLimiterConfig {
        bandwidth: Some(TokenBucketConfig {
            size: 10,
            one_time_burst: None,
            refill_time: 1000,
        }),
        ops: Some(TokenBucketConfig {
            size: 2,
            one_time_burst: None,
            refill_time: 100_000,
        }),
    };
    let mut rl = RateLimiter::new(&c).unwrap();
    assert!(rl.consume_op(10));
    assert!(!rl.consume_op(10));
    // The op bucket still has its second token.
    assert_eq!(rl.ops.as_ref().unwrap().budget(), 1);
}

#[test]
fn no_buckets_never_blocks() {
    let mut rl = RateLimiter::new(&RateLimiterConfig::default()).unwrap();
    assert!(!rl.limits());
    for _ in 0..1000 {
        assert!(rl.consume_op(1 << 30));
    }
    assert!(!rl.is_blocked());
}
