//! The resident pages of anonymous guest memory that are the guest's own:
//! present in the page tables and not the shared zero page. `mincore`
//! counts a page the guest only read (mapped to the zero page, which
//! nothing frees) as resident, so a reclaim summary built on it claimed
//! memory the process never held; `PAGEMAP_SCAN` (Linux 6.7) on
//! `/proc/self/pagemap` tells the two apart, and answers in ranges, not a
//! byte a page. Where the kernel lacks it, or the file was not opened, the
//! caller counts with `mincore` as before. The same scan gives a
//! snapshot the ranges that hold data ([`data_ranges`]).
//!
//! Hand-written: the ioctl's structures (`include/uapi/linux/fs.h`) are in
//! no libc release yet.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

/// `PAGEMAP_SCAN`: `_IOWR('f', 16, struct pm_scan_arg)` (96 bytes).
pub const PAGEMAP_SCAN: libc::c_ulong = 0xc060_6610;
const PAGE_IS_FILE: u64 = 1 << 2;
const PAGE_IS_PRESENT: u64 = 1 << 3;
const PAGE_IS_SWAPPED: u64 = 1 << 4;
const PAGE_IS_PFNZERO: u64 = 1 << 5;
/// Regions asked for per call.
const REGIONS: usize = 256;

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct PageRegion {
    start: u64,
    end: u64,
    categories: u64,
}

#[repr(C)]
#[derive(Debug, Default)]
struct PmScanArg {
    size: u64,
    flags: u64,
    start: u64,
    end: u64,
    walk_end: u64,
    vec: u64,
    vec_len: u64,
    max_pages: u64,
    category_inverted: u64,
    category_mask: u64,
    category_anyof_mask: u64,
    return_mask: u64,
}

static PAGEMAP: OnceLock<Option<File>> = OnceLock::new();
/// Set once the kernel refused the ioctl: `mincore` from then on.
static UNSUPPORTED: AtomicBool = AtomicBool::new(false);

/// Opens `/proc/self/pagemap` (read-only, once), on a thread whose filter
/// lets it open `/proc` files (the start); later calls do nothing.
pub fn open() {
    PAGEMAP.get_or_init(|| File::open("/proc/self/pagemap").ok());
}

/// What the summary says when `/proc/self/pagemap` could not be opened
/// ([`open`]; a jail without `/proc`): the reclaim's resident bytes are
/// then `mincore`'s, which also counts the pages the guest only read.
/// `None` when it is open (or not tried yet).
pub fn unavailable() -> Option<&'static str> {
    match PAGEMAP.get() {
        Some(None) => Some(
            "resident bytes counted by mincore (no /proc/self/pagemap: pages the guest only \
             read count too)",
        ),
        _ => None,
    }
}

/// Bytes of `addr..addr+len` (page-aligned, mapped anonymous private)
/// present and not the zero page; None where `PAGEMAP_SCAN` cannot answer
/// (the file was not opened, or the kernel lacks the ioctl).
pub fn owned_bytes(addr: usize, len: usize) -> Option<io::Result<u64>> {
    let mut total = 0;
    // Present, and not (inverted) the zero page nor a file's page (a
    // memory file mapped private: its page cache pages stay when unmapped,
    // only the copies written are the guest's own).
    let filter = Filter {
        inverted: PAGE_IS_PFNZERO | PAGE_IS_FILE,
        all_of: PAGE_IS_PRESENT | PAGE_IS_PFNZERO | PAGE_IS_FILE,
        any_of: 0,
        returned: PAGE_IS_PRESENT,
    };
    scan(addr, len, &filter, &mut |start, end| {
        total += end - start;
        Ok(())
    })
    .map(|r| r.map(|()| total))
}

/// Calls `f(start, end)` for each range of `addr..addr+len` (page-aligned,
/// mapped anonymous private) that holds data of its own: present or
/// swapped out, and not the zero page (what a snapshot writes); in address
/// order, adjacent ranges possibly apart. None where `PAGEMAP_SCAN` cannot
/// answer, as [`owned_bytes`]; an error of `f` ends the scan.
pub fn data_ranges(
    addr: usize,
    len: usize,
    f: &mut dyn FnMut(u64, u64) -> io::Result<()>,
) -> Option<io::Result<()>> {
    let filter = Filter {
        inverted: PAGE_IS_PFNZERO,
        all_of: PAGE_IS_PFNZERO,
        any_of: PAGE_IS_PRESENT | PAGE_IS_SWAPPED,
        returned: PAGE_IS_PRESENT | PAGE_IS_SWAPPED,
    };
    scan(addr, len, &filter, f)
}

