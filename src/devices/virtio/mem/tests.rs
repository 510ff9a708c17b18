//! The memory device over plain guest memory, with virtio-queue's mock
//! driver and a sink that records what it is given.

use std::collections::VecDeque;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use virtio_bindings::virtio_ring::{VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
use virtio_queue::desc::{split::Descriptor, RawDescriptor};
use virtio_queue::mock::MockSplitQueue;
use virtio_queue::Queue;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::*;
use crate::devices::virtio::test_utils::{guest_memory, queue_evts, Irq, Mem};
use crate::devices::virtio::{
    ActivateError, ActiveState, VirtioDevice, VirtioInterrupt, VirtioInterruptType, Worker,
    VIRTIO_F_VERSION_1,
};
use crate::memory::GuestRange;

pub(super) const MIB: u64 = 1 << 20;
pub(super) const GIB: u64 = 1 << 30;
pub(super) const BLOCK: u64 = 2 * MIB;
pub(super) const SLOT: u64 = 128 * MIB;
pub(super) const REGION: u64 = 4 * GIB;
pub(super) const REGION_BYTES: u64 = GIB;
/// Request i at BUF + i * 0x100, its response 0x80 after it.
pub(super) const BUF: u64 = 4 * MIB;
pub(super) const W: u32 = VRING_DESC_F_WRITE;
pub(super) const N: u32 = VRING_DESC_F_NEXT;
const FEATURES: u64 = VIRTIO_F_VERSION_1 | 1 << VIRTIO_MEM_F_UNPLUGGED_INACCESSIBLE | 1;

/// The guest range of `len` bytes at `gpa`.
pub(super) fn r(gpa: u64, len: u64) -> GuestRange {
    GuestRange::new(gpa, len)
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Call {
    Plug(GuestRange, Vec<GuestRange>),
    Unplug(Vec<GuestRange>, Vec<GuestRange>),
}

/// Records every call; answers PLUGs from `answers` (Ok when empty); if
/// `gate` is set, a PLUG says it entered and waits for a go.
#[derive(Default)]
pub(super) struct Sink {
    calls: Mutex<Vec<Call>>,
    answers: Mutex<VecDeque<Result<(), PlugRefused>>>,
    gate: Mutex<Option<(Sender<()>, Receiver<()>)>>,
}

impl HotplugSink for Sink {
    fn plug(&self, range: GuestRange, map_slots: &[GuestRange]) -> Result<(), PlugRefused> {
        if let Some((entered, go)) = &*self.gate.lock().unwrap() {
            entered.send(()).unwrap();
            go.recv_timeout(Duration::from_secs(30)).unwrap();
        }
        self.calls
            .lock()
            .unwrap()
            .push(Call::Plug(range, map_slots.to_vec()));
        self.answers.lock().unwrap().pop_front().unwrap_or(Ok(()))
    }
    fn unplug(&self, ranges: &[GuestRange], unmap_slots: &[GuestRange]) {
        self.calls
            .lock()
            .unwrap()
            .push(Call::Unplug(ranges.to_vec(), unmap_slots.to_vec()));
    }
}

impl Sink {
    fn take(&self) -> Vec<Call> {
        std::mem::take(&mut *self.calls.lock().unwrap())
    }
}

pub(super) fn opts() -> MemOptions {
    MemOptions {
        region_addr: REGION,
        region_bytes: REGION_BYTES,
        block_bytes: BLOCK,
        slot_bytes: SLOT,
        node_id: 1,
    }
}

pub(super) fn desc(addr: u64, len: u32, flags: u32, next: u16) -> RawDescriptor {
    RawDescriptor::from(Descriptor::new(addr, len, flags as u16, next))
}

pub(super) fn req(t: u16, addr: u64, nb: u16) -> [u8; REQUEST_BYTES] {
    let mut b = [0xeeu8; REQUEST_BYTES];
    b[0..2].copy_from_slice(&t.to_le_bytes());
    b[8..16].copy_from_slice(&addr.to_le_bytes());
    b[16..18].copy_from_slice(&nb.to_le_bytes());
    b
}

struct Rig {
    arc: Mem,
    dev: Arc<Mutex<VirtioMem<Mem>>>,
    sink: Arc<Sink>,
    irq: Arc<Irq>,
    sent: u16,
}

impl Rig {
    fn new(requested: u64) -> Rig {
        let sink = Arc::new(Sink::default());
        let mut dev: VirtioMem<Mem> = VirtioMem::new(opts(), sink.clone()).unwrap();
        dev.set_requested(requested).unwrap();
        Rig {
            arc: guest_memory(&[(0, 16 * MIB)]),
            dev: Arc::new(Mutex::new(dev)),
            sink,
            irq: Arc::new(Irq::default()),
            sent: 0,
        }
    }

    fn start<'a>(&self, mem: &'a GuestMemoryMmap<()>) -> MockSplitQueue<'a, GuestMemoryMmap<()>> {
        let q = MockSplitQueue::create(mem, GuestAddress(MIB), 256);
        let queues: Vec<Queue> = vec![q.create_queue().unwrap()];
        let irq: Arc<dyn VirtioInterrupt> = self.irq.clone();
        self.dev
            .lock()
            .unwrap()
            .activate(ActiveState::new(self.arc.clone(), FEATURES, queues, irq))
            .unwrap();
        q
    }

    /// Posts a well-formed request; its index.
    fn post(&mut self, q: &MockSplitQueue<'_, GuestMemoryMmap<()>>, r: [u8; 24]) -> u16 {
        let i = self.sent;
        self.sent += 1;
        let at = BUF + u64::from(i) * 0x100;
        self.arc.write_slice(&r, GuestAddress(at)).unwrap();
        self.arc
            .write_slice(&[0xff; 10], GuestAddress(at + 0x80))
            .unwrap();
        q.add_desc_chains(
            &[desc(at, 24, N, 2 * i + 1), desc(at + 0x80, 10, W, 0)],
            2 * i,
        )
        .unwrap();
        i
    }

    fn run(&self) {
        MemWorker::new(&self.dev).process_queue();
    }

    /// Posts `r`, runs the queue, and gives the response (type, state).
    fn ask(&mut self, q: &MockSplitQueue<'_, GuestMemoryMmap<()>>, r: [u8; 24]) -> (u16, u16) {
        let i = self.post(q, r);
        self.run();
        self.resp(i)
    }

    fn resp(&self, i: u16) -> (u16, u16) {
        let at = BUF + u64::from(i) * 0x100 + 0x80;
        let t: u16 = self.arc.read_obj(GuestAddress(at)).unwrap();
        let s: u16 = self.arc.read_obj(GuestAddress(at + 8)).unwrap();
        (t, s)
    }

    fn status(&self) -> device::MemStatus {
        self.dev.lock().unwrap().status()
    }

    fn metric(&self, f: fn(&MemMetrics) -> u64) -> u64 {
        f(self.dev.lock().unwrap().metrics())
    }
}

