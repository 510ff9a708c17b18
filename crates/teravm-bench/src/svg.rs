//! The SVG plot: speedup against workers per node, one panel per page size
//! and backing, each with its own y scale (so that THP, freed ten times
//! faster than 4 KiB pages, is not flattened against the axis).
//!
//! In a panel, the colour says which baseline a line is compared with
//! (`munmap`, `exit`/`vm-kill`, `mrelease`/`vm-mrelease`) and the line style
//! says what is measured: solid for teravm's executor in process
//! (`teravm-<w>`), dashed for a microVM end to end (`vm-teravm-<w>`); a
//! triangle marks `vm-async-<w>`; with `--live`, dotted with diamonds,
//! `report-teravm-<w>` against `report-serial` (its own colour: a live
//! reclaim is compared only with the serial one); with `--peers`, in each
//! peer's own colour, `vm-prealloc-teravm-<w>` (dash-dotted, with crosses)
//! and `vm-teravm-<w>` (dashed) against the peer's graceful stop (`vs
//! qemu`). A grey line marks 1x (as fast as the baseline). Written by hand:
//! a pure function from the table rows to the text.

use std::fmt::Write as _;

use crate::model::{Case, Method, Peer, Stop};
use crate::report::Row;

const PANEL_W: f64 = 440.0;
const PANEL_H: f64 = 310.0;
/// Inside a panel: room for the y labels, the title, the x labels.
const PAD_LEFT: f64 = 62.0;
const PAD_RIGHT: f64 = 18.0;
const PAD_TOP: f64 = 34.0;
const PAD_BOTTOM: f64 = 48.0;
const TITLE_H: f64 = 64.0;
const MARGIN: f64 = 10.0;
const LEGEND_ROW_H: f64 = 19.0;
/// The legend's two groups side by side from this width on, else stacked.
const LEGEND_SIDE_BY_SIDE_W: f64 = 800.0;
/// The legend's ink for what is measured (the colour says the baseline).
const INK: &str = "#333";

/// Which baseline a ratio is to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Baseline {
    Munmap,
    Exit,
    Mrelease,
    Serial,
    /// A peer VMM's graceful stop (`qemu-prealloc-quit`).
    Peer(Peer),
}

impl Baseline {
    const ALL: [Baseline; 7] = [
        Baseline::Munmap,
        Baseline::Exit,
        Baseline::Mrelease,
        Baseline::Serial,
        Baseline::Peer(Peer::Qemu),
        Baseline::Peer(Peer::Firecracker),
        Baseline::Peer(Peer::CloudHypervisor),
    ];

    fn colour(self) -> &'static str {
        match self {
            Baseline::Munmap => "#1f77b4",
            Baseline::Exit => "#d95f02",
            Baseline::Mrelease => "#1b9e77",
            Baseline::Serial => "#7570b3",
            Baseline::Peer(Peer::Qemu) => "#e7298a",
            Baseline::Peer(Peer::Firecracker) => "#66a61e",
            Baseline::Peer(Peer::CloudHypervisor) => "#a6761d",
        }
    }

    fn of(self, r: &Row) -> Option<f64> {
        match self {
            Baseline::Munmap => r.vs_munmap,
            Baseline::Exit => r.vs_exit,
            Baseline::Mrelease => r.vs_mrelease,
            Baseline::Serial => r.vs_serial,
            Baseline::Peer(p) => r.vs_peers[p.index()],
        }
    }

    /// The baseline's name for an in-process or a `--vm` method.
    fn label(self) -> &'static str {
        match self {
            Baseline::Munmap => "munmap",
            Baseline::Exit => "exit (vm-kill for a microVM)",
            Baseline::Mrelease => "mrelease (vm-mrelease for a microVM)",
            Baseline::Serial => "report-serial (live: balloon thread, madvise per range)",
            Baseline::Peer(Peer::Qemu) => {
                "qemu-prealloc-quit (QEMU, RAM preallocated, QMP quit to exit; \
                 for vm-guest-teravm-w: qemu-guest-quit)"
            }
            Baseline::Peer(Peer::Firecracker) => {
                "firecracker-guest-ctrlaltdel (Firecracker, test guest, SendCtrlAltDel to exit)"
            }
            Baseline::Peer(Peer::CloudHypervisor) => "cloud-hypervisor-prealloc-stop",
        }
    }

    /// Whether a series of `kind` is drawn against this baseline: the
    /// executor against the in-process baselines, a microVM end to end
    /// against the kills and the peers, the teravm row beside the peers
    /// against the peers, live reclaim against serial.
    fn drawn_for(self, kind: Kind) -> bool {
        match (kind, self) {
            (Kind::Executor, b) => {
                matches!(b, Baseline::Munmap | Baseline::Exit | Baseline::Mrelease)
            }
            (Kind::EndToEnd, b) => {
                matches!(b, Baseline::Exit | Baseline::Mrelease | Baseline::Peer(_))
            }
            (Kind::Async, b) => matches!(b, Baseline::Exit | Baseline::Mrelease),
            (Kind::Live, b) => b == Baseline::Serial,
            (Kind::Prealloc | Kind::Guest, b) => matches!(b, Baseline::Peer(_)),
        }
    }
}

