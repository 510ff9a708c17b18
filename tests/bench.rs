//! Runs the built `teravm-bench` on 1 GiB, one run per method, and checks
//! its CSV and SVG: every method of every default page size and backing is
//! there, with a positive time. No assertion on speed.

use std::path::PathBuf;
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_teravm-bench");

/// A file path in a fresh directory under the system temp dir.
fn temp_path(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("teravm-bench-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

#[test]
fn one_gib_run_writes_every_row_and_a_plot() {
    let csv = temp_path("bench.csv");
    let svg = temp_path("bench.svg");
    let out = Command::new(BIN)
        .args([
            "--size-gib",
            "1",
            "--runs",
            "1",
            "--workers",
            "1,2",
            "--csv",
        ])
        .arg(&csv)
        .arg("--svg")
        .arg(&svg)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(stdout.starts_with("method"), "{stdout}");

    let text = std::fs::read_to_string(&csv).unwrap();
    let mut lines = text.lines();
    assert_eq!(
        lines.next(),
        Some("method,pages,backing,size_gib,workers,chunk_mib,run,seconds")
    );
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    for row in &rows {
        assert_eq!(row.len(), 8, "{row:?}");
        let seconds: f64 = row[7].parse().unwrap();
        assert!(seconds > 0.0, "{row:?}");
        assert_eq!(row[3], "1");
        assert_eq!(row[6], "1");
    }
    for pages in ["4k", "thp"] {
        for backing in ["anonymous", "memfd"] {
            for method in ["munmap", "exit", "teravm-1", "teravm-2"] {
                let n = rows
                    .iter()
                    .filter(|r| r[0] == method && r[1] == pages && r[2] == backing)
                    .count();
                assert_eq!(n, 1, "{method} {pages} {backing} in\n{text}");
            }
        }
    }
    assert_eq!(rows.len(), 16);

    let plot = std::fs::read_to_string(&svg).unwrap();
    assert!(plot.starts_with("<svg"));
    assert_eq!(plot.matches("<polyline").count(), 4);
    let _ = std::fs::remove_dir_all(csv.parent().unwrap());
}

#[test]
fn bad_input_is_one_line_and_exit_1() {
    for args in [
        &["--workers", "0"][..],
        &["--pages", "huge"],
        &["--chunk-mib", "3"],
        &["--size-gib", "100000"],
        &["--sysfs-root", "/nonexistent", "--size-gib", "1"],
    ] {
        let out = Command::new(BIN).args(args).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{args:?}: {stderr}");
        assert!(stderr.starts_with("teravm-bench: "), "{args:?}: {stderr}");
    }
}

#[test]
fn vm_is_refused_until_the_api_socket_exists() {
    let out = Command::new(BIN).args(["--vm"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--vm"), "{stderr}");
}
