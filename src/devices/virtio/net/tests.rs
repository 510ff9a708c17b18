//! The network device's flows and hostile guests, over plain guest memory
//! with virtio-queue's `MockSplitQueue` as the driver and a recording
//! backend as the tap (no KVM, no tap). The real tap is in `tap_tests`.

use std::sync::{Arc, Mutex};

use virtio_bindings::virtio_ring::{VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
use virtio_queue::desc::{split::Descriptor, RawDescriptor};
use virtio_queue::mock::MockSplitQueue;
use virtio_queue::Queue;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::features::*;
use super::test_backend::RecordingBackend;
use super::*;
use crate::devices::virtio::test_utils::{guest_memory, queue_evts, Irq, Mem};
use crate::devices::virtio::ActiveState;
use crate::devices::virtio::Worker;
use crate::devices::virtio::{
    VirtioDevice, VirtioInterrupt, VirtioInterruptType, VIRTIO_F_VERSION_1,
};

const MIB: u64 = 1 << 20;
/// [0, 16 MiB), a hole, [32 MiB, 48 MiB).
const HOLE: u64 = 16 * MIB;
const HIGH: u64 = 32 * MIB;
/// Buffers the driver's data lives in.
pub(super) const BUF: u64 = 4 * MIB;
pub(super) const W: u32 = VRING_DESC_F_WRITE;
const N: u32 = VRING_DESC_F_NEXT;

pub(super) fn mem() -> Mem {
    guest_memory(&[(0, HOLE), (HIGH, 16 * MIB)])
}

pub(super) struct Rig {
    pub mem: Mem,
    pub net: Net<Mem>,
    pub tap: RecordingBackend,
    pub irq: Arc<Irq>,
}

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

pub(super) type Mock<'a> = MockSplitQueue<'a, GuestMemoryMmap<()>>;

/// Activates with `acked` and queues of `size` at 1 MiB and 1 MiB + 64 KiB;
/// runs the activation's wake as the device's thread would.
pub(super) fn start<'a>(
    r: &mut Rig,
    mem: &'a GuestMemoryMmap<()>,
    acked: u64,
    size: u16,
) -> Vec<Mock<'a>> {
    let qs: Vec<Mock<'a>> = (0..2)
        .map(|i| MockSplitQueue::create(mem, GuestAddress(MIB + i * 0x1_0000), size))
        .collect();
    let queues: Vec<Queue> = qs.iter().map(|q| q.create_queue().unwrap()).collect();
    let irq: Arc<dyn VirtioInterrupt> = r.irq.clone();
    r.net
        .activate(ActiveState::new(r.mem.clone(), acked, queues, irq))
        .unwrap();
    assert_eq!(r.net.wake_evt().read().unwrap(), 1);
    wake(&mut r.net);
    qs
}

pub(super) fn desc(addr: u64, len: u32, flags: u32, next: u16) -> RawDescriptor {
    RawDescriptor::from(Descriptor::new(addr, len, flags as u16, next))
}

pub(super) fn used_idx(q: &Mock<'_>) -> u16 {
    q.used().idx().load()
}

/// Used element `i`: (head, len).
fn used_elem(mem: &GuestMemoryMmap<()>, q: &Mock<'_>, i: u16) -> (u32, u32) {
    let at = q.used_addr().0 + 4 + u64::from(i) * 8;
    let id: u32 = mem.read_obj(GuestAddress(at)).unwrap();
    let len: u32 = mem.read_obj(GuestAddress(at + 4)).unwrap();
    (id, len)
}

/// A frame of `len` bytes after a zero header.
pub(super) fn frame(len: usize, fill: u8) -> Vec<u8> {
    let mut f = vec![0u8; VNET_HDR_BYTES];
    f.extend((0..len).map(|i| fill.wrapping_add(i as u8)));
    f
}

