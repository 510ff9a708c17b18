//! teravm's metrics: a store of atomic counters that any thread bumps
//! without locking, and the writer that puts one JSON object per line into
//! the file or FIFO given by `--metrics-path`, the config file's `metrics`
//! section or `PUT /metrics`.
//!
//! A line has Firecracker's layout where Firecracker has the metric
//! (`utc_timestamp_ms`, `api_server`, `get_api_requests`,
//! `put_api_requests`, `patch_api_requests`, `logger`, `signals`,
//! `deprecated_api`; their counters are what happened since the previous
//! line, as in Firecracker; and `latencies_us`, the last duration of each
//! snapshot, pause and resume, [`record_latency_us`]),
//! plus teravm's own group `teravm` (running totals): the VM's state, the
//! reclaim report (state, elapsed, bytes freed per node, workers), API
//! requests and errors per method and resource, bytes of guest console
//! output dropped, lines and bytes of teravm's own output that stderr did
//! not take (also `logger.missed_stderr_count`, since the previous line),
//! the shutdown signals received, and the memslots KVM took (how many of
//! them with `KVM_MEM_LOG_DIRTY_PAGES`, as the flags passed to KVM say).
//!
//! A line is written on `FlushMetrics`, by the event loop's periodic timer
//! ([`FlushTimer`], every [`FLUSH_PERIOD`]) and once when the VM has
//! stopped. The file is opened non-blocking ([`LineSink`]): a line a FIFO
//! has no room for is dropped and counted, never waited for.

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use serde_json::{json, Map, Value};
use vmm_sys_util::timerfd::TimerFd;

use crate::config::MetricsConfig;
use crate::logger::LineSink;
use crate::memory::ReclaimReport;
use crate::util::{clock_us, process_cpu_us};

/// How often the event loop writes a line, as in Firecracker.
pub const FLUSH_PERIOD: Duration = Duration::from_secs(60);

/// Errors of the metrics writer.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    /// The metrics path could not be opened.
    #[error("cannot open the metrics path {path}: {source}")]
    Open {
        /// The path.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// Metrics were already set up (as in Firecracker, once per process).
    #[error("metrics are already written to {0}; they can be set up once")]
    AlreadyConfigured(PathBuf),
    /// The line could not be made.
    #[error("cannot serialize the metrics: {0}")]
    Serialize(serde_json::Error),
    /// The periodic timer could not be made.
    #[error("cannot create the metrics timer: {0}")]
    Timer(io::Error),
}

/// API resources counted apart; every other path counts as `other`.
const RESOURCES: [&str; 21] = [
    "/",
    "/version",
    "/machine-config",
    "/boot-source",
    "/memory",
    "/reclaim",
    "/actions",
    "/vm/config",
    "/vm",
    "/logger",
    "/metrics",
    "/drives",
    "/network-interfaces",
    "/vsock",
    "/balloon",
    "/mmds",
    "/snapshot",
    "/entropy",
    "/cpu-config",
    "/hotplug/memory",
    "other",
];
const METHODS: [&str; 4] = ["GET", "PUT", "PATCH", "other"];
const NR: usize = RESOURCES.len();
const NM: usize = METHODS.len();

/// The resource a path belongs to (`/drives/rootfs` is `/drives`).
fn resource_index(path: &str) -> usize {
    let path = path.split('?').next().unwrap_or(path);
    RESOURCES
        .iter()
        .position(|r| {
            path == *r || (r.len() > 1 && path.starts_with(r) && path[r.len()..].starts_with('/'))
        })
        .filter(|&i| i != 8 || path == "/vm")
        .unwrap_or(NR - 1)
}

fn method_index(method: &str) -> usize {
    METHODS[..NM - 1]
        .iter()
        .position(|m| *m == method)
        .unwrap_or(NM - 1)
}

/// A counter that also remembers its value at the last line written, so a
/// line can show what happened since (Firecracker's `SharedIncMetric`).
#[derive(Debug)]
struct DeltaCounter {
    total: AtomicU64,
    at_last_line: AtomicU64,
}

