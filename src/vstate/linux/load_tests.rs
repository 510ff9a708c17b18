use super::*;
use vm_memory::GuestMemoryMmap;

const MIB: u64 = 1 << 20;

fn mem(bytes: u64) -> GuestMemoryMmap {
    GuestMemoryMmap::from_ranges(&[(GuestAddress(0), bytes as usize)]).unwrap()
}

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("teravm-load-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A minimal x86-64 ELF executable: one PT_LOAD of `code` at physical
/// 16 MiB, entered at its start.
fn tiny_elf(code: &[u8]) -> Vec<u8> {
    let mut b = vec![0u8; 0x1000];
    b[..4].copy_from_slice(b"\x7fELF");
    b[4] = 2; // 64-bit
    b[5] = 1; // little endian
    b[6] = 1; // version
    b[16..18].copy_from_slice(&2u16.to_le_bytes()); // ET_EXEC
    b[18..20].copy_from_slice(&62u16.to_le_bytes()); // x86-64
    b[20..24].copy_from_slice(&1u32.to_le_bytes());
    b[24..32].copy_from_slice(&0x100_0000u64.to_le_bytes()); // entry
    b[32..40].copy_from_slice(&64u64.to_le_bytes()); // phoff
    b[52..54].copy_from_slice(&64u16.to_le_bytes()); // ehsize
    b[54..56].copy_from_slice(&56u16.to_le_bytes()); // phentsize
    b[56..58].copy_from_slice(&1u16.to_le_bytes()); // phnum
    let ph = 64;
    b[ph..ph + 4].copy_from_slice(&1u32.to_le_bytes()); // PT_LOAD
    b[ph + 4..ph + 8].copy_from_slice(&5u32.to_le_bytes());
    b[ph + 8..ph + 16].copy_from_slice(&0x1000u64.to_le_bytes()); // offset
    b[ph + 16..ph + 24].copy_from_slice(&0xffff_ffff_8100_0000u64.to_le_bytes());
    b[ph + 24..ph + 32].copy_from_slice(&0x100_0000u64.to_le_bytes()); // paddr
    b[ph + 32..ph + 40].copy_from_slice(&(code.len() as u64).to_le_bytes());
    b[ph + 40..ph + 48].copy_from_slice(&(code.len() as u64 + 0x10000).to_le_bytes());
    b[ph + 48..ph + 56].copy_from_slice(&0x1000u64.to_le_bytes());
    b.extend_from_slice(code);
    b
}

fn spec(kernel: PathBuf, initrd: Option<PathBuf>) -> KernelSpec {
    KernelSpec {
        kernel: ImageFile::open(&kernel).unwrap(),
        initrd: initrd.map(|i| ImageFile::open(&i).unwrap()),
        cmdline: "console=ttyS0 earlyprintk=serial".into(),
    }
}

#[test]
fn elf_with_initrd() {
    let d = dir("elf");
    let k = d.join("vmlinux");
    std::fs::write(&k, tiny_elf(&[0xf4; 64])).unwrap();
    let i = d.join("initrd");
    std::fs::write(&i, vec![0x5a; 5000]).unwrap();
    let m = mem(128 * MIB);
    let (entry, map) = load(&m, &spec(k, Some(i)), &[(0, 128 * MIB, 0)], &[], 2).unwrap();
    assert_eq!(entry.entry, 0x100_0000);
    assert_eq!(entry.format, KernelFormat::Elf);
    assert_eq!(entry.vcpus, 2);
    assert_eq!(map.len(), 4);
    let code: u8 = m.read_obj(GuestAddress(0x100_0000)).unwrap();
    assert_eq!(code, 0xf4);
    let zp: linux_loader::loader::bootparam::boot_params =
        m.read_obj(GuestAddress(ZERO_PAGE_ADDR)).unwrap();
    let hdr = zp.hdr;
    let (addr, size) = (u64::from(hdr.ramdisk_image), u64::from(hdr.ramdisk_size));
    assert_eq!(size, 5000);
    assert_eq!(addr % 4096, 0);
    assert!(addr + size <= 128 * MIB && addr >= 0x101_0040);
    let byte: u8 = m.read_obj(GuestAddress(addr + 4999)).unwrap();
    assert_eq!(byte, 0x5a);
    let mut line = vec![0u8; 33];
    m.read_slice(&mut line, GuestAddress(CMDLINE_ADDR)).unwrap();
    assert_eq!(&line, b"console=ttyS0 earlyprintk=serial\0");
    assert_eq!({ zp.e820_entries }, 4);
    let mut mp = [0u8; 4];
    m.read_slice(&mut mp, GuestAddress(mptable::MPTABLE_ADDR))
        .unwrap();
    assert_eq!(&mp, b"_MP_");
    // The ACPI tables, found through the zero page as Linux does.
    assert_eq!({ zp.acpi_rsdp_addr }, acpi::RSDP_ADDR);
    let mut rsdp = [0u8; 36];
    m.read_slice(&mut rsdp, GuestAddress(acpi::RSDP_ADDR))
        .unwrap();
    assert_eq!(&rsdp[..8], b"RSD PTR ");
    assert_eq!(rsdp.iter().fold(0u8, |a, b| a.wrapping_add(*b)), 0);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn bzimage_keeps_its_header_and_enters_at_0x200() {
    let d = dir("bz");
    let k = d.join("vmlinuz");
    let mut img = image::tests::bzimage_head();
    img[0x1f1] = 1; // two sectors of setup: the protected-mode code at 0x400
    img.resize(0x2000, 0);
    img[0x400..].fill(0x90);
    std::fs::write(&k, &img).unwrap();
    let m = mem(128 * MIB);
    let (entry, _) = load(&m, &spec(k, None), &[(0, 128 * MIB, 0)], &[], 1).unwrap();
    assert_eq!(entry.format, KernelFormat::BzImage);
    assert_eq!(entry.entry, HIMEM_START + 0x200);
    let zp: linux_loader::loader::bootparam::boot_params =
        m.read_obj(GuestAddress(ZERO_PAGE_ADDR)).unwrap();
    let hdr = zp.hdr;
    assert_eq!({ hdr.version }, 0x020f);
    assert_eq!({ hdr.type_of_loader }, 0xff);
    assert_eq!({ hdr.cmd_line_ptr }, CMDLINE_ADDR as u32);
    let first: u8 = m.read_obj(GuestAddress(HIMEM_START)).unwrap();
    assert_eq!(first, 0x90);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn load_errors() {
    let d = dir("bad");
    let m = mem(64 * MIB);
    // Not a kernel (the files thread checks this when the boot source is
    // put; load checks the descriptor's bytes again).
    let text = d.join("text");
    std::fs::write(&text, b"#!/bin/sh\n").unwrap();
    let e = load(&m, &spec(text, None), &[(0, 64 * MIB, 0)], &[], 1).unwrap_err();
    assert!(
        matches!(e, LinuxError::Image(ImageError::UnknownFormat { .. })),
        "{e}"
    );
    // An ELF whose segment lies beyond guest RAM.
    let k = d.join("vmlinux");
    std::fs::write(&k, tiny_elf(&[0xf4; 16])).unwrap();
    let small = mem(8 * MIB);
    let e = load(&small, &spec(k.clone(), None), &[(0, 8 * MIB, 0)], &[], 1).unwrap_err();
    assert!(matches!(e, LinuxError::Load { .. }), "{e}");
    // An initrd too big for the RAM above the kernel.
    let i = d.join("initrd");
    std::fs::File::create(&i)
        .unwrap()
        .set_len(60 * MIB)
        .unwrap();
    let e = load(&m, &spec(k.clone(), Some(i)), &[(0, 64 * MIB, 0)], &[], 1).unwrap_err();
    assert!(
        matches!(e, LinuxError::Params(ParamsError::InitrdDoesNotFit { .. })),
        "{e}"
    );
    // A command line longer than the kernel takes.
    let mut long = spec(k, None);
    long.cmdline = "x".repeat(3000);
    let e = load(&m, &long, &[(0, 64 * MIB, 0)], &[], 1).unwrap_err();
    assert!(
        matches!(e, LinuxError::Params(ParamsError::CmdlineTooLong { .. })),
        "{e}"
    );
    std::fs::remove_dir_all(&d).unwrap();
}
