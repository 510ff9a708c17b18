//! The statistics the guest sends on the stats queue (virtio 5.5.6.3):
//! packed `(tag: u16, value: u64)` entries, little-endian, named as
//! Firecracker names them in `GET /balloon/statistics`.

use serde::Serialize;

/// Bytes of one entry.
pub const STAT_ENTRY_BYTES: usize = 10;
/// The most entries read from one buffer (the spec defines 16 tags; a
/// longer buffer is read this far and no further).
pub const MAX_STAT_ENTRIES: usize = 64;

/// The guest's latest counters (memory in bytes, the rest as counts), each
/// absent until the guest sends it.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize)]
pub struct BalloonStats {
    /// Bytes swapped in (`VIRTIO_BALLOON_S_SWAP_IN`, 0).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub swap_in: Option<u64>,
    /// Bytes swapped out (1).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub swap_out: Option<u64>,
    /// Major page faults (2).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub major_faults: Option<u64>,
    /// Minor page faults (3).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub minor_faults: Option<u64>,
    /// Free memory, bytes (4).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub free_memory: Option<u64>,
    /// Total memory, bytes (5).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub total_memory: Option<u64>,
    /// Available memory, bytes (6).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub available_memory: Option<u64>,
    /// Disk caches, bytes (7).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disk_caches: Option<u64>,
    /// Huge page allocations (8).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hugetlb_allocations: Option<u64>,
    /// Huge page allocation failures (9).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hugetlb_failures: Option<u64>,
    /// OOM kills (10).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub oom_kill: Option<u64>,
    /// Allocation stalls (11).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub alloc_stall: Option<u64>,
    /// Pages scanned by kswapd (12).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub async_scan: Option<u64>,
    /// Pages scanned directly (13).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub direct_scan: Option<u64>,
    /// Pages reclaimed by kswapd (14).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub async_reclaim: Option<u64>,
    /// Pages reclaimed directly (15).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sync_reclaim: Option<u64>,
}

impl BalloonStats {
    /// Records one entry; returns false for a tag the spec does not define
    /// (ignored, as the spec says).
    pub fn set(&mut self, tag: u16, value: u64) -> bool {
        let slot = match tag {
            0 => &mut self.swap_in,
            1 => &mut self.swap_out,
            2 => &mut self.major_faults,
            3 => &mut self.minor_faults,
            4 => &mut self.free_memory,
            5 => &mut self.total_memory,
            6 => &mut self.available_memory,
            7 => &mut self.disk_caches,
            8 => &mut self.hugetlb_allocations,
            9 => &mut self.hugetlb_failures,
            10 => &mut self.oom_kill,
            11 => &mut self.alloc_stall,
            12 => &mut self.async_scan,
            13 => &mut self.direct_scan,
            14 => &mut self.async_reclaim,
            15 => &mut self.sync_reclaim,
            _ => return false,
        };
        *slot = Some(value);
        true
    }

    /// Parses a buffer of entries (a trailing partial entry is ignored).
    pub fn parse(&mut self, bytes: &[u8]) {
        for e in bytes.chunks_exact(STAT_ENTRY_BYTES).take(MAX_STAT_ENTRIES) {
            let tag = u16::from_le_bytes([e[0], e[1]]);
            let mut v = [0u8; 8];
            v.copy_from_slice(&e[2..10]);
            self.set(tag, u64::from_le_bytes(v));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_entries_and_ignores_unknown_tags() {
        let mut buf = Vec::new();
        for (tag, v) in [(4u16, 100u64), (5, 200), (99, 7), (15, 3)] {
            buf.extend_from_slice(&tag.to_le_bytes());
            buf.extend_from_slice(&v.to_le_bytes());
        }
        buf.push(1); // partial
        let mut s = BalloonStats::default();
        s.parse(&buf);
        assert_eq!(s.free_memory, Some(100));
        assert_eq!(s.total_memory, Some(200));
        assert_eq!(s.sync_reclaim, Some(3));
        assert_eq!(s.swap_in, None);
        let json = serde_json::to_value(&s).unwrap();
        assert_eq!(json["free_memory"], 100);
        assert!(json.get("swap_in").is_none());
    }
}
