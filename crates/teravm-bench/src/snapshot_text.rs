//! `--snapshot`'s vocabulary and its outputs: the rows' names
//! (`snapshot-create-firecracker`, `snapshot-create-teravm-<w>`,
//! `snapshot-load-firecracker`, `snapshot-load-teravm-lazy`,
//! `snapshot-load-teravm-eager-<w>`), the guest a row ran (its size and
//! what it touched), one timed run, the medians per row, the table, the
//! CSV, and the CPU time of a process read from its `stat` line. Pure
//! functions over values; the runs are [`crate::snapshot`]'s, the plot
//! [`crate::snapshot_svg`]'s.

use std::fmt::{self, Write as _};

use crate::stats::{median, speedup, Summary};

/// The test guest's tick period in the snapshot rows, ms: a load is timed
/// until its first `tick` after resume, at most this late.
pub const TICK_MS: u64 = 1;

/// A row of `--snapshot`. The order of the variants is the table's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SnapMethod {
    /// Firecracker's `PUT /snapshot/create` (Full) of its paused guest.
    CreateFirecracker,
    /// teravm's, written by `w` workers per node.
    CreateTeravm(u32),
    /// A fresh Firecracker's `PUT /snapshot/load` (File, resume), timed
    /// until the guest's first line after resume.
    LoadFirecracker,
    /// A fresh teravm's, the same way (`MAP_PRIVATE` of the file).
    LoadTeravmLazy,
    /// A fresh teravm's with `"memory_load": "Eager"` (`w` workers per
    /// node read the file in before the guest runs), timed until its answer.
    LoadTeravmEager(u32),
}

impl SnapMethod {
    /// Whether this is a create.
    pub fn is_create(self) -> bool {
        matches!(
            self,
            SnapMethod::CreateFirecracker | SnapMethod::CreateTeravm(_)
        )
    }

    /// Whether this is one of Firecracker's rows.
    pub fn is_firecracker(self) -> bool {
        matches!(
            self,
            SnapMethod::CreateFirecracker | SnapMethod::LoadFirecracker
        )
    }

    /// Workers per node, for teravm's rows that have them.
    pub fn workers(self) -> Option<u32> {
        match self {
            SnapMethod::CreateTeravm(w) | SnapMethod::LoadTeravmEager(w) => Some(w),
            _ => None,
        }
    }

    /// Firecracker's row of the same kind (`vs firecracker`).
    pub fn firecracker_row(self) -> SnapMethod {
        if self.is_create() {
            SnapMethod::CreateFirecracker
        } else {
            SnapMethod::LoadFirecracker
        }
    }
}

impl fmt::Display for SnapMethod {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SnapMethod::CreateFirecracker => f.write_str("snapshot-create-firecracker"),
            SnapMethod::CreateTeravm(w) => write!(f, "snapshot-create-teravm-{w}"),
            SnapMethod::LoadFirecracker => f.write_str("snapshot-load-firecracker"),
            SnapMethod::LoadTeravmLazy => f.write_str("snapshot-load-teravm-lazy"),
            SnapMethod::LoadTeravmEager(w) => write!(f, "snapshot-load-teravm-eager-{w}"),
        }
    }
}

/// The methods of one round for `workers`: Firecracker's (when it runs),
/// then teravm's create and eager load at each count, and its lazy load.
pub fn snapshot_methods(firecracker: bool, workers: &[u32]) -> Vec<SnapMethod> {
    let mut out = Vec::new();
    if firecracker {
        out.extend([SnapMethod::CreateFirecracker, SnapMethod::LoadFirecracker]);
    }
    out.extend(workers.iter().map(|&w| SnapMethod::CreateTeravm(w)));
    out.push(SnapMethod::LoadTeravmLazy);
    out.extend(workers.iter().map(|&w| SnapMethod::LoadTeravmEager(w)));
    out.sort();
    out
}

/// The guest a snapshot row ran: its RAM, and what it touched before the
/// pause (`None`: all of it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapGuest {
    /// Guest RAM, GiB.
    pub size_gib: u64,
    /// `touch=<MiB>`, or `None` for `touch=all`.
    pub touch_mib: Option<u64>,
}

