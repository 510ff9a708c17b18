//! A range of guest physical addresses: the one type in which the balloon,
//! virtio-mem and the discard pool speak of guest memory given back,
//! plugged or freed, and the few things done to lists of them (sorting and
//! merging, asking whether any overlaps). Pure values: nothing here knows
//! of host addresses, nodes or devices.

/// A range of guest physical addresses, `[gpa, gpa + len)`. Ordered by
/// address, then length.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GuestRange {
    /// The first guest physical address.
    pub gpa: u64,
    /// Its length in bytes.
    pub len: u64,
}

impl GuestRange {
    /// The range of `len` bytes from `gpa`.
    pub const fn new(gpa: u64, len: u64) -> GuestRange {
        GuestRange { gpa, len }
    }

    /// One past the last address (saturating at `u64::MAX`).
    pub fn end(&self) -> u64 {
        self.gpa.saturating_add(self.len)
    }

    /// Whether `other` lies wholly inside this range (a range that runs
    /// past 2^64 lies inside none).
    pub fn contains(&self, other: &GuestRange) -> bool {
        other.gpa >= self.gpa
            && other.end() <= self.end()
            && other.gpa.checked_add(other.len).is_some()
    }

    /// Whether the two ranges share an address.
    pub fn overlaps(&self, other: &GuestRange) -> bool {
        self.gpa < other.end() && other.gpa < self.end()
    }
}

/// `ranges` sorted by address, those that overlap or touch merged (empty
/// ones dropped): the form [`overlaps_any`] searches.
pub fn sorted_merged(mut ranges: Vec<GuestRange>) -> Vec<GuestRange> {
    ranges.retain(|r| r.len > 0);
    ranges.sort_unstable();
    let mut out: Vec<GuestRange> = Vec::with_capacity(ranges.len());
    for r in ranges {
        match out.last_mut() {
            Some(last) if r.gpa <= last.end() => {
                last.len = last.end().max(r.end()) - last.gpa;
            }
            _ => out.push(r),
        }
    }
    out
}

/// Whether `r` overlaps any of `sorted` (as [`sorted_merged`] makes it).
pub fn overlaps_any(sorted: &[GuestRange], r: &GuestRange) -> bool {
    let i = sorted.partition_point(|s| s.end() <= r.gpa);
    sorted.get(i).is_some_and(|s| s.gpa < r.end())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(gpa: u64, len: u64) -> GuestRange {
        GuestRange::new(gpa, len)
    }

    #[test]
    fn overlaps_search_merged_ranges() {
        let s = sorted_merged(vec![r(0x5000, 0x1000), r(0x1000, 0x1000), r(0x2000, 0x800)]);
        assert_eq!(s, vec![r(0x1000, 0x1800), r(0x5000, 0x1000)]);
        assert!(overlaps_any(&s, &r(0x27ff, 1)));
        assert!(!overlaps_any(&s, &r(0x2800, 0x2800)));
        assert!(overlaps_any(&s, &r(0, 0x1001)));
        assert!(overlaps_any(&s, &r(0x5800, 0x100)));
        assert!(!overlaps_any(&s, &r(0x6000, 0x1000)));
        assert!(!overlaps_any(&s, &r(0, 0x1000)));
        assert!(!overlaps_any(&[], &r(0, u64::MAX)));
        assert!(overlaps_any(&s, &r(0, u64::MAX)));
    }

    #[test]
    fn merge_drops_empty_and_saturates() {
        let s = sorted_merged(vec![
            r(0x3000, 0),
            r(u64::MAX - 0xfff, 0x2000),
            r(0x1000, 0x1000),
        ]);
        assert_eq!(s, vec![r(0x1000, 0x1000), r(u64::MAX - 0xfff, 0x2000)]);
        assert_eq!(s[1].end(), u64::MAX);
    }

    #[test]
    fn contains_and_overlaps() {
        let a = r(0x1000, 0x2000);
        assert!(a.contains(&r(0x1000, 0x2000)));
        assert!(a.contains(&r(0x2000, 0x1000)));
        assert!(!a.contains(&r(0x2000, 0x1001)));
        assert!(!a.contains(&r(0xfff, 2)));
        assert!(!r(0, u64::MAX).contains(&r(u64::MAX, 2)));
        assert!(a.overlaps(&r(0x2fff, 1)));
        assert!(!a.overlaps(&r(0x3000, 1)));
        assert!(!a.overlaps(&r(0, 0x1000)));
        assert!(a.overlaps(&r(0, u64::MAX)));
    }
}
