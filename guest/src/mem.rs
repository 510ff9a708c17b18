//! What the VMM told the guest (the PVH `hvm_start_info`: command line and
//! memory map), the identity map of RAM above 4 GiB, and `touch=`.

use core::ptr::{addr_of, addr_of_mut, read_volatile, write_volatile};

use crate::boot;

/// `hvm_start_info.magic`.
const START_INFO_MAGIC: u32 = 0x336e_c578;
/// `hvm_memmap_table_entry.type` of RAM.
const E820_RAM: u32 = 1;
/// Most RAM ranges kept.
pub const MAX_RANGES: usize = 16;

/// One RAM range `[start, end)`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Range {
    /// First byte.
    pub start: u64,
    /// One past the last byte.
    pub end: u64,
}

/// The boot information.
pub struct BootInfo {
    /// The command line (empty if none, or not UTF-8).
    pub cmdline: &'static str,
    /// RAM, in the memory map's order.
    pub ram: [Range; MAX_RANGES],
    /// Entries of `ram` used.
    pub nram: usize,
}

impl BootInfo {
    /// All RAM, in MiB.
    pub fn ram_mib(&self) -> u64 {
        self.ram[..self.nram]
            .iter()
            .map(|r| r.end - r.start)
            .sum::<u64>()
            >> 20
    }
}

fn rd32(addr: u64) -> u32 {
    // SAFETY: the VMM wrote the block at addr, in RAM, identity-mapped.
    unsafe { read_volatile(addr as *const u32) }
}

fn rd64(addr: u64) -> u64 {
    // SAFETY: as for rd32.
    unsafe { read_volatile(addr as *const u64) }
}

/// Reads `hvm_start_info` at `addr` (EBX at the PVH entry). `None` if the
/// magic is wrong.
pub fn boot_info(addr: u64) -> Option<BootInfo> {
    if addr == 0 || rd32(addr) != START_INFO_MAGIC {
        return None;
    }
    let cmdline_paddr = rd64(addr + 24);
    let cmdline = if cmdline_paddr == 0 {
        ""
    } else {
        let mut len = 0;
        // SAFETY: a NUL-terminated string the VMM wrote into RAM.
        while len < 64 * 1024 && unsafe { read_volatile((cmdline_paddr + len) as *const u8) } != 0 {
            len += 1;
        }
        // SAFETY: len bytes at cmdline_paddr were just read; the VMM does
        // not write them again.
        let bytes =
            unsafe { core::slice::from_raw_parts(cmdline_paddr as *const u8, len as usize) };
        core::str::from_utf8(bytes).unwrap_or("")
    };
    let version = rd32(addr + 4);
    let mut info = BootInfo {
        cmdline,
        ram: [Range::default(); MAX_RANGES],
        nram: 0,
    };
    if version >= 1 {
        let map = rd64(addr + 40);
        let entries = rd32(addr + 48);
        for i in 0..u64::from(entries) {
            let e = map + i * 24;
            let (start, size, kind) = (rd64(e), rd64(e + 8), rd32(e + 16));
            if kind == E820_RAM && size != 0 && info.nram < MAX_RANGES {
                info.ram[info.nram] = Range {
                    start,
                    end: start + size,
                };
                info.nram += 1;
            }
        }
    }
    Some(info)
}

const PRESENT_RW_USER: u64 = 0x7;
const HUGE: u64 = 0x80;
const GIB: u64 = 1 << 30;
const TWO_MIB: u64 = 2 << 20;
/// Page-table pages for RAM above 4 GiB: a page directory maps 1 GiB, a
/// PDPT is one per 512 GiB. Never 1 GiB pages: on a PVM host CPUID at
/// CPL3 may run on the host CPU and offer them while the KVM the guest
/// runs on does not (the PS bit is then reserved: a triple fault).
const POOL_PAGES: usize = 256;

#[repr(C, align(4096))]
struct Pool([[u64; 512]; POOL_PAGES]);

static mut POOL: Pool = Pool([[0; 512]; POOL_PAGES]);
static mut POOL_USED: usize = 0;

fn pool_page() -> Option<*mut u64> {
    // SAFETY: one vCPU; the pool is only touched here.
    unsafe {
        let used = POOL_USED;
        if used == POOL_PAGES {
            return None;
        }
        POOL_USED = used + 1;
        Some(addr_of_mut!(POOL.0[used]) as *mut u64)
    }
}

