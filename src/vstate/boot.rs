//! How the built-in firmware is started: the low guest memory layout (GDT,
//! boot-info block, command line, firmware image, stacks, page tables), the
//! identity page tables with 2 MiB pages (plus the virtio-mmio window,
//! uncached), and each vCPU's long-mode registers at CPL3.
//!
//! CPL3 because on PVM hosts (paging-based KVM, no VMX/SVM) every instruction
//! a guest runs at CPL0 is emulated, about 1,000x slower, while CPL3 code
//! runs natively; the firmware only needs port I/O (IOPL 3). The same state
//! works on VMX/SVM hosts.

use kvm_bindings::{kvm_regs, kvm_segment, kvm_sregs};
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend};

use crate::memory::layout::MMIO_GAP_START;

/// The firmware image, assembled from `firmware/firmware.S` by `build.rs`.
pub static FIRMWARE: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/firmware.bin"));

/// Guest address of the GDT.
pub const GDT_ADDR: u64 = 0x500;
/// Guest address of the boot-info block (layout in `firmware/firmware.S`).
pub const BOOT_INFO_ADDR: u64 = 0x7000;
/// Guest address of the command line.
pub const CMDLINE_ADDR: u64 = 0x8000;
/// Room for the command line (NUL included).
pub const CMDLINE_MAX: usize = 0x8000;
/// Where the firmware is loaded and entered.
pub const FW_LOAD_ADDR: u64 = 0x10000;
/// Most bytes of firmware image.
pub const FW_MAX: usize = 0xf0000;
/// Base of the per-vCPU stacks (vCPU `i` gets the 4 KiB page `i`).
pub const STACKS_ADDR: u64 = 0x10_0000;
/// Bytes of stack per vCPU.
pub const STACK_BYTES: u64 = 0x1000;
/// Start of the page tables (PML4, then PDPTs, then page directories).
pub const PAGE_TABLES_ADDR: u64 = 0x20_0000;
/// Most RAM regions the boot-info block lists.
pub const MAX_BOOT_REGIONS: usize = 8;
/// Start of the guest-physical window of virtio-mmio devices the firmware
/// probes (Firecracker's: 4 KiB devices from 0xC000_1000, in the MMIO gap).
pub const MMIO_WINDOW_START: u64 = MMIO_GAP_START;
/// End of that window (exclusive).
pub const MMIO_WINDOW_END: u64 = MMIO_WINDOW_START + 0x10_0000;
// The firmware and the tests expect the window in one 2 MiB page.
const _: () =
    assert!(MMIO_WINDOW_START % TWO_MIB + (MMIO_WINDOW_END - MMIO_WINDOW_START) <= TWO_MIB);

const GIB: u64 = 1 << 30;
const TWO_MIB: u64 = 2 << 20;
const PAGE: u64 = 4096;

/// GDT entries: null; 64-bit code DPL0 (0x08, and again at 0x10); data DPL0
/// (0x18); busy 64-bit TSS (0x20); 64-bit code DPL3 (0x28, selector 0x2b);
/// data DPL3 (0x30, selector 0x33).
const GDT: [u64; 7] = [
    0,
    0x00af_9b00_0000_ffff,
    0x00af_9b00_0000_ffff,
    0x00cf_9300_0000_ffff,
    0x008f_8b00_0000_ffff,
    0x00af_fb00_0000_ffff,
    0x00cf_f300_0000_ffff,
];
const TSS_SELECTOR: u16 = 0x20;
const USER_CS: u16 = 0x2b;
const USER_DS: u16 = 0x33;

const MAGIC: u32 = u32::from_le_bytes(*b"TVMB");

