//! The outputs of a benchmark over its samples: the CSV (one row per run),
//! the table on stdout (one row per method, page size and backing, with the
//! methods this host cannot run marked unavailable), the async reply
//! latencies and the shutdown phases. Pure functions over values.
//!
//! With `--peers`, every row is also compared with each peer VMM's graceful
//! stop in the same case (`vs qemu`: `qemu-prealloc-quit`'s median over the row's).

use std::fmt::Write as _;

use crate::cputime::CpuSplit;
use crate::model::{backing_name, Case, Method, Peer, Sample, Stop, Unavailable, PHASE_NAMES};
use crate::stats::{gib_per_s, median, percentile, speedup, Summary};

/// The header line of the CSV: the first eight columns are those of earlier
/// versions, the others were appended.
pub const CSV_HEADER: &str = "method,pages,backing,size_gib,workers,chunk_mib,run,seconds,\
vs_munmap,vs_exit,vs_mrelease,reply_ms,reply_p50_ms,reply_p99_ms,reply_max_ms,\
stop_vcpus_ms,close_vm_ms,reclaim_ms,unmap_ms,vs_serial,discard_mib_per_s,discarded_mib,rss_before_mib,rss_after_mib,\
vs_qemu,vs_firecracker,vs_cloud_hypervisor,resident_mib,huge_mib,populate_ms,touched_mib,\
vcpu_cpu_s,discard_cpu_s,device_cpu_s";

/// The row a method's `vs <peer>` is against: the peer's graceful stop of
/// the same kind (with the test guest for a guest row, preallocated for the
/// others).
pub fn peer_baseline(method: Method, peer: Peer) -> Method {
    if method.is_guest() {
        Method::PeerGuest(peer, Stop::Graceful)
    } else {
        Method::Peer(peer, Stop::Graceful)
    }
}

/// How many ratios a row has: munmap, exit, mrelease, serial, then one per
/// peer ([`Peer::ALL`]).
const RATIOS: usize = 4 + Peer::ALL.len();

/// The medians of the baselines a method is compared with in a case:
/// `munmap`, and `exit` and `mrelease` (for a `--vm` method, `vm-kill` and
/// `vm-mrelease`: the same microVM killed; none for a `--live` method,
/// which frees a running guest's memory), for a `--live` method
/// `report-serial`, and each peer VMM's graceful stop (`qemu-prealloc-quit`).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Baselines {
    munmap: Option<f64>,
    exit: Option<f64>,
    mrelease: Option<f64>,
    serial: Option<f64>,
    peers: [Option<f64>; Peer::ALL.len()],
}

impl Baselines {
    fn of(samples: &[Sample], case: Case, method: Method) -> Baselines {
        let median_of = |m: Method| {
            let times: Vec<f64> = samples
                .iter()
                .filter(|s| s.case == case && s.method == m)
                .map(|s| s.seconds)
                .collect();
            median(&times)
        };
        let (exit, mrelease) = if method.is_vm() {
            (Method::VmKill, Method::VmMrelease)
        } else {
            (Method::Exit, Method::Mrelease)
        };
        let live = method.is_live();
        Baselines {
            munmap: median_of(Method::Munmap),
            exit: median_of(exit).filter(|_| !live),
            mrelease: median_of(mrelease).filter(|_| !live),
            serial: method.live_baseline().and_then(&median_of),
            peers: Peer::ALL.map(|p| median_of(peer_baseline(method, p)).filter(|_| !live)),
        }
    }

    /// How many times faster `seconds` is than each baseline: munmap,
    /// exit, mrelease, serial, then the peers.
    fn ratios(&self, seconds: f64) -> [Option<f64>; RATIOS] {
        let mut all = [None; RATIOS];
        all[..4].copy_from_slice(&[self.munmap, self.exit, self.mrelease, self.serial]);
        all[4..].copy_from_slice(&self.peers);
        all.map(|b| b.and_then(|b| speedup(b, seconds)))
    }
}

fn opt(v: Option<f64>, decimals: usize) -> String {
    v.map(|v| format!("{v:.decimals$}")).unwrap_or_default()
}

