//! The VM configuration: one serde struct per section of the config file (and
//! per API resource), unknown fields refused, each with a `validate()` that
//! names the offending field in a one-line error.
//!
//! The spelling follows Firecracker where Firecracker has the item
//! (`machine-config`, `boot-source`, `vcpu_count`, `mem_size_mib`,
//! `huge_pages`); `memory` and `reclaim` are teravm's own. Each section has
//! its file: [`machine`], [`boot`], [`memory`], [`reclaim`]; Firecracker's
//! other sections (`logger`, `metrics`, the unsupported ones) and the checks
//! the sections share are in [`firecracker`], its devices in [`balloon`],
//! [`drives`], [`net`], [`vsock`], [`entropy`], [`serial`] and
//! [`hotplug`]. This file holds the whole ([`VmConfig`]): reading and
//! parsing the file, validating every section, the checks that read two
//! sections, and the one error type ([`ConfigError`]) every section uses;
//! every section's types are re-exported here.

pub mod balloon;
pub mod boot;
pub mod drives;
pub mod entropy;
pub mod firecracker;
pub mod hotplug;
pub mod machine;
pub mod memory;
pub mod net;
pub mod reclaim;
pub mod serial;
pub mod vsock;

use std::io::Read;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Largest config file read, in bytes (a config is a few hundred bytes; this
/// stops `--config-file /dev/zero` from filling memory).
pub const MAX_CONFIG_FILE_BYTES: u64 = 1 << 20;

/// A file's text, at most [`MAX_CONFIG_FILE_BYTES`] of UTF-8 (the config
/// file, and a `cpu-config` it names); `Err` says why not.
pub(crate) fn read_text(path: &Path) -> Result<String, String> {
    let file = std::fs::File::open(path).map_err(|e| e.to_string())?;
    let mut bytes = Vec::new();
    file.take(MAX_CONFIG_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| e.to_string())?;
    if bytes.len() as u64 > MAX_CONFIG_FILE_BYTES {
        return Err(format!("larger than {MAX_CONFIG_FILE_BYTES} bytes"));
    }
    String::from_utf8(bytes).map_err(|_| "not UTF-8 text".into())
}

pub use balloon::{check_balloon_target, BalloonConfig, BalloonStatsUpdate, BalloonUpdate};
pub use boot::{BootSource, MAX_BOOT_ARGS_LEN};
pub use drives::{check_drives, CacheType, DriveConfig, DriveUpdate, IoEngine};
pub use firecracker::{
    check_id, LogLevel, LoggerConfig, MetricsConfig, UnsupportedSection, MAX_ID_LEN,
};
pub use hotplug::{HotplugConfigError, MemoryHotplugConfig, MemoryHotplugSizeUpdate};
pub use machine::{
    CpuTemplate, HugePages, MachineConfig, MachineConfigBody, MachineConfigPatch, MAX_MEM_SIZE_MIB,
    MAX_VCPU_COUNT,
};
pub use memory::{check_guest_memfd, Backing, MemoryConfig, NumaPolicy};
pub use net::{check_nets, MacAddr, MacAddrError, NetConfig, NetUpdate};
pub use reclaim::{check_worker_threads, ReclaimConfig, MAX_WORKERS_PER_NODE, MAX_WORKER_THREADS};
pub use vsock::VsockConfig;

/// Errors of configuration parsing and validation.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    /// The config file could not be read.
    #[error("cannot read config file {path}: {reason}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The JSON is malformed, has an unknown field or a wrong type.
    #[error("invalid config file {path}: {reason}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// serde's message, which names the field and the position.
        reason: String,
    },
    /// A field has a value outside its range.
    #[error("invalid value for {field}: {reason}")]
    InvalidField {
        /// Dotted path of the field, e.g. `machine-config.vcpu_count`.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// A log level name that is not one of the accepted spellings.
    #[error(
        "{0:?} is not a log level; use one of Off, Error, Warning (Warn), Info, Debug, Trace \
         (any case)"
    )]
    LogLevel(String),
    /// A Firecracker section for a feature teravm does not have.
    #[error("not supported yet: {0} (teravm has no such feature; leave the section empty)")]
    NotSupported(&'static str),
}

fn invalid(field: &'static str, reason: impl Into<String>) -> ConfigError {
    ConfigError::InvalidField {
        field,
        reason: reason.into(),
    }
}