/// Maps the RAM above 4 GiB into the identity map (2 MiB pages). Returns the highest address mapped; RAM
/// beyond it (past what the pool's pages can map) is left out.
pub fn map_high(info: &BootInfo) -> u64 {
    let mut top = 4 * GIB;
    for r in &info.ram[..info.nram] {
        let mut at = r.start.max(4 * GIB) & !(GIB - 1);
        while at < r.end {
            if !map_gib(at) {
                return top;
            }
            at += GIB;
            top = top.max(at.min(r.end));
        }
    }
    top
}

/// Maps `[start, end)` (at or above 4 GiB: a virtio-mem region above RAM)
/// into the identity map as [`map_high`] maps RAM, whole GiBs at a time.
/// False if the pool's pages ran out or the range begins below 4 GiB.
pub fn map_range(start: u64, end: u64) -> bool {
    if start < 4 * GIB {
        return false;
    }
    let mut at = start & !(GIB - 1);
    while at < end {
        if !map_gib(at) {
            return false;
        }
        at += GIB;
    }
    true
}

/// Maps the GiB at `at` (4 GiB or above).
fn map_gib(at: u64) -> bool {
    let l4 = (at >> 39) as usize & 511;
    let l3 = (at >> 30) as usize & 511;
    // SAFETY: the page tables are in the image and user-writable; entries
    // are only added (not-present ones are never cached, so no flush).
    unsafe {
        let pml4 = addr_of_mut!(boot::pml4) as *mut u64;
        let mut e4 = read_volatile(pml4.add(l4));
        if e4 & 1 == 0 {
            let Some(page) = pool_page() else {
                return false;
            };
            e4 = page as u64 | PRESENT_RW_USER;
            write_volatile(pml4.add(l4), e4);
        }
        let pdpt = (e4 & !0xfff) as *mut u64;
        if read_volatile(pdpt.add(l3)) & 1 != 0 {
            return true;
        }
        let Some(pd) = pool_page() else { return false };
        for i in 0..512u64 {
            write_volatile(
                pd.add(i as usize),
                (at + i * TWO_MIB) | PRESENT_RW_USER | HUGE,
            );
        }
        write_volatile(pdpt.add(l3), pd as u64 | PRESENT_RW_USER);
    }
    true
}

/// The first byte the guest does not own.
pub fn guest_end() -> u64 {
    addr_of!(boot::_guest_end) as u64
}

/// The RAM `touch=` may use, in order: every range above the guest's end,
/// up to `mapped`.
pub fn touchable(info: &BootInfo, mapped: u64) -> impl Iterator<Item = Range> + '_ {
    let low = guest_end();
    info.ram[..info.nram].iter().filter_map(move |r| {
        let start = r.start.max(low);
        let end = r.end.min(mapped);
        (start < end).then_some(Range { start, end })
    })
}

/// What [`check_touched`] found.
#[derive(Clone, Copy, Debug, Default)]
pub struct Check {
    /// Pages that no longer hold what [`touch`] wrote.
    pub bad: u64,
    /// Pages read.
    pub pages: u64,
    /// The guest physical address of the first of the bad pages.
    pub first_bad: Option<u64>,
}

/// Re-reads the first `bytes` of the touchable RAM that [`touch`] wrote:
/// each page must still hold its own guest physical address in its first
/// word (so a page zeroed, lost or swapped with another is caught).
pub fn check_touched(info: &BootInfo, mapped: u64, bytes: u64) -> Check {
    let mut check = Check::default();
    let mut left = bytes;
    for r in touchable(info, mapped) {
        let n = (r.end - r.start).min(left) & !0xfff;
        let mut p = r.start;
        while p < r.start + n {
            // SAFETY: the page `touch` wrote, identity-mapped.
            if unsafe { read_volatile(p as *const u64) } != p {
                check.bad += 1;
                check.first_bad.get_or_insert(p);
            }
            check.pages += 1;
            p += 4096;
        }
        left -= n;
        if left == 0 {
            break;
        }
    }
    check
}

/// Dirties `bytes` of the touchable RAM, one write per 4 KiB page, and
/// returns how many bytes it touched.
pub fn touch(info: &BootInfo, mapped: u64, bytes: u64) -> u64 {
    let mut left = bytes;
    for r in touchable(info, mapped) {
        let n = (r.end - r.start).min(left) & !0xfff;
        let mut p = r.start;
        while p < r.start + n {
            // SAFETY: RAM the guest does not otherwise use, identity-mapped.
            unsafe { write_volatile(p as *mut u64, p) };
            p += 4096;
        }
        left -= n;
        if left == 0 {
            break;
        }
    }
    bytes - left
}
