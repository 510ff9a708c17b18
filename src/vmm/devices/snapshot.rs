//! The devices' state in a snapshot ([`DevicesState`]): one entry per
//! device, keyed by its kind and id ([`DeviceKey`]), each with its
//! transport's state ([`TransportState`]) and its own
//! ([`DeviceKindState`]). Saved with the devices held
//! ([`Devices::save_state`]), put back on devices built from the same
//! configuration ([`Devices::restore_state`]).
//!
//! Covered: the balloon, the drives, the network interfaces, the vsock
//! (its connections are not: the guest is told of a transport reset after
//! the restore, as Firecracker does), the entropy device. A microVM with
//! memory hotplug (virtio-mem) is refused at the save, naming it
//! ([`DeviceError::SnapshotUnsupported`]).
//!
//! A restore reads a file that may be hostile: a state whose devices are
//! not the configuration's (one missing, one more, another kind), or whose
//! numbers do not fit its device (queues, features, addresses outside
//! guest memory, a statistics buffer past its queue) is an error naming
//! the device, never a panic.

use std::collections::HashSet;

use serde::{Deserialize, Serialize};

use crate::devices::virtio::balloon::BalloonState;
use crate::devices::virtio::block::BlockState;
use crate::devices::virtio::net::NetState;
use crate::devices::virtio::vsock::VsockState;
use crate::devices::virtio::TransportState;

use super::hold::{DeviceHold, DeviceKey};
use super::{lock, DeviceError, Devices};

/// A device's own state, beside its transport's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeviceKindState {
    /// The balloon's.
    Balloon(BalloonState),
    /// A drive's.
    Block(BlockState),
    /// A network interface's.
    Net(NetState),
    /// The vsock's.
    Vsock(VsockState),
    /// The entropy device keeps nothing.
    Rng,
}

impl DeviceKindState {
    /// Whether it is the state of a device `key` names.
    fn fits(&self, key: &DeviceKey) -> bool {
        matches!(
            (self, key),
            (DeviceKindState::Balloon(_), DeviceKey::Balloon)
                | (DeviceKindState::Block(_), DeviceKey::Block(_))
                | (DeviceKindState::Net(_), DeviceKey::Net(_))
                | (DeviceKindState::Vsock(_), DeviceKey::Vsock)
                | (DeviceKindState::Rng, DeviceKey::Rng)
        )
    }
}

/// One device in a snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceState {
    /// Which device.
    pub key: DeviceKey,
    /// Its transport's registers and queues.
    pub transport: TransportState,
    /// Its own state.
    pub device: DeviceKindState,
}

/// Every device of a microVM, in attach order.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct DevicesState {
    /// One per device.
    pub devices: Vec<DeviceState>,
}

fn restore_error(key: &DeviceKey, why: impl std::fmt::Display) -> DeviceError {
    DeviceError::Restore {
        device: key.to_string(),
        why: why.to_string(),
    }
}

impl Devices {
    /// The devices this microVM has that a snapshot does not cover yet.
    fn unsupported(&self) -> Result<(), DeviceError> {
        if self.hotplug.is_some() {
            return Err(DeviceError::SnapshotUnsupported(
                "memory hotplug (virtio-mem)",
            ));
        }
        Ok(())
    }

    /// Every device's state, with the devices held (`hold`, from
    /// [`Devices::hold`] on these devices). A device a snapshot does not
    /// cover yet is [`DeviceError::SnapshotUnsupported`].
    pub fn save_state(&self, hold: &DeviceHold) -> Result<DevicesState, DeviceError> {
        if !std::sync::Arc::ptr_eq(&hold.parts, &self.hold_parts) {
            return Err(DeviceError::NotHeld);
        }
        self.unsupported()?;
        let mut devices = Vec::with_capacity(self.hold_parts.entries.len());
        for e in &self.hold_parts.entries {
            let transport = self
                .buses
                .mmio
                .with_device(e.slot, |d| d.save_transport())
                .flatten()
                .ok_or_else(|| DeviceError::Save {
                    device: e.key.to_string(),
                    why: "its transport is no longer on the bus",
                })?;
            let device = self.device_state(&e.key)?;
            devices.push(DeviceState {
                key: e.key.clone(),
                transport,
                device,
            });
        }
        Ok(DevicesState { devices })
    }