impl DeltaCounter {
    const fn new() -> DeltaCounter {
        DeltaCounter {
            total: AtomicU64::new(0),
            at_last_line: AtomicU64::new(0),
        }
    }

    fn add(&self, n: u64) {
        self.total.fetch_add(n, Ordering::Relaxed);
    }

    fn total(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }

    /// What was added since the last call (called only while writing a line).
    fn since_last_line(&self) -> u64 {
        let now = self.total();
        now - self.at_last_line.swap(now, Ordering::Relaxed)
    }
}

/// The store. There is one, [`METRICS`].
#[derive(Debug)]
pub struct Metrics {
    requests: [[DeltaCounter; NR]; NM],
    fails: [[DeltaCounter; NR]; NM],
    startup_us: AtomicU64,
    startup_cpu_us: AtomicU64,
    missed_lines: DeltaCounter,
    write_fails: DeltaCounter,
    missed_log_lines: DeltaCounter,
    missed_stderr_lines: DeltaCounter,
    sighup: DeltaCounter,
    sigterm: AtomicU64,
    sigint: AtomicU64,
    sighup_total: AtomicU64,
    console_bytes_dropped: AtomicU64,
    deprecated_calls: DeltaCounter,
    /// The API-level `latencies_us` fields, by [`Latency`].
    api_latency_us: [AtomicU64; LATENCIES],
    /// The VMM-level ones (`vmm_` before the name).
    vmm_latency_us: [AtomicU64; LATENCIES],
    sink: Mutex<Option<LineSink>>,
}

/// One of Firecracker's `latencies_us` measures. Each has two fields: the
/// API level (`full_create_snapshot`: from the request to the answer) and
/// the VMM level (`vmm_full_create_snapshot`: the action alone). A field
/// holds the last duration recorded, in microseconds (Firecracker's
/// `SharedStoreMetric`: not reset by a line).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Latency {
    /// A Full `PUT /snapshot/create`.
    FullCreateSnapshot,
    /// A Diff `PUT /snapshot/create`.
    DiffCreateSnapshot,
    /// A `PUT /snapshot/load`.
    LoadSnapshot,
    /// A `PATCH /vm` to `Paused`.
    PauseVm,
    /// A `PATCH /vm` to `Resumed`.
    ResumeVm,
}

const LATENCIES: usize = 5;

impl Latency {
    const ALL: [Latency; LATENCIES] = [
        Latency::FullCreateSnapshot,
        Latency::DiffCreateSnapshot,
        Latency::LoadSnapshot,
        Latency::PauseVm,
        Latency::ResumeVm,
    ];

    /// The API-level field's name (the VMM-level one has `vmm_` before it).
    pub fn field(self) -> &'static str {
        match self {
            Latency::FullCreateSnapshot => "full_create_snapshot",
            Latency::DiffCreateSnapshot => "diff_create_snapshot",
            Latency::LoadSnapshot => "load_snapshot",
            Latency::PauseVm => "pause_vm",
            Latency::ResumeVm => "resume_vm",
        }
    }
}

/// Where a duration was measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LatencyLevel {
    /// From the request to the answer (the API server).
    Api,
    /// The action alone (the VMM).
    Vmm,
}

/// The process's metrics.
pub static METRICS: Metrics = Metrics::new();

impl Metrics {
    const fn new() -> Metrics {
        Metrics {
            requests: [const { [const { DeltaCounter::new() }; NR] }; NM],
            fails: [const { [const { DeltaCounter::new() }; NR] }; NM],
            startup_us: AtomicU64::new(0),
            startup_cpu_us: AtomicU64::new(0),
            missed_lines: DeltaCounter::new(),
            write_fails: DeltaCounter::new(),
            missed_log_lines: DeltaCounter::new(),
            missed_stderr_lines: DeltaCounter::new(),
            sighup: DeltaCounter::new(),
            sigterm: AtomicU64::new(0),
            sigint: AtomicU64::new(0),
            sighup_total: AtomicU64::new(0),
            console_bytes_dropped: AtomicU64::new(0),
            deprecated_calls: DeltaCounter::new(),
            api_latency_us: [const { AtomicU64::new(0) }; LATENCIES],
            vmm_latency_us: [const { AtomicU64::new(0) }; LATENCIES],
            sink: Mutex::new(None),
        }
    }
}