/// Used ring entry `i` (id, len).
fn used(
    mem: &GuestMemoryMmap<()>,
    q: &MockSplitQueue<'_, GuestMemoryMmap<()>>,
    i: u64,
) -> (u32, u32) {
    let at = q.used_addr().0 + 4 + i * 8;
    (
        mem.read_obj(GuestAddress(at)).unwrap(),
        mem.read_obj(GuestAddress(at + 4)).unwrap(),
    )
}

const ACK: (u16, u16) = (VIRTIO_MEM_RESP_ACK, 0);
const ERR: (u16, u16) = (VIRTIO_MEM_RESP_ERROR, 0);
pub(super) const PLUG: u16 = VIRTIO_MEM_REQ_PLUG;
pub(super) const UNPLUG: u16 = VIRTIO_MEM_REQ_UNPLUG;
pub(super) const STATE: u16 = VIRTIO_MEM_REQ_STATE;

#[test]
fn hostile_chains_are_answered_with_nothing_and_the_device_goes_on() {
    let mut rig = Rig::new(64 * MIB);
    let mem = rig.arc.clone();
    let q = rig.start(&mem);
    // A read-only response, a write-only request, a lone request: 0 bytes.
    q.add_desc_chains(&[desc(BUF, 24, N, 1), desc(BUF + 0x80, 10, 0, 0)], 0)
        .unwrap();
    q.add_desc_chains(&[desc(BUF, 24, W | N, 3), desc(BUF + 0x80, 10, W, 0)], 2)
        .unwrap();
    q.add_desc_chains(&[desc(BUF, 24, 0, 0)], 4).unwrap();
    rig.sent = 3;
    let i = rig.post(&q, req(PLUG, REGION, 1));
    rig.run();
    assert_eq!(q.used().idx().load(), 4);
    assert_eq!(used(&mem, &q, 0), (0, 0));
    assert_eq!(used(&mem, &q, 1), (2, 0));
    assert_eq!(used(&mem, &q, 2), (4, 0));
    assert_eq!(used(&mem, &q, 3), (6, RESPONSE_BYTES as u32));
    assert_eq!(rig.resp(i), ACK);
    assert_eq!(rig.metric(|m| m.queue_event_fails.get()), 3);
    assert_eq!(rig.status().plugged_bytes, BLOCK);
    // One signal for the pass's used entries before the sink, one after.
    assert!(rig
        .irq
        .0
        .lock()
        .unwrap()
        .contains(&VirtioInterruptType::Queue(0)));
}