// Control-register and EFER bits of 64-bit entry, for the firmware here and
// for Linux in `linux::cpu`.
pub(crate) const CR0_PE: u64 = 1;
pub(crate) const CR0_ET: u64 = 1 << 4;
pub(crate) const CR0_PG: u64 = 1 << 31;
pub(crate) const CR4_PAE: u64 = 1 << 5;
pub(crate) const EFER_LME: u64 = 1 << 8;
pub(crate) const EFER_LMA: u64 = 1 << 10;
/// Reserved bit 1, IOPL 3 (so `out` works at CPL3), IF clear.
const RFLAGS_CPL3_IOPL3: u64 = 0x3002;
/// Present, writable, user.
const PTE_TABLE: u64 = 0x7;
/// Present, writable, user, 2 MiB page.
const PTE_2M: u64 = 0x87;
/// Present, writable, user, write-through, cache disabled, 2 MiB page: the
/// MMIO window (PAT entry 3, uncached).
const PTE_2M_UNCACHED: u64 = 0x9f;

/// Errors of writing the boot state into guest memory.
#[derive(Debug, thiserror::Error)]
pub enum BootError {
    /// Writing into guest memory failed.
    #[error("cannot write {what} at guest address {addr:#x}: {source}")]
    GuestWrite {
        /// What was being written.
        what: &'static str,
        /// Where.
        addr: u64,
        /// vm-memory's error.
        source: vm_memory::GuestMemoryError,
    },
    /// The command line does not fit.
    #[error("the command line is {0} bytes; at most {max} fit", max = CMDLINE_MAX - 1)]
    CmdlineTooLong(usize),
    /// Too many vCPUs for the stack area.
    #[error("{0} vCPUs do not fit the firmware's stack area")]
    TooManyVcpus(usize),
    /// The guest has too little RAM for the firmware's own pages.
    #[error(
        "the guest needs more than {0} MiB of RAM below 3 GiB for the firmware and page tables"
    )]
    TooLittleMemory(u64),
    /// Too many RAM regions for the boot-info block.
    #[error("{0} RAM regions; the boot-info block holds {MAX_BOOT_REGIONS}")]
    TooManyRegions(usize),
}

/// Where the boot state went, for setting up the vCPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BootLayout {
    /// Guest address of the PML4 (CR3).
    pub pml4: u64,
    /// First byte past the firmware's own pages: the firmware touches RAM only above it.
    pub fw_end: u64,
    /// Entry point.
    pub entry: u64,
}

/// Page directories (one per GiB, from 0) for RAM up to `top` and the MMIO
/// window; the directories of gigabytes between the two stay unused.
fn page_directories(top: u64) -> u64 {
    top.div_ceil(GIB).max(MMIO_WINDOW_END.div_ceil(GIB))
}

/// Bytes of page tables needed to identity-map `[0, top)` and the MMIO
/// window with 2 MiB pages.
pub fn page_table_bytes(top: u64) -> u64 {
    let pds = page_directories(top);
    let pdpts = pds.div_ceil(512);
    (1 + pdpts + pds) * PAGE
}

