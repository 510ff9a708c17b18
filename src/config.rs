//! The VM configuration: one serde struct per section of the config file (and
//! per API resource), unknown fields refused, each with a `validate()` that
//! names the offending field in a one-line error.
//!
//! The spelling follows Firecracker where Firecracker has the item
//! (`machine-config`, `boot-source`, `vcpu_count`, `mem_size_mib`,
//! `huge_pages`); `memory` and `reclaim` are teravm's own. Firecracker's
//! other fields and sections (`smt`, `logger`, `metrics`, `mmds-config`,
//! ...) are in [`firecracker`], its devices in [`balloon`], [`drives`],
//! [`net`] and [`vsock`].

pub mod balloon;
pub mod drives;
pub mod entropy;
pub mod firecracker;
pub mod hotplug;
pub mod net;
pub mod serial;
pub mod vsock;

use std::io::Read;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Largest guest: 64 TiB of address space (sparse; only touched memory costs).
pub const MAX_MEM_SIZE_MIB: u64 = 64 << 20;
/// Most vCPUs a microVM may have: Firecracker's bound (its
/// `MAX_SUPPORTED_VCPUS`).
pub const MAX_VCPU_COUNT: u8 = 32;
/// Longest firmware / kernel command line, in bytes.
pub const MAX_BOOT_ARGS_LEN: usize = 2048;
/// Most reclaim workers per NUMA node.
pub const MAX_WORKERS_PER_NODE: u32 = 256;
/// Most reclaim (or populate) worker threads in all: `workers_per_node`
/// times the nodes the guest spans. A host with 8 nodes can still run 128
/// per node; 256 per node on 8 nodes is refused.
pub const MAX_WORKER_THREADS: u64 = 1024;

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

/// Whether this kernel's KVM can back guest RAM with guest_memfd, for a
/// `memory` section that asks for it: a clear error naming what is missing.
pub fn check_guest_memfd(
    memory: &MemoryConfig,
    support: &crate::memory::GuestMemfdSupport,
) -> Result<(), ConfigError> {
    if memory.backing != Backing::GuestMemfd {
        return Ok(());
    }
    support
        .check()
        .map_err(|why| invalid("memory.backing", format!("guest_memfd: {why}")))
}

/// Checks the total of worker threads a reclaim (or populate) of a guest
/// spanning `nodes` host nodes would start.
pub fn check_worker_threads(workers_per_node: u32, nodes: usize) -> Result<(), ConfigError> {
    let total = u64::from(workers_per_node) * nodes as u64;
    if total > MAX_WORKER_THREADS {
        return Err(invalid(
            "reclaim.workers_per_node",
            format!(
                "{workers_per_node} per node on {nodes} nodes is {total} threads, more than \
                 {MAX_WORKER_THREADS}"
            ),
        ));
    }
    Ok(())
}
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
pub use drives::{check_drives, CacheType, DriveConfig, DriveUpdate, IoEngine};
pub use firecracker::{
    check_id, CpuTemplate, LogLevel, LoggerConfig, MachineConfigBody, MachineConfigPatch,
    MetricsConfig, UnsupportedSection, MAX_ID_LEN,
};
pub use hotplug::{HotplugConfigError, MemoryHotplugConfig, MemoryHotplugSizeUpdate};
pub use net::{check_nets, MacAddr, MacAddrError, NetConfig, NetUpdate};
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

/// How guest memory is backed by pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum HugePages {
    /// 4 KiB pages only (`MADV_NOHUGEPAGE`).
    None,
    /// Transparent huge pages (`MADV_HUGEPAGE`), the default.
    #[default]
    Transparent,
    /// hugetlbfs 2 MiB pages (must be reserved on the host).
    #[serde(rename = "2M")]
    Huge2M,
    /// hugetlbfs 1 GiB pages (must be reserved on the host).
    #[serde(rename = "1G")]
    Huge1G,
}

impl HugePages {
    /// The size of a hugetlb page, if this is a hugetlb backing.
    pub fn hugetlb_page_bytes(self) -> Option<u64> {
        match self {
            HugePages::Huge2M => Some(2 << 20),
            HugePages::Huge1G => Some(1 << 30),
            HugePages::None | HugePages::Transparent => None,
        }
    }
}

