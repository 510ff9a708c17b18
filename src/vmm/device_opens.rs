//! The devices' host resources, opened when their section is put, as
//! Firecracker opens them: a drive's file (`PUT /drives`), a network
//! interface's tap (`PUT /network-interfaces`), the vsock's listening socket
//! (`PUT /vsock`). All on the `files` thread ([`crate::files`]); the event
//! loop keeps the client's reply and answers when the result comes back
//! (see [`super::opens`]). A missing tap or file is a 400 naming it; from a
//! config file, exit 1.

use std::collections::BTreeMap;
use std::os::unix::net::UnixListener;
use std::sync::Arc;

use crate::config::{check_drives, DriveConfig, NetConfig, VsockConfig};
use crate::devices::virtio::block::BlockOptions;
use crate::devices::virtio::net::{open_tap, NetOptions, Tap};
use crate::devices::virtio::vsock::{bind_uds, VsockOptions};
use crate::files::{FileOpener, OpenRequest, OpenSpec, OPEN_TIMEOUT};

use super::devices::{DriveSpec, NetSpec, VsockSpec};
use super::VmmError;

/// The devices' host resources in force, by id.
#[derive(Debug, Default)]
pub struct DeviceResources {
    /// Each drive's file.
    pub drives: BTreeMap<String, Arc<std::fs::File>>,
    /// Each interface's tap (a device at start gets its own handle).
    pub taps: BTreeMap<String, Arc<Tap>>,
    /// The vsock's socket (a device at start gets its own handle).
    pub vsock: Option<Arc<UnixListener>>,
}

/// How the `files` thread opens a drive's file.
pub fn drive_request(d: &DriveConfig) -> OpenRequest {
    OpenRequest {
        what: "drives.path_on_host",
        path: d.path_on_host.clone(),
        spec: OpenSpec::Drive {
            read_only: d.is_read_only,
        },
    }
}

/// Opens a tap by name (run on the `files` thread).
pub fn tap_for(n: &NetConfig) -> Result<Tap, String> {
    if let Some(mtu) = n.mtu {
        return Err(format!(
            "network-interfaces.mtu: {mtu} is not supported by teravm (its virtio-net offers no MTU)"
        ));
    }
    open_tap(&n.host_dev_name).map_err(|e| format!("network-interfaces.host_dev_name: {e}"))
}

/// Binds a vsock's socket (run on the `files` thread).
pub fn listener_for(v: &VsockConfig) -> Result<UnixListener, String> {
    bind_uds(&v.uds_path).map_err(|e| format!("vsock.uds_path: {e}"))
}

/// `drives` with `d` put in (replacing the drive of the same id), checked
/// as a list (unique ids, one root device).
pub fn with_drive(drives: &[DriveConfig], d: DriveConfig) -> Result<Vec<DriveConfig>, String> {
    let next = replaced(drives, d, |a, b| a.drive_id == b.drive_id);
    check_drives(&next).map_err(|e| e.to_string())?;
    Ok(next)
}

/// `nets` with `n` put in (replacing the interface of the same id).
pub fn with_net(nets: &[NetConfig], n: NetConfig) -> Result<Vec<NetConfig>, String> {
    let next = replaced(nets, n, |a, b| a.iface_id == b.iface_id);
    crate::config::net::check_nets(&next).map_err(|e| e.to_string())?;
    Ok(next)
}

/// `list` with `item` last, in place of the entries that are `same` as it.
fn replaced<T: Clone>(list: &[T], item: T, same: impl Fn(&T, &T) -> bool) -> Vec<T> {
    let mut next: Vec<T> = list.iter().filter(|x| !same(x, &item)).cloned().collect();
    next.push(item);
    next
}

/// The parts of `config`'s hotplug region on `topology`, one per guest
/// node (one virtio-mem device each), as the start places them; `None`
/// without a region.
pub fn hotplug_parts(
    config: &crate::config::VmConfig,
    topology: &crate::memory::HostTopology,
) -> Option<Result<Vec<crate::memory::NodeSlice>, String>> {
    let h = config.memory_hotplug.as_ref()?;
    let opts = crate::memory::HotplugOptions {
        total_bytes: u64::from(h.total_size_mib) << 20,
        slot_bytes: u64::from(h.slot_size_mib) << 20,
    };
    let memory = crate::memory::MemoryOptions::from(config);
    Some(
        crate::memory::GuestMemory::plan(&memory, topology)
            .map_err(|e| e.to_string())
            .and_then(|slices| {
                let nodes: Vec<u32> = slices.iter().map(|s| s.node).collect();
                crate::memory::hotplug::hotplug_parts(&opts, memory.mem_bytes, &nodes)
                    .map_err(|e| format!("memory hotplug: {e}"))
            }),
    )
}

