//! The block device's state in a snapshot ([`BlockState`]): its queue is
//! the transport's ([`crate::devices::virtio::TransportState`]); the device
//! keeps only its configuration space (the capacity, which the backing file
//! given at restore answers again) and its generation. Firecracker's
//! `VirtioBlockState` keeps the same, with the file's path, which here is
//! the configuration's.
//!
//! Holding it still ([`Block::hold_requests`]): the thread takes no new
//! chain and finishes those in host I/O; [`Block::requests_in_flight`]
//! says when none is left.

use std::sync::atomic::Ordering;

use serde::{Deserialize, Serialize};

use super::{Block, BlockError};
use crate::devices::virtio::DeviceMemory;

/// What a drive keeps in a snapshot beside its transport.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockState {
    /// The drive's id.
    pub drive_id: String,
    /// Whether it was read-only (offers `VIRTIO_BLK_F_RO`).
    pub read_only: bool,
    /// Its size in sectors when saved (the configuration space).
    pub capacity_sectors: u64,
    /// The configuration generation.
    pub config_generation: u32,
}

impl<M: DeviceMemory> Block<M> {
    /// Holds the device's thread from taking new chains (`true`) or lets it
    /// go on (`false`; the caller wakes it).
    pub fn hold_requests(&self, on: bool) {
        self.shared.holding.store(on, Ordering::SeqCst);
    }

    /// Requests in host I/O (io_uring), as the thread left it after its
    /// last pass.
    pub fn requests_in_flight(&self) -> usize {
        self.shared.in_flight.load(Ordering::SeqCst)
    }

    /// Its state now.
    pub fn save_state(&self) -> BlockState {
        BlockState {
            drive_id: self.opts.drive_id.clone(),
            read_only: self.opts.read_only,
            capacity_sectors: self.capacity_sectors(),
            config_generation: self.shared.config_generation.load(Ordering::SeqCst),
        }
    }

    /// Puts the state back on a device made from the same configuration
    /// (before its transport restarts it).
    pub fn restore_state(&self, s: &BlockState) -> Result<(), BlockError> {
        if s.read_only != self.opts.read_only {
            return Err(BlockError::BadState(format!(
                "saved {}, configured {}",
                ro(s.read_only),
                ro(self.opts.read_only)
            )));
        }
        if s.capacity_sectors != self.capacity_sectors() {
            log::warn!(
                "drive {}: the snapshot saw {} sectors, its file now has {}",
                self.opts.drive_id,
                s.capacity_sectors,
                self.capacity_sectors()
            );
        }
        self.shared
            .config_generation
            .store(s.config_generation, Ordering::SeqCst);
        Ok(())
    }
}

fn ro(read_only: bool) -> &'static str {
    if read_only {
        "read-only"
    } else {
        "read-write"
    }
}
