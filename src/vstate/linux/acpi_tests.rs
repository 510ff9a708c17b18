use super::*;
use crate::memory::layout::ram_regions;
use crate::memory::plan::partition;

const GIB: u64 = 1 << 30;

fn sum(b: &[u8]) -> u8 {
    b.iter().fold(0u8, |a, x| a.wrapping_add(*x))
}

fn u32_at(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes(b[off..off + 4].try_into().unwrap())
}

fn u64_at(b: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(b[off..off + 8].try_into().unwrap())
}

/// The block's tables found as a guest would: RSDP → XSDT → each entry,
/// plus the FADT's DSDT; each one's checksum verified.
fn walk(block: &[u8]) -> Vec<(String, Vec<u8>)> {
    let at = |addr: u64| &block[(addr - RSDP_ADDR) as usize..];
    assert_eq!(&block[..8], b"RSD PTR ");
    assert_eq!(sum(&block[..20]), 0, "RSDP checksum");
    assert_eq!(sum(&block[..36]), 0, "RSDP extended checksum");
    assert_eq!(block[15], 2, "RSDP revision");
    assert_eq!(u32_at(block, 20), 36);
    let get = |addr: u64| {
        let t = at(addr);
        let len = u32_at(t, 4) as usize;
        let t = t[..len].to_vec();
        assert_eq!(sum(&t), 0, "{} checksum", String::from_utf8_lossy(&t[..4]));
        assert_eq!(addr % 8, 0);
        (String::from_utf8(t[..4].to_vec()).unwrap(), t)
    };
    let (sig, xsdt) = get(u64_at(block, 24));
    assert_eq!(sig, "XSDT");
    let mut found: Vec<(String, Vec<u8>)> = xsdt[36..]
        .chunks(8)
        .map(|c| get(u64::from_le_bytes(c.try_into().unwrap())))
        .collect();
    let fadt = found.iter().find(|(s, _)| s == "FACP").unwrap().1.clone();
    assert_eq!(u64_at(&fadt, 140), u64::from(u32_at(&fadt, 40)), "X_DSDT");
    found.push(get(u64_at(&fadt, 140)));
    found
}

fn find<'a>(tables: &'a [(String, Vec<u8>)], sig: &str) -> &'a [u8] {
    &tables.iter().find(|(s, _)| s == sig).unwrap().1
}

/// `(guest_addr, len, host_node)` of a guest of `mem` bytes over `nodes`,
/// as teravm partitions it.
fn slices(mem: u64, nodes: &[u32]) -> Vec<(u64, u64, u32)> {
    let mut s: Vec<_> = partition(&ram_regions(mem), nodes, GIB)
        .unwrap()
        .iter()
        .map(|s| (s.guest_addr, s.len, s.node))
        .collect();
    s.sort_unstable();
    s
}

#[test]
fn every_table_is_reachable_and_checksummed() {
    let nodes = guest_nodes(&slices(8 * GIB, &[0, 1]));
    let d = distances(&nodes, |_, _| None);
    let block = tables(4, &nodes, &d).unwrap();
    assert!(block.len() <= ACPI_MAX);
    let found = walk(&block);
    let sigs: Vec<&str> = found.iter().map(|(s, _)| s.as_str()).collect();
    assert_eq!(sigs, ["FACP", "APIC", "SRAT", "SLIT", "DSDT"]);
    let fadt = find(&found, "FACP");
    assert_eq!(fadt.len(), 276);
    assert_eq!(fadt[8], 6, "FADT revision");
    assert_ne!(u32_at(fadt, 112) & (1 << 20), 0, "hardware-reduced");
    assert_eq!(find(&found, "DSDT").len(), 36);
}

