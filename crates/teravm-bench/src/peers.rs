//! `--peers`: the VMMs users run today, beside teravm. Which are there
//! (a binary named by a flag, found on `PATH`, or for Firecracker the shared
//! script's cached build), the line that says so, which of them
//! teravm-bench can drive and which cases, and one timed run of a peer row
//! (`qemu-prealloc-quit`, `qemu-guest-kill`, `firecracker-guest-ctrlaltdel`,
//! ...), dispatched to the peer's own module ([`crate::qemu`],
//! [`crate::firecracker`]).
//!
//! Runs on the bench's main thread; a peer is a child process the bench
//! talks to over a socket, nothing here is shared between threads.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::args::is_executable;
use crate::firecracker::FirecrackerError;
use crate::model::{Case, Method, Peer, PeerRun, Stop};
use crate::qemu::{GuestBoot, QemuError};

/// Errors of a peer VMM's run.
#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    /// A QEMU row failed.
    #[error(transparent)]
    Qemu(#[from] QemuError),
    /// A Firecracker row failed.
    #[error(transparent)]
    Firecracker(#[from] FirecrackerError),
    /// teravm-bench does not drive this peer.
    #[error("{peer}: {why}")]
    NotDriven {
        /// The peer.
        peer: Peer,
        /// Why.
        why: &'static str,
    },
}

/// The peer's binary, as `--peers` looks for it on `PATH`.
pub fn binary_name(peer: Peer) -> &'static str {
    match peer {
        Peer::Qemu => "qemu-system-x86_64",
        Peer::Firecracker => "firecracker",
        Peer::CloudHypervisor => "cloud-hypervisor",
    }
}

/// The flag that names the peer's binary.
pub fn flag_name(peer: Peer) -> &'static str {
    match peer {
        Peer::Qemu => "--qemu",
        Peer::Firecracker => "--firecracker",
        Peer::CloudHypervisor => "--cloud-hypervisor",
    }
}

/// Why teravm-bench cannot drive `peer` (its rows are then marked
/// unavailable); `None` for the peers it drives.
pub fn driver_missing(peer: Peer) -> Option<&'static str> {
    match peer {
        Peer::Qemu | Peer::Firecracker => None,
        Peer::CloudHypervisor => Some(
            "found, but teravm-bench does not drive Cloud Hypervisor yet (no binary on \
             the machines it was written on to test against)",
        ),
    }
}

/// A peer's binary, found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerBinary {
    /// Where it is.
    pub path: PathBuf,
    /// The first line of its `--version`.
    pub version: String,
}

/// What discovery found for one peer: its binary, or why not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Discovered {
    /// The peer.
    pub peer: Peer,
    /// Its binary, or why there is none.
    pub binary: Result<PeerBinary, String>,
}

/// The first executable `name` in the directories of `path_var` (a `PATH`).
pub fn find_on_path(name: &str, path_var: Option<&OsStr>) -> Option<PathBuf> {
    std::env::split_paths(path_var?)
        .filter(|dir| !dir.as_os_str().is_empty())
        .map(|dir| dir.join(name))
        .find(|p| is_executable(p))
}

/// The first non-empty line of `bin --version`.
fn version_of(bin: &Path) -> Result<String, String> {
    let out = Command::new(bin)
        .arg("--version")
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {} --version: {e}", bin.display()))?;
    let text = String::from_utf8_lossy(&out.stdout);
    match text.lines().map(str::trim).find(|l| !l.is_empty()) {
        Some(line) if out.status.success() => Ok(line.to_string()),
        _ => Err(format!(
            "{} --version ended with {} and said nothing",
            bin.display(),
            out.status
        )),
    }
}

/// Finds `peer`'s binary: the one its flag names, or the first on
/// `path_var`, or `fallback` (Firecracker's cached build), and asks it its
/// version.
pub fn discover(
    peer: Peer,
    flag: Option<&Path>,
    path_var: Option<&OsStr>,
    fallback: Option<PathBuf>,
) -> Discovered {
    let path = match flag {
        Some(p) => Ok(p.to_path_buf()),
        None => find_on_path(binary_name(peer), path_var)
            .or(fallback)
            .ok_or_else(|| {
                format!(
                    "no {} on PATH (name one with {})",
                    binary_name(peer),
                    flag_name(peer)
                )
            }),
    };
    let binary = path.and_then(|path| {
        let version = version_of(&path)?;
        Ok(PeerBinary { path, version })
    });
    Discovered { peer, binary }
}

