//! Holding the devices still for a snapshot ([`Devices::hold`]): while the
//! [`DeviceHold`] lives, no device thread does queue work or touches guest
//! memory, and the work that was in flight when it was taken has ended.
//!
//! How: the drives take no new chain and the balloon sends no new batch to
//! its sink (their flags), and the hold waits, pass by pass
//! ([`crate::devices::virtio::wait_for`]), until no drive has a request in
//! host I/O and no balloon batch is in flight; then the [`Gate`] every
//! device loop's passes enter closes, waiting for the passes inside to
//! end ([`Gate::close`]). Each wait has the one deadline
//! [`HOLD_TIMEOUT`]: a device that is not still by then is an error naming
//! it, and the hold is released. Dropping the hold opens the gate, lifts
//! the flags and wakes every device with all its queues marked, so what
//! came while it was held (a queue notification, a frame on the tap) is
//! served then: nothing is lost.

use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::devices::virtio::balloon::Balloon;
use crate::devices::virtio::block::Block;
use crate::devices::virtio::{wait_for, Gate, PassWatch, Wake};
use crate::devices::MmioSlot;
use crate::memory::GuestView;

use super::{lock, DeviceError, Devices};

/// How long [`Devices::hold`] waits for the devices to be still.
pub const HOLD_TIMEOUT: Duration = Duration::from_secs(10);

/// One device as a hold and a snapshot see it.
pub(super) struct Entry {
    /// Which device (the state file's key).
    pub key: DeviceKey,
    /// Its window on the bus (its transport).
    pub slot: MmioSlot,
    /// Its thread's passes.
    pub passes: PassWatch,
    /// Its wake eventfd, and how many queues it has.
    pub wake: Arc<Wake>,
    pub queues: usize,
}

/// What a hold closes, waits for and opens again: one per [`Devices`].
#[derive(Default)]
pub(super) struct HoldParts {
    /// Every device loop waits here before a pass while it is closed.
    pub gate: Arc<Gate>,
    pub entries: Vec<Entry>,
    pub blocks: Vec<Arc<Mutex<Block<GuestView>>>>,
    pub balloon: Option<Arc<Mutex<Balloon<GuestView>>>>,
    /// A hold exists.
    pub taken: AtomicBool,
}

/// The devices held still ([`Devices::hold`]); dropping it lets them go on.
#[must_use = "the devices go on when the hold is dropped"]
pub struct DeviceHold {
    pub(super) parts: Arc<HoldParts>,
}

impl std::fmt::Debug for DeviceHold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceHold")
            .field("devices", &self.parts.entries.len())
            .finish()
    }
}

impl HoldParts {
    /// The drives' and the balloon's work in flight has ended, and no pass
    /// of theirs runs (a pass running when the flags were set may still
    /// start I/O; one that starts after cannot).
    fn settled(&self, key: &DeviceKey) -> bool {
        let Some(e) = self.entries.iter().find(|e| &e.key == key) else {
            return true;
        };
        if e.passes.running() {
            return false;
        }
        match key {
            DeviceKey::Block(id) => self
                .blocks
                .iter()
                .map(|b| lock(b))
                .find(|b| &b.options().drive_id == id)
                .is_none_or(|b| b.requests_in_flight() == 0),
            DeviceKey::Balloon => self.balloon.as_ref().is_none_or(|b| lock(b).settled()),
            _ => true,
        }
    }

    fn set_flags(&self, on: bool) {
        for b in &self.blocks {
            lock(b).hold_requests(on);
        }
        if let Some(b) = &self.balloon {
            lock(b).hold_discards(on);
        }
    }

    /// Opens the gate, lifts the flags, wakes every device with all its
    /// queues marked.
    fn release(&self) {
        self.set_flags(false);
        self.gate.open();
        for e in &self.entries {
            let all: Vec<usize> = (0..e.queues).collect();
            if let Err(err) = e.wake.again(&all) {
                log::error!("{}: cannot wake it after a hold: {err}", e.key);
            }
        }
        self.taken.store(false, Ordering::SeqCst);
    }
}

impl Drop for DeviceHold {
    fn drop(&mut self) {
        self.parts.release();
    }
}

impl Devices {
    /// Holds every device still (see the module's docs): call it with the
    /// vCPUs paused, keep the hold while the devices' state is saved
    /// ([`Devices::save_state`]) and the memory written, then drop it. An
    /// error names the device that was not still in [`HOLD_TIMEOUT`] (the
    /// devices go on as before), or says a hold exists already.
    pub fn hold(&self) -> Result<DeviceHold, DeviceError> {
        let parts = &self.hold_parts;
        if parts
            .taken
            .compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst)
            .is_err()
        {
            return Err(DeviceError::AlreadyHeld);
        }
        // From here on an error drops it: released.
        let hold = DeviceHold {
            parts: parts.clone(),
        };
        let deadline = Instant::now() + HOLD_TIMEOUT;
        parts.set_flags(true);
        for e in &parts.entries {
            if !wait_for(deadline, || parts.settled(&e.key)) {
                return Err(DeviceError::NotStill {
                    device: e.key.to_string(),
                    what: "its work in flight did not end",
                });
            }
        }
        if !parts.gate.close(deadline) {
            let device = parts
                .entries
                .iter()
                .find(|e| e.passes.running())
                .map_or_else(|| "a device".to_string(), |e| e.key.to_string());
            return Err(DeviceError::NotStill {
                device,
                what: "its thread's pass did not end",
            });
        }
        // Still, with no pass to change it: settled stays settled.
        if let Some(e) = parts.entries.iter().find(|e| !parts.settled(&e.key)) {
            return Err(DeviceError::NotStill {
                device: e.key.to_string(),
                what: "work in flight was left after its thread stopped",
            });
        }
        Ok(hold)
    }
}

/// Which device an entry is: its kind and, where there may be several, its
/// id.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeviceKey {
    /// The balloon.
    Balloon,
    /// A drive, by `drive_id`.
    Block(String),
    /// A network interface, by `iface_id`.
    Net(String),
    /// The vsock.
    Vsock,
    /// The entropy device.
    Rng,
    /// The `n`th virtio-mem device (part of the hotplug region).
    Mem(usize),
}

impl std::fmt::Display for DeviceKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeviceKey::Balloon => write!(f, "balloon"),
            DeviceKey::Block(id) => write!(f, "drive {id}"),
            DeviceKey::Net(id) => write!(f, "network interface {id}"),
            DeviceKey::Vsock => write!(f, "vsock"),
            DeviceKey::Rng => write!(f, "entropy device"),
            DeviceKey::Mem(i) => write!(f, "virtio-mem{i}"),
        }
    }
}