    fn device_state(&self, key: &DeviceKey) -> Result<DeviceKindState, DeviceError> {
        let missing = || DeviceError::Save {
            device: key.to_string(),
            why: "it is not among the devices",
        };
        Ok(match key {
            DeviceKey::Balloon => {
                let b = self.balloon.as_ref().ok_or_else(missing)?;
                DeviceKindState::Balloon(lock(&b.device).save_state())
            }
            DeviceKey::Block(id) => {
                let b = self
                    .blocks
                    .iter()
                    .find(|b| &b.drive_id == id)
                    .ok_or_else(missing)?;
                DeviceKindState::Block(lock(&b.device).save_state())
            }
            DeviceKey::Net(id) => {
                let n = self
                    .nets
                    .iter()
                    .map(|n| lock(n))
                    .find(|n| n.iface_id() == id)
                    .ok_or_else(missing)?;
                DeviceKindState::Net(n.save_state())
            }
            DeviceKey::Rng => DeviceKindState::Rng,
            DeviceKey::Vsock => {
                let v = self.vsock.as_ref().ok_or_else(missing)?;
                DeviceKindState::Vsock(lock(v).save_state())
            }
            DeviceKey::Mem(_) => {
                return Err(DeviceError::SnapshotUnsupported(
                    "memory hotplug (virtio-mem)",
                ))
            }
        })
    }

    /// Puts every device back as `state` says, on devices just built
    /// ([`Devices::build`]) from the configuration the snapshot was taken
    /// with, guest memory already holding the snapshot's contents and the
    /// vCPUs not yet started. A device that ran is started through the path
    /// of a driver's `DRIVER_OK`, its queues where they stood, and signalled
    /// for the interrupts it had pending; then every device thread is woken
    /// to serve what the guest had queued. A state that does not fit the
    /// devices is an error naming the device.
    pub fn restore_state(&self, state: &DevicesState) -> Result<(), DeviceError> {
        self.unsupported()?;
        let entries = &self.hold_parts.entries;
        let mut seen = HashSet::new();
        for s in &state.devices {
            if !seen.insert(&s.key) {
                return Err(restore_error(&s.key, "the snapshot has it twice"));
            }
            if !entries.iter().any(|e| e.key == s.key) {
                return Err(restore_error(
                    &s.key,
                    "the snapshot has it and the configuration does not",
                ));
            }
            if !s.device.fits(&s.key) {
                return Err(restore_error(&s.key, "its saved state is another kind's"));
            }
        }
        // The devices' threads wait while it is put back, and are woken to
        // go on when the hold is dropped.
        let _held = self.hold()?;
        for e in entries {
            let s = state
                .devices
                .iter()
                .find(|s| s.key == e.key)
                .ok_or_else(|| restore_error(&e.key, "the snapshot does not have it"))?;
            self.buses
                .mmio
                .with_device(e.slot, |d| d.restore_transport(&s.transport))
                .flatten()
                .ok_or_else(|| restore_error(&e.key, "its transport is not on the bus"))?
                .map_err(|err| restore_error(&e.key, err))?;
            self.restore_device(&e.key, &s.device)
                .map_err(|err| restore_error(&e.key, err))?;
        }
        Ok(())
    }

    fn restore_device(&self, key: &DeviceKey, s: &DeviceKindState) -> Result<(), String> {
        match (key, s) {
            (DeviceKey::Balloon, DeviceKindState::Balloon(s)) => {
                let b = self.balloon.as_ref().ok_or("not configured")?;
                lock(&b.device).restore_state(s).map_err(|e| e.to_string())
            }
            (DeviceKey::Block(id), DeviceKindState::Block(s)) => {
                let b = self
                    .blocks
                    .iter()
                    .find(|b| &b.drive_id == id)
                    .ok_or("not configured")?;
                lock(&b.device).restore_state(s).map_err(|e| e.to_string())
            }
            (DeviceKey::Net(id), DeviceKindState::Net(s)) => {
                let n = self
                    .nets
                    .iter()
                    .map(|n| lock(n))
                    .find(|n| n.iface_id() == id)
                    .ok_or("not configured")?;
                n.restore_state(s).map_err(|e| e.to_string())
            }
            (DeviceKey::Vsock, DeviceKindState::Vsock(s)) => {
                let v = self.vsock.as_ref().ok_or("not configured")?;
                let sent = lock(v).restore_state(s).map_err(|e| e.to_string())?;
                if !sent {
                    log::info!("vsock: restored without a transport reset event (not running, or no event buffer)");
                }
                Ok(())
            }
            (DeviceKey::Rng, DeviceKindState::Rng) => Ok(()),
            _ => Err("its saved state is another kind's".into()),
        }
    }
}
