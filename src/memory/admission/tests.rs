//! The admission's tests: the rule, the cgroup trees (v1, v2, a jail's
//! mount root), meminfo and sysinfo.

use super::super::numa::fake::TempDir;
use super::super::options::PageSize;
use super::*;

const GIB: u64 = 1 << 30;

fn opts(gib: u64, page_size: PageSize, populate: bool) -> MemoryOptions {
    MemoryOptions {
        mem_bytes: gib * GIB,
        page_size,
        populate,
        ..MemoryOptions::default()
    }
}

#[test]
fn the_rule() {
    let host = HostMemory {
        cgroup: Some(CgroupRoom {
            dir: "/sys/fs/cgroup/x".into(),
            limit: GIB,
            usage: 100 * MIB,
        }),
        mem_available: Some(8 * GIB),
        mem_total: Some(16 * GIB),
        free_huge_pages: Some((
            3,
            "/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages".into(),
        )),
        ..HostMemory::default()
    };
    // Sparse guests are always admitted.
    assert_eq!(admit(&opts(64, PageSize::Small, false), &host), Ok(()));
    assert_eq!(
        admit(&opts(64, PageSize::Transparent, false), &host),
        Ok(())
    );
    // Populated: the cgroup's room (924 MiB) is the tightest.
    let e = admit(&opts(4, PageSize::Transparent, true), &host).unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("4096 MiB") && text.contains("924 MiB"),
        "{text}"
    );
    assert!(text.contains("limit 1024 MiB, usage 100 MiB"), "{text}");
    assert!(!text.contains('\n'));
    let small = MemoryOptions {
        mem_bytes: 900 * MIB,
        populate: true,
        ..MemoryOptions::default()
    };
    assert_eq!(admit(&small, &host), Ok(()));
    // Without a cgroup limit, MemAvailable.
    let host2 = HostMemory {
        cgroup: None,
        ..host.clone()
    };
    assert_eq!(admit(&opts(4, PageSize::Small, true), &host2), Ok(()));
    let e = admit(&opts(9, PageSize::Small, true), &host2).unwrap_err();
    assert!(e.to_string().contains("MemAvailable (8192 MiB)"), "{e}");
    // hugetlb: the free pages, populated or not; the cgroup does not
    // count them.
    let e = admit(&opts(1, PageSize::Huge2M, false), &host).unwrap_err();
    assert_eq!(
        e,
        AdmissionError::HugePages {
            need: 512,
            free: 3,
            page: 2 * MIB,
            path: "/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages".into()
        }
    );
    assert!(e.to_string().contains("512 huge pages of 2 MiB"), "{e}");
    let few = MemoryOptions {
        mem_bytes: 6 * MIB,
        page_size: PageSize::Huge2M,
        populate: true,
        ..MemoryOptions::default()
    };
    assert_eq!(admit(&few, &host), Ok(()));
}

#[test]
fn a_sparse_guest_larger_than_the_cgroup_or_the_host_is_said_once() {
    let cg = HostMemory {
        cgroup: Some(CgroupRoom {
            dir: "/sys/fs/cgroup/x".into(),
            limit: 4 * GIB,
            usage: 0,
        }),
        mem_available: Some(8 * GIB),
        mem_total: Some(16 * GIB),
        free_huge_pages: None,
        ..HostMemory::default()
    };
    let w = sparse_warning(&opts(8, PageSize::Small, false), &cg).unwrap();
    assert!(
        w.contains("8192 MiB") && w.contains("/sys/fs/cgroup/x's limit (4096 MiB)"),
        "{w}"
    );
    assert!(!w.contains('\n'));
    let host = HostMemory {
        cgroup: None,
        ..cg.clone()
    };
    let w = sparse_warning(&opts(1024, PageSize::Transparent, false), &host).unwrap();
    assert!(w.contains("MemTotal) (16384 MiB)"), "{w}");
    // Within both, populated (admission decides) or hugetlb: nothing.
    assert_eq!(sparse_warning(&opts(2, PageSize::Small, false), &cg), None);
    assert_eq!(sparse_warning(&opts(8, PageSize::Small, true), &cg), None);
    assert_eq!(
        sparse_warning(&opts(32, PageSize::Huge2M, false), &host),
        None
    );
    // A limit above the host: the host's memory is what is exceeded.
    let loose = HostMemory {
        cgroup: Some(CgroupRoom {
            limit: 64 * GIB,
            ..cg.cgroup.clone().unwrap()
        }),
        ..cg.clone()
    };
    let w = sparse_warning(&opts(32, PageSize::Small, false), &loose).unwrap();
    assert!(w.contains("MemTotal"), "{w}");
}

#[test]
fn meminfo_keys() {
    let t = "MemTotal:       24000000 kB\nMemAvailable:    1000 kB\nHugePages_Free: 0\n";
    assert_eq!(meminfo_bytes(t, "MemAvailable"), Some(1000 * 1024));
    assert_eq!(meminfo_bytes(t, "MemTotal"), Some(24_000_000 * 1024));
    assert_eq!(meminfo_bytes(t, "HugePages_Free"), None);
    assert_eq!(meminfo_bytes(t, "Mem"), None);
}

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

