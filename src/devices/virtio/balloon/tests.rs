//! The balloon's flows and hostile guests, over plain guest memory with
//! virtio-queue's `MockSplitQueue` as the driver (no KVM). The recording
//! sink asserts that every range it gets lies inside guest RAM, aligned.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use virtio_bindings::virtio_ring::{VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
use virtio_queue::desc::{split::Descriptor, RawDescriptor};
use virtio_queue::mock::MockSplitQueue;
use virtio_queue::Queue;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::features::{REPORTING, STATS_VQ};
use super::*;
use crate::devices::virtio::test_utils::{guest_memory, queue_evts, Irq, Mem};
use crate::devices::virtio::ActiveState;
use crate::devices::virtio::Worker;
use crate::devices::virtio::{
    VirtioDevice, VirtioInterrupt, VirtioInterruptType, VIRTIO_F_VERSION_1,
};
use crate::memory::GuestRange;

#[path = "persist_tests.rs"]
mod persist_tests;

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;
/// 0..3 GiB, the MMIO gap, then 4 GiB .. 4 GiB + 16 MiB.
const HIGH: u64 = 4 * GIB;
const HIGH_LEN: u64 = 16 * MIB;

fn mem() -> Mem {
    guest_memory(&[(0, 3 * GIB), (HIGH, HIGH_LEN)])
}

#[derive(Default)]
struct Sink {
    ram: Mutex<Option<RamMap>>,
    got: Mutex<Vec<(DiscardKind, Vec<GuestRange>)>>,
    held: Mutex<Vec<DiscardAck>>,
    hold: bool,
}

impl DiscardSink for Sink {
    fn discard(&self, kind: DiscardKind, ranges: Vec<GuestRange>, ack: DiscardAck) {
        let ram = self.ram.lock().unwrap().clone().unwrap();
        for r in &ranges {
            assert!(r.len > 0 && ram.contains(r), "{r:?} outside RAM");
            assert_eq!(r.gpa % ram.page_bytes(), 0, "{r:?}");
            assert_eq!(r.len % ram.page_bytes(), 0, "{r:?}");
        }
        assert!(ranges.len() <= MAX_CHAINS_PER_PASS * usize::from(QUEUE_SIZE) * MAX_PFNS_PER_CHAIN);
        self.got.lock().unwrap().push((kind, ranges));
        if self.hold {
            self.held.lock().unwrap().push(ack);
        } else {
            ack.freed();
        }
    }
}

struct Rig {
    mem: Mem,
    b: Balloon<Mem>,
    sink: Arc<Sink>,
    irq: Arc<Irq>,
}

const PAGE: u64 = 4096;

fn balloon(opts: BalloonOptions, page: u64, hold: bool) -> Rig {
    let mem = mem();
    let sink = Arc::new(Sink {
        hold,
        ..Sink::default()
    });
    *sink.ram.lock().unwrap() = Some(RamMap::of(&*mem, page));
    let ram_mib = (3 * GIB + HIGH_LEN) / MIB;
    let b = Balloon::new(opts, ram_mib, page, sink.clone()).unwrap();
    Rig {
        mem,
        b,
        sink,
        irq: Arc::new(Irq::default()),
    }
}

type Mock<'a> = MockSplitQueue<'a, GuestMemoryMmap<()>>;

/// Activates with `acked` features and queues of `size` whose rings lie
/// 64 KiB apart from 1 MiB up; returns the driver's side of each queue.
fn start<'a>(r: &mut Rig, mem: &'a GuestMemoryMmap<()>, acked: u64, size: u16) -> Vec<Mock<'a>> {
    let n = r.b.queue_max_sizes().len();
    let qs: Vec<Mock<'a>> = (0..n)
        .map(|i| MockSplitQueue::create(mem, GuestAddress(MIB + i as u64 * 0x1_0000), size))
        .collect();
    let queues: Vec<Queue> = qs
        .iter()
        .map(|q| q.create_queue::<Queue>().unwrap())
        .collect();
    let irq: Arc<dyn VirtioInterrupt> = r.irq.clone();
    r.b.activate(ActiveState::new(r.mem.clone(), acked, queues, irq))
        .unwrap();
    wake(&mut r.b);
    let _ = r.b.wake_evt().read(); // as the balloon's thread would
    qs
}

/// One pass over queue `i` as the balloon's thread makes it: the batches
/// go to the sink once the pass is over.
fn queue(b: &mut Balloon<Mem>, i: usize) {
    b.process_queue(i);
    b.take_sink_work().send();
}

/// The wake eventfd fired, as the balloon's thread handles it.
fn wake(b: &mut Balloon<Mem>) {
    let pending = b.wake().take();
    b.process_wake(pending);
    b.take_sink_work().send();
}

