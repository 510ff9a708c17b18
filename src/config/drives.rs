//! The `drives` section and the bodies of `PUT` and `PATCH /drives/{id}`,
//! in Firecracker's shape (its swagger's `Drive` and `PartialDrive`), and
//! the conversion to the block device's [`BlockOptions`].
//!
//! teravm has virtio-blk over a host file with both of Firecracker's
//! engines (`io_engine` `Sync` and `Async`, io_uring) and its rate limiter
//! (`rate_limiter`, changed while running by `PATCH`): a vhost-user
//! `socket` is refused with the reason. What needs the file
//! (it exists, its size, read-only) is checked by the VMM when it opens
//! it; what needs the other drives (ids, one root device) by
//! [`check_drives`].

use std::path::PathBuf;

use serde::{Deserialize, Deserializer, Serialize};

use super::firecracker::{check_id, check_path};
use super::{invalid, ConfigError};
use crate::devices::virtio::block::{self, BlockOptions};
use crate::rate_limiter::RateLimiterConfig;

/// Longest `partuuid`: a GPT UUID is 36 characters; MBR's `SSSSSSSS-PP` is
/// shorter.
pub const MAX_PARTUUID_LEN: usize = 36;

/// Firecracker's `cache_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum CacheType {
    /// No FLUSH offered; the guest's writes reach the file, not the disk.
    #[default]
    Unsafe,
    /// FLUSH offered and honoured with `fdatasync`.
    Writeback,
}

/// Firecracker's `io_engine`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum IoEngine {
    /// Blocking reads and writes on the device's thread.
    #[default]
    Sync,
    /// io_uring: many requests in flight, answered as they complete (the
    /// ring is made when the VM starts; a host that refuses io_uring fails
    /// the start).
    Async,
}

/// One drive: an entry of the `drives` section and the body of `PUT
/// /drives/{drive_id}` (Firecracker's `Drive`): `drive_id` and
/// `is_root_device` required, `path_on_host` required as well (teravm has
/// no vhost-user backend), the rest optional.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DriveConfig {
    /// The drive's id: 1 to [`super::MAX_ID_LEN`] ASCII letters, digits and
    /// `_`; the last path segment of `PUT /drives/{drive_id}`.
    pub drive_id: String,
    /// The host file (or block device) the guest sees. Absent only in a
    /// vhost-user drive, which is refused.
    #[serde(default)]
    pub path_on_host: PathBuf,
    /// Whether the kernel boots from this drive (`root=` on its command
    /// line); at most one drive is.
    pub is_root_device: bool,
    /// The partition to boot from on the root device (`root=PARTUUID=`),
    /// instead of the whole device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partuuid: Option<String>,
    /// Offer the drive read-only (and open the file read-only). Absent or
    /// `null` means `false`, as in Firecracker.
    #[serde(default, deserialize_with = "null_is_default")]
    pub is_read_only: bool,
    /// Whether FLUSH is offered and honoured.
    #[serde(default)]
    pub cache_type: CacheType,
    /// The I/O engine: `Sync` or `Async` (absent or `null` means `Sync`).
    #[serde(default, deserialize_with = "null_is_default")]
    pub io_engine: IoEngine,
    /// Firecracker's rate limiter (`bandwidth` in bytes, `ops` in
    /// requests); absent, `null`, `{}` or buckets that limit nothing: no
    /// limit. `GET /vm/config` shows the buckets that limit.
    #[serde(
        default,
        serialize_with = "ser_limiter",
        skip_serializing_if = "limits_nothing"
    )]
    pub rate_limiter: Option<RateLimiterConfig>,
    /// A vhost-user-block backend's socket: only absent or `null`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socket: Option<PathBuf>,
}

fn limits_nothing(r: &Option<RateLimiterConfig>) -> bool {
    !r.is_some_and(|r| r.limits())
}

fn ser_limiter<S: serde::Serializer>(
    r: &Option<RateLimiterConfig>,
    s: S,
) -> Result<S::Ok, S::Error> {
    r.map(|r| r.effective()).serialize(s)
}

/// Checks a rate limiter's buckets (what they can hold).
fn check_limiter(r: &Option<RateLimiterConfig>) -> Result<(), ConfigError> {
    match r {
        Some(r) => r
            .check()
            .map_err(|e| invalid("drives.rate_limiter", e.to_string())),
        None => Ok(()),
    }
}

