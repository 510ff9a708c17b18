//! The outputs of a benchmark over its samples: the CSV (one row per run),
//! the table on stdout (one row per method, page size and backing, with the
//! methods this host cannot run marked unavailable), the async reply
//! latencies and the shutdown phases. Pure functions over values.

use std::fmt::Write as _;

use crate::model::{backing_name, Case, Method, Sample, Unavailable, PHASE_NAMES};
use crate::stats::{gib_per_s, median, percentile, speedup, Summary};

/// The header line of the CSV: the first eight columns are those of earlier
/// versions, the others were appended.
pub const CSV_HEADER: &str = "method,pages,backing,size_gib,workers,chunk_mib,run,seconds,\
vs_munmap,vs_exit,vs_mrelease,reply_ms,reply_p50_ms,reply_p99_ms,reply_max_ms,\
stop_vcpus_ms,close_vm_ms,reclaim_ms,unmap_ms,vs_serial,discard_mib_per_s,discarded_mib,rss_before_mib,rss_after_mib";

/// The medians of the baselines a method is compared with in a case:
/// `munmap`, and `exit` and `mrelease` (for a `--vm` method, `vm-kill` and
/// `vm-mrelease`: the same microVM killed; none for a `--live` method,
/// which frees a running guest's memory), and for a `--live` method
/// `report-serial`.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Baselines {
    munmap: Option<f64>,
    exit: Option<f64>,
    mrelease: Option<f64>,
    serial: Option<f64>,
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
            serial: median_of(Method::ReportSerial).filter(|_| live),
        }
    }

    /// How many times faster `seconds` is than each baseline: munmap,
    /// exit, mrelease, serial.
    fn ratios(&self, seconds: f64) -> [Option<f64>; 4] {
        [self.munmap, self.exit, self.mrelease, self.serial]
            .map(|b| b.and_then(|b| speedup(b, seconds)))
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
/// sizes but for `--live` rows. A method this host cannot run has no rows
/// (the table says so).
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
    /// `--live` rows: how many times faster than `report-serial`.
    pub vs_serial: Option<f64>,
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
            let [vs_munmap, vs_exit, vs_mrelease, vs_serial] =
                Baselines::of(samples, case, method).ratios(summary.median_s);
            out.push(Row {
                case,
                method,
                size_gib,
                summary,
                vs_munmap,
                vs_exit,
                vs_mrelease,
                vs_serial,
            });
        }
    }
    out
}

fn ratio_text(r: Option<f64>) -> String {
    r.map_or_else(|| "-".to_string(), |r| format!("{r:.2}x"))
}

const TABLE_HEADER: [&str; 12] = [
    "method",
    "pages",
    "backing",
    "size",
    "workers",
    "median s",
    "min-max s",
    "GiB/s",
    "vs munmap",
    "vs exit",
    "vs mrelease",
    "vs serial",
];

/// The cells of a row that ran.
fn row_cells(r: &Row) -> [String; 12] {
    let workers = match r.method {
        Method::Exit | Method::Mrelease | Method::VmKill | Method::VmMrelease => "-".to_string(),
        m => m.workers().to_string(),
    };
    [
        r.method.to_string(),
        r.case.pages.to_string(),
        backing_name(r.case.backing).to_string(),
        format!("{} GiB", r.size_gib),
        workers,
        format!("{:.3}", r.summary.median_s),
        format!("{:.3}-{:.3}", r.summary.min_s, r.summary.max_s),
        r.gib_per_s().map_or("-".to_string(), |g| format!("{g:.2}")),
        ratio_text(r.vs_munmap),
        ratio_text(r.vs_exit),
        ratio_text(r.vs_mrelease),
        ratio_text(r.vs_serial),
    ]
}

/// The cells of a method this host cannot run, in a case.
fn unavailable_cells(method: Method, case: Case, size_gib: u64) -> [String; 12] {
    let mut cells = [(); 12].map(|()| "-".to_string());
    cells[0] = method.to_string();
    cells[1] = case.pages.to_string();
    cells[2] = backing_name(case.backing).to_string();
    cells[3] = format!("{size_gib} GiB");
    cells[5] = "unavailable".to_string();
    cells
}