/// The `machine-config` section, read and written through
/// [`MachineConfigBody`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "MachineConfigBody", into = "MachineConfigBody")]
pub struct MachineConfig {
    /// Number of vCPUs, 1 to [`MAX_VCPU_COUNT`].
    pub vcpu_count: u8,
    /// Guest RAM in MiB (the MMIO gap below 4 GiB is not counted).
    pub mem_size_mib: u64,
    /// Page backing of guest RAM.
    pub huge_pages: HugePages,
    /// Two threads per core in the CPUID topology (`vcpu_count` 1 or even).
    pub smt: bool,
    /// KVM's dirty log on the guest memslots.
    pub track_dirty_pages: bool,
    /// The static CPU template (checked against the host at start).
    pub cpu_template: CpuTemplate,
}

impl Default for MachineConfig {
    fn default() -> Self {
        MachineConfig {
            vcpu_count: 1,
            mem_size_mib: 128,
            huge_pages: HugePages::default(),
            smt: false,
            track_dirty_pages: false,
            cpu_template: CpuTemplate::None,
        }
    }
}

impl MachineConfig {
    /// Checks every field.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.vcpu_count == 0 || self.vcpu_count > MAX_VCPU_COUNT {
            return Err(invalid(
                "machine-config.vcpu_count",
                format!("{} is not in 1..={MAX_VCPU_COUNT}", self.vcpu_count),
            ));
        }
        if self.smt && self.vcpu_count > 1 && self.vcpu_count % 2 == 1 {
            return Err(invalid(
                "machine-config.vcpu_count",
                format!(
                    "{} is odd: with smt (two threads per core) it must be 1 or even",
                    self.vcpu_count
                ),
            ));
        }
        if self.mem_size_mib < 16 || self.mem_size_mib > MAX_MEM_SIZE_MIB {
            return Err(invalid(
                "machine-config.mem_size_mib",
                format!("{} is not in 16..={MAX_MEM_SIZE_MIB}", self.mem_size_mib),
            ));
        }
        if let Some(page) = self.huge_pages.hugetlb_page_bytes() {
            if (self.mem_size_mib << 20) % page != 0 {
                return Err(invalid(
                    "machine-config.mem_size_mib",
                    format!(
                        "{} MiB is not a multiple of the {} MiB huge page size",
                        self.mem_size_mib,
                        page >> 20
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Guest RAM in bytes.
    pub fn mem_bytes(&self) -> u64 {
        self.mem_size_mib << 20
    }
}

/// The `boot-source` section.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BootSource {
    /// A Linux kernel to boot (ELF vmlinux or bzImage); absent means the
    /// built-in firmware.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_image_path: Option<PathBuf>,
    /// An initrd for the kernel.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initrd_path: Option<PathBuf>,
    /// The command line of the firmware, or of the kernel (empty: the
    /// default kernel command line).
    #[serde(default)]
    pub boot_args: String,
}

impl BootSource {
    /// Checks every field without touching the files: they are opened and
    /// checked (a regular file, its size, the image's magic) by the `files`
    /// thread when the section is put, and read through those descriptors
    /// at start.
    pub fn validate(&self) -> Result<(), ConfigError> {
        use firecracker::check_path;
        if let Some(kernel) = &self.kernel_image_path {
            check_path("boot-source.kernel_image_path", kernel)?;
        }
        if let Some(initrd) = &self.initrd_path {
            check_path("boot-source.initrd_path", initrd)?;
            if self.kernel_image_path.is_none() {
                return Err(invalid(
                    "boot-source.initrd_path",
                    "an initrd needs a kernel_image_path (the built-in firmware takes none)",
                ));
            }
        }
        if self.boot_args.len() > MAX_BOOT_ARGS_LEN {
            return Err(invalid(
                "boot-source.boot_args",
                format!("longer than {MAX_BOOT_ARGS_LEN} bytes"),
            ));
        }
        if let Some(c) = self
            .boot_args
            .chars()
            .find(|c| !(c.is_ascii_graphic() || *c == ' '))
        {
            return Err(invalid(
                "boot-source.boot_args",
                format!("contains {c:?}; only printable ASCII and spaces are allowed"),
            ));
        }
        Ok(())
    }
}

/// What backs guest RAM.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Backing {
    /// Private anonymous memory, the default.
    #[default]
    Anonymous,
    /// Shared memory from a `memfd` (one file per node slice).
    Memfd,
    /// KVM's own memory files (`KVM_CREATE_GUEST_MEMFD`, mapped into teravm
    /// too; Linux 6.18+), 4 KiB pages.
    #[serde(rename = "guest_memfd")]
    GuestMemfd,
}

/// How each slice of guest RAM is bound to its host node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NumaPolicy {
    /// `MPOL_BIND`: pages only from the slice's node (the default).
    #[default]
    Bind,
    /// `MPOL_PREFERRED`: the slice's node first, others when it is full.
    Preferred,
    /// No `mbind` call: the kernel's default policy.
    None,
}

/// The `memory` section.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemoryConfig {
    /// What backs guest RAM.
    #[serde(default)]
    pub backing: Backing,
    /// Host nodes to spread guest RAM over; `null` means every node with memory.
    #[serde(default)]
    pub host_nodes: Option<Vec<u32>>,
    /// How each slice is bound to its node.
    #[serde(default)]
    pub numa_policy: NumaPolicy,
    /// Fault in all guest RAM before the vCPUs start, with per-node workers.
    #[serde(default)]
    pub populate: bool,
}