/// What a series plots.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// `teravm-<w>`: a polyline, solid.
    Executor,
    /// `vm-teravm-<w>`: a polyline, dashed.
    EndToEnd,
    /// `vm-async-<w>`: triangles, no line.
    Async,
    /// `report-teravm-<w>`: a polyline, dotted, with diamonds.
    Live,
    /// `vm-prealloc-teravm-<w>`: a polyline, dash-dotted, with crosses.
    Prealloc,
    /// `vm-guest-teravm-<w>`: a polyline, long dashes, with crosses.
    Guest,
}

impl Kind {
    fn of(method: Method) -> Option<(Kind, u32)> {
        match method {
            Method::Teravm(w) => Some((Kind::Executor, w)),
            Method::VmShutdown(w) => Some((Kind::EndToEnd, w)),
            Method::VmAsync(w) => Some((Kind::Async, w)),
            Method::ReportTeravm(w) => Some((Kind::Live, w)),
            Method::VmPrealloc(w) => Some((Kind::Prealloc, w)),
            Method::VmGuestShutdown(w) => Some((Kind::Guest, w)),
            _ => None,
        }
    }

    fn label(self) -> &'static str {
        match self {
            Kind::Executor => "teravm-w: the executor, in process",
            Kind::EndToEnd => "vm-teravm-w: microVM, sync Shutdown",
            Kind::Async => "vm-async-w: microVM, async Shutdown, until exit",
            Kind::Live => "report-teravm-w: live, guest reports, per-node pool",
            Kind::Prealloc => "vm-prealloc-teravm-w: microVM, RAM populated, SIGTERM to exit",
            Kind::Guest => "vm-guest-teravm-w: microVM, test guest touched, Shutdown to exit",
        }
    }

    fn dash(self) -> Option<&'static str> {
        match self {
            Kind::Executor => None,
            Kind::EndToEnd => Some("7,4"),
            Kind::Async => None,
            Kind::Live => Some("2,3"),
            Kind::Prealloc => Some("8,3,2,3"),
            Kind::Guest => Some("12,4"),
        }
    }
}

/// One line (or set of markers) in a panel: (workers, speedup) points.
struct Series {
    kind: Kind,
    baseline: Baseline,
    points: Vec<(u32, f64)>,
}

/// The series of one case, in a fixed order; those without points left out.
fn series(rows: &[Row], case: Case) -> Vec<Series> {
    let mut out = Vec::new();
    for kind in [
        Kind::Executor,
        Kind::EndToEnd,
        Kind::Async,
        Kind::Live,
        Kind::Prealloc,
        Kind::Guest,
    ] {
        for baseline in Baseline::ALL {
            // An end-to-end run against munmap says little: not drawn; a
            // live one is compared with the serial live one only.
            if !baseline.drawn_for(kind) {
                continue;
            }
            let mut points: Vec<(u32, f64)> = rows
                .iter()
                .filter(|r| r.case == case)
                .filter_map(|r| match Kind::of(r.method) {
                    Some((k, w)) if k == kind => {
                        baseline.of(r).filter(|v| v.is_finite()).map(|v| (w, v))
                    }
                    _ => None,
                })
                .collect();
            points.sort_by_key(|p| p.0);
            if !points.is_empty() {
                out.push(Series {
                    kind,
                    baseline,
                    points,
                });
            }
        }
    }
    out
}

/// Escapes text for an XML text node or attribute.
pub fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A round step near `span / 5`: 1, 2 or 5 times a power of ten.
pub fn nice_step(span: f64) -> f64 {
    if !(span.is_finite() && span > 0.0) {
        return 1.0;
    }
    let raw = span / 5.0;
    let power = 10f64.powf(raw.log10().floor());
    let fraction = raw / power;
    let nice = if fraction <= 1.0 {
        1.0
    } else if fraction <= 2.0 {
        2.0
    } else if fraction <= 5.0 {
        5.0
    } else {
        10.0
    };
    nice * power
}