/// The line that says which peers were found and which not.
pub fn discovery_line(found: &[Discovered]) -> String {
    let parts: Vec<String> = found
        .iter()
        .map(|d| match &d.binary {
            Ok(b) => format!("{} found ({}, {})", d.peer, b.path.display(), b.version),
            Err(why) => format!("{} not found ({why})", d.peer),
        })
        .collect();
    format!("peers: {}", parts.join("; "))
}

/// The preallocated rows of `peer` (its graceful stop, then its kill):
/// none for Firecracker, which cannot preallocate guest RAM.
pub fn prealloc_methods(peer: Peer) -> Vec<Method> {
    match peer {
        Peer::Firecracker => Vec::new(),
        Peer::Qemu | Peer::CloudHypervisor => vec![
            Method::Peer(peer, Stop::Graceful),
            Method::Peer(peer, Stop::Kill),
        ],
    }
}

/// The rows of `peer` with the test guest: its graceful stop, its kill.
pub fn guest_methods(peer: Peer) -> [Method; 2] {
    [
        Method::PeerGuest(peer, Stop::Graceful),
        Method::PeerGuest(peer, Stop::Kill),
    ]
}

/// Every row of `peer`: the preallocated ones, then the guest's.
pub fn peer_methods(peer: Peer) -> Vec<Method> {
    let mut out = prealloc_methods(peer);
    out.extend(guest_methods(peer));
    out
}

/// Whether `peer` can run `case`: `Err` says why not (a backing it lacks),
/// and its rows skip that case.
pub fn supports(peer: Peer, case: Case) -> Result<(), String> {
    match peer {
        Peer::Qemu => crate::qemu::backend(case, 1).map(|_| ()),
        Peer::Firecracker => crate::firecracker::supports(case),
        Peer::CloudHypervisor => Err(driver_missing(peer).unwrap_or("not driven").to_string()),
    }
}