impl SnapGuest {
    /// The test guest's command line: touch, then tick forever.
    pub fn boot_args(self) -> String {
        match self.touch_mib {
            Some(mib) => format!("touch={mib} tick={TICK_MS}"),
            None => format!("touch=all tick={TICK_MS}"),
        }
    }

    /// Bytes of the memory file Firecracker writes: all of RAM.
    pub fn full_bytes(self) -> u64 {
        self.size_gib << 30
    }

    /// Bytes of teravm's sparse file: what the guest touched (all of RAM
    /// for `touch=all`).
    pub fn touched_bytes(self) -> u64 {
        self.touch_mib.map_or(self.full_bytes(), |m| m << 20)
    }
}

impl fmt::Display for SnapGuest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.touch_mib {
            Some(mib) => write!(f, "{} GiB, {mib} MiB touched", self.size_gib),
            None => write!(f, "{} GiB, all touched", self.size_gib),
        }
    }
}

/// CPU seconds of a process over a timed part, all its threads.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct UserSys {
    /// User time.
    pub user_s: f64,
    /// System time.
    pub sys_s: f64,
}

/// utime and stime, in clock ticks, of a `/proc/<pid>/stat` line.
pub fn parse_user_sys(line: &str) -> Option<(u64, u64)> {
    let close = line.rfind(')')?;
    // After "(comm) ": state is field 3; utime and stime are 14 and 15.
    let mut f = line.get(close + 2..)?.split_whitespace().skip(11);
    Some((f.next()?.parse().ok()?, f.next()?.parse().ok()?))
}

/// The memory file a create wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileSize {
    /// Its length (`st_size`).
    pub len: u64,
    /// What it holds on disk (`st_blocks` × 512).
    pub disk: u64,
}

/// One timed run of a snapshot row.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SnapSample {
    /// The guest.
    pub guest: SnapGuest,
    /// The row.
    pub method: SnapMethod,
    /// Run number, from 1.
    pub run: u32,
    /// The row's time: a create's answer, a lazy load's first guest line,
    /// an eager load's answer.
    pub seconds: f64,
    /// From the request until its answer.
    pub answer_s: f64,
    /// Loads: from the request until the guest's first line after resume.
    pub first_line_s: Option<f64>,
    /// The VMM process's CPU time over the timed part.
    pub cpu: UserSys,
    /// Creates: the memory file.
    pub file: Option<FileSize>,
    /// Loads: the VMM's resident size (VmRSS) at the guest's first line
    /// (eager: at the answer).
    pub resident_bytes: Option<u64>,
    /// The MiB the guest said it touched before the snapshot.
    pub touched_mib: u64,
}

/// A row this host cannot run, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapUnavailable {
    /// The guest.
    pub guest: SnapGuest,
    /// The row.
    pub method: SnapMethod,
    /// Why, in a few words.
    pub reason: String,
}

/// One row of the table: medians over the runs of a method and guest.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SnapRow {
    /// The guest.
    pub guest: SnapGuest,
    /// The row.
    pub method: SnapMethod,
    /// Median and range of the row's time.
    pub summary: Summary,
    /// Median time until the answer.
    pub answer_s: Option<f64>,
    /// Median time until the guest's first line (loads).
    pub first_line_s: Option<f64>,
    /// Median CPU time of the VMM process.
    pub cpu: Option<UserSys>,
    /// Median memory file on disk, bytes (creates).
    pub file_disk: Option<f64>,
    /// Median resident size at the first line, bytes (loads).
    pub resident: Option<f64>,
    /// Firecracker's row of the same kind and guest, its median over this.
    pub vs_firecracker: Option<f64>,
}

fn median_of(samples: &[&SnapSample], f: impl Fn(&SnapSample) -> Option<f64>) -> Option<f64> {
    median(&samples.iter().filter_map(|s| f(s)).collect::<Vec<_>>())
}

/// The guests of the samples, in the order first seen.
pub fn guests_of(samples: &[SnapSample]) -> Vec<SnapGuest> {
    let mut out: Vec<SnapGuest> = Vec::new();
    for s in samples {
        if !out.contains(&s.guest) {
            out.push(s.guest);
        }
    }
    out
}