/// Counts one API request.
pub fn record_request(method: &str, path: &str) {
    METRICS.requests[method_index(method)][resource_index(path)].add(1);
}

/// Counts one failed API request (answered 4xx or 5xx).
pub fn record_failure(method: &str, path: &str) {
    METRICS.fails[method_index(method)][resource_index(path)].add(1);
}

/// The running totals of requests and failures of `method` on `path`'s
/// resource.
pub fn counts(method: &str, path: &str) -> (u64, u64) {
    let (m, r) = (method_index(method), resource_index(path));
    (METRICS.requests[m][r].total(), METRICS.fails[m][r].total())
}

/// Records the duration of one successful action, in microseconds, as
/// Firecracker's `latencies_us` does (the last one is kept).
pub fn record_latency_us(which: Latency, level: LatencyLevel, us: u64) {
    let fields = match level {
        LatencyLevel::Api => &METRICS.api_latency_us,
        LatencyLevel::Vmm => &METRICS.vmm_latency_us,
    };
    fields[which as usize].store(us, Ordering::Relaxed);
}

/// The last duration recorded for `which` at `level` (0: none yet).
pub fn latency_us(which: Latency, level: LatencyLevel) -> u64 {
    let fields = match level {
        LatencyLevel::Api => &METRICS.api_latency_us,
        LatencyLevel::Vmm => &METRICS.vmm_latency_us,
    };
    fields[which as usize].load(Ordering::Relaxed)
}

/// Counts one request that used a deprecated field (Firecracker's
/// `deprecated_api.deprecated_http_api_calls`).
pub fn record_deprecated_api_call() {
    METRICS.deprecated_calls.add(1);
}

/// Firecracker's `latencies_us` group.
fn latencies() -> Value {
    let mut map = Map::new();
    for l in Latency::ALL {
        map.insert(
            l.field().to_string(),
            latency_us(l, LatencyLevel::Api).into(),
        );
    }
    for l in Latency::ALL {
        map.insert(
            format!("vmm_{}", l.field()),
            latency_us(l, LatencyLevel::Vmm).into(),
        );
    }
    Value::Object(map)
}

/// Counts one shutdown signal (SIGTERM, SIGINT, SIGHUP) received.
pub fn record_signal(signo: i32) {
    match signo {
        libc::SIGHUP => {
            METRICS.sighup.add(1);
            METRICS.sighup_total.fetch_add(1, Ordering::Relaxed);
        }
        libc::SIGTERM => {
            METRICS.sigterm.fetch_add(1, Ordering::Relaxed);
        }
        libc::SIGINT => {
            METRICS.sigint.fetch_add(1, Ordering::Relaxed);
        }
        _ => {}
    }
}

/// Counts guest console bytes the host side did not take (the console
/// writer calls this when its bounded buffer overflows).
pub fn add_console_bytes_dropped(bytes: u64) {
    METRICS
        .console_bytes_dropped
        .fetch_add(bytes, Ordering::Relaxed);
}

/// Records the process start-up time that the jailer's flags let teravm
/// compute (Firecracker's `api_server.process_startup_time_us` and
/// `process_startup_time_cpu_us`).
pub fn set_startup_times(wall_us: Option<u64>, cpu_us: Option<u64>) {
    if let Some(us) = wall_us {
        METRICS.startup_us.store(us, Ordering::Relaxed);
    }
    if let Some(us) = cpu_us {
        METRICS.startup_cpu_us.store(us, Ordering::Relaxed);
    }
}

