//! MMDS V2 session tokens: made by `PUT /latest/api/token` with a time to
//! live of 1 to 21600 s, required (and checked) on a V2 `GET`.
//!
//! A token holds nothing secret and nothing is kept per token: it is its
//! expiry (milliseconds on the authority's monotonic clock), a counter,
//! and a keyed hash (SipHash, keys drawn once from the OS by
//! [`std::hash::RandomState`] when the authority is made, on the thread
//! that makes it) over both. A guest cannot forge one without the keys,
//! cannot extend one, and a flood of `PUT`s costs no memory. The clock is
//! passed in (`now`: time since the authority was made), so tests expire
//! tokens without waiting.

use std::hash::{BuildHasher, RandomState};
use std::time::Duration;

/// The shortest time to live a token may have, in seconds.
pub const MIN_TTL_SECONDS: u32 = 1;
/// The longest, in seconds (six hours, as EC2 IMDS and Firecracker).
pub const MAX_TTL_SECONDS: u32 = 21600;
/// The path that makes tokens.
pub const TOKEN_PATH: &str = "/latest/api/token";

/// Why no token was made (Firecracker's wording).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    /// A time to live outside 1..=21600 s.
    #[error(
        "Invalid time to live value provided for token: {0}. Please provide a value between \
         {MIN_TTL_SECONDS} and {MAX_TTL_SECONDS}."
    )]
    InvalidTtl(u32),
}

/// Makes and checks tokens.
#[derive(Debug, Clone)]
pub struct TokenAuthority {
    keys: RandomState,
    counter: u64,
}

/// Hex digits of a token: expiry (16), counter (16), two hashes (32).
const TOKEN_HEX: usize = 64;

impl Default for TokenAuthority {
    fn default() -> Self {
        Self::new()
    }
}

impl TokenAuthority {
    /// An authority with fresh keys.
    pub fn new() -> TokenAuthority {
        TokenAuthority {
            keys: RandomState::new(),
            counter: 0,
        }
    }

    fn mac(&self, expiry_ms: u64, counter: u64) -> (u64, u64) {
        (
            self.keys.hash_one((0u8, expiry_ms, counter)),
            self.keys.hash_one((1u8, expiry_ms, counter)),
        )
    }

    /// A token valid for `ttl_seconds` from `now`.
    pub fn generate(&mut self, ttl_seconds: u32, now: Duration) -> Result<String, TokenError> {
        if !(MIN_TTL_SECONDS..=MAX_TTL_SECONDS).contains(&ttl_seconds) {
            return Err(TokenError::InvalidTtl(ttl_seconds));
        }
        let now_ms = u64::try_from(now.as_millis()).unwrap_or(u64::MAX);
        let expiry_ms = now_ms.saturating_add(u64::from(ttl_seconds) * 1000);
        self.counter = self.counter.wrapping_add(1);
        let (a, b) = self.mac(expiry_ms, self.counter);
        Ok(format!(
            "{expiry_ms:016x}{:016x}{a:016x}{b:016x}",
            self.counter
        ))
    }

    /// Whether `token` was made here and has not expired at `now`.
    pub fn is_valid(&self, token: &str, now: Duration) -> bool {
        if token.len() != TOKEN_HEX || !token.bytes().all(|b| b.is_ascii_hexdigit()) {
            return false;
        }
        let field = |i: usize| u64::from_str_radix(&token[i * 16..(i + 1) * 16], 16).ok();
        let (Some(expiry_ms), Some(counter), Some(a), Some(b)) =
            (field(0), field(1), field(2), field(3))
        else {
            return false;
        };
        let now_ms = u64::try_from(now.as_millis()).unwrap_or(u64::MAX);
        self.mac(expiry_ms, counter) == (a, b) && now_ms < expiry_ms
    }
}
