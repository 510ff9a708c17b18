//! The devices' host resources, opened when their section is put, as
//! Firecracker opens them: a drive's file (`PUT /drives`), a network
//! interface's tap (`PUT /network-interfaces`), the vsock's listening socket
//! (`PUT /vsock`). All on the `files` thread ([`crate::files`]); the event
//! loop keeps the client's reply and answers when the result comes back
//! (see [`super::opens`]). A missing tap or file is a 400 naming it; from a
//! config file, exit 1.

use std::collections::BTreeMap;
use std::os::unix::net::UnixListener;
use std::sync::{Arc, Mutex};

use crate::config::{check_drives, DriveConfig, NetConfig, VsockConfig};
use crate::devices::virtio::block::{BlockOptions, CacheType as BlockCache};
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
    /// Each interface's tap (taken by the device at start).
    pub taps: BTreeMap<String, Arc<Mutex<Option<Tap>>>>,
    /// The vsock's socket (taken by the device at start).
    pub vsock: Option<Arc<Mutex<Option<UnixListener>>>>,
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
    let mut next: Vec<DriveConfig> = drives
        .iter()
        .filter(|x| x.drive_id != d.drive_id)
        .cloned()
        .collect();
    next.push(d);
    check_drives(&next).map_err(|e| e.to_string())?;
    Ok(next)
}

/// `nets` with `n` put in (replacing the interface of the same id).
pub fn with_net(nets: &[NetConfig], n: NetConfig) -> Result<Vec<NetConfig>, String> {
    let mut next: Vec<NetConfig> = nets
        .iter()
        .filter(|x| x.iface_id != n.iface_id)
        .cloned()
        .collect();
    next.push(n);
    crate::config::net::check_nets(&next).map_err(|e| e.to_string())?;
    Ok(next)
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
            r.taps
                .insert(n.iface_id.clone(), Arc::new(Mutex::new(Some(tap))));
        }
        if let Some(v) = vsock {
            let v2 = v.clone();
            let l = files
                .run_now(move || listener_for(&v2), OPEN_TIMEOUT)?
                .map_err(VmmError::Device)?;
            r.vsock = Some(Arc::new(Mutex::new(Some(l))));
        }
        Ok(r)
    }

    /// The drives to attach, the root device first (Firecracker's order).
    pub fn drive_specs(&self, drives: &[DriveConfig]) -> Vec<DriveSpec> {
        let mut v: Vec<DriveSpec> = drives
            .iter()
            .filter_map(|d| {
                let file = self.drives.get(&d.drive_id)?.clone();
                Some(DriveSpec {
                    opts: BlockOptions {
                        drive_id: d.drive_id.clone(),
                        read_only: d.is_read_only,
                        cache_type: match d.cache_type {
                            crate::config::CacheType::Unsafe => BlockCache::Unsafe,
                            crate::config::CacheType::Writeback => BlockCache::Writeback,
                        },
                    },
                    file,
                    is_root_device: d.is_root_device,
                    partuuid: d.partuuid.clone(),
                })
            })
            .collect();
        v.sort_by_key(|d| !d.is_root_device);
        v
    }

    /// The network interfaces to attach.
    pub fn net_specs(&self, nets: &[NetConfig]) -> Vec<NetSpec> {
        nets.iter()
            .filter_map(|n| {
                Some(NetSpec {
                    opts: NetOptions {
                        iface_id: n.iface_id.clone(),
                        guest_mac: n.guest_mac.map(|m| m.bytes()),
                    },
                    tap: self.taps.get(&n.iface_id)?.clone(),
                })
            })
            .collect()
    }

    /// The vsock to attach.
    pub fn vsock_spec(&self, vsock: Option<&VsockConfig>) -> Option<VsockSpec> {
        let v = vsock?;
        Some(VsockSpec {
            opts: VsockOptions {
                guest_cid: u64::from(v.guest_cid),
                uds_path: v.uds_path.clone(),
            },
            listener: self.vsock.clone()?,
        })
    }
}
