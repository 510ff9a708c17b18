//! The vsock's snapshot: its CID checked, and a transport reset sent on
//! the event queue after a restore.

use super::*;
use crate::devices::virtio::vsock::persist::EVENT_TRANSPORT_RESET;
use crate::devices::virtio::VirtioInterruptType;

#[test]
fn a_restore_sends_a_transport_reset_in_the_next_event_buffer() {
    let mut r = rig();
    let saved = r.dev.save_state();
    assert_eq!(saved.guest_cid, CID);
    // No event buffer posted: nothing sent, nothing written.
    assert!(!r.dev.restore_state(&saved).unwrap());
    let buf = 48 * MIB;
    r.mem.write_obj(0xffff_ffffu32, GuestAddress(buf)).unwrap();
    let head = r.add(EVQ, buf, 8, VRING_DESC_F_WRITE as u16);
    r.irq.0.lock().unwrap().clear();
    assert!(r.dev.restore_state(&saved).unwrap());
    assert_eq!(r.used(EVQ), vec![(head, 4)]);
    let id: u32 = r.mem.read_obj(GuestAddress(buf)).unwrap();
    assert_eq!(id, EVENT_TRANSPORT_RESET);
    assert_eq!(
        r.irq.0.lock().unwrap().as_slice(),
        &[VirtioInterruptType::Queue(EVQ as u16)]
    );
}

#[test]
fn a_restore_with_another_cid_is_refused() {
    let mut r = rig();
    let mut saved = r.dev.save_state();
    saved.guest_cid += 1;
    assert!(matches!(
        r.dev.restore_state(&saved),
        Err(VsockError::BadState(_))
    ));
}
