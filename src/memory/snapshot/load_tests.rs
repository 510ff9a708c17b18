//! A restored guest's memory on real mappings, files, userfaultfds and
//! Firecracker's own page fault handlers (no KVM): lazy (private file
//! mappings), eager (per-node load) and uffd.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::super::mapping::Contents;
use super::super::options::{MemoryOptions, NumaPolicy, PageSize};
use super::super::progress::ReclaimProgress;
use super::super::reclaim::{ReclaimError, ReclaimOptions};
use super::super::uffd::UffdError;
use super::super::NumaBinding;
use super::tests::{
    holds_pattern, host, memory, pattern, real, touch, two_fake_nodes, TempDir, MIB, PAGE,
};
use super::*;

/// Pages touched before the snapshot: both slices of a two-node guest of
/// 256 MiB (128 MiB each), at their edges too.
const TOUCHED: [u64; 6] = [
    0,
    17 * PAGE,
    128 * MIB - PAGE,
    128 * MIB,
    200 * MIB + 3 * PAGE,
    256 * MIB - PAGE,
];
/// Pages never touched: zero in the file and in the restored guest.
const UNTOUCHED: [u64; 3] = [PAGE, 100 * MIB, 129 * MIB];

/// A guest of `opts` with [`TOUCHED`] written, saved to `dir/mem`; the
/// file (reopened read-only) and its regions.
fn snapshot(dir: &TempDir, opts: &MemoryOptions, topo: &HostTopology) -> (File, Vec<FileRegion>) {
    let m = GuestMemory::new(opts, topo).unwrap();
    touch(&m, &TOUCHED);
    let file = dir.create("mem");
    m.write_memory_file(&file, &MemoryFileOptions::default(), topo)
        .unwrap();
    let regions = m.memory_file_regions();
    drop(m);
    (File::open(dir.0.join("mem")).unwrap(), regions)
}

/// The word at `addr` (a live guest mapping).
fn read(addr: usize) -> u64 {
    // SAFETY: callers pass addresses inside a live guest mapping, aligned.
    unsafe { (addr as *const u64).read_volatile() }
}

fn file_word(file: &File, offset: u64) -> u64 {
    let mut b = [0u8; 8];
    file.read_exact_at(&mut b, offset).unwrap();
    u64::from_ne_bytes(b)
}

/// Page `gpa` reads its pattern (touched) or zero (untouched).
fn check_contents(m: &GuestMemory) {
    for gpa in TOUCHED {
        assert!(holds_pattern(m, gpa), "page {gpa:#x}");
    }
    for gpa in UNTOUCHED {
        assert_eq!(read(host(m, gpa)), 0, "page {gpa:#x}");
    }
}

/// The `Uffd` backend with the userfaultfd from `userfaultfd(2)`, not
/// `/dev/userfaultfd` (whose path `memory::uffd`'s own test takes).
fn uffd_by_call(handler: PathBuf) -> SnapshotMemory {
    SnapshotMemory::Uffd {
        handler,
        device: None,
    }
}

