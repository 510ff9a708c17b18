//! The x86-64 guest physical map: RAM from 0 up to 3 GiB, an MMIO gap from
//! 3 GiB to 4 GiB, then RAM again from 4 GiB up.

/// Start of the MMIO gap (3 GiB); guest RAM below it starts at 0.
pub const MMIO_GAP_START: u64 = 3 << 30;
/// End of the MMIO gap (4 GiB); guest RAM above the gap starts here.
pub const MMIO_GAP_END: u64 = 4 << 30;

/// A contiguous range of guest RAM in guest physical address space.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RamRegion {
    /// First guest physical address of the region.
    pub guest_addr: u64,
    /// Length in bytes.
    pub len: u64,
}

impl RamRegion {
    /// One past the last guest physical address (saturating).
    pub fn end(&self) -> u64 {
        self.guest_addr.saturating_add(self.len)
    }
}

/// RAM from 0 up to 3 GiB, then from 4 GiB up: `mem_bytes` in total.
///
/// Zero bytes gives no region.
pub fn ram_regions(mem_bytes: u64) -> Vec<RamRegion> {
    let mut regions = Vec::with_capacity(2);
    let low = mem_bytes.min(MMIO_GAP_START);
    if low > 0 {
        regions.push(RamRegion {
            guest_addr: 0,
            len: low,
        });
    }
    let high = mem_bytes - low;
    if high > 0 {
        regions.push(RamRegion {
            guest_addr: MMIO_GAP_END,
            len: high,
        });
    }
    regions
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_guest_is_one_region() {
        assert_eq!(
            ram_regions(256 << 20),
            vec![RamRegion {
                guest_addr: 0,
                len: 256 << 20
            }]
        );
        assert!(ram_regions(0).is_empty());
    }

    #[test]
    fn exactly_three_gib_is_one_region() {
        assert_eq!(
            ram_regions(3 << 30),
            vec![RamRegion {
                guest_addr: 0,
                len: 3 << 30
            }]
        );
    }

    #[test]
    fn large_guest_skips_the_gap() {
        let r = ram_regions(1 << 40);
        assert_eq!(r.len(), 2);
        assert_eq!(
            r[0],
            RamRegion {
                guest_addr: 0,
                len: 3 << 30
            }
        );
        assert_eq!(r[1].guest_addr, MMIO_GAP_END);
        assert_eq!(r[0].len + r[1].len, 1 << 40);
        assert_eq!(r[1].end(), (1 << 40) + (1 << 30));
    }
}
