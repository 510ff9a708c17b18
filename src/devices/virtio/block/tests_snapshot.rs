//! A drive's snapshot: its transport driven as a driver would, requests
//! served, the state saved, restored into a fresh transport and drive over
//! the same memory, and the next request served at the right used index;
//! hostile states refused; and a drive held for a snapshot takes no chain.
//! No KVM.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use virtio_bindings::virtio_blk as b;
use virtio_queue::mock::MockSplitQueue;
use vm_memory::{Bytes, GuestAddress};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::test_disk::RecordingDisk;
use super::tests::*;
use super::*;
use crate::devices::virtio::transport::mmio::regs;
use crate::devices::virtio::{
    status as st, wait_for, Gate, MmioError, MmioTransport, TransportState, Worker, INT_VRING,
    VIRTIO_F_VERSION_1,
};

/// A drive behind its transport, with its worker (not on a thread).
struct Drive {
    block: Arc<Mutex<Block<Mem>>>,
    t: MmioTransport<Mem>,
    worker: Option<BlockWorker<Mem>>,
}

fn drive(mem: &Mem) -> Drive {
    let (disk, _log) = RecordingDisk::new(pattern(8));
    let block = Arc::new(Mutex::new(
        Block::with_disk(opts(false, CacheType::Unsafe), Box::new(disk)).unwrap(),
    ));
    let worker = Some(BlockWorker::new(&block).unwrap());
    let t = MmioTransport::new(
        block.clone(),
        mem.clone(),
        EventFd::new(EFD_NONBLOCK).unwrap(),
    )
    .unwrap();
    Drive { block, t, worker }
}

fn wr(t: &mut MmioTransport<Mem>, off: u64, v: u32) {
    t.write(off, &v.to_le_bytes()).unwrap();
}

/// The driver's steps up to DRIVER_OK, with queue 0 on `q`'s rings.
fn start_as_driver(t: &mut MmioTransport<Mem>, q: &Mock<'_>) {
    let s = st::ACKNOWLEDGE | st::DRIVER;
    wr(t, regs::STATUS, st::ACKNOWLEDGE);
    wr(t, regs::STATUS, s);
    wr(t, regs::DRIVER_FEATURES_SEL, 1);
    wr(t, regs::DRIVER_FEATURES, (VIRTIO_F_VERSION_1 >> 32) as u32);
    wr(t, regs::STATUS, s | st::FEATURES_OK);
    wr(t, regs::QUEUE_SEL, 0);
    wr(t, regs::QUEUE_NUM, 16);
    for (lo, a) in [
        (regs::QUEUE_DESC_LOW, q.desc_table_addr().0),
        (regs::QUEUE_DRIVER_LOW, q.avail_addr().0),
        (regs::QUEUE_DEVICE_LOW, q.used_addr().0),
    ] {
        wr(t, lo, a as u32);
        wr(t, lo + 4, (a >> 32) as u32);
    }
    wr(t, regs::QUEUE_READY, 1);
    wr(t, regs::STATUS, s | st::FEATURES_OK | st::DRIVER_OK);
}

fn saved_after_two_reads(mem: &Mem) -> (TransportState, BlockState) {
    let mut d = drive(mem);
    let q = MockSplitQueue::create(&**mem, GuestAddress(MIB), 16);
    start_as_driver(&mut d.t, &q);
    for at in [0, 3] {
        request(mem, &q, at, b::VIRTIO_BLK_T_IN, 1, 512, W);
        d.worker.as_mut().unwrap().process_queue(true);
    }
    assert_eq!(used_idx(&q), 2);
    let block_state = d.block.lock().unwrap().save_state();
    (d.t.save_state(), block_state)
}

