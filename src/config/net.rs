//! The `network-interfaces` section and the bodies of `PUT` and `PATCH
//! /network-interfaces/{id}`, in Firecracker's shape (its swagger's
//! `NetworkInterface` and `PartialNetworkInterface`), and the guest MAC
//! address type.
//!
//! teravm has virtio-net over a host TAP device with Firecracker's receive
//! and transmit rate limiters ([`crate::rate_limiter`]). Whether the TAP device exists and can be opened is checked by
//! the VMM when it opens it; what needs the other interfaces (ids, TAP
//! names and MACs unique) by [`check_nets`].

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::firecracker::check_id;
use super::{invalid, ConfigError};
use crate::rate_limiter::RateLimiterConfig;

/// Longest TAP device name, in bytes: `IFNAMSIZ` less the NUL.
pub const MAX_HOST_DEV_NAME_LEN: usize = 15;
/// The longest macvtap device path `host_dev_name` may be (`PATH_MAX` less
/// the NUL).
pub const MAX_HOST_DEV_PATH_LEN: usize = 4095;
/// Smallest MTU offered to the guest (IPv4's minimum, as Firecracker).
pub const MIN_MTU: u16 = 68;

/// A guest MAC address: six octets, written `aa:bb:cc:dd:ee:ff` (two hex
/// digits each, any case; shown in lower case). Only unicast, non-zero
/// addresses exist (what Linux's `is_valid_ether_addr` takes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MacAddr([u8; 6]);

/// Why a text or octets are not a guest MAC address.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MacAddrError {
    /// Not six pairs of hex digits separated by `:`.
    #[error("{0:?} is not a MAC address (six pairs of hex digits separated by ':')")]
    Syntax(String),
    /// The group bit (bit 0 of the first octet) is set.
    #[error("{0} is a multicast address; a guest MAC must be unicast")]
    Multicast(String),
    /// All octets zero.
    #[error("00:00:00:00:00:00 is not a valid MAC address")]
    Zero,
}

impl MacAddr {
    /// A MAC address from its octets, if it is unicast and non-zero.
    pub fn from_bytes(octets: [u8; 6]) -> Result<MacAddr, MacAddrError> {
        if octets == [0; 6] {
            return Err(MacAddrError::Zero);
        }
        if octets[0] & 1 != 0 {
            return Err(MacAddrError::Multicast(MacAddr(octets).to_string()));
        }
        Ok(MacAddr(octets))
    }

    /// The six octets, as virtio-net's configuration space holds them.
    pub fn bytes(self) -> [u8; 6] {
        self.0
    }
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let o = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            o[0], o[1], o[2], o[3], o[4], o[5]
        )
    }
}

impl FromStr for MacAddr {
    type Err = MacAddrError;

    fn from_str(s: &str) -> Result<Self, MacAddrError> {
        let syntax = || MacAddrError::Syntax(s.to_string());
        let mut octets = [0u8; 6];
        let mut parts = s.split(':');
        for o in &mut octets {
            let part = parts.next().ok_or_else(syntax)?;
            if part.len() != 2 || !part.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(syntax());
            }
            *o = u8::from_str_radix(part, 16).map_err(|_| syntax())?;
        }
        if parts.next().is_some() {
            return Err(syntax());
        }
        MacAddr::from_bytes(octets)
    }
}

impl<'de> Deserialize<'de> for MacAddr {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

impl Serialize for MacAddr {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// A `guest_mac` whose error names the field (serde places a custom error
/// after the whole object, where the field cannot be found).
fn guest_mac<'de, D: Deserializer<'de>>(d: D) -> Result<Option<MacAddr>, D::Error> {
    Option::<String>::deserialize(d)?
        .map(|s| s.parse())
        .transpose()
        .map_err(|e| serde::de::Error::custom(format!("network-interfaces.guest_mac: {e}")))
}

/// One network interface: an entry of the `network-interfaces` section and
/// the body of `PUT /network-interfaces/{iface_id}` (Firecracker's
/// `NetworkInterface`): `iface_id` and `host_dev_name` required.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetConfig {
    /// The interface's id: 1 to [`super::MAX_ID_LEN`] ASCII letters, digits
    /// and `_`; the last path segment of `PUT /network-interfaces/{id}`.
    pub iface_id: String,
    /// The host TAP device (1 to [`MAX_HOST_DEV_NAME_LEN`] bytes), or the
    /// absolute path of a macvtap or ipvtap device node (`/dev/tapN`).
    pub host_dev_name: String,
    /// The guest's MAC address; absent: the guest driver picks one.
    #[serde(
        default,
        deserialize_with = "guest_mac",
        skip_serializing_if = "Option::is_none"
    )]
    pub guest_mac: Option<MacAddr>,
    /// The MTU offered to the guest (`VIRTIO_NET_F_MTU`), [`MIN_MTU`] to
    /// 65535; absent: none offered, the guest uses its default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u16>,
    /// The receive rate limiter (frames from the tap to the guest: one op
    /// and the frame's bytes each); absent, `null` or `{}`: no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rx_rate_limiter: Option<RateLimiterConfig>,
    /// The transmit rate limiter (frames from the guest to the tap).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tx_rate_limiter: Option<RateLimiterConfig>,
}

