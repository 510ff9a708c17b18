//! One node slice's host mapping, owned: [`SliceMapping`] maps the slice
//! (private anonymous, or memfd stripes mapped contiguously into one
//! reservation), advises it (huge pages, `MADV_DONTDUMP`), binds it to its
//! node, and unmaps it in `Drop`. Nothing else in teravm calls `munmap` on
//! guest memory.

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};
use std::sync::OnceLock;

use super::error::GuestMemoryError;
use super::gmem::{self, GuestMemfdSource, NumaBinding, Placement};
use super::options::{Backing, NumaPolicy, PageSize};
use super::plan::NodeSlice;
use super::reclaim::{FreeMethod, HostRange};
use super::sys;

const MIB: u64 = 1 << 20;

/// The smallest memfd (and guest_memfd) stripe. A hole punch holds its
/// file's inode lock for the whole call (`shmem_fallocate`,
/// `kvm_gmem_fallocate`), so two workers in one file take turns: a
/// reclaim frees whole stripes, one worker a file
/// ([`super::ReclaimOptions::chunk_bytes_for`]), and a slice has enough of
/// them for every worker from 1 GiB up (8 stripes; 32, the cap, from
/// 4 GiB). With 1 GiB stripes and the guest-sized chunks (512 MiB at
/// 4 GiB for 2 workers) both workers punched the same file and 2 workers
/// freed a 4 GiB memfd only 1.3x faster than one `munmap`.
pub const MEMFD_STRIPE_BYTES: u64 = 128 * MIB;
/// Most memfd stripes per slice (file descriptors and VMAs stay bounded:
/// a 64 TiB guest on one node is 32 stripes of 2 TiB).
pub const MAX_STRIPES_PER_SLICE: u64 = 32;

/// A host mapping that this value owns and unmaps on drop.
#[derive(Debug)]
struct Mapping {
    addr: usize,
    len: usize,
}

impl Mapping {
    /// Unmaps now, reporting a failure (drop would only log it).
    fn unmap(self) -> std::io::Result<()> {
        let (addr, len) = (self.addr, self.len);
        std::mem::forget(self);
        // SAFETY: `addr..addr+len` is a mapping that this `Mapping` owned
        // (made by `mmap` in this module); it was consumed, so nothing can
        // reach the range through it any more.
        let ret = unsafe { libc::munmap(addr as *mut libc::c_void, len) };
        if ret == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: as in `unmap`: our own mapping, and its owner is gone.
        if unsafe { libc::munmap(self.addr as *mut libc::c_void, self.len) } != 0 {
            log::warn!(
                "munmap of {:#x}+{:#x} failed: {}",
                self.addr,
                self.len,
                std::io::Error::last_os_error()
            );
        }
    }
}

/// One memfd of a striped slice.
#[derive(Debug)]
pub struct Stripe {
    /// Offset of the stripe in the slice (and in the slice's mapping).
    pub offset: u64,
    /// Its length (the file's size).
    pub len: u64,
    /// The memfd.
    pub file: File,
}

/// Where a slice's contents are: in its own memory, or (a guest restored
/// from a snapshot) partly still in the memory file or with a page fault
/// handler, until touched.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Contents {
    /// All in the mapping (anonymous, memfd, guest_memfd; an eager load).
    #[default]
    Own,
    /// Mapped private from a snapshot's memory file: untouched pages are
    /// the file's, written ones copies of their own.
    MemoryFile,
    /// Registered with a userfaultfd: missing pages are the handler's.
    Userfault,
}

/// One node slice and the host mapping behind it, unmapped when dropped.
#[derive(Debug)]
pub struct SliceMapping {
    // Declared first: the mapping goes before the memfds close.
    map: Mapping,
    slice: NodeSlice,
    stripes: Vec<Stripe>,
    backing: Backing,
    numa: NumaBinding,
    placement: OnceLock<Placement>,
    contents: Contents,
}

impl SliceMapping {
    /// The slice of guest RAM.
    pub fn slice(&self) -> NodeSlice {
        self.slice
    }

    /// Host virtual address of the slice's first byte.
    pub fn host_addr(&self) -> usize {
        self.map.addr
    }

    /// The memfds or guest_memfds, in slice order (empty for anonymous
    /// memory).
    pub fn stripes(&self) -> &[Stripe] {
        &self.stripes
    }

    /// What backs the slice.
    pub fn backing(&self) -> Backing {
        self.backing
    }

    /// Where its contents are.
    pub fn contents(&self) -> Contents {
        self.contents
    }

    pub(crate) fn set_contents(&mut self, contents: Contents) {
        self.contents = contents;
    }

