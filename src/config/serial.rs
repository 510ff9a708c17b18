//! The body of `PUT /serial` (Firecracker's `SerialDevice`): where the
//! guest's serial output goes instead of stdout. Pre-boot only.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::firecracker::{check_no_rate_limiter, check_path};
use super::ConfigError;

/// The serial output.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SerialConfig {
    /// The file (or FIFO) the guest's serial output is written to, opened
    /// for appending, created if missing (0600), never following a symlink.
    pub serial_out_path: PathBuf,
    /// Firecracker's serial rate limiter: only absent or `null`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limiter: Option<serde_json::Value>,
}

impl SerialConfig {
    /// Checks the path's text and the limiter.
    pub fn validate(&self) -> Result<(), ConfigError> {
        check_path("serial.serial_out_path", &self.serial_out_path)?;
        check_no_rate_limiter("serial.rate_limiter", &self.rate_limiter)
    }
}