/// From the jailer's `--start-time-us` (CLOCK_MONOTONIC), `--start-time-cpu-us`
/// and `--parent-cpu-time-us`: the wall and CPU time from the jailer's start
/// to now, as Firecracker computes them; stored in the metrics and returned.
pub fn process_startup_times(
    start_us: Option<u64>,
    start_cpu_us: Option<u64>,
    parent_cpu_us: Option<u64>,
) -> (Option<u64>, Option<u64>) {
    let wall = start_us.map(|s| clock_us(libc::CLOCK_MONOTONIC).saturating_sub(s));
    let cpu = start_cpu_us.map(|s| {
        process_cpu_us()
            .saturating_sub(s)
            .saturating_add(parent_cpu_us.unwrap_or(0))
    });
    set_startup_times(wall, cpu);
    (wall, cpu)
}

/// Starts writing metrics to `config.metrics_path` (once per process),
/// through `file`: that path as the `files` thread opened it (append-only,
/// non-blocking).
pub fn configure(config: &MetricsConfig, file: std::fs::File) -> Result<(), MetricsError> {
    let mut sink = METRICS.sink.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(s) = sink.as_ref() {
        return Err(MetricsError::AlreadyConfigured(s.path().to_path_buf()));
    }
    *sink = Some(LineSink::from_file(file, &config.metrics_path));
    Ok(())
}

/// Whether a metrics path is set up.
pub fn is_configured() -> bool {
    METRICS
        .sink
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .is_some()
}

/// What the VMM adds to a line: its state and its reclaim report.
#[derive(Debug, Clone)]
pub struct VmmSnapshot<'a> {
    /// The VM's state as `GET /` spells it.
    pub state: &'a str,
    /// The reclaim's progress or final report.
    pub reclaim: &'a ReclaimReport,
    /// Guest console bytes dropped so far (the console's own count).
    pub console_dropped_bytes: u64,
    /// The devices' groups (Firecracker's `balloon`, `block`, `net`,
    /// `vsock`), already in their JSON shape.
    pub device_groups: Vec<(String, Value)>,
}

fn fc_group(method: usize, fields: &[(&str, usize)], with_fails: bool) -> Value {
    let mut map = Map::new();
    for (name, r) in fields {
        map.insert(
            format!("{name}_count"),
            METRICS.requests[method][*r].since_last_line().into(),
        );
        if with_fails {
            map.insert(
                format!("{name}_fails"),
                METRICS.fails[method][*r].since_last_line().into(),
            );
        }
    }
    Value::Object(map)
}

fn totals(counters: &[[DeltaCounter; NR]; NM]) -> Value {
    let mut map = Map::new();
    for (m, row) in counters.iter().enumerate() {
        for (r, c) in row.iter().enumerate() {
            let n = c.total();
            if n > 0 {
                map.insert(format!("{} {}", METHODS[m], RESOURCES[r]), n.into());
            }
        }
    }
    Value::Object(map)
}

