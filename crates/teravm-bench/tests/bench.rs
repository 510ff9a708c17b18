//! Runs the built `teravm-bench` on 1 GiB, one run per method, and checks
//! its table, CSV and SVG: every method of every page size and backing is
//! there with a positive time, or marked unavailable where this kernel lacks
//! it (`process_mrelease`). No assertion on speed.

mod common;

use std::process::Command;

use common::{kvm_or_skip, temp_dir};

const BIN: &str = env!("CARGO_BIN_EXE_teravm-bench");

/// The CSV's header: the eight columns of earlier versions first.
const CSV_HEADER: &str = "method,pages,backing,size_gib,workers,chunk_mib,run,seconds,\
vs_munmap,vs_exit,vs_mrelease,reply_ms,reply_p50_ms,reply_p99_ms,reply_max_ms,\
stop_vcpus_ms,close_vm_ms,reclaim_ms,unmap_ms,\
vs_serial,discard_mib_per_s,discarded_mib,rss_before_mib,rss_after_mib,\
vs_qemu,vs_firecracker,vs_cloud_hypervisor,resident_mib,huge_mib,populate_ms,touched_mib,\
vcpu_cpu_s,discard_cpu_s,device_cpu_s";

/// The CSV's rows, each checked: every column there, a positive time, the
/// size and run asked for.
fn csv_rows(text: &str) -> Vec<Vec<String>> {
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some(CSV_HEADER));
    let rows: Vec<Vec<String>> = lines
        .map(|l| l.split(',').map(str::to_string).collect())
        .collect();
    for row in &rows {
        assert_eq!(row.len(), 34, "{row:?}");
        let seconds: f64 = row[7].parse().unwrap();
        assert!(seconds > 0.0, "{row:?}");
        assert_eq!((row[3].as_str(), row[6].as_str()), ("1", "1"), "{row:?}");
        for field in &row[8..] {
            assert!(field.is_empty() || field.parse::<f64>().is_ok(), "{row:?}");
        }
    }
    rows
}

