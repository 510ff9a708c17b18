//! The hotplug region (virtio-mem) in the guest map: above RAM (from
//! 4 GiB, or from the first GiB boundary past RAM), split like RAM into one
//! contiguous part per node of RAM's slices, each a whole number of
//! memslots of `slot_bytes`. Pure: nothing is mapped here (the parts are
//! mapped with RAM's slices by `GuestMemory::new_with_hotplug`).

use super::layout::{ram_regions, MMIO_GAP_END};
use super::plan::NodeSlice;

const GIB: u64 = 1 << 30;

/// What the hotplug region is made of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HotplugOptions {
    /// The region's size (a multiple of `slot_bytes`).
    pub total_bytes: u64,
    /// The memslot size: the host's unit of attaching memory to the guest.
    pub slot_bytes: u64,
}

/// Errors of laying out the hotplug region.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum HotplugLayoutError {
    /// The sizes cannot be used.
    #[error("hotplug region of {total_bytes:#x} bytes in slots of {slot_bytes:#x}: {reason}")]
    Invalid {
        /// The region's size.
        total_bytes: u64,
        /// The slot size.
        slot_bytes: u64,
        /// Why.
        reason: &'static str,
    },
    /// The region does not fit in the guest physical address space.
    #[error("the hotplug region ends past the guest physical address space")]
    Overflow,
}

/// First guest physical address of the hotplug region for `mem_bytes` of
/// RAM: 4 GiB for a guest whose RAM ends below the MMIO gap, else RAM's end
/// rounded up to a GiB.
pub fn hotplug_base(mem_bytes: u64) -> u64 {
    let end = ram_regions(mem_bytes).last().map_or(0, |r| r.end());
    end.div_ceil(GIB).saturating_mul(GIB).max(MMIO_GAP_END)
}

/// The parts of the region, in guest address order: the slots shared out
/// over `nodes` (in that order, duplicates ignored) as evenly as whole
/// slots allow, the first nodes taking one more each; a node left with no
/// slot gets no part.
pub fn hotplug_parts(
    opts: &HotplugOptions,
    mem_bytes: u64,
    nodes: &[u32],
) -> Result<Vec<NodeSlice>, HotplugLayoutError> {
    let invalid = |reason| HotplugLayoutError::Invalid {
        total_bytes: opts.total_bytes,
        slot_bytes: opts.slot_bytes,
        reason,
    };
    if opts.slot_bytes == 0 || opts.total_bytes == 0 {
        return Err(invalid("sizes must not be 0"));
    }
    if opts.total_bytes % opts.slot_bytes != 0 {
        return Err(invalid("the size is not a whole number of slots"));
    }
    let mut distinct: Vec<u32> = Vec::with_capacity(nodes.len());
    for &n in nodes {
        if !distinct.contains(&n) {
            distinct.push(n);
        }
    }
    if distinct.is_empty() {
        return Err(invalid("no node to place it on"));
    }
    let base = hotplug_base(mem_bytes);
    base.checked_add(opts.total_bytes)
        .ok_or(HotplugLayoutError::Overflow)?;
    let slots = opts.total_bytes / opts.slot_bytes;
    let n = distinct.len() as u64;
    let mut parts = Vec::with_capacity(distinct.len());
    let mut addr = base;
    for (i, &node) in distinct.iter().enumerate() {
        let mine = slots / n + u64::from((i as u64) < slots % n);
        if mine == 0 {
            continue;
        }
        let len = mine * opts.slot_bytes;
        parts.push(NodeSlice {
            node,
            guest_addr: addr,
            len,
        });
        addr += len;
    }
    Ok(parts)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn the_region_starts_above_ram_and_the_gap() {
        assert_eq!(hotplug_base(256 * MIB), 4 * GIB);
        assert_eq!(hotplug_base(3 * GIB), 4 * GIB);
        // 4 GiB of RAM ends at 5 GiB (1 GiB above the gap).
        assert_eq!(hotplug_base(4 * GIB), 5 * GIB);
        assert_eq!(hotplug_base(4 * GIB + 2 * MIB), 6 * GIB);
        assert_eq!(hotplug_base(1 << 40), (1 << 40) + GIB);
    }

    #[test]
    fn one_node_has_the_whole_region() {
        let o = HotplugOptions {
            total_bytes: GIB,
            slot_bytes: 128 * MIB,
        };
        let p = hotplug_parts(&o, 256 * MIB, &[0]).unwrap();
        assert_eq!(
            p,
            vec![NodeSlice {
                node: 0,
                guest_addr: 4 * GIB,
                len: GIB
            }]
        );
    }

    #[test]
    fn slots_are_shared_out_over_the_nodes_in_order() {
        let o = HotplugOptions {
            total_bytes: 5 * 128 * MIB,
            slot_bytes: 128 * MIB,
        };
        let p = hotplug_parts(&o, 8 * GIB, &[1, 0, 1]).unwrap();
        let base = hotplug_base(8 * GIB);
        assert_eq!(p.len(), 2);
        assert_eq!((p[0].node, p[0].guest_addr, p[0].len), (1, base, 384 * MIB));
        assert_eq!(
            (p[1].node, p[1].guest_addr, p[1].len),
            (0, base + 384 * MIB, 256 * MIB)
        );
        // Fewer slots than nodes: the last nodes get none.
        let one = HotplugOptions {
            total_bytes: 128 * MIB,
            slot_bytes: 128 * MIB,
        };
        assert_eq!(hotplug_parts(&one, GIB, &[0, 1, 2]).unwrap().len(), 1);
    }

    #[test]
    fn bad_sizes_are_refused() {
        let o = |t, s| HotplugOptions {
            total_bytes: t,
            slot_bytes: s,
        };
        assert!(hotplug_parts(&o(0, 128 * MIB), GIB, &[0]).is_err());
        assert!(hotplug_parts(&o(GIB, 0), GIB, &[0]).is_err());
        assert!(hotplug_parts(&o(GIB + MIB, 128 * MIB), GIB, &[0]).is_err());
        assert!(hotplug_parts(&o(GIB, 128 * MIB), GIB, &[]).is_err());
        assert_eq!(
            hotplug_parts(&o(u64::MAX / GIB * GIB, GIB), GIB, &[0]),
            Err(HotplugLayoutError::Overflow)
        );
    }
}