/// A tick label without trailing zeros.
fn trim_number(v: f64) -> String {
    let text = format!("{v:.3}");
    let text = text.trim_end_matches('0').trim_end_matches('.');
    if text.is_empty() {
        "0".to_string()
    } else {
        text.to_string()
    }
}

/// The cases of the rows, in order of first appearance.
fn cases(rows: &[Row]) -> Vec<Case> {
    let mut out: Vec<Case> = Vec::new();
    for r in rows {
        if !out.contains(&r.case) {
            out.push(r.case);
        }
    }
    out
}

/// A marker at (x, y): a circle for the executor, a square end to end, a
/// triangle for async, a diamond live.
fn marker(s: &mut String, kind: Kind, x: f64, y: f64, colour: &str) {
    let _ = match kind {
        Kind::Executor => writeln!(
            s,
            "<circle cx=\"{x:.1}\" cy=\"{y:.1}\" r=\"3.5\" fill=\"{colour}\"/>"
        ),
        Kind::EndToEnd => writeln!(
            s,
            "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"7\" height=\"7\" fill=\"white\" \
             stroke=\"{colour}\" stroke-width=\"1.5\"/>",
            x - 3.5,
            y - 3.5
        ),
        Kind::Async => writeln!(
            s,
            "<polygon points=\"{x:.1},{:.1} {:.1},{:.1} {:.1},{:.1}\" fill=\"white\" \
             stroke=\"{colour}\" stroke-width=\"1.5\"/>",
            y - 5.0,
            x - 4.5,
            y + 3.5,
            x + 4.5,
            y + 3.5
        ),
        Kind::Live => writeln!(
            s,
            "<polygon points=\"{x:.1},{:.1} {:.1},{y:.1} {x:.1},{:.1} {:.1},{y:.1}\" \
             fill=\"{colour}\"/>",
            y - 5.0,
            x + 5.0,
            y + 5.0,
            x - 5.0
        ),
        Kind::Prealloc => writeln!(
            s,
            "<path d=\"M{:.1},{:.1} L{:.1},{:.1} M{:.1},{:.1} L{:.1},{:.1}\" stroke=\"{colour}\" \
             stroke-width=\"2\"/>",
            x - 4.0,
            y - 4.0,
            x + 4.0,
            y + 4.0,
            x - 4.0,
            y + 4.0,
            x + 4.0,
            y - 4.0
        ),
        Kind::Guest => writeln!(
            s,
            "<path d=\"M{x:.1},{:.1} L{x:.1},{:.1} M{:.1},{y:.1} L{:.1},{y:.1}\" \
             stroke=\"{colour}\" stroke-width=\"2\"/>",
            y - 5.0,
            y + 5.0,
            x - 5.0,
            x + 5.0
        ),
    };
}