/// The CSV text: the header, then one row per run in the order run. Empty
/// fields: `chunk_mib` for the baselines (no chunks); a ratio whose baseline
/// did not run; `reply_*` but for `vm-async` rows (`reply_ms` this run's
/// reply, the others over all runs of the method and case); the phases
/// where teravm's reply has none; `vs_serial` and the discard and resident
/// sizes but for `--live` rows; `vs_<peer>` where that peer did not run;
/// `resident_mib` and `huge_mib` but for the `--peers` rows (a peer's and
/// `vm-prealloc-teravm`'s). A method this host cannot run has no rows (the
/// table says so).
pub fn csv(samples: &[Sample]) -> String {
    let mut out = String::with_capacity(128 * (samples.len() + 1));
    out.push_str(CSV_HEADER);
    out.push('\n');
    for s in samples {
        let chunk = s.chunk_mib.map(|c| c.to_string()).unwrap_or_default();
        let ratios = Baselines::of(samples, s.case, s.method).ratios(s.seconds);
        let replies = reply_ms(samples, s.case, s.method);
        let (p50, p99, max) = match s.reply_ms {
            Some(_) => (
                percentile(&replies, 50.0),
                percentile(&replies, 99.0),
                percentile(&replies, 100.0),
            ),
            None => (None, None, None),
        };
        let _ = write!(
            out,
            "{},{},{},{},{},{},{},{:.6}",
            s.method,
            s.case.pages,
            backing_name(s.case.backing),
            s.size_gib,
            s.method.workers(),
            chunk,
            s.run,
            s.seconds
        );
        for r in &ratios[..3] {
            let _ = write!(out, ",{}", opt(*r, 4));
        }
        for v in [s.reply_ms, p50, p99, max] {
            let _ = write!(out, ",{}", opt(v, 3));
        }
        for v in s.phases {
            let _ = write!(out, ",{}", opt(v, 3));
        }
        let _ = write!(out, ",{}", opt(ratios[3], 4));
        let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
        let live = s.live.map(|l| {
            [
                l.discard_bytes_per_s,
                l.discarded_bytes,
                l.rss_before_bytes,
                l.rss_after_bytes,
            ]
            .map(mib)
        });
        for i in 0..4 {
            let _ = write!(out, ",{}", opt(live.map(|l| l[i]), 1));
        }
        for r in &ratios[4..] {
            let _ = write!(out, ",{}", opt(*r, 4));
        }
        let resident = s.resident.map(|r| [r.bytes, r.huge_bytes].map(mib));
        for i in 0..2 {
            let _ = write!(out, ",{}", opt(resident.map(|r| r[i]), 1));
        }
        let _ = write!(out, ",{}", opt(s.populate_ms, 1));
        let touched = s.touched_mib.map(|m| m.to_string()).unwrap_or_default();
        let _ = write!(out, ",{touched}");
        let cpu = s
            .live
            .map(|l| [l.cpu.vcpu_s, l.cpu.discard_s, l.cpu.device_s]);
        for i in 0..3 {
            let _ = write!(out, ",{}", opt(cpu.map(|c| c[i]), 3));
        }
        out.push('\n');
    }
    out
}

/// The async reply latencies, ms, of `method`'s runs in `case`.
fn reply_ms(samples: &[Sample], case: Case, method: Method) -> Vec<f64> {
    samples
        .iter()
        .filter(|s| s.case == case && s.method == method)
        .filter_map(|s| s.reply_ms)
        .collect()
}

/// One row of the table: a method on one page size and backing.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Row {
    /// Page size and backing.
    pub case: Case,
    /// The method.
    pub method: Method,
    /// Guest memory size in GiB.
    pub size_gib: u64,
    /// Median and range of the runs.
    pub summary: Summary,
    /// How many times faster than `munmap` in the same case (median over median).
    pub vs_munmap: Option<f64>,
    /// How many times faster than `exit` (`vm-kill` for a `--vm` method) in
    /// the same case.
    pub vs_exit: Option<f64>,
    /// How many times faster than `mrelease` (`vm-mrelease` for a `--vm`
    /// method) in the same case.
    pub vs_mrelease: Option<f64>,
    /// `--live` rows: how many times faster than `report-serial` (`unplug-serial` for the unplug rows).
    pub vs_serial: Option<f64>,
    /// `--peers`: how many times faster than each peer's graceful stop
    /// (`qemu-prealloc-quit`, ...) in the same case, in the order of [`Peer::ALL`].
    pub vs_peers: [Option<f64>; Peer::ALL.len()],
    /// `--live` rows: the median CPU seconds of the vCPU threads, the
    /// discard workers and the balloon thread over the report.
    pub cpu: Option<CpuSplit>,
}

