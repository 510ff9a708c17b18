//! Memory admission: a guest that will be populated, or that is backed by
//! hugetlb pages, is refused before anything is mapped when it is larger
//! than what this process may get, so it fails with a message that names
//! the numbers instead of being killed by the OOM killer (or by `SIGBUS`)
//! half-way through.
//!
//! What this process may get, read from the kernel:
//! - the room left in its memory cgroup and every ancestor: v2
//!   `memory.max - memory.current`, v1 `memory.limit_in_bytes -
//!   memory.usage_in_bytes` (the process's cgroup from `/proc/self/cgroup`;
//!   where that is unreadable, as in a jail without `/proc`, the root of
//!   what is mounted at `/sys/fs/cgroup`, as a cgroup namespace shows it or
//!   as an orchestrator bind-mounts the VM's own cgroup into the jail:
//!   [`CgroupSource`]);
//! - the host's `MemAvailable` (`/proc/meminfo`); without `/proc`,
//!   `sysinfo(2)`'s `freeram + bufferram`, which is not `MemAvailable` (it
//!   leaves out the page cache the kernel could reclaim, so it is lower) and
//!   is named so ([`AvailableSource`]);
//! - for hugetlb backings, the free huge pages of the guest's page size
//!   (`/sys/kernel/mm/hugepages/hugepages-<size>kB/free_hugepages`), which
//!   are not charged to the memory cgroup.
//!
//! A guest that is neither populated nor hugetlb-backed is always admitted:
//! it is mapped `MAP_NORESERVE` and costs only what the guest touches.

use std::path::{Path, PathBuf};

use super::options::MemoryOptions;

const MIB: u64 = 1 << 20;

/// Why a guest was not admitted.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AdmissionError {
    /// Populating the guest would need more memory than the process may get.
    #[error("populating {need_mib} MiB of guest memory needs more than this process may get: {limit} leaves {available_mib} MiB; lower machine-config.mem_size_mib, raise that limit, or set memory.populate to false", need_mib = need >> 20, available_mib = available >> 20)]
    Memory {
        /// Bytes the guest needs.
        need: u64,
        /// Bytes available under the tightest limit.
        available: u64,
        /// That limit, with its numbers (e.g. the cgroup's files).
        limit: String,
    },
    /// Not enough free huge pages of the guest's size.
    #[error("{need} huge pages of {page_mib} MiB are needed for {need_mib} MiB of guest memory, but only {free} are free ({path}); reserve more huge pages (nr_hugepages) or use huge_pages \"None\" or \"Transparent\"", page_mib = page >> 20, need_mib = need * (page >> 20))]
    HugePages {
        /// Pages needed.
        need: u64,
        /// Pages free.
        free: u64,
        /// The page size in bytes.
        page: u64,
        /// The file the free count was read from.
        path: String,
    },
}

/// The room left under one memory cgroup level.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupRoom {
    /// The cgroup directory.
    pub dir: PathBuf,
    /// Its limit in bytes.
    pub limit: u64,
    /// Its usage in bytes.
    pub usage: u64,
}

impl CgroupRoom {
    /// Bytes left under the limit.
    pub fn room(&self) -> u64 {
        self.limit.saturating_sub(self.usage)
    }
}

/// Where the process's memory cgroup was found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum CgroupSource {
    /// Named by `/proc/self/cgroup`, under `/sys/fs/cgroup`.
    #[default]
    ProcSelf,
    /// The process is taken to be at the root of what is mounted at
    /// `/sys/fs/cgroup`, the view a cgroup namespace gives, and what an
    /// orchestrator that wants admission in a jail bind-mounts there (the
    /// VM's own cgroup, at `memory/` for v1 or at the top for v2); why:
    /// `/proc/self/cgroup` is unreadable (no `/proc`), or the cgroup it
    /// names is not under this root's `/sys/fs/cgroup`.
    MountRoot(String),
    /// No memory cgroup can be seen at all; why.
    NotVisible(String),
}

/// Where the host's available memory was read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum AvailableSource {
    /// `MemAvailable` of `/proc/meminfo`.
    #[default]
    Meminfo,
    /// No `/proc/meminfo`: `sysinfo(2)`'s `freeram + bufferram`, which is
    /// not `MemAvailable` (no reclaimable page cache in it: lower).
    Sysinfo,
    /// Neither could be read.
    Unknown,
}

impl AvailableSource {
    /// The figure's name in messages.
    pub fn name(self) -> &'static str {
        match self {
            AvailableSource::Meminfo => "MemAvailable",
            AvailableSource::Sysinfo => {
                "free memory (sysinfo freeram + bufferram, not MemAvailable: no /proc/meminfo)"
            }
            AvailableSource::Unknown => "available memory (no /proc/meminfo, and sysinfo failed)",
        }
    }
}