#[test]
fn lazy_guest_reads_the_file_writes_its_own_copies_and_is_reclaimed() {
    let dir = TempDir::new("lazy");
    let topo = two_fake_nodes();
    let opts = memory(256, Backing::Anonymous, Some(vec![0, 1]));
    let (file, regions) = snapshot(&dir, &opts, &topo);
    assert_eq!(regions.len(), 2);
    let m = GuestMemory::from_snapshot(&opts, &topo, &regions, SnapshotMemory::Lazy(file)).unwrap();
    assert!(m
        .slices()
        .iter()
        .all(|s| s.contents() == Contents::MemoryFile));
    check_contents(&m);
    // Writes are the guest's own: the file keeps what it had.
    let (a, b) = (TOUCHED[3], UNTOUCHED[2]);
    for gpa in [a, b] {
        // SAFETY: inside the guest's live writable mapping, aligned.
        unsafe { (host(&m, gpa) as *mut u64).write_volatile(0xdead_beef) };
        assert_eq!(read(host(&m, gpa)), 0xdead_beef);
    }
    let f = File::open(dir.0.join("mem")).unwrap();
    assert_eq!(
        file_word(&f, a),
        pattern(a, 0),
        "private: the file is unchanged"
    );
    assert_eq!(file_word(&f, b), 0);
    // A snapshot of the restored guest has all of it: the pages still in
    // the file too.
    let again = dir.create("again");
    m.write_memory_file(&again, &MemoryFileOptions::default(), &topo)
        .unwrap();
    assert_eq!(file_word(&again, a), 0xdead_beef);
    assert_eq!(file_word(&again, b), 0xdead_beef);
    assert_eq!(file_word(&again, TOUCHED[5]), pattern(TOUCHED[5], 0));
    // Reclaim frees it as anonymous memory, counting only the copies the
    // guest wrote (the file's page cache pages are not its own).
    let counts_own = pagemap_answers(host(&m, 0));
    let report = m
        .reclaim(&ReclaimOptions::default(), &topo, &ReclaimProgress::new())
        .unwrap();
    assert_eq!(report.address_bytes, 256 * MIB);
    assert_eq!(report.address_bytes_done, 256 * MIB);
    if counts_own {
        assert_eq!(report.resident_bytes_freed, 2 * PAGE, "{report:?}");
    }
    assert_eq!(file_word(&f, a), pattern(a, 0));
}

/// Whether `PAGEMAP_SCAN` counts here (else reclaim counts with mincore):
/// asked of the page at `addr`.
fn pagemap_answers(addr: usize) -> bool {
    super::super::pagemap::open();
    super::super::pagemap::owned_bytes(addr, PAGE as usize).is_some()
}

#[test]
fn lazy_guest_is_bound_to_its_node() {
    let dir = TempDir::new("lazy-bind");
    let topo = real();
    let opts = MemoryOptions {
        mem_bytes: 64 * MIB,
        page_size: PageSize::Small,
        policy: NumaPolicy::Bind,
        ..MemoryOptions::default()
    };
    let m = GuestMemory::new(&opts, &topo).unwrap();
    touch(&m, &[0, 5 * PAGE]);
    let file = dir.create("mem");
    m.write_memory_file(&file, &MemoryFileOptions::default(), &topo)
        .unwrap();
    let regions = m.memory_file_regions();
    drop(m);
    let m = GuestMemory::from_snapshot(&opts, &topo, &regions, SnapshotMemory::Lazy(file)).unwrap();
    assert!(m
        .slices()
        .iter()
        .all(|s| s.numa_binding() == NumaBinding::Mbind));
    assert!(holds_pattern(&m, 5 * PAGE));
}

#[test]
fn eager_guest_is_loaded_per_node() {
    let dir = TempDir::new("eager");
    let topo = two_fake_nodes();
    let opts = memory(256, Backing::Anonymous, Some(vec![0, 1]));
    let (file, regions) = snapshot(&dir, &opts, &topo);
    let source = SnapshotMemory::Eager {
        file,
        workers_per_node: 2,
    };
    let m = GuestMemory::from_snapshot(&opts, &topo, &regions, source).unwrap();
    assert!(m.slices().iter().all(|s| s.contents() == Contents::Own));
    check_contents(&m);
    let report = m
        .reclaim(&ReclaimOptions::default(), &topo, &ReclaimProgress::new())
        .unwrap();
    assert_eq!(report.address_bytes_done, 256 * MIB);
}