/// Every feature offered (without a MAC) but `dropped`.
fn all(dropped: u64) -> u64 {
    (VIRTIO_F_VERSION_1 | OFFERED) & !dropped
}

fn m(r: &Rig) -> NetMetrics {
    r.net.metrics().snapshot()
}

#[test]
fn features_and_config_space() {
    let r = rig(None);
    let f = r.net.avail_features();
    assert_eq!(f, VIRTIO_F_VERSION_1 | OFFERED);
    assert_eq!(f & MAC, 0);
    for bit in [
        CSUM, GUEST_CSUM, GUEST_TSO4, GUEST_TSO6, GUEST_UFO, HOST_TSO4, HOST_TSO6,
    ] {
        assert_ne!(f & bit, 0);
    }
    assert_ne!(f & HOST_UFO, 0);
    assert_ne!(f & MRG_RXBUF, 0);
    assert_eq!(r.net.device_type(), 1);
    assert_eq!(r.net.queue_max_sizes(), &[256, 256]);

    let mut r = rig(Some([2, 0xfc, 0, 0, 0, 7]));
    assert_ne!(r.net.avail_features() & MAC, 0);
    let mut b = [0xffu8; 8];
    r.net.read_config(0, &mut b);
    assert_eq!(b, [2, 0xfc, 0, 0, 0, 7, 0, 0]);
    let mut b = [0xffu8; 4];
    r.net.read_config(4, &mut b);
    assert_eq!(b, [0, 7, 0, 0]);
    r.net.read_config(u64::MAX, &mut b);
    assert_eq!(b, [0; 4]);
    // The driver cannot change the MAC.
    r.net.write_config(0, &[9; 6]);
    let mut b = [0u8; 6];
    r.net.read_config(0, &mut b);
    assert_eq!(b, [2, 0xfc, 0, 0, 0, 7]);
    assert_eq!(m(&r).cfg_fails.get(), 1);
}

#[test]
fn activation_sets_the_offloads_the_guest_acked() {
    let mut r = rig(None);
    let mem = r.mem.clone();
    let acked = VIRTIO_F_VERSION_1 | GUEST_CSUM | GUEST_TSO4;
    let _qs = start(&mut r, &mem, acked, 16);
    assert_eq!(
        r.tap.lock().offloads,
        vec![libc::TUN_F_CSUM | libc::TUN_F_TSO4]
    );
    // Once per activation.
    wake(&mut r.net);
    r.net.process_tap();
    assert_eq!(r.tap.lock().offloads.len(), 1);
    r.net.reset();
    let _qs = start(&mut r, &mem, VIRTIO_F_VERSION_1, 16);
    assert_eq!(r.tap.lock().offloads[1], 0);
}

#[test]
fn a_queue_not_ready_refuses_activation() {
    let mut r = rig(None);
    let mem = r.mem.clone();
    let q = MockSplitQueue::create(&*mem, GuestAddress(MIB), 16);
    let mut not_ready: Queue = q.create_queue().unwrap();
    virtio_queue::QueueT::set_ready(&mut not_ready, false);
    let ready: Queue = q.create_queue().unwrap();
    let e = r.net.activate(ActiveState::new(
        mem.clone(),
        VIRTIO_F_VERSION_1,
        vec![ready, not_ready],
        r.irq.clone(),
    ));
    assert!(e.is_err());
    assert!(!r.net.is_active());
    assert_eq!(m(&r).activate_fails.get(), 1);
}

