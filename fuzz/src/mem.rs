//! What the fuzz target `virtio_mem` runs; its seeds replay in `seeds`.
//!
//! A running virtio-mem device whose queue's descriptor table, available
//! ring and request bytes come from the input. Guest RAM is two small
//! regions with a hole (the rings and requests live there); the hotplug
//! region lies far above, in no guest memory, as in teravm. The sink keeps
//! its own model of the plugged blocks and mapped slots, and asserts that
//! every range and slot it is given lies inside the region, block or slot
//! aligned, and agrees with that model: a PLUG's range was unplugged and
//! its `map_slots` unmapped; an unplug's ranges were plugged and its
//! `unmap_slots` mapped and now empty.

use std::sync::{Arc, Mutex};

use vm_memory::{Address, Bytes, GuestAddress};

use crate::driver::{fresh_queues, memory, push_avail, take, Layout, Mem, NoIrq, Rings};
use teravm::devices::virtio::mem::{
    HotplugSink, MemOptions, MemWorker, PlugRefused, VirtioMem, VIRTIO_MEM_F_UNPLUGGED_INACCESSIBLE,
};
use teravm::devices::virtio::{ActiveState, VirtioDevice};
use teravm::memory::GuestRange;

const MIB: u64 = 1 << 20;
const LAYOUT: Layout = Layout {
    low_len: 4 * MIB,
    high: 8 * MIB,
    high_len: 4 * MIB,
};
/// The queue's rings.
const RING_BASE: u64 = MIB;
/// Where op 7 writes requests (64 bytes each: request, then response).
const DATA_BASE: u64 = 2 * MIB;
/// The hotplug region: 512 MiB at 64 GiB, blocks of 2 MiB.
const REGION: u64 = 64 << 30;
const REGION_BYTES: u64 = 512 * MIB;
const BLOCK: u64 = 2 * MIB;
const BLOCKS: usize = (REGION_BYTES / BLOCK) as usize;

/// The sink's view of the device, checked on every call.
struct Model {
    slot: u64,
    plugged: Vec<bool>,
    mapped: Vec<bool>,
    /// How PLUGs are answered (`% 3`: 0 Ok, 1 Busy, 2 Failed) until op 5
    /// says otherwise.
    answer: u8,
    calls: usize,
}

struct CheckingSink(Mutex<Model>);

impl Model {
    fn blocks(&self, GuestRange { gpa: addr, len }: GuestRange) -> std::ops::Range<usize> {
        assert!(len > 0, "empty range {addr:#x}+{len:#x}");
        assert_eq!(addr % BLOCK, 0, "unaligned range {addr:#x}");
        assert_eq!(len % BLOCK, 0, "partial block {addr:#x}+{len:#x}");
        assert!(
            addr >= REGION && addr - REGION + len <= REGION_BYTES,
            "range {addr:#x}+{len:#x} outside the region"
        );
        let first = ((addr - REGION) / BLOCK) as usize;
        first..first + (len / BLOCK) as usize
    }

    fn slot_of(&self, GuestRange { gpa: addr, len }: GuestRange) -> usize {
        assert_eq!(len, self.slot, "slot {addr:#x} of {len:#x} bytes");
        assert_eq!(addr % self.slot, 0, "unaligned slot {addr:#x}");
        assert!(
            addr >= REGION && addr - REGION + len <= REGION_BYTES,
            "slot {addr:#x} outside the region"
        );
        ((addr - REGION) / self.slot) as usize
    }

    fn slot_plugged(&self, s: usize) -> bool {
        let bps = (self.slot / BLOCK) as usize;
        self.plugged[s * bps..(s + 1) * bps].iter().any(|&p| p)
    }
}

