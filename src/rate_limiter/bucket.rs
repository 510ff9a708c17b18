//! One token bucket, in Firecracker's semantics: it starts full, refills
//! continuously at `size` tokens per `refill_time` milliseconds, never holds
//! more than `size`, and spends a `one_time_burst` first. A request larger
//! than the whole bucket is let through once and reported as an
//! over-consumption, so the caller blocks for as long as the excess takes to
//! refill.
//!
//! Time is passed in (`*_at` methods) so the arithmetic is tested without
//! sleeping; the [`super::RateLimiter`] passes `Instant::now()`.

use std::time::{Duration, Instant};

use super::TokenBucketConfig;

const NS_PER_MS: u64 = 1_000_000;

/// What a [`TokenBucket::reduce_at`] did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum BucketReduction {
    /// Not enough tokens: nothing was taken.
    Failure,
    /// The tokens were taken.
    Success,
    /// The request was larger than the bucket: it was let through, the
    /// bucket is empty, and the excess is this many bucket sizes.
    OverConsumption(f64),
}

/// A token bucket (see the module docs).
#[derive(Debug, Clone)]
pub struct TokenBucket {
    size: u64,
    one_time_burst: u64,
    initial_one_time_burst: u64,
    refill_time_ms: u64,
    budget: u64,
    last_update: Instant,
    // `size / refill_time_ns` reduced by their greatest common divisor, so
    // the refill products stay small.
    rate_tokens: u64,
    rate_ns: u64,
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

impl TokenBucket {
    /// A full bucket, or `None` when `size` or `refill_time_ms` is 0 (no
    /// limit, as in Firecracker) or the refill time does not fit in
    /// nanoseconds.
    pub fn new_at(
        size: u64,
        one_time_burst: u64,
        refill_time_ms: u64,
        now: Instant,
    ) -> Option<TokenBucket> {
        if size == 0 || refill_time_ms == 0 {
            return None;
        }
        let refill_ns = refill_time_ms.checked_mul(NS_PER_MS)?;
        let g = gcd(size, refill_ns);
        Some(TokenBucket {
            size,
            one_time_burst,
            initial_one_time_burst: one_time_burst,
            refill_time_ms,
            budget: size,
            last_update: now,
            rate_tokens: size / g,
            rate_ns: refill_ns / g,
        })
    }

    /// The bucket a config describes (see [`TokenBucket::new_at`]).
    pub fn from_config_at(c: &TokenBucketConfig, now: Instant) -> Option<TokenBucket> {
        TokenBucket::new_at(c.size, c.one_time_burst.unwrap_or(0), c.refill_time, now)
    }

    /// The config this bucket was made from, as `GET /vm/config` echoes it.
    pub fn config(&self) -> TokenBucketConfig {
        TokenBucketConfig {
            size: self.size,
            one_time_burst: (self.initial_one_time_burst > 0)
                .then_some(self.initial_one_time_burst),
            refill_time: self.refill_time_ms,
        }
    }

    /// The bucket's size.
    pub fn capacity(&self) -> u64 {
        self.size
    }

    /// The tokens it holds now (not counting the burst), as of the last
    /// reduction or refill.
    pub fn budget(&self) -> u64 {
        self.budget
    }

    /// The one-time burst left.
    pub fn one_time_burst(&self) -> u64 {
        self.one_time_burst
    }

    /// The refill time in milliseconds.
    pub fn refill_time_ms(&self) -> u64 {
        self.refill_time_ms
    }

    fn refill_at(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.last_update).as_nanos();
        if elapsed >= u128::from(self.refill_time_ms) * u128::from(NS_PER_MS) {
            self.budget = self.size;
            self.last_update = now;
            return;
        }
        // elapsed < refill_ns <= u64::MAX, so the products fit in u128.
        let (rate_tokens, rate_ns) = (u128::from(self.rate_tokens), u128::from(self.rate_ns));
        let tokens = elapsed * rate_tokens / rate_ns;
        // Advance the clock only by the time those whole tokens took, rounded
        // up, so a fraction of a token carries over to the next refill and
        // no nanosecond is counted twice.
        let used_ns = (tokens * rate_ns).div_ceil(rate_tokens);
        self.last_update += Duration::from_nanos(used_ns as u64);
        self.budget = self.size.min(self.budget.saturating_add(tokens as u64));
    }

    /// Takes `tokens` at time `now`.
    pub fn reduce_at(&mut self, mut tokens: u64, now: Instant) -> BucketReduction {
        if self.one_time_burst > 0 {
            if self.one_time_burst >= tokens {
                self.one_time_burst -= tokens;
                self.last_update = now;
                return BucketReduction::Success;
            }
            tokens -= self.one_time_burst;
            self.one_time_burst = 0;
        }
        if tokens > self.budget {
            self.refill_at(now);
            if tokens > self.size {
                let excess = tokens - self.budget;
                self.budget = 0;
                return BucketReduction::OverConsumption(excess as f64 / self.size as f64);
            }
            if tokens > self.budget {
                return BucketReduction::Failure;
            }
        }
        self.budget -= tokens;
        BucketReduction::Success
    }

    /// Gives `tokens` back (an operation that was counted and then not
    /// done), never beyond the bucket's size or the initial burst.
    pub fn replenish(&mut self, tokens: u64) {
        if self.one_time_burst > 0 {
            self.one_time_burst = self
                .initial_one_time_burst
                .min(self.one_time_burst.saturating_add(tokens));
        } else {
            self.budget = self.size.min(self.budget.saturating_add(tokens));
        }
    }
}