/// Whether the table marks `method` unavailable, with the reason below it.
fn marked_unavailable(stdout: &str, method: &str) -> bool {
    stdout
        .lines()
        .any(|l| l.split_whitespace().next() == Some(method) && l.contains("unavailable"))
        && stdout.contains(&format!("{method}: unavailable here: "))
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
    assert!(
        stdout.lines().next().unwrap().ends_with("vs mrelease"),
        "{stdout}"
    );

    let text = std::fs::read_to_string(&csv).unwrap();
    let rows = csv_rows(&text);
    let mrelease = !marked_unavailable(&stdout, "mrelease");
    let mut methods = vec!["munmap", "exit", "teravm-1", "teravm-2"];
    if mrelease {
        methods.push("mrelease");
    }
    for pages in ["4k", "thp"] {
        for backing in ["anonymous", "memfd"] {
            for method in &methods {
                let n = rows
                    .iter()
                    .filter(|r| r[0] == *method && r[1] == pages && r[2] == backing)
                    .count();
                assert_eq!(n, 1, "{method} {pages} {backing} in\n{text}");
                let table_row = format!("{method} ");
                assert!(
                    stdout.lines().any(|l| l.starts_with(&table_row)
                        && l.contains(pages)
                        && l.contains(backing)),
                    "no table row {method} {pages} {backing} in\n{stdout}"
                );
            }
        }
    }
    assert_eq!(rows.len(), 4 * methods.len());
    // teravm's rows are compared with munmap and exit (and mrelease).
    for row in rows.iter().filter(|r| r[0].starts_with("teravm-")) {
        assert!(!row[8].is_empty() && !row[9].is_empty(), "{row:?}");
        assert_eq!(row[10].is_empty(), !mrelease, "{row:?}");
    }

    let plot = std::fs::read_to_string(&svg).unwrap();
    assert!(plot.starts_with("<svg"));
    // One panel per page size and backing, a line per baseline in each.
    let baselines = if mrelease { 3 } else { 2 };
    assert_eq!(plot.matches("<polyline").count(), 4 * baselines);
    for panel in ["4k anonymous", "4k memfd", "thp anonymous", "thp memfd"] {
        assert!(plot.contains(&format!(">{panel} (munmap ")), "{panel}");
    }
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
fn vm_runs_a_real_microvm_killed_reaped_and_shut_down() {
    if !kvm_or_skip("vm_runs_a_real_microvm") {
        return;
    }
    let dir = temp_dir("vm");
    let csv = dir.join("bench.csv");
    let svg = dir.join("bench.svg");
    let out = Command::new(BIN)
        .args(["--size-gib", "1", "--runs", "1", "--workers", "1,2"])
        .args(["--pages", "thp", "--backing", "anonymous", "--vm", "--csv"])
        .arg(&csv)
        .arg("--svg")
        .arg(&svg)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    let text = std::fs::read_to_string(&csv).unwrap();
    let rows = csv_rows(&text);
    let row = |method: &str| {
        rows.iter()
            .find(|r| r[0] == method && r[1] == "thp" && r[2] == "anonymous")
            .unwrap_or_else(|| panic!("no {method} row in {text}"))
    };
    let mrelease = !marked_unavailable(&stdout, "vm-mrelease");
    let mut methods = vec!["vm-kill", "vm-teravm-1", "vm-teravm-2", "vm-async-2"];
    if mrelease {
        methods.push("vm-mrelease");
    }
    for method in &methods {
        row(method);
        assert!(
            stdout.lines().any(|l| l.starts_with(&format!("{method} "))),
            "no table row {method} in\n{stdout}"
        );
    }
    // Compared with the same microVM killed (and reaped), from the same run.
    let sync = row("vm-teravm-2");
    assert!(!sync[9].is_empty(), "{sync:?}");
    assert_eq!(sync[10].is_empty(), !mrelease, "{sync:?}");
    // The async run has its reply latency, and the report summarises it.
    let a = row("vm-async-2");
    let reply_ms: f64 = a[11].parse().unwrap();
    assert!(reply_ms > 0.0, "{a:?}");
    assert!(a[12..15].iter().all(|v| v.parse::<f64>().is_ok()), "{a:?}");
    assert!(
        stdout.contains("vm-async-2 thp anonymous: p50 "),
        "no reply latency line in\n{stdout}"
    );
    let table_row = stdout
        .lines()
        .find(|l| l.starts_with("vm-teravm-2"))
        .unwrap_or_else(|| panic!("{stdout}"));
    assert!(table_row.trim_end().ends_with('x'), "{table_row}");
    let plot = std::fs::read_to_string(&svg).unwrap();
    assert!(plot.contains("vm-teravm-w: microVM, sync Shutdown"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn live_runs_a_guest_that_reports_its_memory_free() {
    if !kvm_or_skip("live_runs_a_guest_that_reports") {
        return;
    }
    let dir = temp_dir("live");
    let csv = dir.join("bench.csv");
    let out = Command::new(BIN)
        .args(["--size-gib", "1", "--runs", "1", "--workers", "1"])
        .args(["--pages", "4k", "--backing", "anonymous", "--live", "--csv"])
        .arg(&csv)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    let text = std::fs::read_to_string(&csv).unwrap();
    let rows = csv_rows(&text);
    let num = |r: &[String], i: usize| -> f64 {
        r[i].parse()
            .unwrap_or_else(|_| panic!("column {i} of {r:?}"))
    };
    for (method, workers) in [("report-serial", "0"), ("report-teravm-1", "1")] {
        let r = rows
            .iter()
            .find(|r| r[0] == method && r[1] == "4k" && r[2] == "anonymous")
            .unwrap_or_else(|| panic!("no {method} row in {text}"));
        assert_eq!(r[4], workers, "{r:?}");
        // Compared with munmap and serial, not with a kill.
        assert!(
            num(r, 8) > 0.0 && r[9].is_empty() && r[10].is_empty(),
            "{r:?}"
        );
        assert!(num(r, 19) > 0.0, "{r:?}");
        // teravm discarded the whole GiB, at some rate, and gave it back.
        assert!(num(r, 20) > 0.0, "{r:?}");
        assert_eq!(num(r, 21), 1024.0, "{r:?}");
        assert!(num(r, 22) - num(r, 23) >= 900.0, "{r:?}");
        // The CPU time of the vCPU and discard threads over the report.
        assert!(num(r, 31) >= 0.0 && num(r, 32) >= 0.0, "{r:?}");
        if method != "report-serial" {
            assert!(num(r, 32) > 0.0, "the discard workers freed the GiB: {r:?}");
        }
        assert!(
            stdout.lines().any(|l| l.starts_with(&format!("{method} "))),
            "no table row {method} in\n{stdout}"
        );
    }
    assert!(
        stdout.lines().next().unwrap().ends_with("vs serial"),
        "{stdout}"
    );
    assert!(stdout.contains("live reclaim"), "{stdout}");
    assert!(stdout.contains("cpu vcpu/discard/dev"), "{stdout}");
    assert!(stdout.contains("same run, in process"), "{stdout}");
    let _ = std::fs::remove_dir_all(&dir);
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

/// `qemu-system-x86_64` on `PATH`, or why not (CI installs it: there a
/// missing QEMU fails the test, see `common::skip`).
fn qemu_or_skip(test: &str) -> bool {
    let path = std::env::var_os("PATH").unwrap_or_default();
    if std::env::split_paths(&path).any(|d| d.join("qemu-system-x86_64").is_file()) {
        return true;
    }
    common::skip(
        test,
        "no qemu-system-x86_64 on PATH (apt-get install qemu-system-x86)",
    );
    false
}

/// Firecracker on `PATH` or in the shared script's cache
/// (`~/.cache/teravm-peers/firecracker-*/bin/firecracker`), as the bench
/// finds it.
fn firecracker_here() -> Option<std::path::PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    if let Some(p) = std::env::split_paths(&path)
        .map(|d| d.join("firecracker"))
        .find(|p| p.is_file())
    {
        return Some(p);
    }
    let cache = std::path::PathBuf::from(std::env::var_os("HOME")?).join(".cache/teravm-peers");
    let mut found: Vec<_> = std::fs::read_dir(cache)
        .ok()?
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with("firecracker-"))
        .map(|e| e.path().join("bin/firecracker"))
        .filter(|p| p.is_file())
        .collect();
    found.sort();
    found.pop()
}

#[test]
fn peers_run_qemu_and_firecracker_preallocated_and_with_the_test_guest() {
    let test = "peers_run_qemu_and_firecracker_preallocated_and_with_the_test_guest";
    if !kvm_or_skip(test) || !qemu_or_skip(test) {
        return;
    }
    let firecracker = firecracker_here();
    if firecracker.is_none() {
        common::skip(
            test,
            "no Firecracker (run ../shared/peers/build-firecracker.sh); its rows are left out",
        );
    }
    let dir = temp_dir("peers");
    let csv = dir.join("bench.csv");
    let svg = dir.join("bench.svg");
    let out = Command::new(BIN)
        .args([
            "--peers",
            "qemu,firecracker,cloud-hypervisor",
            "--peers-only",
            "--size-gib",
            "1",
        ])
        .args(["--runs", "1", "--workers", "1", "--pages", "thp"])
        .args([
            "--backing",
            "anonymous",
            "--cloud-hypervisor",
            "/bin/true",
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
    // The discovery line: QEMU found, Firecracker where it is, and
    // /bin/true standing in for Cloud Hypervisor (it answers --version),
    // found but not driven: its rows are unavailable, with the reason.
    let peers = stdout
        .lines()
        .find(|l| l.starts_with("peers: "))
        .unwrap_or_else(|| panic!("no peers line in\n{stdout}"));
    assert!(peers.contains("qemu found ("), "{peers}");
    assert!(
        peers.contains("cloud-hypervisor found (/bin/true, "),
        "{peers}"
    );
    for method in [
        "cloud-hypervisor-prealloc-stop",
        "cloud-hypervisor-guest-kill",
    ] {
        assert!(marked_unavailable(&stdout, method), "{method}: {stdout}");
    }
    assert!(
        stdout.contains("does not drive Cloud Hypervisor yet"),
        "{stdout}"
    );
    let header = stdout.lines().next().unwrap();
    let vs_last = if firecracker.is_some() {
        "vs qemu  vs firecracker"
    } else {
        "vs qemu"
    };
    assert!(header.ends_with(vs_last), "{stdout}");

    let text = std::fs::read_to_string(&csv).unwrap();
    let rows = csv_rows(&text);
    let methods: Vec<&str> = rows.iter().map(|r| r[0].as_str()).collect();
    let mut expected = vec![
        "qemu-prealloc-quit",
        "qemu-prealloc-kill",
        "qemu-guest-quit",
        "qemu-guest-kill",
    ];
    if firecracker.is_some() {
        expected.extend(["firecracker-guest-ctrlaltdel", "firecracker-guest-kill"]);
    }
    expected.extend([
        "vm-prealloc-teravm-1",
        "vm-guest-teravm-1",
        "vm-guest-sigterm-1",
        "vm-teravm-1",
    ]);
    assert_eq!(methods, expected, "{text}");
    let row = |m: &str| rows.iter().find(|r| r[0] == m).unwrap();
    for r in &rows {
        // Compared with qemu of the same run and kind.
        assert!(r[24].parse::<f64>().unwrap() > 0.0, "{r:?}");
        let guest = r[0].contains("-guest-");
        // The guest rows: the guest's touched line was seen (nearly all
        // of the GiB) and the VMM held that much when the clock started.
        if guest {
            let touched: f64 = r[30].parse().unwrap_or_else(|_| panic!("{r:?}"));
            assert!((900.0..=1024.0).contains(&touched), "{r:?}");
            assert!(r[27].parse::<f64>().unwrap() >= touched, "{r:?}");
        } else {
            assert!(r[30].is_empty(), "{r:?}");
        }
        if r[0] != "vm-teravm-1" && !guest {
            assert!(r[27].parse::<f64>().unwrap() >= 1024.0, "{r:?}");
        }
    }
    // Each kind against its own kind: the guest quit is its own 1.00x.
    assert_eq!(row("qemu-guest-quit")[24], "1.0000");
    assert_eq!(row("qemu-prealloc-quit")[24], "1.0000");
    if firecracker.is_some() {
        assert_eq!(row("firecracker-guest-ctrlaltdel")[25], "1.0000");
        assert!(row("vm-guest-teravm-1")[25].parse::<f64>().unwrap() > 0.0);
        assert!(row("vm-prealloc-teravm-1")[25].is_empty());
    }
    assert!(
        stdout.contains("qemu-guest-quit thp anonymous: ")
            && stdout.contains("(the guest said it touched "),
        "{stdout}"
    );
    let plot = std::fs::read_to_string(&svg).unwrap();
    assert!(plot.contains("qemu-prealloc-quit (QEMU, RAM preallocated, QMP quit to exit"));
    assert!(plot.contains("vm-guest-teravm-w: microVM, test guest touched"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_peer_whose_guest_cannot_boot_is_reported_not_waited_for() {
    if !kvm_or_skip("a_peer_whose_guest_cannot_boot") {
        return;
    }
    // A "Firecracker" that answers --version and exits at once otherwise:
    // its console closes before any touched line.
    let dir = temp_dir("fakefc");
    let fake = dir.join("firecracker");
    std::fs::write(
        &fake,
        "#!/bin/sh\n[ \"$1\" = --version ] && echo 'Firecracker v0.0' && exit 0\n\
         echo 'no such VM' >&2; exit 1\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    let t0 = std::time::Instant::now();
    let out = Command::new(BIN)
        .args(["--peers", "firecracker", "--peers-only", "--size-gib", "1"])
        .args(["--runs", "1", "--workers", "1", "--pages", "4k"])
        .args(["--backing", "anonymous", "--firecracker"])
        .arg(&fake)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let last = stderr.trim_end().lines().last().unwrap_or_default();
    assert!(
        last.starts_with("teravm-bench: --peers: firecracker-guest-ctrlaltdel: cannot start firecracker: it exited before the guest said it touched its memory"),
        "{stderr}"
    );
    assert!(last.contains("it said: no such VM"), "{stderr}");
    assert!(t0.elapsed() < std::time::Duration::from_secs(120));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn peers_none_of_which_can_run_is_exit_2_and_bad_peer_flags_exit_1() {
    // Cloud Hypervisor is not driven, found or not: nothing to run.
    let out = Command::new(BIN)
        .args([
            "--peers",
            "cloud-hypervisor",
            "--peers-only",
            "--size-gib",
            "1",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("peers: cloud-hypervisor "), "{stderr}");
    assert!(
        stderr.contains("teravm-bench: --peers: none of the peers asked for can run here: "),
        "{stderr}"
    );
    for args in [
        &["--peers", "xen"][..],
        &["--peers-only"],
        &["--peers", "qemu", "--qemu", "/nonexistent/qemu"],
    ] {
        let out = Command::new(BIN).args(args).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{args:?}: {stderr}");
    }
}