/// The rows: guests in the order first seen, methods in [`SnapMethod`]'s.
pub fn rows(samples: &[SnapSample]) -> Vec<SnapRow> {
    let mut out = Vec::new();
    for guest in guests_of(samples) {
        let of_guest: Vec<&SnapSample> = samples.iter().filter(|s| s.guest == guest).collect();
        let median_s =
            |m: SnapMethod| median_of(&of_guest, |s| (s.method == m).then_some(s.seconds));
        let mut methods: Vec<SnapMethod> = of_guest.iter().map(|s| s.method).collect();
        methods.sort();
        methods.dedup();
        for method in methods {
            let of: Vec<&SnapSample> = of_guest
                .iter()
                .copied()
                .filter(|s| s.method == method)
                .collect();
            let times: Vec<f64> = of.iter().map(|s| s.seconds).collect();
            let Some(summary) = Summary::of(&times) else {
                continue;
            };
            let cpu = median_of(&of, |s| Some(s.cpu.user_s))
                .zip(median_of(&of, |s| Some(s.cpu.sys_s)))
                .map(|(user_s, sys_s)| UserSys { user_s, sys_s });
            let vs_firecracker = (!method.is_firecracker())
                .then(|| median_s(method.firecracker_row()))
                .flatten()
                .and_then(|fc| speedup(fc, summary.median_s));
            out.push(SnapRow {
                guest,
                method,
                summary,
                answer_s: median_of(&of, |s| Some(s.answer_s)),
                first_line_s: median_of(&of, |s| s.first_line_s),
                cpu,
                file_disk: median_of(&of, |s| s.file.map(|f| f.disk as f64)),
                resident: median_of(&of, |s| s.resident_bytes.map(|b| b as f64)),
                vs_firecracker,
            });
        }
    }
    out
}

const MIB: f64 = (1u64 << 20) as f64;

const HEADER: [&str; 10] = [
    "method",
    "guest",
    "workers",
    "median s",
    "min-max s",
    "answer s",
    "first line s",
    "cpu user/sys s",
    "file on disk",
    "vs firecracker",
];

fn secs(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_string(), |v| format!("{v:.4}"))
}

fn row_cells(r: &SnapRow) -> [String; 10] {
    let mib = |v: Option<f64>| v.map_or_else(|| "-".to_string(), |b| format!("{:.0} MiB", b / MIB));
    [
        r.method.to_string(),
        r.guest.to_string(),
        r.method
            .workers()
            .map_or_else(|| "-".to_string(), |w| w.to_string()),
        format!("{:.4}", r.summary.median_s),
        format!("{:.4}-{:.4}", r.summary.min_s, r.summary.max_s),
        secs(r.answer_s),
        secs(r.first_line_s),
        r.cpu.map_or_else(
            || "-".to_string(),
            |c| format!("{:.2}/{:.2}", c.user_s, c.sys_s),
        ),
        mib(r.file_disk),
        r.vs_firecracker
            .map_or_else(|| "-".to_string(), |v| format!("{v:.2}x")),
    ]
}

fn unavailable_cells(u: &SnapUnavailable) -> [String; 10] {
    let mut cells = [(); 10].map(|()| "-".to_string());
    cells[0] = u.method.to_string();
    cells[1] = u.guest.to_string();
    if let Some(w) = u.method.workers() {
        cells[2] = w.to_string();
    }
    cells[3] = "not possible".to_string();
    cells
}

