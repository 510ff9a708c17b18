//! The memory file on real mappings and real files (no KVM): sparse
//! writes, eager loads, Firecracker's offsets, a full file system.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};

use super::super::layout::{ram_regions, MMIO_GAP_END, MMIO_GAP_START};
use super::super::numa::HostNode;
use super::super::options::{MemoryOptions, NumaPolicy, PageSize};
use super::super::plan::partition;
use super::super::{pagemap, sys};
use super::*;

pub(super) const PAGE: u64 = 4096;
pub(super) const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

pub(super) fn real() -> HostTopology {
    HostTopology::from_sysfs(Path::new("/sys")).unwrap()
}

/// Two nodes whose workers run on this process's first CPU (no binding:
/// this host has one node).
pub(super) fn two_fake_nodes() -> HostTopology {
    let cpu = sys::get_affinity().unwrap()[0];
    HostTopology {
        nodes: (0..2)
            .map(|id| HostNode {
                id,
                cpus: vec![cpu],
                mem_total_bytes: GIB,
            })
            .collect(),
        source: crate::memory::numa::TopologySource::Sysfs("(built by a test)".into()),
    }
}

pub(super) fn memory(mib: u64, backing: Backing, host_nodes: Option<Vec<u32>>) -> MemoryOptions {
    MemoryOptions {
        mem_bytes: mib * MIB,
        page_size: PageSize::Small,
        backing,
        policy: if host_nodes.is_some() {
            NumaPolicy::None
        } else {
            NumaPolicy::Bind
        },
        host_nodes,
        ..MemoryOptions::default()
    }
}

/// A directory of its own, removed on drop.
pub(super) struct TempDir(pub(super) PathBuf);