/// What this process may get, as the kernel reports it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostMemory {
    /// The tightest limited level of the process's memory cgroup, if any is
    /// limited.
    pub cgroup: Option<CgroupRoom>,
    /// Where the cgroup was looked for.
    pub cgroup_source: CgroupSource,
    /// `MemAvailable` of the host (or what stands for it: see
    /// `available_source`), in bytes.
    pub mem_available: Option<u64>,
    /// Where `mem_available` was read.
    pub available_source: AvailableSource,
    /// `MemTotal` of the host, in bytes.
    pub mem_total: Option<u64>,
    /// For a hugetlb page size: the free pages and the file they came from.
    pub free_huge_pages: Option<(u64, PathBuf)>,
}

/// Where the kernel's files are (the real roots, or a test's tree).
#[derive(Debug, Clone)]
pub struct Roots {
    /// `/proc`.
    pub proc: PathBuf,
    /// `/sys`.
    pub sys: PathBuf,
}

impl Default for Roots {
    fn default() -> Self {
        Roots {
            proc: PathBuf::from("/proc"),
            sys: PathBuf::from("/sys"),
        }
    }
}

impl HostMemory {
    /// Reads what this process may get, for a guest of huge pages of
    /// `hugetlb_page` bytes (if any). Limit files that cannot be read count
    /// as no limit; where none can be seen, `cgroup_source` says why.
    pub fn read(roots: &Roots, hugetlb_page: Option<u64>) -> HostMemory {
        let cgroup_root = roots.sys.join("fs/cgroup");
        let proc_cgroup = roots.proc.join("self/cgroup");
        let (cgroup, cgroup_source) = match std::fs::read_to_string(&proc_cgroup) {
            Ok(text) => match tightest_cgroup(&text, &cgroup_root) {
                // Nothing it names is here, but a limited cgroup is mounted
                // at the root: a jail's bind mount without a cgroup
                // namespace.
                None if !listed_cgroup_visible(&text, &cgroup_root) => {
                    match mount_root_cgroup(&cgroup_root) {
                        Some(c) => (
                            Some(c),
                            CgroupSource::MountRoot(format!(
                                "the memory cgroup {} names is not under {} here",
                                proc_cgroup.display(),
                                cgroup_root.display()
                            )),
                        ),
                        None => (None, CgroupSource::ProcSelf),
                    }
                }
                c => (c, CgroupSource::ProcSelf),
            },
            Err(_) if cgroup_root.is_dir() => (
                mount_root_cgroup(&cgroup_root),
                CgroupSource::MountRoot(format!("no {}", proc_cgroup.display())),
            ),
            Err(_) => (
                None,
                CgroupSource::NotVisible(format!(
                    "no memory cgroup visible: no {} and no {} in this root",
                    proc_cgroup.display(),
                    cgroup_root.display()
                )),
            ),
        };
        let meminfo = std::fs::read_to_string(roots.proc.join("meminfo")).ok();
        let (mem_available, mem_total, available_source) = match meminfo.as_deref() {
            Some(t) => (
                meminfo_bytes(t, "MemAvailable"),
                meminfo_bytes(t, "MemTotal"),
                AvailableSource::Meminfo,
            ),
            None => match super::sys::sysinfo() {
                Ok(m) => (
                    Some(m.free.saturating_add(m.buffers)),
                    Some(m.total),
                    AvailableSource::Sysinfo,
                ),
                Err(_) => (None, None, AvailableSource::Unknown),
            },
        };
        let free_huge_pages = hugetlb_page.and_then(|page| {
            let path = roots.sys.join(format!(
                "kernel/mm/hugepages/hugepages-{}kB/free_hugepages",
                page >> 10
            ));
            let free = std::fs::read_to_string(&path).ok()?.trim().parse().ok()?;
            Some((free, path))
        });
        HostMemory {
            cgroup,
            cgroup_source,
            mem_available,
            available_source,
            mem_total,
            free_huge_pages,
        }
    }