    /// Takes ownership of `addr..addr + slice.len`, a private mapping
    /// (anonymous or of a file) that the caller made, to unmap it on drop.
    ///
    /// # Safety
    /// The range is a live mapping of the caller that nothing else owns or
    /// unmaps.
    pub(crate) unsafe fn adopt(slice: &NodeSlice, addr: usize, contents: Contents) -> SliceMapping {
        SliceMapping {
            map: Mapping {
                addr,
                len: slice.len as usize,
            },
            slice: *slice,
            stripes: Vec::new(),
            backing: Backing::Anonymous,
            numa: NumaBinding::NotAsked,
            placement: OnceLock::new(),
            contents,
        }
    }

    /// How its NUMA policy took effect.
    pub fn numa_binding(&self) -> NumaBinding {
        self.numa
    }

    /// Where sampled pages landed, once a populate checked.
    pub fn placement(&self) -> Option<Placement> {
        self.placement.get().copied()
    }

    /// Checks where `samples` pages of the slice are (after a populate) and
    /// keeps the answer for [`SliceMapping::placement`].
    pub(crate) fn check_placement(&self, samples: usize) -> Placement {
        // SAFETY: our own live mapping (kept by `&self`), readable.
        let p = unsafe {
            gmem::sample_placement(self.map.addr, self.slice.len, self.slice.node, samples)
        };
        let _ = self.placement.set(p);
        p
    }

    /// The ranges the reclaim executor frees: the whole slice for anonymous
    /// memory, one per stripe for memfd (a hole punch in its own file).
    pub(crate) fn free_ranges(&self) -> Vec<HostRange> {
        if self.stripes.is_empty() {
            return vec![HostRange {
                node: self.slice.node,
                host_addr: self.map.addr,
                len: self.slice.len,
                method: FreeMethod::DontNeed,
            }];
        }
        self.stripes
            .iter()
            .map(|s| {
                let (fd, file_offset) = (s.file.as_raw_fd(), 0);
                HostRange {
                    node: self.slice.node,
                    host_addr: self.map.addr + s.offset as usize,
                    len: s.len,
                    method: match self.backing {
                        Backing::GuestMemfd => FreeMethod::ZapThenPunch { fd, file_offset },
                        _ => FreeMethod::PunchHole { fd, file_offset },
                    },
                }
            })
            .collect()
    }

    /// Unmaps the slice and closes its memfds; an `munmap` failure is
    /// returned as `(address, length, error)`.
    pub(crate) fn unmap(self) -> Result<(), (usize, u64, std::io::Error)> {
        let SliceMapping {
            map,
            slice,
            stripes,
            ..
        } = self;
        let addr = map.addr;
        let result = map.unmap().map_err(|e| (addr, slice.len, e));
        drop(stripes);
        result
    }

