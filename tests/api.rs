//! The HTTP API over a real Unix socket, against the real binary and the
//! real /dev/kvm: the whole life cycle, sync and async shutdown with live
//! progress, every error status, Ctrl-Alt-Del, SIGTERM with linger,
//! concurrent clients, curl, thread names, and the socket file itself.

mod common;

use std::io::Write;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;
use teravm::api::client::{request, Connection};

use common::*;

const T: Duration = Duration::from_secs(60);
const MIB: u64 = 1 << 20;

/// Starts teravm with an API socket in a fresh temp dir; returns once the
/// API answers.
fn start_api(name: &str, extra: &[&str]) -> (Vmm, PathBuf, PathBuf) {
    let dir = temp_dir(name);
    let sock = dir.join("api.sock");
    let mut args = vec!["--api-sock", sock.to_str().unwrap()];
    args.extend_from_slice(extra);
    let vmm = Vmm::spawn(&args);
    wait_for_api(&sock, T);
    (vmm, sock, dir)
}

/// Starts teravm configured from `json` (not started yet).
fn start_configured(name: &str, json: &str, extra: &[&str]) -> (Vmm, PathBuf) {
    let dir = temp_dir(name);
    let cfg = config_file(&dir, json);
    let sock = dir.join("api.sock");
    let mut args = vec![
        "--api-sock",
        sock.to_str().unwrap(),
        "--config-file",
        cfg.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let vmm = Vmm::spawn(&args);
    wait_for_api(&sock, T);
    (vmm, sock)
}

fn json(body: &str) -> Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body:?}"))
}

/// `GET path`, expecting 200 and a JSON body.
fn get(sock: &Path, path: &str) -> Value {
    let (status, body) = request(sock, "GET", path, None).unwrap();
    assert_eq!(status, 200, "GET {path}: {body}");
    json(&body)
}

fn put(sock: &Path, path: &str, body: &str) -> (u16, String) {
    request(sock, "PUT", path, Some(body)).unwrap()
}

/// `PUT path` expecting 204 and no body.
fn put_ok(sock: &Path, path: &str, body: &str) {
    let (status, reply) = put(sock, path, body);
    assert_eq!(status, 204, "PUT {path} {body}: {reply}");
    assert!(reply.is_empty(), "204 with a body: {reply:?}");
}

fn action(sock: &Path, body: &str) -> (u16, String) {
    put(sock, "/actions", body)
}

fn state(sock: &Path) -> String {
    get(sock, "/")["state"].as_str().unwrap().to_string()
}

/// A 400 whose `fault_message` contains `needle`.
fn assert_fault(status: u16, body: &str, code: u16, needle: &str) {
    assert_eq!(status, code, "{body}");
    let msg = json(body)["fault_message"]
        .as_str()
        .unwrap_or_else(|| panic!("no fault_message in {body}"))
        .to_string();
    assert!(msg.contains(needle), "{msg:?} lacks {needle:?}");
}

/// The N of the firmware's `touched N MiB in ...` line, in bytes.
fn touched_bytes(line: &str) -> u64 {
    let mib: u64 = line
        .strip_prefix("teravm firmware: touched ")
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("not a touched line: {line:?}"));
    mib * MIB
}

fn u(v: &Value, key: &str) -> u64 {
    v[key]
        .as_u64()
        .unwrap_or_else(|| panic!("no number {key} in {v}"))
}

/// Waits for exit 0 and returns stdout.
fn exits_ok(vmm: Vmm) -> Vec<String> {
    let (code, stdout, stderr) = vmm.wait(T);
    assert_eq!(code, 0, "stdout {stdout:?} stderr {stderr}");
    stdout
}

// 1.

