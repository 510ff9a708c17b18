//! The `balloon` section and the bodies of `PUT /balloon`, `PATCH /balloon`
//! and `PATCH /balloon/statistics`, in Firecracker's shape (its swagger's
//! `Balloon`, `BalloonUpdate` and `BalloonStatsUpdate`), and the conversion
//! to the device's [`BalloonOptions`].
//!
//! Free page hinting is refused with the device's reason
//! ([`BalloonError::HintingNotSupported`]); free page reporting is taken.
//! What needs the machine configuration (a target above the guest's RAM)
//! is checked by the VMM with [`check_balloon_target`].

use serde::{Deserialize, Serialize};

use super::{invalid, ConfigError};
use crate::devices::virtio::balloon::{BalloonError, BalloonOptions, PAGES_PER_MIB};

/// The largest balloon target: virtio counts the balloon in 4 KiB pages in
/// a `u32` (`num_pages`), so 16 TiB less a MiB.
pub const MAX_BALLOON_MIB: u32 = (u32::MAX as u64 / PAGES_PER_MIB) as u32;

/// The `balloon` section and the body of `PUT /balloon` (Firecracker's
/// `Balloon`): `amount_mib` and `deflate_on_oom` required, the rest
/// optional.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BalloonConfig {
    /// Target balloon size in MiB.
    pub amount_mib: u32,
    /// Let the guest deflate the balloon when it runs out of memory.
    pub deflate_on_oom: bool,
    /// Seconds between statistics updates; 0 (the default) means no
    /// statistics.
    #[serde(default)]
    pub stats_polling_interval_s: u16,
    /// Offer free page reporting (the guest reports free pages, the host
    /// frees them before the guest reuses them).
    #[serde(default)]
    pub free_page_reporting: bool,
    /// Free page hinting: only `false` (see the module doc).
    #[serde(default)]
    pub free_page_hinting: bool,
}

impl BalloonConfig {
    /// Checks every field that can be checked without the machine
    /// configuration.
    pub fn validate(&self) -> Result<(), ConfigError> {
        check_amount(self.amount_mib)?;
        if self.free_page_hinting {
            return Err(invalid(
                "balloon.free_page_hinting",
                BalloonError::HintingNotSupported.to_string(),
            ));
        }
        Ok(())
    }
}

/// The body of `PATCH /balloon` (Firecracker's `BalloonUpdate`): a new
/// target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BalloonUpdate {
    /// New target balloon size in MiB.
    pub amount_mib: u32,
}

impl BalloonUpdate {
    /// Checks the target (against the guest's RAM: the VMM, with
    /// [`check_balloon_target`]).
    pub fn validate(&self) -> Result<(), ConfigError> {
        check_amount(self.amount_mib)
    }
}

/// The body of `PATCH /balloon/statistics` (Firecracker's
/// `BalloonStatsUpdate`): a new polling interval. Statistics cannot be
/// turned on or off once the balloon exists (the device refuses it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BalloonStatsUpdate {
    /// New interval in seconds between statistics updates.
    pub stats_polling_interval_s: u16,
}

impl BalloonStatsUpdate {
    /// Nothing to check alone: every `u16` is an interval.
    pub fn validate(&self) -> Result<(), ConfigError> {
        Ok(())
    }
}

fn check_amount(amount_mib: u32) -> Result<(), ConfigError> {
    if amount_mib > MAX_BALLOON_MIB {
        return Err(invalid(
            "balloon.amount_mib",
            format!(
                "{amount_mib} MiB is more than a balloon can hold ({MAX_BALLOON_MIB} MiB: \
                 virtio counts it in 4 KiB pages, in 32 bits)"
            ),
        ));
    }
    Ok(())
}

/// Checks a balloon target against the guest's RAM (for `PUT` and `PATCH
/// /balloon` and the config file, where the machine configuration is
/// known): the error names `balloon.amount_mib` and says both sizes.
pub fn check_balloon_target(amount_mib: u32, mem_size_mib: u64) -> Result<(), ConfigError> {
    let amount_mib = u64::from(amount_mib);
    if amount_mib > mem_size_mib {
        return Err(invalid(
            "balloon.amount_mib",
            BalloonError::TargetAboveRam {
                amount_mib,
                ram_mib: mem_size_mib,
            }
            .to_string(),
        ));
    }
    Ok(())
}