    /// Replaces the slice's mapping with an inaccessible reservation
    /// (`PROT_NONE`, `MAP_FIXED`: the old pages go at once) that is never
    /// unmapped, and closes the memfds: for a range a guest may still write
    /// through KVM (a vCPU thread that did not stop), so that no later
    /// mapping of this process can land there. Its accesses then fail in
    /// KVM instead of reaching other memory.
    pub(crate) fn reserve(self) -> std::io::Result<()> {
        let SliceMapping { map, stripes, .. } = self;
        let (addr, len) = (map.addr, map.len);
        // Never unmapped from here on: the range stays ours until exit.
        std::mem::forget(map);
        // SAFETY: `addr..addr+len` is the mapping this value owned (its
        // `Mapping` was consumed above); MAP_FIXED replaces exactly that
        // range, which no Rust reference points into any more (views hold
        // the `Arc` that owned this slice and are gone).
        let p = unsafe {
            libc::mmap(
                addr as *mut libc::c_void,
                len,
                libc::PROT_NONE,
                libc::MAP_FIXED | libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        drop(stripes);
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// Maps `slice` as asked: advised, `MADV_DONTDUMP`, bound to its node
    /// (unless `policy` is none). guest_memfd stripes come from `gmem`.
    /// On error nothing stays mapped.
    pub(crate) fn new(
        slice: &NodeSlice,
        index: usize,
        backing: Backing,
        page_size: PageSize,
        policy: NumaPolicy,
        gmem: Option<&dyn GuestMemfdSource>,
    ) -> Result<SliceMapping, GuestMemoryError> {
        let node = slice.node;
        let mapped = match backing {
            Backing::Anonymous => map_anonymous(slice, page_size)?,
            Backing::Memfd => map_striped(slice, page_size, backing, &|n, this| {
                new_memfd(slice, index, n, this, page_size)
            })?,
            Backing::GuestMemfd => {
                let source = gmem.ok_or(GuestMemoryError::GuestMemfdNeedsVm)?;
                if let Some(page) = page_size.hugetlb_bytes() {
                    return Err(GuestMemoryError::GuestMemfdPageSize { page });
                }
                map_striped(slice, PageSize::Small, backing, &|_, this| {
                    source
                        .create_guest_memfd(this)
                        .map_err(|source| GuestMemoryError::GuestMemfd {
                            node,
                            len: this,
                            source,
                        })
                })?
            }
        };
        mapped.settle(page_size, policy)
    }

    /// Advises a fresh mapping (huge pages for private memory,
    /// `MADV_DONTDUMP`) and binds it to its node (unless `policy` is none).
    /// On error it is unmapped (dropped).
    pub(crate) fn settle(
        mut self,
        page_size: PageSize,
        policy: NumaPolicy,
    ) -> Result<SliceMapping, GuestMemoryError> {
        let mapped = &mut self;
        let (node, len, backing) = (mapped.slice.node, mapped.slice.len, mapped.backing);
        let addr = mapped.map.addr;
        let size = mapped.map.len;
        if backing == Backing::Anonymous && page_size.hugetlb_bytes().is_none() {
            let (advice, name) = if page_size == PageSize::Small {
                (libc::MADV_NOHUGEPAGE, "MADV_NOHUGEPAGE")
            } else {
                (libc::MADV_HUGEPAGE, "MADV_HUGEPAGE")
            };
            // SAFETY: our own fresh mapping; huge page advice keeps contents.
            unsafe { sys::madvise(addr, size, advice) }.map_err(|source| {
                GuestMemoryError::Madvise {
                    node,
                    advice: name,
                    source,
                }
            })?;
        }
        // Keep the guest out of core dumps (a terabyte for a sparse guest).
        // SAFETY: our own mapping; MADV_DONTDUMP only changes a VMA flag.
        unsafe { sys::madvise(addr, size, libc::MADV_DONTDUMP) }.map_err(|source| {
            GuestMemoryError::Madvise {
                node,
                advice: "MADV_DONTDUMP",
                source,
            }
        })?;
        if let Some(mode) = policy.mbind_mode() {
            sys::mbind(addr, size, mode, node)
                .map_err(|source| GuestMemoryError::Mbind { node, source })?;
            mapped.numa = match (backing, mapped.stripes.first()) {
                (Backing::GuestMemfd, Some(first)) => {
                    match gmem::probe_shared_policy(&first.file, mode) {
                        Ok(true) => NumaBinding::FilePolicy,
                        Ok(false) => NumaBinding::IgnoredByKernel,
                        Err(source) => return Err(GuestMemoryError::Mbind { node, source }),
                    }
                }
                _ => NumaBinding::Mbind,
            };
        }
        debug_assert_eq!(size as u64, len);
        Ok(self)
    }
}

fn to_usize(
    len: u64,
    err: impl Fn(std::io::Error) -> GuestMemoryError,
) -> Result<usize, GuestMemoryError> {
    usize::try_from(len).map_err(|_| err(std::io::Error::from_raw_os_error(libc::ENOMEM)))
}

/// `mmap` of a new range the kernel places (or `fixed` for a stripe inside
/// our own reservation).
fn mmap(
    fixed: Option<usize>,
    len: usize,
    prot: libc::c_int,
    flags: libc::c_int,
    fd: libc::c_int,
) -> std::io::Result<usize> {
    let (hint, fixed_flag) = match fixed {
        Some(a) => (a as *mut libc::c_void, libc::MAP_FIXED),
        None => (std::ptr::null_mut(), 0),
    };
    // SAFETY: without MAP_FIXED the kernel picks a free range and nothing is
    // replaced; with it, `fixed` is inside a reservation that the caller owns
    // and that nothing references yet (the stripes are mapped before the
    // slice is handed out).
    let addr = unsafe { libc::mmap(hint, len, prot, flags | fixed_flag, fd, 0) };
    if addr == libc::MAP_FAILED {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(addr as usize)
    }
}

fn map_error(
    slice: &NodeSlice,
    page_size: PageSize,
) -> impl Fn(std::io::Error) -> GuestMemoryError {
    let (node, len) = (slice.node, slice.len);
    move |source| match page_size.hugetlb_bytes() {
        Some(page) => GuestMemoryError::HugePages {
            node,
            len,
            page,
            source,
        },
        None => GuestMemoryError::Mmap { node, len, source },
    }
}

/// Private anonymous memory: `MAP_NORESERVE`, or `MAP_HUGETLB` (reserved now,
/// so a host without free huge pages fails here).
fn map_anonymous(slice: &NodeSlice, page_size: PageSize) -> Result<SliceMapping, GuestMemoryError> {
    let err = map_error(slice, page_size);
    let size = to_usize(slice.len, &err)?;
    let mut flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
    flags |= match page_size.hugetlb_bytes() {
        Some(_) => libc::MAP_HUGETLB | page_size.huge_flag(),
        None => libc::MAP_NORESERVE,
    };
    let addr = mmap(None, size, libc::PROT_READ | libc::PROT_WRITE, flags, -1).map_err(&err)?;
    Ok(SliceMapping {
        map: Mapping { addr, len: size },
        slice: *slice,
        stripes: Vec::new(),
        backing: Backing::Anonymous,
        numa: NumaBinding::NotAsked,
        placement: OnceLock::new(),
        contents: Contents::Own,
    })
}

/// The stripe size for a slice of `len` bytes: [`MEMFD_STRIPE_BYTES`], or
/// larger (a multiple of it) to keep at most [`MAX_STRIPES_PER_SLICE`]; a
/// multiple of the huge page size.
pub fn stripe_bytes(len: u64, page: u64) -> u64 {
    let unit = MEMFD_STRIPE_BYTES.max(page);
    let stripes_at_unit = len.div_ceil(unit);
    let per = stripes_at_unit.div_ceil(MAX_STRIPES_PER_SLICE).max(1);
    unit.saturating_mul(per)
}

/// A memfd of `len` bytes for stripe `n` of slice `index` (hugetlb for the
/// hugetlb page sizes).
fn new_memfd(
    slice: &NodeSlice,
    index: usize,
    n: usize,
    len: u64,
    page_size: PageSize,
) -> Result<File, GuestMemoryError> {
    let node = slice.node;
    let name = std::ffi::CString::new(format!("teravm-n{node}-{index}-{n}")).unwrap_or_default();
    let mut flags = libc::MFD_CLOEXEC;
    if page_size.hugetlb_bytes().is_some() {
        flags |= libc::MFD_HUGETLB | page_size.huge_flag() as libc::c_uint;
    }
    // SAFETY: `name` is NUL-terminated; no memory of ours is touched.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), flags) };
    if fd < 0 {
        let source = std::io::Error::last_os_error();
        return Err(match page_size.hugetlb_bytes() {
            Some(_) => map_error(slice, page_size)(source),
            None => GuestMemoryError::Memfd { node, source },
        });
    }
    // SAFETY: `fd` is a fresh descriptor that nothing else owns.
    let file = unsafe { File::from_raw_fd(fd) };
    file.set_len(len)
        .map_err(|source| GuestMemoryError::Truncate { node, len, source })?;
    Ok(file)
}

/// Striped backing (memfd, guest_memfd): a `PROT_NONE` reservation aligned
/// to 2 MiB (or the huge page), with one file per stripe (from `new_file`,
/// given the stripe's number and length) mapped over it with `MAP_FIXED`,
/// so the slice stays one contiguous host range while hole punches of
/// different stripes take different files' locks.
fn map_striped(
    slice: &NodeSlice,
    page_size: PageSize,
    backing: Backing,
    new_file: &dyn Fn(usize, u64) -> Result<File, GuestMemoryError>,
) -> Result<SliceMapping, GuestMemoryError> {
    let len = slice.len;
    let err = map_error(slice, page_size);
    let size = to_usize(len, &err)?;
    let page = page_size.hugetlb_bytes();
    let align = to_usize(page.unwrap_or(0).max(2 * MIB), &err)?;
    // Reserve with room to align, then give back the unaligned ends.
    let reserve = size
        .checked_add(align)
        .ok_or_else(|| err(std::io::Error::from_raw_os_error(libc::ENOMEM)))?;
    let base = mmap(
        None,
        reserve,
        libc::PROT_NONE,
        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
        -1,
    )
    .map_err(&err)?;
    let start = base.next_multiple_of(align);
    let whole = Mapping {
        addr: base,
        len: reserve,
    };
    // Split the reservation into the three parts and let the ends go.
    std::mem::forget(whole);
    let head = Mapping {
        addr: base,
        len: start - base,
    };
    let tail = Mapping {
        addr: start + size,
        len: base + reserve - (start + size),
    };
    let map = Mapping {
        addr: start,
        len: size,
    };
    for end in [head, tail] {
        if end.len > 0 {
            end.unmap().map_err(&err)?;
        } else {
            std::mem::forget(end);
        }
    }
    let mut mapping = SliceMapping {
        map,
        slice: *slice,
        stripes: Vec::new(),
        backing,
        numa: NumaBinding::NotAsked,
        placement: OnceLock::new(),
        contents: Contents::Own,
    };
    let stripe = stripe_bytes(len, page.unwrap_or(0));
    let mut offset = 0u64;
    let mut n = 0usize;
    while offset < len {
        let this = stripe.min(len - offset);
        let file = new_file(n, this)?;
        let at = mapping.map.addr + offset as usize;
        mmap(
            Some(at),
            to_usize(this, &err)?,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            file.as_raw_fd(),
        )
        .map_err(&err)?;
        mapping.stripes.push(Stripe {
            offset,
            len: this,
            file,
        });
        offset += this;
        n += 1;
    }
    Ok(mapping)
}

#[cfg(test)]
#[path = "mapping_tests.rs"]
mod tests;
