//! The `entropy` section and the body of `PUT /entropy` (Firecracker's
//! `EntropyDevice`): a virtio-rng device, with an optional rate limiter.
//! Pre-boot only.

use serde::{Deserialize, Serialize};

use super::{invalid, ConfigError};
use crate::rate_limiter::RateLimiterConfig;

/// The entropy device.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EntropyConfig {
    /// Its limiter (one op and the bytes of each request); absent, `null`
    /// or `{}`: no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limiter: Option<RateLimiterConfig>,
}

impl EntropyConfig {
    /// Checks what the limiter's buckets hold.
    pub fn validate(&self) -> Result<(), ConfigError> {
        match &self.rate_limiter {
            Some(l) => l
                .check()
                .map_err(|e| invalid("entropy.rate_limiter", e.to_string())),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies() {
        let c: EntropyConfig = serde_json::from_str("{}").unwrap();
        assert_eq!(c, EntropyConfig::default());
        let c: EntropyConfig = serde_json::from_str(
            r#"{"rate_limiter": {"bandwidth": {"size": 1000, "refill_time": 100}}}"#,
        )
        .unwrap();
        c.validate().unwrap();
        assert_eq!(c.rate_limiter.unwrap().bandwidth.unwrap().size, 1000);
        assert!(serde_json::from_str::<EntropyConfig>(r#"{"rate": 1}"#).is_err());
        let c: EntropyConfig = serde_json::from_str(
            r#"{"rate_limiter": {"ops": {"size": 1, "refill_time": 18446744073709551615}}}"#,
        )
        .unwrap();
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .contains("entropy.rate_limiter"));
    }
}
