//! The VM configuration: one serde struct per section of the config file (and
//! per API resource), unknown fields refused, each with a `validate()` that
//! names the offending field in a one-line error.
//!
//! The spelling follows Firecracker where Firecracker has the item
//! (`machine-config`, `boot-source`, `vcpu_count`, `mem_size_mib`,
//! `huge_pages`); `memory` and `reclaim` are teravm's own.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Largest guest: 64 TiB of address space (sparse; only touched memory costs).
pub const MAX_MEM_SIZE_MIB: u64 = 64 << 20;
/// Most vCPUs a microVM may have.
pub const MAX_VCPU_COUNT: u8 = 254;
/// Longest firmware / kernel command line, in bytes.
pub const MAX_BOOT_ARGS_LEN: usize = 2048;
/// Most reclaim workers per NUMA node.
pub const MAX_WORKERS_PER_NODE: u32 = 256;

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

/// The `machine-config` section.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MachineConfig {
    /// Number of vCPUs, 1 to [`MAX_VCPU_COUNT`].
    pub vcpu_count: u8,
    /// Guest RAM in MiB (the MMIO gap below 4 GiB is not counted).
    pub mem_size_mib: u64,
    /// Page backing of guest RAM.
    #[serde(default)]
    pub huge_pages: HugePages,
}