#[test]
fn what_does_not_match_the_configuration_is_refused() {
    let dir = TempDir::new("refused");
    let topo = two_fake_nodes();
    let opts = memory(256, Backing::Anonymous, Some(vec![0, 1]));
    let (file, regions) = snapshot(&dir, &opts, &topo);
    // Another RAM size.
    let other = memory(512, Backing::Anonymous, Some(vec![0, 1]));
    let e = check_regions(&regions, other.mem_bytes).unwrap_err();
    assert!(e.to_string().contains("536870912"), "{e}");
    // Offsets that are not Firecracker's.
    let mut moved = regions.clone();
    moved[1].file_offset += PAGE;
    let e = check_regions(&moved, opts.mem_bytes).unwrap_err();
    assert!(e.to_string().contains("file offset"), "{e}");
    let mut swapped = regions.clone();
    swapped.swap(0, 1);
    assert!(check_regions(&swapped, opts.mem_bytes).is_err());
    // A file shorter than RAM names both sizes.
    let short = dir.create("short");
    short.set_len(100 * MIB).unwrap();
    let e = GuestMemory::from_snapshot(&opts, &topo, &regions, SnapshotMemory::Lazy(short))
        .unwrap_err();
    assert!(matches!(e, RestoreError::FileTooShort { .. }), "{e}");
    let text = e.to_string();
    assert!(
        text.contains(&(100 * MIB).to_string()) && text.contains(&(256 * MIB).to_string()),
        "{text}"
    );
    // Backings and page sizes that are not restored.
    let memfd = memory(256, Backing::Memfd, Some(vec![0, 1]));
    let e = GuestMemory::from_snapshot(
        &memfd,
        &topo,
        &regions,
        SnapshotMemory::Lazy(file.try_clone().unwrap()),
    )
    .unwrap_err();
    assert!(matches!(e, RestoreError::Backing(Backing::Memfd)), "{e}");
    let huge = MemoryOptions {
        page_size: PageSize::Huge2M,
        ..opts.clone()
    };
    let e =
        GuestMemory::from_snapshot(&huge, &topo, &regions, SnapshotMemory::Lazy(file)).unwrap_err();
    assert!(matches!(e, RestoreError::LazyHugePages { .. }), "{e}");
}

/// The uffd tests one at a time: each counts the process's userfaultfds.
static UFFD_TESTS: Mutex<()> = Mutex::new(());

/// Firecracker's example handler `name` (built by the peers' cache, or in
/// `$TERAVM_UFFD_HANDLERS`); None (after saying why) where it is missing,
/// a failure where `CI=true`.
fn handler_bin(name: &str) -> Option<PathBuf> {
    let dir = std::env::var_os("TERAVM_UFFD_HANDLERS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/root/.cache/teravm-peers/firecracker-81b38b9da/bin"));
    let bin = dir.join(name);
    if bin.is_file() {
        return Some(bin);
    }
    let reason = format!("Firecracker's {name} is not at {}", bin.display());
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "NOT POSSIBLE HERE: {reason}"
    );
    println!("NOT POSSIBLE HERE: {reason}");
    None
}

/// A running handler, killed on drop.
struct Handler(Child);