impl Row {
    /// Throughput of the median run, GiB/s.
    pub fn gib_per_s(&self) -> Option<f64> {
        gib_per_s(self.size_gib << 30, self.summary.median_s)
    }
}

/// The cases of the samples, in the order first seen.
pub fn cases_of(samples: &[Sample]) -> Vec<Case> {
    let mut cases: Vec<Case> = Vec::new();
    for s in samples {
        if !cases.contains(&s.case) {
            cases.push(s.case);
        }
    }
    cases
}

/// Groups the samples into rows: cases in the order first seen, and within a
/// case the methods in the order of [`Method`]'s variants (baselines first,
/// then teravm by worker count, then the `--vm` methods).
pub fn rows(samples: &[Sample]) -> Vec<Row> {
    let mut out = Vec::new();
    for case in cases_of(samples) {
        let in_case: Vec<&Sample> = samples.iter().filter(|s| s.case == case).collect();
        let mut methods: Vec<Method> = in_case.iter().map(|s| s.method).collect();
        methods.sort();
        methods.dedup();
        for method in methods {
            let times: Vec<f64> = in_case
                .iter()
                .filter(|s| s.method == method)
                .map(|s| s.seconds)
                .collect();
            let Some(summary) = Summary::of(&times) else {
                continue;
            };
            let size_gib = in_case
                .iter()
                .find(|s| s.method == method)
                .map_or(0, |s| s.size_gib);
            let ratios = Baselines::of(samples, case, method).ratios(summary.median_s);
            let [vs_munmap, vs_exit, vs_mrelease, vs_serial] = [0, 1, 2, 3].map(|i| ratios[i]);
            let mut vs_peers = [None; Peer::ALL.len()];
            vs_peers.copy_from_slice(&ratios[4..]);
            let cpus: Vec<CpuSplit> = in_case
                .iter()
                .filter(|s| s.method == method)
                .filter_map(|s| s.live.map(|l| l.cpu))
                .collect();
            let cpu = median_cpu(&cpus);
            out.push(Row {
                cpu,
                case,
                method,
                size_gib,
                summary,
                vs_munmap,
                vs_exit,
                vs_mrelease,
                vs_serial,
                vs_peers,
            });
        }
    }
    out
}

/// The median of each role's CPU seconds; None for no runs.
fn median_cpu(cpus: &[CpuSplit]) -> Option<CpuSplit> {
    let of = |f: fn(&CpuSplit) -> f64| median(&cpus.iter().map(f).collect::<Vec<_>>());
    Some(CpuSplit {
        vcpu_s: of(|c| c.vcpu_s)?,
        discard_s: of(|c| c.discard_s)?,
        device_s: of(|c| c.device_s)?,
    })
}

fn cpu_text(c: Option<CpuSplit>) -> String {
    c.map_or_else(
        || "-".to_string(),
        |c| format!("{:.2}/{:.2}/{:.2}", c.vcpu_s, c.discard_s, c.device_s),
    )
}

fn ratio_text(r: Option<f64>) -> String {
    r.map_or_else(|| "-".to_string(), |r| format!("{r:.2}x"))
}

/// The table's columns: 13, then one per peer.
const COLUMNS: usize = 13 + Peer::ALL.len();
/// Where `cpu` is, and the columns after it.
const CPU: usize = 7;
const VS_MUNMAP: usize = 9;
const VS_SERIAL: usize = 12;
const VS_PEERS: usize = 13;

const TABLE_HEADER: [&str; COLUMNS] = [
    "method",
    "pages",
    "backing",
    "size",
    "workers",
    "median s",
    "min-max s",
    "cpu vcpu/discard/dev s",
    "GiB/s",
    "vs munmap",
    "vs exit",
    "vs mrelease",
    "vs serial",
    "vs qemu",
    "vs firecracker",
    "vs cloud-hypervisor",
];