/// Writes the GDT, page tables, boot-info block, command line and firmware
/// into guest memory. `regions` are the guest RAM regions `(address, bytes)`
/// in ascending order; the first must start at 0.
pub fn write_boot_state<M: GuestMemoryBackend>(
    mem: &M,
    regions: &[(u64, u64)],
    vcpu_count: usize,
    mem_mib: u64,
    cmdline: &str,
) -> Result<BootLayout, BootError> {
    if cmdline.len() >= CMDLINE_MAX {
        return Err(BootError::CmdlineTooLong(cmdline.len()));
    }
    if STACKS_ADDR + vcpu_count as u64 * STACK_BYTES > PAGE_TABLES_ADDR {
        return Err(BootError::TooManyVcpus(vcpu_count));
    }
    if regions.len() > MAX_BOOT_REGIONS {
        return Err(BootError::TooManyRegions(regions.len()));
    }
    let top = regions.iter().map(|(a, l)| a + l).max().unwrap_or(0);
    let fw_end = (PAGE_TABLES_ADDR + page_table_bytes(top)).next_multiple_of(TWO_MIB);
    let low = regions
        .first()
        .map_or(0, |&(a, l)| if a == 0 { l } else { 0 });
    if fw_end > low {
        return Err(BootError::TooLittleMemory(fw_end >> 20));
    }
    let write = |what: &'static str, addr: u64, bytes: &[u8]| {
        mem.write_slice(bytes, GuestAddress(addr))
            .map_err(|source| BootError::GuestWrite { what, addr, source })
    };

    let gdt: Vec<u8> = GDT.iter().flat_map(|e| e.to_le_bytes()).collect();
    write("the GDT", GDT_ADDR, &gdt)?;

    // Page tables: PML4 | PDPTs | PDs, identity-mapping [0, top) with 2 MiB
    // pages, and the MMIO window uncached. Directory `i` maps GiB `i`; those
    // of gigabytes with neither RAM nor the window are left unused.
    let ram_pds = top.div_ceil(GIB);
    let pds = page_directories(top);
    let pdpts = pds.div_ceil(512);
    let window_pds = MMIO_WINDOW_START / GIB..MMIO_WINDOW_END.div_ceil(GIB);
    let pml4 = PAGE_TABLES_ADDR;
    let pdpt_base = pml4 + PAGE;
    let pd_base = pdpt_base + pdpts * PAGE;
    let pml4_entries: Vec<u8> = (0..pdpts)
        .flat_map(|i| ((pdpt_base + i * PAGE) | PTE_TABLE).to_le_bytes())
        .collect();
    write("the PML4", pml4, &pml4_entries)?;
    let pdpt_entries: Vec<u8> = (0..pds)
        .map(|i| {
            if i < ram_pds || window_pds.contains(&i) {
                (pd_base + i * PAGE) | PTE_TABLE
            } else {
                0
            }
        })
        .flat_map(u64::to_le_bytes)
        .collect();
    write("the PDPTs", pdpt_base, &pdpt_entries)?;
    // The directories in pieces of 64 (256 KiB of entries), so a 64 TiB guest
    // does not build 256 MiB of entries in one vector.
    let mut pd = 0;
    while pd < ram_pds {
        let n = (ram_pds - pd).min(64);
        let entries: Vec<u8> = (pd * 512..(pd + n) * 512)
            .flat_map(|i| ((i * TWO_MIB) | PTE_2M).to_le_bytes())
            .collect();
        write("the page directories", pd_base + pd * PAGE, &entries)?;
        pd += n;
    }
    // The window's directories: a fresh one where no RAM shares its GiB;
    // where RAM does (a guest above 4 GiB maps the gap too), only the
    // window's entries change.
    for i in window_pds {
        if i >= ram_pds {
            write(
                "the page directories",
                pd_base + i * PAGE,
                &[0; PAGE as usize],
            )?;
        }
    }
    let mut page = MMIO_WINDOW_START & !(TWO_MIB - 1);
    while page < MMIO_WINDOW_END {
        let entry = pd_base + (page / GIB) * PAGE + (page % GIB) / TWO_MIB * 8;
        write(
            "the MMIO window's page table entry",
            entry,
            &(page | PTE_2M_UNCACHED).to_le_bytes(),
        )?;
        page += TWO_MIB;
    }

    let mut info = Vec::with_capacity(48 + 16 * MAX_BOOT_REGIONS);
    info.extend(MAGIC.to_le_bytes());
    info.extend((vcpu_count as u32).to_le_bytes());
    info.extend(mem_mib.to_le_bytes());
    info.extend(CMDLINE_ADDR.to_le_bytes());
    info.extend((cmdline.len() as u64).to_le_bytes());
    info.extend(fw_end.to_le_bytes());
    info.extend((regions.len() as u32).to_le_bytes());
    info.extend(0u32.to_le_bytes());
    for (addr, len) in regions {
        info.extend(addr.to_le_bytes());
        info.extend(len.to_le_bytes());
    }
    write("the boot-info block", BOOT_INFO_ADDR, &info)?;
    let mut line = cmdline.as_bytes().to_vec();
    line.push(0);
    write("the command line", CMDLINE_ADDR, &line)?;
    write("the firmware", FW_LOAD_ADDR, FIRMWARE)?;
    Ok(BootLayout {
        pml4,
        fw_end,
        entry: FW_LOAD_ADDR,
    })
}