#[test]
fn plug_unplug_state_and_unplug_all_with_their_slots() {
    let mut rig = Rig::new(3 * SLOT);
    let mem = rig.arc.clone();
    let q = rig.start(&mem);
    // The first blocks of slot 0: slot 0 is mapped.
    assert_eq!(rig.ask(&q, req(PLUG, REGION, 2)), ACK);
    assert_eq!(
        rig.sink.take(),
        [Call::Plug(r(REGION, 2 * BLOCK), vec![r(REGION, SLOT)])]
    );
    // More of slot 0: nothing to map.
    assert_eq!(rig.ask(&q, req(PLUG, REGION + 2 * BLOCK, 2)), ACK);
    assert_eq!(
        rig.sink.take(),
        [Call::Plug(r(REGION + 2 * BLOCK, 2 * BLOCK), vec![])]
    );
    // Across the end of slot 0 into slot 1: only slot 1 is new.
    let edge = REGION + SLOT - BLOCK;
    assert_eq!(rig.ask(&q, req(PLUG, edge, 2)), ACK);
    assert_eq!(
        rig.sink.take(),
        [Call::Plug(r(edge, 2 * BLOCK), vec![r(REGION + SLOT, SLOT)])]
    );
    assert_eq!(rig.status().plugged_bytes, 6 * BLOCK);
    let st = |s| (VIRTIO_MEM_RESP_ACK, s);
    assert_eq!(
        rig.ask(&q, req(STATE, REGION, 4)),
        st(VIRTIO_MEM_STATE_PLUGGED)
    );
    assert_eq!(
        rig.ask(&q, req(STATE, REGION, 5)),
        st(VIRTIO_MEM_STATE_MIXED)
    );
    assert_eq!(
        rig.ask(&q, req(STATE, REGION + 2 * SLOT, 64)),
        st(VIRTIO_MEM_STATE_UNPLUGGED)
    );
    // Unplug part of slot 0: it keeps blocks, nothing to unmap.
    assert_eq!(rig.ask(&q, req(UNPLUG, REGION, 2)), ACK);
    assert_eq!(
        rig.sink.take(),
        [Call::Unplug(vec![r(REGION, 2 * BLOCK)], vec![])]
    );
    // The rest of slot 0's first run: slot 0 still has its last block.
    assert_eq!(rig.ask(&q, req(UNPLUG, REGION + 2 * BLOCK, 2)), ACK);
    assert_eq!(
        rig.sink.take(),
        [Call::Unplug(vec![r(REGION + 2 * BLOCK, 2 * BLOCK)], vec![])]
    );
    assert_eq!(rig.ask(&q, req(UNPLUG, edge, 1)), ACK);
    assert_eq!(
        rig.sink.take(),
        [Call::Unplug(vec![r(edge, BLOCK)], vec![r(REGION, SLOT)])]
    );
    // Two runs in slot 2 and the one in slot 1, then UNPLUG_ALL.
    assert_eq!(rig.ask(&q, req(PLUG, REGION + 2 * SLOT, 1)), ACK);
    assert_eq!(
        rig.ask(&q, req(PLUG, REGION + 2 * SLOT + 4 * BLOCK, 3)),
        ACK
    );
    rig.sink.take();
    assert_eq!(rig.status().plugged_bytes, 5 * BLOCK);
    assert_eq!(rig.ask(&q, req(VIRTIO_MEM_REQ_UNPLUG_ALL, 0, 0)), ACK);
    assert_eq!(
        rig.sink.take(),
        [Call::Unplug(
            vec![
                r(REGION + SLOT, BLOCK),
                r(REGION + 2 * SLOT, BLOCK),
                r(REGION + 2 * SLOT + 4 * BLOCK, 3 * BLOCK)
            ],
            vec![r(REGION + SLOT, SLOT), r(REGION + 2 * SLOT, SLOT)]
        )]
    );
    let s = rig.status();
    assert_eq!((s.plugged_bytes, s.usable_bytes), (0, 0));
    // Nothing plugged: UNPLUG_ALL is acknowledged without the sink.
    assert_eq!(rig.ask(&q, req(VIRTIO_MEM_REQ_UNPLUG_ALL, 0, 0)), ACK);
    assert!(rig.sink.take().is_empty());
    assert_eq!(rig.metric(|m| m.plug_count.get()), 5);
    assert_eq!(rig.metric(|m| m.plug_bytes.get()), 10 * BLOCK);
    assert_eq!(rig.metric(|m| m.unplug_count.get()), 3);
    assert_eq!(rig.metric(|m| m.unplug_bytes.get()), 10 * BLOCK);
    assert_eq!(rig.metric(|m| m.unplug_all_count.get()), 2);
    assert_eq!(rig.metric(|m| m.state_count.get()), 3);
    // After UNPLUG_ALL the usable region is 0: a PLUG is refused.
    assert_eq!(rig.ask(&q, req(PLUG, REGION, 1)), ERR);
}

