//! Guest ranges the balloon hands to the discard sink (the memory layer's
//! [`GuestRange`], never empty once they leave this module): PFNs coalesced
//! into ranges, and every range clipped to guest RAM and aligned inward to
//! the discard page size. Pure functions over values: nothing here touches
//! memory.

use vm_memory::{GuestMemoryBackend, GuestMemoryRegion};

use crate::memory::GuestRange;

/// The balloon's page: 4 KiB, whatever the backing (virtio 5.5.6).
pub const BALLOON_PAGE_BYTES: u64 = 4096;

/// Guest RAM as the balloon sees it: the memory's regions, sorted, and the
/// page size discards are made in (4 KiB, or the huge page size: only whole
/// pages are ever discarded).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RamMap {
    regions: Vec<GuestRange>,
    page_bytes: u64,
}

/// What clipping kept and refused.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Clipped {
    /// The pieces inside RAM, aligned inward, in the order given.
    pub ranges: Vec<GuestRange>,
    /// Bytes asked for that lay outside RAM or in partial pages.
    pub refused_bytes: u64,
    /// Ranges given that were refused in whole or in part.
    pub refused_ranges: u64,
}

impl RamMap {
    /// The regions of `mem`, discarding in pages of `page_bytes` (a power
    /// of two, at least 4 KiB; anything else is taken as 4 KiB).
    pub fn of<G: GuestMemoryBackend>(mem: &G, page_bytes: u64) -> RamMap {
        let regions = mem
            .iter()
            .map(|r| GuestRange {
                gpa: r.start_addr().0,
                len: r.len(),
            })
            .collect();
        RamMap::new(regions, page_bytes)
    }

    /// A map of the given regions (overlaps are not expected; the list is
    /// sorted here).
    pub fn new(mut regions: Vec<GuestRange>, page_bytes: u64) -> RamMap {
        regions.retain(|r| r.len > 0);
        regions.sort();
        let page_bytes = if page_bytes.is_power_of_two() && page_bytes >= BALLOON_PAGE_BYTES {
            page_bytes
        } else {
            BALLOON_PAGE_BYTES
        };
        RamMap {
            regions,
            page_bytes,
        }
    }

    /// The discard page size.
    pub fn page_bytes(&self) -> u64 {
        self.page_bytes
    }

    /// The RAM regions.
    pub fn regions(&self) -> &[GuestRange] {
        &self.regions
    }

    /// Bytes of RAM in all.
    pub fn total_bytes(&self) -> u64 {
        self.regions.iter().map(|r| r.len).sum()
    }

    /// Whether `r` lies inside one RAM region.
    pub fn contains(&self, r: &GuestRange) -> bool {
        self.regions.iter().any(|m| m.contains(r))
    }

    /// Clips each range to RAM, splitting at region ends, and aligns each
    /// piece inward to whole pages (counted from the region's start, so a
    /// huge page is never split). What is outside, or in a partial page, is
    /// refused and counted.
    pub fn clip(&self, ranges: &[GuestRange]) -> Clipped {
        let mut out = Clipped::default();
        let p = self.page_bytes;
        for r in ranges {
            let (start, end) = (r.gpa, r.end());
            let mut kept = 0u64;
            for m in &self.regions {
                let (lo, hi) = (start.max(m.gpa), end.min(m.end()));
                if lo >= hi {
                    continue;
                }
                // Align inward, relative to the region's start.
                let lo = m.gpa + (lo - m.gpa).div_ceil(p) * p;
                let hi = m.gpa + (hi - m.gpa) / p * p;
                if lo < hi {
                    out.ranges.push(GuestRange {
                        gpa: lo,
                        len: hi - lo,
                    });
                    kept += hi - lo;
                }
            }
            let asked = end - start;
            if kept < asked {
                out.refused_bytes += asked - kept;
                out.refused_ranges += 1;
            }
        }
        out
    }
}