fn desc(addr: u64, len: u32, flags: u32, next: u16) -> RawDescriptor {
    RawDescriptor::from(Descriptor::new(addr, len, flags as u16, next))
}

/// Writes `pfns` at `buf` and adds a one-descriptor chain at table index `at`.
fn add_pfns(mem: &GuestMemoryMmap<()>, q: &Mock<'_>, at: u16, buf: u64, pfns: &[u32]) {
    let bytes: Vec<u8> = pfns.iter().flat_map(|p| p.to_le_bytes()).collect();
    mem.write_slice(&bytes, GuestAddress(buf)).unwrap();
    q.add_desc_chains(&[desc(buf, bytes.len() as u32, 0, 0)], at)
        .unwrap();
}

/// The driver inflates `pfns` (one chain at slot 0 of the inflate queue,
/// buffer at [`BUF`]) and the device processes it.
fn inflate(r: &mut Rig, mem: &GuestMemoryMmap<()>, qs: &[Mock<'_>], pfns: &[u32]) {
    add_pfns(mem, &qs[0], 0, BUF, pfns);
    queue(&mut r.b, 0);
}

fn used(q: &Mock<'_>) -> u16 {
    q.used().idx().load()
}

/// Every range the sink got, of `kind`.
fn got(r: &Rig, kind: DiscardKind) -> Vec<GuestRange> {
    let g = r.sink.got.lock().unwrap();
    g.iter()
        .filter(|(k, _)| *k == kind)
        .flat_map(|(_, v)| v.clone())
        .collect()
}

fn range(gpa: u64, len: u64) -> GuestRange {
    GuestRange { gpa, len }
}

/// Buffers the driver's data lives in.
const BUF: u64 = 8 * MIB;

fn m(b: &Balloon<Mem>) -> BalloonMetrics {
    b.metrics().snapshot()
}

const V1: u64 = VIRTIO_F_VERSION_1;
/// What a Linux driver accepts besides: MUST_TELL_HOST (inflates answered
/// at once, freed behind).
const TELL: u64 = V1 | features::MUST_TELL_HOST;

fn opts() -> BalloonOptions {
    BalloonOptions {
        stats_polling_interval_s: 1,
        free_page_reporting: true,
        ..BalloonOptions::default()
    }
}

#[test]
fn features_queues_and_config() {
    let r = balloon(BalloonOptions::default(), PAGE, false);
    assert_eq!(r.b.avail_features(), V1 | features::MUST_TELL_HOST);
    assert_eq!(r.b.queue_max_sizes(), &[256, 256]);
    let all = BalloonOptions {
        deflate_on_oom: true,
        ..opts()
    };
    let r = balloon(all, PAGE, false);
    let f = r.b.avail_features();
    assert_ne!(f & STATS_VQ, 0);
    assert_ne!(f & REPORTING, 0);
    assert_ne!(f & features::DEFLATE_ON_OOM, 0);
    assert_eq!(f & features::FREE_PAGE_HINT, 0);
    assert_eq!(r.b.queue_max_sizes().len(), 4);
    assert_eq!(r.b.device_type(), VIRTIO_ID_BALLOON);
    // Layout per accepted features: reporting is 2 without statistics.
    assert_eq!(QueueLayout::of(V1 | REPORTING).reporting, Some(2));
    assert_eq!(
        QueueLayout::of(V1 | REPORTING | STATS_VQ).reporting,
        Some(3)
    );
    assert_eq!(QueueLayout::of(V1 | STATS_VQ).stats, Some(2));
}

#[test]
fn hinting_and_targets_above_ram_are_refused() {
    let sink = Arc::new(Sink::default());
    let hint = BalloonOptions {
        free_page_hinting: true,
        ..BalloonOptions::default()
    };
    let e = Balloon::<Mem>::new(hint, 1024, PAGE, sink.clone()).unwrap_err();
    assert!(e.to_string().contains("free_page_reporting"), "{e}");
    let big = BalloonOptions {
        amount_mib: 1025,
        ..BalloonOptions::default()
    };
    assert!(matches!(
        Balloon::<Mem>::new(big, 1024, PAGE, sink.clone()),
        Err(BalloonError::TargetAboveRam { .. })
    ));
    let mut b = Balloon::<Mem>::new(BalloonOptions::default(), 1 << 30, PAGE, sink).unwrap();
    assert!(b.set_target(1 << 24).is_err(), "num_pages overflows u32");
}

#[test]
fn target_config_space_and_generation() {
    let mut r = balloon(opts(), PAGE, false);
    r.b.set_target(100).unwrap();
    let mut c = [0u8; 8];
    r.b.read_config(0, &mut c);
    assert_eq!(u32::from_le_bytes(c[0..4].try_into().unwrap()), 100 * 256);
    let g = r.b.config_generation();
    let mem = r.mem.clone();
    let _qs = start(&mut r, &mem, TELL | STATS_VQ | REPORTING, 256);
    r.b.set_target(50).unwrap();
    assert_ne!(r.b.config_generation(), g);
    assert_eq!(
        r.irq.0.lock().unwrap().last(),
        Some(&VirtioInterruptType::Config)
    );
    assert_eq!(r.b.target_pages(), 50 * 256);
    // The driver writes actual; num_pages is read-only.
    r.b.write_config(0, &[0xff; 8]);
    assert_eq!(r.b.target_pages(), 50 * 256);
    r.b.write_config(4, &(25u32 * 256).to_le_bytes());
    assert_eq!(r.b.actual_mib(), 25);
    // Reads past the end are zero.
    let mut tail = [0xffu8; 4];
    r.b.read_config(14, &mut tail);
    assert_eq!(tail, [0; 4]);
    assert!(r.b.set_target(1 << 20).is_err());
}

#[test]
fn inflate_then_deflate() {
    let mut r = balloon(opts(), PAGE, false);
    let mem = r.mem.clone();
    let qs = start(&mut r, &mem, TELL | STATS_VQ | REPORTING, 256);
    inflate(&mut r, &mem, &qs, &[0x102, 0x100, 0x101, 0x200, 0x100]);
    assert_eq!(used(&qs[0]), 1, "inflate acknowledged at once");
    assert_eq!(
        got(&r, DiscardKind::Inflate),
        vec![range(0x100 * PAGE, 3 * PAGE), range(0x200 * PAGE, PAGE)]
    );
    assert!(r
        .irq
        .0
        .lock()
        .unwrap()
        .contains(&VirtioInterruptType::Queue(0)));
    wake(&mut r.b); // the sink's completion
    let s = m(&r.b);
    assert_eq!((s.inflate_count.get(), s.inflated_pages.get()), (1, 5));
    assert_eq!(
        (s.discarded_bytes.get(), s.discarded_ranges.get()),
        (4 * PAGE, 2)
    );
    add_pfns(&mem, &qs[1], 0, BUF, &[0x100, 0x101]);
    queue(&mut r.b, 1);
    assert_eq!(used(&qs[1]), 1, "no discard of them in flight: at once");
    assert_eq!(r.b.chains_parked(), 0);
    assert_eq!(
        (m(&r.b).deflate_count.get(), m(&r.b).deflated_pages.get()),
        (1, 2)
    );
}

#[test]
fn reported_ranges_acknowledged_only_once_freed() {
    let mut r = balloon(opts(), PAGE, true);
    let mem = r.mem.clone();
    let qs = start(&mut r, &mem, TELL | STATS_VQ | REPORTING, 256);
    let w = VRING_DESC_F_WRITE | VRING_DESC_F_NEXT;
    qs[3]
        .add_desc_chains(
            &[
                desc(16 * MIB, 4 * MIB as u32, w, 1),
                desc(HIGH, 2 * MIB as u32, VRING_DESC_F_WRITE, 0),
            ],
            0,
        )
        .unwrap();
    queue(&mut r.b, 3);
    assert_eq!(
        got(&r, DiscardKind::Report),
        vec![range(16 * MIB, 4 * MIB), range(HIGH, 2 * MIB)]
    );
    assert_eq!(used(&qs[3]), 0, "not before the sink says freed");
    wake(&mut r.b);
    assert_eq!(used(&qs[3]), 0);
    let ack = r.sink.held.lock().unwrap().pop().unwrap();
    assert_eq!(ack.bytes(), 6 * MIB);
    ack.freed();
    assert_eq!(
        r.b.wake_evt().read().unwrap(),
        1,
        "the ack wakes the balloon thread"
    );
    wake(&mut r.b);
    assert_eq!(used(&qs[3]), 1);
    let s = m(&r.b);
    assert_eq!(
        (s.free_page_report_count.get(), s.discarded_bytes.get()),
        (1, 6 * MIB)
    );
    // A sink that drops the ack (a failure, a panic) still returns the chain.
    qs[3]
        .add_desc_chains(&[desc(32 * MIB, PAGE as u32, VRING_DESC_F_WRITE, 0)], 2)
        .unwrap();
    queue(&mut r.b, 3);
    drop(r.sink.held.lock().unwrap().pop());
    wake(&mut r.b);
    assert_eq!(used(&qs[3]), 2);
    assert_eq!(m(&r.b).discard_fails.get(), 1);
}

#[test]
fn statistics_buffer_held_until_the_next_update() {
    let mut r = balloon(opts(), PAGE, false);
    let mem = r.mem.clone();
    let qs = start(&mut r, &mem, TELL | STATS_VQ | REPORTING, 256);
    let mut buf = Vec::new();
    for (tag, v) in [(4u16, 1000u64), (5, 4000), (6, 2000)] {
        buf.extend_from_slice(&tag.to_le_bytes());
        buf.extend_from_slice(&v.to_le_bytes());
    }
    mem.write_slice(&buf, GuestAddress(BUF)).unwrap();
    qs[2]
        .add_desc_chains(&[desc(BUF, buf.len() as u32, 0, 0)], 0)
        .unwrap();
    queue(&mut r.b, 2);
    let st = r.b.latest_stats().unwrap();
    assert_eq!(
        (st.free_memory, st.total_memory, st.available_memory),
        (Some(1000), Some(4000), Some(2000))
    );
    assert_eq!(used(&qs[2]), 0, "held");
    let now = Instant::now();
    assert!(r.b.stats_timeout(now).unwrap() <= Duration::from_secs(1));
    r.b.process_stats_timer(now + Duration::from_secs(2));
    assert_eq!(used(&qs[2]), 1, "given back: the guest refills it");
    r.b.process_stats_timer(now + Duration::from_secs(4));
    assert_eq!(used(&qs[2]), 1, "nothing held, nothing given");
    assert_eq!(m(&r.b).stats_updates_count.get(), 1);
    // Switching statistics on or off after creation is refused.
    assert!(r.b.set_stats_polling_interval(0).is_err());
    r.b.set_stats_polling_interval(5).unwrap();
    let mut off = balloon(BalloonOptions::default(), PAGE, false);
    assert!(off.b.set_stats_polling_interval(1).is_err());
    assert!(off.b.latest_stats().is_err());
}

#[test]
fn hostile_pfns_and_ranges_never_leave_ram() {
    let mut r = balloon(opts(), PAGE, false);
    let mem = r.mem.clone();
    let qs = start(&mut r, &mem, TELL | STATS_VQ | REPORTING, 256);
    let gap = (3 * GIB / PAGE) as u32;
    let top = ((HIGH + HIGH_LEN) / PAGE) as u32;
    add_pfns(
        &mem,
        &qs[0],
        0,
        BUF,
        &[u32::MAX, gap, gap + 5, top, top - 1, 7],
    );
    queue(&mut r.b, 0);
    assert_eq!(
        got(&r, DiscardKind::Inflate),
        vec![
            range(7 * PAGE, PAGE),
            range(u64::from(top - 1) * PAGE, PAGE)
        ]
    );
    assert_eq!(m(&r.b).refused_ranges.get(), 4);
    // Reports: in the gap, across the end of low RAM, past the end, huge
    // and unaligned, a zero length.
    let wo = VRING_DESC_F_WRITE;
    let chains = [
        desc(3 * GIB + MIB, MIB as u32, wo, 0),
        desc(3 * GIB - 2 * PAGE, 1 << 31, wo, 0),
        desc(HIGH + HIGH_LEN - PAGE, u32::MAX, wo, 0),
        desc(100, 3 * PAGE as u32, wo, 0),
        desc(u64::MAX - 10, u32::MAX, wo, 0),
        desc(4 * PAGE, 0, wo, 0),
    ];
    qs[3].add_desc_chains(&chains, 0).unwrap();
    queue(&mut r.b, 3);
    wake(&mut r.b);
    assert_eq!(
        got(&r, DiscardKind::Report),
        vec![
            range(3 * GIB - 2 * PAGE, 2 * PAGE),
            range(HIGH, HIGH_LEN),
            range(HIGH + HIGH_LEN - PAGE, PAGE),
            range(PAGE, 2 * PAGE),
        ]
        .into_iter()
        .filter(|r| r.len > 0)
        .collect::<Vec<_>>()
    );
    assert_eq!(used(&qs[3]), 6, "every chain returned");
    // Everything refused: the chain still goes back, the sink sees nothing.
    let before = r.sink.got.lock().unwrap().len();
    qs[3]
        .add_desc_chains(&[desc(3 * GIB, PAGE as u32, wo, 0)], 6)
        .unwrap();
    queue(&mut r.b, 3);
    assert_eq!(used(&qs[3]), 7);
    assert_eq!(r.sink.got.lock().unwrap().len(), before);
}

#[test]
fn hostile_descriptors_loops_write_only_outside_ram() {
    let mut r = balloon(opts(), PAGE, false);
    let mem = r.mem.clone();
    let qs = start(&mut r, &mem, TELL | STATS_VQ | REPORTING, 16);
    mem.write_slice(&9u32.to_le_bytes(), GuestAddress(BUF))
        .unwrap();
    let n = VRING_DESC_F_NEXT;
    // A loop: 0 -> 1 -> 0 ...
    let tbl = &qs[0];
    tbl.desc_table().store(0, desc(BUF, 4, n, 1)).unwrap();
    tbl.desc_table().store(1, desc(BUF, 4, n, 0)).unwrap();
    // Write-only where a PFN list is read; a buffer in the MMIO gap; a
    // huge length.
    tbl.desc_table()
        .store(2, desc(BUF, 4, VRING_DESC_F_WRITE, 0))
        .unwrap();
    tbl.desc_table().store(3, desc(3 * GIB, 4, 0, 0)).unwrap();
    tbl.desc_table()
        .store(4, desc(BUF, u32::MAX, 0, 0))
        .unwrap();
    // An index past the table.
    let heads = [0u16, 2, 3, 4, 200];
    for (i, h) in heads.iter().enumerate() {
        tbl.avail().ring().ref_at(i).unwrap().store(*h);
    }
    tbl.avail().idx().store(heads.len() as u16);
    queue(&mut r.b, 0);
    wake(&mut r.b);
    // The loop's PFN (read up to the chain's TTL) and the huge buffer's
    // first 16 KiB: only page 9 and what lies at BUF.. inside RAM.
    let inflated = got(&r, DiscardKind::Inflate);
    assert!(
        inflated.contains(&range(9 * PAGE, PAGE)),
        "the loop's PFN 9 was read: {inflated:?}"
    );
    for g in &inflated {
        assert!(g.end() <= 3 * GIB, "{g:?}");
    }
    assert_eq!(used(&qs[0]), 4, "the four chains with a head in the table");
    assert!(m(&r.b).event_fails.get() >= 2);
    // An available index far ahead of the ring (1000 entries in a ring of
    // 16): nothing is taken, returned or discarded, and nothing panics.
    let (used_before, batches_before) = (used(&qs[0]), r.sink.got.lock().unwrap().len());
    let pfns_before = m(&r.b).inflated_pages.get();
    tbl.avail().idx().store(1000);
    queue(&mut r.b, 0);
    wake(&mut r.b);
    assert_eq!(used(&qs[0]), used_before);
    assert_eq!(r.sink.got.lock().unwrap().len(), batches_before);
    assert_eq!(m(&r.b).inflated_pages.get(), pfns_before);
}

#[test]
fn reset_in_the_middle_drops_stale_completions() {
    let mut r = balloon(opts(), PAGE, true);
    let mem = r.mem.clone();
    let qs = start(&mut r, &mem, TELL | STATS_VQ | REPORTING, 256);
    qs[3]
        .add_desc_chains(&[desc(16 * MIB, MIB as u32, VRING_DESC_F_WRITE, 0)], 0)
        .unwrap();
    queue(&mut r.b, 3);
    r.b.reset();
    assert!(!r.b.is_active());
    r.sink.held.lock().unwrap().pop().unwrap().freed();
    wake(&mut r.b);
    queue(&mut r.b, 3);
    assert_eq!(used(&qs[3]), 0, "no write to the old rings after reset");
    // Start again: new rings, same flows.
    let mem2 = r.mem.clone();
    let qs2 = start(&mut r, &mem2, TELL | REPORTING, 256);
    assert_eq!(r.b.layout().unwrap().reporting, Some(2));
    qs2[2]
        .add_desc_chains(&[desc(16 * MIB, MIB as u32, VRING_DESC_F_WRITE, 0)], 0)
        .unwrap();
    queue(&mut r.b, 2);
    r.sink.held.lock().unwrap().pop().unwrap().freed();
    wake(&mut r.b);
    assert_eq!(used(&qs2[2]), 1);
}

#[test]
fn bounded_work_per_pass_and_in_flight() {
    let mut r = balloon(opts(), PAGE, true);
    let mem = r.mem.clone();
    let qs = start(&mut r, &mem, TELL | STATS_VQ | REPORTING, 256);
    for i in 0..100u16 {
        add_pfns(
            &mem,
            &qs[0],
            i,
            BUF + u64::from(i) * 16,
            &[u32::from(i) + 16],
        );
    }
    queue(&mut r.b, 0);
    assert_eq!(usize::from(used(&qs[0])), MAX_CHAINS_PER_PASS);
    assert_eq!(
        r.b.wake_evt().read().unwrap(),
        1,
        "more work: the thread wakes"
    );
    wake(&mut r.b);
    assert_eq!(used(&qs[0]), 100);
    // The sink holds every batch: past MAX_INFLIGHT_BATCHES, reports wait.
    for i in 0..(MAX_INFLIGHT_BATCHES as u16 + 4) {
        let gpa = 64 * MIB + u64::from(i) * MIB;
        qs[3]
            .add_desc_chains(&[desc(gpa, MIB as u32, VRING_DESC_F_WRITE, 0)], i)
            .unwrap();
        queue(&mut r.b, 3);
    }
    let held = r.sink.held.lock().unwrap().len();
    assert_eq!(held, MAX_INFLIGHT_BATCHES);
    let acks: Vec<DiscardAck> = r.sink.held.lock().unwrap().drain(..).collect();
    acks.into_iter().for_each(DiscardAck::freed);
    wake(&mut r.b);
    wake(&mut r.b);
    assert!(
        !r.sink.held.lock().unwrap().is_empty(),
        "the waiting reports went on"
    );
}

#[test]
fn huge_pages_discarded_whole_only() {
    let huge = 2 * MIB;
    let mut r = balloon(opts(), huge, false);
    let mem = r.mem.clone();
    let qs = start(&mut r, &mem, TELL | STATS_VQ | REPORTING, 256);
    // 512 PFNs from 2 MiB: one whole huge page; 511 from 4 MiB: none.
    let whole: Vec<u32> = (512..1024).collect();
    add_pfns(&mem, &qs[0], 0, BUF, &whole);
    let part: Vec<u32> = (1024..1535).collect();
    add_pfns(&mem, &qs[0], 1, BUF + 4 * PAGE * 256, &part);
    queue(&mut r.b, 0);
    assert_eq!(got(&r, DiscardKind::Inflate), vec![range(huge, huge)]);
    assert_eq!(m(&r.b).refused_bytes.get(), 511 * PAGE);
}

struct Rig2 {
    sink: Arc<Sink>,
}

#[test]
fn worker_thread_serves_queues_until_exit() {
    use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};
    let mut r = balloon(opts(), PAGE, false);
    let mem = r.mem.clone();
    let qs = start(&mut r, &mem, TELL | STATS_VQ | REPORTING, 256);
    let Rig { b, sink, .. } = r;
    let r = Rig2 { sink };
    let b = Arc::new(Mutex::new(b));
    let (evts, clones) = queue_evts(4);
    let exit = EventFd::new(EFD_NONBLOCK).unwrap();
    let worker = Worker::start(BalloonWorker::new(&b), clones, exit.try_clone().unwrap()).unwrap();
    let t = std::thread::Builder::new()
        .name("balloon".into())
        .spawn(move || worker.run())
        .unwrap();
    add_pfns(&mem, &qs[0], 0, BUF, &[42]);
    evts[0].write(1).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while used(&qs[0]) == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(used(&qs[0]), 1);
    exit.write(1).unwrap();
    t.join().unwrap().unwrap();
    let g = r.sink.got.lock().unwrap();
    assert_eq!(g[0], (DiscardKind::Inflate, vec![range(42 * PAGE, PAGE)]));
}

