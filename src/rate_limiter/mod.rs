//! Rate limiters in Firecracker's shape and semantics, for the block, net
//! and entropy devices: two token buckets, `bandwidth` (bytes) and `ops`
//! (requests), each `{size, one_time_burst, refill_time}` (tokens, tokens,
//! milliseconds), either absent or with a 0 size or refill time for "no
//! limit".
//!
//! A device asks [`RateLimiter::consume`] before each operation. When a
//! bucket is empty the limiter blocks: it arms its timer (100 ms, as
//! Firecracker's; or, after an operation larger than the bucket, the time
//! the excess takes to refill), refuses everything until the timer fires,
//! and the device puts the request back and waits for the timer's fd in its
//! event loop, then calls [`RateLimiter::event_handler`] and retries. The
//! fd is non-blocking, so a spurious wake never stalls a device thread.
//!
//! `PATCH` changes the buckets of a running device ([`RateLimiter::update`]):
//! a bucket left out stays as it is, one with a 0 size or refill time is
//! removed, any other is replaced by a full new one, as in Firecracker.

mod bucket;
#[cfg(test)]
mod tests;

use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use vmm_sys_util::timerfd::TimerFd;

pub use bucket::{BucketReduction, TokenBucket};

/// How long a limiter blocks after a refused operation (Firecracker's).
pub const REFILL_TIMER: Duration = Duration::from_millis(100);

/// Why a rate limiter could not be made or its timer read.
#[derive(Debug, thiserror::Error)]
pub enum RateLimiterError {
    /// The timer fd could not be made or armed.
    #[error("rate limiter timer: {0}")]
    Timer(#[source] std::io::Error),
    /// A refill time whose nanoseconds do not fit in 64 bits.
    #[error("refill_time {0} ms is too large (at most {max} ms)", max = u64::MAX / 1_000_000)]
    RefillTime(u64),
}

/// One bucket as the API and config file give it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
pub struct TokenBucketConfig {
    /// Tokens the bucket holds when full (bytes or operations).
    pub size: u64,
    /// Tokens spent before the bucket, once. (No `serde(default)` on the
    /// optional fields here and below: an absent one is `None` anyway, and
    /// without it serde refuses a JSON array where the object is due.)
    #[serde(serialize_with = "burst_as_firecracker")]
    pub one_time_burst: Option<u64>,
    /// Milliseconds an empty bucket takes to fill.
    pub refill_time: u64,
}

/// `one_time_burst` as Firecracker echoes it: `null` when there is none
/// (absent or 0), else the number.
fn burst_as_firecracker<S: serde::Serializer>(b: &Option<u64>, s: S) -> Result<S::Ok, S::Error> {
    match b {
        Some(n) if *n > 0 => s.serialize_some(n),
        _ => s.serialize_none(),
    }
}

impl TokenBucketConfig {
    /// Whether this bucket limits anything (Firecracker: size and refill
    /// time both non-zero).
    pub fn limits(&self) -> bool {
        self.size != 0 && self.refill_time != 0
    }
}

/// A rate limiter as the API and config file give it
/// (`rate_limiter`, `rx_rate_limiter`, `tx_rate_limiter`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimiterConfig {
    /// The bytes bucket.
    pub bandwidth: Option<TokenBucketConfig>,
    /// The operations bucket.
    pub ops: Option<TokenBucketConfig>,
}

impl RateLimiterConfig {
    /// Whether either bucket limits anything.
    pub fn limits(&self) -> bool {
        self.bandwidth.is_some_and(|b| b.limits()) || self.ops.is_some_and(|b| b.limits())
    }

    /// Checks what the buckets can hold: a refill time whose nanoseconds
    /// overflow is refused rather than silently taken as "no limit".
    pub fn check(&self) -> Result<(), RateLimiterError> {
        for b in [self.bandwidth, self.ops].into_iter().flatten() {
            if b.limits() && b.refill_time.checked_mul(1_000_000).is_none() {
                return Err(RateLimiterError::RefillTime(b.refill_time));
            }
        }
        Ok(())
    }

    /// This config with the buckets `update` names replaced (a `PATCH`).
    pub fn patched(&self, update: &RateLimiterConfig) -> RateLimiterConfig {
        let pick = |old: Option<TokenBucketConfig>, new: Option<TokenBucketConfig>| match new {
            None => old,
            Some(b) if !b.limits() => None,
            Some(b) => Some(b),
        };
        RateLimiterConfig {
            bandwidth: pick(self.bandwidth, update.bandwidth),
            ops: pick(self.ops, update.ops),
        }
    }

    /// Only the buckets that limit, as `GET /vm/config` shows them.
    pub fn effective(&self) -> RateLimiterConfig {
        RateLimiterConfig {
            bandwidth: self.bandwidth.filter(|b| b.limits()),
            ops: self.ops.filter(|b| b.limits()),
        }
    }
}

/// Which bucket an amount is taken from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenType {
    /// Bytes, from `bandwidth`.
    Bytes,
    /// Operations, from `ops`.
    Ops,
}

/// A live rate limiter: the two buckets and the timer that ends a block.
#[derive(Debug)]
pub struct RateLimiter {
    bandwidth: Option<TokenBucket>,
    ops: Option<TokenBucket>,
    timer: TimerFd,
    blocked: bool,
    throttled: u64,
}

