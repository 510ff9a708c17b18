//! Metrics lines: `PUT /metrics` opens the file ([`super::opens`]);
//! `FlushMetrics`, the periodic timer and the end of a shutdown write a
//! line with the VM's state, its reclaim report and its devices' groups.

use serde_json::Value;

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

    /// The devices' metrics groups while they run
    /// ([`Devices::metrics_groups`](crate::vmm::devices::Devices::metrics_groups)),
    /// the MMDS's among them.
    fn device_metrics(&self) -> Vec<(String, Value)> {
        match &self.phase {
            Phase::Running(m) => m
                .devices()
                .map_or_else(Vec::new, |d| d.metrics_groups(self.mmds_metrics(&d.nets))),
            _ => Vec::new(),
        }
    }
}