#[test]
fn madt_lists_every_vcpu_and_the_ioapic() {
    for vcpus in [1usize, 3, 254] {
        let t = madt(vcpus).unwrap();
        assert_eq!(sum(&t), 0);
        assert_eq!(u32_at(&t, 36), super::super::mptable::LAPIC_ADDR);
        let e = &t[44..];
        for i in 0..vcpus {
            let l = &e[i * 8..i * 8 + 8];
            assert_eq!((l[0], l[1], l[2], l[3]), (0, 8, i as u8, i as u8));
            assert_eq!(u32_at(l, 4), 1, "enabled");
        }
        let io = &e[vcpus * 8..vcpus * 8 + 12];
        assert_eq!((io[0], io[1], io[2]), (1, 12, vcpus as u8));
        assert_eq!(u32_at(io, 4), super::super::mptable::IOAPIC_ADDR);
        assert_eq!(u32_at(io, 8), 0);
        assert_eq!(&e[vcpus * 8 + 12..], &[4, 6, 0xff, 0, 0, 1]);
    }
    assert_eq!(madt(0), Err(AcpiError::VcpuCount(0)));
    assert_eq!(madt(255), Err(AcpiError::VcpuCount(255)));
}

/// `(APIC id, proximity domain)` of each SRAT CPU entry.
type CpuEntries = Vec<(u8, u32)>;
/// `(proximity domain, base, length)` of each SRAT memory entry.
type MemEntries = Vec<(u32, u64, u64)>;

/// The SRAT's CPU and memory entries, decoded.
fn decode_srat(t: &[u8]) -> (CpuEntries, MemEntries) {
    assert_eq!(u32_at(t, 36), 1);
    let (mut cpus, mut mems) = (Vec::new(), Vec::new());
    let mut e = &t[48..];
    while !e.is_empty() {
        let len = e[1] as usize;
        match e[0] {
            0 => {
                assert_eq!(len, 16);
                assert_eq!(u32_at(e, 4), 1, "enabled");
                let pxm = u32::from(e[2]) | (u32::from_le_bytes([e[9], e[10], e[11], 0]) << 8);
                cpus.push((e[3], pxm));
            }
            1 => {
                assert_eq!(len, 40);
                assert_eq!(u32_at(e, 28), 1, "enabled, not hot-pluggable");
                mems.push((u32_at(e, 2), u64_at(e, 8), u64_at(e, 16)));
            }
            other => panic!("unexpected SRAT entry type {other}"),
        }
        e = &e[len..];
    }
    (cpus, mems)
}

#[test]
fn srat_gives_each_host_slice_its_node_for_1_2_4_nodes() {
    for (host_nodes, vcpus) in [
        (vec![0u32], 2usize),
        (vec![0, 1], 3),
        (vec![0, 1, 2, 3], 8),
        (vec![3, 1], 2),
    ] {
        let s = slices(16 * GIB, &host_nodes);
        let nodes = guest_nodes(&s);
        assert_eq!(nodes.len(), host_nodes.len());
        let t = srat(&nodes, vcpus).unwrap();
        assert_eq!(sum(&t), 0);
        let (cpus, mems) = decode_srat(&t);
        // Every vCPU, round-robin over the nodes.
        let want: Vec<(u8, u32)> = (0..vcpus)
            .map(|i| (i as u8, (i % host_nodes.len()) as u32))
            .collect();
        assert_eq!(cpus, want, "{host_nodes:?}");
        // Every slice, in the guest node of its host node; together they
        // cover all guest RAM.
        assert_eq!(mems.len(), s.len());
        for ((pxm, addr, len), (s_addr, s_len, host)) in mems.iter().zip(&s) {
            assert_eq!((*addr, *len), (*s_addr, *s_len));
            assert_eq!(nodes[*pxm as usize].host_node, *host);
        }
        assert_eq!(mems.iter().map(|m| m.2).sum::<u64>(), 16 * GIB);
        // Guest node g is the g-th host node in address order.
        let order: Vec<u32> = nodes.iter().map(|n| n.host_node).collect();
        assert_eq!(order, host_nodes);
    }
}

#[test]
fn a_node_split_by_the_mmio_gap_has_two_ranges() {
    // 2 nodes of 4 GiB: node 0 holds [0, 3 GiB) and [4 GiB, 5 GiB).
    let nodes = guest_nodes(&slices(8 * GIB, &[0, 1]));
    assert_eq!(nodes[0].ranges, vec![(0, 3 * GIB), (4 * GIB, GIB)]);
    assert_eq!(nodes[1].ranges, vec![(5 * GIB, 4 * GIB)]);
    let (_, mems) = decode_srat(&srat(&nodes, 1).unwrap());
    assert_eq!(
        mems,
        vec![(0, 0, 3 * GIB), (0, 4 * GIB, GIB), (1, 5 * GIB, 4 * GIB)]
    );
}