/// The cells of a row that ran.
fn row_cells(r: &Row) -> [String; COLUMNS] {
    let workers = if r.method.has_no_workers() {
        "-".to_string()
    } else {
        r.method.workers().to_string()
    };
    let [qemu, firecracker, cloud_hypervisor] = r.vs_peers.map(ratio_text);
    [
        r.method.to_string(),
        r.case.pages.to_string(),
        backing_name(r.case.backing).to_string(),
        format!("{} GiB", r.size_gib),
        workers,
        format!("{:.3}", r.summary.median_s),
        format!("{:.3}-{:.3}", r.summary.min_s, r.summary.max_s),
        cpu_text(r.cpu),
        r.gib_per_s().map_or("-".to_string(), |g| format!("{g:.2}")),
        ratio_text(r.vs_munmap),
        ratio_text(r.vs_exit),
        ratio_text(r.vs_mrelease),
        ratio_text(r.vs_serial),
        qemu,
        firecracker,
        cloud_hypervisor,
    ]
}

/// The cells of a method this host cannot run, in a case.
fn unavailable_cells(method: Method, case: Case, size_gib: u64) -> [String; COLUMNS] {
    let mut cells = [(); COLUMNS].map(|()| "-".to_string());
    cells[0] = method.to_string();
    cells[1] = case.pages.to_string();
    cells[2] = backing_name(case.backing).to_string();
    cells[3] = format!("{size_gib} GiB");
    cells[5] = "unavailable".to_string();
    cells
}

/// Which columns the table shows: all but `vs munmap`, `vs exit` and `vs
/// mrelease` (only where one of them has a value), `vs serial` (only with
/// `--live` rows) and `vs <peer>` (only where that peer ran).
fn shown_columns(rows: &[Row]) -> [bool; COLUMNS] {
    let mut shown = [true; COLUMNS];
    // vs munmap, exit and mrelease: hidden only when none of them ran
    // (`--peers-only`).
    let any_baseline = rows.iter().any(|r| {
        [r.vs_munmap, r.vs_exit, r.vs_mrelease]
            .iter()
            .any(Option::is_some)
    });
    shown[VS_MUNMAP..VS_SERIAL].fill(any_baseline);
    shown[VS_SERIAL] = rows.iter().any(|r| r.method.is_live());
    shown[CPU] = shown[VS_SERIAL];
    for peer in Peer::ALL {
        shown[VS_PEERS + peer.index()] = rows
            .iter()
            .any(|r| matches!(r.method, Method::Peer(p, _) | Method::PeerGuest(p, _) if p == peer));
    }
    shown
}