#[test]
fn tx_sends_the_chain_as_one_frame() {
    let mut r = rig(None);
    let mem = r.mem.clone();
    let qs = start(&mut r, &mem, all(0), 16);
    let f = frame(60, 1);
    mem.write_slice(&f[..VNET_HDR_BYTES], GuestAddress(BUF))
        .unwrap();
    mem.write_slice(&f[VNET_HDR_BYTES..], GuestAddress(BUF + 0x1000))
        .unwrap();
    qs[TX_INDEX]
        .add_desc_chains(&[desc(BUF, 12, N, 1), desc(BUF + 0x1000, 60, 0, 0)], 0)
        .unwrap();
    r.net.process_queue(TX_INDEX);
    assert_eq!(r.tap.lock().sent, vec![f]);
    assert_eq!(used_idx(&qs[TX_INDEX]), 1);
    assert_eq!(used_elem(&mem, &qs[TX_INDEX], 0), (0, 0));
    assert_eq!(
        *r.irq.0.lock().unwrap(),
        vec![VirtioInterruptType::Queue(1)]
    );
    let s = m(&r);
    assert_eq!(
        (
            s.tx_packets_count.get(),
            s.tx_bytes_count.get(),
            s.tx_queue_event_count.get()
        ),
        (1, 60, 1)
    );
}

#[test]
fn rx_puts_a_frame_in_one_chain_with_num_buffers_1() {
    let mut r = rig(None);
    let mem = r.mem.clone();
    let qs = start(&mut r, &mem, all(MRG_RXBUF), 16);
    qs[RX_INDEX]
        .add_desc_chains(
            &[desc(BUF, 100, W | N, 1), desc(BUF + 0x1000, 4000, W, 0)],
            0,
        )
        .unwrap();
    let f = frame(1000, 3);
    r.tap.push(f.clone());
    r.net.process_tap();
    assert_eq!(used_idx(&qs[RX_INDEX]), 1);
    assert_eq!(used_elem(&mem, &qs[RX_INDEX], 0), (0, f.len() as u32));
    let mut got = vec![0u8; f.len()];
    mem.read_slice(&mut got[..100], GuestAddress(BUF)).unwrap();
    mem.read_slice(&mut got[100..], GuestAddress(BUF + 0x1000))
        .unwrap();
    let mut want = f.clone();
    want[10] = 1; // num_buffers
    assert_eq!(got, want);
    assert_eq!(
        *r.irq.0.lock().unwrap(),
        vec![VirtioInterruptType::Queue(0)]
    );
    let s = m(&r);
    assert_eq!(
        (s.rx_packets_count.get(), s.rx_bytes_count.get()),
        (1, 1000)
    );
}

#[test]
fn rx_spans_merged_buffers_published_at_once() {
    let mut r = rig(None);
    let mem = r.mem.clone();
    let qs = start(&mut r, &mem, all(0), 16);
    for i in 0..4u16 {
        qs[RX_INDEX]
            .add_desc_chains(&[desc(BUF + u64::from(i) * 0x1000, 1500, W, 0)], i)
            .unwrap();
    }
    let f = frame(3500, 9);
    r.tap.push(f.clone());
    r.net.process_tap();
    // 3512 bytes: three chains of 1500, the count in the first header.
    assert_eq!(used_idx(&qs[RX_INDEX]), 3);
    assert_eq!(used_elem(&mem, &qs[RX_INDEX], 0), (0, 1500));
    assert_eq!(used_elem(&mem, &qs[RX_INDEX], 1), (1, 1500));
    assert_eq!(used_elem(&mem, &qs[RX_INDEX], 2), (2, 512));
    let mut got = vec![0u8; f.len()];
    for (i, c) in got.chunks_mut(1500).enumerate() {
        mem.read_slice(c, GuestAddress(BUF + i as u64 * 0x1000))
            .unwrap();
    }
    let mut want = f;
    want[10] = 3;
    assert_eq!(got, want);
}