/// A flat, present code or data segment (base 0, 4 KiB granularity) at
/// privilege `dpl`, 64-bit when `long`; `limit` as KVM takes it.
pub(crate) fn flat_segment(
    selector: u16,
    type_: u8,
    dpl: u8,
    long: bool,
    limit: u32,
) -> kvm_segment {
    kvm_segment {
        base: 0,
        limit,
        selector,
        type_,
        present: 1,
        dpl,
        db: u8::from(!long),
        s: 1,
        l: u8::from(long),
        g: 1,
        avl: 0,
        unusable: 0,
        padding: 0,
    }
}

/// Sets CS, the five data segments (DS, ES, FS, GS, SS: all `data`) and
/// a busy TSS in TR (`selector`, `limit`, granularity `g`) in `sregs`.
pub(crate) fn set_segments(
    sregs: &mut kvm_sregs,
    cs: kvm_segment,
    data: kvm_segment,
    (selector, limit, g): (u16, u32, u8),
) {
    sregs.cs = cs;
    sregs.ds = data;
    sregs.es = data;
    sregs.fs = data;
    sregs.gs = data;
    sregs.ss = data;
    sregs.tr = kvm_segment {
        selector,
        type_: 0xb,
        present: 1,
        limit,
        g,
        ..Default::default()
    };
}

/// Sets long mode, paging and CPL3 segments in `sregs` (read from the vCPU,
/// so the fields this does not own keep KVM's values).
pub fn setup_sregs(sregs: &mut kvm_sregs, layout: &BootLayout) {
    set_segments(
        sregs,
        flat_segment(USER_CS, 0xb, 3, true, 0xffff_ffff),
        flat_segment(USER_DS, 0x3, 3, false, 0xffff_ffff),
        (TSS_SELECTOR, 0xffff, 0),
    );
    sregs.ldt = kvm_segment {
        unusable: 1,
        ..Default::default()
    };
    sregs.gdt.base = GDT_ADDR;
    sregs.gdt.limit = (GDT.len() * 8 - 1) as u16;
    sregs.idt.base = 0;
    sregs.idt.limit = 0;
    sregs.cr0 = CR0_PG | CR0_ET | CR0_PE;
    sregs.cr3 = layout.pml4;
    sregs.cr4 = CR4_PAE;
    sregs.efer = EFER_LME | EFER_LMA;
}

