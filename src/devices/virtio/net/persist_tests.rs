//! The network device's snapshot: receive chains held for a waiting frame
//! are saved as not taken; the MAC must be the configuration's.

use std::sync::Arc;

use super::test_backend::RecordingBackend;
use super::tests::{desc, frame, mem, start, used_idx, Rig, BUF, W};
use super::*;
use crate::devices::virtio::{VirtioDevice, VIRTIO_F_VERSION_1};

fn rig(mac: Option<[u8; 6]>) -> Rig {
    let tap = RecordingBackend::new();
    let opts = NetOptions {
        iface_id: "eth0".into(),
        guest_mac: mac,
        ..Default::default()
    };
    Rig {
        mem: mem(),
        net: Net::with_backend(opts, Box::new(tap.clone())).unwrap(),
        tap,
        irq: Arc::default(),
    }
}

#[test]
fn receive_chains_held_for_a_waiting_frame_are_saved_as_not_taken() {
    let mut r = rig(None);
    let mem = r.mem.clone();
    let qs = start(&mut r, &mem, VIRTIO_F_VERSION_1 | features::MRG_RXBUF, 16);
    qs[RX_INDEX]
        .add_desc_chains(&[desc(BUF, 1000, W, 0)], 0)
        .unwrap();
    r.tap.push(frame(3000, 0));
    r.net.process_tap();
    // The frame waits for more buffers, the first chain held.
    assert_eq!(used_idx(&qs[RX_INDEX]), 0);
    assert_eq!(r.net.queue_positions().unwrap()[RX_INDEX].next_avail, 0);
    qs[RX_INDEX]
        .add_desc_chains(&[desc(BUF + 0x1000, 4000, W, 0)], 1)
        .unwrap();
    r.net.process_queue(RX_INDEX);
    assert_eq!(used_idx(&qs[RX_INDEX]), 2, "the frame took both buffers");
    let p = r.net.queue_positions().unwrap();
    assert_eq!((p[RX_INDEX].next_avail, p[RX_INDEX].next_used), (2, 2));
}

#[test]
fn the_mac_must_be_the_configurations() {
    let mac = [6, 0, 0xac, 0x10, 0, 2];
    let r = rig(Some(mac));
    let saved = r.net.save_state();
    assert_eq!(saved.guest_mac, Some(mac));
    r.net.restore_state(&saved).unwrap();
    let other = rig(Some([6, 0, 0xac, 0x10, 0, 3]));
    assert!(matches!(
        other.net.restore_state(&saved),
        Err(NetError::BadState(_))
    ));
    assert!(rig(None).net.restore_state(&saved).is_err());
}
