//! The network device's state in a snapshot ([`NetState`]): its queues are
//! the transport's ([`crate::devices::virtio::TransportState`]); the device
//! keeps its configuration space (the guest's MAC). The tap is the
//! configuration's (a restore may name another, Firecracker's network
//! overrides), so it is not saved.
//!
//! Receive: chains the device took for a frame that waited for more
//! buffers are saved as not taken ([`Net::queue_positions`](crate::devices::virtio::VirtioDevice::queue_positions)
//! rewinds the receive queue's `next_avail` over them), and the frame is not
//! saved: after a restore the device takes those chains again and the frame
//! is lost, as a frame on the wire may be (Firecracker drops it too).

use serde::{Deserialize, Serialize};

use super::device::Net;
use super::{NetError, RX_INDEX};
use crate::devices::virtio::{DeviceMemory, QueuePosition};

/// What a network interface keeps in a snapshot beside its transport.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetState {
    /// The interface's id.
    pub iface_id: String,
    /// The guest's MAC, as the configuration space showed it.
    pub guest_mac: Option<[u8; 6]>,
}

impl<M: DeviceMemory> Net<M> {
    /// Its state now.
    pub fn save_state(&self) -> NetState {
        NetState {
            iface_id: self.opts.iface_id.clone(),
            guest_mac: self.opts.guest_mac,
        }
    }

    /// Checks the state against a device made from the same configuration
    /// (the MAC is the configuration's: it must be the one saved, since
    /// the guest's driver read it).
    pub fn restore_state(&self, s: &NetState) -> Result<(), NetError> {
        if s.guest_mac != self.opts.guest_mac {
            return Err(NetError::BadState(format!(
                "the snapshot's guest MAC {:02x?} is not the configuration's {:02x?}",
                s.guest_mac, self.opts.guest_mac
            )));
        }
        Ok(())
    }

    /// Where the queues stand as the guest would be served again: the
    /// receive chains held for a waiting frame count as not taken.
    pub(super) fn positions(&self) -> Option<Vec<QueuePosition>> {
        let a = self.active.as_ref()?;
        let mut p = a.positions();
        let held = u16::try_from(self.rx_held.len()).unwrap_or(u16::MAX);
        if let Some(rx) = p.get_mut(RX_INDEX) {
            rx.next_avail = rx.next_avail.wrapping_sub(held);
        }
        Some(p)
    }
}
