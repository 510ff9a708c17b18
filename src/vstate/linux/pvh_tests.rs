//! The PVH entry: an ELF with a `XEN_ELFNOTE_PHYS32_ENTRY` note is loaded
//! for it (start info, memory map, module list, GDT), the low-memory areas
//! never overlap, and on real KVM only vCPU 0 is runnable.

use super::*;
use linux_loader::loader::elf::start_info::{
    hvm_memmap_table_entry, hvm_modlist_entry, hvm_start_info,
};
use vm_memory::GuestMemoryMmap;

const MIB: u64 = 1 << 20;
/// Where the test ELF's segment lies (physical) and its ELF entry.
const LOAD_ADDR: u64 = 0x100_0000;
/// Its PVH entry: not the ELF entry, so a test sees which was taken.
const PVH_ENTRY: u32 = 0x100_0040;
/// `XEN_ELFNOTE_PHYS32_ENTRY`.
const PHYS32_ENTRY: u32 = 18;

fn mem(bytes: u64) -> GuestMemoryMmap {
    GuestMemoryMmap::from_ranges(&[(GuestAddress(0), bytes as usize)]).unwrap()
}

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("teravm-pvh-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// One ELF note: `name` (NUL added), type, and an 8-byte descriptor.
fn note(name: &[u8], kind: u32, desc: u64) -> Vec<u8> {
    let mut n = Vec::new();
    n.extend_from_slice(&(name.len() as u32 + 1).to_le_bytes());
    n.extend_from_slice(&8u32.to_le_bytes());
    n.extend_from_slice(&kind.to_le_bytes());
    n.extend_from_slice(name);
    n.push(0);
    while n.len() % 4 != 0 {
        n.push(0);
    }
    n.extend_from_slice(&desc.to_le_bytes());
    n
}

/// A minimal x86-64 ELF executable by hand: one PT_LOAD of `code` at
/// physical 16 MiB (the ELF entry) and one PT_NOTE holding `notes`.
fn elf(code: &[u8], notes: &[u8]) -> Vec<u8> {
    let mut b = vec![0u8; 0x1000];
    b[..4].copy_from_slice(b"\x7fELF");
    b[4] = 2; // 64-bit
    b[5] = 1; // little endian
    b[6] = 1; // version
    b[16..18].copy_from_slice(&2u16.to_le_bytes()); // ET_EXEC
    b[18..20].copy_from_slice(&62u16.to_le_bytes()); // x86-64
    b[20..24].copy_from_slice(&1u32.to_le_bytes());
    b[24..32].copy_from_slice(&LOAD_ADDR.to_le_bytes()); // entry
    b[32..40].copy_from_slice(&64u64.to_le_bytes()); // phoff
    b[52..54].copy_from_slice(&64u16.to_le_bytes()); // ehsize
    b[54..56].copy_from_slice(&56u16.to_le_bytes()); // phentsize
    b[56..58].copy_from_slice(&2u16.to_le_bytes()); // phnum
    let ph = 64;
    b[ph..ph + 4].copy_from_slice(&1u32.to_le_bytes()); // PT_LOAD
    b[ph + 4..ph + 8].copy_from_slice(&5u32.to_le_bytes());
    b[ph + 8..ph + 16].copy_from_slice(&0x1000u64.to_le_bytes()); // offset
    b[ph + 16..ph + 24].copy_from_slice(&(0xffff_ffff_8000_0000 | LOAD_ADDR).to_le_bytes());
    b[ph + 24..ph + 32].copy_from_slice(&LOAD_ADDR.to_le_bytes()); // paddr
    b[ph + 32..ph + 40].copy_from_slice(&(code.len() as u64).to_le_bytes());
    b[ph + 40..ph + 48].copy_from_slice(&(code.len() as u64).to_le_bytes());
    b[ph + 48..ph + 56].copy_from_slice(&0x1000u64.to_le_bytes());
    let ph = 64 + 56;
    let note_at = 0x200usize;
    b[ph..ph + 4].copy_from_slice(&4u32.to_le_bytes()); // PT_NOTE
    b[ph + 4..ph + 8].copy_from_slice(&4u32.to_le_bytes());
    b[ph + 8..ph + 16].copy_from_slice(&(note_at as u64).to_le_bytes());
    b[ph + 32..ph + 40].copy_from_slice(&(notes.len() as u64).to_le_bytes());
    b[ph + 40..ph + 48].copy_from_slice(&(notes.len() as u64).to_le_bytes());
    b[ph + 48..ph + 56].copy_from_slice(&4u64.to_le_bytes());
    b[note_at..note_at + notes.len()].copy_from_slice(notes);
    b.extend_from_slice(code);
    b
}

/// The test ELF with a PVH note (after a GNU note, as a real vmlinux has).
fn pvh_elf() -> Vec<u8> {
    let mut notes = note(b"GNU", 3, 0x1234);
    notes.extend(note(b"Xen", PHYS32_ENTRY, u64::from(PVH_ENTRY)));
    elf(&[0xf4; 0x100], &notes)
}

fn spec(kernel: PathBuf, initrd: Option<PathBuf>) -> KernelSpec {
    KernelSpec {
        kernel: ImageFile::open(&kernel).unwrap(),
        initrd: initrd.map(|i| ImageFile::open(&i).unwrap()),
        cmdline: "console=ttyS0 pvh=1".into(),
    }
}

fn read<T: vm_memory::ByteValued>(m: &GuestMemoryMmap, addr: u64) -> T {
    m.read_obj(GuestAddress(addr)).unwrap()
}

#[test]
fn an_elf_with_a_pvh_note_is_entered_there_with_its_start_info() {
    let d = dir("note");
    let k = d.join("vmlinux");
    std::fs::write(&k, pvh_elf()).unwrap();
    let i = d.join("initrd");
    std::fs::write(&i, vec![0x5a; 5000]).unwrap();
    let m = mem(128 * MIB);
    let (entry, map) = load(&m, &spec(k, Some(i)), &[(0, 128 * MIB, 0)], &[], 2).unwrap();
    assert_eq!(entry.protocol, BootProtocol::Pvh);
    assert_eq!(entry.entry, u64::from(PVH_ENTRY));
    assert_eq!(entry.format, KernelFormat::Elf);

    let info: hvm_start_info = read(&m, pvh::START_INFO_ADDR);
    assert_eq!(info.magic, 0x336e_c578);
    assert_eq!(info.version, 1);
    assert_eq!(info.flags, 0);
    // The command line, where teravm wrote it.
    let mut line = vec![0u8; 20];
    m.read_slice(&mut line, GuestAddress(info.cmdline_paddr))
        .unwrap();
    assert_eq!(&line, b"console=ttyS0 pvh=1\0");
    // The ACPI tables, found through the start info as Linux does.
    let mut rsdp = [0u8; 8];
    m.read_slice(&mut rsdp, GuestAddress(info.rsdp_paddr))
        .unwrap();
    assert_eq!(&rsdp, b"RSD PTR ");
    // The memory map is the zero page's e820 map, entry for entry.
    assert_eq!(info.memmap_entries as usize, map.len());
    assert_eq!(map.len(), 4);
    for (n, e) in map.iter().enumerate() {
        let got: hvm_memmap_table_entry = read(&m, info.memmap_paddr + 24 * n as u64);
        assert_eq!(
            (got.addr, got.size, got.type_, got.reserved),
            (e.addr, e.size, e.kind, 0),
            "entry {n}"
        );
    }
    // The initrd is module 0: its bytes are where the entry says.
    assert_eq!(info.nr_modules, 1);
    let module: hvm_modlist_entry = read(&m, info.modlist_paddr);
    assert_eq!(module.size, 5000);
    assert_eq!((module.cmdline_paddr, module.reserved), (0, 0));
    assert_eq!(module.paddr % 4096, 0);
    assert!(module.paddr >= LOAD_ADDR + 0x100 && module.paddr + 5000 <= 128 * MIB);
    let first: u8 = read(&m, module.paddr);
    let last: u8 = read(&m, module.paddr + 4999);
    assert_eq!((first, last), (0x5a, 0x5a));
    // The GDT the PVH segments describe is in guest memory; no zero page.
    for (n, want) in cpu::PVH_GDT.iter().enumerate() {
        let got: u64 = read(&m, cpu::GDT_ADDR + 8 * n as u64);
        assert_eq!(got, *want, "GDT entry {n}");
    }
    let zp: linux_loader::loader::bootparam::boot_params = read(&m, ZERO_PAGE_ADDR);
    assert_eq!({ zp.hdr.header }, 0, "a PVH boot writes no zero page");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn without_an_initrd_there_is_no_module() {
    let d = dir("nomod");
    let k = d.join("vmlinux");
    std::fs::write(&k, pvh_elf()).unwrap();
    let m = mem(64 * MIB);
    let (entry, _) = load(&m, &spec(k, None), &[(0, 64 * MIB, 0)], &[], 1).unwrap();
    assert_eq!(entry.protocol, BootProtocol::Pvh);
    let info: hvm_start_info = read(&m, pvh::START_INFO_ADDR);
    assert_eq!((info.nr_modules, info.modlist_paddr), (0, 0));
    assert_eq!(info.memmap_entries, 4);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn an_elf_without_the_xen_note_keeps_the_64_bit_entry() {
    let d = dir("other");
    let m = mem(64 * MIB);
    // A GNU note of type 18 and a Xen note of another type are not it.
    let notes = [
        note(b"GNU", PHYS32_ENTRY, u64::from(PVH_ENTRY)),
        note(b"Xen", 1, u64::from(PVH_ENTRY)),
    ]
    .concat();
    let k = d.join("vmlinux");
    std::fs::write(&k, elf(&[0xf4; 0x100], &notes)).unwrap();
    let (entry, _) = load(&m, &spec(k, None), &[(0, 64 * MIB, 0)], &[], 1).unwrap();
    assert_eq!(entry.protocol, BootProtocol::Linux64);
    assert_eq!(entry.entry, LOAD_ADDR);
    let zp: linux_loader::loader::bootparam::boot_params = read(&m, ZERO_PAGE_ADDR);
    assert_eq!({ zp.hdr.header }, 0x5372_6448);
    let info: hvm_start_info = read(&m, pvh::START_INFO_ADDR);
    assert_eq!(info.magic, 0, "no start info for the 64-bit entry");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn start_info_fields() {
    let map = params::e820_map(&[(0, 256 * MIB), (256 * MIB, 256 * MIB)]).unwrap();
    let initrd = InitrdPlacement {
        addr: 0x0ff0_0000,
        size: 0x1234,
    };
    let blobs = pvh::start_info(&map, Some(initrd)).unwrap();
    let find = |addr| blobs.iter().find(|(a, _)| *a == addr).unwrap().1.clone();
    let info = find(pvh::START_INFO_ADDR);
    assert_eq!(info.len(), 56);
    let u32_at = |b: &[u8], i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap());
    let u64_at = |b: &[u8], i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
    // The field offsets of start_info.h, version 1.
    assert_eq!(u32_at(&info, 0), 0x336e_c578);
    assert_eq!(u32_at(&info, 4), 1);
    assert_eq!(u32_at(&info, 8), 0);
    assert_eq!(u32_at(&info, 12), 1);
    assert_eq!(u64_at(&info, 16), pvh::MODLIST_ADDR);
    assert_eq!(u64_at(&info, 24), params::CMDLINE_ADDR);
    assert_eq!(u64_at(&info, 32), acpi::RSDP_ADDR);
    assert_eq!(u64_at(&info, 40), pvh::MEMMAP_ADDR);
    assert_eq!(u32_at(&info, 48) as usize, map.len());
    let memmap = find(pvh::MEMMAP_ADDR);
    assert_eq!(memmap.len(), 24 * map.len());
    for (n, e) in map.iter().enumerate() {
        let at = 24 * n;
        assert_eq!(u64_at(&memmap, at), e.addr);
        assert_eq!(u64_at(&memmap, at + 8), e.size);
        assert_eq!(u32_at(&memmap, at + 16), e.kind);
    }
    // RAM is type 1 and the BIOS area and MMIO gap are type 2, as in e820.
    let kinds: Vec<u32> = (0..map.len())
        .map(|n| u32_at(&memmap, 24 * n + 16))
        .collect();
    assert_eq!(kinds, [1, 2, 1, 1, 2]);
    let module = find(pvh::MODLIST_ADDR);
    assert_eq!(module.len(), 32);
    assert_eq!(
        (u64_at(&module, 0), u64_at(&module, 8)),
        (0x0ff0_0000, 0x1234)
    );
    assert_eq!(u64_at(&module, 16), 0);

    let too_many = vec![map[0]; params::E820_MAX + 1];
    assert_eq!(
        pvh::start_info(&too_many, None),
        Err(pvh::PvhError::TooManyEntries(params::E820_MAX + 1))
    );
}

#[test]
fn low_memory_areas_do_not_overlap() {
    use params::{CMDLINE_MAX, EBDA_START, HIMEM_START};
    let mut areas: Vec<(&str, u64, u64)> = vec![
        ("zero page", ZERO_PAGE_ADDR, 4096),
        // The 64-bit entry's stack: Linux uses a few bytes of it before
        // it switches to its own (Firecracker's, the same place); 3 KiB.
        ("boot stack", cpu::BOOT_STACK - 0xc00, 0xc00),
        ("command line", CMDLINE_ADDR, CMDLINE_MAX as u64),
        (
            "PVH start info",
            pvh::START_INFO_ADDR,
            std::mem::size_of::<hvm_start_info>() as u64,
        ),
        (
            "PVH module list",
            pvh::MODLIST_ADDR,
            std::mem::size_of::<hvm_modlist_entry>() as u64,
        ),
        ("PVH memory map", pvh::MEMMAP_ADDR, pvh::MEMMAP_MAX as u64),
        ("ACPI", acpi::RSDP_ADDR, acpi::ACPI_MAX as u64),
        (
            "MP table",
            mptable::MPTABLE_ADDR,
            mptable::MPTABLE_MAX as u64,
        ),
    ];
    // Every table either protocol writes (the GDTs share one address).
    for protocol in [BootProtocol::Linux64, BootProtocol::Pvh] {
        for (addr, bytes) in cpu::tables(protocol) {
            if !areas.iter().any(|a| a.1 == addr) {
                areas.push(("boot table", addr, bytes.len() as u64));
            }
        }
    }
    assert!(areas.len() >= 13, "{areas:?}");
    for (i, a) in areas.iter().enumerate() {
        assert!(a.2 > 0 && a.1 + a.2 <= HIMEM_START, "{a:?} is not low");
        // What the kernel reads before it knows the map lies in RAM, not
        // in the reserved BIOS area (only ACPI and the MP table do).
        if a.1 < EBDA_START {
            assert!(a.1 + a.2 <= EBDA_START, "{a:?} crosses the EBDA");
        }
        for b in &areas[i + 1..] {
            assert!(a.1 + a.2 <= b.1 || b.1 + b.2 <= a.1, "{a:?} overlaps {b:?}");
        }
    }
    // The PVH tables are inside the first (RAM) e820 entry.
    let map = params::e820_map(&[(0, 64 * MIB)]).unwrap();
    assert_eq!(map[0].kind, params::E820_RAM);
    assert!(pvh::MEMMAP_ADDR + pvh::MEMMAP_MAX as u64 <= map[0].addr + map[0].size);
}

/// On real KVM, with the in-kernel irqchip Linux guests get: vCPU 0 takes
/// the PVH state and is runnable; vCPU 1, configured the same way, waits
/// for INIT/SIPI, so only vCPU 0 runs the entry.
#[test]
fn on_kvm_only_vcpu_0_enters_and_in_32_bit_protected_mode() {
    use crate::vstate::vm::Vm;
    if let Err(e) = Vm::available() {
        if std::env::var("CI").is_ok_and(|v| v.eq_ignore_ascii_case("true")) {
            panic!("a KVM test cannot run in CI (CI=true): {e}");
        }
        eprintln!("SKIPPED: {e}");
        return;
    }
    let mut vm = Vm::new().unwrap();
    vm.setup_irqchip().unwrap();
    let cpuid = crate::vstate::template::CpuSetup::new(
        vm.supported_cpuid().unwrap(),
        false,
        crate::config::CpuTemplate::None,
        None,
    )
    .unwrap();
    let entry = LinuxEntry {
        entry: u64::from(PVH_ENTRY),
        protocol: BootProtocol::Pvh,
        vcpus: 2,
        format: KernelFormat::Elf,
    };
    let fds: Vec<_> = (0..2).map(|i| vm.create_vcpu(i).unwrap()).collect();
    for (i, fd) in fds.iter().enumerate() {
        cpu::configure(fd, i as u8, &cpuid, &entry).unwrap();
    }
    let states: Vec<u32> = fds
        .iter()
        .map(|fd| fd.get_mp_state().unwrap().mp_state)
        .collect();
    assert_eq!(
        states,
        [
            kvm_bindings::KVM_MP_STATE_RUNNABLE,
            kvm_bindings::KVM_MP_STATE_UNINITIALIZED
        ]
    );
    let s = fds[0].get_sregs().unwrap();
    assert_eq!(s.cr0 & 0x8000_0011, 0x11, "PE and ET, no PG: {:#x}", s.cr0);
    assert_eq!((s.cr4, s.efer & 0x500), (0, 0));
    assert_eq!(
        (s.cs.selector, s.cs.base, s.cs.limit, s.cs.db, s.cs.l),
        (0x08, 0, 0xffff_ffff, 1, 0)
    );
    assert_eq!((s.ss.selector, s.ss.limit, s.ss.db), (0x10, 0xffff_ffff, 1));
    assert_eq!((s.tr.selector, s.tr.type_), (0x18, 0xb));
    assert_eq!(s.gdt.base, cpu::GDT_ADDR);
    let r = fds[0].get_regs().unwrap();
    assert_eq!(
        (r.rip, r.rbx, r.rflags, r.rsi, r.rsp),
        (u64::from(PVH_ENTRY), pvh::START_INFO_ADDR, 2, 0, 0)
    );
}
