//! guest_memfd backing: guest RAM in KVM's own memory files
//! (`KVM_CREATE_GUEST_MEMFD`), mapped into teravm for its own accesses
//! (`GUEST_MEMFD_FLAG_MMAP | GUEST_MEMFD_FLAG_INIT_SHARED`, Linux 6.18+).
//!
//! The memory module knows no KVM: the files come from a
//! [`GuestMemfdSource`] (the VM implements it), and what the kernel offers
//! is a plain [`GuestMemfdSupport`] read once at start-up. Each node slice
//! is striped over several files as memfd is ([`super::mapping`]): a hole
//! punch takes its file's invalidate lock exclusively, so punches of one
//! file never run in parallel (measured here: 2 GiB with two workers, 182 ms
//! on one file, 86 ms on two).
//!
//! NUMA: `mbind` on the mapping sets a policy, but a kernel without shared
//! policies for guest_memfd ignores it when it allocates the file's pages
//! (they come from the node of the thread that first touches them). Which
//! one this kernel is, is asked of the file itself (`probe_shared_policy`)
//! and said per slice ([`NumaBinding`]); after a populate, where sampled
//! pages landed is checked (`sample_placement`).

use std::fs::File;
use std::os::fd::AsRawFd;

use super::sys;

/// `KVM_CAP_USER_MEMORY2`: `KVM_SET_USER_MEMORY_REGION2`.
pub const KVM_CAP_USER_MEMORY2: u32 = 231;
/// `KVM_CAP_GUEST_MEMFD`: `KVM_CREATE_GUEST_MEMFD`.
pub const KVM_CAP_GUEST_MEMFD: u32 = 234;
/// `KVM_CAP_GUEST_MEMFD_FLAGS`: the flags `KVM_CREATE_GUEST_MEMFD` takes.
pub const KVM_CAP_GUEST_MEMFD_FLAGS: u32 = 244;
/// `GUEST_MEMFD_FLAG_MMAP`: the file can be mapped by the VMM.
pub const GUEST_MEMFD_FLAG_MMAP: u64 = 1 << 0;
/// `GUEST_MEMFD_FLAG_INIT_SHARED`: its memory starts shared (not private).
pub const GUEST_MEMFD_FLAG_INIT_SHARED: u64 = 1 << 1;
/// The flags teravm creates every guest_memfd with.
pub const GUEST_MEMFD_FLAGS: u64 = GUEST_MEMFD_FLAG_MMAP | GUEST_MEMFD_FLAG_INIT_SHARED;

/// What this kernel's KVM offers for guest_memfd, read once at start-up
/// (`KVM_CHECK_EXTENSION` on `/dev/kvm`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GuestMemfdSupport {
    /// `KVM_CAP_USER_MEMORY2`.
    pub user_memory2: bool,
    /// `KVM_CAP_GUEST_MEMFD`.
    pub guest_memfd: bool,
    /// `KVM_CAP_GUEST_MEMFD_FLAGS` (0 where the capability is missing).
    pub flags: u64,
}

impl GuestMemfdSupport {
    /// Everything guest_memfd backing needs.
    pub const FULL: GuestMemfdSupport = GuestMemfdSupport {
        user_memory2: true,
        guest_memfd: true,
        flags: GUEST_MEMFD_FLAGS,
    };

    /// `Ok` if teravm can back guest RAM with guest_memfd here, otherwise
    /// what is missing, in words a user can look up.
    pub fn check(&self) -> Result<(), String> {
        let mut missing = Vec::new();
        if !self.guest_memfd {
            missing.push("KVM_CAP_GUEST_MEMFD (KVM_CREATE_GUEST_MEMFD)".to_string());
        }
        if !self.user_memory2 {
            missing.push("KVM_CAP_USER_MEMORY2 (KVM_SET_USER_MEMORY_REGION2)".to_string());
        }
        for (bit, name) in [
            (GUEST_MEMFD_FLAG_MMAP, "GUEST_MEMFD_FLAG_MMAP"),
            (GUEST_MEMFD_FLAG_INIT_SHARED, "GUEST_MEMFD_FLAG_INIT_SHARED"),
        ] {
            if self.flags & bit == 0 {
                missing.push(format!("{name} in KVM_CAP_GUEST_MEMFD_FLAGS"));
            }
        }
        if missing.is_empty() {
            return Ok(());
        }
        Err(format!(
            "this kernel's KVM lacks {} (it offers guest_memfd flags {:#x}; teravm maps guest_memfd into its own address space, which needs Linux 6.18 or later)",
            missing.join(", "),
            self.flags
        ))
    }
}

/// Bytes allocated in a guest_memfd (or any file's page cache), whether used
/// yet or not (`cachestat` of the whole file). Unlike `mincore` on a
/// mapping it counts pages a populate allocated but nobody touched; unlike
/// `st_blocks` (always 0 for a guest_memfd) it counts at all.
pub fn allocated_bytes(file: &impl AsRawFd) -> std::io::Result<u64> {
    // Length 0: to the end of the file.
    sys::file_cached_bytes(file.as_raw_fd(), 0, 0)
}

/// Where guest_memfd files come from: `KVM_CREATE_GUEST_MEMFD` on the VM
/// (implemented by `vstate::vm::Vm`), always with [`GUEST_MEMFD_FLAGS`].
pub trait GuestMemfdSource {
    /// A new guest_memfd of `len` bytes, mappable and shared.
    fn create_guest_memfd(&self, len: u64) -> std::io::Result<File>;
}