/// The table printed on stdout, with closing lines that say how to read the
/// ratios and why a method is unavailable. Each unavailable method gets a
/// row in every case where its kind ran (the `--vm` ones only with `--vm`).
/// The `vs serial` column is there only when `--live` rows are.
pub fn table(rows: &[Row], unavailable: &[Unavailable]) -> String {
    let columns = if rows.iter().any(|r| r.method.is_live()) {
        12
    } else {
        11
    };
    let mut lines: Vec<[String; 12]> = Vec::with_capacity(rows.len());
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
            .map(|u| u.method)
            .filter(|m| in_case.iter().any(|r| r.method.is_vm() == m.is_vm()))
            .collect();
        let mut pending = in_case.iter().peekable();
        missing.sort();
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
    widths[columns..].fill(0);
    for line in &lines {
        for (w, cell) in widths.iter_mut().zip(line.iter()) {
            *w = (*w).max(cell.len());
        }
    }
    let mut out = String::new();
    let mut push_line = |cells: &[&str]| {
        let mut text = String::new();
        for (i, (cell, w)) in cells.iter().zip(widths.iter()).take(columns).enumerate() {
            if i > 0 {
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
    out.push_str(
        "vs X: median time of X over this median, from the same run (above 1: faster than X); \
         for vm-* rows, exit and mrelease are vm-kill and vm-mrelease; \
         workers are per NUMA node\n",
    );
    if columns == 12 {
        out.push_str(
            "report-* rows: a running guest reports its memory free, timed by the guest from \
             its first report to the last acknowledged; vs serial: report-serial's median \
             over this one\n",
        );
    }
    for u in unavailable {
        let _ = writeln!(out, "{}: unavailable here: {}", u.method, u.reason);
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
        for method in methods {
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
            let _ = writeln!(
                out,
                "  {method} {case}: discard {:.0} MiB/s, {:.0} MiB discarded, \
                 RSS {:.0} -> {:.0} MiB",
                med(&|l| l.discard_bytes_per_s),
                med(&|l| l.discarded_bytes),
                med(&|l| l.rss_before_bytes),
                med(&|l| l.rss_after_bytes),
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Pages;
    use teravm::config::Backing;

    fn sample(method: Method, pages: Pages, run: u32, seconds: f64) -> Sample {
        Sample {
            case: Case {
                pages,
                backing: Backing::Anonymous,
            },
            method,
            size_gib: 8,
            chunk_mib: method.uses_chunks().then_some(1024),
            run,
            seconds,
            reply_ms: None,
            phases: [None; 4],
            live: None,
        }
    }

    fn samples() -> Vec<Sample> {
        let mut v = Vec::new();
        for run in 1..=2 {
            v.push(sample(Method::Munmap, Pages::FourK, run, 2.0));
            v.push(sample(Method::Exit, Pages::FourK, run, 1.0 + run as f64));
            v.push(sample(Method::Mrelease, Pages::FourK, run, 1.0));
            v.push(sample(Method::Teravm(2), Pages::FourK, run, 0.5));
        }
        v.push(sample(Method::Munmap, Pages::Thp, 1, 0.2));
        v.push(sample(Method::Teravm(1), Pages::Thp, 1, 0.1));
        v
    }

    /// `samples()` plus a `--vm` round in the 4k case.
    fn vm_samples() -> Vec<Sample> {
        let mut v = samples();
        v.push(sample(Method::VmKill, Pages::FourK, 1, 3.0));
        v.push(sample(Method::VmMrelease, Pages::FourK, 1, 2.0));
        let mut sync = sample(Method::VmShutdown(2), Pages::FourK, 1, 1.5);
        sync.phases = [Some(1.0), Some(0.5), Some(1400.0), None];
        v.push(sync);
        for (run, ms) in [(1, 0.8), (2, 3.5), (3, 1.0)] {
            let mut a = sample(Method::VmAsync(2), Pages::FourK, run, 1.2);
            a.reply_ms = Some(ms);
            v.push(a);
        }
        v
    }

    #[test]
    fn csv_has_the_header_and_one_row_per_run() {
        let text = csv(&samples());
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], CSV_HEADER);
        assert!(
            CSV_HEADER.starts_with("method,pages,backing,size_gib,workers,chunk_mib,run,seconds,")
        );
        assert_eq!(lines.len(), 1 + 10);
        assert_eq!(
            lines[1],
            "munmap,4k,anonymous,8,1,,1,2.000000,1.0000,1.2500,0.5000,,,,,,,,,,,,,"
        );
        assert_eq!(
            lines[4],
            "teravm-2,4k,anonymous,8,2,1024,1,0.500000,4.0000,5.0000,2.0000,,,,,,,,,,,,,"
        );
        // No exit or mrelease in the THP case: empty ratios, not 4k's.
        assert_eq!(
            lines[10],
            "teravm-1,thp,anonymous,8,1,1024,1,0.100000,2.0000,,,,,,,,,,,,,,,"
        );
        for line in &lines {
            assert_eq!(line.split(',').count(), 24, "{line}");
        }
    }

    #[test]
    fn csv_has_reply_latencies_and_phases_of_the_vm_runs() {
        let text = csv(&vm_samples());
        let row = |prefix: &str| {
            text.lines()
                .find(|l| l.starts_with(prefix))
                .unwrap_or_else(|| panic!("no {prefix} in {text}"))
                .split(',')
                .map(str::to_string)
                .collect::<Vec<_>>()
        };
        let sync = row("vm-teravm-2,");
        // Compared with the microVM killed (3 s) and mrelease'd (2 s).
        assert_eq!((sync[9].as_str(), sync[10].as_str()), ("2.0000", "1.3333"));
        assert_eq!(&sync[15..19], ["1.000", "0.500", "1400.000", ""]);
        let a = row("vm-async-2,4k,anonymous,8,2,1024,2,");
        assert_eq!(&a[11..15], ["3.500", "1.000", "3.500", "3.500"]);
    }

    /// `samples()` plus a `--live` round in the 4k case.
    fn live_samples() -> Vec<Sample> {
        let mut v = samples();
        for (method, seconds) in [
            (Method::ReportSerial, 1.0),
            (Method::ReportTeravm(1), 0.8),
            (Method::ReportTeravm(2), 0.5),
        ] {
            let mut s = sample(method, Pages::FourK, 1, seconds);
            s.chunk_mib = None;
            s.live = Some(crate::model::Live {
                discard_bytes_per_s: 16 << 30,
                discarded_bytes: 8 << 30,
                rss_before_bytes: 9 << 30,
                rss_after_bytes: 1 << 30,
            });
            v.push(s);
        }
        v
    }

    #[test]
    fn live_rows_are_compared_with_serial_only() {
        let text = csv(&live_samples());
        let row = |prefix: &str| {
            text.lines()
                .find(|l| l.starts_with(prefix))
                .unwrap_or_else(|| panic!("no {prefix} in {text}"))
                .split(',')
                .map(str::to_string)
                .collect::<Vec<_>>()
        };
        let serial = row("report-serial,");
        assert_eq!(&serial[4..6], ["0", ""]);
        let t = row("report-teravm-2,");
        // vs munmap (2 s), no kill to compare with, 2x serial.
        assert_eq!(&t[8..11], ["4.0000", "", ""]);
        assert_eq!(
            &t[19..],
            ["2.0000", "16384.0", "8192.0", "9216.0", "1024.0"]
        );
        assert_eq!(row("teravm-2,")[19], "");
        let rows = rows(&live_samples());
        let r = rows
            .iter()
            .find(|r| r.method == Method::ReportTeravm(1))
            .unwrap();
        assert_eq!(r.vs_serial, Some(1.25));
        let table = table(&rows, &[]);
        let lines: Vec<&str> = table.lines().collect();
        assert!(lines[0].ends_with("vs serial"), "{table}");
        let line = lines
            .iter()
            .find(|l| l.starts_with("report-teravm-2"))
            .unwrap();
        assert!(line.ends_with("2.00x"), "{line}");
        assert!(table.contains("report-* rows:"), "{table}");
        let text = live_text(&live_samples());
        assert!(
            text.contains("report-serial 4k anonymous: discard 16384 MiB/s, 8192 MiB discarded, RSS 9216 -> 1024 MiB"),
            "{text}"
        );
        assert_eq!(live_text(&samples()), "");
    }

    #[test]
    fn csv_of_no_runs_is_the_header() {
        assert_eq!(csv(&[]), format!("{CSV_HEADER}\n"));
    }

    #[test]
    fn rows_are_grouped_by_case_with_ratios_to_the_baselines_of_the_case() {
        let rows = rows(&samples());
        let names: Vec<String> = rows
            .iter()
            .map(|r| format!("{} {}", r.method, r.case.pages))
            .collect();
        assert_eq!(
            names,
            [
                "munmap 4k",
                "exit 4k",
                "mrelease 4k",
                "teravm-2 4k",
                "munmap thp",
                "teravm-1 thp"
            ]
        );
        let exit = &rows[1];
        assert_eq!(exit.summary.median_s, 2.5);
        assert_eq!((exit.summary.min_s, exit.summary.max_s), (2.0, 3.0));
        let t = &rows[3];
        assert_eq!(t.vs_munmap, Some(4.0));
        assert_eq!(t.vs_exit, Some(5.0));
        assert_eq!(t.vs_mrelease, Some(2.0));
        assert_eq!(t.gib_per_s(), Some(16.0));
        // The THP case has no exit run: no ratio, rather than one from 4k.
        assert_eq!(rows[5].vs_munmap, Some(2.0));
        assert_eq!(rows[5].vs_exit, None);
        assert_eq!(rows[5].vs_mrelease, None);
    }

    #[test]
    fn vm_rows_are_compared_with_the_microvm_killed() {
        let rows = rows(&vm_samples());
        let sync = rows
            .iter()
            .find(|r| r.method == Method::VmShutdown(2))
            .unwrap();
        assert_eq!(sync.vs_exit, Some(2.0));
        assert_eq!(sync.vs_mrelease, Some(2.0 / 1.5));
        assert_eq!(sync.vs_munmap, Some(2.0 / 1.5));
    }

    #[test]
    fn table_has_a_header_and_a_line_per_row() {
        let text = table(&rows(&samples()), &[]);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("method"));
        assert!(lines[0].ends_with("vs mrelease"));
        assert_eq!(lines.len(), 1 + 6 + 1);
        assert!(lines[4].starts_with("teravm-2"));
        assert!(lines[4].contains("4.00x"));
        assert!(lines[4].contains("5.00x"));
        assert!(lines[4].ends_with("2.00x"));
        assert!(lines[6].ends_with('-'), "{}", lines[6]);
    }

    #[test]
    fn an_unavailable_method_has_a_row_and_a_reason() {
        let mut s = vm_samples();
        s.retain(|s| !matches!(s.method, Method::Mrelease | Method::VmMrelease));
        let unavailable = [Method::Mrelease, Method::VmMrelease].map(|method| Unavailable {
            method,
            reason: "process_mrelease: ENOSYS (Linux < 5.15)".into(),
        });
        let text = table(&rows(&s), &unavailable);
        let lines: Vec<&str> = text.lines().collect();
        let methods: Vec<&str> = lines[1..]
            .iter()
            .map(|l| l.split_whitespace().next().unwrap())
            .collect();
        assert_eq!(
            &methods[..10],
            [
                "munmap",
                "exit",
                "mrelease",
                "teravm-2",
                "vm-kill",
                "vm-mrelease",
                "vm-teravm-2",
                "vm-async-2",
                // The THP case ran no --vm method: no vm-mrelease row there.
                "munmap",
                "mrelease"
            ]
        );
        assert!(lines[3].contains("unavailable"), "{}", lines[3]);
        assert!(text.contains("mrelease: unavailable here: process_mrelease: ENOSYS"));
        assert!(text.contains("vm-mrelease: unavailable here"));
    }

    #[test]
    fn reply_latencies_are_summarised_by_percentile() {
        let text = reply_text(&vm_samples());
        assert!(text.starts_with("async Shutdown reply"), "{text}");
        assert!(
            text.contains(
                "vm-async-2 4k anonymous: p50 1.000 ms, p99 3.500 ms, max 3.500 ms (3 runs)"
            ),
            "{text}"
        );
        assert_eq!(reply_text(&samples()), "");
    }

    #[test]
    fn phases_are_medians_of_what_teravm_reported() {
        let text = phases_text(&vm_samples());
        assert!(
            text.contains("vm-teravm-2 4k anonymous: stop_vcpus 1.0, close_vm 0.5, reclaim 1400.0"),
            "{text}"
        );
        assert!(!text.contains("unmap"), "{text}");
        assert_eq!(phases_text(&samples()), "");
    }
}