#[test]
fn a_restored_drive_serves_the_next_request_at_the_next_used_index() {
    let mem = mem();
    let (saved, block_state) = saved_after_two_reads(&mem);
    assert_eq!(saved.queues[0].next_avail, 2);
    assert_eq!(saved.queues[0].next_used, 2);
    assert_eq!(saved.interrupt_status & INT_VRING, INT_VRING);
    assert!(saved.device_ran());
    // Through the file format and back.
    let saved: TransportState =
        serde_json::from_str(&serde_json::to_string(&saved).unwrap()).unwrap();

    // A fresh drive and transport over the same memory.
    let mut d = drive(&mem);
    d.t.restore_state(&saved).unwrap();
    d.block.lock().unwrap().restore_state(&block_state).unwrap();
    assert!(d.block.lock().unwrap().is_active());
    assert_eq!(d.t.save_state(), saved, "registers and positions as saved");
    assert_eq!(d.t.interrupt().status() & INT_VRING, INT_VRING);
    assert!(
        d.t.interrupt().irq_evt().read().is_ok(),
        "the guest is signalled again"
    );

    // The driver goes on where it was: the third request is served as the
    // third used entry.
    let q = MockSplitQueue::create(&*mem, GuestAddress(MIB), 16);
    mem.write_obj(0u8, GuestAddress(DATA)).unwrap();
    request(&mem, &q, 6, b::VIRTIO_BLK_T_IN, 2, 512, W);
    // The mock starts its own avail index at 0: put it where the guest's was.
    q.avail().idx().store(3);
    q.avail().ring().ref_at(2).unwrap().store(6);
    d.worker.as_mut().unwrap().process_queue(true);
    assert_eq!(used_idx(&q), 3);
    assert_eq!(used(&q, 2), (6, 513));
    assert_eq!(status_byte(&mem), status::OK);
    let mut sector = [0u8; 1];
    mem.read_slice(&mut sector, GuestAddress(DATA)).unwrap();
    assert_eq!(sector[0], 3, "sector 2 read");
}

#[test]
fn hostile_states_are_refused_and_start_nothing() {
    let mem = mem();
    let (saved, _) = saved_after_two_reads(&mem);
    let refused = |f: &dyn Fn(&mut TransportState)| {
        let mut s = saved.clone();
        f(&mut s);
        let mut d = drive(&mem);
        let e = d.t.restore_state(&s).unwrap_err();
        assert!(
            !d.block.lock().unwrap().is_active(),
            "{e}: the device started"
        );
        e
    };
    let e = refused(&|s| s.queues[0].size = 512);
    assert!(matches!(e, MmioError::BadState(_)), "{e}");
    let e = refused(&|s| s.queues[0].size = 12);
    assert!(matches!(e, MmioError::BadState(_)), "{e}");
    let e = refused(&|s| s.queues[0].max_size = 128);
    assert!(matches!(e, MmioError::BadState(_)), "{e}");
    let e = refused(&|s| {
        s.queues.push(s.queues[0].clone());
    });
    assert!(matches!(e, MmioError::BadState(_)), "{e}");
    let e = refused(&|s| s.acked_features |= 1 << 40);
    assert!(matches!(e, MmioError::BadState(_)), "{e}");
    let e = refused(&|s| s.status = st::DRIVER_OK);
    assert!(matches!(e, MmioError::BadState(_)), "{e}");
    let e = refused(&|s| s.status |= 1 << 5);
    assert!(matches!(e, MmioError::BadState(_)), "{e}");
    // Rings outside guest RAM, or misaligned: the DRIVER_OK checks.
    let e = refused(&|s| s.queues[0].used_ring = HOLE);
    assert!(matches!(e, MmioError::BadQueue { .. }), "{e}");
    let e = refused(&|s| s.queues[0].desc_table = u64::MAX - 15);
    assert!(matches!(e, MmioError::BadQueue { .. }), "{e}");
    let e = refused(&|s| s.queues[0].avail_ring = MIB + 1);
    assert!(matches!(e, MmioError::BadQueue { .. }), "{e}");
    // A drive that was read-write restored as read-only.
    let (ro_disk, _) = RecordingDisk::with(pattern(8), true);
    let ro = Block::<Mem>::with_disk(opts(true, CacheType::Unsafe), Box::new(ro_disk)).unwrap();
    let (_, block_state) = saved_after_two_reads(&mem);
    assert!(matches!(
        ro.restore_state(&block_state),
        Err(BlockError::BadState(_))
    ));
}