#[test]
fn invalid_requests_are_answered_error_and_reach_no_sink() {
    let mut rig = Rig::new(4 * BLOCK);
    let mem = rig.arc.clone();
    let q = rig.start(&mem);
    // usable is one slot (requested 8 MiB rounded up).
    assert_eq!(rig.status().usable_bytes, SLOT);
    assert_eq!(rig.ask(&q, req(PLUG, REGION + 2 * BLOCK, 2)), ACK);
    rig.sink.take();
    let top = !(BLOCK - 1);
    for (t, addr, nb, why) in [
        (PLUG, REGION - BLOCK, 1, "below the region"),
        (PLUG, REGION + SLOT, 1, "past the usable region"),
        (PLUG, REGION + SLOT - BLOCK, 2, "across the usable end"),
        (PLUG, REGION + 4096, 1, "unaligned"),
        (PLUG, REGION, 0, "zero blocks"),
        (PLUG, REGION + BLOCK, 2, "overlaps a plugged block"),
        (PLUG, REGION + 4 * BLOCK, 3, "beyond the requested size"),
        (PLUG, top, u16::MAX, "addr + len overflows"),
        (STATE, top, u16::MAX, "addr + len overflows"),
        (STATE, REGION + SLOT, 1, "past the usable region"),
        (STATE, REGION, 0, "zero blocks"),
        (UNPLUG, REGION, 1, "not plugged"),
        (UNPLUG, REGION + BLOCK, 2, "partly plugged"),
        (UNPLUG, REGION + 2 * BLOCK + 4096, 1, "unaligned"),
        (UNPLUG, top, u16::MAX, "addr + len overflows"),
        (7, REGION, 1, "unknown type"),
    ] {
        assert_eq!(rig.ask(&q, req(t, addr, nb)), ERR, "{why}");
    }
    assert!(rig.sink.take().is_empty());
    assert_eq!(rig.status().plugged_bytes, 2 * BLOCK);
    assert_eq!(rig.metric(|m| m.plug_fails.get()), 8);
    assert_eq!(rig.metric(|m| m.state_fails.get()), 3);
    assert_eq!(rig.metric(|m| m.unplug_fails.get()), 4);
    // What was plugged is still whole.
    assert_eq!(
        rig.ask(&q, req(STATE, REGION + 2 * BLOCK, 2)),
        (VIRTIO_MEM_RESP_ACK, VIRTIO_MEM_STATE_PLUGGED)
    );
}