#[test]
fn cgroup_v1_and_v2_trees() {
    let t = TempDir::new("cgroup");
    let root = t.0.join("fs/cgroup");
    // v1: a limited parent and an unlimited child: the parent counts.
    let v1 = root.join("memory/a/b");
    write(&root.join("memory/a/memory.limit_in_bytes"), "1073741824\n");
    write(&root.join("memory/a/memory.usage_in_bytes"), "104857600\n");
    write(&v1.join("memory.limit_in_bytes"), "9223372036854771712\n");
    write(&v1.join("memory.usage_in_bytes"), "4096\n");
    let text = "4:memory:/a/b\n1:cpu:/\n0::/\n";
    let room = tightest_cgroup(text, &root).unwrap();
    assert_eq!(room.dir, root.join("memory/a"));
    assert_eq!(room.room(), GIB - 100 * MIB);
    // v2: memory.max "max" at the leaf, a number above.
    write(&root.join("x/memory.max"), "2147483648\n");
    write(&root.join("x/memory.current"), "0\n");
    write(&root.join("x/y/memory.max"), "max\n");
    write(&root.join("x/y/memory.current"), "12345\n");
    let room = tightest_cgroup("0::/x/y\n", &root).unwrap();
    assert_eq!((room.limit, room.usage), (2 * GIB, 0));
    // No limit anywhere, or no files: none.
    assert_eq!(tightest_cgroup("0::/x/y/z\n", &root), None);
    assert_eq!(tightest_cgroup("garbage\n", &root), None);
    write(&root.join("x/memory.max"), "max\n");
    assert_eq!(tightest_cgroup("0::/x/y\n", &root), None);
}

#[test]
fn reads_a_whole_tree() {
    let t = TempDir::new("host-memory");
    let roots = Roots {
        proc: t.0.join("proc"),
        sys: t.0.join("sys"),
    };
    write(&roots.proc.join("self/cgroup"), "0::/vm\n");
    write(&roots.proc.join("meminfo"), "MemAvailable: 2048 kB\n");
    write(&roots.sys.join("fs/cgroup/vm/memory.max"), "1048576\n");
    write(&roots.sys.join("fs/cgroup/vm/memory.current"), "0\n");
    write(
        &roots
            .sys
            .join("kernel/mm/hugepages/hugepages-1048576kB/free_hugepages"),
        "2\n",
    );
    let h = HostMemory::read(&roots, Some(GIB));
    assert_eq!(h.cgroup_source, CgroupSource::ProcSelf);
    assert_eq!(h.available_source, AvailableSource::Meminfo);
    assert_eq!(
        h.describe(),
        format!(
            "memory limit: the memory cgroup {} (1 MiB, found through /proc/self/cgroup); \
             host memory: MemAvailable (/proc/meminfo)",
            roots.sys.join("fs/cgroup/vm").display()
        )
    );
    assert_eq!(h.mem_available, Some(2 << 20));
    assert_eq!(h.cgroup.unwrap().room(), MIB);
    assert_eq!(h.free_huge_pages.unwrap().0, 2);
    assert_eq!(
        HostMemory::read(&roots, Some(2 * MIB)).free_huge_pages,
        None
    );
}

