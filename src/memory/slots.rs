//! The KVM memslots of guest RAM: one per slice, or several where a slice is
//! larger than one memslot can hold (KVM refuses more than 2^31 - 1 pages,
//! 8 TiB - 4 KiB on x86, in one slot). Pure: no KVM here.

/// Largest memslot teravm registers: the largest multiple of 1 GiB below
/// KVM's limit of 2^31 - 1 pages of 4 KiB (so every slot stays aligned for
/// 2 MiB and 1 GiB pages).
pub const MAX_SLOT_BYTES: u64 = ((((1u64 << 31) - 1) * 4096) >> 30) << 30;

use std::os::fd::{AsRawFd, BorrowedFd};

/// One memslot to register: guest physical range and the host address of
/// its first byte, and for guest_memfd memory the file behind it (borrowed
/// from the `GuestMemory`, so no slot outlives its file).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GuestSlot<'m> {
    /// Guest physical address.
    pub guest_addr: u64,
    /// Length in bytes.
    pub len: u64,
    /// Host virtual address.
    pub host_addr: u64,
    /// The guest_memfd and the offset in it of the slot's first byte.
    pub guest_memfd: Option<GmemBinding<'m>>,
}

/// Where a guest_memfd memslot's memory is in its file.
#[derive(Debug, Clone, Copy)]
pub struct GmemBinding<'m> {
    /// The guest_memfd.
    pub fd: BorrowedFd<'m>,
    /// Offset in the file.
    pub offset: u64,
}

impl PartialEq for GmemBinding<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.fd.as_raw_fd() == other.fd.as_raw_fd() && self.offset == other.offset
    }
}

impl Eq for GmemBinding<'_> {}

/// Cuts `(guest_addr, len, host_addr)` ranges into slots of at most
/// `max_bytes` each, in order.
pub fn split_slots(ranges: &[(u64, u64, u64)], max_bytes: u64) -> Vec<GuestSlot<'static>> {
    let ranges: Vec<_> = ranges.iter().map(|&(g, l, h)| (g, l, h, None)).collect();
    split_bound(&ranges, max_bytes)
}

/// As [`split_slots`], for ranges that may each be (the start of) a
/// guest_memfd: a cut slot's offset in the file moves with it.
pub fn split_bound<'m>(
    ranges: &[(u64, u64, u64, Option<GmemBinding<'m>>)],
    max_bytes: u64,
) -> Vec<GuestSlot<'m>> {
    let max = max_bytes.max(1);
    let mut out = Vec::new();
    for &(guest_addr, len, host_addr, file) in ranges {
        let mut off = 0;
        while off < len {
            let this = max.min(len - off);
            out.push(GuestSlot {
                guest_addr: guest_addr + off,
                len: this,
                host_addr: host_addr + off,
                guest_memfd: file.map(|b| GmemBinding {
                    fd: b.fd,
                    offset: b.offset + off,
                }),
            });
            off += this;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cut_guest_memfd_slot_moves_its_file_offset() {
        let file = std::fs::File::open("/dev/null").unwrap();
        let fd = std::os::fd::AsFd::as_fd(&file);
        let bound = GmemBinding { fd, offset: 4096 };
        let slots = split_bound(&[(1 << 32, 10, 0x1000, Some(bound))], 4);
        let offsets: Vec<u64> = slots
            .iter()
            .map(|s| s.guest_memfd.unwrap().offset)
            .collect();
        assert_eq!(offsets, vec![4096, 4100, 4104]);
        assert!(slots
            .iter()
            .all(|s| s.guest_memfd.unwrap().fd.as_raw_fd() == file.as_raw_fd()));
    }

    const GIB: u64 = 1 << 30;
    const TIB: u64 = 1 << 40;

    #[test]
    fn the_largest_slot_fits_kvm() {
        const { assert!(MAX_SLOT_BYTES / 4096 < (1 << 31)) };
        assert_eq!(MAX_SLOT_BYTES, 8 * TIB - GIB);
    }

    #[test]
    fn a_64_tib_guest_is_cut_into_slots_kvm_takes() {
        // The two RAM regions of a 64 TiB guest on one node.
        let high = 64 * TIB - 3 * GIB;
        let ranges = [
            (0, 3 * GIB, 0x7f00_0000_0000),
            (4 * GIB, high, 0x1000_0000_0000),
        ];
        let slots = split_slots(&ranges, MAX_SLOT_BYTES);
        assert_eq!(slots[0].len, 3 * GIB);
        assert_eq!(slots.len(), 1 + high.div_ceil(MAX_SLOT_BYTES) as usize);
        assert_eq!(slots.iter().map(|s| s.len).sum::<u64>(), 64 * TIB);
        for w in slots[1..].windows(2) {
            assert_eq!(w[0].guest_addr + w[0].len, w[1].guest_addr, "contiguous");
            assert_eq!(w[0].host_addr + w[0].len, w[1].host_addr, "same mapping");
        }
        for s in &slots {
            assert!(s.len / 4096 < (1 << 31), "{s:?}");
            assert_eq!(s.guest_addr % GIB, 0);
        }
    }

    #[test]
    fn small_ranges_are_one_slot_each() {
        let slots = split_slots(&[(0, 5, 100), (10, 0, 0), (20, 3, 200)], 4);
        assert_eq!(
            slots,
            vec![
                GuestSlot {
                    guest_addr: 0,
                    len: 4,
                    host_addr: 100,
                    guest_memfd: None,
                },
                GuestSlot {
                    guest_addr: 4,
                    len: 1,
                    host_addr: 104,
                    guest_memfd: None,
                },
                GuestSlot {
                    guest_addr: 20,
                    len: 3,
                    host_addr: 200,
                    guest_memfd: None,
                },
            ]
        );
    }
}
