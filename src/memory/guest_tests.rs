//! Tests of guest memory mappings (no KVM).

use vm_memory::{Bytes, GuestMemoryBackend as _};

use super::super::numa::HostNode;
use super::super::progress::ReclaimState;
use super::*;

fn machine(mem_size_mib: u64, huge_pages: HugePages) -> MachineConfig {
    MachineConfig {
        vcpu_count: 1,
        mem_size_mib,
        huge_pages,
    }
}

fn real() -> HostTopology {
    HostTopology::from_sysfs(Path::new("/sys")).unwrap()
}

fn resident(m: &GuestMemory) -> u64 {
    m.slices()
        .iter()
        .map(|s| sys::resident_bytes(s.host_addr, s.slice.len as usize, &mut Vec::new()).unwrap())
        .sum()
}

#[test]
fn anonymous_transparent_256_mib() {
    let m = GuestMemory::new(
        &machine(256, HugePages::Transparent),
        &MemoryConfig::default(),
        &real(),
    )
    .unwrap();
    assert_eq!(m.mem_bytes(), 256 << 20);
    assert_eq!(m.slices().len(), 1);
    let s = &m.slices()[0];
    assert_eq!(
        s.slice,
        NodeSlice {
            node: 0,
            guest_addr: 0,
            len: 256 << 20
        }
    );
    assert!(s.memfd.is_none());
    assert_eq!(s.host_addr % 4096, 0);
    assert_eq!(resident(&m), 0, "nothing touched yet");
    let view = m.vm_memory();
    assert_eq!(view.num_regions(), 1);
    view.write_obj(0x1234_5678u32, GuestAddress(0x1000))
        .unwrap();
    // SAFETY: inside the slice's mapping.
    let host = unsafe { ((s.host_addr + 0x1000) as *const u32).read_volatile() };
    assert_eq!(host, 0x1234_5678);
    assert!(
        view.write_obj(0u8, GuestAddress(256 << 20)).is_err(),
        "beyond RAM"
    );
}

#[test]
fn memfd_slices_have_their_own_file() {
    let mem = MemoryConfig {
        backing: Backing::Memfd,
        ..MemoryConfig::default()
    };
    let m = GuestMemory::new(&machine(128, HugePages::None), &mem, &real()).unwrap();
    let s = &m.slices()[0];
    let file = s.memfd.as_ref().unwrap();
    assert_eq!(file.metadata().unwrap().len(), 128 << 20);
    m.vm_memory().write_obj(7u64, GuestAddress(0)).unwrap();
    assert!(std::os::unix::fs::MetadataExt::blocks(&file.metadata().unwrap()) > 0);
}

#[test]
fn fake_nodes_split_the_guest_without_binding() {
    let topo = HostTopology {
        nodes: (0..2)
            .map(|id| HostNode {
                id,
                cpus: vec![0],
                mem_total_bytes: 1 << 30,
            })
            .collect(),
    };
    let mem = MemoryConfig {
        numa_policy: NumaPolicy::None,
        ..MemoryConfig::default()
    };
    let m = GuestMemory::new(&machine(256, HugePages::None), &mem, &topo).unwrap();
    let got: Vec<NodeSlice> = m.slices().iter().map(|s| s.slice).collect();
    assert_eq!(
        got,
        vec![
            NodeSlice {
                node: 0,
                guest_addr: 0,
                len: 128 << 20
            },
            NodeSlice {
                node: 1,
                guest_addr: 128 << 20,
                len: 128 << 20
            },
        ]
    );
    assert_eq!(m.vm_memory().num_regions(), 2);
    // Binding to a node this host lacks is an error (unless the host has it).
    let bind = MemoryConfig::default();
    if !Path::new("/sys/devices/system/node/node1").exists() {
        let e = GuestMemory::new(&machine(256, HugePages::None), &bind, &topo).unwrap_err();
        assert!(matches!(e, GuestMemoryError::HostLacksNode(1)), "{e}");
    }
    let unknown = MemoryConfig {
        host_nodes: Some(vec![0, 7]),
        ..MemoryConfig::default()
    };
    let e = GuestMemory::new(&machine(256, HugePages::None), &unknown, &topo).unwrap_err();
    assert!(matches!(e, GuestMemoryError::UnknownNode(7)), "{e}");
}