#[test]
fn rx_without_buffers_waits_and_reads_no_more() {
    let mut r = rig(None);
    let mem = r.mem.clone();
    let qs = start(&mut r, &mem, all(0), 16);
    // A flood with no receive buffers: one frame is read and waits, the
    // rest stay in the tap, however often it signals.
    for i in 0..1000 {
        r.tap.push(frame(100, i as u8));
    }
    for _ in 0..50 {
        r.net.process_tap();
    }
    assert_eq!(r.tap.lock().reads, 1);
    assert_eq!(r.tap.lock().to_guest.len(), 999);
    assert_eq!(m(&r).no_rx_avail_buffer.get(), 50);
    assert!(r.irq.0.lock().unwrap().is_empty());
    // The guest posts two buffers: the waiting frame and the next go in.
    qs[RX_INDEX]
        .add_desc_chains(&[desc(BUF, 2000, W, 0)], 0)
        .unwrap();
    qs[RX_INDEX]
        .add_desc_chains(&[desc(BUF + 0x1000, 2000, W, 0)], 1)
        .unwrap();
    r.net.process_queue(RX_INDEX);
    assert_eq!(used_idx(&qs[RX_INDEX]), 2);
    let mut b = [0u8; 1];
    mem.read_slice(&mut b, GuestAddress(BUF + 12)).unwrap();
    assert_eq!(b[0], 0, "the first frame first");
    assert_eq!(r.tap.lock().reads, 3);
    assert_eq!(m(&r).rx_packets_count.get(), 2);
}

#[test]
fn a_pass_is_bounded_and_resumes_by_the_wake_eventfd() {
    let mut r = rig(None);
    let mem = r.mem.clone();
    let qs = start(&mut r, &mem, all(0), 256);
    let n = MAX_FRAMES_PER_PASS as u16 + 36;
    for i in 0..n {
        qs[TX_INDEX]
            .add_desc_chains(&[desc(BUF + u64::from(i) * 64, 64, 0, 0)], i)
            .unwrap();
    }
    r.net.process_queue(TX_INDEX);
    assert_eq!(r.tap.lock().sent.len(), MAX_FRAMES_PER_PASS);
    assert_eq!(r.net.wake_evt().read().unwrap(), 1);
    wake(&mut r.net);
    assert_eq!(r.tap.lock().sent.len(), usize::from(n));
    assert_eq!(used_idx(&qs[TX_INDEX]), n);
}

#[test]
fn hostile_tx_chains_are_refused_and_returned() {
    let mut r = rig(None);
    let mem = r.mem.clone();
    let qs = start(&mut r, &mem, all(0), 16);
    let tx = &qs[TX_INDEX];
    // Too short for the header; longer than a frame may be; write-only;
    // in the hole; past the end of RAM; one huge descriptor.
    tx.add_desc_chains(&[desc(BUF, 11, 0, 0)], 0).unwrap();
    tx.add_desc_chains(&[desc(BUF, 65536, N, 2), desc(BUF, 65536, 0, 0)], 1)
        .unwrap();
    tx.add_desc_chains(&[desc(BUF, 100, W, 0)], 3).unwrap();
    tx.add_desc_chains(&[desc(HOLE + 0x1000, 100, 0, 0)], 4)
        .unwrap();
    tx.add_desc_chains(&[desc(HIGH + 16 * MIB - 50, 100, 0, 0)], 5)
        .unwrap();
    tx.add_desc_chains(&[desc(BUF, u32::MAX, 0, 0)], 6).unwrap();
    // A loop: 7 -> 8 -> 7 (virtio-queue's TTL ends it; 16 x 100 bytes fit).
    tx.add_desc_chains(&[desc(BUF, 100, N, 8), desc(BUF, 100, N, 7)], 7)
        .unwrap();
    r.net.process_queue(TX_INDEX);
    assert_eq!(used_idx(tx), 7);
    let s = m(&r);
    assert_eq!(s.tx_malformed_frames.get(), 6, "{s:?}");
    // The loop sends whatever its TTL allowed (at most 16 descriptors).
    let sent = r.tap.lock().sent.clone();
    assert!(sent.len() <= 1 && sent.iter().all(|f| f.len() <= 1600));
    for i in 0..7 {
        assert_eq!(used_elem(&mem, tx, i).1, 0);
    }
}