impl Handler {
    /// Starts `bin` on `sock` and `mem` and waits (10 s at most) for its
    /// socket.
    fn start(bin: &Path, sock: &Path, mem: &Path) -> Handler {
        let child = Command::new(bin)
            .arg(sock)
            .arg(mem)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut h = Handler(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !sock.exists() {
            assert!(h.0.try_wait().unwrap().is_none(), "the handler exited");
            assert!(Instant::now() < deadline, "no handler socket in 10 s");
            std::thread::sleep(Duration::from_millis(10));
        }
        // The path appears at bind, a moment before listen.
        std::thread::sleep(Duration::from_millis(50));
        h
    }

    /// Its exit status, waiting `within` at most.
    fn exit(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(s) = self.0.try_wait().unwrap() {
                return Some(s);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Handler {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// This process's userfaultfds.
fn userfaultfds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|l| l.to_string_lossy().contains("userfaultfd"))
        .count()
}

/// Reads the first, a middle and the last word of each page at `addrs`
/// on a thread of its own; the answer, or None if it did not come within
/// `within` (the thread is then left blocked).
fn touch_from_thread(addrs: Vec<usize>, within: Duration) -> Option<Vec<[u64; 3]>> {
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name("uffd-toucher".into())
        .spawn(move || {
            let words: Vec<[u64; 3]> = addrs
                .iter()
                .map(|&a| [read(a), read(a + 255 * 8), read(a + 511 * 8)])
                .collect();
            let _ = tx.send(words);
        })
        .unwrap();
    rx.recv_timeout(within).ok()
}

#[test]
fn firecrackers_on_demand_handler_serves_the_guest() {
    let _one = UFFD_TESTS.lock().unwrap_or_else(|e| e.into_inner());
    let Some(bin) = handler_bin("uffd_on_demand_handler") else {
        return;
    };
    let dir = TempDir::new("uffd");
    let topo = two_fake_nodes();
    let opts = memory(256, Backing::Anonymous, Some(vec![0, 1]));
    let (_file, regions) = snapshot(&dir, &opts, &topo);
    let sock = dir.0.join("uffd.sock");
    let _handler = Handler::start(&bin, &sock, &dir.0.join("mem"));
    let before = userfaultfds();
    let m = GuestMemory::from_snapshot(&opts, &topo, &regions, uffd_by_call(sock)).unwrap();
    assert_eq!(userfaultfds(), before + 1);
    assert!(m
        .slices()
        .iter()
        .all(|s| s.contents() == Contents::Userfault));
    let pages: Vec<u64> = TOUCHED.iter().chain(&UNTOUCHED).copied().collect();
    let addrs = pages.iter().map(|&g| host(&m, g)).collect();
    let words = touch_from_thread(addrs, Duration::from_secs(20)).expect("pages served in 20 s");
    for (&gpa, w) in pages.iter().zip(&words) {
        let want = if TOUCHED.contains(&gpa) {
            [pattern(gpa, 0), pattern(gpa, 255), pattern(gpa, 511)]
        } else {
            [0; 3]
        };
        assert_eq!(*w, want, "page {gpa:#x}");
    }
    // A snapshot of the restored guest has the pages the handler has not
    // served yet too (its workers' reads fault them in).
    let again = dir.create("again");
    m.write_memory_file(&again, &MemoryFileOptions::default(), &topo)
        .unwrap();
    for gpa in TOUCHED {
        assert_eq!(file_word(&again, gpa + 255 * 8), pattern(gpa, 255));
    }
    // The handler is there: its connection has not hung up.
    let conn = m.uffd_handler_connection().expect("a uffd guest");
    let mut poll = libc::pollfd {
        fd: std::os::fd::AsRawFd::as_raw_fd(&conn),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one pollfd of ours, for the call.
    assert_eq!(unsafe { libc::poll(&mut poll, 1, 0) }, 0);
    // Reclaim (unregisters first, so its MADV_DONTNEED waits on no
    // handler) ends, and the userfaultfd with it.
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let r = m.reclaim(&ReclaimOptions::default(), &topo, &ReclaimProgress::new());
        let _ = tx.send(r.map(|r| r.address_bytes_done));
    });
    let done = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("reclaim ends");
    assert_eq!(done.unwrap(), 256 * MIB);
    assert_eq!(userfaultfds(), before);
}

#[test]
fn firecrackers_fault_all_handler_serves_the_guest() {
    let _one = UFFD_TESTS.lock().unwrap_or_else(|e| e.into_inner());
    let Some(bin) = handler_bin("uffd_fault_all_handler") else {
        return;
    };
    let dir = TempDir::new("uffd-all");
    let topo = two_fake_nodes();
    let opts = memory(256, Backing::Anonymous, Some(vec![0, 1]));
    let (_file, regions) = snapshot(&dir, &opts, &topo);
    let sock = dir.0.join("uffd.sock");
    let _handler = Handler::start(&bin, &sock, &dir.0.join("mem"));
    let m = GuestMemory::from_snapshot(&opts, &topo, &regions, uffd_by_call(sock)).unwrap();
    let addrs = vec![host(&m, TOUCHED[4])];
    let words = touch_from_thread(addrs, Duration::from_secs(20)).expect("served in 20 s");
    assert_eq!(words[0][0], pattern(TOUCHED[4], 0));
    // The first fault brought all of it in.
    check_contents(&m);
}

/// The malicious handler dies at the first fault: the thread that touched
/// guest memory waits for ever (as a Firecracker guest freezes), and
/// nothing else does: the memory is given back without waiting on it.
#[test]
fn firecrackers_malicious_handler_blocks_only_the_faulting_thread() {
    let _one = UFFD_TESTS.lock().unwrap_or_else(|e| e.into_inner());
    let Some(bin) = handler_bin("uffd_malicious_handler") else {
        return;
    };
    let dir = TempDir::new("uffd-evil");
    let topo = two_fake_nodes();
    let opts = memory(256, Backing::Anonymous, Some(vec![0, 1]));
    let (_file, regions) = snapshot(&dir, &opts, &topo);
    let sock = dir.0.join("uffd.sock");
    let mut handler = Handler::start(&bin, &sock, &dir.0.join("mem"));
    let m = GuestMemory::from_snapshot(&opts, &topo, &regions, uffd_by_call(sock)).unwrap();
    // The toucher holds a view, as a device thread does: the mapping
    // outlives the memory's owner, so the abandoned thread never reads
    // unmapped memory.
    let view = m.view();
    let addr = host(&m, TOUCHED[0]);
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name("uffd-abandoned".into())
        .spawn(move || {
            let v = read(addr);
            let _ = tx.send(v);
            drop(view);
        })
        .unwrap();
    let status = handler
        .exit(Duration::from_secs(10))
        .expect("the handler dies");
    assert!(!status.success());
    assert!(
        rx.recv_timeout(Duration::from_millis(500)).is_err(),
        "the faulting thread still waits"
    );
    // The owner gives the memory back at once: refused while the
    // toucher's view is held, nothing waits.
    let started = Instant::now();
    let e = m
        .reclaim(&ReclaimOptions::default(), &topo, &ReclaimProgress::new())
        .unwrap_err();
    assert!(matches!(e, ReclaimError::ViewStillHeld { .. }), "{e}");
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[test]
fn a_missing_or_refusing_handler_is_a_clear_error_and_leaves_nothing() {
    let _one = UFFD_TESTS.lock().unwrap_or_else(|e| e.into_inner());
    let dir = TempDir::new("uffd-none");
    let topo = two_fake_nodes();
    let opts = memory(256, Backing::Anonymous, Some(vec![0, 1]));
    let regions = file_regions(&GuestMemory::plan(&opts, &topo).unwrap());
    let before = userfaultfds();
    let missing = dir.0.join("nobody.sock");
    let e = GuestMemory::from_snapshot(&opts, &topo, &regions, uffd_by_call(missing.clone()))
        .unwrap_err();
    match &e {
        RestoreError::Uffd(UffdError::Connect { path, source }) => {
            assert_eq!(path, &missing);
            assert_eq!(source.raw_os_error(), Some(libc::ENOENT));
        }
        other => panic!("{other}"),
    }
    assert!(e.to_string().contains(&*missing.to_string_lossy()), "{e}");
    // A socket file nobody listens on any more.
    let refusing = dir.0.join("closed.sock");
    drop(std::os::unix::net::UnixListener::bind(&refusing).unwrap());
    let e = GuestMemory::from_snapshot(&opts, &topo, &regions, uffd_by_call(refusing)).unwrap_err();
    match &e {
        RestoreError::Uffd(UffdError::Connect { source, .. }) => {
            assert_eq!(source.raw_os_error(), Some(libc::ECONNREFUSED), "{e}");
        }
        other => panic!("{other}"),
    }
    assert_eq!(userfaultfds(), before, "no userfaultfd left");
}

#[test]
fn the_handler_is_told_firecrackers_fields() {
    let r = super::super::uffd::GuestRegionUffdMapping {
        base_host_virt_addr: 0x7f00_0000_0000,
        size: 1 << 30,
        offset: 3 << 30,
        page_size: 4096,
        page_size_kib: 4096,
    };
    assert_eq!(
        serde_json::to_string(&[r]).unwrap(),
        r#"[{"base_host_virt_addr":139637976727552,"size":1073741824,"offset":3221225472,"page_size":4096,"page_size_kib":4096}]"#
    );
}
