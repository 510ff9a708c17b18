//! What the device fuzz harnesses share: a driver that writes rings into
//! test memory from fuzz bytes. One queue's rings lie at `base` (the
//! descriptor table), `base + 4 KiB` (avail) and `base + 8 KiB` (used); a
//! guest address comes from a selector byte and 32 bits, landing in low
//! RAM, high RAM, the hole between them, or anywhere.
//!
//! [`WriteCheck`] checks that a device writes guest memory only where the
//! driver let it (the used rings, and buffers a descriptor marks
//! device-writable). It looks only at what was written: the memory's dirty
//! bitmap (vm-memory marks every page a write through it touches; the
//! devices reach guest memory only through vm-memory) names the pages, and
//! only those are compared with the harness's copy, so a check costs a few
//! pages, not all of guest memory.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use virtio_queue::{Queue, QueueT};
use vm_memory::bitmap::AtomicBitmap;
use vm_memory::{
    Address, Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion,
};

use teravm::devices::virtio::{VirtioInterrupt, VirtioInterruptType};

/// The harnesses' guest memory, with a dirty bitmap.
pub type Mem = Arc<GuestMemoryMmap<AtomicBitmap>>;

/// Guest memory of two RAM regions (zeroed), as `layout` says.
pub fn memory(layout: &Layout) -> Mem {
    Arc::new(
        GuestMemoryMmap::from_ranges(&[
            (GuestAddress(0), layout.low_len as usize),
            (GuestAddress(layout.high), layout.high_len as usize),
        ])
        .expect("fuzz guest memory"),
    )
}

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

/// The dirty bitmap's page.
const PAGE: u64 = 4096;

/// Checks what a device writes into guest memory (see the module doc).
#[derive(Default)]
pub struct WriteCheck {
    /// Pages as the harness last saw them; a page not here was never
    /// written, so it holds zeros.
    shadow: HashMap<u64, Box<[u8; PAGE as usize]>>,
    /// Ranges the device may write, kept until a reset: the device may hold
    /// chains whose descriptors the driver has since rewritten.
    allowed: HashSet<(u64, u64)>,
    /// The used rings (the device may write them too).
    used: HashSet<(u64, u64)>,
    /// The pages the last scan of the descriptors read (the table and the
    /// indirect tables it named): the scan is done again only when one of
    /// them was written since.
    scanned: HashSet<u64>,
    /// Whether one of [`Self::scanned`] was written since the last scan.
    stale: bool,
    /// The descriptor table as the last scan read it: a descriptor that did
    /// not change adds nothing new.
    last_table: Vec<u8>,
    /// A page's worth of scratch.
    scratch: Vec<u8>,
}

impl WriteCheck {
    /// Takes the pages written since the last call (by the harness, when
    /// called before the device runs) into the copy; with `check`, first
    /// asserts that every byte that changed in them is allowed.
    fn sync(&mut self, mem: &Mem, check: bool) {
        for region in mem.iter() {
            let base = region.start_addr().0;
            let words = std::ops::Deref::deref(region).bitmap().get_and_reset();
            for (w, mut bits) in words.into_iter().enumerate() {
                while bits != 0 {
                    let p = (w as u64 * 64 + u64::from(bits.trailing_zeros())) * PAGE;
                    bits &= bits - 1;
                    if p < region.len() {
                        self.page_written(mem, base + p, (region.len() - p).min(PAGE), check);
                    }
                }
            }
        }
    }

    fn page_written(&mut self, mem: &Mem, gpa: u64, len: u64, check: bool) {
        let n = len as usize;
        let mut now = std::mem::take(&mut self.scratch);
        now.resize(PAGE as usize, 0);
        mem.read_slice(&mut now[..n], GuestAddress(gpa))
            .expect("a page of RAM");
        if check {
            self.check_page(gpa, &now[..n]);
        }
        self.stale |= self.scanned.contains(&gpa);
        self.shadow
            .entry(gpa)
            .or_insert_with(|| Box::new([0u8; PAGE as usize]))[..n]
            .copy_from_slice(&now[..n]);
        self.scratch = now;
    }

