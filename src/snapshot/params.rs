//! The bodies of `PUT /snapshot/create` and `PUT /snapshot/load`, as
//! Firecracker takes them (`vmm_config/snapshot.rs`), plus teravm's
//! `memory_load` (the eager, per-node load; Firecracker refuses the field).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// What a create writes: the whole memory, or the pages dirtied since the
/// last snapshot (Firecracker's `snapshot_type`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
pub enum SnapshotType {
    /// Only the pages written since the last snapshot or the load.
    Diff,
    /// All of guest memory (sparse: only where the guest has memory).
    #[default]
    Full,
}

/// `PUT /snapshot/create`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CreateSnapshotParams {
    /// Full or Diff.
    #[serde(default)]
    pub snapshot_type: SnapshotType,
    /// Where the state file goes.
    pub snapshot_path: PathBuf,
    /// Where the memory file goes.
    pub mem_file_path: PathBuf,
}

/// Where a load's guest memory comes from (Firecracker's `backend_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
pub enum MemBackendType {
    /// The memory file, at `backend_path`.
    File,
    /// A page-fault handler listening on the Unix socket at `backend_path`.
    Uffd,
}

/// `mem_backend` of `PUT /snapshot/load`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct MemBackend {
    /// The memory file, or the handler's socket.
    pub backend_path: PathBuf,
    /// Which of the two.
    pub backend_type: MemBackendType,
}

/// How a `File` load brings guest memory in (teravm's `memory_load`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
pub enum MemoryLoad {
    /// `MAP_PRIVATE` of the memory file: pages come in as the guest touches
    /// them (Firecracker's way).
    #[default]
    Lazy,
    /// Each host node's workers read their slice's data extents into memory
    /// bound to the node before the guest runs; the guest then depends on no
    /// file.
    Eager,
}

/// One entry of `network_overrides`: the tap a restored interface uses.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct NetworkOverride {
    /// The interface, as the snapshot names it.
    pub iface_id: String,
    /// The tap to use instead of the snapshot's.
    pub host_dev_name: String,
}

/// `PUT /snapshot/load`, checked: exactly one memory source, resolved.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LoadSnapshotParams {
    /// The state file.
    pub snapshot_path: PathBuf,
    /// Where guest memory comes from.
    pub mem_backend: MemBackend,
    /// Track dirty pages from the start (for a later Diff snapshot).
    pub track_dirty_pages: bool,
    /// Resume the vCPUs once loaded.
    pub resume_vm: bool,
    /// Taps to use instead of the snapshot's.
    pub network_overrides: Vec<NetworkOverride>,
    /// Lazy (Firecracker's) or Eager (teravm's); only with `File`.
    pub memory_load: MemoryLoad,
}