#[test]
fn tap_write_failures_are_counted_and_the_chain_returned() {
    let mut r = rig(None);
    let mem = r.mem.clone();
    let qs = start(&mut r, &mem, all(0), 16);
    r.tap.lock().fail_writes = true;
    qs[TX_INDEX]
        .add_desc_chains(&[desc(BUF, 100, 0, 0)], 0)
        .unwrap();
    r.net.process_queue(TX_INDEX);
    assert_eq!(used_idx(&qs[TX_INDEX]), 1);
    let s = m(&r);
    assert_eq!(
        (
            s.tap_write_fails.get(),
            s.tx_fails.get(),
            s.tx_packets_count.get()
        ),
        (1, 1, 0)
    );
}

#[test]
fn hostile_rx_chains_are_returned_unused_and_the_frame_waits() {
    let mut r = rig(None);
    let mem = r.mem.clone();
    let qs = start(&mut r, &mem, all(0), 16);
    let rx = &qs[RX_INDEX];
    // Read-only; in the hole; past RAM; too short for the header.
    rx.add_desc_chains(&[desc(BUF, 100, W | N, 1), desc(BUF, 100, 0, 0)], 0)
        .unwrap();
    rx.add_desc_chains(&[desc(HOLE, 2000, W, 0)], 2).unwrap();
    rx.add_desc_chains(&[desc(HIGH + 16 * MIB - 10, 2000, W, 0)], 3)
        .unwrap();
    rx.add_desc_chains(&[desc(BUF, 11, W, 0)], 4).unwrap();
    let f = frame(500, 5);
    r.tap.push(f.clone());
    r.net.process_tap();
    assert_eq!(used_idx(rx), 4);
    for i in 0..4 {
        assert_eq!(used_elem(&mem, rx, i).1, 0);
    }
    assert_eq!(m(&r).rx_fails.get(), 4);
    assert_eq!(m(&r).rx_packets_count.get(), 0);
    // A good chain takes the frame that waited.
    rx.add_desc_chains(&[desc(BUF + 0x1000, 2000, W, 0)], 5)
        .unwrap();
    r.net.process_queue(RX_INDEX);
    assert_eq!(used_idx(rx), 5);
    assert_eq!(used_elem(&mem, rx, 4), (5, f.len() as u32));
    assert_eq!(m(&r).rx_packets_count.get(), 1);
}

#[test]
fn without_merged_buffers_a_frame_too_big_is_dropped_and_the_chain_kept() {
    let mut r = rig(None);
    let mem = r.mem.clone();
    let qs = start(&mut r, &mem, all(MRG_RXBUF), 16);
    qs[RX_INDEX]
        .add_desc_chains(&[desc(BUF, 1526, W, 0)], 0)
        .unwrap();
    r.tap.push(frame(4000, 0));
    r.tap.push(frame(100, 0));
    r.net.process_tap();
    assert_eq!(m(&r).rx_dropped_frames.get(), 1);
    assert_eq!(used_idx(&qs[RX_INDEX]), 1);
    assert_eq!(used_elem(&mem, &qs[RX_INDEX], 0), (0, 112));
}

#[test]
fn frames_with_offloads_the_guest_did_not_ack_are_dropped() {
    let mut r = rig(None);
    let mem = r.mem.clone();
    let acked = all(GUEST_TSO4 | GUEST_TSO6 | GUEST_UFO | GUEST_CSUM);
    let qs = start(&mut r, &mem, acked, 16);
    qs[RX_INDEX]
        .add_desc_chains(&[desc(BUF, 2000, W, 0)], 0)
        .unwrap();
    let mut gso = frame(100, 0);
    gso[1] = 1; // GSO_TCPV4
    let mut csum = frame(100, 0);
    csum[0] = 1; // NEEDS_CSUM
    r.tap.push(gso);
    r.tap.push(csum);
    r.tap.push(vec![0; 5]); // a runt
    r.tap.push(frame(100, 0));
    r.net.process_tap();
    assert_eq!(m(&r).rx_dropped_frames.get(), 3);
    assert_eq!(m(&r).rx_packets_count.get(), 1);
    assert_eq!(used_idx(&qs[RX_INDEX]), 1);
}

