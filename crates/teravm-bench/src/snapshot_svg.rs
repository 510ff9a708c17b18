//! `--snapshot`'s plot: two panels, creates and loads, each a horizontal
//! bar per row (its median, a whisker from the fastest run to the slowest),
//! Firecracker's bars in its colour of the `--peers` plot, teravm's in
//! another (its lazy load lighter); a row that could not run is named with
//! `not possible here`. A pure function from the rows to the text, with
//! [`crate::svg`]'s escaping and axis steps.

use std::fmt::Write as _;

use crate::snapshot_text::{SnapMethod, SnapRow, SnapUnavailable};
use crate::svg::{escape, nice_step};

const WIDTH: f64 = 960.0;
const LABEL_W: f64 = 420.0;
const BAR_W: f64 = 470.0;
const ROW_H: f64 = 24.0;
const TITLE_H: f64 = 56.0;
const PANEL_HEAD: f64 = 28.0;
const AXIS_H: f64 = 34.0;
const MARGIN: f64 = 12.0;

fn colour(method: SnapMethod) -> &'static str {
    match method {
        SnapMethod::CreateFirecracker | SnapMethod::LoadFirecracker => "#66a61e",
        SnapMethod::LoadTeravmLazy => "#6baed6",
        SnapMethod::CreateTeravm(_) | SnapMethod::LoadTeravmEager(_) => "#1f77b4",
    }
}

