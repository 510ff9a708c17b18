//! What the device fuzz harnesses share: a driver that writes rings into
//! test memory from fuzz bytes. One queue's rings lie at `base` (the
//! descriptor table), `base + 4 KiB` (avail) and `base + 8 KiB` (used); a
//! guest address comes from a selector byte and 32 bits, landing in low
//! RAM, high RAM, the hole between them, or anywhere.

use std::sync::Arc;

use virtio_queue::{Queue, QueueT};
use vm_memory::{Address, Bytes, GuestAddress, GuestMemoryMmap};

use teravm::devices::virtio::{VirtioInterrupt, VirtioInterruptType};

/// The harnesses' guest memory.
pub type Mem = Arc<GuestMemoryMmap<()>>;

/// An interrupt that goes nowhere.
pub struct NoIrq;

impl VirtioInterrupt for NoIrq {
    fn trigger(&self, _: VirtioInterruptType) -> std::io::Result<()> {
        Ok(())
    }
}

/// One queue's rings in test memory, written as a driver would.
pub struct Rings {
    /// The descriptor table's address.
    pub base: u64,
    /// The queue's size.
    pub size: u16,
}

impl Rings {
    /// Descriptor `i` (modulo the size).
    pub fn desc(&self, i: u16) -> GuestAddress {
        GuestAddress(self.base + u64::from(i % self.size) * 16)
    }
    /// The available ring.
    pub fn avail(&self) -> GuestAddress {
        GuestAddress(self.base + 0x1000)
    }
    /// The used ring.
    pub fn used(&self) -> GuestAddress {
        GuestAddress(self.base + 0x2000)
    }
    /// The used ring's bytes (flags, idx, ring, avail_event).
    pub fn used_bytes(&self) -> u64 {
        6 + 8 * u64::from(self.size)
    }
}

/// `n` ready queues of `size` whose rings start at `base`, `stride` apart,
/// with zeroed avail and used headers.
pub fn fresh_queues(
    mem: &Mem,
    n: usize,
    size: u16,
    base: u64,
    stride: u64,
) -> (Vec<Rings>, Vec<Queue>) {
    let mut rings = Vec::new();
    let mut queues = Vec::new();
    for i in 0..n {
        let r = Rings {
            base: base + i as u64 * stride,
            size,
        };
        let _ = mem.write_slice(&[0u8; 4], r.avail());
        let _ = mem.write_slice(&[0u8; 4], r.used());
        let mut q = Queue::new(256).expect("256 is a valid queue size");
        let _ = q.try_set_size(size);
        let _ = q.try_set_desc_table_address(GuestAddress(r.base));
        let _ = q.try_set_avail_ring_address(r.avail());
        let _ = q.try_set_used_ring_address(r.used());
        q.set_ready(true);
        rings.push(r);
        queues.push(q);
    }
    (rings, queues)
}

/// Test memory's two RAM regions: `[0, low_len)` and `[high, high + high_len)`.
#[derive(Debug, Clone, Copy)]
pub struct Layout {
    /// Bytes of low RAM.
    pub low_len: u64,
    /// Where high RAM begins.
    pub high: u64,
    /// Bytes of high RAM.
    pub high_len: u64,
}

impl Layout {
    /// Maps fuzz bytes to a guest address in low RAM, high RAM, the hole,
    /// or anywhere (`raw << shift`).
    pub fn addr(&self, sel: u8, raw: u32, shift: u32) -> u64 {
        match sel % 4 {
            0 => u64::from(raw) % self.low_len,
            1 => self.high + u64::from(raw) % self.high_len,
            2 => self.low_len + u64::from(raw) % (self.high - self.low_len),
            _ => u64::from(raw) << shift,
        }
    }

    /// Writes descriptor `d[1]` of `r` from 13 fuzz bytes
    /// `[q, index, sel, addr u32, len u32, flags, next]`.
    pub fn write_desc(&self, mem: &Mem, r: &Rings, d: &[u8]) {
        let a = self.addr(d[2], u32::from_le_bytes([d[3], d[4], d[5], d[6]]), 12);
        let mut raw = [0u8; 16];
        raw[0..8].copy_from_slice(&a.to_le_bytes());
        raw[8..12].copy_from_slice(&d[7..11]);
        raw[12..14].copy_from_slice(&u16::from(d[11] & 7).to_le_bytes());
        raw[14..16].copy_from_slice(&u16::from(d[12]).to_le_bytes());
        let _ = mem.write_slice(&raw, r.desc(u16::from(d[1])));
    }
}

/// Makes `head` available on `r` (the next avail slot, then the index).
pub fn push_avail(mem: &Mem, r: &Rings, head: u16) {
    let idx: u16 = mem.read_obj(r.avail().unchecked_add(2)).unwrap_or(0);
    let slot = r.avail().unchecked_add(4 + u64::from(idx % r.size) * 2);
    let _ = mem.write_obj(head, slot);
    let _ = mem.write_obj(idx.wrapping_add(1), r.avail().unchecked_add(2));
}

/// The next `n` bytes of the input, if there are that many.
pub fn take(n: usize, rest: &mut &[u8]) -> Option<Vec<u8>> {
    if rest.len() < n {
        return None;
    }
    let (h, t) = rest.split_at(n);
    *rest = t;
    Some(h.to_vec())
}