/// The table printed on stdout, with closing lines that say how to read the
/// ratios and why a method is unavailable. Each unavailable method gets a
/// row in every case where its kind ran (the `--vm` ones only with `--vm`),
/// or in its one case. The `vs serial` column is there only when `--live`
/// rows are, `vs <peer>` only where the peer ran.
pub fn table(rows: &[Row], unavailable: &[Unavailable]) -> String {
    let shown = shown_columns(rows);
    let mut lines: Vec<[String; COLUMNS]> = Vec::with_capacity(rows.len());
    let mut cases: Vec<Case> = Vec::new();
    for r in rows {
        if !cases.contains(&r.case) {
            cases.push(r.case);
        }
    }
    for case in cases {
        let in_case: Vec<&Row> = rows.iter().filter(|r| r.case == case).collect();
        let size_gib = in_case.first().map_or(0, |r| r.size_gib);
        let mut missing: Vec<Method> = unavailable
            .iter()
            .filter(|u| u.case.is_none_or(|c| c == case))
            .map(|u| u.method)
            .filter(|m| in_case.iter().any(|r| r.method.is_vm() == m.is_vm()))
            .collect();
        let mut pending = in_case.iter().peekable();
        missing.sort();
        missing.dedup();
        // Rows and unavailable methods merged in the order of `Method`.
        for m in missing {
            while let Some(r) = pending.next_if(|r| r.method < m) {
                lines.push(row_cells(r));
            }
            lines.push(unavailable_cells(m, case, size_gib));
        }
        lines.extend(pending.map(|r| row_cells(r)));
    }
    let mut widths = TABLE_HEADER.map(str::len);
    for line in &lines {
        for (w, cell) in widths.iter_mut().zip(line.iter()) {
            *w = (*w).max(cell.len());
        }
    }
    let mut out = String::new();
    let mut push_line = |cells: &[&str]| {
        let mut text = String::new();
        let columns = cells.iter().zip(widths.iter()).enumerate();
        for (n, (i, (cell, w))) in columns.filter(|(i, _)| shown[*i]).enumerate() {
            if n > 0 {
                text.push_str("  ");
            }
            // Text columns to the left, numbers to the right.
            if i < 3 {
                let _ = write!(text, "{cell:<w$}");
            } else {
                let _ = write!(text, "{cell:>w$}");
            }
        }
        out.push_str(text.trim_end());
        out.push('\n');
    };
    push_line(&TABLE_HEADER);
    for line in &lines {
        let cells: Vec<&str> = line.iter().map(String::as_str).collect();
        push_line(&cells);
    }
    // Said only where those columns are (not with --peers-only).
    if shown[VS_MUNMAP..VS_SERIAL].iter().any(|s| *s) {
        out.push_str(
            "vs X: median time of X over this median, from the same run (above 1: faster than X); \
             for vm-* rows, exit and mrelease are vm-kill and vm-mrelease; \
             workers are per NUMA node\n",
        );
    }
    if shown[VS_SERIAL] {
        out.push_str(
            "report-* rows: a running guest reports its memory free, timed by the guest from \
             its first report to the last acknowledged; vs serial: report-serial's median \
             over this one; cpu: median CPU seconds of teravm's vCPU threads, discard \
             workers and balloon thread over the report (/proc/<pid>/task/*/stat)\n",
        );
    }
    if rows.iter().any(|r| r.method.is_unplug()) {
        out.push_str(
            "unplug-* rows: a running guest has plugged and touched virtio-mem memory; timed \
             from the host's PATCH to 0 until plugged_size_mib is 0 and the resident size has \
             fallen; vs serial: unplug-serial's median over this one\n",
        );
    }
    if shown[VS_PEERS..].iter().any(|s| *s) {
        out.push_str(
            "vs <peer>: median time of the peer's graceful stop of the same kind over this \
             median, same case (guest rows: qemu-guest-quit, firecracker-guest-ctrlaltdel; \
             the others: qemu-prealloc-quit); *-prealloc-* rows: all guest RAM resident, \
             preallocated, the guest never run; *-guest-* rows: the test guest wrote all its \
             RAM (touch=all, on vCPU 0); both timed from the stop request until waitpid\n",
        );
    }
    let mut said: Vec<String> = Vec::new();
    for u in unavailable {
        let line = match u.case {
            Some(case) => format!("{} {case}: unavailable here: {}", u.method, u.reason),
            None => format!("{}: unavailable here: {}", u.method, u.reason),
        };
        if !said.contains(&line) {
            let _ = writeln!(out, "{line}");
            said.push(line);
        }
    }
    out
}

/// The async `Shutdown` reply latencies (request sent → 202 received): one
/// line per `vm-async` method and case with p50, p99 and max; empty when
/// none ran.
pub fn reply_text(samples: &[Sample]) -> String {
    let mut out = String::new();
    for case in cases_of(samples) {
        let mut methods: Vec<Method> = samples
            .iter()
            .filter(|s| s.case == case && s.reply_ms.is_some())
            .map(|s| s.method)
            .collect();
        methods.sort();
        methods.dedup();
        for method in methods {
            let v = reply_ms(samples, case, method);
            let ms = |p| percentile(&v, p).map_or("-".into(), |x| format!("{x:.3}"));
            if out.is_empty() {
                out.push_str("async Shutdown reply (request sent -> 202 received):\n");
            }
            let _ = writeln!(
                out,
                "  {method} {case}: p50 {} ms, p99 {} ms, max {} ms ({} run{})",
                ms(50.0),
                ms(99.0),
                ms(100.0),
                v.len(),
                if v.len() == 1 { "" } else { "s" }
            );
        }
    }
    out
}

/// The shutdown phases of the `vm-teravm` runs, median per phase, from
/// teravm's sync reply: one line per method and case that has any; empty
/// when teravm reports none.
pub fn phases_text(samples: &[Sample]) -> String {
    let mut out = String::new();
    for case in cases_of(samples) {
        let mut methods: Vec<Method> = samples
            .iter()
            .filter(|s| s.case == case && s.phases.iter().any(Option::is_some))
            .map(|s| s.method)
            .collect();
        methods.sort();
        methods.dedup();
        for method in methods {
            let parts: Vec<String> = PHASE_NAMES
                .iter()
                .enumerate()
                .filter_map(|(i, name)| {
                    let v: Vec<f64> = samples
                        .iter()
                        .filter(|s| s.case == case && s.method == method)
                        .filter_map(|s| s.phases[i])
                        .collect();
                    median(&v).map(|m| format!("{} {m:.1}", name.trim_end_matches("_ms")))
                })
                .collect();
            if out.is_empty() {
                out.push_str("shutdown phases (median ms, from teravm's sync reply):\n");
            }
            let _ = writeln!(out, "  {method} {case}: {}", parts.join(", "));
        }
    }
    out
}