/// Makes one line (and moves the "since the last line" marks).
fn line(vmm: &VmmSnapshot<'_>) -> Result<String, MetricsError> {
    let (get, put, patch) = (0, 1, 2);
    let idx = |p: &str| resource_index(p);
    let utc_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis() as u64;
    let missed_log = crate::logger::missed_lines();
    let m = &METRICS;
    let seen = m.missed_log_lines.total();
    m.missed_log_lines.add(missed_log.saturating_sub(seen));
    let missed_stderr = crate::output::dropped_lines();
    let seen = m.missed_stderr_lines.total();
    m.missed_stderr_lines
        .add(missed_stderr.saturating_sub(seen));
    let value = json!({
        "utc_timestamp_ms": utc_ms,
        "api_server": {
            "process_startup_time_us": m.startup_us.load(Ordering::Relaxed),
            "process_startup_time_cpu_us": m.startup_cpu_us.load(Ordering::Relaxed),
        },
        "get_api_requests": fc_group(get, &[
            ("instance_info", idx("/")),
            ("machine_cfg", idx("/machine-config")),
            ("mmds", idx("/mmds")),
            ("vmm_version", idx("/version")),
            ("hotplug_memory", idx("/hotplug/memory")),
        ], false),
        "put_api_requests": fc_group(put, &[
            ("actions", idx("/actions")),
            ("boot_source", idx("/boot-source")),
            ("drive", idx("/drives")),
            ("logger", idx("/logger")),
            ("machine_cfg", idx("/machine-config")),
            ("cpu_cfg", idx("/cpu-config")),
            ("metrics", idx("/metrics")),
            ("network", idx("/network-interfaces")),
            ("mmds", idx("/mmds")),
            ("vsock", idx("/vsock")),
            ("hotplug_memory", idx("/hotplug/memory")),
        ], true),
        "patch_api_requests": fc_group(patch, &[
            ("drive", idx("/drives")),
            ("network", idx("/network-interfaces")),
            ("machine_cfg", idx("/machine-config")),
            ("mmds", idx("/mmds")),
            ("hotplug_memory", idx("/hotplug/memory")),
        ], true),
        "logger": {
            "missed_metrics_count": m.missed_lines.since_last_line(),
            "metrics_fails": m.write_fails.since_last_line(),
            "missed_log_count": m.missed_log_lines.since_last_line(),
            "missed_stderr_count": m.missed_stderr_lines.since_last_line(),
        },
        "signals": { "sighup": m.sighup.since_last_line() },
        "deprecated_api": {
            "deprecated_http_api_calls": m.deprecated_calls.since_last_line(),
        },
        "latencies_us": latencies(),
        "teravm": {
            "version": env!("CARGO_PKG_VERSION"),
            "state": vmm.state,
            "reclaim": vmm.reclaim,
            "api": { "requests": totals(&m.requests), "errors": totals(&m.fails) },
            "console": {
                "bytes_dropped": vmm.console_dropped_bytes
                    .max(m.console_bytes_dropped.load(Ordering::Relaxed)),
            },
            "stderr": {
                "lines_dropped": missed_stderr,
                "bytes_dropped": crate::output::dropped_bytes(),
            },
            "signals": {
                "sigterm": m.sigterm.load(Ordering::Relaxed),
                "sigint": m.sigint.load(Ordering::Relaxed),
                "sighup": m.sighup_total.load(Ordering::Relaxed),
            },
            "memslots": {
                "added": crate::vstate::vm::MEMSLOTS_ADDED.load(Ordering::Relaxed),
                "dirty_log": crate::vstate::vm::MEMSLOTS_DIRTY_LOG.load(Ordering::Relaxed),
            },
        },
    });
    let mut value = value;
    if let Value::Object(map) = &mut value {
        for (name, group) in &vmm.device_groups {
            map.insert(name.clone(), group.clone());
        }
    }
    let mut text = serde_json::to_string(&value).map_err(MetricsError::Serialize)?;
    text.push('\n');
    Ok(text)
}

/// Firecracker's aggregate group (`block`, `net`): every counter of the
/// per-device `groups` summed into `zero` (the group with each counter 0,
/// so that it is there without devices too, as in Firecracker's).
pub fn aggregate<'a>(zero: Value, groups: impl IntoIterator<Item = &'a Value>) -> Value {
    let mut out = zero;
    let Value::Object(sum) = &mut out else {
        return out;
    };
    for group in groups {
        let Value::Object(group) = group else {
            continue;
        };
        for (key, v) in group {
            if let (Some(a), Some(b)) = (sum.get(key).and_then(Value::as_u64), v.as_u64()) {
                sum.insert(key.clone(), a.saturating_add(b).into());
            }
        }
    }
    out
}