/// The general registers vCPU `index` starts with.
pub fn initial_regs(index: usize, layout: &BootLayout) -> kvm_regs {
    kvm_regs {
        rip: layout.entry,
        rsp: STACKS_ADDR + (index as u64 + 1) * STACK_BYTES,
        rflags: RFLAGS_CPL3_IOPL3,
        rdi: index as u64,
        rsi: BOOT_INFO_ADDR,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::GuestMemoryMmap;

    fn mem(bytes: u64) -> GuestMemoryMmap {
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), bytes as usize)]).unwrap()
    }

    fn read_u64(m: &GuestMemoryMmap, addr: u64) -> u64 {
        m.read_obj(GuestAddress(addr)).unwrap()
    }

    #[test]
    fn firmware_is_embedded() {
        assert!(FIRMWARE.len() > 64 && FIRMWARE.len() < FW_MAX);
    }

    #[test]
    fn identity_maps_with_2m_user_pages() {
        let m = mem(64 << 20);
        let l = write_boot_state(&m, &[(0, 64 << 20)], 2, 64, "touch=all").unwrap();
        assert_eq!(l.pml4, PAGE_TABLES_ADDR);
        assert_eq!(l.fw_end, 4 << 20);
        let pdpt = read_u64(&m, l.pml4) & !0xfff;
        let pd = read_u64(&m, pdpt) & !0xfff;
        for i in 0..32u64 {
            assert_eq!(read_u64(&m, pd + i * 8), (i * TWO_MIB) | PTE_2M);
        }
        assert_eq!(read_u64(&m, l.pml4) & 0xfff, PTE_TABLE);
    }

    #[test]
    fn page_tables_cover_a_terabyte() {
        // 1 TiB of RAM plus the gap: 1025 directories and 3 PDPTs.
        let top = (1u64 << 40) + GIB;
        assert_eq!(page_table_bytes(top), (1 + 3 + 1025) * PAGE);
        // A small guest: its RAM's directory, two unused ones, the window's.
        assert_eq!(page_table_bytes(64 << 20), (1 + 1 + 4) * PAGE);
    }

    /// Follows the page tables at `pml4` to the entry mapping `addr`: the
    /// flags of the PML4, PDPT and PD entries, and the PD entry itself.
    fn walk(m: &GuestMemoryMmap, pml4: u64, addr: u64) -> ([u64; 2], u64) {
        let e4 = read_u64(m, pml4 + ((addr >> 39) & 511) * 8);
        let e3 = read_u64(m, (e4 & !0xfff) + ((addr >> 30) & 511) * 8);
        let e2 = read_u64(m, (e3 & !0xfff) + ((addr >> 21) & 511) * 8);
        ([e4 & 0xfff, e3 & 0xfff], e2)
    }

    #[test]
    fn the_mmio_window_is_mapped_uncached_for_cpl3() {
        // A small guest: the window's GiB has no RAM.
        let m = mem(64 << 20);
        let l = write_boot_state(&m, &[(0, 64 << 20)], 1, 64, "").unwrap();
        let (upper, pde) = walk(&m, l.pml4, MMIO_WINDOW_START);
        assert_eq!(upper, [PTE_TABLE, PTE_TABLE]);
        assert_eq!(pde, MMIO_WINDOW_START | PTE_2M_UNCACHED);
        // User, present, writable, PWT and PCD, a 2 MiB page.
        assert_eq!(pde & 0x9f, 0x9f);
        // The rest of that directory maps nothing, nor do the GiBs between
        // RAM and the window.
        let pdpt = read_u64(&m, l.pml4) & !0xfff;
        let pd3 = read_u64(&m, pdpt + 3 * 8) & !0xfff;
        for i in 1..512 {
            assert_eq!(read_u64(&m, pd3 + i * 8), 0);
        }
        assert_eq!(read_u64(&m, pdpt + 8), 0);
        assert_eq!(read_u64(&m, pdpt + 16), 0);
        // RAM is still mapped as before, and the tables end below fw_end.
        assert_eq!(walk(&m, l.pml4, 0x20_0000).1, 0x20_0000 | PTE_2M);
        assert!(PAGE_TABLES_ADDR + page_table_bytes(64 << 20) <= l.fw_end);

        // A guest above 4 GiB maps the gap as RAM pages; the window's entry
        // becomes uncached, its neighbours stay.
        let regions = [(0, 3 * GIB), (4 * GIB, 64 << 20)];
        let m = GuestMemoryMmap::from_ranges(&[
            (GuestAddress(0), 3 * GIB as usize),
            (GuestAddress(4 * GIB), 64 << 20),
        ])
        .unwrap();
        let l = write_boot_state(&m, &regions, 1, 3136, "").unwrap();
        let (upper, pde) = walk(&m, l.pml4, MMIO_WINDOW_START + 0x1000);
        assert_eq!(upper, [PTE_TABLE, PTE_TABLE]);
        assert_eq!(pde, MMIO_WINDOW_START | PTE_2M_UNCACHED);
        let next = MMIO_WINDOW_START + TWO_MIB;
        assert_eq!(walk(&m, l.pml4, next).1, next | PTE_2M);
        assert_eq!(walk(&m, l.pml4, 4 * GIB).1, (4 * GIB) | PTE_2M);
        let below = MMIO_WINDOW_START - TWO_MIB;
        assert_eq!(walk(&m, l.pml4, below).1, below | PTE_2M);
    }

    #[test]
    fn boot_info_and_cmdline() {
        let m = mem(64 << 20);
        let l = write_boot_state(&m, &[(0, 64 << 20)], 3, 64, "then=reset").unwrap();
        let magic: u32 = m.read_obj(GuestAddress(BOOT_INFO_ADDR)).unwrap();
        assert_eq!(magic, MAGIC);
        let vcpus: u32 = m.read_obj(GuestAddress(BOOT_INFO_ADDR + 4)).unwrap();
        assert_eq!(vcpus, 3);
        assert_eq!(read_u64(&m, BOOT_INFO_ADDR + 8), 64);
        assert_eq!(read_u64(&m, BOOT_INFO_ADDR + 24), 10);
        assert_eq!(read_u64(&m, BOOT_INFO_ADDR + 32), l.fw_end);
        assert_eq!(read_u64(&m, BOOT_INFO_ADDR + 48), 0);
        assert_eq!(read_u64(&m, BOOT_INFO_ADDR + 56), 64 << 20);
        let mut line = [0u8; 11];
        m.read_slice(&mut line, GuestAddress(CMDLINE_ADDR)).unwrap();
        assert_eq!(&line, b"then=reset\0");
        let mut fw = vec![0u8; FIRMWARE.len()];
        m.read_slice(&mut fw, GuestAddress(FW_LOAD_ADDR)).unwrap();
        assert_eq!(fw, FIRMWARE);
    }

    #[test]
    fn refuses_what_does_not_fit() {
        let m = mem(64 << 20);
        let long = "x".repeat(CMDLINE_MAX);
        assert!(matches!(
            write_boot_state(&m, &[(0, 64 << 20)], 1, 64, &long),
            Err(BootError::CmdlineTooLong(_))
        ));
        assert!(matches!(
            write_boot_state(&m, &[(0, 64 << 20)], 300, 64, ""),
            Err(BootError::TooManyVcpus(300))
        ));
        let small = mem(2 << 20);
        assert!(matches!(
            write_boot_state(&small, &[(0, 2 << 20)], 1, 2, ""),
            Err(BootError::TooLittleMemory(_))
        ));
    }

    #[test]
    fn registers_enter_at_cpl3() {
        let l = BootLayout {
            pml4: PAGE_TABLES_ADDR,
            fw_end: 4 << 20,
            entry: FW_LOAD_ADDR,
        };
        let mut s = kvm_sregs::default();
        setup_sregs(&mut s, &l);
        assert_eq!(s.cs.selector & 3, 3);
        assert_eq!(s.cs.dpl, 3);
        assert_eq!(s.cs.l, 1);
        assert_eq!(s.ss.selector, USER_DS);
        assert_eq!(s.cr3, PAGE_TABLES_ADDR);
        assert_eq!(s.efer, 0x500);
        assert_eq!(s.cr0, 0x8000_0011);
        // The selectors index the descriptors with the same DPL.
        assert_eq!((GDT[(USER_CS >> 3) as usize] >> 45) & 3, 3);
        assert_eq!((GDT[(USER_DS >> 3) as usize] >> 45) & 3, 3);
        let r = initial_regs(1, &l);
        assert_eq!(r.rsp, STACKS_ADDR + 2 * STACK_BYTES);
        assert_eq!(r.rdi, 1);
        assert_eq!((r.rflags >> 12) & 3, 3);
    }
}
