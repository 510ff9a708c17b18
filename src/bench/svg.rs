//! The SVG plot: median time against workers per node, one line (an SVG
//! `polyline`) per page size and backing for teravm, the baselines of the
//! same case as horizontal lines in the same colour (`munmap` dashed, `exit`
//! dotted), labelled axes and a legend. Written by hand: a pure function from
//! the table rows to the text.

use std::fmt::Write as _;

use super::report::Row;
use super::{Case, Method};

const WIDTH: f64 = 820.0;
const HEIGHT: f64 = 500.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 240.0;
const TOP: f64 = 50.0;
const BOTTOM: f64 = 70.0;
const COLOURS: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf",
];
const MUNMAP_DASH: &str = "8,5";
const EXIT_DASH: &str = "2,4";

/// Escapes text for an XML text node or attribute.
fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A round step near `span / 5`: 1, 2 or 5 times a power of ten.
fn nice_step(span: f64) -> f64 {
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

/// The plot of the rows as an SVG document. `title` goes above the plot.
pub fn plot(rows: &[Row], title: &str) -> String {
    let cases = cases(rows);
    let mut workers: Vec<u32> = rows
        .iter()
        .filter_map(|r| match r.method {
            Method::Teravm(w) => Some(w),
            _ => None,
        })
        .collect();
    workers.sort_unstable();
    workers.dedup();
    if workers.is_empty() {
        workers.push(1);
    }
    let y_max_data = rows
        .iter()
        .map(|r| r.summary.median_s)
        .filter(|t| t.is_finite())
        .fold(0.0f64, f64::max);
    let y_step = nice_step(if y_max_data > 0.0 { y_max_data } else { 1.0 });
    let y_max = ((y_max_data / y_step).floor() + 1.0) * y_step;

    // Workers on a log2 scale: 1, 2, 4, 8 ... evenly apart.
    let lx = |w: u32| f64::from(w.max(1)).log2();
    let (mut x_lo, mut x_hi) = (lx(workers[0]), lx(workers[workers.len() - 1]));
    if x_hi - x_lo < 1e-9 {
        x_lo -= 0.5;
        x_hi += 0.5;
    }
    let plot_w = WIDTH - LEFT - RIGHT;
    let plot_h = HEIGHT - TOP - BOTTOM;
    let pad = 0.05 * plot_w;
    let x_of = |w: u32| LEFT + pad + (lx(w) - x_lo) / (x_hi - x_lo) * (plot_w - 2.0 * pad);
    let y_of = |t: f64| TOP + plot_h - (t / y_max) * plot_h;

    let mut s = String::new();
    let _ = writeln!(
        s,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{HEIGHT}\" \
         viewBox=\"0 0 {WIDTH} {HEIGHT}\" font-family=\"sans-serif\" font-size=\"12\">"
    );
    let _ = writeln!(
        s,
        "<rect x=\"0\" y=\"0\" width=\"{WIDTH}\" height=\"{HEIGHT}\" fill=\"white\"/>"
    );
    let _ = writeln!(
        s,
        "<text x=\"{:.1}\" y=\"28\" text-anchor=\"middle\" font-size=\"15\">{}</text>",
        LEFT + plot_w / 2.0,
        escape(title)
    );

    // Axes, grid and ticks.
    let (x0, x1, y0, y1) = (LEFT, LEFT + plot_w, TOP + plot_h, TOP);
    let _ = writeln!(
        s,
        "<g stroke=\"black\"><line x1=\"{x0}\" y1=\"{y0}\" x2=\"{x1}\" y2=\"{y0}\"/>\
         <line x1=\"{x0}\" y1=\"{y0}\" x2=\"{x0}\" y2=\"{y1}\"/></g>"
    );
    let ticks = (y_max / y_step).round() as u32;
    for i in 0..=ticks {
        let t = f64::from(i) * y_step;
        let y = y_of(t);
        let _ = writeln!(
            s,
            "<line x1=\"{x0}\" y1=\"{y:.1}\" x2=\"{x1}\" y2=\"{y:.1}\" stroke=\"#e0e0e0\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
            x0 - 6.0,
            y + 4.0,
            trim_number(t)
        );
    }
    for &w in &workers {
        let x = x_of(w);
        let _ = writeln!(
            s,
            "<line x1=\"{x:.1}\" y1=\"{y0}\" x2=\"{x:.1}\" y2=\"{:.1}\" stroke=\"black\"/>\
             <text x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{w}</text>",
            y0 + 5.0,
            y0 + 20.0
        );
    }
    let _ = writeln!(
        s,
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">workers per NUMA node (log scale)</text>",
        LEFT + plot_w / 2.0,
        HEIGHT - 25.0
    );
    let _ = writeln!(
        s,
        "<text x=\"20\" y=\"{:.1}\" text-anchor=\"middle\" transform=\"rotate(-90 20 {:.1})\">\
         median time to free (s)</text>",
        TOP + plot_h / 2.0,
        TOP + plot_h / 2.0
    );

    // Series and baselines.
    let mut legend: Vec<(String, &str, Option<&str>)> = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        let mut points: Vec<(u32, f64)> = rows
            .iter()
            .filter(|r| r.case == *case)
            .filter_map(|r| match r.method {
                Method::Teravm(w) => Some((w, r.summary.median_s)),
                _ => None,
            })
            .collect();
        points.sort_by_key(|p| p.0);
        let coords: Vec<String> = points
            .iter()
            .map(|&(w, t)| format!("{:.1},{:.1}", x_of(w), y_of(t)))
            .collect();
        let _ = writeln!(
            s,
            "<polyline fill=\"none\" stroke=\"{colour}\" stroke-width=\"2\" points=\"{}\"/>",
            coords.join(" ")
        );
        for &(w, t) in &points {
            let _ = writeln!(
                s,
                "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3.5\" fill=\"{colour}\"/>",
                x_of(w),
                y_of(t)
            );
        }
        legend.push((format!("teravm, {case}"), colour, None));
        for (method, dash) in [(Method::Munmap, MUNMAP_DASH), (Method::Exit, EXIT_DASH)] {
            if let Some(r) = rows.iter().find(|r| r.case == *case && r.method == method) {
                let y = y_of(r.summary.median_s);
                let _ = writeln!(
                    s,
                    "<line x1=\"{x0}\" y1=\"{y:.1}\" x2=\"{x1}\" y2=\"{y:.1}\" stroke=\"{colour}\" \
                     stroke-width=\"1.5\" stroke-dasharray=\"{dash}\"/>"
                );
                legend.push((format!("{method}, {case}"), colour, Some(dash)));
            }
        }
    }

    // Legend, right of the plot.
    let lx0 = LEFT + plot_w + 20.0;
    for (i, (label, colour, dash)) in legend.iter().enumerate() {
        let y = TOP + 10.0 + 20.0 * i as f64;
        let dash_attr = dash.map_or(String::new(), |d| format!(" stroke-dasharray=\"{d}\""));
        let _ = writeln!(
            s,
            "<line x1=\"{lx0}\" y1=\"{y:.1}\" x2=\"{:.1}\" y2=\"{y:.1}\" stroke=\"{colour}\" \
             stroke-width=\"2\"{dash_attr}/><text x=\"{:.1}\" y=\"{:.1}\">{}</text>",
            lx0 + 30.0,
            lx0 + 36.0,
            y + 4.0,
            escape(label)
        );
    }
    s.push_str("</svg>\n");
    s
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::report::rows;
    use crate::bench::{Pages, Sample};
    use crate::config::Backing;

    fn samples() -> Vec<Sample> {
        let mut v = Vec::new();
        for (pages, backing, scale) in [
            (Pages::FourK, Backing::Anonymous, 1.0),
            (Pages::Thp, Backing::Anonymous, 0.1),
            (Pages::FourK, Backing::Memfd, 1.5),
        ] {
            let case = Case { pages, backing };
            for (method, t) in [
                (Method::Munmap, 2.0),
                (Method::Exit, 1.8),
                (Method::Teravm(1), 2.1),
                (Method::Teravm(2), 1.2),
                (Method::Teravm(4), 0.7),
            ] {
                v.push(Sample {
                    case,
                    method,
                    size_gib: 8,
                    chunk_mib: None,
                    run: 1,
                    seconds: t * scale,
                });
            }
        }
        v
    }

    #[test]
    fn plot_is_an_svg_document_with_one_polyline_per_series() {
        let text = plot(&rows(&samples()), "reclaim of 8 GiB <test>");
        assert!(text.starts_with("<svg"));
        assert!(text.trim_end().ends_with("</svg>"));
        assert_eq!(text.matches("<polyline").count(), 3);
        // Two baselines per series, dashed.
        assert_eq!(
            text.matches(&format!("stroke-dasharray=\"{MUNMAP_DASH}\""))
                .count(),
            3 * 2, // the line and its legend entry
        );
        assert!(text.contains("workers per NUMA node"));
        assert!(text.contains("median time to free (s)"));
        assert!(text.contains("teravm, thp anonymous"));
        assert!(text.contains("&lt;test&gt;"));
        // Every element opened is closed: a crude well-formedness check.
        assert_eq!(text.matches('<').count(), text.matches('>').count());
        assert_eq!(
            text.matches("<text").count(),
            text.matches("</text>").count()
        );
    }

    #[test]
    fn polyline_points_are_ordered_by_workers() {
        let text = plot(&rows(&samples()), "t");
        let line = text.lines().find(|l| l.starts_with("<polyline")).unwrap();
        let points = line.split("points=\"").nth(1).unwrap();
        let xs: Vec<f64> = points
            .trim_end_matches("\"/>")
            .split(' ')
            .map(|p| p.split(',').next().unwrap().parse().unwrap())
            .collect();
        assert_eq!(xs.len(), 3);
        assert!(xs.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn plot_of_a_single_worker_count_or_no_rows_is_still_a_document() {
        let one: Vec<Sample> = samples()
            .into_iter()
            .filter(|s| s.method.workers() == 1)
            .collect();
        let text = plot(&rows(&one), "t");
        assert!(text.starts_with("<svg"));
        assert_eq!(text.matches("<polyline").count(), 3);
        assert!(!text.contains("NaN"));
        let empty = plot(&[], "t");
        assert!(empty.starts_with("<svg"));
        assert!(!empty.contains("NaN"));
    }

    #[test]
    fn nice_steps() {
        assert_eq!(nice_step(10.0), 2.0);
        assert_eq!(nice_step(2.3), 0.5);
        assert_eq!(nice_step(0.0), 1.0);
        assert_eq!(trim_number(0.5), "0.5");
        assert_eq!(trim_number(2.0), "2");
        assert_eq!(trim_number(0.0), "0");
    }
}