#[test]
fn without_proc_the_cgroup_mount_is_the_process_cgroup() {
    // v1: the VM's cgroup bind-mounted at <root>/sys/fs/cgroup/memory.
    let t = TempDir::new("jail-v1");
    let roots = Roots {
        proc: t.0.join("proc"),
        sys: t.0.join("sys"),
    };
    let mem = roots.sys.join("fs/cgroup/memory");
    write(&mem.join("memory.limit_in_bytes"), "536870912\n");
    write(&mem.join("memory.usage_in_bytes"), "1048576\n");
    let h = HostMemory::read(&roots, None);
    assert_eq!(
        h.cgroup_source,
        CgroupSource::MountRoot(format!("no {}", roots.proc.join("self/cgroup").display()))
    );
    let c = h.cgroup.clone().unwrap();
    assert_eq!(
        (c.dir.clone(), c.limit, c.usage),
        (mem.clone(), 512 * MIB, MIB)
    );
    // No /proc/meminfo: sysinfo's free memory, named as such.
    assert_eq!(h.available_source, AvailableSource::Sysinfo);
    assert!(h.mem_available.is_some_and(|b| b > 0));
    assert!(h.mem_total.is_some_and(|b| b >= h.mem_available.unwrap()));
    let line = h.describe();
    assert_eq!(
        line,
        format!(
            "memory limit: the memory cgroup {} (512 MiB, mounted at /sys/fs/cgroup, \
             taken as this process's: no {}); host memory: free memory (sysinfo \
             freeram + bufferram, not MemAvailable: no /proc/meminfo)",
            mem.display(),
            roots.proc.join("self/cgroup").display()
        )
    );
    let e = admit(&opts(1, PageSize::Small, true), &h)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(&format!(
            "limit 512 MiB, usage 1 MiB, mounted at /sys/fs/cgroup, taken as this process's: \
             no {}) leaves 511 MiB",
            roots.proc.join("self/cgroup").display()
        )),
        "{e}"
    );

    // v2: the VM's cgroup mounted at <root>/sys/fs/cgroup.
    let t = TempDir::new("jail-v2");
    let roots = Roots {
        proc: t.0.join("proc"),
        sys: t.0.join("sys"),
    };
    let top = roots.sys.join("fs/cgroup");
    write(&top.join("memory.max"), "268435456\n");
    write(&top.join("memory.current"), "0\n");
    write(&top.join("cpu.max"), "max 100000\n");
    let h = HostMemory::read(&roots, None);
    assert_eq!(
        h.cgroup_source,
        CgroupSource::MountRoot(format!("no {}", roots.proc.join("self/cgroup").display()))
    );
    assert_eq!(h.cgroup.clone().unwrap().dir, top);
    assert_eq!(h.cgroup.clone().unwrap().room(), 256 * MIB);
    // Unlimited there: none, and said so.
    write(&top.join("memory.max"), "max\n");
    let h = HostMemory::read(&roots, None);
    assert_eq!(
        (h.cgroup_source.clone(), h.cgroup.clone()),
        (
            CgroupSource::MountRoot(format!("no {}", roots.proc.join("self/cgroup").display())),
            None
        )
    );
    assert!(
        h.describe().starts_with(
            "memory limit: none (the cgroup mounted at /sys/fs/cgroup, taken as this \
             process's as no "
        ),
        "{}",
        h.describe()
    );

    // /proc there, naming a cgroup that is not under this root's
    // /sys/fs/cgroup (a bind mount without a cgroup namespace): the
    // mount's root, and why.
    let t = TempDir::new("jail-v1-proc");
    let roots = Roots {
        proc: t.0.join("proc"),
        sys: t.0.join("sys"),
    };
    write(
        &roots.proc.join("self/cgroup"),
        "4:memory:/parent/vm\n0::/\n",
    );
    let mem = roots.sys.join("fs/cgroup/memory");
    write(&mem.join("memory.limit_in_bytes"), "536870912\n");
    write(&mem.join("memory.usage_in_bytes"), "0\n");
    let h = HostMemory::read(&roots, None);
    assert_eq!(h.cgroup.clone().map(|c| c.dir), Some(mem.clone()));
    assert_eq!(
        h.cgroup_source,
        CgroupSource::MountRoot(format!(
            "the memory cgroup {} names is not under {} here",
            roots.proc.join("self/cgroup").display(),
            roots.sys.join("fs/cgroup").display()
        ))
    );
    // Unlimited there too: as before, none through /proc/self/cgroup.
    write(&mem.join("memory.limit_in_bytes"), "9223372036854771712\n");
    let h = HostMemory::read(&roots, None);
    assert_eq!((h.cgroup, h.cgroup_source), (None, CgroupSource::ProcSelf));
}

#[test]
fn no_cgroup_visible_is_said_plainly() {
    let t = TempDir::new("jail-bare");
    let roots = Roots {
        proc: t.0.join("proc"),
        sys: t.0.join("sys"),
    };
    let h = HostMemory::read(&roots, None);
    let why = format!(
        "no memory cgroup visible: no {} and no {} in this root",
        roots.proc.join("self/cgroup").display(),
        roots.sys.join("fs/cgroup").display()
    );
    assert_eq!(h.cgroup_source, CgroupSource::NotVisible(why.clone()));
    assert_eq!(h.cgroup, None);
    assert!(
        h.describe().starts_with(&format!(
            "memory limit: {why}; host memory: free memory (sysinfo"
        )),
        "{}",
        h.describe()
    );
    // A refusal by the host's memory names the stand-in and the missing cgroup.
    let host = HostMemory {
        mem_available: Some(GIB),
        ..h
    };
    let e = admit(&opts(2, PageSize::Small, true), &host)
        .unwrap_err()
        .to_string();
    assert!(e.contains("the host's free memory (sysinfo freeram + bufferram, not MemAvailable: no /proc/meminfo) (1024 MiB; no memory cgroup visible"), "{e}");
}

#[test]
fn sysinfo_gives_the_hosts_memory() {
    let m = super::super::sys::sysinfo().unwrap();
    assert!(m.total > 0 && m.free > 0 && m.free <= m.total, "{m:?}");
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
    assert_eq!(Some(m.total), meminfo_bytes(&meminfo, "MemTotal"));
}

#[test]
fn this_host_can_be_read() {
    let h = HostMemory::read(&Roots::default(), Some(2 * MIB));
    assert!(h.mem_available.is_some_and(|b| b > 0));
    assert!(check(&opts(1, PageSize::Transparent, false)).is_ok());
}