#[test]
fn a_busy_or_failed_sink_leaves_the_blocks_unplugged() {
    let mut rig = Rig::new(SLOT);
    let mem = rig.arc.clone();
    let q = rig.start(&mem);
    rig.sink.answers.lock().unwrap().extend([
        Err(PlugRefused::Busy),
        Err(PlugRefused::Failed("no memslot".into())),
    ]);
    assert_eq!(rig.ask(&q, req(PLUG, REGION, 2)), (VIRTIO_MEM_RESP_BUSY, 0));
    assert_eq!(rig.ask(&q, req(PLUG, REGION, 2)), ERR);
    let unplugged = (VIRTIO_MEM_RESP_ACK, VIRTIO_MEM_STATE_UNPLUGGED);
    assert_eq!(rig.ask(&q, req(STATE, REGION, 2)), unplugged);
    assert_eq!(rig.status().plugged_bytes, 0);
    assert_eq!(rig.metric(|m| m.busy_count.get()), 1);
    assert_eq!(rig.metric(|m| m.plug_fails.get()), 1);
    // Each retry asks to map the slot again (nothing was committed).
    assert_eq!(rig.ask(&q, req(PLUG, REGION, 2)), ACK);
    let calls = rig.sink.take();
    assert_eq!(calls.len(), 3);
    assert!(calls
        .iter()
        .all(|c| *c == Call::Plug(r(REGION, 2 * BLOCK), vec![r(REGION, SLOT)])));
    assert_eq!(rig.status().plugged_bytes, 2 * BLOCK);
}

#[test]
fn set_requested_checks_and_raises_the_usable_region() {
    let rig = Rig::new(0);
    let mut d = rig.dev.lock().unwrap();
    assert!(matches!(
        d.set_requested(BLOCK + 4096),
        Err(MemError::RequestedSize { .. })
    ));
    assert!(d.set_requested(REGION_BYTES + BLOCK).is_err());
    let gen = d.config_generation();
    d.set_requested(3 * BLOCK).unwrap();
    assert_ne!(d.config_generation(), gen);
    assert_eq!(
        (d.status().requested_bytes, d.status().usable_bytes),
        (3 * BLOCK, SLOT)
    );
    d.set_requested(SLOT + BLOCK).unwrap();
    assert_eq!(d.status().usable_bytes, 2 * SLOT);
    // Lowering the target keeps the usable region.
    d.set_requested(0).unwrap();
    assert_eq!(
        (d.status().requested_bytes, d.status().usable_bytes),
        (0, 2 * SLOT)
    );
    d.set_requested(REGION_BYTES).unwrap();
    assert_eq!(d.status().usable_bytes, REGION_BYTES);
    // Not active: no interrupt.
    assert!(rig.irq.0.lock().unwrap().is_empty());
    drop(d);
    let mem = rig.arc.clone();
    let _q = rig.start(&mem);
    rig.dev.lock().unwrap().set_requested(BLOCK).unwrap();
    assert!(rig
        .irq
        .0
        .lock()
        .unwrap()
        .contains(&VirtioInterruptType::Config));
}