#[test]
fn a_deflate_waits_for_the_discard_of_its_pages_however_long() {
    let mut r = balloon(opts(), PAGE, true);
    let mem = r.mem.clone();
    let qs = start(&mut r, &mem, TELL | STATS_VQ | REPORTING, 256);
    inflate(&mut r, &mem, &qs, &[0x100, 0x101, 0x102]);
    assert_eq!(used(&qs[0]), 1, "inflate acknowledged at once");
    assert_eq!(r.b.batches_in_flight(), 1);
    // The guest deflates one of them while its discard still runs.
    add_pfns(&mem, &qs[1], 0, BUF + 64, &[0x101]);
    queue(&mut r.b, 1);
    assert_eq!(used(&qs[1]), 0, "parked while a discard can reach it");
    assert_eq!(r.b.chains_parked(), 1);
    // A deflate of pages no discard covers goes back at once.
    add_pfns(&mem, &qs[1], 1, BUF + 128, &[0x300]);
    queue(&mut r.b, 1);
    assert_eq!(used(&qs[1]), 1);
    // Nothing but the end of the discard releases it: wakes, passes.
    for _ in 0..3 {
        wake(&mut r.b);
        queue(&mut r.b, 1);
    }
    assert_eq!(used(&qs[1]), 1);
    r.sink.held.lock().unwrap().pop().unwrap().freed();
    assert_eq!(
        r.b.wake_evt().read().unwrap(),
        1,
        "the ack wakes the thread"
    );
    wake(&mut r.b);
    assert_eq!(used(&qs[1]), 2);
    assert_eq!((r.b.chains_parked(), r.b.batches_in_flight()), (0, 0));
}

