use super::*;
use crate::memory::layout::ram_regions;
use crate::memory::plan::partition;

const GIB: u64 = 1 << 30;

fn slices(mem: u64, nodes: &[u32]) -> Vec<(u64, u64)> {
    let align = if mem >= nodes.len() as u64 * GIB {
        GIB
    } else {
        2 << 20
    };
    partition(&ram_regions(mem), nodes, align)
        .unwrap()
        .iter()
        .map(|s| (s.guest_addr, s.len))
        .collect()
}

fn ram(map: &[E820Entry]) -> Vec<(u64, u64)> {
    map.iter()
        .filter(|e| e.kind == E820_RAM)
        .map(|e| (e.addr, e.size))
        .collect()
}

/// The RAM entries plus the low reserved area are exactly the slices.
fn covers_slices(map: &[E820Entry], slices: &[(u64, u64)]) {
    let total: u64 = ram(map).iter().map(|r| r.1).sum();
    let slice_total: u64 = slices.iter().map(|s| s.1).sum();
    assert_eq!(total, slice_total - (HIMEM_START - EBDA_START));
    for w in map.windows(2) {
        assert!(w[0].addr + w[0].size <= w[1].addr, "{map:?}");
    }
    let gap: Vec<_> = map.iter().filter(|e| e.addr == MMIO_GAP_START).collect();
    assert_eq!(gap.len(), 1);
    assert_eq!(gap[0].kind, E820_RESERVED);
    assert_eq!(gap[0].size, GIB);
}

#[test]
fn one_node_small_guest() {
    let s = slices(256 << 20, &[0]);
    let map = e820_map(&s).unwrap();
    assert_eq!(
        map,
        vec![
            E820Entry {
                addr: 0,
                size: 0x9fc00,
                kind: E820_RAM
            },
            E820Entry {
                addr: 0x9fc00,
                size: 0x60400,
                kind: E820_RESERVED
            },
            E820Entry {
                addr: 0x10_0000,
                size: (256 << 20) - 0x10_0000,
                kind: E820_RAM
            },
            E820Entry {
                addr: 3 << 30,
                size: GIB,
                kind: E820_RESERVED
            },
        ]
    );
    covers_slices(&map, &s);
    assert_eq!(
        map[0].linux_line(),
        "BIOS-e820: [mem 0x0000000000000000-0x000000000009fbff] usable"
    );
    assert_eq!(
        map[3].linux_line(),
        "BIOS-e820: [mem 0x00000000c0000000-0x00000000ffffffff] reserved"
    );
}

#[test]
fn two_nodes_one_entry_per_slice() {
    let s = slices(8 * GIB, &[0, 1]);
    assert_eq!(s, vec![(0, 3 * GIB), (4 * GIB, GIB), (5 * GIB, 4 * GIB)]);
    let map = e820_map(&s).unwrap();
    assert_eq!(
        ram(&map),
        vec![
            (0, 0x9fc00),
            (HIMEM_START, 3 * GIB - HIMEM_START),
            (4 * GIB, GIB),
            (5 * GIB, 4 * GIB)
        ]
    );
    covers_slices(&map, &s);
}

#[test]
fn four_nodes_and_a_terabyte() {
    let s = slices(8 * GIB, &[0, 1, 2, 3]);
    let map = e820_map(&s).unwrap();
    assert_eq!(ram(&map).len(), 1 + s.len());
    covers_slices(&map, &s);

    let tib = 1u64 << 40;
    for nodes in [&[0u32][..], &[0, 1], &[0, 1, 2, 3]] {
        let s = slices(tib, nodes);
        let map = e820_map(&s).unwrap();
        covers_slices(&map, &s);
        let last = map.last().unwrap();
        assert_eq!(last.addr + last.size, tib + GIB);
        assert_eq!(
            map.iter().filter(|e| e.kind == E820_RAM).count(),
            1 + s.len()
        );
    }
}

#[test]
fn bad_slices_are_refused() {
    assert!(matches!(e820_map(&[]), Err(ParamsError::BadSlices(_))));
    assert_eq!(
        e820_map(&[(GIB, GIB)]),
        Err(ParamsError::NoLowMemory(HIMEM_START))
    );
    assert_eq!(
        e820_map(&[(0, 0x8_0000)]),
        Err(ParamsError::NoLowMemory(HIMEM_START))
    );
    assert!(matches!(
        e820_map(&[(0, 4 * GIB)]),
        Err(ParamsError::BadSlices(_))
    ));
    assert!(matches!(
        e820_map(&[(0, GIB), (GIB / 2, GIB)]),
        Err(ParamsError::BadSlices(_))
    ));
    let many: Vec<(u64, u64)> = (0..200).map(|i| ((i + 4) * GIB, GIB)).collect();
    let mut with_low = vec![(0, GIB)];
    with_low.extend(many);
    assert!(matches!(
        e820_map(&with_low),
        Err(ParamsError::TooManyEntries(_))
    ));
}