/// How a slice's NUMA policy took effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NumaBinding {
    /// `mbind` on the slice's mapping, which its page faults follow
    /// (anonymous and memfd memory).
    Mbind,
    /// guest_memfd: the kernel keeps the policy for the file itself, so
    /// pages KVM allocates for the guest follow it too.
    FilePolicy,
    /// guest_memfd: the kernel ignores the policy when it allocates the
    /// file's pages; they come from the node of the thread that first
    /// touches them (populate's workers are pinned to the slice's node).
    IgnoredByKernel,
    /// No policy was asked for (`numa_policy` "none").
    NotAsked,
}

/// Whether the memory policy set with `mbind` on a mapping of `file` is
/// the file's own (a shared policy, which every allocation of the file
/// follows) rather than only that mapping's: maps one page of the file
/// again and asks for its policy (`get_mempolicy(MPOL_F_ADDR)`). A kernel
/// whose guest_memfd keeps no shared policy shows the default there.
pub(crate) fn probe_shared_policy(file: &File, mode: libc::c_int) -> std::io::Result<bool> {
    let page = sys::page_size();
    // SAFETY: a new mapping the kernel places (no MAP_FIXED), of a file we
    // own; nothing else refers to it and it is unmapped below.
    let addr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            page,
            libc::PROT_READ,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        )
    };
    if addr == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    let got = sys::policy_at(addr as usize);
    // SAFETY: the page mapped above, which nothing else refers to.
    unsafe { libc::munmap(addr, page) };
    Ok(got? == mode)
}

/// Where sampled pages of a slice landed after a populate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct Placement {
    /// Pages asked about.
    pub sampled_pages: u32,
    /// Of those, pages on the slice's node.
    pub on_node: u32,
    /// Pages on another node.
    pub elsewhere: u32,
    /// Pages the kernel could not place (`move_pages` gave an error).
    pub unknown: u32,
}

/// Pages `sample_placement` asks about per slice.
pub const PLACEMENT_SAMPLES: usize = 64;

/// Where `samples` pages spread evenly over `addr..addr+len` are
/// (`move_pages` without targets), against `node`. Each sample is read
/// once first, so that a page populated without teravm mapping it (a
/// guest_memfd `fallocate`) is mapped and can be asked about.
///
/// # Safety
/// `addr..addr+len` is a live readable mapping of the caller's.
pub(crate) unsafe fn sample_placement(
    addr: usize,
    len: u64,
    node: u32,
    samples: usize,
) -> Placement {
    let page = sys::page_size() as u64;
    let pages = (len / page).max(1);
    let n = samples.min(pages as usize).max(1);
    let step = pages / n as u64;
    let addrs: Vec<usize> = (0..n as u64)
        .map(|i| addr + (i * step * page) as usize)
        .collect();
    for &a in &addrs {
        // SAFETY: inside the caller's live readable mapping; a read
        // changes nothing.
        unsafe { std::ptr::read_volatile(a as *const u8) };
    }
    let nodes = sys::page_nodes(&addrs);
    let mut p = Placement {
        sampled_pages: n as u32,
        ..Placement::default()
    };
    for status in nodes {
        match status {
            Ok(s) if s == node => p.on_node += 1,
            Ok(_) => p.elsewhere += 1,
            Err(_) => p.unknown += 1,
        }
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn support_names_what_is_missing() {
        assert_eq!(GuestMemfdSupport::FULL.check(), Ok(()));
        let no_mmap = GuestMemfdSupport {
            flags: 0,
            ..GuestMemfdSupport::FULL
        };
        let e = no_mmap.check().unwrap_err();
        assert!(e.contains("GUEST_MEMFD_FLAG_MMAP"), "{e}");
        assert!(e.contains("GUEST_MEMFD_FLAG_INIT_SHARED"), "{e}");
        assert!(e.contains("flags 0x0"), "{e}");
        assert!(!e.contains("KVM_CAP_GUEST_MEMFD ("), "{e}");
        let e = GuestMemfdSupport::default().check().unwrap_err();
        assert!(
            e.contains("KVM_CAP_GUEST_MEMFD (KVM_CREATE_GUEST_MEMFD)"),
            "{e}"
        );
        assert!(e.contains("KVM_CAP_USER_MEMORY2"), "{e}");
        let only_mmap = GuestMemfdSupport {
            flags: GUEST_MEMFD_FLAG_MMAP,
            ..GuestMemfdSupport::FULL
        };
        let e = only_mmap.check().unwrap_err();
        assert!(
            e.contains("GUEST_MEMFD_FLAG_INIT_SHARED") && !e.contains("FLAG_MMAP "),
            "{e}"
        );
    }

    #[test]
    fn placement_of_anonymous_pages() {
        let len = 8 << 20;
        // SAFETY: a fresh private mapping, unmapped below.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(addr, libc::MAP_FAILED);
        // SAFETY: our own writable mapping.
        unsafe { std::ptr::write_bytes(addr as *mut u8, 1, len) };
        let node = sys::page_nodes(&[addr as usize])[0]
            .as_ref()
            .copied()
            .unwrap();
        // SAFETY: our own readable mapping.
        let p = unsafe { sample_placement(addr as usize, len as u64, node, 16) };
        assert_eq!(
            (p.sampled_pages, p.on_node, p.elsewhere, p.unknown),
            (16, 16, 0, 0)
        );
        // SAFETY: as above.
        let p = unsafe { sample_placement(addr as usize, len as u64, node + 1, 4) };
        assert_eq!((p.on_node, p.elsewhere), (0, 4));
        // SAFETY: our mapping, not used after.
        unsafe { libc::munmap(addr, len) };
    }
}

#[cfg(test)]
#[path = "gmem_tests.rs"]
pub(crate) mod kvm_tests;
