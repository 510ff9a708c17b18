//! The pages the balloon takes and `report=` reports: the touched RAM, as
//! `mem::touch` dirtied it (the same walk over [`mem::touchable`]), counted
//! in 4 KiB pages. Balloon page `j` is touched page `T-1-j`.

use super::PAGE;
use crate::mem::{self, BootInfo, Range, MAX_RANGES};

/// The touched RAM, as `mem::touch` dirtied it: its ranges in order, each
/// a whole number of pages.
pub struct Touched {
    ranges: [Range; MAX_RANGES],
    n: usize,
    /// Pages touched (`T`).
    pub pages: u64,
}

impl Touched {
    /// The ranges `mem::touch` wrote `bytes` into (the same walk).
    pub fn new(info: &BootInfo, mapped: u64, bytes: u64) -> Touched {
        let mut t = Touched {
            ranges: [Range::default(); MAX_RANGES],
            n: 0,
            pages: 0,
        };
        let mut left = bytes;
        for r in mem::touchable(info, mapped) {
            if left == 0 || t.n == MAX_RANGES {
                break;
            }
            let n = (r.end - r.start).min(left) & !(PAGE - 1);
            if n != 0 {
                t.ranges[t.n] = Range {
                    start: r.start,
                    end: r.start + n,
                };
                t.n += 1;
                t.pages += n / PAGE;
            }
            left -= n;
        }
        t
    }

    /// The address of touched page `k` (0 = the first touched).
    fn page(&self, mut k: u64) -> u64 {
        for r in &self.ranges[..self.n] {
            let n = (r.end - r.start) / PAGE;
            if k < n {
                return r.start + k * PAGE;
            }
            k -= n;
        }
        unreachable!("touched page out of range")
    }

    /// The PFN of balloon page `j`: touched page `T-1-j`.
    pub fn balloon_pfn(&self, j: u64) -> u32 {
        (self.page(self.pages - 1 - j) >> 12) as u32
    }

    /// The touched ranges, top first.
    pub fn ranges_down(&self) -> impl Iterator<Item = Range> + '_ {
        self.ranges[..self.n].iter().rev().copied()
    }
}
