//! Issue 26's two contract words in the built-in firmware, on the real
//! binary and /dev/kvm with the default flags: `blk-read=<MiB>` against a
//! real drive file (firmware/blk_read.S) and `mmds=<path>` against a real
//! TCP/IP stack, Linux's, behind a tap in a network namespace
//! (firmware/mmds.S).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::api::*;
use common::*;

/// teravm (inside `netns` when given) with an API socket in `dir`,
/// `--metrics-path dir/metrics`, configured by `sections` (path, body),
/// booting the firmware with `args`, started.
fn start(
    dir: &Path,
    sections: &[(String, String)],
    args: &str,
    netns: Option<&str>,
) -> (Vmm, PathBuf) {
    let sock = dir.join("api.sock");
    let metrics = dir.join("metrics");
    let mut cmd = match netns {
        None => Command::new(teravm()),
        Some(ns) => {
            let mut cmd = Command::new("ip");
            cmd.args(["netns", "exec", ns, teravm()]);
            cmd
        }
    };
    cmd.args([
        "--api-sock",
        sock.to_str().unwrap(),
        "--metrics-path",
        metrics.to_str().unwrap(),
    ]);
    let vmm = Vmm::spawn_command(cmd);
    wait_for_api(&sock, T);
    put_ok(
        &sock,
        "/machine-config",
        r#"{"vcpu_count": 1, "mem_size_mib": 128, "huge_pages": "None"}"#,
    );
    for (path, body) in sections {
        put_ok(&sock, path, body);
    }
    put_ok(
        &sock,
        "/boot-source",
        &format!(r#"{{"boot_args": "{args}"}}"#),
    );
    let (status, body) = action(&sock, r#"{"action_type": "InstanceStart"}"#);
    assert_eq!(status, 204, "{body}");
    (vmm, sock)
}

fn shutdown_ok(vmm: Vmm, sock: &Path) {
    let (status, body) = action(sock, r#"{"action_type": "Shutdown"}"#);
    assert_eq!(status, 200, "{body}");
    let (code, _, stderr) = vmm.wait(T);
    assert_eq!(code, 0, "{stderr}");
}

/// The last metrics line after a FlushMetrics.
fn metrics(dir: &Path, sock: &Path) -> serde_json::Value {
    let (status, body) = action(sock, r#"{"action_type": "FlushMetrics"}"#);
    assert_eq!(status, 204, "{body}");
    let text = std::fs::read_to_string(dir.join("metrics")).unwrap();
    serde_json::from_str(text.lines().last().unwrap()).unwrap()
}

/// `blk-read=<ask>` against a drive file of `size` bytes: the line, and
/// the drive's read_bytes and read_count from the metrics.
fn blk_read(name: &str, size: u64, ask: u64) -> (String, u64, u64) {
    let _big = big_memory();
    let dir = temp_dir(name);
    let disk = dir.join("disk.img");
    let f = std::fs::File::create(&disk).unwrap();
    f.set_len(size).unwrap();
    let drive = (
        "/drives/d0".to_string(),
        format!(
            r#"{{"drive_id": "d0", "path_on_host": "{}", "is_root_device": false, "is_read_only": true}}"#,
            disk.display()
        ),
    );
    let (mut vmm, sock) = start(&dir, &[drive], &format!("blk-read={ask} then=idle"), None);
    let line = vmm.wait_line("teravm firmware: blk read", T);
    eprintln!("{line}");
    vmm.wait_line("teravm firmware: idle", T);
    let m = metrics(&dir, &sock);
    let n = |c: &str| {
        m["block_d0"][c]
            .as_u64()
            .unwrap_or_else(|| panic!("no block_d0.{c}: {m}"))
    };
    let (bytes, count) = (n("read_bytes"), n("read_count"));
    shutdown_ok(vmm, &sock);
    (line, bytes, count)
}

/// "teravm firmware: blk read <MiB> MiB in <ms> ms": (MiB, ms).
fn read_line(line: &str) -> (u64, u64) {
    let rest = line
        .strip_prefix("teravm firmware: blk read ")
        .unwrap_or_else(|| panic!("{line:?}"));
    let w: Vec<&str> = rest.split(' ').collect();
    assert!(
        w.len() == 5 && w[1] == "MiB" && w[2] == "in" && w[4] == "ms",
        "{line:?}"
    );
    let num = |s: &str| s.parse::<u64>().unwrap_or_else(|_| panic!("{line:?}"));
    (num(w[0]), num(w[3]))
}

#[test]
fn blk_read_reads_what_it_says_in_64_kib_requests() {
    if !kvm_or_skip("blk_read") {
        return;
    }
    let (line, bytes, count) = blk_read("blk-read", 16 * MIB, 4);
    let (mib, ms) = read_line(&line);
    assert_eq!(mib, 4, "{line}");
    assert!(ms < 60_000, "{line}");
    assert_eq!(bytes, 4 * MIB, "the drive's read_bytes");
    assert_eq!(count, 4 * MIB / (64 << 10), "one request per 64 KiB");
}

#[test]
fn blk_read_of_more_than_the_drive_reads_it_whole() {
    if !kvm_or_skip("blk_read_small") {
        return;
    }
    // 3 MiB and 4 KiB: 48 full requests and a short one; the line rounds
    // the MiB down.
    let size = 3 * MIB + 4096;
    let (line, bytes, count) = blk_read("blk-read-small", size, 64);
    assert_eq!(read_line(&line).0, 3, "{line}");
    assert_eq!(bytes, size, "the whole drive was read");
    assert_eq!(count, 49);
}