/// teravm's populate before boot, median per case over every microVM run
/// of it (all its `vm-*` rows populate the same way): milliseconds and
/// GiB/s; empty when none ran.
pub fn populate_text(samples: &[Sample]) -> String {
    let mut out = String::new();
    for case in cases_of(samples) {
        let of_case: Vec<&Sample> = samples
            .iter()
            .filter(|s| s.case == case && s.populate_ms.is_some())
            .collect();
        let times: Vec<f64> = of_case.iter().filter_map(|s| s.populate_ms).collect();
        let (Some(ms), Some(first)) = (median(&times), of_case.first()) else {
            continue;
        };
        if out.is_empty() {
            out.push_str("populate before boot (median ms over the microVM runs, teravm's per-node workers, from its log):\n");
        }
        let gib_s = if ms > 0.0 {
            first.size_gib as f64 / (ms / 1000.0)
        } else {
            0.0
        };
        let _ = writeln!(
            out,
            "  {case}: {ms:.0} ms ({gib_s:.2} GiB/s, {} runs)",
            times.len()
        );
    }
    out
}

/// The `--live` runs' checks, median per method and case: teravm's discard
/// rate over its busy time and its resident size before and after (the
/// lowest sampled); empty when none ran.
pub fn live_text(samples: &[Sample]) -> String {
    let mut out = String::new();
    for case in cases_of(samples) {
        let mut methods: Vec<Method> = samples
            .iter()
            .filter(|s| s.case == case && s.live.is_some())
            .map(|s| s.method)
            .collect();
        methods.sort();
        methods.dedup();
        for &method in &methods {
            let lives: Vec<_> = samples
                .iter()
                .filter(|s| s.case == case && s.method == method)
                .filter_map(|s| s.live)
                .collect();
            let med = |f: &dyn Fn(&crate::model::Live) -> u64| {
                let v: Vec<f64> = lives.iter().map(|l| f(l) as f64).collect();
                median(&v).unwrap_or(0.0) / (1u64 << 20) as f64
            };
            if out.is_empty() {
                out.push_str(
                    "live reclaim (median; teravm's discard rate over its busy time, \
                     its resident size at the peak and lowest after reporting):\n",
                );
            }
            let cpu = median_cpu(&lives.iter().map(|l| l.cpu).collect::<Vec<_>>());
            let _ = writeln!(
                out,
                "  {method} {case}: discard {:.0} MiB/s, {:.0} MiB discarded, \
                 RSS {:.0} -> {:.0} MiB, cpu vcpu/discard/dev {} s",
                med(&|l| l.discard_bytes_per_s),
                med(&|l| l.discarded_bytes),
                med(&|l| l.rss_before_bytes),
                med(&|l| l.rss_after_bytes),
                cpu_text(cpu),
            );
        }
        if let Some(line) = quiet_line(samples, case).filter(|_| !methods.is_empty()) {
            out.push_str(&line);
        }
    }
    out
}

/// How quiet the host was during a `--live` round: the in-process
/// `teravm-<w>` (the most workers that ran) against one `munmap`, from the
/// same run (about 1.9x at 2 workers on a quiet 2-core host; near 1x, the
/// cores were busy with something else). None where either did not run.
fn quiet_line(samples: &[Sample], case: Case) -> Option<String> {
    let median_of = |m: Method| {
        let v: Vec<f64> = samples
            .iter()
            .filter(|s| s.case == case && s.method == m)
            .map(|s| s.seconds)
            .collect();
        median(&v)
    };
    let w = samples
        .iter()
        .filter(|s| s.case == case)
        .filter_map(|s| match s.method {
            Method::Teravm(w) => Some(w),
            _ => None,
        })
        .max()?;
    let ratio = speedup(median_of(Method::Munmap)?, median_of(Method::Teravm(w))?)?;
    Some(format!(
        "  same run, in process {case}: teravm-{w} {ratio:.2}x munmap (how quiet the host was)\n"
    ))
}

#[cfg(test)]
#[path = "report_tests.rs"]
mod tests;