impl From<&BalloonConfig> for BalloonOptions {
    fn from(c: &BalloonConfig) -> Self {
        BalloonOptions {
            amount_mib: u64::from(c.amount_mib),
            deflate_on_oom: c.deflate_on_oom,
            stats_polling_interval_s: c.stats_polling_interval_s,
            free_page_reporting: c.free_page_reporting,
            free_page_hinting: c.free_page_hinting,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<BalloonConfig, String> {
        serde_json::from_str(text).map_err(|e| e.to_string())
    }

    #[test]
    fn firecracker_shape() {
        let c = parse(r#"{"amount_mib": 64, "deflate_on_oom": true}"#).unwrap();
        assert_eq!(
            c,
            BalloonConfig {
                amount_mib: 64,
                deflate_on_oom: true,
                stats_polling_interval_s: 0,
                free_page_reporting: false,
                free_page_hinting: false,
            }
        );
        c.validate().unwrap();
        let all = r#"{"amount_mib": 1, "deflate_on_oom": false, "stats_polling_interval_s": 5,
                      "free_page_reporting": true, "free_page_hinting": false}"#;
        let c = parse(all).unwrap();
        assert_eq!(
            serde_json::to_value(c).unwrap(),
            serde_json::from_str::<serde_json::Value>(all).unwrap(),
            "every field shown, as written"
        );
        for (body, needle) in [
            (r#"{"deflate_on_oom": true}"#, "missing field `amount_mib`"),
            (r#"{"amount_mib": 1}"#, "missing field `deflate_on_oom`"),
            (
                r#"{"amount_mib": 1, "deflate_on_oom": true, "x": 1}"#,
                "unknown field `x`",
            ),
            (
                r#"{"amount_mib": -1, "deflate_on_oom": true}"#,
                "invalid value",
            ),
            (
                r#"{"amount_mib": 1, "deflate_on_oom": true, "stats_polling_interval_s": 65536}"#,
                "invalid value",
            ),
        ] {
            let e = parse(body).unwrap_err();
            assert!(e.contains(needle), "{body}: {e}");
        }
    }

    #[test]
    fn validation_names_the_field() {
        let mut c = parse(r#"{"amount_mib": 1, "deflate_on_oom": true}"#).unwrap();
        c.free_page_hinting = true;
        let e = c.validate().unwrap_err().to_string();
        assert!(
            e.starts_with("invalid value for balloon.free_page_hinting: ")
                && e.contains("use free_page_reporting")
                && !e.contains('\n'),
            "{e}"
        );
        c.free_page_hinting = false;
        c.amount_mib = MAX_BALLOON_MIB;
        c.validate().unwrap();
        c.amount_mib = MAX_BALLOON_MIB + 1;
        let e = c.validate().unwrap_err().to_string();
        assert!(
            e.contains("balloon.amount_mib") && e.contains("16777215"),
            "{e}"
        );
        assert_eq!(MAX_BALLOON_MIB, 16_777_215);
        let e = BalloonUpdate {
            amount_mib: u32::MAX,
        }
        .validate()
        .unwrap_err();
        assert!(e.to_string().contains("balloon.amount_mib"), "{e}");
        BalloonStatsUpdate {
            stats_polling_interval_s: 0,
        }
        .validate()
        .unwrap();
    }

    #[test]
    fn target_against_ram() {
        check_balloon_target(128, 128).unwrap();
        check_balloon_target(0, 16).unwrap();
        let e = check_balloon_target(129, 128).unwrap_err().to_string();
        assert_eq!(
            e,
            "invalid value for balloon.amount_mib: the balloon target 129 MiB is above the \
             guest's RAM (128 MiB)"
        );
    }

    #[test]
    fn options_from_config() {
        let c = BalloonConfig {
            amount_mib: 300,
            deflate_on_oom: true,
            stats_polling_interval_s: 2,
            free_page_reporting: true,
            free_page_hinting: false,
        };
        assert_eq!(
            BalloonOptions::from(&c),
            BalloonOptions {
                amount_mib: 300,
                deflate_on_oom: true,
                stats_polling_interval_s: 2,
                free_page_reporting: true,
                free_page_hinting: false,
            }
        );
    }
}
