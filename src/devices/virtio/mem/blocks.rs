//! The plugged state of each block: a bitmap of `u64` words, a bit per
//! block, with the count of set bits kept beside it. Ranges are
//! `(first block, blocks)` that the caller has checked lie inside.

/// A bit per block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Blocks {
    words: Vec<u64>,
    len: usize,
    plugged: usize,
}

/// The (word, mask) pieces of the bits `[first, first + n)`.
fn pieces(first: usize, n: usize) -> impl Iterator<Item = (usize, u64)> {
    let end = first + n;
    let mut at = first;
    std::iter::from_fn(move || {
        if at >= end {
            return None;
        }
        let word = at / 64;
        let lo = at % 64;
        let hi = (end - word * 64).min(64);
        let mask = if hi - lo == 64 {
            u64::MAX
        } else {
            ((1u64 << (hi - lo)) - 1) << lo
        };
        at = word * 64 + hi;
        Some((word, mask))
    })
}

impl Blocks {
    /// `len` blocks, none plugged.
    pub(crate) fn new(len: usize) -> Blocks {
        Blocks {
            words: vec![0; len.div_ceil(64)],
            len,
            plugged: 0,
        }
    }

    /// How many blocks there are.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// How many are plugged.
    pub(crate) fn plugged(&self) -> usize {
        self.plugged
    }

    /// How many of `[first, first + n)` are plugged.
    pub(crate) fn count(&self, first: usize, n: usize) -> usize {
        debug_assert!(first + n <= self.len);
        pieces(first, n)
            .map(|(w, m)| (self.words[w] & m).count_ones() as usize)
            .sum()
    }

    /// Plugs (`on`) or unplugs `[first, first + n)`.
    pub(crate) fn set(&mut self, first: usize, n: usize, on: bool) {
        debug_assert!(first + n <= self.len);
        for (w, m) in pieces(first, n) {
            let before = (self.words[w] & m).count_ones() as usize;
            if on {
                self.words[w] |= m;
                self.plugged += m.count_ones() as usize - before;
            } else {
                self.words[w] &= !m;
                self.plugged -= before;
            }
        }
    }

    /// The runs of plugged blocks, `(first, blocks)`, in order.
    pub(crate) fn runs(&self) -> Vec<(usize, usize)> {
        let mut runs: Vec<(usize, usize)> = Vec::new();
        for (w, &word) in self.words.iter().enumerate() {
            let mut bits = word;
            while bits != 0 {
                let lo = bits.trailing_zeros() as usize;
                let ones = (bits >> lo).trailing_ones() as usize;
                let first = w * 64 + lo;
                match runs.last_mut() {
                    Some((f, n)) if *f + *n == first => *n += ones,
                    _ => runs.push((first, ones)),
                }
                bits = if lo + ones >= 64 {
                    0
                } else {
                    bits & !(((1u64 << ones) - 1) << lo)
                };
            }
        }
        runs
    }
}