#[test]
fn a_terabyte_guest_maps_across_the_gap_and_unmaps() {
    let m = GuestMemory::new(
        &machine(1 << 20, HugePages::Transparent),
        &MemoryConfig::default(),
        &real(),
    )
    .unwrap();
    assert_eq!(m.mem_bytes(), 1 << 40);
    let slices: Vec<NodeSlice> = m.slices().iter().map(|s| s.slice).collect();
    assert_eq!(slices.len(), 2);
    assert_eq!(
        slices[0],
        NodeSlice {
            node: 0,
            guest_addr: 0,
            len: 3 << 30
        }
    );
    assert_eq!(slices[1].guest_addr, 4 << 30);
    assert_eq!(slices[1].len, (1 << 40) - (3 << 30));
    let addrs: Vec<(usize, usize)> = m
        .slices()
        .iter()
        .map(|s| (s.host_addr, s.slice.len as usize))
        .collect();
    drop(m);
    let mut buf = Vec::new();
    for (addr, _) in addrs {
        assert!(
            sys::resident_bytes(addr, 4096, &mut buf).is_err(),
            "unmapped on drop"
        );
    }
}

#[test]
fn hugetlb_without_reserved_pages_fails_cleanly() {
    let reserved = std::fs::read_to_string("/proc/sys/vm/nr_hugepages").unwrap_or_default();
    if reserved.trim() != "0" {
        eprintln!("huge pages are reserved on this host; skipping");
        return;
    }
    for backing in [Backing::Anonymous, Backing::Memfd] {
        let mem = MemoryConfig {
            backing,
            ..MemoryConfig::default()
        };
        let e = GuestMemory::new(&machine(64, HugePages::Huge2M), &mem, &real()).unwrap_err();
        assert!(matches!(e, GuestMemoryError::HugePages { .. }), "{e}");
        assert!(e.to_string().contains("huge pages"), "{e}");
    }
}

#[test]
fn populate_then_reclaim() {
    for backing in [Backing::Anonymous, Backing::Memfd] {
        let mem = MemoryConfig {
            backing,
            ..MemoryConfig::default()
        };
        let topo = real();
        let m = GuestMemory::new(&machine(128, HugePages::None), &mem, &topo).unwrap();
        let stats = m.populate(2, &topo).unwrap();
        assert_eq!(stats.bytes, 128 << 20);
        assert_eq!(resident(&m), 128 << 20);
        let opts = ReclaimOptions {
            workers_per_node: 2,
            chunk_bytes: 16 << 20,
            parallel_threshold_bytes: 0,
            steal: true,
        };
        let progress = ReclaimProgress::new();
        let r = m.reclaim(&opts, &topo, &progress).unwrap();
        assert_eq!(r.state, ReclaimState::Done);
        assert_eq!(r.address_bytes_done, 128 << 20);
        assert_eq!(r.resident_bytes_freed, 128 << 20);
        assert_eq!(r.workers, 2);
    }
}

#[test]
fn reclaim_with_bad_options_still_unmaps() {
    let topo = real();
    let m = GuestMemory::new(
        &machine(16, HugePages::None),
        &MemoryConfig::default(),
        &topo,
    )
    .unwrap();
    let addr = m.slices()[0].host_addr;
    m.vm_memory().write_obj(1u8, GuestAddress(0)).unwrap();
    let opts = ReclaimOptions {
        workers_per_node: 0,
        ..ReclaimOptions::default()
    };
    assert!(m.reclaim(&opts, &topo, &ReclaimProgress::new()).is_err());
    assert!(
        sys::resident_bytes(addr, 4096, &mut Vec::new()).is_err(),
        "unmapped"
    );
}

#[test]
fn guest_memory_is_send() {
    fn check<T: Send>() {}
    check::<GuestMemory>();
}
