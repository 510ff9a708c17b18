//! What the fuzz targets `virtio_mmio` and `balloon_queues` run (they are
//! thin wrappers over these functions); their seeds replay in `seeds`.
//!
//! Guest memory is two small regions with a hole between them (standing in
//! for the MMIO gap); the discard sink asserts that every range lies inside
//! one region, aligned to the discard page, and holds its acks until the
//! input says to complete them.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use virtio_queue::Queue;
use vm_memory::{Address, Bytes, GuestAddress, GuestMemoryMmap};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::driver::{push_avail, take, Layout, NoIrq, Rings};
use teravm::devices::virtio::balloon::{
    features, Balloon, BalloonOptions, DiscardAck, DiscardKind, DiscardSink, RamMap,
};
use teravm::devices::virtio::transport::mmio::{
    regs, MmioTransport, MMIO_MAGIC, MMIO_WINDOW_BYTES,
};
use teravm::devices::virtio::ActiveState;
use teravm::devices::virtio::{status, VirtioDevice, VIRTIO_F_VERSION_1};
use teravm::memory::GuestRange;

use crate::driver::Mem;

const MIB: u64 = 1 << 20;
/// Low RAM: [0, 4 MiB); the hole: [4 MiB, 8 MiB); high RAM: [8 MiB, 12 MiB).
const LOW_LEN: u64 = 4 * MIB;
const HIGH: u64 = 8 * MIB;
const HIGH_LEN: u64 = 4 * MIB;
/// Where the queues' rings lie: queue q at RING_BASE + q * RING_STRIDE.
const RING_BASE: u64 = MIB;
const RING_STRIDE: u64 = 0x1_0000;
/// Where op 3 writes the driver's buffers.
const DATA_BASE: u64 = 2 * MIB;

fn memory() -> Mem {
    Arc::new(
        GuestMemoryMmap::from_ranges(&[
            (GuestAddress(0), LOW_LEN as usize),
            (GuestAddress(HIGH), HIGH_LEN as usize),
        ])
        .expect("fuzz guest memory"),
    )
}

/// A sink that checks every range and holds the acks.
struct CheckingSink {
    ram: RamMap,
    held: Mutex<Vec<DiscardAck>>,
    checked: std::sync::atomic::AtomicUsize,
}

impl DiscardSink for CheckingSink {
    fn discard(&self, _kind: DiscardKind, ranges: Vec<GuestRange>, ack: DiscardAck) {
        let n = check_ranges(&self.ram, &ranges);
        self.checked
            .fetch_add(n, std::sync::atomic::Ordering::Relaxed);
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        held.push(ack);
        assert!(held.len() <= 64, "unbounded batches in flight");
    }
}

fn check_ranges(ram: &RamMap, ranges: &[GuestRange]) -> usize {
    for r in ranges {
        assert!(r.len > 0, "empty range {r:?}");
        assert!(ram.contains(r), "{r:?} outside guest RAM");
        assert_eq!(r.gpa % ram.page_bytes(), 0, "{r:?} unaligned");
        assert_eq!(r.len % ram.page_bytes(), 0, "{r:?} partial page");
    }
    ranges.len()
}

impl CheckingSink {
    fn complete(&self, how: u8) {
        let acks: Vec<DiscardAck> = self
            .held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
            .collect();
        for (i, a) in acks.into_iter().enumerate() {
            match (usize::from(how) + i) % 3 {
                0 => a.freed(),
                1 => a.failed(),
                _ => drop(a),
            }
        }
    }
}

fn balloon(mem: &Mem, flags: u8) -> (Arc<Mutex<Balloon<Mem>>>, Arc<CheckingSink>) {
    let page = if flags & 8 != 0 { 2 * MIB } else { 4096 };
    let sink = Arc::new(CheckingSink {
        ram: RamMap::of(&**mem, page),
        held: Mutex::new(Vec::new()),
        checked: Default::default(),
    });
    let opts = BalloonOptions {
        amount_mib: 0,
        deflate_on_oom: flags & 4 != 0,
        stats_polling_interval_s: u16::from(flags & 1),
        free_page_reporting: flags & 2 != 0,
        free_page_hinting: false,
    };
    let b = Balloon::new(opts, (LOW_LEN + HIGH_LEN) / MIB, page, sink.clone())
        .expect("balloon options are valid");
    (Arc::new(Mutex::new(b)), sink)
}

fn read_u32(t: &MmioTransport<Mem>, off: u64) -> u32 {
    let mut b = [0u8; 4];
    let _ = t.read(off, &mut b);
    u32::from_le_bytes(b)
}