/// Writes one line if metrics are set up: `Ok(true)` when written,
/// `Ok(false)` when metrics are not set up or the line was dropped (counted
/// in `missed_metrics_count`; a FIFO reader that keeps up loses nothing).
pub fn flush(vmm: &VmmSnapshot<'_>) -> Result<bool, MetricsError> {
    let mut sink = METRICS.sink.lock().unwrap_or_else(|p| p.into_inner());
    let Some(sink) = sink.as_mut() else {
        return Ok(false);
    };
    let text = line(vmm)?;
    if sink.write_line(text.as_bytes()) {
        Ok(true)
    } else {
        METRICS.missed_lines.add(1);
        Ok(false)
    }
}

/// A `timerfd` that fires every [`FLUSH_PERIOD`], for the event loop to
/// watch; on each event, call [`FlushTimer::ack`] and then [`flush`].
#[derive(Debug)]
pub struct FlushTimer {
    timer: TimerFd,
}

impl FlushTimer {
    /// A non-blocking timer firing every `period` from now.
    pub fn new(period: Duration) -> Result<FlushTimer, MetricsError> {
        let mut timer = crate::util::nonblocking_timer().map_err(MetricsError::Timer)?;
        timer
            .reset(period, Some(period))
            .map_err(|e| MetricsError::Timer(e.into()))?;
        Ok(FlushTimer { timer })
    }

    /// Consumes the pending expirations; returns how many there were.
    pub fn ack(&mut self) -> u64 {
        self.timer.wait().unwrap_or(0)
    }
}

impl AsRawFd for FlushTimer {
    fn as_raw_fd(&self) -> RawFd {
        self.timer.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reclaim_object_is_what_get_reclaim_shows() {
        let opts = crate::memory::ReclaimOptions::default();
        let mut r = ReclaimReport::planned(&[(0, 2 << 30), (3, 1 << 30)], &opts);
        r.state = crate::memory::ReclaimState::Failed;
        r.elapsed_us = 1500;
        r.nodes[1].resident_bytes_freed = 4096;
        let snapshot = VmmSnapshot {
            state: "Running",
            reclaim: &r,
            console_dropped_bytes: 0,
            device_groups: Vec::new(),
        };
        let v: Value = serde_json::from_str(&line(&snapshot).unwrap()).unwrap();
        assert_eq!(v["teravm"]["reclaim"], serde_json::to_value(&r).unwrap());
        assert_eq!(v["teravm"]["reclaim"]["state"], "failed");
    }

    #[test]
    fn paths_map_to_resources() {
        assert_eq!(RESOURCES[resource_index("/")], "/");
        assert_eq!(RESOURCES[resource_index("/drives/rootfs")], "/drives");
        assert_eq!(RESOURCES[resource_index("/vm")], "/vm");
        assert_eq!(RESOURCES[resource_index("/vm/config")], "/vm/config");
        assert_eq!(RESOURCES[resource_index("/snapshot/create")], "/snapshot");
        assert_eq!(RESOURCES[resource_index("/mmds/config")], "/mmds");
        assert_eq!(RESOURCES[resource_index("/balloon/statistics")], "/balloon");
        assert_eq!(RESOURCES[resource_index("/machine-configx")], "other");
        assert_eq!(RESOURCES[resource_index("/nope")], "other");
        assert_eq!(
            RESOURCES[resource_index("/hotplug/memory")],
            "/hotplug/memory"
        );
        assert_eq!(RESOURCES[resource_index("/hotplug")], "other");
        assert_eq!(METHODS[method_index("DELETE")], "other");
    }

    #[test]
    fn counters_show_what_happened_since_the_last_line() {
        let c = DeltaCounter::new();
        c.add(3);
        assert_eq!(c.since_last_line(), 3);
        assert_eq!(c.since_last_line(), 0);
        c.add(2);
        assert_eq!(c.since_last_line(), 2);
        assert_eq!(c.total(), 5);
    }

    #[test]
    fn a_line_is_one_json_object_with_both_layouts() {
        record_request("GET", "/version");
        record_request("PUT", "/drives/1");
        record_failure("PUT", "/drives/1");
        let report = crate::memory::ReclaimProgress::new().snapshot();
        let text = line(&VmmSnapshot {
            state: "Running",
            reclaim: &report,
            console_dropped_bytes: 7,
            device_groups: vec![("balloon".into(), json!({"inflate_count": 3}))],
        })
        .unwrap();
        assert!(text.ends_with('\n') && text.matches('\n').count() == 1);
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["balloon"]["inflate_count"], 3);
        assert!(v["utc_timestamp_ms"].as_u64().unwrap() > 0);
        assert!(v["put_api_requests"]["drive_fails"].as_u64().unwrap() >= 1);
        assert!(v["get_api_requests"]["vmm_version_count"].as_u64().unwrap() >= 1);
        assert_eq!(v["teravm"]["state"], "Running");
        assert_eq!(v["teravm"]["console"]["bytes_dropped"], 7);
        assert!(v["logger"]["missed_stderr_count"].is_u64());
        assert!(v["teravm"]["stderr"]["lines_dropped"].is_u64());
        assert!(v["teravm"]["stderr"]["bytes_dropped"].is_u64());
        assert_eq!(v["teravm"]["reclaim"]["state"], "idle");
        assert!(
            v["teravm"]["api"]["errors"]["PUT /drives"]
                .as_u64()
                .unwrap()
                >= 1
        );
    }

