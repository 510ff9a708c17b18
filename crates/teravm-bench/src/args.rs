//! The command line of `teravm-bench` ([`Args`]) and its checks: what clap
//! cannot check, and the size against the host's available memory.

use std::path::PathBuf;

use clap::Parser;
use teravm::config::{Backing, ReclaimConfig};

use crate::model::{parse_backing, BenchError, Pages, Peer};

/// Whether `path` is a file someone may execute.
pub fn is_executable(path: &std::path::Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Kept free of the host's MemAvailable: this much, plus a twentieth of it.
pub const MARGIN_BYTES: u64 = 1 << 30;

/// Measures how fast fully touched guest memory is given back to the host:
/// one munmap, a process exit, and teravm's parallel reclaim at several worker
/// counts, side by side.
#[derive(Debug, Clone, Parser)]
#[command(name = "teravm-bench", version)]
pub struct Args {
    /// Guest memory size in GiB.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..=65536))]
    pub size_gib: u64,
    /// teravm reclaim worker counts per NUMA node, comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "1,2,4",
        value_parser = clap::value_parser!(u32).range(1..=i64::from(teravm::config::MAX_WORKERS_PER_NODE))
    )]
    pub workers: Vec<u32>,
    /// Page sizes, comma-separated: 4k, thp.
    #[arg(long, value_delimiter = ',', default_value = "4k,thp")]
    pub pages: Vec<Pages>,
    /// Backings, comma-separated: anonymous, memfd, guest_memfd (KVM's own
    /// memory files, Linux 6.18+, 4k pages only; the rows it cannot run are
    /// skipped with the reason).
    #[arg(long, value_delimiter = ',', default_value = "anonymous,memfd", value_parser = parse_backing)]
    pub backing: Vec<Backing>,
    /// Reclaim chunk size in MiB (even, 2 to 1048576); default: teravm's,
    /// sized from the guest and the workers (4 chunks per worker, 2 MiB to
    /// 1 GiB).
    #[arg(long)]
    pub chunk_mib: Option<u64>,
    /// Runs of each method per page size and backing.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub runs: u32,
    /// Root of the sysfs tree the host NUMA topology is read from.
    #[arg(long, default_value = "/sys")]
    pub sysfs_root: PathBuf,
    /// Write one CSV row per run to this file.
    #[arg(long)]
    pub csv: Option<PathBuf>,
    /// Write an SVG plot of median time against workers to this file.
    #[arg(long)]
    pub svg: Option<PathBuf>,
    /// Populate (untimed) workers per node [default: CPUs per node].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub populate_workers: Option<u32>,
    /// Also measure end to end against a real teravm microVM.
    #[arg(long)]
    pub vm: bool,
    /// Also measure live reclaim of a running microVM: its guest reports
    /// --size-gib as free (virtio-balloon free page reporting), freed
    /// serially (`report-serial`, as Firecracker) and by teravm's per-node
    /// pool at each --workers count (`report-teravm-<w>`); and it plugs
    /// --size-gib of virtio-mem memory that the host then unplugs, freed
    /// serially (`unplug-serial`) and by the pool (`unplug-teravm-<w>`,
    /// `unplug-all-teravm-<w>` for the guest's UNPLUG_ALL).
    #[arg(long)]
    pub live: bool,
    /// Also run the VMMs users run today beside teravm, comma-separated:
    /// qemu, firecracker, cloud-hypervisor (each found on PATH or named by
    /// its flag; Firecracker also in the shared build script's cache):
    /// `<peer>-prealloc-<stop>` rows (all guest RAM preallocated, the guest
    /// never run) beside teravm's `vm-prealloc-teravm-<w>`, and
    /// `<peer>-guest-<stop>` rows (the test guest `teravm-guest` booted
    /// with touch=all wrote its RAM) beside `vm-guest-teravm-<w>`
    /// (Shutdown) and `vm-guest-sigterm-<w>`; each timed until waitpid.
    #[arg(long, value_delimiter = ',')]
    pub peers: Vec<Peer>,
    /// With --peers: only the peer rows and teravm's rows beside them, not
    /// the in-process methods.
    #[arg(long, requires = "peers")]
    pub peers_only: bool,
    /// The QEMU binary for --peers [default: qemu-system-x86_64 on PATH].
    #[arg(long, value_name = "PATH", requires = "peers")]
    pub qemu: Option<PathBuf>,
    /// The Firecracker binary for --peers [default: firecracker on PATH,
    /// else ~/.cache/teravm-peers/firecracker-*/bin/firecracker].
    #[arg(long, value_name = "PATH", requires = "peers")]
    pub firecracker: Option<PathBuf>,
    /// The Cloud Hypervisor binary for --peers [default: cloud-hypervisor
    /// on PATH].
    #[arg(long, value_name = "PATH", requires = "peers")]
    pub cloud_hypervisor: Option<PathBuf>,
    /// Instead of the reclaim rows, time Firecracker's snapshot API: the
    /// test guest (1 vCPU, touch=all) paused and snapshotted (`PUT
    /// /snapshot/create`, Full), and loaded by a fresh process (`PUT
    /// /snapshot/load`, File, resume): `snapshot-create-teravm-<w>`,
    /// `snapshot-load-teravm-lazy`, `snapshot-load-teravm-eager-<w>`, and
    /// with `--peers firecracker` `snapshot-create-firecracker` and
    /// `snapshot-load-firecracker`.
    #[arg(long)]
    pub snapshot: bool,
    /// With --snapshot: where the snapshot files are written (removed after
    /// each load) [default: a new directory in the temp dir].
    #[arg(long, value_name = "DIR", requires = "snapshot")]
    pub snapshot_dir: Option<PathBuf>,
    /// With --snapshot: also a sparse guest of this many GiB that touched
    /// only --sparse-touch-mib before its snapshot.
    #[arg(long, value_name = "GIB", requires = "snapshot",
          value_parser = clap::value_parser!(u64).range(1..=65536))]
    pub sparse_gib: Option<u64>,
    /// What the sparse guest touches, MiB.
    #[arg(long, value_name = "MIB", default_value_t = 2048,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub sparse_touch_mib: u64,
    /// Internal: be the child of the `exit` and `mrelease` baselines (map,
    /// populate, print "ready", wait to be killed) for the first --pages and
    /// --backing.
    #[arg(long, hide = true)]
    pub exit_child: bool,
}

