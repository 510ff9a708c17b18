//! virtio-mem (virtio 1.2, 5.15; device ID 24): one device per guest node's
//! part of the hotplug region, as Firecracker's `memory-hotplug` and QEMU
//! lay it out. The guest plugs and unplugs blocks of `block_bytes` inside
//! `[region_addr, region_addr + usable_region_size)` with PLUG, UNPLUG,
//! UNPLUG_ALL and STATE requests on the one queue; the host asks for a
//! total with [`VirtioMem::set_requested`] (a configuration change).
//!
//! What goes where:
//! - [`request`]: the chain's two buffers (the 24-byte request, read-only;
//!   the 10-byte response, writable) parsed, every field checked.
//! - [`device`]: the block bitmap, the checks of each request against the
//!   region, the requested and usable sizes, and which whole slots of
//!   `slot_bytes` a request maps or unmaps; the configuration space.
//! - [`worker`]: the device's thread. It pops and checks a request under the
//!   device's lock, lets go of the lock while the [`HotplugSink`] works (a
//!   PLUG may wait for a discard of its range, the fence), then locks again
//!   to commit the blocks and answer. The API thread
//!   ([`VirtioMem::set_requested`], [`VirtioMem::status`]) and vCPU
//!   configuration reads never wait behind a sink.
//! - [`metrics`]: Firecracker's `memory_hotplug` counters and teravm's
//!   `busy_count`.
//!
//! Hostile guests: a chain without its two buffers, or with them the wrong
//! way round or too short, is answered with 0 bytes and counted
//! (`queue_event_fails`); a request outside the usable region, unaligned,
//! of zero blocks, overflowing, overlapping what it may not, or beyond the
//! requested size gets `VIRTIO_MEM_RESP_ERROR`; an unknown type too. Nothing
//! the guest writes stops the device or panics. Every range and slot the
//! sink is given lies inside the region, block and slot aligned.
//!
//! A reset keeps the blocks' state (the spec: the device must not change
//! it on reset); Linux's driver sends UNPLUG_ALL at probe when
//! `plugged_size` is not 0.
//!
//! Syscalls of its thread, for its seccomp role (`virtio-mem`): the loop's
//! ([`crate::devices::virtio::worker`]: `epoll_wait`, `read` and `write` on
//! eventfds), `futex` for the device's lock, `write` on the irqfd, and what
//! the sink does inline.

pub mod device;
pub mod metrics;
pub mod request;
pub mod worker;

mod blocks;
#[cfg(test)]
mod request_tests;
#[cfg(test)]
mod tests;

pub use device::{MemStatus, VirtioMem};
pub use metrics::MemMetrics;
pub use request::{Request, RequestError, RequestKind};
pub use worker::MemWorker;

use crate::memory::GuestRange;

/// The virtio device ID of a memory device.
pub const VIRTIO_ID_MEM: u32 = 24;
/// The queue's size (Firecracker's).
pub const QUEUE_SIZE: u16 = 256;
/// The smallest block: 2 MiB (Firecracker's minimum `block_size_mib`, a
/// huge page, and at least Linux's pageblock).
pub const MIN_BLOCK_BYTES: u64 = 2 << 20;

/// Feature bit: `node_id` is the ACPI proximity domain of the region.
pub const VIRTIO_MEM_F_ACPI_PXM: u32 = 0;
/// Feature bit: the driver will not touch unplugged memory (required here,
/// as in Firecracker).
pub const VIRTIO_MEM_F_UNPLUGGED_INACCESSIBLE: u32 = 1;

/// Request types.
pub const VIRTIO_MEM_REQ_PLUG: u16 = 0;
/// Unplug the given blocks.
pub const VIRTIO_MEM_REQ_UNPLUG: u16 = 1;
/// Unplug every block and shrink the usable region to 0.
pub const VIRTIO_MEM_REQ_UNPLUG_ALL: u16 = 2;
/// Report whether the given blocks are plugged.
pub const VIRTIO_MEM_REQ_STATE: u16 = 3;

/// Response: done.
pub const VIRTIO_MEM_RESP_ACK: u16 = 0;
/// Response: refused for now (not sent by this device).
pub const VIRTIO_MEM_RESP_NACK: u16 = 1;
/// Response: try again later (a discard of the range still runs).
pub const VIRTIO_MEM_RESP_BUSY: u16 = 2;
/// Response: the request is invalid, or the host failed it.
pub const VIRTIO_MEM_RESP_ERROR: u16 = 3;

