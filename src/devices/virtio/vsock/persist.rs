//! The vsock's state in a snapshot ([`VsockState`], Firecracker's
//! `VsockState`): its queues are the transport's; the device keeps only
//! the guest's CID. Connections are not saved: after a restore the device
//! has none, and, as Firecracker does, it tells the guest with a
//! `VIRTIO_VSOCK_EVENT_TRANSPORT_RESET` on the event queue
//! ([`Vsock::restore_state`]), on which the guest's driver drops every
//! connection it had (the host side of each was closed with the VMM that
//! saved it, or lives on there).

use serde::{Deserialize, Serialize};
use virtio_queue::QueueT;
use vm_memory::Bytes;

use super::device::{buffers, Vsock};
use super::{VsockError, EVQ};
use crate::devices::virtio::DeviceMemory;

/// `VIRTIO_VSOCK_EVENT_TRANSPORT_RESET` (virtio 1.2, 5.10.6.6): the event's
/// `id`, a le32.
pub const EVENT_TRANSPORT_RESET: u32 = 0;

/// What the vsock keeps in a snapshot beside its transport.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VsockState {
    /// The guest's CID (its configuration space).
    pub guest_cid: u64,
}

impl<M: DeviceMemory> Vsock<M> {
    /// Its state now.
    pub fn save_state(&self) -> VsockState {
        VsockState {
            guest_cid: self.opts.guest_cid,
        }
    }

    /// Checks the state against a vsock made from the same configuration,
    /// after its transport restarted it, and, if it runs, sends the guest a
    /// transport reset on the event queue. Returns whether the event was
    /// sent (false: the device does not run, or the guest had no event
    /// buffer posted, which Firecracker logs too).
    pub fn restore_state(&mut self, s: &VsockState) -> Result<bool, VsockError> {
        if s.guest_cid != self.opts.guest_cid {
            return Err(VsockError::BadState(format!(
                "the snapshot's guest CID {} is not the configuration's {}",
                s.guest_cid, self.opts.guest_cid
            )));
        }
        Ok(self.send_transport_reset())
    }

    /// Puts a `TRANSPORT_RESET` event in the guest's next event buffer.
    fn send_transport_reset(&mut self) -> bool {
        let Some(a) = self.active.as_mut() else {
            return false;
        };
        let m = &self.metrics;
        let Some(chain) = crate::devices::virtio::chains::pop_direct(
            &mut a.queues[EVQ],
            &*a.mem,
            &m.ev_queue_event_fails,
        ) else {
            log::warn!("vsock: no event buffer for the transport reset after the restore");
            return false;
        };
        let head = chain.head_index();
        let event = EVENT_TRANSPORT_RESET.to_le_bytes();
        let mut written = 0;
        if let Some((segs, _)) = buffers(&*a.mem, chain, true, event.len()) {
            for (addr, len) in segs {
                if a.mem
                    .write_slice(&event[written..written + len], addr)
                    .is_err()
                {
                    break;
                }
                written += len;
            }
        }
        let len = if written == event.len() { written } else { 0 };
        let ok = a.queues[EVQ].add_used(&*a.mem, head, len as u32).is_ok() && a.signal_used(EVQ);
        if !ok {
            m.ev_queue_event_fails.inc();
        }
        len > 0 && ok
    }
}
