//! Runs the built `teravm-bench` on 1 GiB, one run per method, and checks
//! its CSV and SVG: every method of every default page size and backing is
//! there, with a positive time. No assertion on speed.

use std::path::PathBuf;
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_teravm-bench");

/// A fresh directory under the system temp dir, one per test.
fn temp_dir(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("teravm-bench-test-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn one_gib_run_writes_every_row_and_a_plot() {
    let dir = temp_dir("rows");
    let csv = dir.join("bench.csv");
    let svg = dir.join("bench.svg");
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
    let _ = std::fs::remove_dir_all(&dir);
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
fn vm_runs_a_real_microvm_killed_and_shut_down() {
    if let Err(e) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
    {
        eprintln!("SKIPPED vm_runs_a_real_microvm: /dev/kvm is not usable here ({e})");
        return;
    }
    let dir = temp_dir("vm");
    let csv = dir.join("bench.csv");
    let out = Command::new(BIN)
        .args([
            "--size-gib",
            "1",
            "--runs",
            "1",
            "--workers",
            "2",
            "--pages",
            "thp",
            "--backing",
            "anonymous",
            "--vm",
            "--csv",
        ])
        .arg(&csv)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    let text = std::fs::read_to_string(&csv).unwrap();
    for method in ["vm-kill", "vm-teravm-2"] {
        let row = text
            .lines()
            .find(|l| l.starts_with(&format!("{method},thp,anonymous,1,")))
            .unwrap_or_else(|| panic!("no {method} row in {text}"));
        let seconds: f64 = row.rsplit(',').next().unwrap().parse().unwrap();
        assert!(seconds > 0.0, "{row}");
    }
    let table_row = stdout
        .lines()
        .find(|l| l.starts_with("vm-teravm-2"))
        .unwrap_or_else(|| panic!("{stdout}"));
    // Compared with the same microVM killed, from the same run.
    assert!(table_row.trim_end().ends_with('x'), "{table_row}");
}

#[test]
fn a_multi_node_host_gets_per_node_results() {
    // A fake two-node sysfs tree; the host may lack node 1, so the bench
    // leaves placement to the kernel, but the executor still runs per node.
    let dir = temp_dir("nodes");
    let root = dir.join("sys");
    for node in 0..2 {
        let dir = root.join(format!("devices/system/node/node{node}"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("cpulist"), "0\n").unwrap();
        std::fs::write(
            dir.join("meminfo"),
            format!("Node {node} MemTotal:       4000000 kB\n"),
        )
        .unwrap();
    }
    std::fs::write(root.join("devices/system/node/online"), "0-1\n").unwrap();
    let out = Command::new(BIN)
        .args(["--size-gib", "1", "--runs", "1", "--workers", "1"])
        .args(["--pages", "thp", "--backing", "anonymous", "--sysfs-root"])
        .arg(&root)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    let line = stdout
        .lines()
        .find(|l| l.trim_start().starts_with("teravm-1 thp anonymous:"))
        .unwrap_or_else(|| panic!("no per-node line in\n{stdout}"));
    assert!(
        line.contains("node 0: ") && line.contains("node 1: "),
        "{line}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