/// Turns 4 KiB balloon PFNs into sorted, merged ranges (duplicates once).
pub fn pfns_to_ranges(pfns: &mut [u32]) -> Vec<GuestRange> {
    pfns.sort_unstable();
    let mut out: Vec<GuestRange> = Vec::new();
    let mut prev: Option<u32> = None;
    for &pfn in pfns.iter() {
        if prev == Some(pfn) {
            continue;
        }
        let gpa = u64::from(pfn) * BALLOON_PAGE_BYTES;
        match out.last_mut() {
            Some(last) if last.end() == gpa => last.len += BALLOON_PAGE_BYTES,
            _ => out.push(GuestRange {
                gpa,
                len: BALLOON_PAGE_BYTES,
            }),
        }
        prev = Some(pfn);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn r(gpa: u64, len: u64) -> GuestRange {
        GuestRange { gpa, len }
    }

    fn two_regions(page: u64) -> RamMap {
        // 0..3 GiB, then 4..5 GiB: the MMIO gap in between.
        RamMap::new(vec![r(4 * GIB, GIB), r(0, 3 * GIB)], page)
    }

    #[test]
    fn pfns_merge_sort_and_dedup() {
        let mut pfns = [5, 3, 4, 4, 10, 0xffff_ffff];
        assert_eq!(
            pfns_to_ranges(&mut pfns),
            vec![
                r(3 << 12, 3 << 12),
                r(10 << 12, 4096),
                r(0xffff_ffffu64 << 12, 4096)
            ]
        );
        assert!(pfns_to_ranges(&mut []).is_empty());
    }

    #[test]
    fn clip_keeps_ram_and_refuses_the_gap() {
        let map = two_regions(4096);
        // Across the gap: the part below 3 GiB and the part from 4 GiB.
        let c = map.clip(&[r(3 * GIB - 8192, GIB + 16384)]);
        assert_eq!(c.ranges, vec![r(3 * GIB - 8192, 8192), r(4 * GIB, 8192)]);
        assert_eq!(c.refused_bytes, GIB);
        assert_eq!(c.refused_ranges, 1);
        // Entirely in the gap, and beyond RAM.
        let c = map.clip(&[r(3 * GIB + 4096, 4096), r(5 * GIB, 1 << 40)]);
        assert!(c.ranges.is_empty());
        assert_eq!(c.refused_ranges, 2);
        // Near the top of the address space: no overflow.
        let c = map.clip(&[r(u64::MAX - 4095, 1 << 32)]);
        assert!(c.ranges.is_empty());
    }

    #[test]
    fn clip_aligns_inward() {
        let map = two_regions(4096);
        let c = map.clip(&[r(100, 8192)]);
        assert_eq!(c.ranges, vec![r(4096, 4096)]);
        assert_eq!(c.refused_bytes, 4096);
        let c = map.clip(&[r(4096, 4095)]);
        assert!(c.ranges.is_empty());
    }

    #[test]
    fn clip_huge_pages_whole_only() {
        let huge = 2 << 20;
        let map = two_regions(huge);
        assert_eq!(map.page_bytes(), huge);
        let c = map.clip(&[r(huge - 4096, 2 * huge)]);
        assert_eq!(c.ranges, vec![r(huge, huge)]);
        let c = map.clip(&[r(0, huge - 4096)]);
        assert!(c.ranges.is_empty());
        // A page size that is not a power of two falls back to 4 KiB.
        assert_eq!(RamMap::new(vec![], 3000).page_bytes(), 4096);
    }

    #[test]
    fn contains_checks_one_region() {
        let map = two_regions(4096);
        assert!(map.contains(&r(0, 3 * GIB)));
        assert!(!map.contains(&r(3 * GIB - 4096, 8192)));
        assert!(!map.contains(&r(u64::MAX, 2)));
        assert_eq!(map.total_bytes(), 4 * GIB);
    }
}
