//! virtio-mem as the VMM drives it (`PATCH` and `GET /hotplug/memory`):
//! one device per guest node, each over its node's part of the hotplug
//! region ([`crate::memory::hotplug`]), its plugged blocks in memslots of
//! `slot_size_mib` and its unplugged blocks freed behind by the per-node
//! discard pool that the balloon shares. The devices' one sink, the slots
//! entering and leaving KVM, is [`HotplugSlots`].

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use serde::Serialize;

use crate::devices::virtio::mem::VirtioMem;
use crate::devices::MmioSlot;
use crate::memory::GuestView;

use crate::vmm::sinks::discard::PoolSink;
use crate::vmm::sinks::hotplug_slots::HotplugSlots;

const MIB: u64 = 1 << 20;

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

fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
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
    /// Discards (balloon and hotplug) in flight now.
    pub discards_in_flight: usize,
}

/// One virtio-mem device as the VMM drives it.
pub struct HotplugDevice {
    /// The device (shared with its transport and its thread).
    pub device: Arc<Mutex<VirtioMem<GuestView>>>,
    /// Its slot on the MMIO bus.
    pub slot: MmioSlot,
    /// The host node backing its part.
    pub host_node: u32,
}

/// The running microVM's virtio-mem devices.
pub struct Hotplug {
    /// In guest address order.
    pub devices: Vec<HotplugDevice>,
    /// Their sink.
    pub slots: Arc<HotplugSlots>,
    /// The pool the sink frees through.
    pub discard: Arc<PoolSink>,
    /// The configured sizes.
    pub total_size_mib: u32,
    /// The block size.
    pub block_size_mib: u32,
    /// The slot size.
    pub slot_size_mib: u32,
    /// Guest accesses to the region outside its memslots (the MMIO bus's
    /// count: they read zeros).
    pub unplugged_accesses: Arc<std::sync::atomic::AtomicU64>,
}

impl std::fmt::Debug for Hotplug {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hotplug")
            .field("devices", &self.devices.len())
            .field("total_size_mib", &self.total_size_mib)
            .finish_non_exhaustive()
    }
}

/// `requested` blocks shared over parts of `parts` blocks, in proportion,
/// the remainder one block each from the first part: never more than a
/// part holds while `requested` is at most their sum.
pub fn share_blocks(requested: u64, parts: &[u64]) -> Vec<u64> {
    let total: u64 = parts.iter().sum();
    if total == 0 {
        return vec![0; parts.len()];
    }
    let mut out: Vec<u64> = parts
        .iter()
        .map(|&p| (u128::from(requested) * u128::from(p) / u128::from(total)) as u64)
        .collect();
    let mut left = requested.saturating_sub(out.iter().sum());
    for (o, &p) in out.iter_mut().zip(parts) {
        if left == 0 {
            break;
        }
        if *o < p {
            *o += 1;
            left -= 1;
        }
    }
    out
}

impl Hotplug {
    /// Asks the guest for `requested_size_mib` in all (split over the nodes
    /// in proportion to their parts, in whole blocks).
    pub fn update(&self, requested_size_mib: u32) -> Result<(), HotplugError> {
        let invalid = |reason: String| HotplugError::InvalidSize {
            requested_mib: requested_size_mib,
            reason,
        };
        if requested_size_mib > self.total_size_mib {
            return Err(invalid(format!(
                "above total_size_mib ({})",
                self.total_size_mib
            )));
        }
        if requested_size_mib % self.block_size_mib != 0 {
            return Err(invalid(format!(
                "not a multiple of block_size_mib ({})",
                self.block_size_mib
            )));
        }
        let block = u64::from(self.block_size_mib) * MIB;
        let parts: Vec<u64> = self
            .devices
            .iter()
            .map(|d| lock(&d.device).status().region_bytes / block)
            .collect();
        let shares = share_blocks(u64::from(requested_size_mib) * MIB / block, &parts);
        for (d, blocks) in self.devices.iter().zip(shares) {
            lock(&d.device)
                .set_requested(blocks * block)
                .map_err(|e| invalid(e.to_string()))?;
        }
        Ok(())
    }

    /// The state now.
    pub fn status(&self) -> HotplugStatus {
        let snapshot = self.discard.snapshot();
        let per_node = |node: u32| {
            snapshot
                .as_ref()
                .and_then(|s| s.per_node.iter().find(|n| n.node == node))
                .map_or(0, |n| n.bytes)
        };
        let nodes: Vec<HotplugNodeStatus> = self
            .devices
            .iter()
            .map(|d| {
                let s = lock(&d.device).status();
                HotplugNodeStatus {
                    host_node: d.host_node,
                    guest_node: s.node_id,
                    guest_addr: s.region_addr,
                    size_mib: (s.region_bytes / MIB) as u32,
                    plugged_size_mib: (s.plugged_bytes / MIB) as u32,
                    requested_size_mib: (s.requested_bytes / MIB) as u32,
                    discarded_bytes: per_node(d.host_node),
                }
            })
            .collect();
        HotplugStatus {
            total_size_mib: self.total_size_mib,
            block_size_mib: self.block_size_mib,
            slot_size_mib: self.slot_size_mib,
            plugged_size_mib: nodes.iter().map(|n| n.plugged_size_mib).sum(),
            requested_size_mib: nodes.iter().map(|n| n.requested_size_mib).sum(),
            nodes,
            discards_in_flight: snapshot.map_or(0, |s| s.in_flight_batches),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::share_blocks;

    #[test]
    fn blocks_are_shared_in_proportion_and_never_past_a_part() {
        assert_eq!(share_blocks(0, &[64, 64]), vec![0, 0]);
        assert_eq!(share_blocks(128, &[64, 64]), vec![64, 64]);
        assert_eq!(share_blocks(3, &[64, 64]), vec![2, 1]);
        assert_eq!(share_blocks(100, &[192, 64]), vec![75, 25]);
        assert_eq!(share_blocks(7, &[1, 1, 5]), vec![1, 1, 5]);
        assert_eq!(share_blocks(5, &[]), Vec::<u64>::new());
        for r in 0..=12 {
            let s = share_blocks(r, &[5, 3, 4]);
            assert_eq!(s.iter().sum::<u64>(), r);
            assert!(s.iter().zip([5, 3, 4]).all(|(a, b)| *a <= b));
        }
    }
}