    /// Every byte of the page at `gpa` that differs from the copy lies in
    /// an allowed range: the bytes outside them are compared as slices.
    fn check_page(&self, gpa: u64, now: &[u8]) {
        let zeros = [0u8; PAGE as usize];
        let was: &[u8] = self.shadow.get(&gpa).map_or(&zeros[..], |b| &b[..]);
        let was = &was[..now.len()];
        if was == now {
            return;
        }
        let end = gpa + now.len() as u64;
        let mut ok: Vec<(usize, usize)> = self
            .allowed
            .iter()
            .chain(&self.used)
            .filter_map(|&(a, l)| {
                let (s, e) = (a.max(gpa), a.saturating_add(l).min(end));
                (s < e).then(|| ((s - gpa) as usize, (e - gpa) as usize))
            })
            .collect();
        ok.sort_unstable();
        let mut at = 0usize;
        for (s, e) in ok.into_iter().chain([(now.len(), now.len())]) {
            if s > at && was[at..s] != now[at..s] {
                let i = at + (at..s).position(|i| was[i] != now[i]).unwrap_or(0);
                panic!(
                    "the device wrote {:#x}, outside every writable buffer and used ring",
                    gpa + i as u64
                );
            }
            at = at.max(e);
        }
    }

    /// Before the device runs: takes the harness's own writes into the
    /// copy, and allows the used rings of `rings` and every range a
    /// descriptor of `writable` (or an entry of an indirect table it
    /// names) marks device-writable now.
    pub fn before(&mut self, mem: &Mem, rings: &[Rings], writable: &Rings) {
        self.sync(mem, false);
        if !self.stale && !self.scanned.is_empty() {
            return;
        }
        self.stale = false;
        self.scanned.clear();
        for r in rings {
            self.used.insert((r.used().0, r.used_bytes()));
        }
        let len = u64::from(writable.size) * 16;
        self.note_scanned(writable.base, len);
        let mut table = vec![0u8; len as usize];
        if mem
            .read_slice(&mut table, GuestAddress(writable.base))
            .is_err()
        {
            return;
        }
        for d in table.chunks_exact(16) {
            let (a, l, f) = parse_desc(d);
            if f & 2 != 0 {
                self.allowed.insert((a, u64::from(l)));
            }
            if f & 4 != 0 {
                self.allow_indirect(mem, a, l);
            }
        }
    }

    fn note_scanned(&mut self, at: u64, len: u64) {
        let first = at / PAGE * PAGE;
        let end = at.saturating_add(len.max(1));
        self.scanned.extend((first..end).step_by(PAGE as usize));
    }

    /// The writable entries of the indirect table at `a` of `l` bytes that
    /// a chain can reach: as virtio-queue walks it, from entry 0 along the
    /// `next` links, at most `l / 16` (and 65535) entries. The pages read
    /// are watched: a write to one makes the next call scan again.
    fn allow_indirect(&mut self, mem: &Mem, a: u64, l: u32) {
        let n = (l / 16).min(u32::from(u16::MAX));
        let mut i = 0u32;
        for _ in 0..n {
            let at = a.saturating_add(u64::from(i) * 16);
            let mut d = [0u8; 16];
            self.note_scanned(at, 16);
            if mem.read_slice(&mut d, GuestAddress(at)).is_err() {
                return;
            }
            let (ia, il, iflags) = parse_desc(&d);
            if iflags & 2 != 0 {
                self.allowed.insert((ia, u64::from(il)));
            }
            let next = u32::from(u16::from_le_bytes([d[14], d[15]]));
            if iflags & 1 == 0 || next >= n {
                return;
            }
            i = next;
        }
    }