/// The registers op bit 3 picks from (so short inputs reach them).
const REGS: [u64; 20] = [
    regs::STATUS,
    regs::DRIVER_FEATURES,
    regs::DRIVER_FEATURES_SEL,
    regs::DEVICE_FEATURES_SEL,
    regs::QUEUE_SEL,
    regs::QUEUE_NUM,
    regs::QUEUE_READY,
    regs::QUEUE_NOTIFY,
    regs::QUEUE_DESC_LOW,
    regs::QUEUE_DESC_HIGH,
    regs::QUEUE_DRIVER_LOW,
    regs::QUEUE_DRIVER_HIGH,
    regs::QUEUE_DEVICE_LOW,
    regs::QUEUE_DEVICE_HIGH,
    regs::INTERRUPT_ACK,
    regs::INTERRUPT_STATUS,
    regs::CONFIG_GENERATION,
    regs::DEVICE_FEATURES,
    0x100,
    0x104,
];

/// `virtio_mmio`: a balloon behind the transport, driven by a sequence of
/// register accesses of 8 input bytes each (byte 0 of the input picks the
/// balloon's options):
/// `op` (bit 0 write; bits 1-2 size 1/2/4/8; bit 3: offset from a list of
/// registers, else anywhere in the window; bit 4: a statistics tick after),
/// two bytes of offset, four of value, one spare. A `QueueNotify` write runs
/// the balloon's pass as its thread would. Checks: no panic, the magic
/// always reads, `DRIVER_OK` only after `FEATURES_OK` and with the device
/// running (stopped only with DEVICE_NEEDS_RESET: a QueueReady 0 while it
/// ran), reads never return more than asked. Returns whether the device
/// ever ran (so tests can tell the seeds reach that far).
pub fn virtio_mmio(data: &[u8]) -> bool {
    let Some((&flags, data)) = data.split_first() else {
        return false;
    };
    let mut ran = false;
    let mem = memory();
    let (b, sink) = balloon(&mem, flags);
    let dev: Arc<Mutex<dyn VirtioDevice<Mem>>> = b.clone();
    let irq = EventFd::new(EFD_NONBLOCK).expect("eventfd");
    let mut t = MmioTransport::new(dev, mem.clone(), irq).expect("transport");
    for a in data.chunks_exact(8) {
        let op = a[0];
        let size = [1usize, 2, 4, 8][usize::from((op >> 1) & 3)];
        let raw = u64::from(u16::from_le_bytes([a[1], a[2]]));
        let off = if op & 8 != 0 {
            REGS[raw as usize % REGS.len()]
        } else {
            raw % MMIO_WINDOW_BYTES
        };
        let v = [a[3], a[4], a[5], a[6], a[7], 0, 0, 0];
        if op & 1 == 1 {
            let _ = t.write(off, &v[..size]);
            if off == regs::QUEUE_NOTIFY {
                let q = u32::from_le_bytes([a[3], a[4], a[5], a[6]]) as usize;
                let mut bl = b.lock().unwrap_or_else(|e| e.into_inner());
                bl.process_queue(q);
                bl.take_sink_work().send();
                wake(&mut bl);
                bl.take_sink_work().send();
            }
        } else {
            let mut buf = [0x5au8; 9];
            let _ = t.read(off, &mut buf[..size]);
            assert_eq!(buf[size..], [0x5au8; 9][size..], "read past its bytes");
        }
        if op & 0x10 != 0 {
            sink.complete(op >> 5);
            let mut bl = b.lock().unwrap_or_else(|e| e.into_inner());
            wake(&mut bl);
            bl.take_sink_work().send();
            bl.process_stats_timer(Instant::now() + Duration::from_secs(3600));
        }
        assert_eq!(read_u32(&t, regs::MAGIC_VALUE), MMIO_MAGIC);
        let s = t.status();
        if s & status::DRIVER_OK != 0 {
            assert_ne!(s & status::FEATURES_OK, 0, "DRIVER_OK without FEATURES_OK");
            // Running, unless a QueueReady 0 stopped it (then it asks for a
            // reset: DEVICE_NEEDS_RESET, and is stopped).
            let active = b.lock().unwrap_or_else(|e| e.into_inner()).is_active();
            assert_eq!(
                active,
                s & status::DEVICE_NEEDS_RESET == 0,
                "status {s:#x}, active {active}"
            );
            ran = true;
        }
    }
    ran
}

/// The wake eventfd fired, as the balloon's thread handles it: the queues
/// marked for another pass are taken, then run.
fn wake(b: &mut Balloon<Mem>) {
    let pending = b.wake().take();
    b.process_wake(pending);
}