/// One panel with its top-left corner at (`px`, `py`).
fn panel(s: &mut String, rows: &[Row], case: Case, workers: &[u32], px: f64, py: f64) {
    let all = series(rows, case);
    let y_data = all
        .iter()
        .flat_map(|se| se.points.iter().map(|p| p.1))
        .fold(1.0f64, f64::max);
    let y_step = nice_step(y_data * 1.1);
    let y_max = ((y_data * 1.1 / y_step).ceil()).max(1.0) * y_step;
    let (x0, x1) = (px + PAD_LEFT, px + PANEL_W - PAD_RIGHT);
    let (y0, y1) = (py + PANEL_H - PAD_BOTTOM, py + PAD_TOP);
    // Workers on a log2 scale: 1, 2, 4, 8 ... evenly apart.
    let lx = |w: u32| f64::from(w.max(1)).log2();
    let (mut lo, mut hi) = (lx(workers[0]), lx(workers[workers.len() - 1]));
    if hi - lo < 1e-9 {
        lo -= 0.5;
        hi += 0.5;
    }
    let pad = 0.08 * (x1 - x0);
    let x_of = |w: u32| x0 + pad + (lx(w) - lo) / (hi - lo) * (x1 - x0 - 2.0 * pad);
    let y_of = |v: f64| y0 - (v / y_max) * (y0 - y1);

    // Title: the case and the absolute time of its munmap (or, without,
    // of qemu-prealloc-quit), for scale.
    let quit = Method::Peer(Peer::Qemu, Stop::Graceful);
    let munmap = [Method::Munmap, quit]
        .iter()
        .find_map(|&m| rows.iter().find(|r| r.case == case && r.method == m))
        .map(|r| format!(" ({} {:.3} s)", r.method, r.summary.median_s))
        .unwrap_or_default();
    let _ = writeln!(
        s,
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\" font-size=\"14\" \
         font-weight=\"bold\">{}{}</text>",
        (x0 + x1) / 2.0,
        py + 20.0,
        escape(&case.to_string()),
        escape(&munmap)
    );
    // Grid and y ticks.
    let ticks = (y_max / y_step).round() as u32;
    for i in 0..=ticks {
        let v = f64::from(i) * y_step;
        let y = y_of(v);
        let _ = writeln!(
            s,
            "<line x1=\"{x0:.1}\" y1=\"{y:.1}\" x2=\"{x1:.1}\" y2=\"{y:.1}\" stroke=\"#e6e6e6\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}x</text>",
            x0 - 6.0,
            y + 4.0,
            trim_number(v)
        );
    }
    // 1x: as fast as the baseline.
    let y = y_of(1.0);
    let _ = writeln!(
        s,
        "<line x1=\"{x0:.1}\" y1=\"{y:.1}\" x2=\"{x1:.1}\" y2=\"{y:.1}\" stroke=\"#888\" \
         stroke-width=\"1.2\" stroke-dasharray=\"2,3\"/>"
    );
    let _ = writeln!(
        s,
        "<g stroke=\"black\"><line x1=\"{x0:.1}\" y1=\"{y0:.1}\" x2=\"{x1:.1}\" y2=\"{y0:.1}\"/>\
         <line x1=\"{x0:.1}\" y1=\"{y0:.1}\" x2=\"{x0:.1}\" y2=\"{y1:.1}\"/></g>"
    );
    for &w in workers {
        let x = x_of(w);
        let _ = writeln!(
            s,
            "<line x1=\"{x:.1}\" y1=\"{y0:.1}\" x2=\"{x:.1}\" y2=\"{:.1}\" stroke=\"black\"/>\
             <text x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{w}</text>",
            y0 + 5.0,
            y0 + 19.0
        );
    }
    let _ = writeln!(
        s,
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">workers per NUMA node</text>",
        (x0 + x1) / 2.0,
        y0 + 38.0
    );
    let (lx_, ly_) = (px + 16.0, (y0 + y1) / 2.0);
    let _ = writeln!(
        s,
        "<text x=\"{lx_:.1}\" y=\"{ly_:.1}\" text-anchor=\"middle\" \
         transform=\"rotate(-90 {lx_:.1} {ly_:.1})\">speedup (baseline time / time)</text>"
    );
    for se in &all {
        let colour = se.baseline.colour();
        if se.kind != Kind::Async {
            let coords: Vec<String> = se
                .points
                .iter()
                .map(|&(w, v)| format!("{:.1},{:.1}", x_of(w), y_of(v)))
                .collect();
            let dash = se
                .kind
                .dash()
                .map_or(String::new(), |d| format!(" stroke-dasharray=\"{d}\""));
            let _ = writeln!(
                s,
                "<polyline fill=\"none\" stroke=\"{colour}\" stroke-width=\"2\"{dash} points=\"{}\"/>",
                coords.join(" ")
            );
        }
        for &(w, v) in &se.points {
            marker(s, se.kind, x_of(w), y_of(v), colour);
        }
    }
}

/// One legend entry: a short line (or a marker alone) and its text.
fn legend_entry(s: &mut String, x: f64, y: f64, kind: Kind, colour: &str, text: &str) {
    if kind != Kind::Async {
        let dash = kind
            .dash()
            .map_or(String::new(), |d| format!(" stroke-dasharray=\"{d}\""));
        let _ = writeln!(
            s,
            "<line x1=\"{x:.1}\" y1=\"{y:.1}\" x2=\"{:.1}\" y2=\"{y:.1}\" stroke=\"{colour}\" \
             stroke-width=\"2\"{dash}/>",
            x + 28.0
        );
    }
    marker(s, kind, x + 14.0, y, colour);
    let _ = writeln!(
        s,
        "<text x=\"{:.1}\" y=\"{:.1}\">{}</text>",
        x + 36.0,
        y + 4.0,
        escape(text)
    );
}