/// One bar or one missing row in a panel.
enum Line<'a> {
    Ran(&'a SnapRow),
    Missing(&'a SnapUnavailable),
}

fn panel(s: &mut String, y0: f64, title: &str, lines: &[Line<'_>]) -> f64 {
    let _ = writeln!(
        s,
        "<text x=\"{MARGIN}\" y=\"{:.1}\" font-weight=\"bold\">{}</text>",
        y0 + 18.0,
        escape(title)
    );
    let max = lines
        .iter()
        .filter_map(|l| match l {
            Line::Ran(r) => Some(r.summary.max_s),
            Line::Missing(_) => None,
        })
        .fold(0.0f64, f64::max);
    let step = nice_step(max);
    let top = (max / step).ceil().max(1.0) * step;
    let x0 = MARGIN + LABEL_W;
    let sx = |v: f64| x0 + BAR_W * (v / top).clamp(0.0, 1.0);
    let mut y = y0 + PANEL_HEAD;
    for line in lines {
        let (method, guest) = match line {
            Line::Ran(r) => (r.method, r.guest),
            Line::Missing(u) => (u.method, u.guest),
        };
        let _ = writeln!(
            s,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
            x0 - 8.0,
            y + 16.0,
            escape(&format!("{method} ({guest})"))
        );
        match line {
            Line::Ran(r) => {
                let m = r.summary.median_s;
                let _ = writeln!(
                    s,
                    "<rect x=\"{x0:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{:.1}\" \
                     fill=\"{}\"/>",
                    y + 4.0,
                    sx(m) - x0,
                    ROW_H - 8.0,
                    colour(r.method)
                );
                let _ = writeln!(
                    s,
                    "<line x1=\"{:.1}\" y1=\"{:.1}\" x2=\"{:.1}\" y2=\"{:.1}\" stroke=\"#333\"/>",
                    sx(r.summary.min_s),
                    y + ROW_H / 2.0,
                    sx(r.summary.max_s),
                    y + ROW_H / 2.0
                );
                let _ = writeln!(
                    s,
                    "<text x=\"{:.1}\" y=\"{:.1}\">{m:.3} s</text>",
                    sx(r.summary.max_s) + 6.0,
                    y + 16.0
                );
            }
            Line::Missing(_) => {
                let _ = writeln!(
                    s,
                    "<text x=\"{:.1}\" y=\"{:.1}\" fill=\"#888\">not possible here</text>",
                    x0 + 4.0,
                    y + 16.0
                );
            }
        }
        y += ROW_H;
    }
    // The axis: ticks every `step` seconds.
    let _ = writeln!(
        s,
        "<line x1=\"{x0:.1}\" y1=\"{y:.1}\" x2=\"{:.1}\" y2=\"{y:.1}\" stroke=\"#333\"/>",
        x0 + BAR_W
    );
    let mut v = 0.0;
    while v <= top + step / 2.0 {
        let _ = writeln!(
            s,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\" fill=\"#444\">{}</text>",
            sx(v),
            y + 16.0,
            trim(v)
        );
        v += step;
    }
    let _ = writeln!(
        s,
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\" fill=\"#444\">seconds</text>",
        x0 + BAR_W / 2.0,
        y + 30.0
    );
    y + AXIS_H
}

/// An axis label: no trailing zeros.
fn trim(v: f64) -> String {
    let text = format!("{v:.3}");
    text.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// The plot: `title`, the creates' panel, the loads' panel, and `notes`
/// below (how the rows were timed).
pub fn plot(
    rows: &[SnapRow],
    unavailable: &[SnapUnavailable],
    title: &str,
    notes: &[String],
) -> String {
    let lines_of = |create: bool| {
        let mut out: Vec<Line<'_>> = rows
            .iter()
            .filter(|r| r.method.is_create() == create)
            .map(Line::Ran)
            .collect();
        out.extend(
            unavailable
                .iter()
                .filter(|u| u.method.is_create() == create)
                .map(Line::Missing),
        );
        out
    };
    let (creates, loads) = (lines_of(true), lines_of(false));
    let panel_h = |n: usize| PANEL_HEAD + ROW_H * n as f64 + AXIS_H;
    let height =
        TITLE_H + panel_h(creates.len()) + panel_h(loads.len()) + 20.0 * notes.len() as f64 + 20.0;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{height}\" \
         viewBox=\"0 0 {WIDTH} {height}\" font-family=\"sans-serif\" font-size=\"12\">"
    );
    let _ = writeln!(
        s,
        "<rect x=\"0\" y=\"0\" width=\"{WIDTH}\" height=\"{height}\" fill=\"white\"/>"
    );
    let _ = writeln!(
        s,
        "<text x=\"{:.1}\" y=\"26\" text-anchor=\"middle\" font-size=\"16\">{}</text>",
        WIDTH / 2.0,
        escape(title)
    );
    let _ = writeln!(
        s,
        "<text x=\"{:.1}\" y=\"46\" text-anchor=\"middle\" fill=\"#444\">bar: median; whisker: \
         fastest to slowest run; green: Firecracker, blue: teravm (light: lazy load)</text>",
        WIDTH / 2.0
    );
    let y = panel(
        &mut s,
        TITLE_H,
        "PUT /snapshot/create (Full), paused guest, until the answer",
        &creates,
    );
    let y = panel(
        &mut s,
        y,
        "PUT /snapshot/load (File), fresh process: lazy until the guest's first line, eager until the answer",
        &loads,
    );
    for (i, note) in notes.iter().enumerate() {
        let _ = writeln!(
            s,
            "<text x=\"{MARGIN}\" y=\"{:.1}\" fill=\"#444\">{}</text>",
            y + 16.0 + 20.0 * i as f64,
            escape(note)
        );
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot_text::{SnapGuest, UserSys};
    use crate::stats::Summary;

    fn row(method: SnapMethod, median_s: f64) -> SnapRow {
        SnapRow {
            guest: SnapGuest {
                size_gib: 2,
                touch_mib: None,
            },
            method,
            summary: Summary::of(&[median_s / 2.0, median_s, median_s * 2.0]).unwrap(),
            answer_s: Some(median_s),
            first_line_s: None,
            cpu: Some(UserSys::default()),
            file_disk: None,
            resident: None,
            vs_firecracker: None,
        }
    }

    #[test]
    fn the_plot_has_a_bar_per_row_and_names_the_missing() {
        let rows = [
            row(SnapMethod::CreateFirecracker, 16.0),
            row(SnapMethod::CreateTeravm(2), 4.0),
            row(SnapMethod::LoadTeravmLazy, 0.02),
        ];
        let missing = [SnapUnavailable {
            guest: SnapGuest {
                size_gib: 64,
                touch_mib: Some(2048),
            },
            method: SnapMethod::CreateFirecracker,
            reason: "disk".into(),
        }];
        let svg = plot(&rows, &missing, "Snapshots <2 GiB>", &["a & b".into()]);
        assert!(svg.starts_with("<svg "), "{svg}");
        assert!(svg.ends_with("</svg>\n"));
        assert_eq!(svg.matches("<rect ").count(), 1 + rows.len());
        assert!(svg.contains("Snapshots &lt;2 GiB&gt;"));
        assert!(svg.contains("a &amp; b"));
        assert!(svg.contains(">snapshot-create-teravm-2 (2 GiB, all touched)</text>"));
        assert!(svg.contains(">snapshot-load-teravm-lazy (2 GiB, all touched)</text>"));
        assert!(svg.contains("snapshot-create-firecracker (64 GiB, 2048 MiB touched)"));
        assert_eq!(svg.matches("not possible here").count(), 1);
        // The longest create's whisker ends at the axis's end or before.
        assert!(svg.contains(">16.000 s</text>"));
        assert!(svg.contains(">40</text>"));
        assert_eq!(trim(0.05), "0.05");
        assert_eq!(trim(2.0), "2");
    }
}
