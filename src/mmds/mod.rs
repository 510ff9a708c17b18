//! The microVM metadata service (MMDS), versions 1 and 2, as Firecracker
//! has it: a JSON store the host fills over the API (`PUT`/`PATCH`/`GET
//! /mmds`, `--metadata FILE`) and the guest reads over HTTP at a link-local
//! address on the network interfaces `PUT /mmds/config` names. The guest's
//! frames for that address are answered by the network device itself
//! ([`crate::devices::virtio::net::mmds`], a smoltcp stack), never reaching
//! the tap.
//!
//! - [`store`]: the contents, the merge patch, the size limit, the JSON and
//!   IMDS output formats;
//! - [`token`]: V2 session tokens and their time to live;
//! - [`http`]: the guest's requests and Firecracker's answers;
//! - [`MmdsConfig`]: the `/mmds/config` body and the `mmds-config` section.
//!
//! One [`Mmds`] exists per process ([`shared`]), behind a mutex: the API
//! (the VMM thread) writes it, the network devices' threads read it and make
//! tokens.

pub mod http;
pub mod store;
pub mod token;

#[cfg(test)]
mod tests;

use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

pub use store::{OutputFormat, Store, StoreError};
pub use token::{TokenAuthority, TokenError};

/// The MMDS address when `ipv4_address` is not given.
pub const DEFAULT_IPV4: Ipv4Addr = Ipv4Addr::new(169, 254, 169, 254);

/// The MMDS version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum MmdsVersion {
    /// No tokens needed.
    #[default]
    V1,
    /// `GET`s need a session token.
    V2,
}

/// `PUT /mmds/config` and the config file's `mmds-config`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MmdsConfig {
    /// V1 (default) or V2.
    #[serde(default)]
    pub version: MmdsVersion,
    /// The interfaces (`iface_id`s) whose guest frames may reach the MMDS.
    pub network_interfaces: Vec<String>,
    /// The MMDS address (169.254.169.254 when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv4_address: Option<Ipv4Addr>,
    /// Answer in the IMDS text format whatever the `Accept` header says.
    #[serde(default)]
    pub imds_compat: bool,
}

/// Why an MMDS configuration is refused (Firecracker's wording).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MmdsConfigError {
    /// `network_interfaces` is empty.
    #[error("The list of network interface IDs that allow forwarding MMDS requests is empty.")]
    EmptyNetworkIfaceList,
    /// Not in 169.254.1.0 to 169.254.254.255.
    #[error("The MMDS IPv4 address is not link local.")]
    InvalidIpv4Addr,
    /// An id that names no configured interface.
    #[error(
        "The list of network interface IDs provided contains at least one ID that does not \
         correspond to any existing network interface."
    )]
    InvalidNetworkInterfaceId,
}

/// Whether `ip` is a link-local address Firecracker takes: 169.254.0.0/16
/// without its first and last /24 (reserved by RFC 3927).
pub fn is_link_local_valid(ip: Ipv4Addr) -> bool {
    matches!(ip.octets(), [169, 254, x, _] if x != 0 && x != 255)
}

impl MmdsConfig {
    /// The address the guest reaches the MMDS at.
    pub fn ipv4(&self) -> Ipv4Addr {
        self.ipv4_address.unwrap_or(DEFAULT_IPV4)
    }

    /// The checks that need nothing else: an address, some interfaces.
    pub fn validate(&self) -> Result<(), MmdsConfigError> {
        if self.ipv4_address.is_some_and(|ip| !is_link_local_valid(ip)) {
            return Err(MmdsConfigError::InvalidIpv4Addr);
        }
        if self.network_interfaces.is_empty() {
            return Err(MmdsConfigError::EmptyNetworkIfaceList);
        }
        Ok(())
    }

    /// [`MmdsConfig::validate`], and every interface among `ifaces` (the
    /// configured `iface_id`s).
    pub fn check_ifaces(&self, ifaces: &[&str]) -> Result<(), MmdsConfigError> {
        self.validate()?;
        if !self
            .network_interfaces
            .iter()
            .all(|id| ifaces.contains(&id.as_str()))
        {
            return Err(MmdsConfigError::InvalidNetworkInterfaceId);
        }
        Ok(())
    }
}

/// Counters of the guest's requests (Firecracker's `mmds` metrics names).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct MmdsCounters {
    /// `GET`s without a token.
    pub no_token: u64,
    /// `GET`s with an invalid or expired token.
    pub invalid_token: u64,
}

/// The metadata service's state: contents, version, tokens.
#[derive(Debug)]
pub struct Mmds {
    store: Store,
    version: MmdsVersion,
    imds_compat: bool,
    tokens: TokenAuthority,
    epoch: Instant,
    /// The guest's requests, counted.
    pub counters: MmdsCounters,
}

/// The one MMDS of a process, shared by the API and the network devices.
pub type SharedMmds = Arc<Mutex<Mmds>>;

/// A new shared MMDS whose store holds at most `limit` bytes.
pub fn shared(limit: usize) -> SharedMmds {
    Arc::new(Mutex::new(Mmds::new(limit)))
}

/// Locks a shared MMDS (a poisoned lock is taken as it is: the store is
/// never left half-written).
pub fn lock(m: &SharedMmds) -> std::sync::MutexGuard<'_, Mmds> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Mmds {
    /// An empty V1 MMDS whose store holds at most `limit` bytes.
    pub fn new(limit: usize) -> Mmds {
        Mmds {
            store: Store::new(limit),
            version: MmdsVersion::V1,
            imds_compat: false,
            tokens: TokenAuthority::new(),
            epoch: Instant::now(),
            counters: MmdsCounters::default(),
        }
    }

    /// The contents.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The contents, to change.
    pub fn store_mut(&mut self) -> &mut Store {
        &mut self.store
    }

    /// The version in force.
    pub fn version(&self) -> MmdsVersion {
        self.version
    }

    /// Whether the IMDS text format is always used.
    pub fn imds_compat(&self) -> bool {
        self.imds_compat
    }

    /// Applies a configuration's version and output format.
    pub fn configure(&mut self, config: &MmdsConfig) {
        self.version = config.version;
        self.imds_compat = config.imds_compat;
    }

    fn now(&self) -> Duration {
        self.epoch.elapsed()
    }

    /// A token for `ttl_seconds`.
    pub fn generate_token(&mut self, ttl_seconds: u32) -> Result<String, TokenError> {
        let now = self.now();
        self.tokens.generate(ttl_seconds, now)
    }

    /// Whether `token` is valid now.
    pub fn is_valid_token(&self, token: &str) -> bool {
        self.tokens.is_valid(token, self.now())
    }
}
