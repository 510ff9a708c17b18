//! virtio-mem as the VMM drives it (`PATCH` and `GET /hotplug/memory`):
//! one device per guest node, each over its node's part of the hotplug
//! region, their plugged blocks in memslots of `slot_size_mib` and their
//! unplugged blocks freed behind by the per-node discard pool.

use serde::Serialize;

/// Errors of the hotplug control.
#[derive(Debug, thiserror::Error)]
pub enum HotplugError {
    /// The requested size is above the region or not whole blocks.
    #[error("requested_size_mib {requested_mib} is invalid: {reason}")]
    InvalidSize {
        /// What was asked.
        requested_mib: u32,
        /// Why it cannot be.
        reason: String,
    },
}

/// One guest node's part of the hotplug region (`GET /hotplug/memory`'s
/// `nodes`, teravm's addition).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct HotplugNodeStatus {
    /// The host node whose memory backs the part (and its discard workers).
    pub host_node: u32,
    /// The guest node (the device's `node_id`).
    pub guest_node: u16,
    /// First guest physical address of the part.
    pub guest_addr: u64,
    /// Size of the part in MiB.
    pub size_mib: u32,
    /// MiB the guest has plugged in it.
    pub plugged_size_mib: u32,
    /// MiB asked of it.
    pub requested_size_mib: u32,
    /// Bytes the node's discard workers freed (balloon and hotplug alike).
    pub discarded_bytes: u64,
}

/// `GET /hotplug/memory`: Firecracker's five fields, then teravm's.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct HotplugStatus {
    /// The region's size in MiB.
    pub total_size_mib: u32,
    /// The block size in MiB.
    pub block_size_mib: u32,
    /// The memslot size in MiB.
    pub slot_size_mib: u32,
    /// MiB plugged, all nodes.
    pub plugged_size_mib: u32,
    /// MiB asked, all nodes.
    pub requested_size_mib: u32,
    /// Per node.
    pub nodes: Vec<HotplugNodeStatus>,
    /// UNPLUG and UNPLUG_ALL discards in flight now.
    pub discards_in_flight: usize,
}

/// The running microVM's virtio-mem devices.
#[derive(Debug)]
pub struct Hotplug {}

impl Hotplug {
    /// Asks the guest for `requested_size_mib` in all (split over the nodes
    /// in proportion to their parts, in whole blocks).
    pub fn update(&self, requested_size_mib: u32) -> Result<(), HotplugError> {
        Err(HotplugError::InvalidSize {
            requested_mib: requested_size_mib,
            reason: "interface placeholder: the devices are wired in the next commit".into(),
        })
    }

    /// The `memory_hotplug` group of a metrics line (Firecracker's
    /// counter names, summed over the nodes' devices): written by
    /// `Vmm::device_metrics` (src/vmm/actions.rs) while the microVM runs.
    /// An empty object until the devices are wired.
    pub fn metrics_json(&self) -> serde_json::Value {
        serde_json::json!({})
    }

    /// The state now.
    pub fn status(&self) -> HotplugStatus {
        HotplugStatus {
            total_size_mib: 0,
            block_size_mib: 0,
            slot_size_mib: 0,
            plugged_size_mib: 0,
            requested_size_mib: 0,
            nodes: Vec::new(),
            discards_in_flight: 0,
        }
    }
}
