//! Tests of guest memory mappings (no KVM).

use std::path::Path;

use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend as _};

use super::super::numa::HostNode;
use super::super::options::Backing;
use super::super::plan::NodeSlice;
use super::super::progress::ReclaimState;
use super::super::sys;
use super::*;

/// Options for `mem_size_mib` MiB of `page_size` pages, defaults otherwise.
fn opts(mem_size_mib: u64, page_size: PageSize) -> MemoryOptions {
    MemoryOptions {
        mem_bytes: mem_size_mib << 20,
        page_size,
        ..MemoryOptions::default()
    }
}

fn no_cancel() -> AtomicBool {
    AtomicBool::new(false)
}

fn real() -> HostTopology {
    HostTopology::from_sysfs(Path::new("/sys")).unwrap()
}

fn resident(m: &GuestMemory) -> u64 {
    m.slices()
        .iter()
        .map(|s| {
            sys::resident_bytes(s.host_addr(), s.slice().len as usize, &mut Vec::new()).unwrap()
        })
        .sum()
}

#[test]
fn anonymous_transparent_256_mib() {
    let m = GuestMemory::new(&opts(256, PageSize::Transparent), &real()).unwrap();
    assert_eq!(m.mem_bytes(), 256 << 20);
    assert_eq!(m.slices().len(), 1);
    let s = &m.slices()[0];
    assert_eq!(
        s.slice(),
        NodeSlice {
            node: 0,
            guest_addr: 0,
            len: 256 << 20
        }
    );
    assert!(s.stripes().is_empty());
    assert_eq!(s.host_addr() % 4096, 0);
    assert_eq!(resident(&m), 0, "nothing touched yet");
    let view = m.view();
    assert_eq!(view.num_regions(), 1);
    view.write_obj(0x1234_5678u32, GuestAddress(0x1000))
        .unwrap();
    // SAFETY: inside the slice's mapping.
    let host = unsafe { ((s.host_addr() + 0x1000) as *const u32).read_volatile() };
    assert_eq!(host, 0x1234_5678);
    assert!(
        view.write_obj(0u8, GuestAddress(256 << 20)).is_err(),
        "beyond RAM"
    );
}

#[test]
fn memfd_slices_have_their_own_file() {
    let mem = MemoryOptions {
        backing: Backing::Memfd,
        ..opts(128, PageSize::Small)
    };
    let m = GuestMemory::new(&mem, &real()).unwrap();
    let s = &m.slices()[0];
    assert_eq!(s.stripes().len(), 1);
    let file = &s.stripes()[0].file;
    assert_eq!(file.metadata().unwrap().len(), 128 << 20);
    m.view().write_obj(7u64, GuestAddress(0)).unwrap();
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
        source: crate::memory::numa::TopologySource::Sysfs("(built by a test)".into()),
    };
    let mem = MemoryOptions {
        policy: NumaPolicy::None,
        ..opts(256, PageSize::Small)
    };
    let m = GuestMemory::new(&mem, &topo).unwrap();
    let got: Vec<NodeSlice> = m.slices().iter().map(|s| s.slice()).collect();
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
    assert_eq!(m.view().num_regions(), 2);
    // Binding to a node this host lacks is an error (unless the host has it).
    let bind = opts(256, PageSize::Small);
    if !super::super::numa::host_has_node(1) {
        let e = GuestMemory::new(&bind, &topo).unwrap_err();
        assert!(matches!(e, GuestMemoryError::HostLacksNode(1)), "{e}");
    }
    let unknown = MemoryOptions {
        host_nodes: Some(vec![0, 7]),
        ..opts(256, PageSize::Small)
    };
    let e = GuestMemory::new(&unknown, &topo).unwrap_err();
    assert!(matches!(e, GuestMemoryError::UnknownNode(7)), "{e}");
}