    /// One line of where the limits were read: `memory limit: the memory
    /// cgroup <dir> (<n> MiB, found through /proc/self/cgroup); host memory:
    /// MemAvailable (/proc/meminfo)`, or `memory limit: no memory cgroup
    /// visible: ...` in a root without either.
    pub fn describe(&self) -> String {
        let limit = match (&self.cgroup_source, &self.cgroup) {
            (CgroupSource::NotVisible(why), _) => why.clone(),
            (source, Some(c)) => format!(
                "the memory cgroup {} ({} MiB{})",
                c.dir.display(),
                c.limit / MIB,
                source_note(source)
            ),
            (CgroupSource::ProcSelf, None) => {
                "none (no level of the memory cgroup in /proc/self/cgroup sets one)".into()
            }
            (CgroupSource::MountRoot(why), None) => format!(
                "none (the cgroup mounted at /sys/fs/cgroup, taken as this process's as {why}, \
                 sets no memory.max or memory/memory.limit_in_bytes)"
            ),
        };
        let host = match self.available_source {
            AvailableSource::Meminfo => "MemAvailable (/proc/meminfo)",
            other => other.name(),
        };
        format!("memory limit: {limit}; host memory: {host}")
    }
}

/// How a cgroup's source is told in a message.
fn source_note(source: &CgroupSource) -> String {
    match source {
        CgroupSource::ProcSelf => ", found through /proc/self/cgroup".into(),
        CgroupSource::MountRoot(why) => {
            format!(", mounted at /sys/fs/cgroup, taken as this process's: {why}")
        }
        CgroupSource::NotVisible(_) => String::new(),
    }
}

/// The limit of the cgroup mounted at `cgroup_root` itself, for a process
/// without a usable `/proc/self/cgroup` (see [`CgroupSource::MountRoot`]): v1's
/// `memory/memory.limit_in_bytes` if there is one, else v2's `memory.max`.
/// Nothing above the root can be seen from inside it.
pub fn mount_root_cgroup(cgroup_root: &Path) -> Option<CgroupRoom> {
    let levels = [
        (
            cgroup_root.join("memory"),
            "memory.limit_in_bytes",
            "memory.usage_in_bytes",
        ),
        (cgroup_root.to_path_buf(), "memory.max", "memory.current"),
    ];
    let (dir, limit, usage) = levels.iter().find(|l| l.0.join(l.1).exists())?;
    Some(CgroupRoom {
        limit: read_bytes(&dir.join(limit))?,
        usage: read_bytes(&dir.join(usage))?,
        dir: dir.clone(),
    })
}

/// `<key>: <n> kB` of a meminfo text, in bytes.
pub fn meminfo_bytes(text: &str, key: &str) -> Option<u64> {
    let line = text
        .lines()
        .find(|l| l.split(':').next().map(str::trim) == Some(key))?;
    let mut words = line.split(':').nth(1)?.split_whitespace();
    let kib: u64 = words.next()?.parse().ok()?;
    (words.next() == Some("kB")).then_some(kib.checked_mul(1024)?)
}

/// Reads a limit or usage file: a number of bytes, or `max` (none).
fn read_bytes(path: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(path).ok()?;
    let text = text.trim();
    if text == "max" {
        return None;
    }
    let n: u64 = text.parse().ok()?;
    // v1 writes "no limit" as a page-rounded i64::MAX.
    (n < 1 << 62).then_some(n)
}

/// The memory cgroup directories `/proc/self/cgroup` lists under
/// `cgroup_root`, with their limit and usage files, v1 first (see
/// [`tightest_cgroup`]).
fn listed_levels(
    proc_self_cgroup: &str,
    cgroup_root: &Path,
) -> Vec<(PathBuf, &'static str, &'static str)> {
    let mut levels: Vec<(PathBuf, &'static str, &'static str)> = Vec::new();
    for line in proc_self_cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let rel = path.trim_start_matches('/');
        if controllers.split(',').any(|c| c == "memory") {
            levels.push((
                cgroup_root.join("memory").join(rel),
                "memory.limit_in_bytes",
                "memory.usage_in_bytes",
            ));
        } else if controllers.is_empty() {
            levels.push((cgroup_root.join(rel), "memory.max", "memory.current"));
        }
    }
    levels.sort_by_key(|l| l.1 != "memory.limit_in_bytes");
    levels
}

/// Whether a memory cgroup that `/proc/self/cgroup` lists is there under
/// `cgroup_root` (it is not where a jail bind-mounts the VM's own cgroup
/// without a cgroup namespace).
fn listed_cgroup_visible(proc_self_cgroup: &str, cgroup_root: &Path) -> bool {
    listed_levels(proc_self_cgroup, cgroup_root)
        .iter()
        .any(|l| l.0.join(l.2).exists())
}

