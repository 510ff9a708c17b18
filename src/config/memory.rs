//! The `memory` section (teravm's own): what backs guest RAM, the host
//! nodes it is spread over and how each slice is bound, and populate; the
//! check of guest_memfd against the host's KVM, and the conversions to
//! `memory`'s option types.

use serde::{Deserialize, Serialize};

use super::{invalid, ConfigError};

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