#[test]
fn a_deflated_page_inside_a_huge_page_being_freed_waits_too() {
    let huge = 2 * MIB;
    let mut r = balloon(opts(), huge, true);
    let mem = r.mem.clone();
    let qs = start(&mut r, &mem, TELL | STATS_VQ | REPORTING, 256);
    let first = (huge / PAGE) as u32;
    let pfns: Vec<u32> = (first..first + 512).collect();
    add_pfns(&mem, &qs[0], 0, BUF, &pfns);
    queue(&mut r.b, 0);
    assert_eq!(got(&r, DiscardKind::Inflate), vec![range(huge, huge)]);
    // One 4 KiB page of it: not a whole discard page, still covered.
    add_pfns(&mem, &qs[1], 0, BUF + 4096, &[first + 7]);
    queue(&mut r.b, 1);
    assert_eq!(used(&qs[1]), 0);
    drop(r.sink.held.lock().unwrap().pop()); // a failed discard ends too
    wake(&mut r.b);
    assert_eq!(used(&qs[1]), 1);
}

#[test]
fn parked_deflates_are_bounded_and_the_rest_waits_in_the_ring() {
    let mut r = balloon(opts(), PAGE, true);
    let mem = r.mem.clone();
    let qs = start(&mut r, &mem, TELL | STATS_VQ | REPORTING, 256);
    inflate(&mut r, &mem, &qs, &[0x100]);
    let n = MAX_PARKED_DEFLATES as u16 + 3;
    for i in 0..n {
        add_pfns(&mem, &qs[1], i, BUF + 64 + u64::from(i) * 8, &[0x100]);
        queue(&mut r.b, 1);
    }
    assert_eq!(r.b.chains_parked(), MAX_PARKED_DEFLATES);
    assert_eq!(used(&qs[1]), 0);
    r.sink.held.lock().unwrap().pop().unwrap().freed();
    wake(&mut r.b); // the parked ones go back, the ring gets a pass
    wake(&mut r.b);
    assert_eq!(
        used(&qs[1]),
        n,
        "every chain returned once the discard ended"
    );
    assert_eq!(r.b.chains_parked(), 0);
}

