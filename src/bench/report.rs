//! The outputs of a benchmark over its samples: the CSV (one row per run) and
//! the table on stdout (one row per method, page size and backing).

use std::fmt::Write as _;

use super::stats::{gib_per_s, speedup, Summary};
use super::{backing_name, Case, Method, Sample};

/// The header line of the CSV.
pub const CSV_HEADER: &str = "method,pages,backing,size_gib,workers,chunk_mib,run,seconds";

/// The CSV text: the header, then one row per run in the order run. The
/// `chunk_mib` field is empty for the baselines, which have no chunks.
pub fn csv(samples: &[Sample]) -> String {
    let mut out = String::with_capacity(64 * (samples.len() + 1));
    out.push_str(CSV_HEADER);
    out.push('\n');
    for s in samples {
        let chunk = s.chunk_mib.map(|c| c.to_string()).unwrap_or_default();
        let _ = writeln!(
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
    }
    out
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
    /// How many times faster than `exit` in the same case (median over median).
    pub vs_exit: Option<f64>,
}

impl Row {
    /// Throughput of the median run, GiB/s.
    pub fn gib_per_s(&self) -> Option<f64> {
        gib_per_s(self.size_gib << 30, self.summary.median_s)
    }
}

/// Groups the samples into rows: cases in the order first seen, and within a
/// case `munmap`, `exit`, then teravm by worker count.
pub fn rows(samples: &[Sample]) -> Vec<Row> {
    let mut cases: Vec<Case> = Vec::new();
    for s in samples {
        if !cases.contains(&s.case) {
            cases.push(s.case);
        }
    }
    let mut out = Vec::new();
    for case in cases {
        let in_case: Vec<&Sample> = samples.iter().filter(|s| s.case == case).collect();
        let mut methods: Vec<Method> = in_case.iter().map(|s| s.method).collect();
        methods.sort();
        methods.dedup();
        let summary_of = |m: Method| {
            let times: Vec<f64> = in_case
                .iter()
                .filter(|s| s.method == m)
                .map(|s| s.seconds)
                .collect();
            Summary::of(&times)
        };
        let munmap = summary_of(Method::Munmap).map(|s| s.median_s);
        let exit = summary_of(Method::Exit).map(|s| s.median_s);
        // A microVM's "exit" baseline is the same microVM killed.
        let vm_kill = summary_of(Method::VmKill).map(|s| s.median_s);
        for method in methods {
            let exit = match method {
                Method::VmKill | Method::VmShutdown(_) => vm_kill,
                _ => exit,
            };
            let Some(summary) = summary_of(method) else {
                continue;
            };
            let size_gib = in_case
                .iter()
                .find(|s| s.method == method)
                .map_or(0, |s| s.size_gib);
            out.push(Row {
                case,
                method,
                size_gib,
                summary,
                vs_munmap: munmap.and_then(|b| speedup(b, summary.median_s)),
                vs_exit: exit.and_then(|b| speedup(b, summary.median_s)),
            });
        }
    }
    out
}

fn ratio_text(r: Option<f64>) -> String {
    r.map_or_else(|| "-".to_string(), |r| format!("{r:.2}x"))
}

/// The table printed on stdout, with a closing line that says how to read
/// the ratios.
pub fn table(rows: &[Row]) -> String {
    let header = [
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
    ];
    let mut lines: Vec<[String; 10]> = Vec::with_capacity(rows.len());
    for r in rows {
        let workers = match r.method {
            Method::Exit | Method::VmKill => "-".to_string(),
            m => m.workers().to_string(),
        };
        lines.push([
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
        ]);
    }
    let mut widths = header.map(str::len);
    for line in &lines {
        for (w, cell) in widths.iter_mut().zip(line.iter()) {
            *w = (*w).max(cell.len());
        }
    }
    let mut out = String::new();
    let mut push_line = |cells: &[&str]| {
        let mut text = String::new();
        for (i, (cell, w)) in cells.iter().zip(widths.iter()).enumerate() {
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
    push_line(&header);
    for line in &lines {
        let cells: Vec<&str> = line.iter().map(String::as_str).collect();
        push_line(&cells);
    }
    out.push_str(
        "vs X: median time of X over this median, from the same run (above 1: faster than X); \
         workers are per NUMA node\n",
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::Pages;
    use crate::config::Backing;

    fn sample(method: Method, pages: Pages, run: u32, seconds: f64) -> Sample {
        Sample {
            case: Case {
                pages,
                backing: Backing::Anonymous,
            },
            method,
            size_gib: 8,
            chunk_mib: matches!(method, Method::Teravm(_)).then_some(1024),
            run,
            seconds,
        }
    }

    fn samples() -> Vec<Sample> {
        let mut v = Vec::new();
        for run in 1..=2 {
            v.push(sample(Method::Munmap, Pages::FourK, run, 2.0));
            v.push(sample(Method::Exit, Pages::FourK, run, 1.0 + run as f64));
            v.push(sample(Method::Teravm(2), Pages::FourK, run, 0.5));
        }
        v.push(sample(Method::Munmap, Pages::Thp, 1, 0.2));
        v.push(sample(Method::Teravm(1), Pages::Thp, 1, 0.1));
        v
    }

    #[test]
    fn csv_has_the_header_and_one_row_per_run() {
        let text = csv(&samples());
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], CSV_HEADER);
        assert_eq!(lines.len(), 1 + 8);
        assert_eq!(lines[1], "munmap,4k,anonymous,8,1,,1,2.000000");
        assert_eq!(lines[3], "teravm-2,4k,anonymous,8,2,1024,1,0.500000");
        assert_eq!(lines[8], "teravm-1,thp,anonymous,8,1,1024,1,0.100000");
        for line in &lines {
            assert_eq!(line.split(',').count(), 8, "{line}");
        }
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
                "teravm-2 4k",
                "munmap thp",
                "teravm-1 thp"
            ]
        );
        let exit = &rows[1];
        assert_eq!(exit.summary.median_s, 2.5);
        assert_eq!((exit.summary.min_s, exit.summary.max_s), (2.0, 3.0));
        let t = &rows[2];
        assert_eq!(t.vs_munmap, Some(4.0));
        assert_eq!(t.vs_exit, Some(5.0));
        assert_eq!(t.gib_per_s(), Some(16.0));
        // The THP case has no exit run: no ratio, rather than one from 4k.
        assert_eq!(rows[4].vs_munmap, Some(2.0));
        assert_eq!(rows[4].vs_exit, None);
    }

    #[test]
    fn table_has_a_header_and_a_line_per_row() {
        let text = table(&rows(&samples()));
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("method"));
        assert!(lines[0].contains("vs munmap"));
        assert_eq!(lines.len(), 1 + 5 + 1);
        assert!(lines[3].starts_with("teravm-2"));
        assert!(lines[3].contains("4.00x"));
        assert!(lines[3].contains("5.00x"));
        assert!(lines[5].ends_with('-'), "{}", lines[5]);
    }
}