impl NetConfig {
    /// Checks every field that can be checked without the host and the
    /// other interfaces (see [`check_nets`]).
    pub fn validate(&self) -> Result<(), ConfigError> {
        check_id("network-interfaces.iface_id", &self.iface_id)?;
        check_host_dev_name(&self.host_dev_name)?;
        if let Some(mtu) = self.mtu {
            if mtu < MIN_MTU {
                return Err(invalid(
                    "network-interfaces.mtu",
                    format!("{mtu} is not in {MIN_MTU}..=65535"),
                ));
            }
        }
        check_limiters(&self.rx_rate_limiter, &self.tx_rate_limiter)
    }
}

/// Checks a receive and a transmit rate limiter (what the buckets hold).
fn check_limiters(
    rx: &Option<RateLimiterConfig>,
    tx: &Option<RateLimiterConfig>,
) -> Result<(), ConfigError> {
    let one = |field: &'static str, l: &Option<RateLimiterConfig>| {
        l.as_ref()
            .map_or(Ok(()), RateLimiterConfig::check)
            .map_err(|e| invalid(field, e.to_string()))
    };
    one("network-interfaces.rx_rate_limiter", rx)?;
    one("network-interfaces.tx_rate_limiter", tx)
}

/// A TAP name as Linux takes it (`dev_valid_name`): 1 to 15 bytes, not `.`
/// or `..`, no `/`, `:`, whitespace or NUL; or the absolute path of a
/// macvtap or ipvtap character device (`/dev/tap<ifindex>`, as flintlock
/// names one), at most [`MAX_HOST_DEV_PATH_LEN`] bytes without NUL or
/// whitespace (what it is, is checked when it is opened).
fn check_host_dev_name(name: &str) -> Result<(), ConfigError> {
    if name.starts_with('/') {
        if name.len() > MAX_HOST_DEV_PATH_LEN
            || name.chars().any(|c| c == '\0' || c.is_whitespace())
        {
            return Err(invalid(
                "network-interfaces.host_dev_name",
                format!(
                    "{name:?} is not a device path (at most {MAX_HOST_DEV_PATH_LEN} bytes, \
                     no NUL or whitespace)"
                ),
            ));
        }
        return Ok(());
    }
    let bad = name.is_empty()
        || name.len() > MAX_HOST_DEV_NAME_LEN
        || name == "."
        || name == ".."
        || name
            .chars()
            .any(|c| c == '/' || c == ':' || c == '\0' || c.is_whitespace());
    if bad {
        return Err(invalid(
            "network-interfaces.host_dev_name",
            format!(
                "{name:?} is neither a network device name (1..={MAX_HOST_DEV_NAME_LEN} bytes, \
                 not . or .., no '/', ':' or whitespace) nor a macvtap device's absolute path"
            ),
        ));
    }
    Ok(())
}

/// Checks a whole list of interfaces (the config file's section, or the
/// interfaces with one just put): ids, TAP devices and guest MACs unique.
pub fn check_nets(nets: &[NetConfig]) -> Result<(), ConfigError> {
    for (i, n) in nets.iter().enumerate() {
        let before = &nets[..i];
        if before.iter().any(|e| e.iface_id == n.iface_id) {
            return Err(invalid(
                "network-interfaces.iface_id",
                format!("interface {:?} is listed twice", n.iface_id),
            ));
        }
        if let Some(e) = before.iter().find(|e| e.host_dev_name == n.host_dev_name) {
            return Err(invalid(
                "network-interfaces.host_dev_name",
                format!(
                    "interfaces {:?} and {:?} both use the TAP device {:?}",
                    e.iface_id, n.iface_id, n.host_dev_name
                ),
            ));
        }
        if let Some(mac) = n.guest_mac {
            if let Some(e) = before.iter().find(|e| e.guest_mac == Some(mac)) {
                return Err(invalid(
                    "network-interfaces.guest_mac",
                    format!(
                        "interfaces {:?} and {:?} both have the MAC address {mac}",
                        e.iface_id, n.iface_id
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// The body of `PATCH /network-interfaces/{iface_id}` (Firecracker's
/// `PartialNetworkInterface`): new rate limiters, applied to the running
/// device. In each limiter a bucket left out (or `null`) stays as it is, one
/// with a 0 `size` or `refill_time` is removed, any other replaces the old
/// one ([`RateLimiterConfig::patched`]); a limiter left out changes nothing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetUpdate {
    /// The interface to update.
    pub iface_id: String,
    /// The receive limiter's buckets to change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rx_rate_limiter: Option<RateLimiterConfig>,
    /// The transmit limiter's buckets to change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tx_rate_limiter: Option<RateLimiterConfig>,
}

impl NetUpdate {
    /// Checks every field (the interface exists: the VMM).
    pub fn validate(&self) -> Result<(), ConfigError> {
        check_id("network-interfaces.iface_id", &self.iface_id)?;
        check_limiters(&self.rx_rate_limiter, &self.tx_rate_limiter)
    }

    /// `net` with this update's limiters applied, as `GET /vm/config`
    /// shows it afterwards (only the buckets that limit; none: absent).
    pub fn applied_to(&self, net: &NetConfig) -> NetConfig {
        let apply = |old: &Option<RateLimiterConfig>, new: &Option<RateLimiterConfig>| {
            let next = match new {
                None => return *old,
                Some(n) => old.unwrap_or_default().patched(n),
            };
            next.limits().then(|| next.effective())
        };
        NetConfig {
            rx_rate_limiter: apply(&net.rx_rate_limiter, &self.rx_rate_limiter),
            tx_rate_limiter: apply(&net.tx_rate_limiter, &self.tx_rate_limiter),
            ..net.clone()
        }
    }
}

#[cfg(test)]
#[path = "net_tests.rs"]
mod tests;
