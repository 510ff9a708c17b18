//! The `machine-config` section: vCPUs, guest RAM size, page backing,
//! SMT, the dirty log and the static CPU template; the shape it travels in
//! as JSON ([`MachineConfigBody`], Firecracker's fields with teravm's) and
//! its partial update (`PATCH /machine-config`, [`MachineConfigPatch`]).

use serde::{Deserialize, Deserializer, Serialize};

use super::{invalid, ConfigError};
pub use crate::vstate::template::CpuTemplate;

/// Largest guest: 64 TiB of address space (sparse; only touched memory costs).
pub const MAX_MEM_SIZE_MIB: u64 = 64 << 20;
/// Most vCPUs a microVM may have: Firecracker's bound (its
/// `MAX_SUPPORTED_VCPUS`).
pub const MAX_VCPU_COUNT: u8 = 32;

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

/// `machine-config` as it travels in JSON: teravm's fields and Firecracker's.
/// [`MachineConfig`] is (de)serialized through it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MachineConfigBody {
    /// Number of vCPUs.
    pub vcpu_count: u8,
    /// Guest RAM in MiB.
    pub mem_size_mib: u64,
    /// Simultaneous multithreading: two threads per core.
    #[serde(default)]
    pub smt: bool,
    /// Dirty page tracking: KVM's dirty log on the guest memslots.
    #[serde(default)]
    pub track_dirty_pages: bool,
    /// Page backing of guest RAM.
    #[serde(default)]
    pub huge_pages: HugePages,
    /// CPU template: absent, `null` or a static template's name.
    #[serde(default, deserialize_with = "nullable_template")]
    pub cpu_template: CpuTemplate,
}

fn nullable_template<'de, D: Deserializer<'de>>(d: D) -> Result<CpuTemplate, D::Error> {
    Ok(Option::<CpuTemplate>::deserialize(d)?.unwrap_or_default())
}

impl Default for MachineConfigBody {
    fn default() -> Self {
        MachineConfig::default().into()
    }
}

impl TryFrom<MachineConfigBody> for MachineConfig {
    type Error = ConfigError;

    fn try_from(b: MachineConfigBody) -> Result<Self, ConfigError> {
        Ok(MachineConfig {
            vcpu_count: b.vcpu_count,
            mem_size_mib: b.mem_size_mib,
            huge_pages: b.huge_pages,
            smt: b.smt,
            track_dirty_pages: b.track_dirty_pages,
            cpu_template: b.cpu_template,
        })
    }
}

impl From<MachineConfig> for MachineConfigBody {
    fn from(m: MachineConfig) -> Self {
        MachineConfigBody {
            vcpu_count: m.vcpu_count,
            mem_size_mib: m.mem_size_mib,
            smt: m.smt,
            track_dirty_pages: m.track_dirty_pages,
            huge_pages: m.huge_pages,
            cpu_template: m.cpu_template,
        }
    }
}

/// The body of `PATCH /machine-config`: any subset of the fields, applied
/// to the configuration in force and validated as a whole.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MachineConfigPatch {
    /// New vCPU count.
    #[serde(default)]
    pub vcpu_count: Option<u8>,
    /// New memory size.
    #[serde(default)]
    pub mem_size_mib: Option<u64>,
    /// New SMT setting.
    #[serde(default)]
    pub smt: Option<bool>,
    /// New dirty page tracking setting.
    #[serde(default)]
    pub track_dirty_pages: Option<bool>,
    /// New page backing.
    #[serde(default)]
    pub huge_pages: Option<HugePages>,
    /// New CPU template.
    #[serde(default)]
    pub cpu_template: Option<CpuTemplate>,
}

impl MachineConfigPatch {
    /// Whether the patch changes nothing at all.
    pub fn is_empty(&self) -> bool {
        *self == MachineConfigPatch::default()
    }

    /// Checks what can be checked without the configuration in force.
    pub fn validate(&self) -> Result<(), ConfigError> {
        Ok(())
    }

    /// `current` with this patch applied, validated as a whole.
    pub fn apply(&self, current: &MachineConfig) -> Result<MachineConfig, ConfigError> {
        self.validate()?;
        let next = MachineConfig {
            vcpu_count: self.vcpu_count.unwrap_or(current.vcpu_count),
            mem_size_mib: self.mem_size_mib.unwrap_or(current.mem_size_mib),
            huge_pages: self.huge_pages.unwrap_or(current.huge_pages),
            smt: self.smt.unwrap_or(current.smt),
            track_dirty_pages: self.track_dirty_pages.unwrap_or(current.track_dirty_pages),
            cpu_template: self.cpu_template.unwrap_or(current.cpu_template),
        };
        next.validate()?;
        Ok(next)
    }
}

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