#[test]
fn fewer_vcpus_than_nodes_leaves_memory_only_nodes() {
    let nodes = guest_nodes(&slices(16 * GIB, &[0, 1, 2, 3]));
    let (cpus, mems) = decode_srat(&srat(&nodes, 2).unwrap());
    assert_eq!(cpus, vec![(0, 0), (1, 1)]);
    let pxms: Vec<u32> = mems.iter().map(|m| m.0).collect();
    // Node 0's 4 GiB is split by the MMIO gap.
    assert_eq!(pxms, vec![0, 0, 1, 2, 3]);
}

#[test]
fn slit_distances() {
    let nodes = guest_nodes(&slices(16 * GIB, &[2, 0, 1]));
    // The host's distances where it has them; nonsense (<= 10) falls back.
    let host = |a: u32, b: u32| match (a, b) {
        (2, 0) | (0, 2) => Some(31),
        (0, 1) | (1, 0) => Some(10),
        _ => None,
    };
    let d = distances(&nodes, host);
    assert_eq!(
        d,
        vec![vec![10, 31, 20], vec![31, 10, 20], vec![20, 20, 10]]
    );
    let t = slit(&d).unwrap();
    assert_eq!(sum(&t), 0);
    assert_eq!(&t[..4], b"SLIT");
    assert_eq!(u64_at(&t, 36), 3);
    assert_eq!(&t[44..], &[10, 31, 20, 31, 10, 20, 20, 20, 10]);
    // One node: a 1x1 table.
    let one = guest_nodes(&slices(GIB, &[0]));
    assert_eq!(&slit(&distances(&one, host)).unwrap()[44..], &[10]);
    assert_eq!(slit(&[vec![10, 20]]), Err(AcpiError::Distances(1)));
}

#[test]
fn bad_inputs_are_errors() {
    assert_eq!(srat(&[], 1), Err(AcpiError::NoNodes));
    let nodes = guest_nodes(&slices(GIB, &[0]));
    assert_eq!(tables(0, &nodes, &[vec![10]]), Err(AcpiError::VcpuCount(0)));
    assert_eq!(tables(1, &nodes, &[]), Err(AcpiError::Distances(1)));
}

#[test]
fn the_largest_guest_fits_the_area() {
    // 254 vCPUs over 64 nodes, each node's share split by the gap at most once.
    let host: Vec<u32> = (0..64).collect();
    let nodes = guest_nodes(&slices(1 << 40, &host));
    let d = distances(&nodes, |_, _| None);
    let block = tables(254, &nodes, &d).unwrap();
    assert!(block.len() <= ACPI_MAX, "{}", block.len());
    walk(&block);
}

#[test]
fn the_hotplug_parts_are_hot_pluggable_memory_of_their_nodes() {
    let s = slices(8 * GIB, &[0, 1]);
    let mut nodes = guest_nodes(&s);
    let base = 9 * GIB;
    // Node 1's part first in the region, node 0's next, and one of a node
    // with no RAM (left out).
    add_hotplug(
        &mut nodes,
        &[(base, GIB, 1), (base + GIB, GIB, 0), (base + 2 * GIB, GIB, 7)],
    );
    assert_eq!(nodes[0].hotplug, vec![(base + GIB, GIB)]);
    assert_eq!(nodes[1].hotplug, vec![(base, GIB)]);
    let t = srat(&nodes, 2).unwrap();
    assert_eq!(sum(&t), 0);
    let mut e = &t[48..];
    let mut hot = Vec::new();
    while !e.is_empty() {
        let len = e[1] as usize;
        if e[0] == 1 && u32_at(e, 28) == 3 {
            hot.push((u32_at(e, 2), u64_at(e, 8), u64_at(e, 16)));
        } else if e[0] == 1 {
            assert_eq!(u32_at(e, 28), 1, "RAM: enabled, not hot-pluggable");
            assert!(u64_at(e, 8) < base, "RAM below the region");
        }
        e = &e[len..];
    }
    assert_eq!(hot, vec![(0, base + GIB, GIB), (1, base, GIB)]);
}
