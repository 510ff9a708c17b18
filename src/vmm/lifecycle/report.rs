//! What a shutdown reports: the reclaim executor's report, the time each
//! teardown phase took, how the vCPUs stopped and what the console dropped.
//! The summary line goes to stderr and the log; the same numbers are the
//! sync `Shutdown` reply and the metrics.

use std::time::Duration;

use crate::api::shapes;
use crate::devices::ConsoleStats;
use crate::memory::ReclaimReport;
use crate::vstate::vcpu::VcpuStopReport;

/// How long each phase of a shutdown took (the API's shape, filled here).
pub type PhaseTimes = crate::api::shapes::ShutdownPhases;

/// Milliseconds, with microsecond resolution.
pub fn ms(d: Duration) -> f64 {
    (d.as_micros() as f64) / 1000.0
}

/// The outcome of a shutdown.
#[derive(Debug, Clone, Default)]
pub struct ShutdownReport {
    /// The executor's report: also present when it had failures, since the
    /// memory is freed all the same.
    pub reclaim: Option<ReclaimReport>,
    /// What went wrong, if anything.
    pub error: Option<String>,
    /// Phase timings.
    pub phases: PhaseTimes,
    /// How the vCPUs stopped.
    pub vcpus: VcpuStopReport,
    /// How the device threads stopped.
    pub devices: crate::vmm::devices::DeviceStopReport,
    /// What the console wrote and dropped.
    pub console: ConsoleStats,
    /// Lines of teravm's own output that stderr did not take
    /// ([`crate::output::dropped_lines`] when the report was made).
    pub stderr_dropped_lines: u64,
    /// Where the host's topology and memory limit were read
    /// ([`host_sources`]), the summary's last part.
    pub host: Option<String>,
}

/// Where the host's figures came from, for the start's log line and the
/// summary: `topology: 1 node (node 0: CPUs 0-1) from
/// /sys/devices/system/node; memory limit: ...; host memory: ...`, and
/// what could not be counted (no `/proc/self/pagemap`). Reads the memory
/// limit's files: call it before the seccomp filters.
pub fn host_sources(topology: &crate::memory::HostTopology) -> String {
    let memory = crate::memory::admission::HostMemory::read(
        &crate::memory::admission::Roots::default(),
        None,
    );
    let mut line = format!("{}; {}", topology.describe(), memory.describe());
    if let Some(note) = crate::memory::pagemap::unavailable() {
        line.push_str("; ");
        line.push_str(note);
    }
    line
}

impl ShutdownReport {
    /// The summary line (stderr): `teravm: reclaimed <MiB> MiB in <ms> ms
    /// (<GiB/s> GiB/s, <w> workers, <n> nodes)`, then the console's and
    /// stderr's drops and stuck vCPUs when there were any, then where the
    /// host's topology and memory limit came from ([`host_sources`]).
    pub fn summary_line(&self) -> Option<String> {
        let mut line = self.reclaim.as_ref()?.summary_line();
        if self.console.dropped_bytes > 0 {
            line.push_str(&format!(
                "; console dropped {} bytes",
                self.console.dropped_bytes
            ));
        }
        if self.stderr_dropped_lines > 0 {
            line.push_str(&format!(
                "; stderr dropped {} lines",
                self.stderr_dropped_lines
            ));
        }
        if self.vcpus.stuck > 0 {
            line.push_str(&format!("; {} vCPUs did not stop", self.vcpus.stuck));
        }
        if let Some(r) = self.reclaim.as_ref().filter(|r| r.reserved_bytes > 0) {
            line.push_str(&format!(
                ": guest memory freed, its {} MiB of address space kept reserved until exit",
                r.reserved_bytes >> 20
            ));
        }
        if let Some(host) = &self.host {
            line.push_str("; ");
            line.push_str(host);
        }
        Some(line)
    }
}

impl ShutdownReport {
    /// The sync `Shutdown` reply; `None` without a reclaim report.
    pub fn to_shape(&self) -> Option<shapes::ShutdownStats> {
        Some(shapes::ShutdownStats {
            reclaim: self.reclaim.as_ref()?.clone(),
            phases: self.phases,
            vcpus_stuck: self.vcpus.stuck as u64,
            console_dropped_bytes: self.console.dropped_bytes,
            stderr_dropped_lines: self.stderr_dropped_lines,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::ReclaimOptions;

    #[test]
    fn the_summary_names_drops_and_stuck_vcpus() {
        let mut r = ShutdownReport::default();
        assert_eq!(r.summary_line(), None);
        r.reclaim = Some(ReclaimReport::planned(&[], &ReclaimOptions::default()));
        let plain = r.summary_line().unwrap();
        assert!(
            plain.starts_with("teravm: reclaimed 0 MiB in 0 ms"),
            "{plain}"
        );
        assert!(!plain.contains("dropped"));
        assert_eq!(
            serde_json::to_value(r.to_shape()).unwrap()["stderr_dropped_lines"],
            0
        );
        r.console.dropped_bytes = 12;
        r.stderr_dropped_lines = 3;
        r.vcpus.stuck = 1;
        let line = r.summary_line().unwrap();
        assert!(
            line.ends_with(
                "; console dropped 12 bytes; stderr dropped 3 lines; 1 vCPUs did not stop"
            ),
            "{line}"
        );
        assert_eq!(
            serde_json::to_value(r.to_shape()).unwrap()["stderr_dropped_lines"],
            3
        );
        r.host = Some("topology: 1 node (node 0: CPUs 0) from /x".into());
        let line = r.summary_line().unwrap();
        assert!(
            line.ends_with("1 vCPUs did not stop; topology: 1 node (node 0: CPUs 0) from /x"),
            "{line}"
        );
        // The summary's parser still finds the reclaim's counts first.
        assert_eq!(
            teravm_client::host::parse_summary(&line),
            teravm_client::host::parse_summary(&plain)
        );
        assert!(teravm_client::host::parse_summary(&line).is_some());
    }

    #[test]
    fn host_sources_name_the_topology_and_the_limit() {
        let topo = crate::memory::HostTopology::from_sysfs(std::path::Path::new("/sys")).unwrap();
        let line = host_sources(&topo);
        assert!(line.starts_with(&topo.describe()), "{line}");
        assert!(line.contains("; memory limit: "), "{line}");
        assert!(line.contains("; host memory: "), "{line}");
    }
}