#[test]
fn a_terabyte_guest_maps_across_the_gap_and_unmaps() {
    let m = GuestMemory::new(&opts(1 << 20, PageSize::Transparent), &real()).unwrap();
    assert_eq!(m.mem_bytes(), 1 << 40);
    let slices: Vec<NodeSlice> = m.slices().iter().map(|s| s.slice()).collect();
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
        .map(|s| (s.host_addr(), s.slice().len as usize))
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
    // Never skipped: ask for more 2 MiB pages than are free now (none on
    // most hosts; a host with reserved pages gets a guest 16 pages larger
    // than what is free).
    let free: u64 =
        std::fs::read_to_string("/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0);
    let pages = (free + 16).max(32);
    for backing in [Backing::Anonymous, Backing::Memfd] {
        let mem = MemoryOptions {
            backing,
            ..opts(pages * 2, PageSize::Huge2M)
        };
        // Refused by admission (too few free huge pages) before anything is
        // mapped.
        let e = GuestMemory::new(&mem, &real()).unwrap_err();
        assert!(matches!(e, GuestMemoryError::Admission(_)), "{e}");
        assert!(e.to_string().contains("huge pages"), "{e}");
        assert!(
            e.to_string()
                .contains(&format!("{pages} huge pages of 2 MiB")),
            "{e}"
        );
    }
}

#[test]
fn populate_then_reclaim() {
    for (backing, pages) in [
        (Backing::Anonymous, PageSize::Small),
        (Backing::Anonymous, PageSize::Transparent),
        (Backing::Memfd, PageSize::Small),
    ] {
        let mem = MemoryOptions {
            backing,
            ..opts(128, pages)
        };
        let topo = real();
        let m = GuestMemory::new(&mem, &topo).unwrap();
        let progress = PopulateProgress::new();
        let stats = m.populate(2, &topo, &progress, &no_cancel()).unwrap();
        assert_eq!(stats.bytes, 128 << 20);
        assert!(!stats.cancelled);
        assert_eq!(progress.bytes_done(), 128 << 20);
        assert_eq!(resident(&m), 128 << 20);
        let opts = ReclaimOptions {
            workers_per_node: 2,
            chunk_bytes: Some(16 << 20),
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
    let m = GuestMemory::new(&opts(16, PageSize::Small), &topo).unwrap();
    let addr = m.slices()[0].host_addr();
    m.view().write_obj(1u8, GuestAddress(0)).unwrap();
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
fn guest_memory_and_views_are_send() {
    fn check<T: Send>() {}
    check::<GuestMemory>();
    fn check_sync<T: Send + Sync>() {}
    check_sync::<GuestView>();
}

#[test]
fn a_held_view_refuses_reclaim_and_keeps_the_memory_until_dropped() {
    let topo = real();
    let m = GuestMemory::new(&opts(64, PageSize::Small), &topo).unwrap();
    let addr = m.slices()[0].host_addr();
    let view = m.view();
    // Anything cloned from the view keeps the mappings alive too, even the
    // inner vm-memory `GuestMemoryMmap`.
    let region = view.mem().clone();
    drop(view);
    let progress = ReclaimProgress::new();
    let e = m
        .reclaim(&ReclaimOptions::default(), &topo, &progress)
        .unwrap_err();
    assert!(matches!(e, ReclaimError::ViewStillHeld { views: 1 }), "{e}");
    assert!(e.to_string().contains("still held"), "{e}");
    assert_eq!(
        progress.snapshot().state,
        ReclaimState::Idle,
        "nothing was freed"
    );
    // Still mapped and readable through what is held.
    region.write_obj(5u32, GuestAddress(8)).unwrap();
    assert_eq!(region.read_obj::<u32>(GuestAddress(8)).unwrap(), 5);
    assert!(sys::resident_bytes(addr, 4096, &mut Vec::new()).is_ok());
    // The last holder unmaps it: nothing leaks.
    drop(region);
    assert!(
        sys::resident_bytes(addr, 4096, &mut Vec::new()).is_err(),
        "unmapped with the last view"
    );
}

#[test]
fn views_dropped_before_reclaim_do_not_count() {
    let topo = real();
    let m = GuestMemory::new(&opts(32, PageSize::Small), &topo).unwrap();
    let views: Vec<GuestView> = (0..4).map(|_| m.view()).collect();
    views[3].write_obj(9u64, GuestAddress(0x100)).unwrap();
    drop(views);
    let r = m
        .reclaim(&ReclaimOptions::default(), &topo, &ReclaimProgress::new())
        .unwrap();
    assert_eq!(r.state, ReclaimState::Done);
    assert_eq!(r.resident_bytes_freed, 4096);
}

#[test]
fn guest_memory_is_not_dumped() {
    let m = GuestMemory::new(
        &MemoryOptions {
            backing: Backing::Memfd,
            ..opts(2048 + 64, PageSize::Small)
        },
        &real(),
    )
    .unwrap();
    let anon = GuestMemory::new(&opts(64, PageSize::Transparent), &real()).unwrap();
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let mut checked = 0;
    for (start, len) in m
        .slices()
        .iter()
        .chain(anon.slices())
        .map(|s| (s.host_addr(), s.slice().len as usize))
    {
        // Every VMA inside the guest ranges (one per memfd stripe) has `dd`.
        for vma in smaps_vmas(&smaps) {
            if vma.0 >= start && vma.1 <= start + len {
                assert!(
                    vma.2.split_whitespace().any(|f| f == "dd"),
                    "{:#x}: {}",
                    vma.0,
                    vma.2
                );
                checked += 1;
            }
        }
    }
    assert!(
        checked >= 4,
        "3 stripes and one anonymous slice, got {checked}"
    );
}

/// `(start, end, VmFlags)` of each VMA of an smaps text.
fn smaps_vmas(smaps: &str) -> Vec<(usize, usize, String)> {
    let mut out = Vec::new();
    let mut range = None;
    for line in smaps.lines() {
        if let Some(flags) = line.strip_prefix("VmFlags:") {
            if let Some((a, b)) = range.take() {
                out.push((a, b, flags.trim().to_string()));
            }
        } else if let Some((r, _)) = line.split_once(' ') {
            if let Some((a, b)) = r.split_once('-') {
                if let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16))
                {
                    range = Some((a, b));
                }
            }
        }
    }
    out
}

#[test]
fn slots_are_one_per_slice_here() {
    let m = GuestMemory::new(&opts(4096, PageSize::Transparent), &real()).unwrap();
    let slots = m.slots();
    assert_eq!(slots.len(), m.slices().len());
    for (slot, s) in slots.iter().zip(m.slices()) {
        assert_eq!(
            (slot.guest_addr, slot.len, slot.host_addr),
            (s.slice().guest_addr, s.slice().len, s.host_addr() as u64)
        );
    }
}

/// Devices reach a slot of the hotplug region only while it is plugged:
/// before, a write there is an invalid address (never a fault); after, it
/// lands in the part's mapping; hidden again, it is refused again, and a
/// range from RAM into it is never whole.
#[test]
fn the_view_reaches_a_hotplug_slot_only_while_plugged() {
    use super::super::hotplug::HotplugOptions;
    const MIB: u64 = 1 << 20;
    let hotplug = HotplugOptions {
        total_bytes: 256 * MIB,
        slot_bytes: 128 * MIB,
    };
    let m =
        GuestMemory::new_with_hotplug(&opts(256, PageSize::Small), &real(), None, Some(hotplug))
            .unwrap();
    let part = &m.hotplug()[0];
    let base = part.slice().guest_addr;
    let second = base + 128 * MIB;
    let view = m.view();
    let plugged = view.plugged();
    assert!(view.write_obj(7u64, GuestAddress(second)).is_err());
    assert!(view.find_region(GuestAddress(second)).is_none());
    assert!(plugged.set(second, true));
    assert!(plugged.is_plugged(second + 4096) && !plugged.is_plugged(base));
    view.write_obj(0x5eed_u64, GuestAddress(second + 8))
        .unwrap();
    // SAFETY: inside the part's mapping (its second slot).
    let host =
        unsafe { ((part.host_addr() + 128 * MIB as usize + 8) as *const u64).read_volatile() };
    assert_eq!(host, 0x5eed);
    assert_eq!(
        view.read_obj::<u64>(GuestAddress(second + 8)).unwrap(),
        0x5eed
    );
    // The first slot is still unplugged: a range that runs into it from
    // RAM's end, or from it into the plugged one, is not whole.
    assert!(!view.check_range(GuestAddress(second - 8), 16));
    assert!(view.check_range(GuestAddress(second), 4096));
    // RAM's regions alone are iterated (the balloon's map of RAM).
    assert_eq!(view.iter().count(), 1);
    assert!(plugged.set(second, false));
    assert!(view.read_obj::<u64>(GuestAddress(second + 8)).is_err());
    // Outside the region: nothing to set.
    assert!(!plugged.set(base + 256 * MIB, true));
    assert!(!plugged.set(0, true));
}

/// The reclaim counts what the guest owned, not the pages it only read:
/// those map the shared zero page, which `mincore` calls resident but
/// nothing frees (a summary used to say "reclaimed 256 MiB" of a guest
/// that had written 133).
#[test]
fn pages_only_read_are_not_counted_as_reclaimed() {
    let topo = real();
    let m = GuestMemory::new(&opts(64, PageSize::Small), &topo).unwrap();
    let view = m.view();
    for a in (0..16u64 << 20).step_by(4096) {
        view.write_obj(a, GuestAddress(a)).unwrap();
    }
    for a in ((16u64 << 20)..(48 << 20)).step_by(4096) {
        assert_eq!(view.read_obj::<u64>(GuestAddress(a)).unwrap(), 0);
    }
    drop(view);
    assert_eq!(resident(&m), 48 << 20, "mincore counts the zero page");
    let r = m
        .reclaim(&ReclaimOptions::default(), &topo, &ReclaimProgress::new())
        .unwrap();
    if super::super::pagemap::owned_bytes(0, 0).is_none() {
        return teravm_client::not_possible(
            "memory::guest::pages_only_read_are_not_counted_as_reclaimed",
            "this kernel has no PAGEMAP_SCAN (Linux 6.7): mincore counts the zero page",
        );
    }
    assert_eq!(r.resident_bytes_freed, 16 << 20, "{r:?}");
}