#[test]
fn a_drive_held_takes_no_chain_and_serves_it_when_let_go() {
    let mem = mem();
    let mut d = drive(&mem);
    let q = MockSplitQueue::create(&*mem, GuestAddress(MIB), 16);
    start_as_driver(&mut d.t, &q);
    d.block.lock().unwrap().hold_requests(true);
    request(&mem, &q, 0, b::VIRTIO_BLK_T_IN, 1, 512, W);
    let w = d.worker.as_mut().unwrap();
    w.process_queue(true);
    assert_eq!(used_idx(&q), 0, "a held drive took a chain");
    assert_eq!(d.t.save_state().queues[0].next_avail, 0);
    d.block.lock().unwrap().hold_requests(false);
    w.process_queue(false);
    assert_eq!(used_idx(&q), 1);
    assert_eq!(d.block.lock().unwrap().requests_in_flight(), 0);
}

#[test]
fn a_notification_while_the_gate_is_closed_is_served_after_it_opens() {
    let mem = mem();
    let mut d = drive(&mem);
    let q = MockSplitQueue::create(&*mem, GuestAddress(MIB), 16);
    start_as_driver(&mut d.t, &q);
    let gate = Arc::new(Gate::new());
    let evts: Vec<EventFd> =
        d.t.queue_evts()
            .iter()
            .map(|e| e.try_clone().unwrap())
            .collect();
    let exit = EventFd::new(EFD_NONBLOCK).unwrap();
    let mut worker =
        Worker::start(d.worker.take().unwrap(), evts, exit.try_clone().unwrap()).unwrap();
    worker.hold_at(gate.clone());
    let passes = worker.pass_watch();
    let thread = std::thread::spawn(move || worker.run().unwrap());

    assert!(gate.close(Instant::now() + Duration::from_secs(10)));
    request(&mem, &q, 0, b::VIRTIO_BLK_T_IN, 1, 512, W);
    d.t.write(regs::QUEUE_NOTIFY, &0u32.to_le_bytes()).unwrap();
    // Nothing to wait for: the test is that nothing happens. Give the
    // thread time to (wrongly) serve it.
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(used_idx(&q), 0, "served while held");
    assert!(!passes.running());

    gate.open();
    assert!(
        wait_for(Instant::now() + Duration::from_secs(10), || used_idx(&q)
            == 1),
        "not served after the gate opened"
    );
    exit.write(1).unwrap();
    thread.join().unwrap();
}

#[test]
fn a_driver_saved_mid_setup_goes_on_with_its_setup_after_the_restore() {
    let mem = mem();
    let mut d = drive(&mem);
    let q = MockSplitQueue::create(&*mem, GuestAddress(MIB), 16);
    start_as_driver(&mut d.t, &q);
    // Saved before DRIVER_OK: as start_as_driver leaves it, less its last
    // write.
    let mut saved = d.t.save_state();
    saved.status &= !st::DRIVER_OK;
    saved.queue_sel = 7;
    saved.interrupt_status = 0;
    let mut fresh = drive(&mem);
    fresh.t.restore_state(&saved).unwrap();
    assert!(!fresh.block.lock().unwrap().is_active());
    assert_eq!(fresh.t.save_state(), saved);
    assert!(
        fresh.t.interrupt().irq_evt().read().is_err(),
        "signalled with no interrupt bit saved"
    );
    // QueueSel past the queues reads no queue.
    let mut b = [0u8; 4];
    fresh.t.read(regs::QUEUE_NUM_MAX, &mut b).unwrap();
    assert_eq!(b, [0; 4]);
    let s = st::ACKNOWLEDGE | st::DRIVER | st::FEATURES_OK;
    wr(&mut fresh.t, regs::STATUS, s | st::DRIVER_OK);
    assert!(fresh.block.lock().unwrap().is_active());
    request(&mem, &q, 0, b::VIRTIO_BLK_T_IN, 1, 512, W);
    fresh.worker.as_mut().unwrap().process_queue(true);
    assert_eq!(used_idx(&q), 1);
}