fn nonblocking_timer() -> Result<TimerFd, RateLimiterError> {
    // SAFETY: no memory is passed; the result is checked.
    let fd = unsafe {
        libc::timerfd_create(
            libc::CLOCK_MONOTONIC,
            libc::TFD_CLOEXEC | libc::TFD_NONBLOCK,
        )
    };
    if fd < 0 {
        return Err(RateLimiterError::Timer(std::io::Error::last_os_error()));
    }
    // SAFETY: `fd` is a new timer fd that nothing else owns.
    Ok(unsafe { TimerFd::from_raw_fd(fd) })
}

impl RateLimiter {
    /// A limiter with the given buckets, full, not blocked.
    pub fn new(config: &RateLimiterConfig) -> Result<RateLimiter, RateLimiterError> {
        config.check()?;
        let now = Instant::now();
        Ok(RateLimiter {
            bandwidth: config
                .bandwidth
                .and_then(|b| TokenBucket::from_config_at(&b, now)),
            ops: config
                .ops
                .and_then(|b| TokenBucket::from_config_at(&b, now)),
            timer: nonblocking_timer()?,
            blocked: false,
            throttled: 0,
        })
    }

    /// The buckets it has, as a config (`GET /vm/config`).
    pub fn config(&self) -> RateLimiterConfig {
        RateLimiterConfig {
            bandwidth: self.bandwidth.as_ref().map(TokenBucket::config),
            ops: self.ops.as_ref().map(TokenBucket::config),
        }
    }

    /// Whether it limits anything.
    pub fn limits(&self) -> bool {
        self.bandwidth.is_some() || self.ops.is_some()
    }

    /// Whether it refuses everything until its timer fires.
    pub fn is_blocked(&self) -> bool {
        self.blocked
    }

    /// How many operations it has refused (each refusal counted once).
    pub fn throttled(&self) -> u64 {
        self.throttled
    }

    fn block_for(&mut self, d: Duration) {
        // A zero duration would disarm the timer and block for ever.
        let d = d.max(Duration::from_millis(1));
        if self.timer.reset(d, None).is_err() {
            // A timer that cannot be armed must not leave the device stuck:
            // let the operation through instead of blocking with no wake.
            log::error!("rate limiter: cannot arm its timer; not blocking");
            return;
        }
        self.blocked = true;
    }

    /// Takes `tokens` from the bucket of `kind`; false when it is empty (the
    /// limiter is then blocked until its timer fires) or already blocked.
    pub fn consume(&mut self, tokens: u64, kind: TokenType) -> bool {
        if self.blocked {
            return false;
        }
        let bucket = match kind {
            TokenType::Bytes => self.bandwidth.as_mut(),
            TokenType::Ops => self.ops.as_mut(),
        };
        let Some(bucket) = bucket else {
            return true;
        };
        let refill_ms = bucket.refill_time_ms();
        match bucket.reduce_at(tokens, Instant::now()) {
            BucketReduction::Success => true,
            BucketReduction::Failure => {
                self.throttled += 1;
                self.block_for(REFILL_TIMER);
                false
            }
            BucketReduction::OverConsumption(ratio) => {
                // Let it through, then hold everything for as long as the
                // excess takes to refill.
                self.block_for(Duration::from_secs_f64(ratio * refill_ms as f64 / 1000.0));
                true
            }
        }
    }

    /// One operation of `bytes` bytes: an op token and the bytes, or neither
    /// (the op token is given back when the bytes are refused).
    pub fn consume_op(&mut self, bytes: u64) -> bool {
        if !self.consume(1, TokenType::Ops) {
            return false;
        }
        if !self.consume(bytes, TokenType::Bytes) {
            self.replenish(1, TokenType::Ops);
            return false;
        }
        true
    }

    /// Gives back tokens taken for an operation that was not done.
    pub fn replenish(&mut self, tokens: u64, kind: TokenType) {
        let bucket = match kind {
            TokenType::Bytes => self.bandwidth.as_mut(),
            TokenType::Ops => self.ops.as_mut(),
        };
        if let Some(b) = bucket {
            b.replenish(tokens);
        }
    }

    /// Called when the timer's fd is readable: ends the block. Returns
    /// whether the timer had fired (false for a spurious wake, which
    /// changes nothing).
    pub fn event_handler(&mut self) -> bool {
        match self.timer.wait() {
            Ok(n) if n > 0 => {
                self.blocked = false;
                true
            }
            _ => false,
        }
    }

    /// Changes the buckets (a `PATCH`): see the module docs. A block in
    /// progress ends when its timer fires, as before.
    pub fn update(&mut self, update: &RateLimiterConfig) -> Result<(), RateLimiterError> {
        update.check()?;
        let now = Instant::now();
        let pick = |old: &mut Option<TokenBucket>, new: Option<TokenBucketConfig>| {
            if let Some(b) = new {
                *old = TokenBucket::from_config_at(&b, now);
            }
        };
        pick(&mut self.bandwidth, update.bandwidth);
        pick(&mut self.ops, update.ops);
        Ok(())
    }
}

impl AsRawFd for RateLimiter {
    fn as_raw_fd(&self) -> RawFd {
        self.timer.as_raw_fd()
    }
}
