//! The devices' counters: a [`Counter`] is an atomic that serializes
//! itself (as its running total), so a device's metrics group is one struct
//! of counters, declared once, that `serde` writes as the group's JSON
//! object (Firecracker's `SharedIncMetric`, without its reset at each line:
//! teravm's groups are running totals).

use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Serialize, Serializer};

/// A counter any thread bumps and anyone reads.
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    /// Adds one.
    pub fn inc(&self) {
        self.add(1);
    }

    /// Adds `n`.
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }

    /// The total now.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// A copy holds the total at the time of the copy (a metrics group's
/// `snapshot()` is a clone of its counters).
impl Clone for Counter {
    fn clone(&self) -> Counter {
        Counter(AtomicU64::new(self.get()))
    }
}

impl PartialEq for Counter {
    fn eq(&self, other: &Counter) -> bool {
        self.get() == other.get()
    }
}

impl Eq for Counter {}

impl PartialEq<u64> for Counter {
    fn eq(&self, other: &u64) -> bool {
        self.get() == *other
    }
}

impl Serialize for Counter {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(self.get())
    }
}

#[cfg(test)]
mod tests {
    use super::Counter;

    #[derive(Default, serde::Serialize)]
    struct Group {
        a_count: Counter,
        b_bytes: Counter,
    }

    #[test]
    fn a_group_serializes_its_totals_and_a_copy_stays_put() {
        let g = Group::default();
        g.a_count.inc();
        g.b_bytes.add(40);
        g.b_bytes.add(2);
        let copy = g.b_bytes.clone();
        g.b_bytes.inc();
        assert_eq!(copy, 42);
        assert_eq!(g.b_bytes, 43);
        assert_eq!(
            serde_json::to_string(&g).unwrap(),
            r#"{"a_count":1,"b_bytes":43}"#
        );
    }
}