/// The whole configuration of one microVM, in the config file's shape.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VmConfig {
    /// vCPUs, memory size, page backing.
    #[serde(rename = "machine-config", default)]
    pub machine_config: MachineConfig,
    /// What the guest runs and its command line.
    #[serde(rename = "boot-source", default)]
    pub boot_source: BootSource,
    /// Backing and NUMA placement of guest RAM.
    #[serde(default)]
    pub memory: MemoryConfig,
    /// How guest RAM is freed at shutdown.
    #[serde(default)]
    pub reclaim: ReclaimConfig,
    /// Firecracker's logger settings (applied at launch, like the flags).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logger: Option<LoggerConfig>,
    /// Firecracker's metrics output (applied at launch, like the flag).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics: Option<MetricsConfig>,
    /// Firecracker's block devices, in the order they are attached (absent
    /// or `null`: none; always shown, as Firecracker shows it).
    #[serde(default, deserialize_with = "drives::null_is_default")]
    pub drives: Vec<DriveConfig>,
    /// Firecracker's network interfaces, in the order they are attached
    /// (absent or `null`: none; always shown).
    #[serde(
        rename = "network-interfaces",
        default,
        deserialize_with = "drives::null_is_default"
    )]
    pub network_interfaces: Vec<NetConfig>,
    /// Firecracker's vsock device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vsock: Option<VsockConfig>,
    /// Firecracker's balloon device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub balloon: Option<BalloonConfig>,
    /// Firecracker's metadata service configuration.
    #[serde(
        rename = "mmds-config",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub mmds_config: Option<crate::mmds::MmdsConfig>,
    /// Firecracker's entropy device (virtio-rng).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entropy: Option<entropy::EntropyConfig>,
    /// Firecracker's custom CPU template (`PUT /cpu-config`), inline or
    /// the path of its JSON file.
    #[serde(
        rename = "cpu-config",
        default,
        skip_serializing,
        deserialize_with = "firecracker::cpu_config_inline_or_path"
    )]
    pub cpu_config: Option<crate::vstate::template::CustomTemplate>,
    /// Firecracker's virtio-pmem devices: only empty.
    #[serde(default, skip_serializing)]
    pub pmem: UnsupportedSection,
    /// Firecracker's memory hotplug (virtio-mem): the region above RAM,
    /// one device per guest node.
    #[serde(
        rename = "memory-hotplug",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub memory_hotplug: Option<MemoryHotplugConfig>,
}

impl VmConfig {
    /// Parses a config from JSON text and validates it.
    pub fn from_json(text: &str, path: &Path) -> Result<Self, ConfigError> {
        let config: VmConfig = serde_json::from_str(text).map_err(|e| ConfigError::Parse {
            path: path.to_path_buf(),
            // serde quotes an unknown field or variant as written, and a JSON
            // string may hold an escaped newline: keep the error one line.
            reason: e.to_string().replace(['\r', '\n'], " "),
        })?;
        config.validate()?;
        Ok(config)
    }

    /// Reads (at most [`MAX_CONFIG_FILE_BYTES`]), parses and validates a
    /// config file.
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let text = read_text(path).map_err(|reason| ConfigError::Read {
            path: path.to_path_buf(),
            reason,
        })?;
        Self::from_json(&text, path)
    }

    /// How many virtio devices the configuration asks for: the balloon,
    /// the drives, the network interfaces and the vsock (one GSI each).
    ///
    /// The memory-hotplug devices are not counted here: there is one per
    /// guest node, and the guest nodes are known only at launch (with
    /// `memory.host_nodes` absent, every host node with memory). The start
    /// path that wires them counts them then, against
    /// [`check_device_count`].
    pub fn device_count(&self) -> usize {
        usize::from(self.balloon.is_some())
            + self.drives.len()
            + self.network_interfaces.len()
            + usize::from(self.vsock.is_some())
            + usize::from(self.entropy.is_some())
            // One virtio-mem device per node part: at least one.
            + usize::from(self.memory_hotplug.is_some())
    }

    /// Checks every section.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.machine_config.validate()?;
        if let Some(t) = &self.cpu_config {
            t.validate()
                .map_err(|e| invalid("cpu-config", e.to_string()))?;
        }
        self.boot_source.validate()?;
        self.memory.validate()?;
        self.reclaim.validate()?;
        if let Some(logger) = &self.logger {
            logger.validate()?;
        }
        if let Some(metrics) = &self.metrics {
            metrics.validate()?;
        }
        for drive in &self.drives {
            drive.validate()?;
        }
        check_drives(&self.drives)?;
        for net in &self.network_interfaces {
            net.validate()?;
        }
        check_nets(&self.network_interfaces)?;
        check_device_count(self.device_count())?;
        if let Some(vsock) = &self.vsock {
            vsock.validate()?;
        }
        if let Some(balloon) = &self.balloon {
            balloon.validate()?;
            check_balloon_target(balloon.amount_mib, self.machine_config.mem_size_mib)?;
        }
        check_backing_pages(&self.machine_config, &self.memory)?;
        if let Some(m) = &self.mmds_config {
            let ids: Vec<&str> = self
                .network_interfaces
                .iter()
                .map(|n| n.iface_id.as_str())
                .collect();
            m.check_ifaces(&ids)
                .map_err(|e| invalid("mmds-config", e.to_string()))?;
        }
        self.pmem.check("pmem")?;
        if let Some(h) = &self.memory_hotplug {
            h.validate()
                .map_err(|e| invalid("memory-hotplug", e.to_string()))?;
        }
        check_hotplug_pages(&self.machine_config, self.memory_hotplug.as_ref())?;
        self.entropy.map_or(Ok(()), |e| e.validate())
    }
}

/// Most virtio devices a microVM can have: one interrupt line each, GSI 5
/// to 23 (Firecracker's legacy GSIs; the IOAPIC has 24 pins).
pub const MAX_DEVICES: usize = crate::devices::bus::mmio::MAX_MMIO_DEVICES;

