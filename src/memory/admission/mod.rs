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
            let path = free_huge_pages_path(&roots.sys, page);
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

/// The free huge pages of `page` bytes: `<sys>/kernel/mm/hugepages/
/// hugepages-<size>kB/free_hugepages`.
fn free_huge_pages_path(sys: &Path, page: u64) -> PathBuf {
    sys.join(format!(
        "kernel/mm/hugepages/hugepages-{}kB/free_hugepages",
        page >> 10
    ))
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
    if let (Some(page), None) = (hugetlb, &host.free_huge_pages) {
        log::warn!(
            "memory admission: no {}: the free huge pages cannot be counted here (a root \
             without /sys); the mapping fails if there are too few",
            free_huge_pages_path(&Roots::default().sys, page).display()
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
                limit: format!(
                    "the host's {} ({} MiB{})",
                    host.available_source.name(),
                    avail / MIB,
                    match &host.cgroup_source {
                        CgroupSource::NotVisible(why) => format!("; {why}"),
                        _ => String::new(),
                    }
                ),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