impl Args {
    /// Checks what clap cannot, and removes duplicates from the lists.
    pub fn validate(&mut self) -> Result<(), BenchError> {
        ReclaimConfig {
            chunk_mib: self.chunk_mib,
            ..ReclaimConfig::default()
        }
        .validate()
        .map_err(|e| BenchError::InvalidArgument(format!("--chunk-mib: {e}")))?;
        if !self.sysfs_root.is_dir() {
            return Err(BenchError::InvalidArgument(format!(
                "--sysfs-root {}: not a directory",
                self.sysfs_root.display()
            )));
        }
        dedup_in_order(&mut self.workers);
        dedup_in_order(&mut self.pages);
        dedup_in_order(&mut self.backing);
        dedup_in_order(&mut self.peers);
        for (flag, path) in [
            ("--qemu", &self.qemu),
            ("--firecracker", &self.firecracker),
            ("--cloud-hypervisor", &self.cloud_hypervisor),
        ] {
            if let Some(path) = path.as_ref().filter(|p| !is_executable(p)) {
                return Err(BenchError::InvalidArgument(format!(
                    "{flag} {}: not an executable file",
                    path.display()
                )));
            }
        }
        if let Some(size_gib) = self.sparse_gib.filter(|&g| self.sparse_touch_mib > g << 10) {
            return Err(BenchError::InvalidArgument(format!(
                "--sparse-touch-mib {} is more than --sparse-gib {size_gib}",
                self.sparse_touch_mib
            )));
        }
        if self.workers.is_empty() || self.pages.is_empty() || self.backing.is_empty() {
            return Err(BenchError::InvalidArgument(
                "--workers, --pages and --backing need at least one value".into(),
            ));
        }
        Ok(())
    }
}

fn dedup_in_order<T: PartialEq + Copy>(values: &mut Vec<T>) {
    let mut seen: Vec<T> = Vec::with_capacity(values.len());
    values.retain(|v| {
        if seen.contains(v) {
            false
        } else {
            seen.push(*v);
            true
        }
    });
}