    #[test]
    fn latencies_us_has_firecrackers_fields_and_keeps_the_last() {
        record_latency_us(Latency::DiffCreateSnapshot, LatencyLevel::Vmm, 5);
        record_latency_us(Latency::DiffCreateSnapshot, LatencyLevel::Vmm, 7);
        record_latency_us(Latency::LoadSnapshot, LatencyLevel::Api, 11);
        record_deprecated_api_call();
        let report = crate::memory::ReclaimProgress::new().snapshot();
        let snap = VmmSnapshot {
            state: "Running",
            reclaim: &report,
            console_dropped_bytes: 0,
            device_groups: vec![],
        };
        let v: Value = serde_json::from_str(&line(&snap).unwrap()).unwrap();
        let l = &v["latencies_us"];
        let mut names: Vec<&str> = l.as_object().unwrap().keys().map(String::as_str).collect();
        names.sort_unstable();
        let mut fc = vec![
            "full_create_snapshot",
            "diff_create_snapshot",
            "load_snapshot",
            "pause_vm",
            "resume_vm",
            "vmm_full_create_snapshot",
            "vmm_diff_create_snapshot",
            "vmm_load_snapshot",
            "vmm_pause_vm",
            "vmm_resume_vm",
        ];
        fc.sort_unstable();
        assert_eq!(names, fc);
        assert_eq!(l["vmm_diff_create_snapshot"], 7);
        assert_eq!(l["load_snapshot"], 11);
        assert!(
            v["deprecated_api"]["deprecated_http_api_calls"]
                .as_u64()
                .unwrap()
                >= 1
        );
        // A store, not a delta: the next line shows it again.
        let v: Value = serde_json::from_str(&line(&snap).unwrap()).unwrap();
        assert_eq!(v["latencies_us"]["vmm_diff_create_snapshot"], 7);
    }

    #[test]
    fn aggregate_sums_each_counter_over_the_devices() {
        let zero = json!({"read_count": 0, "write_bytes": 0});
        let a = json!({"read_count": 2, "write_bytes": 512});
        let b = json!({"read_count": 3, "write_bytes": 1, "extra": 7});
        assert_eq!(
            aggregate(zero.clone(), [&a, &b]),
            json!({"read_count": 5, "write_bytes": 513})
        );
        // No devices: the group is there, every counter 0.
        assert_eq!(aggregate(zero.clone(), []), zero);
    }

    #[test]
    fn the_timer_fires() {
        let mut t = FlushTimer::new(Duration::from_millis(1)).unwrap();
        let mut pfd = libc::pollfd {
            fd: t.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd; waits at most 5 s for the event.
        assert_eq!(unsafe { libc::poll(&mut pfd, 1, 5000) }, 1);
        assert!(t.ack() >= 1);
    }
}