/// Refuses more devices than a guest has interrupt lines for.
pub fn check_device_count(count: usize) -> Result<(), ConfigError> {
    if count > MAX_DEVICES {
        return Err(ConfigError::InvalidField {
            field: "devices",
            reason: format!(
                "{count} devices (balloon, drives, network interfaces, vsock, entropy and one \
                 virtio-mem per guest node together) but a guest has interrupt lines for \
                 {MAX_DEVICES} at most (GSI {} to {}, as in Firecracker)",
                crate::devices::bus::mmio::FIRST_GSI,
                crate::devices::bus::mmio::LAST_GSI
            ),
        });
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Checks that read two sections (also made when one of them is changed
// through the API).

/// The page size and the backing agree: guest_memfd takes no hugetlb pages
/// (transparent huge pages are not offered for it either: it gets 4 KiB
/// pages, said in the log and `GET /memory`).
pub fn check_backing_pages(
    machine: &MachineConfig,
    memory: &MemoryConfig,
) -> Result<(), ConfigError> {
    match (memory.backing, machine.huge_pages.hugetlb_page_bytes()) {
        (Backing::GuestMemfd, Some(page)) => Err(invalid(
            "memory.backing",
            format!(
                "guest_memfd has no {} MiB huge pages in this kernel (4 KiB pages only): set machine-config.huge_pages to \"None\" or choose another backing",
                page >> 20
            ),
        )),
        (Backing::GuestMemfd, None) if machine.track_dirty_pages => Err(invalid(
            "machine-config.track_dirty_pages",
            "KVM keeps no dirty log of guest_memfd memory: set it to false or choose another \
             memory.backing",
        )),
        _ => Ok(()),
    }
}

/// Refuses a virtio-mem block smaller than the hugetlb page backing the
/// guest: an UNPLUG of one block would free no whole huge page, so the
/// memory would stay while the guest believes it gave it back.
pub fn check_hotplug_pages(
    machine: &MachineConfig,
    hotplug: Option<&MemoryHotplugConfig>,
) -> Result<(), ConfigError> {
    let (Some(h), Some(page)) = (hotplug, machine.huge_pages.hugetlb_page_bytes()) else {
        return Ok(());
    };
    if u64::from(h.block_size_mib) << 20 >= page {
        return Ok(());
    }
    Err(invalid(
        "memory-hotplug.block_size_mib",
        format!(
            "block_size_mib {} is below machine-config.huge_pages' {} MiB pages: an unplugged \
             block would free no whole huge page; use block_size_mib of at least {} or other \
             huge_pages",
            h.block_size_mib,
            page >> 20,
            page >> 20
        ),
    ))
}

impl From<&VmConfig> for crate::memory::MemoryOptions {
    /// `machine-config` (size, page size) and `memory` (backing, nodes,
    /// policy, populate) together.
    fn from(c: &VmConfig) -> Self {
        crate::memory::MemoryOptions {
            mem_bytes: c.machine_config.mem_bytes(),
            page_size: c.machine_config.huge_pages.into(),
            backing: c.memory.backing.into(),
            host_nodes: c.memory.host_nodes.clone(),
            policy: c.memory.numa_policy.into(),
            populate: c.memory.populate,
        }
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod conversion_tests {
    use super::*;
    use crate::memory;

    #[test]
    fn reclaim_options_from_config() {
        let o = memory::ReclaimOptions::from(&ReclaimConfig::default());
        assert_eq!(o, memory::ReclaimOptions::default(), "the same defaults");
        assert_eq!(
            o,
            memory::ReclaimOptions {
                workers_per_node: 2,
                chunk_bytes: None,
                parallel_threshold_bytes: 1 << 30,
                steal: true
            }
        );
    }

    #[test]
    fn memory_options_from_config() {
        let mut c = VmConfig::default();
        c.machine_config.mem_size_mib = 4096;
        c.machine_config.huge_pages = HugePages::Huge2M;
        c.memory = MemoryConfig {
            backing: Backing::Memfd,
            host_nodes: Some(vec![1, 0]),
            numa_policy: NumaPolicy::Preferred,
            populate: true,
        };
        let o = memory::MemoryOptions::from(&c);
        assert_eq!(
            o,
            memory::MemoryOptions {
                mem_bytes: 4 << 30,
                page_size: memory::PageSize::Huge2M,
                backing: memory::Backing::Memfd,
                host_nodes: Some(vec![1, 0]),
                policy: memory::NumaPolicy::Preferred,
                populate: true,
            }
        );
        for (h, p) in [
            (HugePages::None, memory::PageSize::Small),
            (HugePages::Transparent, memory::PageSize::Transparent),
            (HugePages::Huge1G, memory::PageSize::Huge1G),
        ] {
            assert_eq!(memory::PageSize::from(h), p);
            assert_eq!(h.hugetlb_page_bytes(), p.hugetlb_bytes());
        }
        assert_eq!(
            memory::NumaPolicy::from(NumaPolicy::None),
            memory::NumaPolicy::None
        );
    }
}
