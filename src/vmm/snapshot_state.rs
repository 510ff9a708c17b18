//! What the state file holds ([`SnapshotState`]) and the checks a loaded
//! one passes before anything is built from it: the configuration as a
//! config file is checked, one vCPU state per vCPU, and the memory
//! regions exactly the RAM layout of the configured size, at the offsets
//! of Firecracker's memory file (contiguous from 0, in guest address
//! order).

use serde::{Deserialize, Serialize};

use crate::config::VmConfig;
use crate::memory::layout::ram_regions;
use crate::vmm::devices::DevicesState;
use crate::vstate::snapshot::{VcpuState, VmState};

/// Why a loaded state cannot be restored (its envelope was whole).
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// The configuration it carries is not one teravm would start.
    #[error("the snapshot's configuration is invalid: {0}")]
    Config(#[from] crate::config::ConfigError),
    /// Not one vCPU state per vCPU.
    #[error("the snapshot has {states} vCPU states for {vcpus} vCPUs")]
    VcpuCount {
        /// vCPU states in the file.
        states: usize,
        /// `vcpu_count` of its configuration.
        vcpus: u8,
    },
    /// The memory regions are not the RAM layout of its memory size.
    #[error("the snapshot's memory regions {found:?} are not the layout of {mem_mib} MiB of RAM ({expected:?})")]
    Regions {
        /// (guest address, length, file offset) in the file.
        found: Vec<(u64, u64, u64)>,
        /// What the size gives.
        expected: Vec<(u64, u64, u64)>,
        /// The configured size.
        mem_mib: u64,
    },
}

/// One guest RAM region in the memory file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemoryRegionState {
    /// Guest physical address.
    pub guest_addr: u64,
    /// Bytes.
    pub len: u64,
    /// Offset of its first byte in the memory file.
    pub file_offset: u64,
}

/// Everything of a paused microVM but its memory.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotState {
    /// The teravm that wrote it (for people; the format version is in the
    /// envelope).
    pub teravm_version: String,
    /// The configuration it ran with (no logger or metrics: a load keeps
    /// the loading process's own).
    pub config: VmConfig,
    /// Guest RAM's regions in the memory file.
    pub memory: Vec<MemoryRegionState>,
    /// Each vCPU's KVM state, in index order.
    pub vcpus: Vec<VcpuState>,
    /// The VM's KVM state (irqchip, PIT, clock).
    pub vm: VmState,
    /// The devices' state.
    pub devices: DevicesState,
}

/// The RAM regions of `mem_bytes` at Firecracker's memory-file offsets.
pub fn memory_regions(mem_bytes: u64) -> Vec<MemoryRegionState> {
    let mut offset = 0;
    ram_regions(mem_bytes)
        .iter()
        .map(|r| {
            let m = MemoryRegionState {
                guest_addr: r.guest_addr,
                len: r.len,
                file_offset: offset,
            };
            offset += r.len;
            m
        })
        .collect()
}

impl SnapshotState {
    /// Checks what a hostile file could get wrong in a whole envelope.
    pub fn check(&self) -> Result<(), StateError> {
        self.config.validate()?;
        let vcpus = self.config.machine_config.vcpu_count;
        if self.vcpus.len() != usize::from(vcpus) {
            return Err(StateError::VcpuCount {
                states: self.vcpus.len(),
                vcpus,
            });
        }
        let expected = memory_regions(self.config.machine_config.mem_bytes());
        if self.memory != expected {
            let t = |v: &[MemoryRegionState]| {
                v.iter()
                    .map(|m| (m.guest_addr, m.len, m.file_offset))
                    .collect()
            };
            return Err(StateError::Regions {
                found: t(&self.memory),
                expected: t(&expected),
                mem_mib: self.config.machine_config.mem_size_mib,
            });
        }
        Ok(())
    }

    /// Bytes of guest RAM (the memory file's size).
    pub fn mem_bytes(&self) -> u64 {
        self.memory.iter().map(|m| m.len).sum()
    }
}