/// STATE: every block of the range is plugged.
pub const VIRTIO_MEM_STATE_PLUGGED: u16 = 0;
/// STATE: no block of the range is plugged.
pub const VIRTIO_MEM_STATE_UNPLUGGED: u16 = 1;
/// STATE: some are.
pub const VIRTIO_MEM_STATE_MIXED: u16 = 2;

/// Bytes of a request (`le16 type, le16 padding[3], le64 addr, le16
/// nb_blocks, u8 padding[6]`).
pub const REQUEST_BYTES: usize = 24;
/// Bytes of a response (`le16 type, le16 padding[3], le16 state`).
pub const RESPONSE_BYTES: usize = 10;
/// Bytes of the configuration space.
pub const CONFIG_BYTES: usize = 56;

/// One device's part of the hotplug region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemOptions {
    /// Guest physical start of the part (slot aligned).
    pub region_addr: u64,
    /// Its size (a multiple of `slot_bytes`).
    pub region_bytes: u64,
    /// The block the guest plugs by (a power of two, at least
    /// [`MIN_BLOCK_BYTES`]).
    pub block_bytes: u64,
    /// The memslot size (a multiple of `block_bytes`).
    pub slot_bytes: u64,
    /// The guest node of the part (`node_id`, the SRAT proximity domain).
    pub node_id: u16,
}

/// Why the sink refused a PLUG.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlugRefused {
    /// A discard of the range still runs past the sink's deadline: the guest
    /// is answered `VIRTIO_MEM_RESP_BUSY` and retries.
    Busy,
    /// The memslots could not be registered: `VIRTIO_MEM_RESP_ERROR`.
    Failed(String),
}

/// Where plugged and unplugged blocks go (the host side: memslots and the
/// per-node discard pool). Ranges and slots are [`GuestRange`]s.
pub trait HotplugSink: Send + Sync {
    /// Before a PLUG of `range` is acknowledged: waits for any discard of it
    /// still running (the fence), then registers the memslots `map_slots`
    /// (each one whole slot of `slot_bytes` that had no plugged block before
    /// this request). May block (bounded); called with no device lock held.
    fn plug(&self, range: GuestRange, map_slots: &[GuestRange]) -> Result<(), PlugRefused>;
    /// After UNPLUG / UNPLUG_ALL bookkeeping: removes the memslots
    /// `unmap_slots` (whole slots with no plugged block left) from KVM, then
    /// frees `ranges` behind (the discard pool). Never waits for the
    /// discard. Called with no device lock held, before the response is
    /// written.
    fn unplug(&self, ranges: &[GuestRange], unmap_slots: &[GuestRange]);
}

/// Errors of the memory device.
#[derive(Debug, thiserror::Error)]
pub enum MemError {
    /// The block size is not a power of two of at least 2 MiB.
    #[error("virtio-mem block size {0:#x} is not a power of two of at least 2 MiB")]
    BlockSize(u64),
    /// The slot size is not a non-zero multiple of the block size.
    #[error(
        "virtio-mem slot size {slot:#x} is not a non-zero multiple of the block size {block:#x}"
    )]
    SlotSize {
        /// The slot size given.
        slot: u64,
        /// The block size.
        block: u64,
    },
    /// The region is empty, not a multiple of the slot size, or its end
    /// overflows.
    #[error("virtio-mem region of {region:#x} bytes is not a non-zero multiple of the slot size {slot:#x} below 2^64")]
    RegionSize {
        /// The region size given.
        region: u64,
        /// The slot size.
        slot: u64,
    },
    /// The region does not start on a slot boundary.
    #[error("virtio-mem region at {addr:#x} is not aligned to the slot size {slot:#x}")]
    RegionAddr {
        /// The region address given.
        addr: u64,
        /// The slot size.
        slot: u64,
    },
    /// The requested size is not a multiple of the block size or exceeds
    /// the region.
    #[error("virtio-mem requested size {bytes:#x} is not a multiple of the block size {block:#x} at most the region's {region:#x}")]
    RequestedSize {
        /// The size asked for.
        bytes: u64,
        /// The block size.
        block: u64,
        /// The region size.
        region: u64,
    },
    /// An eventfd could not be made.
    #[error("cannot create the virtio-mem device's eventfd: {0}")]
    EventFd(std::io::Error),
}
