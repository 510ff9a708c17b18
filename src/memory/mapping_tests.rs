//! The memfd stripes of a slice.

use super::*;

const GIB: u64 = 1 << 30;

#[test]
fn stripes_are_a_gib_or_fewer_than_the_cap() {
    assert_eq!(stripe_bytes(128 * MIB, 0), 128 * MIB);
    assert_eq!(stripe_bytes(GIB, 0), 128 * MIB);
    assert_eq!(stripe_bytes(4 * GIB, 0), 128 * MIB);
    assert_eq!(stripe_bytes(8 * GIB, 0), 256 * MIB);
    assert_eq!(stripe_bytes(32 * GIB, 0), GIB);
    assert_eq!(stripe_bytes(33 * GIB, 0), 1152 * MIB);
    assert_eq!(stripe_bytes(64 << 40, 0), 2 << 40);
    assert_eq!(stripe_bytes(4 * GIB, 2 * MIB), 128 * MIB);
    assert_eq!(stripe_bytes(4 * GIB, GIB), GIB);
    for len in [GIB, 5 * GIB, 100 * GIB, 1 << 40, 64 << 40] {
        let s = stripe_bytes(len, 0);
        assert!(len.div_ceil(s) <= MAX_STRIPES_PER_SLICE, "{len}");
        assert_eq!(s % MEMFD_STRIPE_BYTES, 0);
    }
}

#[test]
fn memfd_stripes_are_one_contiguous_range() {
    let slice = NodeSlice {
        node: 0,
        guest_addr: 0,
        len: 2 * GIB + 64 * MIB,
    };
    let m = SliceMapping::new(
        &slice,
        0,
        Backing::Memfd,
        PageSize::Small,
        NumaPolicy::None,
        None,
    )
    .unwrap();
    assert_eq!(
        m.host_addr() % (2 * MIB as usize),
        0,
        "aligned for huge pages"
    );
    let lens: Vec<(u64, u64)> = m.stripes().iter().map(|s| (s.offset, s.len)).collect();
    let mut want: Vec<(u64, u64)> = (0..16).map(|i| (i * 128 * MIB, 128 * MIB)).collect();
    want.push((2 * GIB, 64 * MIB));
    assert_eq!(lens, want);
    // Each stripe is its own file, written through the one mapping.
    for s in m.stripes() {
        // SAFETY: inside our own writable mapping.
        unsafe { ((m.host_addr() + s.offset as usize) as *mut u64).write_volatile(7) };
        use std::os::unix::fs::MetadataExt;
        assert!(s.file.metadata().unwrap().blocks() > 0);
        assert_eq!(s.file.metadata().unwrap().len(), s.len);
    }
    let ranges = m.free_ranges();
    assert_eq!(ranges.len(), 17);
    assert_eq!(ranges[8].host_addr, m.host_addr() + GIB as usize);
    let addr = m.host_addr();
    m.unmap().unwrap();
    assert!(sys::resident_bytes(addr, 4096, &mut Vec::new()).is_err());
}