impl Default for MachineConfig {
    fn default() -> Self {
        MachineConfig {
            vcpu_count: 1,
            mem_size_mib: 128,
            huge_pages: HugePages::default(),
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
    /// Checks every field; a kernel and an initrd are checked cheaply here
    /// (readable regular file, size, image magic), loaded at start.
    pub fn validate(&self) -> Result<(), ConfigError> {
        use crate::vstate::linux::image::{check_initrd, check_kernel};
        if let Some(kernel) = &self.kernel_image_path {
            check_kernel(kernel)
                .map_err(|e| invalid("boot-source.kernel_image_path", e.to_string()))?;
        }
        if let Some(initrd) = &self.initrd_path {
            if self.kernel_image_path.is_none() {
                return Err(invalid(
                    "boot-source.initrd_path",
                    "an initrd needs a kernel_image_path (the built-in firmware takes none)",
                ));
            }
            check_initrd(initrd).map_err(|e| invalid("boot-source.initrd_path", e.to_string()))?;
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
/// - `chunk_mib` 1024: 64, 256, 1024 and 2048 MiB chunks gave the same time
///   (0.26–0.27 s for 8 GiB with 2 workers); 1 GiB keeps the queues short on
///   terabyte guests and still leaves 8 chunks per 8 GiB for stealing.
/// - `parallel_threshold_mib` 1024: below 1 GiB a reclaim takes a few
///   milliseconds, less than starting pinned workers is worth.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReclaimConfig {
    /// Worker threads per host node.
    #[serde(default = "ReclaimConfig::default_workers_per_node")]
    pub workers_per_node: u32,
    /// Size of the unit of work a worker takes from its node's queue.
    #[serde(default = "ReclaimConfig::default_chunk_mib")]
    pub chunk_mib: u64,
    /// Below this much guest RAM, one thread frees it all.
    #[serde(default = "ReclaimConfig::default_parallel_threshold_mib")]
    pub parallel_threshold_mib: u64,
    /// Workers whose queue is empty take chunks from the fullest other queue.
    #[serde(default = "ReclaimConfig::default_steal")]
    pub steal: bool,
}

impl ReclaimConfig {
    fn default_workers_per_node() -> u32 {
        2
    }
    fn default_chunk_mib() -> u64 {
        1024
    }
    fn default_parallel_threshold_mib() -> u64 {
        1024
    }
    fn default_steal() -> bool {
        true
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
        if self.chunk_mib < 2 || self.chunk_mib > (1 << 20) {
            return Err(invalid(
                "reclaim.chunk_mib",
                format!("{} is not in 2..=1048576", self.chunk_mib),
            ));
        }
        if self.chunk_mib % 2 != 0 {
            return Err(invalid(
                "reclaim.chunk_mib",
                format!(
                    "{} is not a multiple of 2 (the huge page size)",
                    self.chunk_mib
                ),
            ));
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
            chunk_mib: Self::default_chunk_mib(),
            parallel_threshold_mib: Self::default_parallel_threshold_mib(),
            steal: Self::default_steal(),
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

    /// Reads, parses and validates a config file.
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Read {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        Self::from_json(&text, path)
    }

    /// Checks every section.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.machine_config.validate()?;
        self.boot_source.validate()?;
        self.memory.validate()?;
        self.reclaim.validate()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<VmConfig, ConfigError> {
        VmConfig::from_json(text, Path::new("t.json"))
    }

    #[test]
    fn full_example_parses() {
        let c = parse(
            r#"{
             "machine-config": {"vcpu_count": 2, "mem_size_mib": 4096, "huge_pages": "Transparent"},
             "boot-source": {"boot_args": "touch=all then=reset"},
             "memory": {"backing": "anonymous", "host_nodes": null, "numa_policy": "bind", "populate": false},
             "reclaim": {"workers_per_node": 1, "chunk_mib": 1024, "parallel_threshold_mib": 1024, "steal": true}
           }"#,
        )
        .unwrap();
        assert_eq!(c.machine_config.vcpu_count, 2);
        assert_eq!(c.machine_config.mem_bytes(), 4 << 30);
        assert_eq!(c.boot_source.boot_args, "touch=all then=reset");
        assert_eq!(c.reclaim.workers_per_node, 1);
        assert_eq!(c.memory.numa_policy, NumaPolicy::Bind);
    }

    #[test]
    fn sections_default() {
        let c = parse(r#"{"machine-config": {"vcpu_count": 1, "mem_size_mib": 128}}"#).unwrap();
        assert_eq!(c.machine_config.huge_pages, HugePages::Transparent);
        assert_eq!(c.memory, MemoryConfig::default());
        assert_eq!(c.reclaim, ReclaimConfig::default());
        let m: MachineConfig =
            serde_json::from_str(r#"{"vcpu_count":1,"mem_size_mib":64,"huge_pages":"2M"}"#)
                .unwrap();
        assert_eq!(m.huge_pages, HugePages::Huge2M);
    }

    #[test]
    fn unknown_fields_are_refused() {
        let e = parse(r#"{"machine-config": {"vcpu_count": 1, "mem_size_mib": 128, "vcpus": 2}}"#)
            .unwrap_err();
        assert!(e.to_string().contains("unknown field `vcpus`"), "{e}");
        let e = parse(r#"{"network": {}}"#).unwrap_err();
        assert!(e.to_string().contains("unknown field `network`"), "{e}");
    }

    #[test]
    fn wrong_types_are_refused() {
        let e =
            parse(r#"{"machine-config": {"vcpu_count": "two", "mem_size_mib": 128}}"#).unwrap_err();
        assert!(matches!(e, ConfigError::Parse { .. }), "{e}");
        let e = parse(r#"{"machine-config": {"vcpu_count": 1, "mem_size_mib": -1}}"#).unwrap_err();
        assert!(matches!(e, ConfigError::Parse { .. }), "{e}");
        let e = parse(
            r#"{"machine-config": {"vcpu_count": 1, "mem_size_mib": 128, "huge_pages": "4K"}}"#,
        )
        .unwrap_err();
        assert!(
            e.to_string().contains("huge_pages") || e.to_string().contains("4K"),
            "{e}"
        );
    }

    #[test]
    fn ranges_are_checked_and_named() {
        let cases = [
            (
                r#"{"machine-config": {"vcpu_count": 0, "mem_size_mib": 128}}"#,
                "machine-config.vcpu_count",
            ),
            (
                r#"{"machine-config": {"vcpu_count": 255, "mem_size_mib": 128}}"#,
                "machine-config.vcpu_count",
            ),
            (
                r#"{"machine-config": {"vcpu_count": 1, "mem_size_mib": 0}}"#,
                "machine-config.mem_size_mib",
            ),
            (
                r#"{"machine-config": {"vcpu_count": 1, "mem_size_mib": 1099511627776}}"#,
                "machine-config.mem_size_mib",
            ),
            (
                r#"{"machine-config": {"vcpu_count": 1, "mem_size_mib": 1025, "huge_pages": "1G"}}"#,
                "machine-config.mem_size_mib",
            ),
            (
                r#"{"boot-source": {"kernel_image_path": "/nonexistent/vmlinux"}}"#,
                "boot-source.kernel_image_path",
            ),
            (
                r#"{"boot-source": {"kernel_image_path": "Cargo.toml"}}"#,
                "boot-source.kernel_image_path",
            ),
            (
                r#"{"boot-source": {"initrd_path": "Cargo.toml"}}"#,
                "boot-source.initrd_path",
            ),
            (
                r#"{"boot-source": {"boot_args": "a\u0000b"}}"#,
                "boot-source.boot_args",
            ),
            (r#"{"memory": {"host_nodes": []}}"#, "memory.host_nodes"),
            (
                r#"{"memory": {"host_nodes": [0, 1, 0]}}"#,
                "memory.host_nodes",
            ),
            (
                r#"{"reclaim": {"workers_per_node": 0}}"#,
                "reclaim.workers_per_node",
            ),
            (r#"{"reclaim": {"chunk_mib": 0}}"#, "reclaim.chunk_mib"),
            (r#"{"reclaim": {"chunk_mib": 3}}"#, "reclaim.chunk_mib"),
        ];
        for (text, field) in cases {
            match parse(text) {
                Err(ConfigError::InvalidField { field: f, .. }) => assert_eq!(f, field, "{text}"),
                other => panic!("{text}: expected an invalid {field}, got {other:?}"),
            }
        }
    }

    #[test]
    fn errors_are_one_line() {
        let e = parse("{\n\"machine-config\": [1,\n2]}").unwrap_err();
        assert!(!e.to_string().contains('\n'), "{e}");
        // Found by fuzzing (config_file): serde echoes an unknown variant or
        // field name as written, so an escaped newline in it made a
        // multi-line error.
        let e = parse(r#"{"machine-config": {"vcpu_count": 1, "mem_size_mib": 256, "huge_pages": "Tr\nsparent"}}"#)
            .unwrap_err();
        assert!(matches!(e, ConfigError::Parse { .. }), "{e}");
        assert!(!e.to_string().contains(['\r', '\n']), "{e}");
        let e = parse("{\"reclaim\": {\"a\\r\\nb\": 1}}").unwrap_err();
        assert!(e.to_string().contains("unknown field `a  b`"), "{e}");
        let e = VmConfig::from_file(Path::new("/nonexistent/teravm.json")).unwrap_err();
        assert!(matches!(e, ConfigError::Read { .. }));
        assert!(!e.to_string().contains('\n'));
    }

    #[test]
    fn round_trips() {
        let c = VmConfig::default();
        let text = serde_json::to_string(&c).unwrap();
        assert_eq!(parse(&text).unwrap(), c);
        assert!(text.contains("\"machine-config\""));
    }
}