impl MemoryConfig {
    /// Checks every field (the nodes against the host come at launch).
    pub fn validate(&self) -> Result<(), ConfigError> {
        if let Some(nodes) = &self.host_nodes {
            if nodes.is_empty() {
                return Err(invalid(
                    "memory.host_nodes",
                    "is empty; use null for all nodes",
                ));
            }
            let mut sorted = nodes.clone();
            sorted.sort_unstable();
            if let Some(w) = sorted.windows(2).find(|w| w[0] == w[1]) {
                return Err(invalid(
                    "memory.host_nodes",
                    format!("node {} is listed twice", w[0]),
                ));
            }
            if let Some(n) = nodes.iter().find(|&&n| n >= 1024) {
                return Err(invalid(
                    "memory.host_nodes",
                    format!("node {n} is not a valid node number (0..1024)"),
                ));
            }
        }
        Ok(())
    }
}

/// The `reclaim` section: how guest memory is freed at shutdown.
///
/// The defaults come from `teravm-bench` on this project's machines (2 cores,
/// one node; 8 GiB of touched 4 KiB pages, 5 runs, see `docs/bench/`):
/// - `workers_per_node` 2: 2 workers freed 8 GiB 1.9x faster than one
///   `munmap`; 4 were no better than 2 on 2 cores, and 1 is no faster than
///   `munmap`. The rule: one worker per core of the node, starting from 2;
///   on bigger nodes raise it towards the node's core count (the background
///   measurements gained up to 4 workers per node, where the zone lock
///   saturates).
/// - `chunk_mib` absent: sized from the guest, the largest node's bytes cut
///   into 4 chunks per worker, rounded up to 2 MiB, between 2 MiB and 1 GiB
///   (`memory::plan::default_chunk_bytes`). 64, 256, 1024 and 2048 MiB chunks
///   gave the same time for 8 GiB with 2 workers (0.26–0.27 s), where the
///   rule gives 1 GiB, which keeps the queues short on terabyte guests; a
///   fixed 1 GiB gave a 1 GiB guest one chunk, so its second worker had
///   nothing to do (77 ms with 1, 2 or 4 workers, 1.97x faster with 256 MiB
///   chunks). A `chunk_mib` given is used as given.
/// - `parallel_threshold_mib` 1024: below 1 GiB a reclaim takes a few
///   milliseconds, less than starting pinned workers is worth.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReclaimConfig {
    /// Worker threads per host node.
    #[serde(default = "ReclaimConfig::default_workers_per_node")]
    pub workers_per_node: u32,
    /// Size of the unit of work a worker takes from its node's queue;
    /// absent: sized from the guest and the workers (see above).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chunk_mib: Option<u64>,
    /// Below this much guest RAM, one thread frees it all.
    #[serde(default = "ReclaimConfig::default_parallel_threshold_mib")]
    pub parallel_threshold_mib: u64,
    /// Workers whose queue is empty take chunks from the fullest other queue.
    #[serde(default = "ReclaimConfig::default_steal")]
    pub steal: bool,
    /// Discard workers per host node for the balloon's live reclaim (freed
    /// ranges of a running guest). Absent: `workers_per_node`. `0`: serial,
    /// as Firecracker does: every batch freed on the balloon's thread, one
    /// free call per range, adjacent ranges not merged, before its ack.
    /// Read when the microVM starts (the pool is built then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub discard_workers_per_node: Option<u32>,
}