fn fresh_queues(mem: &Mem, n: usize, size: u16) -> (Vec<Rings>, Vec<Queue>) {
    crate::driver::fresh_queues(mem, n, size, RING_BASE, RING_STRIDE)
}

fn activate(b: &mut Balloon<Mem>, mem: &Mem, acked: u64, size: u16) -> Vec<Rings> {
    let (rings, queues) = fresh_queues(mem, b.queue_max_sizes().len(), size);
    let _ = b.activate(ActiveState::new(
        mem.clone(),
        acked,
        queues,
        Arc::new(NoIrq),
    ));
    wake(b);
    b.take_sink_work().send();
    rings
}

/// Test memory's RAM regions, for the shared driver.
const LAYOUT: Layout = Layout {
    low_len: LOW_LEN,
    high: HIGH,
    high_len: HIGH_LEN,
};

/// `balloon_queues`: a running balloon whose queues' descriptor tables,
/// available rings and buffers come from the input. Header: options
/// (bit 0 statistics, 1 reporting, 2 deflate-on-oom, 3 huge pages), queue
/// size (`1 << (b % 9)`), features dropped by the driver (bit 0 statistics,
/// 1 reporting). Then ops, by `byte % 9`:
/// 0 descriptor `[q, index, sel, addr u32, len u32, flags, next]`;
/// 1 available entry `[q, head]`; 2 notify `[q]`; 3 data `[off u16, 8 bytes]`;
/// 4 complete the sink's acks `[how]`; 5 reset and start again;
/// 6 statistics tick; 7 target `[u16]`; 8 available index `[q, u16]`.
/// Returns how many ranges the sink checked.
pub fn balloon_queues(data: &[u8]) -> usize {
    if data.len() < 3 {
        return 0;
    }
    let (flags, size, drop_f) = (data[0], 1u16 << (data[1] % 9), data[2]);
    let mut rest = &data[3..];
    let mem = memory();
    let (b, sink) = balloon(&mem, flags);
    let mut bl = b.lock().unwrap_or_else(|e| e.into_inner());
    let mut acked = bl.avail_features();
    if drop_f & 1 != 0 {
        acked &= !features::STATS_VQ;
    }
    if drop_f & 2 != 0 {
        acked &= !features::REPORTING;
    }
    debug_assert_ne!(acked & VIRTIO_F_VERSION_1, 0);
    let mut rings = activate(&mut bl, &mem, acked, size);
    while let Some(op) = take(1, &mut rest) {
        let q_of = |b: u8| usize::from(b) % rings.len();
        match op[0] % 9 {
            0 => {
                let Some(d) = take(13, &mut rest) else { break };
                LAYOUT.write_desc(&mem, &rings[q_of(d[0])], &d);
            }
            1 => {
                let Some(d) = take(2, &mut rest) else { break };
                push_avail(&mem, &rings[q_of(d[0])], u16::from(d[1]));
            }
            2 => {
                let Some(d) = take(1, &mut rest) else { break };
                bl.process_queue(q_of(d[0]));
                bl.take_sink_work().send();
            }
            3 => {
                let Some(d) = take(10, &mut rest) else { break };
                let off = u64::from(u16::from_le_bytes([d[0], d[1]])) * 8;
                let _ = mem.write_slice(&d[2..10], GuestAddress(DATA_BASE + off));
            }
            4 => {
                let Some(d) = take(1, &mut rest) else { break };
                sink.complete(d[0]);
                wake(&mut bl);
                bl.take_sink_work().send();
            }
            5 => {
                bl.reset();
                // The driver polls Status until the reset completed: the
                // discards in flight end first.
                sink.complete(0);
                rings = activate(&mut bl, &mem, acked, size);
            }
            6 => bl.process_stats_timer(Instant::now() + Duration::from_secs(3600)),
            7 => {
                let Some(d) = take(2, &mut rest) else { break };
                let mib = u64::from(u16::from_le_bytes([d[0], d[1]]));
                let _ = bl.set_target(mib % 16);
            }
            _ => {
                let Some(d) = take(3, &mut rest) else { break };
                let r = &rings[q_of(d[0])];
                let idx = u16::from_le_bytes([d[1], d[2]]);
                let _ = mem.write_obj(idx, r.avail().unchecked_add(2));
            }
        }
    }
    // Whatever the guest did, the device still resets and lets go.
    bl.reset();
    sink.complete(0);
    wake(&mut bl);
    bl.take_sink_work().send();
    sink.checked.load(std::sync::atomic::Ordering::Relaxed)
}
