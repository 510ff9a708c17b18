//! Runs the built `teravm-bench --snapshot` at 1 GiB, one run, with the
//! real Firecracker when it is here: every snapshot row is in the table,
//! teravm's with a time and a CSV line, Firecracker's too or `not possible
//! here` with the reason; the files are gone afterwards. No assertion on
//! speed.

mod common;

use std::process::Command;

use common::{kvm_or_skip, temp_dir};

const BIN: &str = env!("CARGO_BIN_EXE_teravm-bench");

const CSV_HEADER: &str = "method,size_gib,touch_mib,touched_mib,workers,run,seconds,answer_s,\
first_line_s,user_s,sys_s,file_bytes,file_disk_bytes,resident_mib";

/// Whether Firecracker is where the bench finds it (`PATH`, or the shared
/// script's cache).
fn firecracker_here() -> bool {
    let path = std::env::var_os("PATH").unwrap_or_default();
    if std::env::split_paths(&path).any(|d| d.join("firecracker").is_file()) {
        return true;
    }
    let Some(home) = std::env::var_os("HOME") else {
        return false;
    };
    let cache = std::path::PathBuf::from(home).join(".cache/teravm-peers");
    std::fs::read_dir(cache).is_ok_and(|entries| {
        entries
            .filter_map(Result::ok)
            .filter(|e| e.file_name().to_string_lossy().starts_with("firecracker-"))
            .any(|e| e.path().join("bin/firecracker").is_file())
    })
}

#[test]
fn snapshot_rows_are_timed_or_said_not_possible() {
    let test = "snapshot_rows_are_timed_or_said_not_possible";
    if !kvm_or_skip(test) {
        return;
    }
    let firecracker = firecracker_here();
    if !firecracker {
        common::skip(
            test,
            "no Firecracker (run ../shared/peers/build-firecracker.sh); its rows are left out",
        );
    }
    let dir = temp_dir("snapshot");
    let files = dir.join("files");
    let csv = dir.join("snap.csv");
    let svg = dir.join("snap.svg");
    let mut command = Command::new(BIN);
    command
        .args(["--snapshot", "--size-gib", "1", "--runs", "1"])
        .args(["--workers", "1", "--pages", "4k"])
        .arg("--snapshot-dir")
        .arg(&files)
        .arg("--csv")
        .arg(&csv)
        .arg("--svg")
        .arg(&svg);
    if firecracker {
        command.args(["--peers", "firecracker"]);
    }
    let out = command.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let csv = std::fs::read_to_string(&csv).unwrap();
    let mut lines = csv.lines();
    assert_eq!(lines.next(), Some(CSV_HEADER));
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    let mut methods = vec![
        "snapshot-create-teravm-1",
        "snapshot-load-teravm-lazy",
        "snapshot-load-teravm-eager-1",
    ];
    if firecracker {
        methods.extend(["snapshot-create-firecracker", "snapshot-load-firecracker"]);
    }
    for method in methods {
        let row = rows.iter().find(|r| r[0] == method);
        let said = stdout.contains(&format!(
            "{method} (1 GiB, all touched): not possible here: "
        ));
        assert!(
            stdout
                .lines()
                .any(|l| l.split_whitespace().next() == Some(method)),
            "{method} not in the table:\n{stdout}"
        );
        // teravm has snapshots: its rows must run; Firecracker's may be
        // not possible here (a disk too small), saying why.
        let Some(row) = row else {
            assert!(
                said && method.contains("firecracker"),
                "{method} did not run:\n{stdout}"
            );
            continue;
        };
        assert_eq!(row.len(), 14, "{row:?}");
        assert!(row[6].parse::<f64>().unwrap() > 0.0, "{row:?}");
        assert_eq!((row[1], row[2], row[5]), ("1", "", "1"), "{row:?}");
        if method.contains("create") {
            // The memory file is the guest's RAM long; all of it touched.
            assert_eq!(row[11], (1u64 << 30).to_string(), "{row:?}");
            let disk: u64 = row[12].parse().unwrap();
            assert!(disk > 900 << 20, "{row:?}");
        } else {
            assert!(row[8].parse::<f64>().unwrap() > 0.0, "{row:?}");
            assert!(row[13].parse::<f64>().unwrap() > 0.0, "{row:?}");
        }
    }
    if firecracker {
        assert!(stdout.contains("peers: firecracker found"), "{stderr}");
        assert!(
            rows.iter().any(|r| r[0] == "snapshot-create-firecracker"),
            "Firecracker's create did not run:\n{stdout}"
        );
    }
    let svg = std::fs::read_to_string(&svg).unwrap();
    assert!(svg.starts_with("<svg ") && svg.contains("snapshot-create-teravm-1"));
    // Every snapshot file was removed, and the directory the bench made.
    assert!(!files.exists(), "{}", files.display());
    let _ = std::fs::remove_dir_all(&dir);
}