#[test]
fn default_and_given_cmdlines() {
    assert_eq!(kernel_cmdline(""), DEFAULT_KERNEL_CMDLINE);
    assert_eq!(kernel_cmdline("  "), DEFAULT_KERNEL_CMDLINE);
    assert_eq!(kernel_cmdline("console=ttyS0 quiet"), "console=ttyS0 quiet");
    for word in [
        "console=ttyS0",
        "reboot=k",
        "panic=1",
        "pci=off",
        "nomodule",
        "i8042.dumbkbd",
    ] {
        assert!(
            DEFAULT_KERNEL_CMDLINE.split(' ').any(|w| w == word),
            "{word}"
        );
    }
    assert!(!DEFAULT_KERNEL_CMDLINE.contains("8250.nr_uarts"));
    assert_eq!(check_cmdline(&"x".repeat(2047), 0), Ok(()));
    assert_eq!(
        check_cmdline(&"x".repeat(2048), 0),
        Err(ParamsError::CmdlineTooLong {
            len: 2048,
            max: 2047
        })
    );
    assert_eq!(
        check_cmdline(&"x".repeat(300), 255),
        Err(ParamsError::CmdlineTooLong { len: 300, max: 255 })
    );
    assert_eq!(check_cmdline(&"x".repeat(4000), 4095), Ok(()));
}

#[test]
fn initrd_goes_high_within_the_limits() {
    let map = e820_map(&slices(256 << 20, &[0])).unwrap();
    // As high as possible in the first region, page aligned.
    let a = initrd_addr(&map, 0x400_0000, 0x7fff_ffff, 0x1234).unwrap();
    assert_eq!(a, ((256 << 20) - 0x1234) & !0xfff);
    assert!(a + 0x1234 <= 256 << 20);
    // The kernel's initrd_addr_max caps it.
    let a = initrd_addr(&map, 0x400_0000, 0x7ff_ffff, 0x10_0000).unwrap();
    assert_eq!(a, 0x7f0_0000);
    // Too big to fit above the kernel.
    assert_eq!(
        initrd_addr(&map, 0x400_0000, 0x7fff_ffff, 253 << 20),
        Err(ParamsError::InitrdDoesNotFit {
            size: 253 << 20,
            low: 0x400_0000,
            high: 0x8000_0000
        })
    );
    // A big guest: below 2 GiB (initrd_addr_max), never in the gap or above 4 GiB.
    let map = e820_map(&slices(16 * GIB, &[0, 1])).unwrap();
    let a = initrd_addr(&map, 0x400_0000, 0x7fff_ffff, 64 << 20).unwrap();
    assert_eq!(a, 0x8000_0000 - (64 << 20));
}

#[test]
fn zero_page_fields() {
    let map = e820_map(&slices(512 << 20, &[0])).unwrap();
    let initrd = InitrdPlacement {
        addr: 0x1f00_0000,
        size: 0x80_0000,
    };
    let p = boot_params(None, 42, Some(initrd), &map).unwrap();
    let hdr = p.hdr;
    assert_eq!({ hdr.type_of_loader }, 0xff);
    assert_eq!({ hdr.boot_flag }, 0xaa55);
    assert_eq!({ hdr.header }, 0x5372_6448);
    assert_eq!({ hdr.cmd_line_ptr }, CMDLINE_ADDR as u32);
    assert_eq!({ hdr.cmdline_size }, 43);
    assert_eq!({ hdr.kernel_alignment }, 0x0100_0000);
    assert_eq!({ hdr.ramdisk_image }, 0x1f00_0000);
    assert_eq!({ hdr.ramdisk_size }, 0x80_0000);
    assert_eq!({ p.e820_entries }, 4);
    let e = p.e820_table[2];
    assert_eq!(
        ({ e.addr }, { e.size }, { e.r#type }),
        (HIMEM_START, (512 << 20) - HIMEM_START, 1)
    );

    // A bzImage's own header is kept, with the loader's fields over it.
    let mut image = setup_header {
        setup_sects: 27,
        version: 0x020f,
        kernel_alignment: 0x20_0000,
        ..Default::default()
    };
    image.loadflags = 1;
    let p = boot_params(Some(image), 10, None, &map).unwrap();
    let hdr = p.hdr;
    assert_eq!({ hdr.setup_sects }, 27);
    assert_eq!({ hdr.version }, 0x020f);
    assert_eq!({ hdr.kernel_alignment }, 0x20_0000);
    assert_eq!({ hdr.type_of_loader }, 0xff);
    assert_eq!({ hdr.ramdisk_size }, 0);
}