/// The limited level of the process's memory cgroup (and its ancestors)
/// with the least room; `cgroup_root` is where the hierarchies are mounted
/// (`/sys/fs/cgroup`). A v1 `memory` hierarchy wins over v2 when both are
/// listed (a hybrid host, whose v2 tree then has no memory controller).
pub fn tightest_cgroup(proc_self_cgroup: &str, cgroup_root: &Path) -> Option<CgroupRoom> {
    let levels = listed_levels(proc_self_cgroup, cgroup_root);
    let (dir, limit_file, usage_file) = levels.into_iter().find(|l| l.0.join(l.2).exists())?;
    let mut best: Option<CgroupRoom> = None;
    let mut at = Some(dir.as_path());
    while let Some(d) = at {
        if !d.starts_with(cgroup_root) {
            break;
        }
        if let (Some(limit), Some(usage)) = (
            read_bytes(&d.join(limit_file)),
            read_bytes(&d.join(usage_file)),
        ) {
            let room = CgroupRoom {
                dir: d.to_path_buf(),
                limit,
                usage,
            };
            if best.as_ref().is_none_or(|b| room.room() < b.room()) {
                best = Some(room);
            }
        }
        at = d.parent();
    }
    best
}

/// Reads the host's figures (only when the guest needs admission) and
/// admits or refuses the guest.
pub fn check(opts: &MemoryOptions) -> Result<(), AdmissionError> {
    let hugetlb = opts.page_size.hugetlb_bytes();
    let host = HostMemory::read(&Roots::default(), hugetlb);
    if let Some(warning) = sparse_warning(opts, &host) {
        log::warn!("{warning}");
    }
    if let (CgroupSource::NotVisible(why), true) =
        (&host.cgroup_source, opts.populate && hugetlb.is_none())
    {
        log::warn!(
            "memory admission: {why}; only the host's {} is checked",
            host.available_source.name()
        );
    }
    admit(opts, &host)
}

/// What to say, once at start, of a guest that is admitted only because
/// its memory is sparse (not populated, not hugetlb: `MAP_NORESERVE`)
/// while it is larger than the tightest memory cgroup's limit or than the
/// host's memory: it runs until it touches more than there is, and then
/// the OOM killer, not teravm, decides.
pub fn sparse_warning(opts: &MemoryOptions, host: &HostMemory) -> Option<String> {
    if opts.populate || opts.page_size.hugetlb_bytes().is_some() {
        return None;
    }
    let need = opts.mem_bytes;
    let (what, have) = match (&host.cgroup, host.mem_total) {
        (Some(c), _) if need > c.limit => (
            format!("the memory cgroup {}'s limit", c.dir.display()),
            c.limit,
        ),
        (_, Some(total)) if need > total => ("this host's memory (MemTotal)".to_string(), total),
        _ => return None,
    };
    Some(format!(
        "the guest's {} MiB exceed {what} ({} MiB): it starts because its memory is sparse \
         (mapped MAP_NORESERVE, populate off), and a guest that touches more than that is \
         OOM-killed with teravm",
        need / MIB,
        have / MIB
    ))
}

/// The rule, over figures already read: a hugetlb guest needs that many free
/// huge pages of its size; a populated guest of normal pages needs its size
/// in the tightest cgroup level and in `MemAvailable`. Anything else is
/// admitted.
pub fn admit(opts: &MemoryOptions, host: &HostMemory) -> Result<(), AdmissionError> {
    let need = opts.mem_bytes;
    if let Some(page) = opts.page_size.hugetlb_bytes() {
        if let Some((free, path)) = &host.free_huge_pages {
            let pages = need.div_ceil(page);
            if pages > *free {
                return Err(AdmissionError::HugePages {
                    need: pages,
                    free: *free,
                    page,
                    path: path.display().to_string(),
                });
            }
        }
        return Ok(());
    }
    if !opts.populate {
        return Ok(());
    }
    if let Some(c) = &host.cgroup {
        if need > c.room() {
            return Err(AdmissionError::Memory {
                need,
                available: c.room(),
                limit: format!(
                    "the memory cgroup {} (limit {} MiB, usage {} MiB{})",
                    c.dir.display(),
                    c.limit / MIB,
                    c.usage / MIB,
                    source_note(&host.cgroup_source)
                ),
            });
        }
    }
    if let Some(avail) = host.mem_available {
        if need > avail {
            return Err(AdmissionError::Memory {
                need,
                available: avail,
                limit: match &host.cgroup_source {
                    CgroupSource::NotVisible(why) => format!(
                        "the host's {} ({} MiB; {why})",
                        host.available_source.name(),
                        avail / MIB
                    ),
                    _ => format!(
                        "the host's {} ({} MiB)",
                        host.available_source.name(),
                        avail / MIB
                    ),
                },
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
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
}