#[test]
fn a_report_goes_back_only_once_no_other_discard_covers_it() {
    let mut r = balloon(opts(), PAGE, true);
    let mem = r.mem.clone();
    let qs = start(&mut r, &mem, TELL | STATS_VQ | REPORTING, 256);
    // A (hostile) guest inflates a page, then reports the MiB around it.
    inflate(&mut r, &mem, &qs, &[(16 * MIB / PAGE) as u32 + 3]);
    qs[3]
        .add_desc_chains(&[desc(16 * MIB, MIB as u32, VRING_DESC_F_WRITE, 0)], 0)
        .unwrap();
    queue(&mut r.b, 3);
    assert_eq!(r.b.batches_in_flight(), 2);
    r.sink.held.lock().unwrap().pop().unwrap().freed(); // the report's
    wake(&mut r.b);
    assert_eq!(used(&qs[3]), 0, "the inflate's discard still covers it");
    r.sink.held.lock().unwrap().pop().unwrap().freed();
    wake(&mut r.b);
    assert_eq!(used(&qs[3]), 1);
}

#[test]
fn a_reset_completes_only_once_the_discards_in_flight_end() {
    use crate::devices::virtio::transport::mmio::regs;
    use crate::devices::virtio::MmioTransport;
    use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};
    let mut r = balloon(opts(), PAGE, true);
    let mem = r.mem.clone();
    let qs = start(&mut r, &mem, TELL | STATS_VQ | REPORTING, 256);
    inflate(&mut r, &mem, &qs, &[0x100]);
    let Rig { b, sink, .. } = r;
    let b = Arc::new(Mutex::new(b));
    let irq = EventFd::new(EFD_NONBLOCK).unwrap();
    let mut t = MmioTransport::new(b.clone(), mem.clone(), irq).unwrap();
    let status = |t: &MmioTransport<Mem>| {
        let mut v = [0u8; 4];
        t.read(regs::STATUS, &mut v).unwrap();
        u32::from_le_bytes(v)
    };
    // The driver resets (a reboot, kexec) while the discard runs.
    t.write(regs::STATUS, &0u32.to_le_bytes()).unwrap();
    // What the bus waits on before the write returns to a driver that
    // never polls Status (Linux's vm_reset).
    let fence = t
        .take_reset_wait()
        .expect("a reset with a discard in flight is fenced");
    assert_eq!(fence.pending(), 1);
    assert!(!fence.wait(Instant::now()));
    assert!(t.take_reset_wait().is_none(), "handed out once");
    assert!(!b.lock().unwrap().is_active());
    assert_ne!(status(&t), 0, "the reset is not complete yet");
    assert!(
        t.write(regs::STATUS, &1u32.to_le_bytes()).is_err(),
        "the driver cannot start again meanwhile"
    );
    assert_ne!(status(&t), 0);
    assert_eq!(used(&qs[0]), 1);
    sink.held.lock().unwrap().pop().unwrap().freed();
    assert!(fence.wait(Instant::now()), "the vCPU goes on once it ended");
    assert_eq!(status(&t), 0, "complete once the discard ended");
    t.write(regs::STATUS, &1u32.to_le_bytes()).unwrap();
    assert_eq!(status(&t), 1);
    // And the device itself refuses an activation while fenced.
    let mut r = balloon(opts(), PAGE, true);
    let mem = r.mem.clone();
    let qs = start(&mut r, &mem, TELL | STATS_VQ | REPORTING, 256);
    inflate(&mut r, &mem, &qs, &[0x100]);
    r.b.reset();
    assert!(r.b.reset_in_progress());
    let queues: Vec<Queue> = qs
        .iter()
        .map(|q| q.create_queue::<Queue>().unwrap())
        .collect();
    let irq: Arc<dyn VirtioInterrupt> = r.irq.clone();
    assert!(r
        .b
        .activate(ActiveState::new(mem.clone(), V1, queues, irq))
        .is_err());
    r.sink.held.lock().unwrap().pop().unwrap().freed();
    assert!(!r.b.reset_in_progress());
}

