//! Tests of the reclaim executor on plain mappings (no KVM).

use std::collections::HashMap;
use std::os::fd::{AsRawFd, FromRawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use super::super::numa::HostNode;
use super::super::progress::ReclaimState;
use super::*;

const MIB: usize = 1 << 20;

/// A test mapping, unmapped on drop.
pub(crate) struct Map {
    pub addr: usize,
    pub len: usize,
    pub memfd: Option<std::fs::File>,
}

impl Map {
    /// Private anonymous memory with 4 KiB pages (MADV_NOHUGEPAGE).
    pub fn anon(len: usize) -> Map {
        // SAFETY: a fresh anonymous mapping; no existing memory is affected.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        // SAFETY: our own fresh mapping.
        unsafe { sys::madvise(p as usize, len, libc::MADV_NOHUGEPAGE) }.unwrap();
        Map {
            addr: p as usize,
            len,
            memfd: None,
        }
    }

    /// A shared mapping of a fresh memfd.
    pub fn memfd(len: usize) -> Map {
        // SAFETY: the name is a NUL-terminated literal.
        let fd = unsafe { libc::memfd_create(c"teravm-test".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0);
        // SAFETY: fd is a fresh descriptor we own.
        let file = unsafe { std::fs::File::from_raw_fd(fd) };
        file.set_len(len as u64).unwrap();
        // SAFETY: a fresh shared mapping of our own file.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        Map {
            addr: p as usize,
            len,
            memfd: Some(file),
        }
    }

    /// Writes a non-zero word into every page.
    pub fn touch(&self) {
        for off in (0..self.len).step_by(4096) {
            // SAFETY: inside our own writable mapping, aligned.
            unsafe { ((self.addr + off) as *mut u64).write_volatile(0xdead_beef) };
        }
    }

    pub fn resident(&self) -> u64 {
        sys::resident_bytes(self.addr, self.len, &mut Vec::new()).unwrap()
    }

    /// Whether every page reads zero (at its first and last word).
    pub fn reads_zero(&self) -> bool {
        (0..self.len).step_by(4096).all(|off| {
            // SAFETY: inside our own readable mapping, aligned.
            unsafe {
                ((self.addr + off) as *const u64).read_volatile() == 0
                    && ((self.addr + off + 4088) as *const u64).read_volatile() == 0
            }
        })
    }

    /// Bytes of file blocks allocated to the memfd.
    pub fn file_bytes(&self) -> u64 {
        use std::os::unix::fs::MetadataExt;
        self.memfd.as_ref().unwrap().metadata().unwrap().blocks() * 512
    }

    pub fn range(&self, node: u32) -> HostRange {
        HostRange {
            node,
            host_addr: self.addr,
            len: self.len as u64,
            method: match &self.memfd {
                None => FreeMethod::DontNeed,
                Some(f) => FreeMethod::PunchHole {
                    fd: f.as_raw_fd(),
                    file_offset: 0,
                },
            },
        }
    }
}

impl Drop for Map {
    fn drop(&mut self) {
        // SAFETY: our own mapping, no longer used.
        unsafe { libc::munmap(self.addr as *mut libc::c_void, self.len) };
    }
}

fn real_topology() -> HostTopology {
    HostTopology::from_sysfs(std::path::Path::new("/sys")).unwrap()
}

/// A fake 4-node host whose nodes' CPUs are the real CPUs, alternating.
fn fake_four_nodes() -> HostTopology {
    let cpus = sys::get_affinity().unwrap();
    let pick = |i: usize| vec![cpus[i % cpus.len()]];
    HostTopology {
        nodes: (0..4)
            .map(|i| HostNode {
                id: i,
                cpus: pick(i as usize),
                mem_total_bytes: 1 << 30,
            })
            .collect(),
        source: crate::memory::numa::TopologySource::Sysfs("(built by a test)".into()),
    }
}

fn opts(workers_per_node: u32, chunk: usize, steal: bool) -> ReclaimOptions {
    ReclaimOptions {
        workers_per_node,
        chunk_bytes: Some(chunk as u64),
        parallel_threshold_bytes: 0,
        steal,
    }
}

fn assert_freed(maps: &[&Map], report: &ReclaimReport, touched: u64) {
    assert_eq!(report.state, ReclaimState::Done);
    assert_eq!(report.address_bytes_done, report.address_bytes);
    assert!(
        report.resident_bytes_freed >= touched / 10 * 9,
        "{} of {touched}",
        report.resident_bytes_freed
    );
    for m in maps {
        assert!(
            m.resident() <= m.len as u64 / 100,
            "resident after: {}",
            m.resident()
        );
        if m.memfd.is_some() {
            assert!(
                m.file_bytes() <= m.len as u64 / 100,
                "blocks after: {}",
                m.file_bytes()
            );
        }
        assert!(m.reads_zero());
    }
}

#[test]
fn anonymous_4k_is_freed_in_parallel() {
    let m = Map::anon(64 * MIB);
    m.touch();
    assert!(m.resident() >= 60 * MIB as u64);
    let progress = ReclaimProgress::new();
    // SAFETY: our own mapping, not used during the call.
    let r = unsafe {
        execute(
            &[m.range(0)],
            &opts(2, 8 * MIB, true),
            &real_topology(),
            &progress,
        )
    }
    .unwrap();
    assert_eq!(r.workers, 2);
    assert_freed(&[&m], &r, 64 * MIB as u64);
    assert_eq!(progress.snapshot(), r);
}

#[test]
fn memfd_is_hole_punched_on_one_thread_below_threshold() {
    let m = Map::memfd(64 * MIB);
    m.touch();
    assert!(m.file_bytes() >= 64 * MIB as u64);
    let o = ReclaimOptions {
        parallel_threshold_bytes: 1 << 30,
        ..opts(2, 16 * MIB, true)
    };
    let progress = ReclaimProgress::new();
    // SAFETY: our own mapping, not used during the call.
    let r = unsafe { execute(&[m.range(0)], &o, &real_topology(), &progress) }.unwrap();
    assert_eq!(r.workers, 1);
    assert_eq!(r.nodes.len(), 1);
    assert_freed(&[&m], &r, 64 * MIB as u64);
}

/// Runs a reclaim over `maps` (map i on node `nodes[i]`) with hooks that
/// count each chunk freed, by whom, and what each worker's affinity was.
struct Run {
    result: Result<ReclaimReport, ReclaimError>,
    freed: HashMap<(usize, u64), Vec<String>>,
    affinity: Vec<(u32, u32, Vec<usize>)>,
    chunks: u64,
}

fn run(
    maps: &[&Map],
    nodes: &[u32],
    o: &ReclaimOptions,
    before: &(dyn Fn(usize, u64) + Sync),
) -> Run {
    let ranges: Vec<HostRange> = maps.iter().zip(nodes).map(|(m, &n)| m.range(n)).collect();
    let freed = Mutex::new(HashMap::<(usize, u64), Vec<String>>::new());
    let affinity = Mutex::new(Vec::new());
    let on_start = |node: u32, index: u32| {
        affinity
            .lock()
            .unwrap()
            .push((node, index, sys::get_affinity().unwrap()));
    };
    let after = |name: &str, q: usize, i: u64| {
        freed
            .lock()
            .unwrap()
            .entry((q, i))
            .or_default()
            .push(name.to_string());
    };
    let hooks = Hooks {
        on_start: Some(&on_start),
        before_free: Some(before),
        after_free: Some(&after),
    };
    let chunk = o.chunk_bytes_for(&ranges);
    let chunks = plan_chunks(
        &ranges.iter().map(|r| (r.node, r.len)).collect::<Vec<_>>(),
        chunk,
    )
    .chunk_count();
    // SAFETY: our own mappings, not used during the call.
    let result = unsafe {
        execute_with(
            &ranges,
            o,
            &fake_four_nodes(),
            &ReclaimProgress::new(),
            &hooks,
        )
    };
    Run {
        result,
        freed: freed.into_inner().unwrap(),
        affinity: affinity.into_inner().unwrap(),
        chunks,
    }
}

#[test]
fn four_fake_nodes_pinned_each_chunk_once() {
    let maps: Vec<Map> = (0..4).map(|_| Map::anon(16 * MIB)).collect();
    maps.iter().for_each(Map::touch);
    let refs: Vec<&Map> = maps.iter().collect();
    let r = run(&refs, &[0, 1, 2, 3], &opts(2, 2 * MIB, false), &|_, _| {});
    let report = r.result.unwrap();
    assert_eq!(report.workers, 8);
    assert_eq!(report.nodes.len(), 4);
    assert_eq!(r.freed.len() as u64, r.chunks);
    assert_eq!(r.chunks, 32);
    for ((q, _), by) in &r.freed {
        assert_eq!(by.len(), 1, "each chunk freed exactly once");
        assert!(
            by[0].starts_with(&format!("reclaim-n{q}-")),
            "no stealing: {by:?}"
        );
    }
    let topo = fake_four_nodes();
    assert_eq!(r.affinity.len(), 8);
    for (node, _, seen) in &r.affinity {
        assert_eq!(
            seen,
            &topo.node(*node).unwrap().cpus,
            "worker of node {node}"
        );
    }
    for n in &report.nodes {
        assert_eq!(n.address_bytes_done, 16 * MIB as u64);
        assert_eq!(n.workers, 2);
    }
    assert_freed(&refs, &report, 64 * MIB as u64);
}

#[test]
fn an_idle_worker_steals_from_the_queue_with_most_left() {
    // Nodes 0 (8 chunks) and 2 (4 chunks) have one worker each, held before
    // each chunk until node 1's worker (1 chunk) has stolen one: the reclaim
    // can only go on by stealing (without it the held workers time out once
    // and the test fails), and the thief's first pick is the queue with the
    // most left, node 0's (at least 7 against at most 4).
    let maps = [Map::anon(16 * MIB), Map::anon(2 * MIB), Map::anon(8 * MIB)];
    maps.iter().for_each(Map::touch);
    let refs: Vec<&Map> = maps.iter().collect();
    let stolen = (Mutex::new(None::<usize>), Condvar::new());
    let timed_out = AtomicBool::new(false);
    let gate = |q: usize, _i: u64| {
        let me = std::thread::current().name().unwrap_or("").to_string();
        let mut first = stolen.0.lock().unwrap();
        if me == "reclaim-n1-0" && q != 1 {
            first.get_or_insert(q);
            stolen.1.notify_all();
        } else if (me == "reclaim-n0-0" || me == "reclaim-n2-0")
            && !timed_out.load(Ordering::Relaxed)
        {
            let (first, wait) = stolen
                .1
                .wait_timeout_while(first, Duration::from_secs(10), |s| s.is_none())
                .unwrap();
            drop(first);
            if wait.timed_out() {
                timed_out.store(true, Ordering::Relaxed);
            }
        }
    };
    let r = run(&refs, &[0, 1, 2], &opts(1, 2 * MIB, true), &gate);
    let report = r.result.unwrap();
    assert!(
        !timed_out.load(Ordering::Relaxed),
        "node 1's worker stole within 10 s"
    );
    assert_eq!(
        *stolen.0.lock().unwrap(),
        Some(0),
        "first steal from node 0"
    );
    assert_eq!(r.freed.len() as u64, r.chunks);
    assert!(r.freed.values().all(|by| by.len() == 1));
    let stolen = r
        .freed
        .iter()
        .filter(|((q, _), by)| *q != 1 && by[0] == "reclaim-n1-0")
        .count();
    assert!(stolen > 0, "node 1's worker freed chunks of other nodes");
    assert_eq!(report.nodes[0].address_bytes_done, 16 * MIB as u64);
    assert_freed(&refs, &report, 26 * MIB as u64);
}

#[test]
fn a_panicking_worker_still_frees_everything() {
    let maps: Vec<Map> = (0..4).map(|_| Map::anon(8 * MIB)).collect();
    maps.iter().for_each(Map::touch);
    let refs: Vec<&Map> = maps.iter().collect();
    let boom = |q: usize, i: u64| {
        if q == 1 && i == 1 {
            panic!("injected reclaim panic");
        }
    };
    let r = run(&refs, &[0, 1, 2, 3], &opts(1, 2 * MIB, false), &boom);
    let Err(ReclaimError::Failed { failures, report }) = r.result else {
        panic!("expected a failure");
    };
    assert_eq!((failures.total(), failures.kept().len()), (1, 1));
    assert!(
        failures.kept()[0].contains("reclaim-n1-0 panicked: injected reclaim panic"),
        "{failures:?}"
    );
    assert_eq!(report.state, ReclaimState::Failed);
    assert_eq!(report.address_bytes_done, report.address_bytes);
    assert_eq!(r.freed.len() as u64, r.chunks);
    assert!(r.freed.values().all(|by| by.len() == 1));
    assert_eq!(r.freed[&(1, 1)], vec!["fallback".to_string()]);
    for m in &maps {
        assert_eq!(m.resident(), 0);
        assert!(m.reads_zero());
    }
}

#[test]
fn a_failing_chunk_is_reported() {
    // A range that is not mapped: mincore fails, the fallback fails too.
    let bogus = HostRange {
        node: 0,
        host_addr: 4096,
        len: 8192,
        method: FreeMethod::DontNeed,
    };
    // SAFETY: the range is not mapped: nothing can be freed.
    let e = unsafe {
        execute(
            &[bogus],
            &opts(1, 4096, false),
            &real_topology(),
            &ReclaimProgress::new(),
        )
    }
    .unwrap_err();
    let text = e.to_string();
    assert!(
        // The count (`mincore`, or PAGEMAP_SCAN, which finds nothing in a
        // hole) or the free (`madvise`) fails first.
        (text.contains("mincore") || text.contains("madvise")) && text.contains("caller thread"),
        "{text}"
    );
}

#[test]
fn many_failing_chunks_keep_the_first_texts_and_a_count() {
    // 100 unmapped chunks: the worker fails on its first and stops, then the
    // caller's thread tries each of the 100 once.
    let bogus = HostRange {
        node: 0,
        host_addr: 4096,
        len: 100 * 4096,
        method: FreeMethod::DontNeed,
    };
    // SAFETY: the range is not mapped: nothing can be freed.
    let e = unsafe {
        execute(
            &[bogus],
            &opts(1, 4096, false),
            &real_topology(),
            &ReclaimProgress::new(),
        )
    }
    .unwrap_err();
    let text = e.to_string();
    let ReclaimError::Failed { failures, report } = e else {
        panic!("{text}");
    };
    assert_eq!(failures.total(), 101);
    assert_eq!(failures.kept().len(), Failures::KEPT);
    assert!(
        failures.kept()[0].starts_with("reclaim-n0-0: mincore")
            || failures.kept()[0].starts_with("reclaim-n0-0: madvise"),
        "{text}"
    );
    assert!(text.starts_with("reclaim had 101 failure(s): "), "{text}");
    assert!(text.ends_with("; and 93 more"), "{text}");
    assert_eq!(report.state, ReclaimState::Failed);
    assert_eq!(report.address_bytes_done, 0);
}

#[test]
fn bad_options_and_reused_progress() {
    let topo = real_topology();
    let p = ReclaimProgress::new();
    // SAFETY: no range.
    let e = unsafe { execute(&[], &opts(0, MIB, true), &topo, &p) }.unwrap_err();
    assert!(matches!(e, ReclaimError::InvalidOptions(_)));
    // SAFETY: no range.
    let e = unsafe { execute(&[], &opts(1, 0, true), &topo, &p) }.unwrap_err();
    assert!(matches!(e, ReclaimError::InvalidOptions(_)));
    // SAFETY: no range.
    let r = unsafe { execute(&[], &opts(1, MIB, true), &topo, &p) }.unwrap();
    assert_eq!((r.state, r.address_bytes), (ReclaimState::Done, 0));
    // SAFETY: no range.
    let e = unsafe { execute(&[], &opts(1, MIB, true), &topo, &p) }.unwrap_err();
    assert!(matches!(e, ReclaimError::ProgressReused));
}

#[test]
fn progress_is_readable_while_running() {
    let m = Map::anon(32 * MIB);
    m.touch();
    let progress = ReclaimProgress::new();
    let range = m.range(0);
    let slow = |_: usize, _: u64| std::thread::sleep(std::time::Duration::from_millis(3));
    let hooks = Hooks {
        before_free: Some(&slow),
        ..Hooks::default()
    };
    std::thread::scope(|s| {
        let reader = s.spawn(|| {
            let mut last = 0;
            let mut seen_running = false;
            loop {
                let r = progress.snapshot();
                assert!(r.address_bytes_done >= last);
                last = r.address_bytes_done;
                seen_running |= r.state == ReclaimState::Running;
                if r.state == ReclaimState::Done {
                    return seen_running;
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        });
        // SAFETY: our own mapping, not used during the call.
        unsafe {
            execute_with(
                &[range],
                &opts(1, MIB, false),
                &real_topology(),
                &progress,
                &hooks,
            )
        }
        .unwrap();
        assert!(reader.join().unwrap(), "a reader saw the reclaim running");
    });
}

/// The share of reclaim time that progress accounting costs, at 4 KiB and
/// THP (run by hand: it touches 2 GiB at a time).
#[test]
#[ignore]
fn accounting_share() {
    // The share of reclaim time spent on progress accounting, chunk by chunk
    // as the executor does it: the count of a 1 GiB chunk (PAGEMAP_SCAN, as
    // anonymous memory is counted, and `mincore`, as before and as memory
    // files are), then its free.
    // Run: cargo test --release --lib accounting_share -- --ignored --nocapture
    const GIB: usize = 1 << 30;
    super::super::pagemap::open();
    for (name, advice) in [("4k", libc::MADV_NOHUGEPAGE), ("thp", libc::MADV_HUGEPAGE)] {
        let mut shares = Vec::new();
        let (mut scan_total, mut acc_total, mut free_total) = (0f64, 0f64, 0f64);
        for _ in 0..3 {
            let m = Map::anon(2 * GIB);
            // SAFETY: our own fresh mapping; advice keeps contents.
            unsafe { sys::madvise(m.addr, m.len, advice) }.unwrap();
            // SAFETY: as above; populate only faults pages in.
            unsafe { sys::madvise(m.addr, m.len, libc::MADV_POPULATE_WRITE) }.unwrap();
            let mut buf = Vec::new();
            let (mut scan, mut acc, mut free) = (0f64, 0f64, 0f64);
            for c in 0..2 {
                let addr = m.addr + c * GIB;
                let t = std::time::Instant::now();
                if let Some(owned) = super::super::pagemap::owned_bytes(addr, GIB) {
                    assert_eq!(owned.unwrap(), GIB as u64);
                }
                scan += t.elapsed().as_secs_f64();
                let t = std::time::Instant::now();
                let r = sys::resident_bytes(addr, GIB, &mut buf).unwrap();
                acc += t.elapsed().as_secs_f64();
                assert_eq!(r, GIB as u64);
                let t = std::time::Instant::now();
                // SAFETY: our own mapping.
                unsafe { sys::madvise(addr, GIB, libc::MADV_DONTNEED) }.unwrap();
                free += t.elapsed().as_secs_f64();
            }
            shares.push(scan / (scan + free));
            scan_total += scan;
            acc_total += acc;
            free_total += free;
        }
        shares.sort_by(f64::total_cmp);
        eprintln!(
            "{name}: PAGEMAP_SCAN {:.2} ms/GiB, mincore {:.2} ms/GiB, free {:.2} ms/GiB, scan share median {:.1}% (runs {:?})",
            scan_total * 1e3 / 6.0,
            acc_total * 1e3 / 6.0,
            free_total * 1e3 / 6.0,
            shares[1] * 100.0,
            shares
                .iter()
                .map(|s| format!("{:.1}%", s * 100.0))
                .collect::<Vec<_>>()
        );
    }
}

/// The `VmFlags` of the mapping that starts at `addr`, from
/// `/proc/self/smaps`.
fn vm_flags(addr: usize) -> Vec<String> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let start = format!("{addr:x}-");
    let mut lines = smaps.lines().skip_while(|l| !l.starts_with(&start));
    assert!(lines.next().is_some(), "no mapping at {addr:#x}");
    let flags = lines
        .find_map(|l| l.strip_prefix("VmFlags:"))
        .expect("a VmFlags line");
    flags.split_whitespace().map(str::to_string).collect()
}

#[test]
fn memory_files_lose_their_recency_before_they_are_freed_and_anonymous_memory_keeps_it() {
    // The kernel's name for VM_RAND_READ in smaps is "rr": without it, the
    // zap of each young page of a file activates it on the LRU first.
    let f = Map::memfd(16 * MIB);
    let a = Map::anon(16 * MIB);
    f.touch();
    a.touch();
    assert!(!vm_flags(f.addr).contains(&"rr".to_string()));
    let progress = ReclaimProgress::new();
    // SAFETY: our own mappings, not used during the call.
    let r = unsafe {
        execute(
            &[f.range(0), a.range(0)],
            &opts(2, 4 * MIB, true),
            &real_topology(),
            &progress,
        )
    }
    .unwrap();
    assert_freed(&[&f, &a], &r, 32 * MIB as u64);
    assert!(
        vm_flags(f.addr).contains(&"rr".to_string()),
        "{:?}",
        vm_flags(f.addr)
    );
    assert!(
        !vm_flags(a.addr).contains(&"rr".to_string()),
        "{:?}",
        vm_flags(a.addr)
    );
}

#[test]
fn the_default_chunk_of_memory_files_is_their_largest_stripe() {
    let o = ReclaimOptions {
        chunk_bytes: None,
        ..opts(2, 0, true)
    };
    let file = |len: u64| HostRange {
        node: 0,
        host_addr: 0,
        len,
        method: FreeMethod::PunchHole {
            fd: -1,
            file_offset: 0,
        },
    };
    // Stripes of 128 MiB and a shorter last one: one file a chunk.
    let stripes = [
        file(128 * MIB as u64),
        file(128 * MIB as u64),
        file(64 * MIB as u64),
    ];
    assert_eq!(o.chunk_bytes_for(&stripes), 128 * MIB as u64);
    // Anonymous memory: the guest-sized default (4 chunks a worker).
    let anon = HostRange {
        method: FreeMethod::DontNeed,
        ..file(1 << 30)
    };
    assert_eq!(o.chunk_bytes_for(&[anon]), (1 << 30) / 8);
    // A chunk given is used as given.
    assert_eq!(
        opts(2, 4 * MIB, true).chunk_bytes_for(&stripes),
        4 * MIB as u64
    );
}