/// The plot of the rows as an SVG document: `title` above the panels,
/// `notes` (e.g. that THP memfd is backed by 4 KiB pages here) below the
/// legend.
pub fn plot(rows: &[Row], title: &str, notes: &[String]) -> String {
    let cases = cases(rows);
    let mut workers: Vec<u32> = rows
        .iter()
        .filter_map(|r| Kind::of(r.method).map(|(_, w)| w))
        .collect();
    workers.sort_unstable();
    workers.dedup();
    if workers.is_empty() {
        workers.push(1);
    }
    // The legend: the baselines (colours) and kinds (line styles) drawn.
    let (mut baselines, mut kinds): (Vec<Baseline>, Vec<Kind>) = (Vec::new(), Vec::new());
    for &case in &cases {
        for se in series(rows, case) {
            if !baselines.contains(&se.baseline) {
                baselines.push(se.baseline);
            }
            if !kinds.contains(&se.kind) {
                kinds.push(se.kind);
            }
        }
    }
    baselines.retain(|b| Baseline::ALL.contains(b));
    baselines.sort_by_key(|b| Baseline::ALL.iter().position(|x| x == b));
    let cols = if cases.len() > 1 { 2 } else { 1 };
    let panel_rows = cases.len().div_ceil(cols).max(1);
    let width = MARGIN * 2.0 + PANEL_W * cols as f64;
    let side_by_side = width >= LEGEND_SIDE_BY_SIDE_W;
    let legend_lines = if side_by_side {
        1 + baselines.len().max(kinds.len())
    } else {
        2 + baselines.len() + kinds.len()
    };
    let legend_h = LEGEND_ROW_H * (legend_lines + notes.len()) as f64 + 12.0;
    let height = TITLE_H + PANEL_H * panel_rows as f64 + legend_h + MARGIN;

    let mut s = String::new();
    let _ = writeln!(
        s,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" \
         viewBox=\"0 0 {width} {height}\" font-family=\"sans-serif\" font-size=\"12\">"
    );
    let _ = writeln!(
        s,
        "<rect x=\"0\" y=\"0\" width=\"{width}\" height=\"{height}\" fill=\"white\"/>"
    );
    let _ = writeln!(
        s,
        "<text x=\"{:.1}\" y=\"26\" text-anchor=\"middle\" font-size=\"16\">{}</text>",
        width / 2.0,
        escape(title)
    );
    let _ = writeln!(
        s,
        "<text x=\"{:.1}\" y=\"48\" text-anchor=\"middle\" fill=\"#444\">speedup = median time \
         of the baseline / median time of the method, same run; above 1x: faster</text>",
        width / 2.0
    );
    for (i, &case) in cases.iter().enumerate() {
        let px = MARGIN + PANEL_W * (i % cols) as f64;
        let py = TITLE_H + PANEL_H * (i / cols) as f64;
        panel(&mut s, rows, case, &workers, px, py);
    }
    // Legend: colours (what a line is compared with) and styles (what is
    // measured), side by side or one above the other.
    let ly0 = TITLE_H + PANEL_H * panel_rows as f64 + 8.0;
    let x_left = MARGIN + 20.0;
    let (x_kinds, y_kinds) = if side_by_side {
        (MARGIN + width / 2.0, ly0)
    } else {
        (x_left, ly0 + LEGEND_ROW_H * (1 + baselines.len()) as f64)
    };
    let heading = |s: &mut String, x: f64, y: f64, text: &str| {
        let _ = writeln!(
            s,
            "<text x=\"{x:.1}\" y=\"{:.1}\" font-weight=\"bold\">{text}</text>",
            y + 4.0
        );
    };
    if !baselines.is_empty() {
        heading(&mut s, x_left, ly0, "colour: compared with");
    }
    for (i, b) in baselines.iter().enumerate() {
        let y = ly0 + LEGEND_ROW_H * (i + 1) as f64;
        legend_entry(&mut s, x_left, y, Kind::Executor, b.colour(), b.label());
    }
    if !kinds.is_empty() {
        heading(&mut s, x_kinds, y_kinds, "line: what is measured");
    }
    for (i, k) in kinds.iter().enumerate() {
        let y = y_kinds + LEGEND_ROW_H * (i + 1) as f64;
        legend_entry(&mut s, x_kinds, y, *k, INK, k.label());
    }
    let y_notes = ly0 + LEGEND_ROW_H * legend_lines as f64;
    for (i, note) in notes.iter().enumerate() {
        let _ = writeln!(
            s,
            "<text x=\"{x_left:.1}\" y=\"{:.1}\" fill=\"#444\">{}</text>",
            y_notes + LEGEND_ROW_H * i as f64 + 4.0,
            escape(note)
        );
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
#[path = "svg_tests.rs"]
mod tests;