impl ReclaimConfig {
    fn default_workers_per_node() -> u32 {
        2
    }
    fn default_parallel_threshold_mib() -> u64 {
        1024
    }
    fn default_steal() -> bool {
        true
    }

    /// Discard workers per node in force: `discard_workers_per_node`, or
    /// `workers_per_node` when absent; 0 is serial.
    pub fn discard_workers(&self) -> u32 {
        self.discard_workers_per_node
            .unwrap_or(self.workers_per_node)
    }

    /// Checks every field.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.workers_per_node == 0 || self.workers_per_node > MAX_WORKERS_PER_NODE {
            return Err(invalid(
                "reclaim.workers_per_node",
                format!(
                    "{} is not in 1..={MAX_WORKERS_PER_NODE}",
                    self.workers_per_node
                ),
            ));
        }
        if let Some(n) = self
            .discard_workers_per_node
            .filter(|&n| n > MAX_WORKERS_PER_NODE)
        {
            return Err(invalid(
                "reclaim.discard_workers_per_node",
                format!("{n} is not in 0..={MAX_WORKERS_PER_NODE}"),
            ));
        }
        if let Some(chunk_mib) = self.chunk_mib {
            if !(2..=(1 << 20)).contains(&chunk_mib) {
                return Err(invalid(
                    "reclaim.chunk_mib",
                    format!("{chunk_mib} is not in 2..=1048576"),
                ));
            }
            if chunk_mib % 2 != 0 {
                return Err(invalid(
                    "reclaim.chunk_mib",
                    format!("{chunk_mib} is not a multiple of 2 (the huge page size)"),
                ));
            }
        }
        if self.parallel_threshold_mib > MAX_MEM_SIZE_MIB {
            return Err(invalid(
                "reclaim.parallel_threshold_mib",
                format!(
                    "{} is larger than the largest guest ({MAX_MEM_SIZE_MIB})",
                    self.parallel_threshold_mib
                ),
            ));
        }
        Ok(())
    }
}

impl Default for ReclaimConfig {
    fn default() -> Self {
        ReclaimConfig {
            workers_per_node: Self::default_workers_per_node(),
            chunk_mib: None,
            parallel_threshold_mib: Self::default_parallel_threshold_mib(),
            steal: Self::default_steal(),
            discard_workers_per_node: None,
        }
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
// Conversions to memory options: the config file's serde types stay here;
// `memory` takes its own option types.

impl From<HugePages> for crate::memory::PageSize {
    fn from(h: HugePages) -> Self {
        match h {
            HugePages::None => crate::memory::PageSize::Small,
            HugePages::Transparent => crate::memory::PageSize::Transparent,
            HugePages::Huge2M => crate::memory::PageSize::Huge2M,
            HugePages::Huge1G => crate::memory::PageSize::Huge1G,
        }
    }
}

impl From<Backing> for crate::memory::Backing {
    fn from(b: Backing) -> Self {
        match b {
            Backing::Anonymous => crate::memory::Backing::Anonymous,
            Backing::Memfd => crate::memory::Backing::Memfd,
            Backing::GuestMemfd => crate::memory::Backing::GuestMemfd,
        }
    }
}

impl From<NumaPolicy> for crate::memory::NumaPolicy {
    fn from(p: NumaPolicy) -> Self {
        match p {
            NumaPolicy::Bind => crate::memory::NumaPolicy::Bind,
            NumaPolicy::Preferred => crate::memory::NumaPolicy::Preferred,
            NumaPolicy::None => crate::memory::NumaPolicy::None,
        }
    }
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

impl From<&ReclaimConfig> for crate::memory::ReclaimOptions {
    fn from(c: &ReclaimConfig) -> Self {
        crate::memory::ReclaimOptions {
            workers_per_node: c.workers_per_node,
            chunk_bytes: c.chunk_mib.map(|m| m.saturating_mul(1 << 20)),
            parallel_threshold_bytes: c.parallel_threshold_mib.saturating_mul(1 << 20),
            steal: c.steal,
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
