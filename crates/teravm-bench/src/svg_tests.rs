//! The tests of `svg.rs`: the plot of made-up rows, checked as text.

use super::*;
use crate::model::{Pages, Sample};
use crate::report::rows;
use teravm::config::Backing;

fn samples(vm: bool) -> Vec<Sample> {
    let mut v = Vec::new();
    for (pages, backing, scale) in [
        (Pages::FourK, Backing::Anonymous, 1.0),
        (Pages::Thp, Backing::Anonymous, 0.1),
        (Pages::FourK, Backing::Memfd, 1.5),
    ] {
        let case = Case { pages, backing };
        let mut methods = vec![
            (Method::Munmap, 2.0),
            (Method::Exit, 1.8),
            (Method::Mrelease, 1.0),
            (Method::Teravm(1), 2.1),
            (Method::Teravm(2), 1.2),
            (Method::Teravm(4), 0.7),
        ];
        if vm {
            methods.extend([
                (Method::VmKill, 3.0),
                (Method::VmMrelease, 2.0),
                (Method::VmShutdown(1), 2.5),
                (Method::VmShutdown(2), 1.6),
                (Method::VmShutdown(4), 1.1),
                (Method::VmAsync(4), 1.2),
            ]);
        }
        for (method, t) in methods {
            v.push(Sample {
                case,
                method,
                size_gib: 8,
                chunk_mib: None,
                run: 1,
                seconds: t * scale,
                reply_ms: None,
                phases: [None; 4],
                live: None,
                resident: None,
                populate_ms: None,
                touched_mib: None,
            });
        }
    }
    v
}

fn well_formed(text: &str) {
    assert!(text.starts_with("<svg"));
    assert!(text.trim_end().ends_with("</svg>"));
    assert!(!text.contains("NaN") && !text.contains("inf"), "{text}");
    assert_eq!(text.matches('<').count(), text.matches('>').count());
    assert_eq!(
        text.matches("<text").count(),
        text.matches("</text>").count()
    );
}

#[test]
fn one_panel_per_case_with_a_line_per_baseline() {
    let text = plot(
        &rows(&samples(false)),
        "reclaim of 8 GiB <test>",
        &["a note".to_string()],
    );
    well_formed(&text);
    // 3 cases x (vs munmap, vs exit, vs mrelease).
    assert_eq!(text.matches("<polyline").count(), 9);
    for case in ["4k anonymous", "thp anonymous", "4k memfd"] {
        assert!(text.contains(&format!(">{case} (munmap ")), "{case}");
    }
    assert!(text.contains("workers per NUMA node"));
    assert!(text.contains("speedup (baseline time / time)"));
    assert!(text.contains("mrelease (vm-mrelease for a microVM)"));
    assert!(text.contains("teravm-w: the executor, in process"));
    assert!(!text.contains("vm-teravm-w"));
    assert!(text.contains(">a note</text>"));
    assert!(text.contains("&lt;test&gt;"));
}

#[test]
fn thp_gets_its_own_scale() {
    // THP is ten times faster in absolute terms but has the same
    // speedups here: its points sit as high in its panel as 4k's in theirs.
    let text = plot(&rows(&samples(false)), "t", &[]);
    let firsts: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("<polyline"))
        .map(|l| {
            l.split("points=\"")
                .nth(1)
                .unwrap()
                .split(' ')
                .next()
                .unwrap()
        })
        .collect();
    let y = |p: &str| p.split(',').nth(1).unwrap().parse::<f64>().unwrap();
    // Panels 0 and 1 (4k and THP anonymous) are side by side.
    assert!((y(firsts[0]) - y(firsts[3])).abs() < 0.5, "{firsts:?}");
}

#[test]
fn vm_methods_are_drawn_dashed_with_async_markers() {
    let text = plot(&rows(&samples(true)), "t", &[]);
    well_formed(&text);
    // Per case: 3 executor lines, vm-teravm vs vm-kill and vs vm-mrelease.
    assert_eq!(text.matches("<polyline").count(), 3 * 5);
    assert_eq!(text.matches("stroke-dasharray=\"7,4\"").count(), 3 * 2 + 1);
    // vm-async against vm-kill and vm-mrelease, in 3 panels, plus legend.
    assert_eq!(text.matches("<polygon").count(), 3 * 2 + 1);
    assert!(text.contains("vm-teravm-w: microVM, sync Shutdown"));
    assert!(text.contains("vm-async-w: microVM, async Shutdown, until exit"));
}

#[test]
fn live_rows_are_drawn_against_serial() {
    let mut v = samples(false);
    let case = v[0].case;
    for (method, t) in [
        (Method::ReportSerial, 1.0),
        (Method::ReportTeravm(1), 0.9),
        (Method::ReportTeravm(2), 0.6),
    ] {
        let mut s = v[0];
        s.case = case;
        s.method = method;
        s.seconds = t;
        v.push(s);
    }
    let text = plot(&rows(&v), "t", &[]);
    well_formed(&text);
    // 3 cases x 3 baselines, plus report-teravm against serial.
    assert_eq!(text.matches("<polyline").count(), 3 * 3 + 1);
    assert!(text.contains("stroke=\"#7570b3\" stroke-width=\"2\" stroke-dasharray=\"2,3\""));
    assert!(text.contains("report-teravm-w: live, guest reports, per-node pool"));
    assert!(text.contains("report-serial (live: balloon thread, madvise per range)"));
}

#[test]
fn peer_rows_are_drawn_against_the_peer() {
    let mut v = samples(false);
    v.retain(|s| s.case.pages == Pages::FourK && s.case.backing == Backing::Anonymous);
    let base = v[0];
    v.clear();
    for (method, t) in [
        (Method::Peer(Peer::Qemu, Stop::Graceful), 0.6),
        (Method::Peer(Peer::Qemu, Stop::Kill), 0.6),
        (Method::VmPrealloc(1), 0.6),
        (Method::VmPrealloc(2), 0.4),
        (Method::VmShutdown(1), 0.7),
        (Method::VmShutdown(2), 0.5),
    ] {
        v.push(Sample {
            method,
            seconds: t,
            ..base
        });
    }
    let text = plot(&rows(&v), "t", &[]);
    well_formed(&text);
    // vm-prealloc-teravm and vm-teravm against qemu-prealloc-quit.
    assert_eq!(text.matches("<polyline").count(), 2);
    // In qemu's colour: the two lines, the two crosses, the legend's line.
    assert_eq!(
        text.matches("stroke=\"#e7298a\" stroke-width=\"2\"")
            .count(),
        2 + 2 + 1
    );
    assert!(
        text.contains(">4k anonymous (qemu-prealloc-quit 0.600 s)</text>"),
        "{text}"
    );
    assert!(text.contains("qemu-prealloc-quit (QEMU, RAM preallocated, QMP quit to exit; "));
    assert!(text.contains("vm-prealloc-teravm-w: microVM, RAM populated, SIGTERM to exit"));
    assert!(!text.contains(">munmap<"), "{text}");
}

#[test]
fn polyline_points_are_ordered_by_workers() {
    let text = plot(&rows(&samples(false)), "t", &[]);
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
    let one: Vec<Sample> = samples(true)
        .into_iter()
        .filter(|s| s.method.workers() == 1 || s.method == Method::VmAsync(4))
        .collect();
    well_formed(&plot(&rows(&one), "t", &[]));
    well_formed(&plot(&[], "t", &[]));
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