#[test]
fn the_config_space_has_each_field_at_its_offset() {
    let mut rig = Rig::new(3 * BLOCK);
    let mem = rig.arc.clone();
    let q = rig.start(&mem);
    assert_eq!(rig.ask(&q, req(PLUG, REGION, 1)), ACK);
    let d = rig.dev.lock().unwrap();
    assert_eq!(d.config_space().len(), CONFIG_BYTES);
    let u64_at = |off: u64| {
        let mut b = [0u8; 8];
        d.read_config(off, &mut b);
        u64::from_le_bytes(b)
    };
    assert_eq!(u64_at(0), BLOCK);
    assert_eq!(u64_at(16), REGION);
    assert_eq!(u64_at(24), REGION_BYTES);
    assert_eq!(u64_at(32), SLOT);
    assert_eq!(u64_at(40), BLOCK);
    assert_eq!(u64_at(48), 3 * BLOCK);
    let mut node = [0u8; 8];
    d.read_config(8, &mut node);
    assert_eq!(node, [1, 0, 0, 0, 0, 0, 0, 0]);
    // Bytes past the end read 0.
    let mut past = [0xffu8; 8];
    d.read_config(56, &mut past);
    assert_eq!(past, [0; 8]);
    assert_eq!(d.device_type(), VIRTIO_ID_MEM);
    assert_eq!(d.queue_max_sizes(), &[256]);
    assert_eq!(d.avail_features(), VIRTIO_F_VERSION_1 | 0b11);
}

#[test]
fn activation_needs_unplugged_inaccessible() {
    let rig = Rig::new(0);
    let q = MockSplitQueue::create(&*rig.arc, GuestAddress(MIB), 256);
    let irq: Arc<dyn VirtioInterrupt> = rig.irq.clone();
    let a = ActiveState::new(
        rig.arc.clone(),
        VIRTIO_F_VERSION_1 | 1,
        vec![q.create_queue().unwrap()],
        irq,
    );
    let mut d = rig.dev.lock().unwrap();
    assert!(matches!(
        d.activate(a),
        Err(ActivateError::FeatureNotAcked(
            VIRTIO_MEM_F_UNPLUGGED_INACCESSIBLE
        ))
    ));
    assert_eq!(d.metrics().activate_fails.get(), 1);
    assert!(!d.is_active());
}

#[test]
fn a_reset_keeps_the_blocks() {
    let mut rig = Rig::new(SLOT);
    let mem = rig.arc.clone();
    let q = rig.start(&mem);
    assert_eq!(rig.ask(&q, req(PLUG, REGION, 4)), ACK);
    rig.dev.lock().unwrap().reset();
    assert_eq!(rig.status().plugged_bytes, 4 * BLOCK);
    assert_eq!(rig.status().usable_bytes, SLOT);
    // The driver's probe: UNPLUG_ALL on a fresh queue.
    let mem2 = guest_memory(&[(0, 16 * MIB)]);
    rig.arc = mem2.clone();
    rig.sent = 0;
    let q2 = rig.start(&mem2);
    assert_eq!(rig.ask(&q2, req(VIRTIO_MEM_REQ_UNPLUG_ALL, 0, 0)), ACK);
    rig.sink.take();
    assert_eq!(rig.status().plugged_bytes, 0);
    drop(q);
}

