//! The discard pool's guest-to-host translation: a table built once from
//! the slices' mappings (one [`Entry`] per anonymous slice or memfd stripe:
//! guest range, host range, node, free method), and the only way a guest
//! range becomes something the free path takes ([`HostPiece`]: whole pages
//! inside one entry, built nowhere but [`Table::translate`]). Pure over
//! values once built: nothing here frees or waits.

use crate::memory::guest::GuestMemory;
use crate::memory::range::GuestRange;
use crate::memory::reclaim::HostRange;

use super::{DiscardError, PART_BYTES};

/// One entry of the translation table: an anonymous slice, or one memfd
/// stripe of a slice.
#[derive(Debug)]
pub(super) struct Entry {
    pub(super) guest_addr: u64,
    /// Where it lives and how it is freed (the slice's own `free_ranges`).
    pub(super) host: HostRange,
    /// Index of its node in [`Table::nodes`].
    pub(super) node_index: usize,
}

impl Entry {
    pub(super) fn guest_end(&self) -> u64 {
        self.guest_addr + self.host.len
    }
}

/// The guest-to-host translation of guest RAM.
#[derive(Debug)]
pub(super) struct Table {
    /// Sorted by guest address, not overlapping.
    pub(super) entries: Vec<Entry>,
    /// The nodes of the entries, sorted.
    pub(super) nodes: Vec<u32>,
    pub(super) page_bytes: u64,
    part_bytes: u64,
    /// One piece per range and entry: no merge, no parts.
    pub(super) serial: bool,
}

/// A part of guest RAM to free: whole pages inside one table entry. Only
/// [`Table::translate`] builds one, so the free path never sees a range
/// that is not guest RAM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct HostPiece {
    pub(super) entry: usize,
    pub(super) offset: u64,
    pub(super) len: u64,
}

/// A batch turned into pieces.
#[derive(Debug, Default)]
pub(super) struct Translation {
    /// In guest address order, merged, whole pages, each at most
    /// `part_bytes`.
    pub(super) pieces: Vec<HostPiece>,
    pub(super) refused_bytes: u64,
    pub(super) unaligned_bytes: u64,
}

impl Table {
    pub(super) fn new(memory: &GuestMemory, page_bytes: u64) -> Result<Table, DiscardError> {
        let mut entries = Vec::new();
        let all = || memory.slices().iter().chain(memory.hotplug());
        let mut nodes: Vec<u32> = all().map(|s| s.slice().node).collect();
        nodes.sort_unstable();
        nodes.dedup();
        for s in all() {
            let slice = s.slice();
            for host in s.free_ranges() {
                let guest_addr = slice.guest_addr + (host.host_addr - s.host_addr()) as u64;
                if guest_addr % page_bytes != 0 || host.len % page_bytes != 0 {
                    return Err(DiscardError::Misaligned {
                        guest_addr,
                        node: host.node,
                        page_bytes,
                    });
                }
                let node_index = nodes.binary_search(&host.node).unwrap_or(0);
                entries.push(Entry {
                    guest_addr,
                    host,
                    node_index,
                });
            }
        }
        entries.sort_by_key(|e| e.guest_addr);
        Ok(Table {
            entries,
            nodes,
            page_bytes,
            part_bytes: PART_BYTES.div_ceil(page_bytes) * page_bytes,
            serial: false,
        })
    }

    /// Clips each guest range to the entries, merges what overlaps or
    /// touches within an entry, aligns each merged span inward to whole
    /// pages and cuts it into parts. Serial: each clipped range aligned
    /// inward is one piece, in the order given, nothing merged or cut.
    pub(super) fn translate(&self, ranges: &[GuestRange]) -> Translation {
        let mut out = Translation::default();
        // (entry, start offset, end offset), not yet aligned.
        let mut spans: Vec<(usize, u64, u64)> = Vec::new();
        for r in ranges {
            let (addr, len, end) = (r.gpa, r.len, r.end());
            let mut inside = 0u64;
            let first = self.entries.partition_point(|e| e.guest_end() <= addr);
            for (i, e) in self.entries.iter().enumerate().skip(first) {
                if e.guest_addr >= end {
                    break;
                }
                let start = addr.max(e.guest_addr);
                let stop = end.min(e.guest_end());
                inside += stop - start;
                spans.push((i, start - e.guest_addr, stop - e.guest_addr));
            }
            out.refused_bytes += len - inside;
        }
        let page = self.page_bytes;
        if self.serial {
            for (entry, start, stop) in spans {
                let a = start.div_ceil(page) * page;
                let b = stop / page * page;
                let whole = b.saturating_sub(a);
                out.unaligned_bytes += (stop - start) - whole;
                if whole > 0 {
                    out.pieces.push(HostPiece {
                        entry,
                        offset: a,
                        len: whole,
                    });
                }
            }
            return out;
        }
        spans.sort_unstable();
        let mut merged: Vec<(usize, u64, u64)> = Vec::with_capacity(spans.len());
        for s in spans {
            match merged.last_mut() {
                Some(m) if m.0 == s.0 && s.1 <= m.2 => m.2 = m.2.max(s.2),
                _ => merged.push(s),
            }
        }
        for (entry, start, stop) in merged {
            let a = start.div_ceil(page) * page;
            let b = stop / page * page;
            let whole = b.saturating_sub(a);
            out.unaligned_bytes += (stop - start) - whole;
            let mut offset = a;
            while offset < b {
                let len = (b - offset).min(self.part_bytes);
                out.pieces.push(HostPiece { entry, offset, len });
                offset += len;
            }
        }
        out
    }

    /// The guest range of a piece.
    pub(super) fn guest_range(&self, p: &HostPiece) -> GuestRange {
        GuestRange::new(self.entries[p.entry].guest_addr + p.offset, p.len)
    }

    pub(super) fn node_index(&self, p: &HostPiece) -> usize {
        self.entries[p.entry].node_index
    }
}