/// One timed run of `peer` stopped as `stop`, with `size_mib` of guest
/// RAM: preallocated, or written by the test guest `guest` booted.
pub fn measure_peer(
    peer: Peer,
    stop: Stop,
    case: Case,
    size_mib: u64,
    binary: &Path,
    guest: Option<&Path>,
) -> Result<PeerRun, PeerError> {
    let boot = guest.map(|kernel| GuestBoot {
        kernel: kernel.to_path_buf(),
        boot_args: crate::guest::BOOT_ARGS.to_string(),
        timeout: crate::guest::BOOT_TIMEOUT,
    });
    match (peer, guest) {
        (Peer::Qemu, _) => Ok(crate::qemu::measure(
            binary,
            stop,
            case,
            size_mib,
            boot.as_ref(),
        )?),
        (Peer::Firecracker, Some(kernel)) => Ok(crate::firecracker::measure(
            binary, stop, case, size_mib, kernel,
        )?),
        (Peer::Firecracker, None) => Err(PeerError::NotDriven {
            peer,
            why:
                "Firecracker cannot preallocate guest RAM: only its guest's writes make it resident",
        }),
        (Peer::CloudHypervisor, _) => Err(PeerError::NotDriven {
            peer,
            why: driver_missing(peer).unwrap_or("not driven"),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn fake_bin(dir: &Path, name: &str, script: &str) -> PathBuf {
        std::fs::create_dir_all(dir).unwrap();
        let p = dir.join(name);
        std::fs::write(&p, format!("#!/bin/sh\n{script}\n")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p
    }

    #[test]
    fn peers_are_found_by_flag_or_on_path_and_said_so() {
        let dir = std::env::temp_dir().join(format!("teravm-bench-peers-{}", std::process::id()));
        let bin = dir.join("bin");
        fake_bin(
            &bin,
            "qemu-system-x86_64",
            "echo 'QEMU emulator version 7.2.22'; echo Copyright",
        );
        // Not executable: not found.
        std::fs::write(bin.join("firecracker"), "").unwrap();
        let other = fake_bin(&dir.join("other"), "ch", "echo 'cloud-hypervisor v38.0'");
        let path = std::env::join_paths(["/nonexistent".as_ref(), bin.as_path()]).unwrap();
        let found: Vec<Discovered> = Peer::ALL
            .iter()
            .map(|&p| {
                let flag = (p == Peer::CloudHypervisor).then_some(other.as_path());
                discover(p, flag, Some(&path), None)
            })
            .collect();
        assert_eq!(
            found[0].binary.as_ref().unwrap().version,
            "QEMU emulator version 7.2.22"
        );
        let line = discovery_line(&found);
        assert_eq!(
            line,
            format!(
                "peers: qemu found ({}/qemu-system-x86_64, QEMU emulator version 7.2.22); \
                 firecracker not found (no firecracker on PATH (name one with --firecracker)); \
                 cloud-hypervisor found ({}, cloud-hypervisor v38.0)",
                bin.display(),
                other.display()
            )
        );
        // No PATH at all, and a binary whose --version fails.
        assert!(discover(Peer::Qemu, None, None, None).binary.is_err());
        let bad = fake_bin(&dir.join("bad"), "qemu", "exit 3");
        let e = discover(Peer::Qemu, Some(&bad), None, None)
            .binary
            .unwrap_err();
        assert!(e.contains("--version ended with"), "{e}");
        // Not on PATH: the fallback (Firecracker's cached build).
        let cached = fake_bin(
            &dir.join("cache"),
            "firecracker",
            "echo 'Firecracker v1.17.0-dev'",
        );
        let d = discover(Peer::Firecracker, None, Some(&path), Some(cached.clone()));
        assert_eq!(d.binary.unwrap().path, cached);
        let d = discover(Peer::Firecracker, Some(&bad), Some(&path), Some(cached));
        let e = d.binary.unwrap_err();
        assert!(e.contains("--version ended with"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn every_peer_has_a_graceful_and_a_kill_row_of_each_kind_it_has() {
        let names: Vec<String> = Peer::ALL
            .iter()
            .flat_map(|&p| peer_methods(p))
            .map(|m| m.to_string())
            .collect();
        assert_eq!(
            names,
            [
                "qemu-prealloc-quit",
                "qemu-prealloc-kill",
                "qemu-guest-quit",
                "qemu-guest-kill",
                "firecracker-guest-ctrlaltdel",
                "firecracker-guest-kill",
                "cloud-hypervisor-prealloc-stop",
                "cloud-hypervisor-prealloc-kill",
                "cloud-hypervisor-guest-stop",
                "cloud-hypervisor-guest-kill"
            ]
        );
        assert!(Method::Peer(Peer::Qemu, Stop::Kill).has_no_workers());
        assert!(Method::PeerGuest(Peer::Firecracker, Stop::Kill).has_no_workers());
        assert!(Method::PeerGuest(Peer::Qemu, Stop::Kill).is_guest());
        assert!(!Method::Peer(Peer::Qemu, Stop::Kill).is_guest());
        assert_eq!(Method::VmGuestShutdown(2).to_string(), "vm-guest-teravm-2");
        assert_eq!(Method::VmGuestSigterm(1).to_string(), "vm-guest-sigterm-1");
    }

    #[test]
    fn qemu_runs_every_case_firecracker_anonymous_and_cloud_hypervisor_none() {
        use crate::model::Pages;
        use teravm::config::Backing;
        for pages in [Pages::FourK, Pages::Thp] {
            for backing in [Backing::Anonymous, Backing::Memfd] {
                let case = Case { pages, backing };
                assert!(supports(Peer::Qemu, case).is_ok(), "{case}");
                assert_eq!(
                    supports(Peer::Firecracker, case).is_ok(),
                    backing == Backing::Anonymous,
                    "{case}"
                );
                assert!(supports(Peer::CloudHypervisor, case).is_err());
            }
        }
        assert!(driver_missing(Peer::Qemu).is_none());
        assert!(driver_missing(Peer::Firecracker).is_none());
        assert!(driver_missing(Peer::CloudHypervisor).is_some());
    }
}