    /// Whether a buffer the device may write (not counting the used rings)
    /// overlaps `[at, at + len)`: what the device wrote there may be a
    /// frame's bytes, not what it means to publish.
    pub fn buffer_overlaps(&self, at: u64, len: u64) -> bool {
        self.allowed
            .iter()
            .any(|&(a, l)| a < at.saturating_add(len) && at < a.saturating_add(l))
    }

    /// After the device ran: every byte it changed is allowed.
    pub fn after(&mut self, mem: &Mem) {
        self.sync(mem, true);
    }

    /// A reset: nothing is allowed any more.
    pub fn reset(&mut self) {
        self.allowed.clear();
        self.used.clear();
        self.scanned.clear();
        self.last_table.clear();
    }
}

/// (address, length, flags) of a 16-byte descriptor.
fn parse_desc(d: &[u8]) -> (u64, u32, u16) {
    let a = u64::from_le_bytes(d[0..8].try_into().expect("8 bytes"));
    let l = u32::from_le_bytes(d[8..12].try_into().expect("4 bytes"));
    let f = u16::from_le_bytes(d[12..14].try_into().expect("2 bytes"));
    (a, l, f)
}

#[cfg(test)]
mod tests {
    use super::*;

    const LAYOUT: Layout = Layout {
        low_len: 64 * 1024,
        high: 128 * 1024,
        high_len: 64 * 1024,
    };

    /// One queue at 4 KiB whose descriptor 0 lets the device write 16
    /// bytes at 40 KiB; the harness has written elsewhere first.
    fn rig() -> (Mem, Vec<Rings>, WriteCheck) {
        let mem = memory(&LAYOUT);
        let (rings, _) = fresh_queues(&mem, 1, 16, 4096, 0);
        let mut d = [0u8; 16];
        d[0..8].copy_from_slice(&(40u64 * 1024).to_le_bytes());
        d[8..12].copy_from_slice(&16u32.to_le_bytes());
        d[12..14].copy_from_slice(&2u16.to_le_bytes());
        mem.write_slice(&d, rings[0].desc(0)).unwrap();
        mem.write_slice(&[7; 8], GuestAddress(50 * 1024)).unwrap();
        (mem, rings, WriteCheck::default())
    }

    #[test]
    fn writes_into_a_writable_buffer_or_the_used_ring_pass() {
        let (mem, rings, mut c) = rig();
        c.before(&mem, &rings, &rings[0]);
        mem.write_slice(&[1; 16], GuestAddress(40 * 1024)).unwrap();
        mem.write_obj(1u16, rings[0].used().unchecked_add(2))
            .unwrap();
        c.after(&mem);
        // What the harness wrote before is not the device's.
        mem.write_slice(&[9; 8], GuestAddress(50 * 1024)).unwrap();
        c.before(&mem, &rings, &rings[0]);
        c.after(&mem);
    }

    #[test]
    #[should_panic(expected = "the device wrote 0xa010")]
    fn a_write_past_the_buffer_is_caught() {
        let (mem, rings, mut c) = rig();
        c.before(&mem, &rings, &rings[0]);
        mem.write_slice(&[1; 17], GuestAddress(40 * 1024)).unwrap();
        c.after(&mem);
    }

    #[test]
    #[should_panic(expected = "the device wrote 0x20000")]
    fn a_write_on_a_page_never_written_before_is_caught() {
        let (mem, rings, mut c) = rig();
        c.before(&mem, &rings, &rings[0]);
        mem.write_obj(1u8, GuestAddress(LAYOUT.high)).unwrap();
        c.after(&mem);
    }

    #[test]
    #[should_panic(expected = "the device wrote 0xc800")]
    fn a_write_over_what_the_harness_wrote_is_caught() {
        let (mem, rings, mut c) = rig();
        c.before(&mem, &rings, &rings[0]);
        mem.write_obj(1u8, GuestAddress(50 * 1024)).unwrap();
        c.after(&mem);
    }
}