/// A sink whose discard blocks until told to go on.
struct BlockingSink {
    entered: Mutex<std::sync::mpsc::Sender<()>>,
    go: Mutex<std::sync::mpsc::Receiver<()>>,
}

impl DiscardSink for BlockingSink {
    fn discard(&self, _kind: DiscardKind, _ranges: Vec<GuestRange>, ack: DiscardAck) {
        self.entered.lock().unwrap().send(()).unwrap();
        let _ = self.go.lock().unwrap().recv();
        ack.freed();
    }
}

#[test]
fn a_slow_discard_never_holds_the_balloons_lock() {
    use std::sync::mpsc::channel;
    use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};
    let mem = mem();
    let (entered_tx, entered) = channel();
    let (go, go_rx) = channel();
    let sink = Arc::new(BlockingSink {
        entered: Mutex::new(entered_tx),
        go: Mutex::new(go_rx),
    });
    let ram_mib = (3 * GIB + HIGH_LEN) / MIB;
    let b: Balloon<Mem> = Balloon::new(opts(), ram_mib, PAGE, sink).unwrap();
    let mut r = Rig {
        mem: mem.clone(),
        b,
        sink: Arc::default(),
        irq: Arc::default(),
    };
    let qs = start(&mut r, &mem, TELL | STATS_VQ | REPORTING, 256);
    let b = Arc::new(Mutex::new(r.b));
    let (evts, clones) = queue_evts(4);
    let exit = EventFd::new(EFD_NONBLOCK).unwrap();
    let worker = Worker::start(BalloonWorker::new(&b), clones, exit.try_clone().unwrap()).unwrap();
    let t = std::thread::spawn(move || worker.run());
    add_pfns(&mem, &qs[0], 0, BUF, &[42]);
    evts[0].write(1).unwrap();
    entered.recv_timeout(Duration::from_secs(10)).unwrap();
    // The discard blocks the balloon's thread: a vCPU's register access
    // (the same lock) goes through meanwhile.
    let (done_tx, done) = channel();
    let b2 = b.clone();
    std::thread::spawn(move || {
        let n = b2.lock().unwrap().target_pages();
        done_tx.send(n).unwrap();
    });
    assert!(
        done.recv_timeout(Duration::from_secs(2)).is_ok(),
        "the balloon's lock is held across the discard"
    );
    go.send(()).unwrap();
    exit.write(1).unwrap();
    t.join().unwrap().unwrap();
}

#[test]
fn without_must_tell_host_an_inflate_is_answered_only_once_freed() {
    let mut r = balloon(opts(), PAGE, true);
    let mem = r.mem.clone();
    let qs = start(&mut r, &mem, V1 | STATS_VQ | REPORTING, 256);
    inflate(&mut r, &mem, &qs, &[0x100, 0x101]);
    assert_eq!(
        used(&qs[0]),
        0,
        "held: the driver may reuse what it deflates"
    );
    assert_eq!(r.b.batches_in_flight(), 1);
    r.sink.held.lock().unwrap().pop().unwrap().freed();
    wake(&mut r.b);
    assert_eq!(used(&qs[0]), 1, "answered once freed");
    assert_eq!(r.b.batches_in_flight(), 0);
    // A reset in between: no fence left once nothing is in flight.
    r.b.reset();
    assert!(!r.b.reset_in_progress());
    assert_eq!(r.b.reset_fence().unwrap().pending(), 0);
}