/// Posts a PLUG of two blocks and runs the worker on its own thread until
/// it is inside the sink's `plug`, held there until `go` is sent; returns
/// the chain's index, `go` and the worker's thread.
fn plug_held_in_sink(
    rig: &mut Rig,
    q: &MockSplitQueue<'_, GuestMemoryMmap<()>>,
) -> (
    u16,
    std::sync::mpsc::Sender<()>,
    std::thread::JoinHandle<()>,
) {
    let (entered_tx, entered) = channel();
    let (go, go_rx) = channel();
    *rig.sink.gate.lock().unwrap() = Some((entered_tx, go_rx));
    let i = rig.post(q, req(PLUG, REGION, 2));
    let worker = MemWorker::new(&rig.dev);
    let t = std::thread::spawn(move || worker.process_queue());
    entered.recv_timeout(Duration::from_secs(30)).unwrap();
    (i, go, t)
}

#[test]
fn the_lock_is_free_while_a_plug_waits_for_the_sink() {
    let mut rig = Rig::new(SLOT);
    let mem = rig.arc.clone();
    let q = rig.start(&mem);
    let (i, go, t) = plug_held_in_sink(&mut rig, &q);
    // The worker is inside the sink: the API and a vCPU get the lock.
    {
        let mut d = rig.dev.try_lock().expect("no lock held during the sink");
        assert_eq!(d.status().plugged_bytes, 0);
        d.set_requested(2 * SLOT).unwrap();
        let mut b = [0u8; 8];
        d.read_config(48, &mut b);
        assert_eq!(u64::from_le_bytes(b), 2 * SLOT);
    }
    assert_eq!(q.used().idx().load(), 0);
    go.send(()).unwrap();
    t.join().unwrap();
    assert_eq!(rig.resp(i), ACK);
    assert_eq!(q.used().idx().load(), 1);
    assert_eq!(rig.status().plugged_bytes, 2 * BLOCK);
}

#[test]
fn a_plug_done_across_a_reset_is_dropped_and_its_slot_taken_out_again() {
    let mut rig = Rig::new(SLOT);
    let mem = rig.arc.clone();
    let q = rig.start(&mem);
    let (i, go, t) = plug_held_in_sink(&mut rig, &q);
    rig.dev.lock().unwrap().reset();
    go.send(()).unwrap();
    t.join().unwrap();
    // The driver that asked is gone: nothing is committed, the old chain is
    // not answered, and the slot the sink mapped for it goes out again.
    assert_eq!(rig.status().plugged_bytes, 0);
    assert_eq!(q.used().idx().load(), 0);
    assert_eq!(rig.resp(i), (0xffff, 0xffff));
    let calls = rig.sink.calls.lock().unwrap();
    assert_eq!(
        calls[..],
        [
            Call::Plug(r(REGION, 2 * BLOCK), vec![r(REGION, SLOT)]),
            Call::Unplug(vec![r(REGION, 2 * BLOCK)], vec![r(REGION, SLOT)]),
        ]
    );
}

#[test]
fn the_thread_loop_answers_a_notified_queue() {
    let mut rig = Rig::new(SLOT);
    let mem = rig.arc.clone();
    let q = rig.start(&mem);
    let (evts, clones) = queue_evts(1);
    let exit = vmm_sys_util::eventfd::EventFd::new(0).unwrap();
    let mut w = Worker::start(MemWorker::new(&rig.dev), clones, exit.try_clone().unwrap()).unwrap();
    // The activation's wake runs first.
    assert!(w.run_once(Some(Duration::from_secs(5))).unwrap());
    let i = rig.post(&q, req(PLUG, REGION, 1));
    evts[0].write(1).unwrap();
    assert!(w.run_once(Some(Duration::from_secs(5))).unwrap());
    assert_eq!(rig.resp(i), ACK);
    assert_eq!(rig.metric(|m| m.queue_event_count.get()), 1);
    exit.write(1).unwrap();
    assert!(!w.run_once(Some(Duration::from_secs(5))).unwrap());
}
