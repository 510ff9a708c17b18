//! guest_memfd memory on a real KVM VM: the files, the memslots that bind
//! them, populate by `fallocate`, reclaim by zap-then-punch.

use std::path::Path;
use std::sync::atomic::AtomicBool;

use vm_memory::{Bytes, GuestAddress};

use super::super::options::{Backing, MemoryOptions, NumaPolicy, PageSize};
use super::super::progress::ReclaimProgress;
use super::super::reclaim::ReclaimOptions;
use super::super::{GuestMemory, GuestMemoryError, HostTopology, PopulateProgress};
use super::*;
use crate::vstate::vm::Vm;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// The VM, where this host's KVM has guest_memfd as teravm needs it;
/// where it lacks it, `NOT POSSIBLE HERE` with what it lacks (appended to
/// `$TERAVM_NOT_POSSIBLE` too, for `.ci/run`'s closing count), not a
/// failure: no install makes a kernel feature appear.
pub(crate) fn vm() -> Option<Vm> {
    match Vm::new() {
        Ok(vm) => match Vm::guest_memfd_available() {
            Ok(()) => Some(vm),
            Err(why) => {
                teravm_client::not_possible("memory::gmem::kvm_tests", why);
                None
            }
        },
        Err(e) => {
            if std::env::var("CI").is_ok_and(|v| v.eq_ignore_ascii_case("true")) {
                panic!("a KVM test cannot run in CI (CI=true): {e}");
            }
            eprintln!("SKIPPED: {e}");
            None
        }
    }
}

fn gmem(mib: u64, policy: NumaPolicy) -> MemoryOptions {
    MemoryOptions {
        mem_bytes: mib * MIB,
        page_size: PageSize::Small,
        backing: Backing::GuestMemfd,
        policy,
        ..MemoryOptions::default()
    }
}

fn cached(m: &GuestMemory) -> u64 {
    m.slices()
        .iter()
        .flat_map(|s| s.stripes())
        .map(|s| allocated_bytes(&s.file).unwrap())
        .sum()
}

#[test]
fn guest_memfd_slices_are_striped_bound_per_stripe_populated_and_freed() {
    let Some(vm) = vm() else { return };
    let topo = HostTopology::from_sysfs(Path::new("/sys")).unwrap();
    let m = GuestMemory::new_with(&gmem(2048 + 64, NumaPolicy::Bind), &topo, Some(&vm)).unwrap();
    let s = &m.slices()[0];
    assert_eq!(s.backing(), Backing::GuestMemfd);
    let lens: Vec<u64> = s.stripes().iter().map(|s| s.len).collect();
    let mut want = vec![128 * MIB; 16];
    want.push(64 * MIB);
    assert_eq!(lens, want, "128 MiB stripes and the rest");
    // This host's kernel keeps no policy for the file (checked here, so
    // that a kernel that does shows up as a changed answer).
    assert!(matches!(
        s.numa_binding(),
        NumaBinding::IgnoredByKernel | NumaBinding::FilePolicy
    ));
    // One memslot per stripe, each bound to its own file at offset 0, over
    // the one contiguous mapping.
    let slots = m.slots();
    assert_eq!(slots.len(), 17);
    for (slot, stripe) in slots.iter().zip(s.stripes()) {
        let b = slot.guest_memfd.expect("bound");
        assert_eq!(b.offset, 0);
        assert_eq!(
            std::os::fd::AsRawFd::as_raw_fd(&b.fd),
            std::os::fd::AsRawFd::as_raw_fd(&stripe.file)
        );
        assert_eq!(slot.host_addr, s.host_addr() as u64 + stripe.offset);
        assert_eq!(slot.guest_addr, stripe.offset);
    }
    // teravm writes through its mapping into the files.
    m.view()
        .mem()
        .write_obj(0xfeed_u32, GuestAddress(GIB + 8))
        .unwrap();
    assert_eq!(cached(&m), 4096);
    assert_eq!(
        m.view()
            .mem()
            .read_obj::<u32>(GuestAddress(GIB + 8))
            .unwrap(),
        0xfeed
    );
    // Populate allocates every page without changing what was written.
    let stats = m
        .populate(2, &topo, &PopulateProgress::new(), &AtomicBool::new(false))
        .unwrap();
    assert_eq!(stats.bytes, (2048 + 64) * MIB);
    assert_eq!(cached(&m), (2048 + 64) * MIB);
    assert_eq!(
        m.view()
            .mem()
            .read_obj::<u32>(GuestAddress(GIB + 8))
            .unwrap(),
        0xfeed
    );
    let p = m.slices()[0].placement().expect("checked after populate");
    assert_eq!((p.sampled_pages, p.on_node), (64, 64));
    // Reclaim counts what the files held and frees it.
    let report = m
        .reclaim(&ReclaimOptions::default(), &topo, &ReclaimProgress::new())
        .unwrap();
    assert_eq!(report.resident_bytes_freed, (2048 + 64) * MIB);
}

#[test]
fn guest_memfd_needs_its_vm_and_takes_no_hugetlb_pages() {
    let topo = HostTopology::from_sysfs(Path::new("/sys")).unwrap();
    let e = GuestMemory::new(&gmem(64, NumaPolicy::None), &topo).unwrap_err();
    assert!(matches!(e, GuestMemoryError::GuestMemfdNeedsVm), "{e}");
    let Some(vm) = vm() else { return };
    let mut o = gmem(64, NumaPolicy::None);
    o.page_size = PageSize::Huge2M;
    let e = GuestMemory::new_with(&o, &topo, Some(&vm)).unwrap_err();
    assert!(e.to_string().contains("huge_pages \"None\""), "{e}");
    // Transparent gives 4 KiB pages: no advice, so no EINVAL.
    o.page_size = PageSize::Transparent;
    let m = GuestMemory::new_with(&o, &topo, Some(&vm)).unwrap();
    assert_eq!(m.slices()[0].numa_binding(), NumaBinding::NotAsked);
    assert_eq!(m.slices()[0].stripes().len(), 1);
}
