//! The request parser, the options' checks and the block bitmap, without
//! a running device.

use std::sync::Arc;

use virtio_queue::desc::RawDescriptor;
use virtio_queue::mock::MockSplitQueue;
use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress};

use super::blocks::Blocks;
use super::tests::{
    desc, opts, req, Sink, BLOCK, BUF, MIB, N, PLUG, REGION, SLOT, STATE, UNPLUG, W,
};
use super::*;
use crate::devices::virtio::test_utils::{guest_memory, Mem};

#[test]
fn the_parser_reads_every_field_and_ignores_padding() {
    assert_eq!(
        request::decode(&req(PLUG, 0x1122_3344_5566_7788, 0xabcd)),
        RequestKind::Plug {
            addr: 0x1122_3344_5566_7788,
            nb_blocks: 0xabcd
        }
    );
    assert_eq!(
        request::decode(&req(UNPLUG, 8, 1)),
        RequestKind::Unplug {
            addr: 8,
            nb_blocks: 1
        }
    );
    assert_eq!(
        request::decode(&req(VIRTIO_MEM_REQ_UNPLUG_ALL, 8, 1)),
        RequestKind::UnplugAll
    );
    assert_eq!(
        request::decode(&req(STATE, 16, 2)),
        RequestKind::State {
            addr: 16,
            nb_blocks: 2
        }
    );
    assert_eq!(
        request::decode(&req(0x704, 0, 0)),
        RequestKind::Unknown(0x704)
    );
    let r = request::encode_response(VIRTIO_MEM_RESP_ACK, VIRTIO_MEM_STATE_MIXED);
    assert_eq!(r, [0, 0, 0, 0, 0, 0, 0, 0, 2, 0]);

    let arc = guest_memory(&[(0, 16 * MIB)]);
    let q = MockSplitQueue::create(&*arc, GuestAddress(MIB), 16);
    arc.write_slice(&req(STATE, REGION, 3), GuestAddress(BUF))
        .unwrap();
    q.add_desc_chains(&[desc(BUF, 24, N, 1), desc(BUF + 0x80, 10, W, 0)], 0)
        .unwrap();
    let mut queue: Queue = q.create_queue().unwrap();
    let chain = queue.pop_descriptor_chain(&*arc).unwrap();
    let r = request::parse(&*arc, chain).unwrap();
    assert_eq!(
        r,
        Request {
            head: 0,
            kind: RequestKind::State {
                addr: REGION,
                nb_blocks: 3
            },
            resp_addr: GuestAddress(BUF + 0x80),
        }
    );
}

#[test]
fn the_parser_refuses_bad_chains() {
    let arc = guest_memory(&[(0, 16 * MIB)]);
    let q = MockSplitQueue::create(&*arc, GuestAddress(MIB), 32);
    let (a, b) = (BUF, BUF + 0x80);
    let out = 64 * MIB;
    let chains: [(&[RawDescriptor], RequestError); 7] = [
        (
            &[desc(a, 24, W | N, 1), desc(b, 10, W, 0)],
            RequestError::RequestWriteOnly,
        ),
        (
            &[desc(a, 23, N, 3), desc(b, 10, W, 0)],
            RequestError::RequestShort(23),
        ),
        (&[desc(a, 24, 0, 0)], RequestError::NoResponse),
        (
            &[desc(a, 24, N, 6), desc(b, 10, 0, 0)],
            RequestError::ResponseReadOnly,
        ),
        (
            &[desc(a, 24, N, 8), desc(b, 9, W, 0)],
            RequestError::ResponseShort(9),
        ),
        (
            &[desc(a, 24, N, 10), desc(out, 10, W, 0)],
            RequestError::ResponseOutsideRam,
        ),
        (
            &[desc(out, 24, N, 12), desc(b, 10, W, 0)],
            RequestError::RequestOutsideRam,
        ),
    ];
    let mut off = 0;
    for (descs, _) in &chains {
        q.add_desc_chains(descs, off).unwrap();
        off += descs.len() as u16;
    }
    let mut queue: Queue = q.create_queue().unwrap();
    let mut off = 0;
    for (descs, why) in &chains {
        let chain = queue.pop_descriptor_chain(&*arc).unwrap();
        assert_eq!(request::parse(&*arc, chain), Err((off, *why)));
        off += descs.len() as u16;
    }
}

#[test]
fn options_are_checked() {
    let sink: Arc<dyn HotplugSink> = Arc::new(Sink::default());
    let with = |f: fn(&mut MemOptions)| {
        let mut o = opts();
        f(&mut o);
        VirtioMem::<Mem>::new(o, sink.clone()).map(|_| ())
    };
    assert!(with(|_| {}).is_ok());
    assert!(matches!(
        with(|o| o.block_bytes = 3 * MIB),
        Err(MemError::BlockSize(_))
    ));
    assert!(matches!(
        with(|o| o.block_bytes = MIB),
        Err(MemError::BlockSize(_))
    ));
    assert!(matches!(
        with(|o| o.slot_bytes = 0),
        Err(MemError::SlotSize { .. })
    ));
    assert!(matches!(
        with(|o| o.slot_bytes = 3 * MIB),
        Err(MemError::SlotSize { .. })
    ));
    assert!(matches!(
        with(|o| o.region_bytes = SLOT + BLOCK),
        Err(MemError::RegionSize { .. })
    ));
    assert!(matches!(
        with(|o| o.region_bytes = 0),
        Err(MemError::RegionSize { .. })
    ));
    assert!(matches!(
        with(|o| o.region_addr = u64::MAX - SLOT + 1),
        Err(MemError::RegionSize { .. })
    ));
    assert!(matches!(
        with(|o| o.region_addr = REGION + BLOCK),
        Err(MemError::RegionAddr { .. })
    ));
}

#[test]
fn the_bitmap_counts_sets_and_finds_runs_across_words() {
    let mut b = Blocks::new(200);
    b.set(60, 10, true);
    b.set(127, 66, true);
    assert_eq!(b.plugged(), 76);
    assert_eq!(b.count(0, 200), 76);
    assert_eq!(b.count(64, 6), 6);
    assert_eq!(b.count(69, 60), 3);
    assert_eq!(b.runs(), vec![(60, 10), (127, 66)]);
    b.set(128, 64, false);
    assert_eq!(b.runs(), vec![(60, 10), (127, 1), (192, 1)]);
    b.set(0, 200, true);
    assert_eq!(b.runs(), vec![(0, 200)]);
    b.set(0, 200, false);
    assert_eq!((b.plugged(), b.runs()), (0, vec![]));
}