/// The table: one line per row and per row that could not run (in the
/// order of the guests, then of [`SnapMethod`]), then how to read it and
/// why each missing row is missing (`not possible here: <why>`).
pub fn table(rows: &[SnapRow], unavailable: &[SnapUnavailable]) -> String {
    let mut guests: Vec<SnapGuest> = rows.iter().map(|r| r.guest).collect();
    guests.extend(unavailable.iter().map(|u| u.guest));
    let mut seen: Vec<SnapGuest> = Vec::new();
    guests.retain(|g| {
        let first = !seen.contains(g);
        seen.push(*g);
        first
    });
    let mut lines: Vec<(SnapMethod, [String; 10])> = Vec::new();
    for guest in guests {
        let mut of_guest: Vec<(SnapMethod, [String; 10])> = rows
            .iter()
            .filter(|r| r.guest == guest)
            .map(|r| (r.method, row_cells(r)))
            .collect();
        of_guest.extend(
            unavailable
                .iter()
                .filter(|u| u.guest == guest)
                .map(|u| (u.method, unavailable_cells(u))),
        );
        of_guest.sort_by_key(|(m, _)| *m);
        of_guest.dedup_by_key(|(m, _)| *m);
        lines.extend(of_guest);
    }
    let shown_fc = rows.iter().any(|r| r.vs_firecracker.is_some());
    let mut widths = HEADER.map(str::len);
    for (_, cells) in &lines {
        for (w, c) in widths.iter_mut().zip(cells) {
            *w = (*w).max(c.len());
        }
    }
    let mut out = String::new();
    let mut push = |cells: &[&str]| {
        let mut text = String::new();
        for (i, (cell, w)) in cells.iter().zip(widths).enumerate() {
            if i == 9 && !shown_fc {
                continue;
            }
            if i > 0 {
                text.push_str("  ");
            }
            if i < 2 {
                let _ = write!(text, "{cell:<w$}");
            } else {
                let _ = write!(text, "{cell:>w$}");
            }
        }
        out.push_str(text.trim_end());
        out.push('\n');
    };
    push(&HEADER);
    for (_, cells) in &lines {
        push(&cells.each_ref().map(String::as_str));
    }
    out.push_str(
        "snapshot-create-*: the paused guest (PATCH /vm Paused), timed from PUT /snapshot/create \
         (Full) until its answer; file on disk: the memory file's st_blocks*512\n",
    );
    let _ = writeln!(
        out,
        "snapshot-load-*: a fresh process, timed from PUT /snapshot/load (File, resume_vm) until \
         the guest's first line after resume (tick={TICK_MS}), eager rows until the answer (all \
         pages in); answer s: until the answer; the memory file was just written (in the page \
         cache); cpu: the VMM process's user/sys seconds over the timed part \
         (/proc/<pid>/stat)"
    );
    if shown_fc {
        out.push_str(
            "vs firecracker: Firecracker's median of the same kind (create, load) and guest over \
             this median (above 1: faster than Firecracker)\n",
        );
    }
    let mut said: Vec<String> = Vec::new();
    for u in unavailable {
        let line = format!(
            "{} ({}): not possible here: {}",
            u.method, u.guest, u.reason
        );
        if !said.contains(&line) {
            let _ = writeln!(out, "{line}");
            said.push(line);
        }
    }
    out
}

/// Below the table: the loads' resident size at the first line (median),
/// what a lazy load has brought in against an eager one.
pub fn resident_text(rows: &[SnapRow]) -> String {
    let mut out = String::new();
    for r in rows.iter().filter(|r| r.resident.is_some()) {
        if out.is_empty() {
            out.push_str(
                "resident after the load (median VmRSS; lazy: at the guest's first line, eager: \
                 at the answer):\n",
            );
        }
        let _ = writeln!(
            out,
            "  {} ({}): {:.0} MiB",
            r.method,
            r.guest,
            r.resident.unwrap_or(0.0) / MIB
        );
    }
    out
}

/// The CSV header.
pub const CSV_HEADER: &str = "method,size_gib,touch_mib,touched_mib,workers,run,seconds,answer_s,\
first_line_s,user_s,sys_s,file_bytes,file_disk_bytes,resident_mib";

/// The CSV: one line per run (`touch_mib` empty for `touch=all`).
pub fn csv(samples: &[SnapSample]) -> String {
    let mut out = format!("{CSV_HEADER}\n");
    let opt = |v: Option<String>| v.unwrap_or_default();
    for s in samples {
        let _ = writeln!(
            out,
            "{},{},{},{},{},{},{:.6},{:.6},{},{:.2},{:.2},{},{},{}",
            s.method,
            s.guest.size_gib,
            opt(s.guest.touch_mib.map(|m| m.to_string())),
            s.touched_mib,
            opt(s.method.workers().map(|w| w.to_string())),
            s.run,
            s.seconds,
            s.answer_s,
            opt(s.first_line_s.map(|v| format!("{v:.6}"))),
            s.cpu.user_s,
            s.cpu.sys_s,
            opt(s.file.map(|f| f.len.to_string())),
            opt(s.file.map(|f| f.disk.to_string())),
            opt(s.resident_bytes.map(|b| format!("{:.1}", b as f64 / MIB))),
        );
    }
    out
}

#[cfg(test)]
#[path = "snapshot_text_tests.rs"]
mod tests;
