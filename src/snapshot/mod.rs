//! Snapshots: Firecracker's `PUT /snapshot/create` and `PUT /snapshot/load`.
//!
//! A snapshot is two files. The memory file holds each guest RAM region at
//! the offset the state file records (Firecracker's layout), written sparse
//! by the per-node workers ([`crate::memory::snapshot`]). The state file
//! holds everything else: the vCPUs and the VM (KVM's state), the devices,
//! the configuration; versioned, CRC'd and bounded on load.

pub mod params;
pub mod state_file;

pub use params::{
    CreateSnapshotParams, LoadBodyError, LoadSnapshotConfig, LoadSnapshotParams, MemBackend,
    MemBackendType, MemoryLoad, NetworkOverride, SnapshotLoadHugePages, SnapshotType,
    VsockOverride,
};