impl HotplugSink for CheckingSink {
    fn plug(&self, range: GuestRange, map_slots: &[GuestRange]) -> Result<(), PlugRefused> {
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        m.calls += 1;
        let blocks = m.blocks(range);
        assert!(blocks.clone().all(|b| !m.plugged[b]), "re-plug {range:x?}");
        let slots: Vec<usize> = map_slots.iter().map(|&s| m.slot_of(s)).collect();
        for &s in &slots {
            assert!(!m.mapped[s], "slot {s} mapped twice");
        }
        // Every slot the range touches is mapped after this.
        let bps = (m.slot / BLOCK) as usize;
        for s in blocks.start / bps..=(blocks.end - 1) / bps {
            assert!(m.mapped[s] || slots.contains(&s), "slot {s} left unmapped");
        }
        match m.answer % 3 {
            0 => {
                for b in blocks {
                    m.plugged[b] = true;
                }
                for s in slots {
                    m.mapped[s] = true;
                }
                Ok(())
            }
            1 => Err(PlugRefused::Busy),
            _ => Err(PlugRefused::Failed("fuzz".into())),
        }
    }

    fn unplug(&self, ranges: &[GuestRange], unmap_slots: &[GuestRange]) {
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        m.calls += 1;
        assert!(!ranges.is_empty(), "an unplug of nothing");
        for &r in ranges {
            for b in m.blocks(r) {
                assert!(m.plugged[b], "unplug of unplugged block {b}");
                m.plugged[b] = false;
            }
        }
        for &s in unmap_slots {
            let s = m.slot_of(s);
            assert!(m.mapped[s], "slot {s} unmapped but not mapped");
            assert!(!m.slot_plugged(s), "slot {s} unmapped with blocks plugged");
            m.mapped[s] = false;
        }
        // A slot left with no block is unmapped.
        for s in 0..m.mapped.len() {
            assert!(
                !m.mapped[s] || m.slot_plugged(s),
                "slot {s} left mapped empty"
            );
        }
    }
}

fn activate(d: &mut VirtioMem<Mem>, mem: &Mem, acked: u64, size: u16) -> Rings {
    let (mut rings, queues) = fresh_queues(mem, 1, size, RING_BASE, 0x1_0000);
    let _ = d.activate(ActiveState::new(
        mem.clone(),
        acked,
        queues,
        Arc::new(NoIrq),
    ));
    rings.remove(0)
}