#[test]
fn reset_during_io_drops_the_waiting_frame_and_stops_all_work() {
    let mut r = rig(None);
    let mem = r.mem.clone();
    let qs = start(&mut r, &mem, all(0), 16);
    r.tap.push(frame(100, 0));
    r.tap.push(frame(100, 1));
    r.net.process_tap();
    assert_eq!(r.tap.lock().reads, 1);
    r.net.reset();
    assert_eq!(m(&r).rx_dropped_frames.get(), 1);
    // Nothing runs without a driver, whatever fires.
    qs[RX_INDEX]
        .add_desc_chains(&[desc(BUF, 2000, W, 0)], 0)
        .unwrap();
    qs[TX_INDEX]
        .add_desc_chains(&[desc(BUF, 100, 0, 0)], 0)
        .unwrap();
    r.net.process_tap();
    r.net.process_queue(RX_INDEX);
    r.net.process_queue(TX_INDEX);
    wake(&mut r.net);
    assert_eq!(used_idx(&qs[RX_INDEX]), 0);
    assert_eq!(used_idx(&qs[TX_INDEX]), 0);
    assert_eq!(r.tap.lock().reads, 1);
    // A new driver gets the frame left in the tap.
    let qs = start(&mut r, &mem, all(0), 16);
    qs[RX_INDEX]
        .add_desc_chains(&[desc(BUF, 2000, W, 0)], 0)
        .unwrap();
    r.net.process_queue(RX_INDEX);
    assert_eq!(used_idx(&qs[RX_INDEX]), 1);
    let mut b = [0u8; 1];
    mem.read_slice(&mut b, GuestAddress(BUF + 12)).unwrap();
    assert_eq!(b[0], 1);
}

#[test]
fn the_worker_serves_events_and_exits() {
    use std::time::{Duration, Instant};
    use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};
    let mut r = rig(None);
    let mem = r.mem.clone();
    let qs = start(&mut r, &mem, all(0), 16);
    qs[RX_INDEX]
        .add_desc_chains(&[desc(BUF, 2000, W, 0)], 0)
        .unwrap();
    let tap = r.tap.clone();
    let net = Arc::new(Mutex::new(r.net));
    let (qevts, clones) = queue_evts(2);
    let exit = EventFd::new(EFD_NONBLOCK).unwrap();
    let mut w = Worker::start(net.clone(), clones, exit.try_clone().unwrap()).unwrap();
    let second = Duration::from_secs(1);
    tap.push(frame(64, 0));
    assert!(w.run_once(Some(second)).unwrap());
    assert_eq!(net.lock().unwrap().metrics().rx_packets_count, 1);
    qs[TX_INDEX]
        .add_desc_chains(&[desc(BUF, 100, 0, 0)], 0)
        .unwrap();
    qevts[TX_INDEX].write(1).unwrap();
    assert!(w.run_once(Some(second)).unwrap());
    assert_eq!(tap.lock().sent.len(), 1);
    // Nothing pending: the wait lasts its whole limit and runs nothing.
    let before = net.lock().unwrap().metrics().snapshot();
    let t = Instant::now();
    assert!(w.run_once(Some(Duration::from_millis(20))).unwrap());
    assert!(t.elapsed() >= Duration::from_millis(20), "woke early");
    assert_eq!(net.lock().unwrap().metrics().snapshot(), before);
    exit.write(1).unwrap();
    assert!(!w.run_once(Some(second)).unwrap());
}

/// Takes the device's pending passes and runs them, as its thread does on
/// a wake.
fn wake(net: &mut Net<Mem>) {
    let pending = net.wake.take();
    net.process_wake(pending);
}