/// The virtio-mem devices `config` gets on `topology`: one per part
/// ([`hotplug_parts`]), 0 without a region, 1 where the parts cannot be
/// planned yet (the start then says why).
pub fn hotplug_devices(
    config: &crate::config::VmConfig,
    topology: &crate::memory::HostTopology,
) -> usize {
    match hotplug_parts(config, topology) {
        None => 0,
        Some(Ok(parts)) => parts.len().max(1),
        Some(Err(_)) => 1,
    }
}

/// Refuses a change to `config` that would give the microVM more devices
/// than a guest has interrupt lines for ([`crate::config::MAX_DEVICES`]),
/// counting virtio-mem as the devices `topology` gives it.
pub fn check_count_with(
    config: &crate::config::VmConfig,
    topology: &crate::memory::HostTopology,
    change: impl FnOnce(&mut crate::config::VmConfig),
) -> Result<(), String> {
    let mut next = config.clone();
    change(&mut next);
    let count = next.device_count() - usize::from(next.memory_hotplug.is_some())
        + hotplug_devices(&next, topology);
    crate::config::check_device_count(count).map_err(|e| e.to_string())
}

impl DeviceResources {
    /// Opens what a config file's device sections name, waiting for each
    /// (start-up: a failure ends the process with exit 1).
    pub fn open_for_config(
        files: &FileOpener,
        drives: &[DriveConfig],
        nets: &[NetConfig],
        vsock: Option<&VsockConfig>,
    ) -> Result<DeviceResources, VmmError> {
        let mut r = DeviceResources::default();
        for d in drives {
            let opened = files.open_one(drive_request(d), OPEN_TIMEOUT)?;
            r.drives.insert(d.drive_id.clone(), Arc::new(opened.file));
        }
        for n in nets {
            let n2 = n.clone();
            let tap = files
                .run_now(move || tap_for(&n2), OPEN_TIMEOUT)?
                .map_err(VmmError::Device)?;
            r.taps.insert(n.iface_id.clone(), Arc::new(tap));
        }
        if let Some(v) = vsock {
            let v2 = v.clone();
            let l = files
                .run_now(move || listener_for(&v2), OPEN_TIMEOUT)?
                .map_err(VmmError::Device)?;
            r.vsock = Some(Arc::new(l));
        }
        Ok(r)
    }

    /// The drives to attach, the root device first (Firecracker's order).
    /// A drive whose file is not open (never a drive that was put, whose
    /// open answered its PUT) fails the start, naming it.
    pub fn drive_specs(&self, drives: &[DriveConfig]) -> Result<Vec<DriveSpec>, String> {
        let mut v = drives
            .iter()
            .map(|d| {
                let file = self.drives.get(&d.drive_id).cloned().ok_or_else(|| {
                    format!(
                        "drive {:?}: its file {} is not open (PUT /drives/{} again)",
                        d.drive_id,
                        d.path_on_host.display(),
                        d.drive_id
                    )
                })?;
                Ok(DriveSpec {
                    opts: BlockOptions::from(d),
                    file,
                    is_root_device: d.is_root_device,
                    partuuid: d.partuuid.clone(),
                })
            })
            .collect::<Result<Vec<_>, String>>()?;
        v.sort_by_key(|d| !d.is_root_device);
        Ok(v)
    }

    /// The network interfaces to attach; one whose tap is not open fails
    /// the start, naming it.
    pub fn net_specs(&self, nets: &[NetConfig]) -> Result<Vec<NetSpec>, String> {
        nets.iter()
            .map(|n| {
                let tap = self.taps.get(&n.iface_id).cloned().ok_or_else(|| {
                    format!(
                        "network interface {:?}: its tap {} is not open",
                        n.iface_id, n.host_dev_name
                    )
                })?;
                Ok(NetSpec {
                    opts: NetOptions {
                        iface_id: n.iface_id.clone(),
                        guest_mac: n.guest_mac.map(|m| m.bytes()),
                        rx_rate_limiter: n.rx_rate_limiter.unwrap_or_default(),
                        tx_rate_limiter: n.tx_rate_limiter.unwrap_or_default(),
                    },
                    tap,
                    mmds: None,
                })
            })
            .collect()
    }

    /// The vsock to attach; one whose socket is not bound fails the start.
    pub fn vsock_spec(&self, vsock: Option<&VsockConfig>) -> Result<Option<VsockSpec>, String> {
        let Some(v) = vsock else {
            return Ok(None);
        };
        let listener = self
            .vsock
            .clone()
            .ok_or_else(|| format!("vsock: its socket {} is not bound", v.uds_path.display()))?;
        Ok(Some(VsockSpec {
            opts: VsockOptions {
                guest_cid: u64::from(v.guest_cid),
                uds_path: v.uds_path.clone(),
            },
            listener,
        }))
    }
}
