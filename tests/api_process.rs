//! The API with the process around it, over a real socket on /dev/kvm:
//! Ctrl-Alt-Del, SIGTERM with linger, concurrent clients, curl, thread
//! names, the socket file itself, and the sync reply with no linger.

mod common;

use std::io::Write;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::client::{request, Connection};

use common::api::*;
use common::*;

// 4.

fn ctrl_alt_del(name: &str, wait_idle: bool) {
    let (mut vmm, sock) = start_configured(
        name,
        &config_json(2, 256, "touch=128 then=idle", ""),
        &["--linger-ms", "200"],
    );
    let (s, b) = action(&sock, r#"{"action_type": "InstanceStart"}"#);
    assert_eq!(s, 204, "{b}");
    if wait_idle {
        vmm.wait_line("teravm firmware: idle", T);
    }
    let (s, b) = action(&sock, r#"{"action_type": "SendCtrlAltDel"}"#);
    assert_eq!(s, 204, "{b}");
    vmm.wait_line("teravm firmware: reset", T);
    vmm.wait_err_line("teravm: reclaimed ", T);
    let (code, stdout, stderr) = vmm.wait(T);
    assert_eq!(code, 0, "stdout {stdout:?} stderr {stderr}");
    let (mib, _, _) = summary(&stderr);
    assert!(mib >= 115, "reclaimed {mib} MiB of 128 touched: {stdout:?}");
    assert!(!sock.exists());
}

#[test]
fn ctrl_alt_del_resets_an_idle_guest() {
    if kvm_or_skip("ctrl_alt_del_resets_an_idle_guest") {
        ctrl_alt_del("cad-idle", true);
    }
}

#[test]
fn ctrl_alt_del_sent_while_the_guest_is_busy_is_answered() {
    if kvm_or_skip("ctrl_alt_del_busy") {
        ctrl_alt_del("cad-busy", false);
    }
}

// 5.

#[test]
fn sigterm_takes_the_shutdown_path_and_exits_once_memory_is_back() {
    if !kvm_or_skip("sigterm_with_api") {
        return;
    }
    let (mut vmm, sock) = start_configured(
        "sigterm",
        &config_json(2, 256, "touch=64 then=idle", ""),
        &["--linger-ms", "5000"],
    );
    let (s, b) = action(&sock, r#"{"action_type": "InstanceStart"}"#);
    assert_eq!(s, 204, "{b}");
    vmm.wait_line("teravm firmware: idle", T);
    vmm.signal(libc::SIGTERM);
    vmm.wait_err_line("teravm: reclaimed ", T);
    let summary_at = Instant::now();
    let (code, stdout, stderr) = vmm.wait(T);
    assert_eq!(code, 0, "stdout {stdout:?} stderr {stderr}");
    // No linger after a signal: a client that sent SIGTERM waits only for
    // the memory (the 5 s linger is for API shutdowns).
    assert!(
        summary_at.elapsed() < Duration::from_millis(2500),
        "exited {:?} after the summary",
        summary_at.elapsed()
    );
    let (mib, _, _) = summary(&stderr);
    assert!(mib >= 58, "{stdout:?}");
    assert!(!sock.exists());
}

#[test]
fn a_second_sigterm_ends_the_linger_at_once() {
    if !kvm_or_skip("second_sigterm") {
        return;
    }
    let (mut vmm, sock) = start_configured(
        "sigterm2",
        &config_json(1, 128, "touch=16 then=idle", ""),
        &["--linger-ms", "30000"],
    );
    let (s, b) = action(&sock, r#"{"action_type": "InstanceStart"}"#);
    assert_eq!(s, 204, "{b}");
    vmm.wait_line("teravm firmware: idle", T);
    let (s, b) = action(&sock, r#"{"action_type": "Shutdown", "reclaim": "sync"}"#);
    assert_eq!(s, 200, "{b}");
    assert_eq!(state(&sock), "Stopped");
    let t = Instant::now();
    vmm.signal(libc::SIGTERM);
    exits_ok(vmm);
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "took {:?} with a 30 s linger",
        t.elapsed()
    );
}

// 6.

#[test]
fn concurrent_clients_and_a_half_request_do_not_disturb_each_other() {
    let (vmm, sock, _dir) = start_api("concurrent", &["--linger-ms", "0"]);
    // A client that sends half a request and stays connected...
    let mut half = UnixStream::connect(&sock).unwrap();
    half.write_all(b"PUT /reclaim HTTP/1.1\r\nContent-Length: 100\r\n\r\n{\"work")
        .unwrap();
    // ...and one that sends half a request head and disconnects.
    {
        let mut gone = UnixStream::connect(&sock).unwrap();
        gone.write_all(b"GET /recl").unwrap();
    }
    let readers: Vec<_> = (0..2)
        .map(|i| {
            let sock = sock.clone();
            std::thread::spawn(move || {
                let mut conn = Connection::open(&sock).unwrap();
                for n in 0..50 {
                    let path = if (n + i) % 2 == 0 { "/" } else { "/reclaim" };
                    let (s, b) = conn.request("GET", path, None).unwrap();
                    assert_eq!(s, 200, "{b}");
                    let v = json(&b);
                    // Each reply is the answer to this request, not another's.
                    if path == "/" {
                        assert_eq!(v["app_name"], "teravm", "{v}");
                    } else {
                        assert_eq!(v["state"], "idle", "{v}");
                    }
                }
            })
        })
        .collect();
    let writer = {
        let sock = sock.clone();
        std::thread::spawn(move || {
            let mut conn = Connection::open(&sock).unwrap();
            for n in 1..=50 {
                let body = format!(r#"{{"workers_per_node": {n}, "chunk_mib": 64}}"#);
                let (s, b) = conn.request("PUT", "/reclaim", Some(&body)).unwrap();
                assert_eq!(s, 204, "{b}");
            }
        })
    };
    // One more that goes away in the middle of a body.
    {
        let mut gone = UnixStream::connect(&sock).unwrap();
        gone.write_all(b"PUT /machine-config HTTP/1.1\r\nContent-Length: 50\r\n\r\n{\"vcpu")
            .unwrap();
    }
    for r in readers {
        r.join().expect("a reader failed");
    }
    writer.join().expect("the writer failed");
    let cfg = get(&sock, "/vm/config");
    assert_eq!(cfg["reclaim"]["workers_per_node"], 50, "{cfg}");
    assert_eq!(cfg["reclaim"]["chunk_mib"], 64, "{cfg}");
    assert_eq!(cfg["machine-config"]["vcpu_count"], 1, "{cfg}");

    // The half request is still pending: completing it now works.
    half.write_all(&[b' '; 94]).unwrap();
    let mut rest = Vec::new();
    // 100 bytes of body: `{"work` (6) + 94 spaces is not valid JSON: a 400.
    half.set_read_timeout(Some(T)).unwrap();
    let mut buf = [0u8; 4096];
    while !rest.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = std::io::Read::read(&mut half, &mut buf).unwrap();
        assert!(n > 0, "the half-request connection was closed");
        rest.extend_from_slice(&buf[..n]);
    }
    let head = String::from_utf8_lossy(&rest);
    assert!(head.starts_with("HTTP/1.1 400 "), "{head}");
    drop(half);

    vmm.signal(libc::SIGTERM);
    exits_ok(vmm);
}

// 7.

fn curl(sock: &Path, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
    let mut cmd = Command::new("curl");
    cmd.args(["-sS", "--max-time", "60", "--unix-socket"])
        .arg(sock)
        .args(["-X", method, "-w", "\n%{http_code}"]);
    if let Some(b) = body {
        cmd.args(["-H", "Content-Type: application/json", "--data-binary", b]);
    }
    cmd.arg(format!("http://localhost{path}"));
    let out = cmd.output().expect("run curl");
    assert!(
        out.status.success(),
        "curl {method} {path}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let (body, code) = text.rsplit_once('\n').unwrap();
    (code.trim().parse().unwrap(), body.to_string())
}

#[test]
fn curl_drives_a_whole_life_cycle() {
    if !kvm_or_skip("curl_drives_a_whole_life_cycle") {
        return;
    }
    if Command::new("curl").arg("--version").output().is_err() {
        skip("curl_drives_a_whole_life_cycle", "curl is not on PATH");
        return;
    }
    let (mut vmm, sock, _dir) = start_api("curl", &[]);
    let (s, b) = curl(
        &sock,
        "PUT",
        "/machine-config",
        Some(r#"{"vcpu_count": 1, "mem_size_mib": 256}"#),
    );
    assert_eq!(s, 204, "{b}");
    let (s, b) = curl(
        &sock,
        "PUT",
        "/boot-source",
        Some(r#"{"boot_args": "touch=all then=idle"}"#),
    );
    assert_eq!(s, 204, "{b}");
    let (s, b) = curl(&sock, "GET", "/machine-config", None);
    assert_eq!(s, 200, "{b}");
    assert_eq!(json(&b)["mem_size_mib"], 256);
    let (s, b) = curl(&sock, "PUT", "/nowhere", Some("{}"));
    assert_fault(s, &b, 404, "/nowhere");
    let (s, b) = curl(
        &sock,
        "PUT",
        "/actions",
        Some(r#"{"action_type": "InstanceStart"}"#),
    );
    assert_eq!(s, 204, "{b}");
    let touched = touched_bytes(&vmm.wait_line("teravm firmware: touched", T));
    vmm.wait_line("teravm firmware: idle", T);
    let (s, b) = curl(
        &sock,
        "PUT",
        "/actions",
        Some(r#"{"action_type": "Shutdown", "reclaim": "async"}"#),
    );
    assert_eq!(s, 202, "{b}");
    assert_eq!(u(&json(&b), "address_bytes"), 256 * MIB, "{b}");
    let deadline = Instant::now() + T;
    let last = loop {
        let (s, b) = curl(&sock, "GET", "/reclaim", None);
        assert_eq!(s, 200, "{b}");
        let r = json(&b);
        if r["state"] == "done" {
            break r;
        }
        assert!(Instant::now() < deadline, "not done: {r}");
    };
    assert!(
        u(&last, "resident_bytes_freed") * 10 >= touched * 9,
        "{last}"
    );
    exits_ok(vmm);
}

// 8.

#[test]
fn threads_are_named() {
    if !kvm_or_skip("threads_are_named") {
        return;
    }
    let (mut vmm, sock) = start_configured(
        "threads",
        &config_json(2, 128, "touch=0 then=idle", ""),
        &["--linger-ms", "0"],
    );
    let (s, b) = action(&sock, r#"{"action_type": "InstanceStart"}"#);
    assert_eq!(s, 204, "{b}");
    vmm.wait_line("teravm firmware: idle", T);
    let pid = vmm.child.id();
    let mut names: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter_map(|e| std::fs::read_to_string(e.ok()?.path().join("comm")).ok())
        .map(|s| s.trim_end().to_string())
        .collect();
    names.sort();
    for want in ["teravm", "api", "vcpu0", "vcpu1"] {
        assert!(names.iter().any(|n| n == want), "no {want} in {names:?}");
    }
    assert!(!names.iter().any(|n| n == "vcpu2"), "{names:?}");
    let (s, b) = action(&sock, r#"{"action_type": "Shutdown", "reclaim": "sync"}"#);
    assert_eq!(s, 200, "{b}");
    exits_ok(vmm);
}

// 9.

#[test]
fn the_socket_is_0600_whatever_the_umask() {
    let dir = temp_dir("mode");
    let sock = dir.join("api.sock");
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg("umask 000; exec \"$0\" --api-sock \"$1\" --linger-ms 0")
        .arg(teravm())
        .arg(&sock);
    let vmm = Vmm::spawn_command(cmd);
    wait_for_api(&sock, T);
    let meta = std::fs::symlink_metadata(&sock).unwrap();
    assert!(meta.file_type().is_socket());
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    vmm.signal(libc::SIGTERM);
    exits_ok(vmm);
    assert!(!sock.exists());
}

#[test]
fn a_stale_socket_of_a_killed_teravm_is_replaced() {
    let (mut first, sock, _dir) = start_api("stale", &["--id", "first"]);
    first.child.kill().unwrap();
    first.child.wait().unwrap();
    let meta = std::fs::symlink_metadata(&sock).expect("SIGKILL leaves the socket");
    assert!(meta.file_type().is_socket());
    drop(first);

    let second = Vmm::spawn(&[
        "--api-sock",
        sock.to_str().unwrap(),
        "--id",
        "second",
        "--linger-ms",
        "0",
    ]);
    wait_for_api(&sock, T);
    assert_eq!(get(&sock, "/")["id"], "second");

    // A live one is not replaced.
    let (code, _, stderr) = run(&["--api-sock", sock.to_str().unwrap()], T);
    assert_eq!(code, 1, "{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("in use"), "{stderr}");
    assert_eq!(get(&sock, "/")["id"], "second");

    second.signal(libc::SIGTERM);
    exits_ok(second);
    assert!(!sock.exists());
}

#[test]
fn a_regular_file_at_the_socket_path_is_refused() {
    let dir = temp_dir("regular");
    let path = dir.join("api.sock");
    std::fs::write(&path, "keep me").unwrap();
    let (code, stdout, stderr) = run(&["--api-sock", path.to_str().unwrap()], T);
    assert_eq!(code, 1, "stdout {stdout:?} stderr {stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("regular file"), "{stderr}");
    assert!(stderr.contains(path.to_str().unwrap()), "{stderr}");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "keep me");
}

/// With no linger the process exits right after reclaim: the sync
/// `Shutdown` reply must still reach the client (it used to be lost now and
/// then, the process exiting before the connection thread wrote it).
#[test]
fn sync_shutdown_reply_arrives_with_no_linger() {
    if !kvm_or_skip("sync_shutdown_reply_arrives_with_no_linger") {
        return;
    }
    for round in 0..10 {
        let (mut vmm, sock) = start_configured(
            "nolinger",
            &config_json(2, 64, "touch=0 then=idle", ""),
            &["--linger-ms", "0"],
        );
        let (s, b) = action(&sock, r#"{"action_type": "InstanceStart"}"#);
        assert_eq!(s, 204, "{b}");
        vmm.wait_line("teravm firmware: idle", T);
        let reply = request(
            &sock,
            "PUT",
            "/actions",
            Some(r#"{"action_type": "Shutdown", "reclaim": "sync"}"#),
        );
        let (s, b) = reply.unwrap_or_else(|e| panic!("round {round}: no reply: {e}"));
        assert_eq!(s, 200, "{b}");
        assert_eq!(json(&b)["state"], "done", "{b}");
        exits_ok(vmm);
    }
}
