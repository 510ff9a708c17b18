//! The bodies of `PUT /snapshot/create` and `PUT /snapshot/load`, as
//! Firecracker takes them (`vmm_config/snapshot.rs`), plus teravm's
//! `memory_load` (the eager, per-node load; Firecracker refuses the field).
//!
//! A load body is parsed as Firecracker's `LoadSnapshotConfig`
//! ([`LoadSnapshotConfig`]: the same fields, unknown ones refused, but
//! inside `network_overrides` and `vsock_override`, where Firecracker takes
//! them too) and then checked and resolved into [`LoadSnapshotParams`]
//! ([`LoadSnapshotConfig::resolve`]) as Firecracker's `parse_put_snapshot_load`
//! does: exactly one of `mem_file_path` (deprecated, a `File` backend) and
//! `mem_backend`; `enable_diff_snapshots` (deprecated) or
//! `track_dirty_pages`. What teravm cannot honour is refused, naming the
//! field: a `vsock_override`, `huge_pages` other than `Snapshot`,
//! `clock_realtime: true`, and `memory_load: Eager` with a `Uffd` backend.

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
/// Other fields are ignored, as Firecracker ignores them (its
/// `NetworkOverride` does not deny unknown fields).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
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

/// Firecracker's text when both `mem_file_path` and `mem_backend` are given.
pub const TOO_MANY_FIELDS: &str =
    "too many fields: either `mem_backend` or `mem_file_path` exclusively is required";
/// Firecracker's text when neither `mem_file_path` nor `mem_backend` is given.
pub const MISSING_FIELD: &str =
    "missing field: either `mem_backend` or `mem_file_path` is required";
/// Firecracker's warning for a load body with a deprecated field.
pub const LOAD_DEPRECATION_MESSAGE: &str =
    "PUT /snapshot/load: mem_file_path and enable_diff_snapshots fields are deprecated.";

/// `vsock_override` of `PUT /snapshot/load`: the socket a restored vsock
/// listens on. Parsed as Firecracker parses it (unknown fields ignored);
/// teravm refuses it ([`LoadBodyError::NotSupported`]).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct VsockOverride {
    /// The new Unix socket path.
    pub uds_path: String,
}

/// `huge_pages` of `PUT /snapshot/load`, with Firecracker's spellings.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
pub enum SnapshotLoadHugePages {
    /// The snapshot's own setting (the only one teravm takes).
    #[default]
    Snapshot,
    /// No huge pages.
    None,
    /// Transparent huge pages.
    Transparent,
    /// 2 MiB hugetlbfs pages.
    #[serde(rename = "2M")]
    Hugetlbfs2M,
}

/// The body of `PUT /snapshot/load` as it comes (Firecracker's
/// `LoadSnapshotConfig`, plus `memory_load`); [`LoadSnapshotConfig::resolve`]
/// checks it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoadSnapshotConfig {
    /// The state file.
    pub snapshot_path: PathBuf,
    /// Deprecated: the memory file (a `File` backend).
    #[serde(default)]
    pub mem_file_path: Option<PathBuf>,
    /// Where guest memory comes from.
    #[serde(default)]
    pub mem_backend: Option<MemBackend>,
    /// Deprecated spelling of `track_dirty_pages`.
    #[serde(default)]
    pub enable_diff_snapshots: bool,
    /// Track dirty pages from the start.
    #[serde(default)]
    pub track_dirty_pages: bool,
    /// Resume the vCPUs once loaded.
    #[serde(default)]
    pub resume_vm: bool,
    /// Taps to use instead of the snapshot's.
    #[serde(default)]
    pub network_overrides: Vec<NetworkOverride>,
    /// Refused by teravm when given.
    #[serde(default)]
    pub vsock_override: Option<VsockOverride>,
    /// Refused by teravm when true.
    #[serde(default)]
    pub clock_realtime: bool,
    /// Refused by teravm unless `Snapshot`.
    #[serde(default)]
    pub huge_pages: SnapshotLoadHugePages,
    /// teravm's own: Lazy (default) or Eager.
    #[serde(default)]
    pub memory_load: MemoryLoad,
}

/// Why a parsed load body is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LoadBodyError {
    /// Both `mem_file_path` and `mem_backend` (Firecracker's text).
    #[error("{TOO_MANY_FIELDS}")]
    TooManyFields,
    /// Neither `mem_file_path` nor `mem_backend` (Firecracker's text).
    #[error("{MISSING_FIELD}")]
    MissingField,
    /// A field Firecracker takes that teravm cannot honour: the field and
    /// the value, e.g. `vsock_override`, `huge_pages "2M"`.
    #[error("{0} is not supported by teravm")]
    NotSupported(&'static str),
    /// `memory_load: Eager` with a `Uffd` backend.
    #[error(
        "memory_load \"Eager\" needs a \"File\" mem_backend (it reads the memory file); a \
         \"Uffd\" backend is served lazily by its handler"
    )]
    EagerNeedsFile,
}

impl LoadSnapshotConfig {
    /// Whether the body uses a deprecated field (`mem_file_path`,
    /// `enable_diff_snapshots`): Firecracker then logs
    /// [`LOAD_DEPRECATION_MESSAGE`] and counts a deprecated API call.
    pub fn is_deprecated(&self) -> bool {
        self.mem_file_path.is_some() || self.enable_diff_snapshots
    }

    /// Checks the body and resolves it, in Firecracker's order (the memory
    /// source first), then what teravm refuses.
    pub fn resolve(self) -> Result<LoadSnapshotParams, LoadBodyError> {
        let mem_backend = match (self.mem_backend, self.mem_file_path) {
            (Some(_), Some(_)) => return Err(LoadBodyError::TooManyFields),
            (None, None) => return Err(LoadBodyError::MissingField),
            (Some(backend), None) => backend,
            (None, Some(path)) => MemBackend {
                backend_path: path,
                backend_type: MemBackendType::File,
            },
        };
        if self.vsock_override.is_some() {
            return Err(LoadBodyError::NotSupported("vsock_override"));
        }
        match self.huge_pages {
            SnapshotLoadHugePages::Snapshot => {}
            SnapshotLoadHugePages::None => {
                return Err(LoadBodyError::NotSupported("huge_pages \"None\""))
            }
            SnapshotLoadHugePages::Transparent => {
                return Err(LoadBodyError::NotSupported("huge_pages \"Transparent\""))
            }
            SnapshotLoadHugePages::Hugetlbfs2M => {
                return Err(LoadBodyError::NotSupported("huge_pages \"2M\""))
            }
        }
        if self.clock_realtime {
            return Err(LoadBodyError::NotSupported("clock_realtime true"));
        }
        if self.memory_load == MemoryLoad::Eager && mem_backend.backend_type == MemBackendType::Uffd
        {
            return Err(LoadBodyError::EagerNeedsFile);
        }
        Ok(LoadSnapshotParams {
            snapshot_path: self.snapshot_path,
            mem_backend,
            track_dirty_pages: self.track_dirty_pages || self.enable_diff_snapshots,
            resume_vm: self.resume_vm,
            network_overrides: self.network_overrides,
            memory_load: self.memory_load,
        })
    }
}

#[cfg(test)]
#[path = "params_tests.rs"]
mod tests;
