//! `PUT /snapshot/load`'s opens, on the `files` thread (never the event
//! loop: a path may be a FIFO or on a hung mount): the state file (read
//! whole, at most [`MAX_STATE_FILE_BYTES`], its envelope and contents
//! checked), the memory file (a regular file of exactly the state's
//! memory size) or the uffd handler's socket path, the network overrides
//! applied, and the devices' files and taps as their `PUT`s open them.

use std::sync::Arc;

use crate::files::{open, OpenRequest, OpenSpec};
use crate::memory::SnapshotMemory;
use crate::snapshot::state_file::{read_state, MAX_STATE_FILE_BYTES};
use crate::snapshot::{LoadSnapshotParams, MemBackendType, MemoryLoad, NetworkOverride};
use crate::vmm::snapshot_state::SnapshotState;

use super::device_opens::{drive_request, tap_for, DeviceResources};

/// A snapshot ready to restore.
pub struct OpenedSnapshot {
    /// The state, checked, with the network overrides applied.
    pub state: SnapshotState,
    /// Where guest memory comes from.
    pub memory: SnapshotMemory,
    /// The devices' files and taps.
    pub resources: DeviceResources,
}

/// Opens and checks what `params` names (on the `files` thread). The text
/// of an error names the field and the path.
pub fn open_snapshot(
    params: &LoadSnapshotParams,
    workers_per_node: u32,
) -> Result<OpenedSnapshot, String> {
    let opened = open(&OpenRequest {
        what: "snapshot_path",
        path: params.snapshot_path.clone(),
        spec: OpenSpec::ReadImage {
            max_bytes: MAX_STATE_FILE_BYTES,
            head_bytes: 0,
            check: None,
        },
    })
    .map_err(|e| e.to_string())?;
    let bad_state = |e: String| format!("snapshot_path {}: {e}", params.snapshot_path.display());
    let mut state: SnapshotState =
        read_state(&opened.file, opened.len).map_err(|e| bad_state(e.to_string()))?;
    state.check().map_err(|e| bad_state(e.to_string()))?;
    apply_overrides(&mut state, &params.network_overrides)?;
    let memory = open_memory(params, &state, workers_per_node)?;
    let resources = open_devices(&state)?;
    Ok(OpenedSnapshot {
        state,
        memory,
        resources,
    })
}

/// Puts each override's tap in place of its interface's.
fn apply_overrides(state: &mut SnapshotState, overrides: &[NetworkOverride]) -> Result<(), String> {
    for o in overrides {
        let Some(n) = state
            .config
            .network_interfaces
            .iter_mut()
            .find(|n| n.iface_id == o.iface_id)
        else {
            return Err(format!(
                "network_overrides: the snapshot has no network interface {:?}",
                o.iface_id
            ));
        };
        n.host_dev_name.clone_from(&o.host_dev_name);
    }
    Ok(())
}

fn open_memory(
    params: &LoadSnapshotParams,
    state: &SnapshotState,
    workers_per_node: u32,
) -> Result<SnapshotMemory, String> {
    let b = &params.mem_backend;
    if b.backend_type == MemBackendType::Uffd {
        return Ok(SnapshotMemory::Uffd {
            handler: b.backend_path.clone(),
            device: open_userfaultfd_device(),
        });
    }
    let opened = open(&OpenRequest {
        what: "mem_backend.backend_path",
        path: b.backend_path.clone(),
        spec: OpenSpec::ReadImage {
            max_bytes: u64::MAX,
            head_bytes: 0,
            check: None,
        },
    })
    .map_err(|e| e.to_string())?;
    let mem_bytes = state.mem_bytes();
    if opened.len != mem_bytes {
        return Err(format!(
            "mem_backend.backend_path {}: the memory file holds {} bytes, the snapshot's memory is {} bytes",
            b.backend_path.display(),
            opened.len,
            mem_bytes
        ));
    }
    Ok(match params.memory_load {
        MemoryLoad::Lazy => SnapshotMemory::Lazy(opened.file),
        MemoryLoad::Eager => SnapshotMemory::Eager {
            file: opened.file,
            workers_per_node,
        },
    })
}

fn open_devices(state: &SnapshotState) -> Result<DeviceResources, String> {
    let mut r = DeviceResources::default();
    for d in &state.config.drives {
        let o = open(&drive_request(d)).map_err(|e| e.to_string())?;
        r.drives.insert(d.drive_id.clone(), Arc::new(o.file));
    }
    for n in &state.config.network_interfaces {
        r.taps.insert(n.iface_id.clone(), Arc::new(tap_for(n)?));
    }
    if let Some(v) = &state.config.vsock {
        let l = super::device_opens::listener_for(v)?;
        r.vsock = Some(Arc::new(l));
    }
    Ok(r)
}

/// `/dev/userfaultfd`, read-write, as Firecracker opens it before it tries
/// `userfaultfd(2)`: the jailer makes one in the chroot, owned by the jailed
/// uid, because an unprivileged process may not ask the call for a
/// userfaultfd that takes KVM's faults. None where this root has none, or
/// one this uid may not open (a host's, root's 0600, where the call may
/// still work: root, or `vm.unprivileged_userfaultfd`); the log says why.
fn open_userfaultfd_device() -> Option<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(USERFAULTFD_DEVICE)
    {
        Ok(f) => Some(f),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => {
            log::warn!("cannot open {USERFAULTFD_DEVICE} ({e}): the userfaultfd is asked of userfaultfd(2)");
            None
        }
    }
}

/// Where the kernel's userfaultfd device is (Linux 6.1 and later).
const USERFAULTFD_DEVICE: &str = "/dev/userfaultfd";
