//! Metrics lines: `PUT /metrics` opens the file ([`super::opens`]);
//! `FlushMetrics`, the periodic timer and the end of a shutdown write a
//! line with the VM's state, its reclaim report and its devices' groups.

use serde_json::Value;

use super::lock;
use crate::devices::virtio::block::metrics::BlockMetrics;
use crate::devices::virtio::net::metrics::NetMetrics;
use crate::metrics;
use crate::vmm::lifecycle::Phase;
use crate::vmm::Vmm;

impl Vmm {
    /// its reclaim report; a failure is logged, never fatal.
    pub(in crate::vmm) fn flush_metrics(&self) -> Result<bool, crate::metrics::MetricsError> {
        let report = self.reclaim_report();
        let console_dropped_bytes = match &self.phase {
            crate::vmm::lifecycle::Phase::Running(m) => {
                m.console().map_or(0, |c| c.buffer().stats().dropped_bytes)
            }
            _ => self
                .last_report
                .as_ref()
                .map_or(0, |r| r.console.dropped_bytes),
        };
        let result = crate::metrics::flush(&crate::metrics::VmmSnapshot {
            state: self.state().as_str(),
            reclaim: &report,
            console_dropped_bytes,
            device_groups: self.device_metrics(),
        });
        if let Err(e) = &result {
            log::warn!("metrics: {e}");
        }
        result
    }

    /// The devices' metrics groups, while they run: Firecracker's `balloon`
    /// (with the discard pool's counters beside the device's),
    /// `block_<drive_id>` and their sum `block`, `net_<iface_id>` and their
    /// sum `net`, `vsock`, `mmds`, `entropy`, and `memory_hotplug` (from
    /// [`Hotplug::metrics_json`](super::hotplug::Hotplug::metrics_json)).
    fn device_metrics(&self) -> Vec<(String, Value)> {
        let mut groups = Vec::new();
        if let Phase::Running(m) = &self.phase {
            if let Some(b) = m.balloon() {
                let mut v = serde_json::to_value(lock(&b.device).metrics().snapshot())
                    .unwrap_or(Value::Null);
                if let (Value::Object(map), Some(p)) = (&mut v, b.discard.snapshot()) {
                    map.insert("pool_discarded_bytes".into(), p.bytes_discarded.into());
                    map.insert("pool_free_calls".into(), p.calls.into());
                    map.insert("pool_failures".into(), p.failures.into());
                }
                groups.push(("balloon".into(), v));
            }
            let json = |v: Result<Value, serde_json::Error>| v.unwrap_or(Value::Null);
            let first = groups.len();
            for b in m.blocks() {
                let snap = lock(&b.device).metrics().snapshot();
                groups.push((
                    format!("block_{}", b.drive_id),
                    json(serde_json::to_value(snap)),
                ));
            }
            // Firecracker's aggregate groups beside the per-device ones.
            let zero = json(serde_json::to_value(BlockMetrics::default()));
            let block = metrics::aggregate(zero, groups[first..].iter().map(|(_, v)| v));
            groups.push(("block".into(), block));
            let first = groups.len();
            for n in m.nets() {
                let n = lock(n);
                let snap = n.metrics().snapshot();
                groups.push((
                    format!("net_{}", n.iface_id()),
                    json(serde_json::to_value(snap)),
                ));
            }
            let zero = json(serde_json::to_value(NetMetrics::default()));
            let net = metrics::aggregate(zero, groups[first..].iter().map(|(_, v)| v));
            groups.push(("net".into(), net));
            if let Some(v) = m.vsock() {
                let snap = lock(v).metrics().snapshot();
                groups.push(("vsock".into(), json(serde_json::to_value(snap))));
            }
            if let Some(g) = self.mmds_metrics(m.nets()) {
                groups.push(("mmds".into(), g));
            }
            if let Some(r) = m.rng() {
                let snap = lock(r).metrics().as_ref().clone();
                groups.push(("entropy".into(), json(serde_json::to_value(snap))));
            }
            if let Some(h) = m.hotplug() {
                groups.push(("memory_hotplug".into(), h.metrics_json()));
            }
        }
        groups
    }
}
