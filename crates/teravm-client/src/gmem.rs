//! What a VMM process holds in guest_memfd files, measured from outside:
//! its descriptors that are `anon_inode:[kvm-gmem]`, each duplicated into
//! this process (`pidfd_getfd`) and asked how many pages its page cache
//! holds (`cachestat`). A guest_memfd's pages are never in teravm's RSS
//! unless teravm itself mapped them, and its `st_blocks` is always 0; this
//! counts exactly the pages allocated in teravm's own files.
//!
//! The count itself is the caller's (`count`, e.g. teravm's
//! `memory::gmem::allocated_bytes`, a `cachestat` wrapper), so that this
//! crate does not depend on teravm.

use std::os::fd::{FromRawFd, OwnedFd, RawFd};

/// The descriptor numbers of `pid`'s guest_memfds.
pub fn gmem_fds(pid: u32) -> Vec<RawFd> {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return Vec::new();
    };
    let mut fds: Vec<RawFd> = dir
        .flatten()
        .filter(|e| {
            std::fs::read_link(e.path())
                .is_ok_and(|t| t.to_string_lossy() == "anon_inode:[kvm-gmem]")
        })
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect();
    fds.sort_unstable();
    fds
}

/// Mappings of guest_memfds in `pid`'s address space (`/proc/pid/maps`).
pub fn gmem_mappings(pid: u32) -> usize {
    std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("[kvm-gmem]"))
        .count()
}

/// Bytes allocated in all of `pid`'s guest_memfds (0 where it has none),
/// each counted by `count` on a duplicate of the descriptor.
pub fn gmem_allocated_bytes(
    pid: u32,
    count: impl Fn(&OwnedFd) -> std::io::Result<u64>,
) -> std::io::Result<u64> {
    let fds = gmem_fds(pid);
    if fds.is_empty() {
        return Ok(0);
    }
    // SAFETY: pidfd_open takes no pointers; a returned descriptor is ours.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if pidfd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor that nothing else owns.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd as RawFd) };
    let mut total = 0;
    for fd in fds {
        // SAFETY: pidfd_getfd takes no pointers; a returned descriptor is ours.
        let dup = unsafe {
            libc::syscall(
                libc::SYS_pidfd_getfd,
                std::os::fd::AsRawFd::as_raw_fd(&pidfd),
                fd,
                0,
            )
        };
        if dup < 0 {
            // Closed since it was listed.
            continue;
        }
        // SAFETY: a fresh descriptor that nothing else owns.
        let dup = unsafe { OwnedFd::from_raw_fd(dup as RawFd) };
        total += count(&dup)?;
    }
    Ok(total)
}