/// Takes `null` as the type's default (Firecracker's `Option` fields that
/// teravm holds as plain values).
pub(crate) fn null_is_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

impl DriveConfig {
    /// Checks every field that can be checked without the file and the
    /// other drives (see [`check_drives`]).
    pub fn validate(&self) -> Result<(), ConfigError> {
        check_id("drives.drive_id", &self.drive_id)?;
        if self.socket.is_some() {
            return Err(invalid(
                "drives.socket",
                "vhost-user block devices are not supported by teravm; give path_on_host \
                 (virtio-blk over a host file)",
            ));
        }
        if self.path_on_host.as_os_str().is_empty() {
            return Err(invalid(
                "drives.path_on_host",
                "is required (teravm's drives are virtio-blk over a host file)",
            ));
        }
        check_path("drives.path_on_host", &self.path_on_host)?;
        if let Some(partuuid) = &self.partuuid {
            check_partuuid(partuuid)?;
        }
        check_limiter(&self.rate_limiter)
    }
}

/// A `partuuid` goes on the kernel command line: hex digits and `-` only.
fn check_partuuid(partuuid: &str) -> Result<(), ConfigError> {
    if partuuid.is_empty()
        || partuuid.len() > MAX_PARTUUID_LEN
        || !partuuid.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-')
    {
        return Err(invalid(
            "drives.partuuid",
            format!(
                "{partuuid:?} is not a partition UUID (1..={MAX_PARTUUID_LEN} hex digits and '-')"
            ),
        ));
    }
    Ok(())
}

/// Checks a whole list of drives (the config file's section, or the
/// drives with one just put): ids unique, at most one root device.
pub fn check_drives(drives: &[DriveConfig]) -> Result<(), ConfigError> {
    for (i, d) in drives.iter().enumerate() {
        if drives[..i].iter().any(|e| e.drive_id == d.drive_id) {
            return Err(invalid(
                "drives.drive_id",
                format!("drive {:?} is listed twice", d.drive_id),
            ));
        }
    }
    let mut roots = drives.iter().filter(|d| d.is_root_device);
    if let (Some(a), Some(b)) = (roots.next(), roots.next()) {
        return Err(invalid(
            "drives.is_root_device",
            format!(
                "drives {:?} and {:?} are both root devices; at most one drive is",
                a.drive_id, b.drive_id
            ),
        ));
    }
    Ok(())
}

/// The body of `PATCH /drives/{drive_id}` (Firecracker's `PartialDrive`):
/// a new backing file and a rate limiter update. A body with only
/// `drive_id` is a no-op, as in Firecracker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DriveUpdate {
    /// The drive to update.
    pub drive_id: String,
    /// The new host file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_on_host: Option<PathBuf>,
    /// Changes the rate limiter: a bucket left out (or `null`) stays, one
    /// with a 0 `size` or `refill_time` is removed, any other replaces the
    /// old one, full (Firecracker's `BucketUpdate`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limiter: Option<RateLimiterConfig>,
}

impl DriveUpdate {
    /// Checks every field (the drive exists, and the file: the VMM).
    pub fn validate(&self) -> Result<(), ConfigError> {
        check_id("drives.drive_id", &self.drive_id)?;
        if let Some(path) = &self.path_on_host {
            check_path("drives.path_on_host", path)?;
        }
        check_limiter(&self.rate_limiter)
    }
}

impl From<CacheType> for block::CacheType {
    fn from(c: CacheType) -> Self {
        match c {
            CacheType::Unsafe => block::CacheType::Unsafe,
            CacheType::Writeback => block::CacheType::Writeback,
        }
    }
}

impl From<&DriveConfig> for BlockOptions {
    fn from(c: &DriveConfig) -> Self {
        BlockOptions {
            drive_id: c.drive_id.clone(),
            read_only: c.is_read_only,
            cache_type: c.cache_type.into(),
            rate_limiter: c.rate_limiter.unwrap_or_default(),
            io_engine: match c.io_engine {
                IoEngine::Sync => block::IoEngine::Sync,
                IoEngine::Async => block::IoEngine::Async,
            },
        }
    }
}

#[cfg(test)]
#[path = "drives_tests.rs"]
mod tests;