#[test]
fn full_life_cycle_over_the_api() {
    if !kvm_or_skip("full_life_cycle_over_the_api") {
        return;
    }
    let (mut vmm, sock, _dir) = start_api("life", &["--id", "life-1"]);
    put_ok(
        &sock,
        "/machine-config",
        r#"{"vcpu_count": 2, "mem_size_mib": 512, "huge_pages": "Transparent"}"#,
    );
    put_ok(
        &sock,
        "/boot-source",
        r#"{"boot_args": "touch=all then=idle"}"#,
    );
    put_ok(
        &sock,
        "/memory",
        r#"{"backing": "anonymous", "numa_policy": "preferred", "populate": false}"#,
    );
    put_ok(
        &sock,
        "/reclaim",
        r#"{"workers_per_node": 1, "chunk_mib": 64, "parallel_threshold_mib": 0, "steal": false}"#,
    );
    let cfg = get(&sock, "/vm/config");
    assert_eq!(cfg["machine-config"]["vcpu_count"], 2, "{cfg}");
    assert_eq!(cfg["machine-config"]["mem_size_mib"], 512, "{cfg}");
    assert_eq!(cfg["machine-config"]["huge_pages"], "Transparent", "{cfg}");
    assert_eq!(
        cfg["boot-source"]["boot_args"], "touch=all then=idle",
        "{cfg}"
    );
    assert_eq!(cfg["memory"]["backing"], "anonymous", "{cfg}");
    assert_eq!(cfg["memory"]["numa_policy"], "preferred", "{cfg}");
    assert_eq!(cfg["memory"]["populate"], false, "{cfg}");
    assert_eq!(cfg["reclaim"]["workers_per_node"], 1, "{cfg}");
    assert_eq!(cfg["reclaim"]["chunk_mib"], 64, "{cfg}");
    assert_eq!(cfg["reclaim"]["parallel_threshold_mib"], 0, "{cfg}");
    assert_eq!(cfg["reclaim"]["steal"], false, "{cfg}");
    assert_eq!(get(&sock, "/machine-config"), cfg["machine-config"]);

    let info = get(&sock, "/");
    assert_eq!(info["state"], "Not started", "{info}");
    assert_eq!(info["id"], "life-1", "{info}");
    assert_eq!(info["app_name"], "teravm", "{info}");
    assert!(
        !info["vmm_version"].as_str().unwrap_or("").is_empty(),
        "{info}"
    );
    assert_eq!(get(&sock, "/reclaim")["state"], "idle");

    let (status, body) = action(&sock, r#"{"action_type": "InstanceStart"}"#);
    assert_eq!(status, 204, "{body}");
    assert_eq!(state(&sock), "Running");

    let memory = get(&sock, "/memory");
    assert_eq!(memory["numa_policy"], "preferred", "{memory}");
    let slices = memory["slices"].as_array().expect("slices");
    assert!(!slices.is_empty(), "{memory}");
    let mut total = 0;
    for s in slices {
        assert!(s["guest_addr"].is_u64(), "{s}");
        assert!(s["host_node"].is_u64(), "{s}");
        assert_eq!(s["policy"], "preferred", "{s}");
        total += u(s, "size_bytes");
    }
    assert_eq!(total, 512 * MIB, "{memory}");

    let touched = touched_bytes(&vmm.wait_line("teravm firmware: touched", T));
    vmm.wait_line("teravm firmware: idle", T);
    assert!(touched >= 500 * MIB, "touched {touched}");

    let (status, body) = action(&sock, r#"{"action_type": "Shutdown", "reclaim": "sync"}"#);
    assert_eq!(status, 200, "{body}");
    let report = json(&body);
    assert_eq!(report["state"], "done", "{report}");
    assert_eq!(u(&report, "address_bytes"), 512 * MIB, "{report}");
    assert_eq!(u(&report, "address_bytes_done"), 512 * MIB, "{report}");
    assert!(
        u(&report, "resident_bytes_freed") * 10 >= touched * 9,
        "freed {} of {touched} touched: {report}",
        u(&report, "resident_bytes_freed")
    );
    // After a sync shutdown the state is final, and GET /reclaim agrees.
    assert_eq!(state(&sock), "Stopped");
    assert_eq!(get(&sock, "/reclaim"), report);

    let stdout = exits_ok(vmm);
    let (mib, workers, _) = summary(&stdout);
    assert_eq!(mib, u(&report, "resident_bytes_freed") >> 20, "{stdout:?}");
    assert_eq!(u64::from(workers), u(&report, "workers"));
    assert!(!sock.exists(), "the socket outlived the process");
}

// 2.

const BIG_4K: &str = r#"{"machine-config": {"vcpu_count": 2, "mem_size_mib": 4096, "huge_pages": "None"},
    "boot-source": {"boot_args": "touch=all then=idle"},
    "reclaim": {"workers_per_node": 1, "chunk_mib": 64, "parallel_threshold_mib": 0}}"#;

/// Checks that no counter of `next` is below the same counter of `prev`.
fn assert_monotonic(prev: &Value, next: &Value) {
    for key in ["address_bytes_done", "resident_bytes_freed"] {
        assert!(
            u(next, key) >= u(prev, key),
            "{key} went down:\n{prev}\n{next}"
        );
    }
    if let (Some(a), Some(b)) = (prev["nodes"].as_array(), next["nodes"].as_array()) {
        for (a, b) in a.iter().zip(b) {
            if a["node"] == b["node"] {
                assert_monotonic_node(a, b);
            }
        }
    }
}

fn assert_monotonic_node(a: &Value, b: &Value) {
    for key in ["address_bytes_done", "resident_bytes_freed"] {
        assert!(u(b, key) >= u(a, key), "node {key} went down:\n{a}\n{b}");
    }
}

/// Boots the 4 GiB, 4 KiB-page guest and returns the bytes it touched.
fn boot_big(name: &str) -> (Vmm, PathBuf, u64) {
    let (mut vmm, sock) = start_configured(name, BIG_4K, &["--linger-ms", "1000"]);
    let (status, body) = action(&sock, r#"{"action_type": "InstanceStart"}"#);
    assert_eq!(status, 204, "{body}");
    let touched = touched_bytes(&vmm.wait_line("teravm firmware: touched", T));
    vmm.wait_line("teravm firmware: idle", T);
    assert!(touched >= 4000 * MIB, "touched only {touched}");
    (vmm, sock, touched)
}

/// Polls `GET /reclaim` on one connection as fast as it can until "done";
/// returns every reply and how many said "running".
fn poll_until_done(sock: &Path) -> (Vec<Value>, usize) {
    let mut conn = Connection::open(sock).unwrap();
    let deadline = Instant::now() + T;
    let mut seen: Vec<Value> = Vec::new();
    loop {
        let (status, body) = conn.request("GET", "/reclaim", None).unwrap();
        assert_eq!(status, 200, "{body}");
        let r = json(&body);
        if let Some(prev) = seen.last() {
            assert_monotonic(prev, &r);
        }
        let s = r["state"].as_str().unwrap().to_string();
        assert!(
            ["idle", "running", "done"].contains(&s.as_str()),
            "state {s}: {r}"
        );
        seen.push(r);
        if s == "done" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "reclaim not done: {:?}",
            seen.last()
        );
    }
    let running = seen.iter().filter(|r| r["state"] == "running").count();
    (seen, running)
}

fn check_final_report(report: &Value, touched: u64) {
    assert_eq!(report["state"], "done", "{report}");
    assert_eq!(u(report, "address_bytes"), 4096 * MIB, "{report}");
    assert_eq!(u(report, "address_bytes_done"), 4096 * MIB, "{report}");
    let freed = u(report, "resident_bytes_freed");
    assert!(
        freed * 10 >= touched * 9,
        "freed {freed} of {touched}: {report}"
    );
    let nodes = report["nodes"].as_array().expect("nodes");
    assert!(!nodes.is_empty(), "{report}");
    let node_sum: u64 = nodes.iter().map(|n| u(n, "address_bytes_done")).sum();
    assert_eq!(node_sum, 4096 * MIB, "{report}");
    let node_freed: u64 = nodes.iter().map(|n| u(n, "resident_bytes_freed")).sum();
    assert_eq!(node_freed, freed, "{report}");
    for n in nodes {
        assert_eq!(u(n, "workers"), 1, "workers_per_node is 1: {report}");
    }
}

#[test]
fn async_shutdown_of_a_touched_4_gib_guest_shows_progress() {
    if !kvm_or_skip("async_shutdown_4g") {
        return;
    }
    let _big = big_memory();
    let (vmm, sock, touched) = boot_big("async4g");
    let mut info = Connection::open(&sock).unwrap();

    let (status, body) = action(&sock, r#"{"action_type": "Shutdown", "reclaim": "async"}"#);
    assert_eq!(status, 202, "{body}");
    let plan = json(&body);
    assert_eq!(u(&plan, "address_bytes"), 4096 * MIB, "{plan}");
    let nodes = plan["nodes"].as_array().expect("plan nodes");
    assert!(!nodes.is_empty(), "{plan}");
    assert_eq!(u(&plan, "workers"), nodes.len() as u64, "{plan}");

    let (s, b) = info.request("GET", "/", None).unwrap();
    assert_eq!(s, 200, "{b}");
    let st = json(&b)["state"].as_str().unwrap().to_string();
    assert!(st == "Reclaiming" || st == "Stopped", "state {st}");

    let (seen, running) = poll_until_done(&sock);
    if running == 0 {
        eprintln!(
            "note: none of {} polls saw reclaim running (the machine was too fast)",
            seen.len()
        );
    }
    let last = seen.last().unwrap();
    check_final_report(last, touched);
    assert_eq!(u(last, "workers"), u(&plan, "workers"), "{last}");

    // The process lingers: it still answers, in its final state.
    let (s, b) = info.request("GET", "/", None).unwrap();
    assert_eq!(s, 200, "{b}");
    let st = json(&b)["state"].as_str().unwrap().to_string();
    assert!(st == "Reclaiming" || st == "Stopped", "state {st}");
    let stdout = exits_ok(vmm);
    let (mib, _, _) = summary(&stdout);
    assert_eq!(mib, u(last, "resident_bytes_freed") >> 20);
    assert!(!sock.exists());
}

#[test]
fn sync_shutdown_of_a_touched_4_gib_guest_while_another_client_polls() {
    if !kvm_or_skip("sync_shutdown_4g") {
        return;
    }
    let _big = big_memory();
    let (vmm, sock, touched) = boot_big("sync4g");
    let poll_sock = sock.clone();
    // A second client watches progress while the first waits for the reply.
    let poller = std::thread::spawn(move || {
        let mut conn = Connection::open(&poll_sock).unwrap();
        let mut seen: Vec<Value> = Vec::new();
        let deadline = Instant::now() + T;
        loop {
            let (status, body) = conn.request("GET", "/reclaim", None).unwrap();
            assert_eq!(status, 200, "{body}");
            let r = json(&body);
            if let Some(prev) = seen.last() {
                if prev["state"] != "idle" {
                    assert_monotonic(prev, &r);
                }
            }
            let done = r["state"] == "done";
            seen.push(r);
            if done || Instant::now() > deadline {
                return seen;
            }
        }
    });
    let started = Instant::now();
    let (status, body) = action(&sock, r#"{"action_type": "Shutdown", "reclaim": "sync"}"#);
    let took = started.elapsed();
    assert_eq!(status, 200, "{body}");
    let report = json(&body);
    check_final_report(&report, touched);
    let seen = poller.join().unwrap();
    assert_eq!(seen.last().unwrap()["state"], "done", "{:?}", seen.last());
    let running = seen.iter().filter(|r| r["state"] == "running").count();
    eprintln!(
        "sync shutdown took {took:?}; the poller made {} requests, {running} saw running",
        seen.len()
    );
    assert_eq!(state(&sock), "Stopped");
    exits_ok(vmm);
    assert!(!sock.exists());
}

// 3.

/// Every HTTP-level and body error over the real binary (no KVM needed: the
/// microVM is never started).
#[test]
fn http_errors_over_the_real_socket() {
    let (vmm, sock, _dir) = start_api("errors", &["--linger-ms", "0"]);
    let alive = |what: &str| {
        let (s, b) =
            request(&sock, "GET", "/", None).unwrap_or_else(|e| panic!("GET / after {what}: {e}"));
        assert_eq!(s, 200, "GET / after {what}: {b}");
        assert_eq!(json(&b)["state"], "Not started");
    };

    // Bad bodies, on one kept-alive connection that survives each 400.
    let mut conn = Connection::open(&sock).unwrap();
    let cases: [(&str, &str, &str); 7] = [
        (
            "/machine-config",
            r#"{"vcpu_count": "two", "mem_size_mib": 128}"#,
            "machine-config.vcpu_count",
        ),
        (
            "/machine-config",
            r#"{"vcpu_count": 1, "mem_size_mib": 128, "cpus": 2}"#,
            "unknown field `cpus`",
        ),
        (
            "/machine-config",
            r#"{"vcpu_count": 0, "mem_size_mib": 128}"#,
            "machine-config.vcpu_count",
        ),
        (
            "/machine-config",
            "{not json",
            "invalid machine-config body",
        ),
        (
            "/reclaim",
            r#"{"workers_per_node": 0}"#,
            "reclaim.workers_per_node",
        ),
        ("/actions", r#"{"action_type": "Reboot"}"#, "Reboot"),
        (
            "/actions",
            r#"{"action_type": "InstanceStart", "reclaim": "sync"}"#,
            "actions.reclaim",
        ),
    ];
    for (path, body, needle) in cases {
        let (s, b) = conn.request("PUT", path, Some(body)).unwrap();
        assert_fault(s, &b, 400, needle);
        let (s, b) = conn.request("GET", "/", None).unwrap();
        assert_eq!(s, 200, "GET / on the same connection after {body}: {b}");
    }
    // None of them changed the configuration.
    let mc = get(&sock, "/machine-config");
    assert_eq!(mc["vcpu_count"], 1, "{mc}");
    assert_eq!(mc["mem_size_mib"], 128, "{mc}");

    let (s, b) = request(&sock, "GET", "/nowhere", None).unwrap();
    assert_fault(s, &b, 404, "/nowhere");
    alive("404");

    let reply = Connection::open(&sock)
        .unwrap()
        .exchange("GET", "/actions", None)
        .unwrap();
    assert_fault(reply.status, &reply.body, 405, "GET");
    assert_eq!(reply.header("allow"), Some("PUT"));
    let (s, b) = request(&sock, "DELETE", "/", None).unwrap();
    assert_fault(s, &b, 405, "DELETE");
    alive("405");

    // 413: a body over 64 KiB, refused from its head alone.
    let big = format!(
        r#"{{"boot_args": "{}"}}"#,
        "a".repeat(teravm::api::http::MAX_BODY_BYTES)
    );
    let mut c = Connection::open(&sock).unwrap();
    c.send_raw(teravm::api::client::format_request("PUT", "/boot-source", Some(&big)).as_bytes())
        .unwrap();
    let reply = c.read_reply().unwrap();
    assert_fault(reply.status, &reply.body, 413, "larger than");
    assert_eq!(reply.header("connection"), Some("close"));
    alive("413");

    // 400: a malformed request line; the connection is closed after it.
    let mut c = Connection::open(&sock).unwrap();
    c.send_raw(b"GARBAGE\r\n\r\n").unwrap();
    let reply = c.read_reply().unwrap();
    assert_fault(reply.status, &reply.body, 400, "malformed request line");
    assert_eq!(reply.header("connection"), Some("close"));
    assert!(c.read_reply().is_err(), "the connection stayed open");
    alive("a malformed request line");

    // Actions that need a running microVM.
    let (s, b) = action(&sock, r#"{"action_type": "Shutdown", "reclaim": "sync"}"#);
    assert_fault(s, &b, 400, "Not started");
    let (s, b) = action(&sock, r#"{"action_type": "Shutdown", "reclaim": "async"}"#);
    assert_fault(s, &b, 400, "Not started");
    let (s, b) = action(&sock, r#"{"action_type": "SendCtrlAltDel"}"#);
    assert_fault(s, &b, 400, "Not started");
    alive("wrong-state actions");
    assert_eq!(get(&sock, "/reclaim")["state"], "idle");

    // SIGTERM before start: a clean exit.
    vmm.signal(libc::SIGTERM);
    exits_ok(vmm);
    assert!(!sock.exists());
}

/// Actions refused once the microVM runs, and after it has stopped.
#[test]
fn wrong_state_actions_name_the_state() {
    if !kvm_or_skip("wrong_state_actions_name_the_state") {
        return;
    }
    let (vmm, sock) = start_configured(
        "wrongstate",
        &config_json(1, 128, "touch=0 then=idle", ""),
        &["--linger-ms", "3000"],
    );
    let (s, b) = action(&sock, r#"{"action_type": "InstanceStart"}"#);
    assert_eq!(s, 204, "{b}");
    let (s, b) = action(&sock, r#"{"action_type": "InstanceStart"}"#);
    assert_fault(s, &b, 400, "Running");
    let (s, b) = put(
        &sock,
        "/machine-config",
        r#"{"vcpu_count": 2, "mem_size_mib": 256}"#,
    );
    assert_fault(s, &b, 400, "Running");
    let (s, b) = put(&sock, "/boot-source", r#"{"boot_args": "touch=1"}"#);
    assert_fault(s, &b, 400, "Running");
    let (s, b) = put(&sock, "/memory", r#"{"populate": true}"#);
    assert_fault(s, &b, 400, "Running");
    // Reclaim settings may still change while running.
    put_ok(&sock, "/reclaim", r#"{"workers_per_node": 3}"#);
    assert_eq!(get(&sock, "/vm/config")["reclaim"]["workers_per_node"], 3);
    assert_eq!(get(&sock, "/machine-config")["vcpu_count"], 1);
    assert_eq!(state(&sock), "Running");

    let (s, b) = action(&sock, r#"{"action_type": "Shutdown", "reclaim": "sync"}"#);
    assert_eq!(s, 200, "{b}");
    assert_eq!(state(&sock), "Stopped");
    for (body, what) in [
        (r#"{"action_type": "InstanceStart"}"#, "InstanceStart"),
        (r#"{"action_type": "SendCtrlAltDel"}"#, "SendCtrlAltDel"),
        (
            r#"{"action_type": "Shutdown", "reclaim": "async"}"#,
            "Shutdown",
        ),
        (
            r#"{"action_type": "Shutdown", "reclaim": "sync"}"#,
            "Shutdown",
        ),
    ] {
        let (s, b) = action(&sock, body);
        assert_fault(s, &b, 400, "Stopped");
        assert_fault(s, &b, 400, what);
    }
    let (s, b) = put(&sock, "/reclaim", r#"{"workers_per_node": 1}"#);
    assert_fault(s, &b, 400, "Stopped");
    assert_eq!(state(&sock), "Stopped");
    vmm.signal(libc::SIGTERM); // ends the linger early
    exits_ok(vmm);
}

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
    vmm.wait_line("teravm: reclaimed ", T);
    let stdout = exits_ok(vmm);
    let (mib, _, _) = summary(&stdout);
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
fn sigterm_takes_the_shutdown_path_and_the_api_answers_during_linger() {
    if !kvm_or_skip("sigterm_with_api") {
        return;
    }
    let (mut vmm, sock) = start_configured(
        "sigterm",
        &config_json(2, 256, "touch=64 then=idle", ""),
        &["--linger-ms", "2000"],
    );
    let (s, b) = action(&sock, r#"{"action_type": "InstanceStart"}"#);
    assert_eq!(s, 204, "{b}");
    vmm.wait_line("teravm firmware: idle", T);
    vmm.signal(libc::SIGTERM);
    vmm.wait_line("teravm: reclaimed ", T);
    let summary_at = Instant::now();
    assert_eq!(state(&sock), "Stopped");
    let r = get(&sock, "/reclaim");
    assert_eq!(r["state"], "done", "{r}");
    assert!(u(&r, "resident_bytes_freed") >= 58 * MIB, "{r}");
    let (s, b) = action(&sock, r#"{"action_type": "Shutdown"}"#);
    assert_fault(s, &b, 400, "Stopped");
    let stdout = exits_ok(vmm);
    assert!(
        summary_at.elapsed() >= Duration::from_millis(1000),
        "exited {:?} after the summary; linger is 2000 ms",
        summary_at.elapsed()
    );
    let (mib, _, _) = summary(&stdout);
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
        eprintln!("SKIPPED curl_drives_a_whole_life_cycle: curl is not on PATH");
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