/// Refuses a size larger than `available_bytes` less the margin
/// ([`MARGIN_BYTES`] plus a twentieth of what is available).
pub fn check_size(size_gib: u64, available_bytes: u64) -> Result<(), BenchError> {
    let margin = MARGIN_BYTES + available_bytes / 20;
    let usable = available_bytes.saturating_sub(margin);
    if size_gib.saturating_mul(1 << 30) > usable {
        return Err(BenchError::TooLarge {
            size_gib,
            available_mib: available_bytes >> 20,
            margin_mib: margin >> 20,
            usable_mib: usable >> 20,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Args, String> {
        let mut a =
            Args::try_parse_from(std::iter::once("teravm-bench").chain(args.iter().copied()))
                .map_err(|e| e.to_string())?;
        a.validate().map_err(|e| e.to_string())?;
        Ok(a)
    }

    #[test]
    fn defaults_are_those_of_the_issue() {
        let a = parse(&[]).unwrap();
        assert_eq!(a.size_gib, 8);
        assert_eq!(a.workers, [1, 2, 4]);
        assert_eq!(a.pages, [Pages::FourK, Pages::Thp]);
        assert_eq!(a.backing, [Backing::Anonymous, Backing::Memfd]);
        assert_eq!((a.chunk_mib, a.runs), (None, 5));
        assert_eq!(a.sysfs_root, PathBuf::from("/sys"));
        assert!(!a.vm && !a.live && !a.exit_child);
        assert!(a.peers.is_empty() && !a.peers_only && a.qemu.is_none());
    }

    #[test]
    fn peers_are_parsed_and_deduplicated() {
        let a = parse(&["--peers", "qemu,cloud-hypervisor,qemu", "--peers-only"]).unwrap();
        assert_eq!(a.peers, [Peer::Qemu, Peer::CloudHypervisor]);
        assert!(a.peers_only);
        let a = parse(&["--peers", "firecracker", "--qemu", "/bin/sh"]).unwrap();
        assert_eq!(a.peers, [Peer::Firecracker]);
        assert_eq!(a.qemu.as_deref(), Some(std::path::Path::new("/bin/sh")));
    }

    #[test]
    fn bad_peer_flags_are_refused() {
        for bad in [
            &["--peers", "xen"][..],
            &["--peers", ""],
            &["--peers-only"],
            &["--qemu", "/bin/sh"],
            &["--peers", "qemu", "--qemu", "/nonexistent/qemu"],
            &["--peers", "qemu", "--qemu", "/proc/self/status"],
            &["--peers", "qemu", "--firecracker", "/tmp"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn snapshot_flags_are_parsed_and_need_snapshot() {
        let a = parse(&["--snapshot", "--sparse-gib", "64", "--snapshot-dir", "/tmp"]).unwrap();
        assert!(a.snapshot);
        assert_eq!((a.sparse_gib, a.sparse_touch_mib), (Some(64), 2048));
        assert_eq!(
            a.snapshot_dir.as_deref(),
            Some(std::path::Path::new("/tmp"))
        );
        let a = parse(&["--snapshot", "--peers", "firecracker"]).unwrap();
        assert!(a.snapshot && a.sparse_gib.is_none() && a.snapshot_dir.is_none());
        for bad in [
            &["--snapshot-dir", "/tmp"][..],
            &["--sparse-gib", "64"],
            &["--snapshot", "--sparse-gib", "0"],
            &["--snapshot", "--sparse-touch-mib", "0"],
            &[
                "--snapshot",
                "--sparse-gib",
                "1",
                "--sparse-touch-mib",
                "1025",
            ],
        ] {
            assert!(parse(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn lists_are_parsed_and_deduplicated() {
        let a = parse(&[
            "--workers",
            "4,1,4",
            "--pages",
            "thp",
            "--backing",
            "memfd,memfd",
        ])
        .unwrap();
        assert_eq!(a.workers, [4, 1]);
        assert_eq!(a.pages, [Pages::Thp]);
        assert_eq!(a.backing, [Backing::Memfd]);
    }

    #[test]
    fn bad_values_are_refused() {
        for bad in [
            &["--workers", "0"][..],
            &["--workers", "1,x"],
            &["--pages", "2m"],
            &["--backing", "hugetlb"],
            &["--size-gib", "0"],
            &["--runs", "0"],
            &["--chunk-mib", "3"],
            &["--chunk-mib", "0"],
            &["--frobnicate"],
            &["--sysfs-root", "/nonexistent"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn size_must_leave_a_margin() {
        let avail = 23u64 << 30;
        assert!(check_size(8, avail).is_ok());
        assert!(check_size(20, avail).is_ok());
        let err = check_size(22, avail).unwrap_err().to_string();
        assert!(err.contains("--size-gib 22 is too large"), "{err}");
        assert!(check_size(1, 1 << 30).is_err());
        assert!(check_size(u64::MAX, avail).is_err());
    }
}