/// `virtio_mem`: header `[slot shift, queue size, requested blocks]`: the
/// slot is `2 MiB << (b % 5)`, the queue `1 << (b % 9)`, the first target
/// `b` blocks (bit 7 of byte 0: the driver does not ack
/// UNPLUGGED_INACCESSIBLE, so the device must stay off). Then ops, by
/// `byte % 8`:
/// 0 descriptor `[q, index, sel, addr u32, len u32, flags, next]`;
/// 1 make head `[_, head]` available; 2 run the queue; 3 a new target
/// `[le16 blocks]`; 4 reset and activate again; 5 how the sink answers
/// PLUGs from now `[n]` (`n % 3`: Ok, Busy, Failed); 6 garbage avail index `[le16]`; 7 a well-formed chain
/// `[slot, type, sel, le32 raw, le16 nb_blocks]` (at descriptors `2 slot`
/// and `2 slot + 1`, the address `sel % 3`: block `raw` of the region,
/// region + `raw` pages, or `raw << 32 | raw`).
/// Returns how many sink calls were checked.
pub fn virtio_mem(data: &[u8]) -> usize {
    if data.len() < 3 {
        return 0;
    }
    let slot = BLOCK << (data[0] % 5);
    let size = 1u16 << (data[1] % 9);
    let sink = Arc::new(CheckingSink(Mutex::new(Model {
        slot,
        plugged: vec![false; BLOCKS],
        mapped: vec![false; (REGION_BYTES / slot) as usize],
        answer: 0,
        calls: 0,
    })));
    let opts = MemOptions {
        region_addr: REGION,
        region_bytes: REGION_BYTES,
        block_bytes: BLOCK,
        slot_bytes: slot,
        node_id: 0,
    };
    let mem = memory(&LAYOUT);
    let dev = VirtioMem::<Mem>::new(opts, sink.clone()).expect("valid options");
    let dev = Arc::new(Mutex::new(dev));
    let lock = || dev.lock().unwrap_or_else(|e| e.into_inner());
    let _ = lock().set_requested(u64::from(data[2]) * BLOCK);
    let mut acked = lock().avail_features();
    if data[0] & 0x80 != 0 {
        acked &= !(1 << VIRTIO_MEM_F_UNPLUGGED_INACCESSIBLE);
    }
    let mut rings = activate(&mut lock(), &mem, acked, size);
    if data[0] & 0x80 != 0 {
        assert!(!lock().is_active(), "active without UNPLUGGED_INACCESSIBLE");
    }
    let worker = MemWorker::new(&dev);
    worker.process_queue();
    let mut rest = &data[3..];
    while let Some(op) = take(1, &mut rest) {
        match op[0] % 8 {
            0 => {
                let Some(d) = take(13, &mut rest) else { break };
                LAYOUT.write_desc(&mem, &rings, &d);
            }
            1 => {
                let Some(d) = take(2, &mut rest) else { break };
                push_avail(&mem, &rings, u16::from(d[1]));
            }
            2 => worker.process_queue(),
            3 => {
                let Some(d) = take(2, &mut rest) else { break };
                let blocks = u64::from(u16::from_le_bytes([d[0], d[1]]));
                let _ = lock().set_requested(blocks * BLOCK);
            }
            4 => {
                lock().reset();
                rings = activate(&mut lock(), &mem, acked, size);
            }
            5 => {
                let Some(d) = take(1, &mut rest) else { break };
                sink.0.lock().unwrap_or_else(|e| e.into_inner()).answer = d[0];
            }
            6 => {
                let Some(d) = take(2, &mut rest) else { break };
                let idx = u16::from_le_bytes([d[0], d[1]]);
                let _ = mem.write_obj(idx, rings.avail().unchecked_add(2));
            }
            _ => {
                let Some(d) = take(9, &mut rest) else { break };
                well_formed(&mem, &rings, &d);
            }
        }
        let plugged = lock().status().plugged_bytes;
        let m = sink.0.lock().unwrap_or_else(|e| e.into_inner());
        let model = m.plugged.iter().filter(|&&p| p).count() as u64 * BLOCK;
        assert_eq!(plugged, model, "the device's plugged_size and the sink's");
    }
    lock().reset();
    let calls = sink.0.lock().unwrap_or_else(|e| e.into_inner()).calls;
    calls
}

/// Op 7: a request and its response buffer, two descriptors, made available.
fn well_formed(mem: &Mem, r: &Rings, d: &[u8]) {
    let slot = u16::from(d[0] % 32);
    let raw = u32::from_le_bytes([d[3], d[4], d[5], d[6]]);
    let addr = match d[2] % 3 {
        0 => REGION + u64::from(raw) * BLOCK,
        1 => REGION + u64::from(raw) * 4096,
        _ => u64::from(raw) << 32 | u64::from(raw),
    };
    let at = DATA_BASE + u64::from(slot) * 64;
    let mut req = [0u8; 24];
    req[0..2].copy_from_slice(&u16::from(d[1] % 5).to_le_bytes());
    req[8..16].copy_from_slice(&addr.to_le_bytes());
    req[16..18].copy_from_slice(&d[7..9]);
    let _ = mem.write_slice(&req, GuestAddress(at));
    let desc = |i: u16, addr: u64, len: u32, flags: u16, next: u16| {
        let mut raw = [0u8; 16];
        raw[0..8].copy_from_slice(&addr.to_le_bytes());
        raw[8..12].copy_from_slice(&len.to_le_bytes());
        raw[12..14].copy_from_slice(&flags.to_le_bytes());
        raw[14..16].copy_from_slice(&next.to_le_bytes());
        let _ = mem.write_slice(&raw, r.desc(i));
    };
    let (h, n) = (2 * slot % r.size, (2 * slot + 1) % r.size);
    desc(h, at, 24, 1, n);
    desc(n, at + 32, 10, 2, 0);
    push_avail(mem, r, h);
}