/// Which pages a scan reports (`pm_scan_arg`'s masks): those whose
/// categories, XORed with `inverted`, have all of `all_of` and (when not 0)
/// one of `any_of`; regions are cut where the `returned` categories change.
struct Filter {
    inverted: u64,
    all_of: u64,
    any_of: u64,
    returned: u64,
}

fn scan(
    addr: usize,
    len: usize,
    filter: &Filter,
    f: &mut dyn FnMut(u64, u64) -> io::Result<()>,
) -> Option<io::Result<()>> {
    if UNSUPPORTED.load(Ordering::Relaxed) {
        return None;
    }
    let file = PAGEMAP.get()?.as_ref()?;
    let mut regions = [PageRegion::default(); REGIONS];
    let end = (addr + len) as u64;
    let mut start = addr as u64;
    let mut first = true;
    while start < end {
        let mut arg = PmScanArg {
            size: std::mem::size_of::<PmScanArg>() as u64,
            start,
            end,
            vec: regions.as_mut_ptr() as u64,
            vec_len: REGIONS as u64,
            category_inverted: filter.inverted,
            category_mask: filter.all_of,
            category_anyof_mask: filter.any_of,
            return_mask: filter.returned,
            ..PmScanArg::default()
        };
        // SAFETY: the kernel reads and writes `arg` (the layout of struct
        // pm_scan_arg, its size given) and writes at most `vec_len` regions
        // into `regions`, both ours; it only reads the page tables of the
        // range.
        let n = unsafe { libc::ioctl(file.as_raw_fd(), PAGEMAP_SCAN, &mut arg as *mut PmScanArg) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if matches!(e.raw_os_error(), Some(libc::ENOTTY | libc::EINVAL)) && first {
                UNSUPPORTED.store(true, Ordering::Relaxed);
                return None;
            }
            return Some(Err(e));
        }
        first = false;
        for r in &regions[..(n as usize).min(REGIONS)] {
            if r.end > r.start {
                if let Err(e) = f(r.start, r.end) {
                    return Some(Err(e));
                }
            }
        }
        if arg.walk_end <= start {
            return Some(Err(io::Error::other("PAGEMAP_SCAN made no progress")));
        }
        start = arg.walk_end;
    }
    Some(Ok(()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ioctl_number_is_iowr_f_16_and_the_filters_allow_it() {
        let iowr = (3 << 30) | ((std::mem::size_of::<PmScanArg>() as libc::c_ulong) << 16);
        assert_eq!(PAGEMAP_SCAN, iowr | (libc::c_ulong::from(b'f') << 8) | 16);
        assert_eq!(PAGEMAP_SCAN, crate::seccomp::filters::PAGEMAP_SCAN);
    }

    /// A page written is owned; one only read (the zero page) and one never
    /// touched are not; `mincore` counts the read one too.
    #[test]
    fn a_page_only_read_is_not_owned() {
        open();
        let page = 4096;
        let len = 16 * page;
        // 4 KiB pages, so a read maps the 4 KiB zero page; unmapped on drop.
        let map = super::super::reclaim::tests::Map::anon(len);
        let base = map.addr;
        for i in 0..4 {
            // SAFETY: inside the mapping.
            unsafe { ((base + i * page) as *mut u64).write_volatile(1) };
        }
        for i in 4..10 {
            // SAFETY: inside the mapping.
            let _ = unsafe { ((base + i * page) as *const u64).read_volatile() };
        }
        let mincore = super::super::sys::resident_bytes(base, len, &mut Vec::new()).unwrap();
        match owned_bytes(base, len) {
            Some(owned) => {
                assert_eq!(owned.unwrap(), 4 * page as u64);
                assert_eq!(mincore, 10 * page as u64, "mincore counts the zero page");
            }
            None => teravm_client::not_possible(
                "memory::pagemap::a_page_only_read_is_not_owned",
                "this kernel has no PAGEMAP_SCAN (Linux 6.7)",
            ),
        }
    }
}
