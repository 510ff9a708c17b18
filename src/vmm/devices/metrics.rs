//! The devices' groups of a metrics line ([`Devices::metrics_groups`]),
//! while they run: Firecracker's `balloon` (the device's counters and its
//! discard pool's, one group), `block_<drive_id>` and their sum `block`,
//! `net_<iface_id>` and their sum `net`, `vsock`, `mmds` (given: the MMDS's
//! token counters are the VMM's), `entropy`, and `memory_hotplug` (every
//! virtio-mem device's counters summed, and teravm's
//! `unplugged_accesses`). Each group is a type that serializes itself; the
//! sums are [`crate::metrics::aggregate`]'s.

use serde::Serialize;
use serde_json::Value;

use crate::devices::virtio::balloon::BalloonMetrics;
use crate::devices::virtio::block::BlockMetrics;
use crate::devices::virtio::mem::MemMetrics;
use crate::devices::virtio::net::metrics::NetMetrics;
use crate::memory::DiscardSnapshot;
use crate::metrics::aggregate;

use super::{lock, BalloonDevice, Devices, Hotplug};

/// The `balloon` group: the device's counters, and its discard pool's
/// beside them while the pool runs.
#[derive(Serialize)]
struct BalloonGroup {
    #[serde(flatten)]
    device: BalloonMetrics,
    #[serde(flatten)]
    pool: Option<PoolCounters>,
}

/// The discard pool's counters in the `balloon` group.
#[derive(Serialize)]
struct PoolCounters {
    /// Bytes freed in all.
    pool_discarded_bytes: u64,
    /// Free calls made (`madvise` or `fallocate`).
    pool_free_calls: u64,
    /// Parts not freed (failed calls, panics, cancelled at shutdown).
    pool_failures: u64,
}

impl From<DiscardSnapshot> for PoolCounters {
    fn from(p: DiscardSnapshot) -> PoolCounters {
        PoolCounters {
            pool_discarded_bytes: p.bytes_discarded,
            pool_free_calls: p.calls,
            pool_failures: p.failures,
        }
    }
}

/// The `memory_hotplug` group: Firecracker's counters summed over the
/// nodes' devices, and teravm's touches of memory not plugged (they read
/// zeros).
#[derive(Serialize)]
struct HotplugGroup {
    #[serde(flatten)]
    devices: Value,
    unplugged_accesses: u64,
}

/// `value` as JSON (`null` if it cannot be: never, for these counters).
fn json(value: &impl Serialize) -> Value {
    serde_json::to_value(value).unwrap_or(Value::Null)
}

/// Each device's group, named `<prefix>_<id>`, and Firecracker's aggregate
/// group `<prefix>`: every counter summed, there (as 0) without devices
/// too.
fn each_and_sum<M: Serialize + Default>(
    prefix: &str,
    devices: impl IntoIterator<Item = (String, M)>,
) -> Vec<(String, Value)> {
    let mut groups: Vec<(String, Value)> = devices
        .into_iter()
        .map(|(id, m)| (format!("{prefix}_{id}"), json(&m)))
        .collect();
    let sum = aggregate(json(&M::default()), groups.iter().map(|(_, v)| v));
    groups.push((prefix.into(), sum));
    groups
}

fn balloon_group(b: &BalloonDevice) -> BalloonGroup {
    BalloonGroup {
        device: lock(&b.device).metrics().snapshot(),
        pool: b.discard.snapshot().map(PoolCounters::from),
    }
}

fn hotplug_group(h: &Hotplug) -> HotplugGroup {
    let devices: Vec<Value> = h
        .devices
        .iter()
        .map(|d| {
            let m = lock(&d.device).shared_metrics();
            json(&*m)
        })
        .collect();
    HotplugGroup {
        devices: aggregate(json(&MemMetrics::default()), &devices),
        unplugged_accesses: h
            .unplugged_accesses
            .load(std::sync::atomic::Ordering::Relaxed),
    }
}

impl Devices {
    /// The devices' groups of a metrics line, the MMDS's (`mmds`, if the
    /// MMDS is on an interface) among them.
    pub fn metrics_groups(&self, mmds: Option<Value>) -> Vec<(String, Value)> {
        let mut groups = Vec::new();
        if let Some(b) = &self.balloon {
            groups.push(("balloon".into(), json(&balloon_group(b))));
        }
        groups.extend(each_and_sum::<BlockMetrics>(
            "block",
            self.blocks.iter().map(|b| {
                let m = lock(&b.device).metrics().snapshot();
                (b.drive_id.clone(), m)
            }),
        ));
        groups.extend(each_and_sum::<NetMetrics>(
            "net",
            self.nets.iter().map(|n| {
                let n = lock(n);
                (n.iface_id().to_string(), n.metrics().snapshot())
            }),
        ));
        if let Some(v) = &self.vsock {
            let m = lock(v).metrics().snapshot();
            groups.push(("vsock".into(), json(&m)));
        }
        if let Some(g) = mmds {
            groups.push(("mmds".into(), g));
        }
        if let Some(r) = &self.rng {
            let m = lock(r).metrics().as_ref().clone();
            groups.push(("entropy".into(), json(&m)));
        }
        if let Some(h) = &self.hotplug {
            groups.push(("memory_hotplug".into(), json(&hotplug_group(h))));
        }
        groups
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The groups' JSON is what the splicing by key gave: the device's
    /// counters with the pool's three beside them (none once the pool is
    /// shut down); virtio-mem's counters summed, `unplugged_accesses` added.
    #[test]
    fn groups_compose_into_the_same_json() {
        let device = BalloonMetrics::default();
        device.inflate_count.add(3);
        let mut spliced = json(&device);
        let Value::Object(map) = &mut spliced else {
            panic!("a group is an object")
        };
        map.insert("pool_discarded_bytes".into(), 4096.into());
        map.insert("pool_free_calls".into(), 2.into());
        map.insert("pool_failures".into(), 1.into());
        let group = BalloonGroup {
            device: device.clone(),
            pool: Some(PoolCounters {
                pool_discarded_bytes: 4096,
                pool_free_calls: 2,
                pool_failures: 1,
            }),
        };
        assert_eq!(json(&group), spliced);
        let group = BalloonGroup {
            device: device.clone(),
            pool: None,
        };
        assert_eq!(json(&group), json(&device));

        let (a, b) = (MemMetrics::default(), MemMetrics::default());
        a.plug_count.add(2);
        b.plug_count.add(5);
        b.busy_count.inc();
        let group = HotplugGroup {
            devices: aggregate(json(&MemMetrics::default()), &[json(&a), json(&b)]),
            unplugged_accesses: 9,
        };
        let v = json(&group);
        assert_eq!(v["plug_count"], 7);
        assert_eq!(v["busy_count"], 1);
        assert_eq!(v["unplugged_accesses"], 9);
        assert_eq!(
            v.as_object().unwrap().len(),
            json(&a).as_object().unwrap().len() + 1
        );
    }

    #[test]
    fn each_device_and_the_sum() {
        let (a, b) = (BlockMetrics::default(), BlockMetrics::default());
        a.read_count.add(1);
        b.read_count.add(2);
        let groups = each_and_sum("block", [("a".to_string(), a), ("b".to_string(), b)]);
        let names: Vec<&str> = groups.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["block_a", "block_b", "block"]);
        assert_eq!(groups[2].1["read_count"], 3);
        let none = each_and_sum::<NetMetrics>("net", []);
        assert_eq!(none, [("net".to_string(), json(&NetMetrics::default()))]);
    }
}