impl TempDir {
    pub(super) fn new(name: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("teravm-snap-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
    pub(super) fn create(&self, name: &str) -> File {
        OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(self.0.join(name))
            .unwrap()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The host address of guest address `gpa` (a RAM address).
pub(super) fn host(m: &GuestMemory, gpa: u64) -> usize {
    let s = m
        .slices()
        .iter()
        .find(|s| (s.slice().guest_addr..s.slice().guest_addr + s.slice().len).contains(&gpa))
        .unwrap();
    s.host_addr() + (gpa - s.slice().guest_addr) as usize
}

/// The 8-byte words of page `gpa`'s pattern: not zero, different per page.
pub(super) fn pattern(gpa: u64, word: u64) -> u64 {
    (gpa | 1).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ word
}

/// Writes the pattern into the first, a middle and the last word of each
/// page at `gpas`.
pub(super) fn touch(m: &GuestMemory, gpas: &[u64]) {
    for &gpa in gpas {
        for word in [0, 255, 511] {
            // SAFETY: inside guest RAM's live writable mapping, aligned.
            unsafe {
                ((host(m, gpa) + word as usize * 8) as *mut u64).write_volatile(pattern(gpa, word))
            };
        }
    }
}

/// Whether page `gpa` of `m` holds its pattern (read from memory).
pub(super) fn holds_pattern(m: &GuestMemory, gpa: u64) -> bool {
    [0u64, 255, 511].iter().all(|&word| {
        // SAFETY: inside guest RAM's live mapping, aligned.
        let v = unsafe { ((host(m, gpa) + word as usize * 8) as *const u64).read_volatile() };
        v == pattern(gpa, word)
    })
}

/// Checks the file against the touched pages: each at its file offset
/// (here the guest address: all below the gap) with its pattern, and
/// `zeros` pages reading zero.
fn check_file(file: &File, touched: &[u64], zeros: &[u64]) {
    let mut page = vec![0u8; PAGE as usize];
    for &gpa in touched {
        file.read_exact_at(&mut page, gpa).unwrap();
        for word in [0u64, 255, 511] {
            let at = word as usize * 8;
            let v = u64::from_ne_bytes(page[at..at + 8].try_into().unwrap());
            assert_eq!(v, pattern(gpa, word), "page {gpa:#x} word {word}");
        }
    }
    for &gpa in zeros {
        file.read_exact_at(&mut page, gpa).unwrap();
        assert!(page.iter().all(|&b| b == 0), "page {gpa:#x} reads zero");
    }
}

fn allocated(file: &File) -> u64 {
    file.metadata().unwrap().blocks() * 512
}

/// Resident bytes of guest page `gpa`.
fn resident(m: &GuestMemory, gpa: u64) -> u64 {
    sys::resident_bytes(host(m, gpa), PAGE as usize, &mut Vec::new()).unwrap()
}

#[test]
fn offsets_are_firecrackers_contiguous_from_zero_in_guest_order() {
    // 8 GiB on two nodes: node 0's share crosses the MMIO gap, so it is two
    // slices; the file knows no gap.
    let slices = partition(&ram_regions(8 * GIB), &[0, 1], GIB).unwrap();
    let regions = file_regions(&slices);
    assert_eq!(regions.len(), 3);
    let mut next = 0;
    for r in &regions {
        assert_eq!(r.file_offset, next, "contiguous from 0");
        next += r.slice.len;
        // Firecracker's offset of a guest address: the RAM below it.
        let want = if r.slice.guest_addr >= MMIO_GAP_END {
            r.slice.guest_addr - (MMIO_GAP_END - MMIO_GAP_START)
        } else {
            r.slice.guest_addr
        };
        assert_eq!(r.file_offset, want, "{r:?}");
    }
    assert_eq!(next, 8 * GIB, "the file is the size of RAM");
    assert_eq!(
        (regions[1].slice.node, regions[1].slice.guest_addr),
        (0, 4 * GIB)
    );
    assert_eq!(regions[1].file_offset, 3 * GIB);
    assert_eq!(regions[2].file_offset, 4 * GIB);
}

/// Anonymous memory, 256 MiB of 4 KiB pages, six pages touched (a run of
/// three across a chunk boundary) and one only read: the file holds
/// exactly the touched pages, loads back, and leaves the rest unpopulated.
#[test]
fn anonymous_guest_is_written_sparse_and_loads_eagerly() {
    let dir = TempDir::new("anon");
    let topo = real();
    let m = GuestMemory::new(&memory(256, Backing::Anonymous, None), &topo).unwrap();
    let chunk = 4 * MIB;
    let touched = [
        0,
        17 * PAGE,
        chunk - PAGE,
        chunk,
        chunk + PAGE,
        255 * MIB - PAGE,
    ];
    touch(&m, &touched);
    let read_only = 100 * MIB;
    // SAFETY: inside guest RAM's live mapping.
    let _ = unsafe { (host(&m, read_only) as *const u64).read_volatile() };
    let opts = MemoryFileOptions {
        workers_per_node: 2,
        chunk_bytes: Some(chunk),
    };
    let file = dir.create("mem");
    let report = m.write_memory_file(&file, &opts, &topo).unwrap();
    let touched_bytes = touched.len() as u64 * PAGE;

    assert_eq!(file.metadata().unwrap().len(), 256 * MIB, "sized to RAM");
    assert_eq!(report.file_bytes, 256 * MIB);
    if pagemap::owned_bytes(host(&m, 0), PAGE as usize).is_some() {
        // PAGEMAP_SCAN leaves the zero page out; mincore would write it.
        assert_eq!(report.copied_bytes, touched_bytes);
    } else {
        assert_eq!(report.copied_bytes, touched_bytes + PAGE);
    }
    assert_eq!(report.nodes.len(), 1);
    assert_eq!(report.nodes[0].copied_bytes, report.copied_bytes);
    assert_eq!(report.workers, 2);
    let on_disk = allocated(&file);
    assert!(
        on_disk >= touched_bytes && on_disk <= touched_bytes + 64 * 1024,
        "{on_disk} bytes allocated for {touched_bytes} touched"
    );
    check_file(&file, &touched, &[PAGE, 2 * chunk, read_only, 200 * MIB]);

    let fresh = GuestMemory::new(&memory(256, Backing::Anonymous, None), &topo).unwrap();
    let loaded = fresh.load_memory_file(&file, &opts, &topo).unwrap();
    assert_eq!(loaded.copied_bytes, report.copied_bytes);
    for &gpa in &touched {
        assert!(holds_pattern(&fresh, gpa), "page {gpa:#x} loaded");
    }
    for gpa in [PAGE, 2 * chunk, 200 * MIB] {
        assert_eq!(resident(&fresh, gpa), 0, "hole {gpa:#x} left unpopulated");
    }
    let total: u64 = fresh
        .slices()
        .iter()
        .map(|s| {
            sys::resident_bytes(s.host_addr(), s.slice().len as usize, &mut Vec::new()).unwrap()
        })
        .sum();
    assert_eq!(
        total, report.copied_bytes,
        "only the file's data is resident"
    );
}

/// Two nodes (fake: this host has one), two workers each: each node's
/// report counts its own slice's pages, and a file written over two nodes
/// loads into a guest of one node (the layout is by guest address).
#[test]
fn each_node_writes_its_own_slice() {
    let dir = TempDir::new("nodes");
    let topo = two_fake_nodes();
    let m = GuestMemory::new(&memory(256, Backing::Anonymous, Some(vec![0, 1])), &topo).unwrap();
    assert_eq!(m.slices().len(), 2);
    let node0 = [MIB, 3 * MIB, 5 * MIB];
    let node1 = [128 * MIB, 200 * MIB];
    touch(&m, &node0);
    touch(&m, &node1);
    let file = dir.create("mem");
    let report = m
        .write_memory_file(&file, &MemoryFileOptions::default(), &topo)
        .unwrap();
    let by_node: Vec<(u32, u64, u64)> = report
        .nodes
        .iter()
        .map(|n| (n.node, n.slice_bytes, n.copied_bytes))
        .collect();
    assert_eq!(
        by_node,
        vec![(0, 128 * MIB, 3 * PAGE), (1, 128 * MIB, 2 * PAGE)]
    );
    assert_eq!(report.workers, 4);
    let all: Vec<u64> = node0.iter().chain(&node1).copied().collect();
    check_file(&file, &all, &[0, 129 * MIB]);

    let one = real();
    let fresh = GuestMemory::new(&memory(256, Backing::Anonymous, None), &one).unwrap();
    fresh
        .load_memory_file(&file, &MemoryFileOptions::default(), &one)
        .unwrap();
    assert!(all.iter().all(|&gpa| holds_pattern(&fresh, gpa)));
}

/// memfd backing (two 128 MiB stripes): the data extents of the files are
/// written, and load back into a fresh memfd guest whose files then hold
/// only those pages.
#[test]
fn memfd_guest_is_written_from_its_data_extents() {
    let dir = TempDir::new("memfd");
    let topo = real();
    let m = GuestMemory::new(&memory(256, Backing::Memfd, None), &topo).unwrap();
    assert_eq!(m.slices()[0].stripes().len(), 2);
    let touched = [0, 64 * MIB, 128 * MIB, 128 * MIB + PAGE, 250 * MIB];
    touch(&m, &touched);
    let file = dir.create("mem");
    let opts = MemoryFileOptions::default();
    let report = m.write_memory_file(&file, &opts, &topo).unwrap();
    let touched_bytes = touched.len() as u64 * PAGE;
    assert_eq!(report.copied_bytes, touched_bytes);
    assert_eq!(file.metadata().unwrap().len(), 256 * MIB);
    let on_disk = allocated(&file);
    assert!(
        on_disk >= touched_bytes && on_disk <= touched_bytes + 64 * 1024,
        "{on_disk}"
    );
    check_file(&file, &touched, &[PAGE, 127 * MIB, 255 * MIB]);

    let fresh = GuestMemory::new(&memory(256, Backing::Memfd, None), &topo).unwrap();
    fresh.load_memory_file(&file, &opts, &topo).unwrap();
    assert!(touched.iter().all(|&gpa| holds_pattern(&fresh, gpa)));
    let backing: u64 = fresh.slices()[0]
        .stripes()
        .iter()
        .map(|s| allocated(&s.file))
        .sum();
    assert_eq!(
        backing, touched_bytes,
        "the holes stayed holes in the memfds"
    );
}

/// Unmounts a tmpfs on drop.
struct Tmpfs(PathBuf);

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
    }
}

/// A file system too small for what the guest has: the write fails with
/// `ENOSPC` and says at which file offset. On a 1 MiB tmpfs (we are root);
/// where it cannot be mounted, a read-only descriptor stands in (the
/// resize is then what fails).
#[test]
fn a_full_file_system_names_the_offset() {
    let dir = TempDir::new("full");
    let topo = real();
    let m = GuestMemory::new(&memory(64, Backing::Anonymous, None), &topo).unwrap();
    let touched: Vec<u64> = (0..1024).map(|i| 32 * MIB + i * PAGE).collect(); // 4 MiB
    touch(&m, &touched);
    let opts = MemoryFileOptions {
        workers_per_node: 2,
        chunk_bytes: Some(MIB),
    };
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=1m", "tmpfs"])
        .arg(&dir.0)
        .status()
        .is_ok_and(|s| s.success());
    if !mounted {
        eprintln!("tmpfs cannot be mounted here: a read-only descriptor instead");
        drop(dir.create("mem"));
        let ro = File::open(dir.0.join("mem")).unwrap();
        let e = m.write_memory_file(&ro, &opts, &topo).unwrap_err();
        assert!(matches!(e, MemoryFileError::Resize { len: 0, .. }), "{e}");
        return;
    }
    let _unmount = Tmpfs(dir.0.clone());
    let file = dir.create("mem");
    let e = m.write_memory_file(&file, &opts, &topo).unwrap_err();
    let text = e.to_string();
    let MemoryFileError::Workers { errors, report } = e else {
        panic!("{text}");
    };
    assert!(!errors.is_empty() && errors.len() <= 2, "{text}");
    for err in &errors {
        let MemoryFileError::Write {
            file_offset,
            source,
            ..
        } = err
        else {
            panic!("{text}");
        };
        assert_eq!(source.raw_os_error(), Some(libc::ENOSPC), "{text}");
        assert!((32 * MIB..36 * MIB).contains(file_offset), "{text}");
    }
    assert!(text.contains("memory file offset 0x"), "{text}");
    assert!(report.copied_bytes < 4 * MIB, "{report:?}");
}

#[test]
fn a_file_of_another_size_or_bad_options_are_refused() {
    let dir = TempDir::new("refused");
    let topo = real();
    let m = GuestMemory::new(&memory(64, Backing::Anonymous, None), &topo).unwrap();
    let file = dir.create("mem");
    file.set_len(32 * MIB).unwrap();
    let e = m
        .load_memory_file(&file, &MemoryFileOptions::default(), &topo)
        .unwrap_err();
    assert!(
        matches!(e, MemoryFileError::SizeMismatch { file_bytes, mem_bytes } if file_bytes == 32 * MIB && mem_bytes == 64 * MIB),
        "{e}"
    );
    for opts in [
        MemoryFileOptions {
            workers_per_node: 0,
            chunk_bytes: None,
        },
        MemoryFileOptions {
            workers_per_node: MAX_WORKERS_PER_NODE + 1,
            chunk_bytes: None,
        },
        MemoryFileOptions {
            workers_per_node: 1,
            chunk_bytes: Some(0),
        },
    ] {
        let e = m.write_memory_file(&file, &opts, &topo).unwrap_err();
        assert!(matches!(e, MemoryFileError::InvalidOptions(_)), "{e}");
    }
    assert_eq!(
        file.metadata().unwrap().len(),
        32 * MIB,
        "refused before any write"
    );
}

/// guest_memfd backing (a real KVM VM, where this host has it): its files
/// have no `SEEK_DATA`, so the pages in its page cache are written; the
/// file is as sparse, and loads back into a fresh guest_memfd guest.
#[test]
fn guest_memfd_guest_is_written_sparse() {
    let Some(vm) = super::super::gmem::kvm_tests::vm() else {
        return;
    };
    let dir = TempDir::new("gmem");
    let topo = real();
    let opts = memory(256, Backing::GuestMemfd, None);
    let m = GuestMemory::new_with(&opts, &topo, Some(&vm)).unwrap();
    let touched = [0, 5 * MIB, 130 * MIB, 255 * MIB];
    touch(&m, &touched);
    let file = dir.create("mem");
    let report = m
        .write_memory_file(&file, &MemoryFileOptions::default(), &topo)
        .unwrap();
    let touched_bytes = touched.len() as u64 * PAGE;
    assert_eq!(report.copied_bytes, touched_bytes);
    let on_disk = allocated(&file);
    assert!(
        on_disk >= touched_bytes && on_disk <= touched_bytes + 64 * 1024,
        "{on_disk}"
    );
    check_file(&file, &touched, &[PAGE, 128 * MIB]);
    let fresh = GuestMemory::new_with(&opts, &topo, Some(&vm)).unwrap();
    fresh
        .load_memory_file(&file, &MemoryFileOptions::default(), &topo)
        .unwrap();
    assert!(touched.iter().all(|&gpa| holds_pattern(&fresh, gpa)));
}
