//! The HTTP API over a real Unix socket, against the real binary and the
//! real /dev/kvm: the whole life cycle, sync and async shutdown with live
//! progress, every error status and wrong-state action. Ctrl-Alt-Del,
//! signals, concurrency, curl and the socket file are in `api_process.rs`.

mod common;

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde_json::Value;

use common::api::*;
use common::client::{request, Connection};
use common::*;

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
    // The reply adds the shutdown's phase timings to the reclaim report.
    let phases = &report["phases"];
    assert!(
        phases["total_ms"].as_f64().unwrap() >= phases["reclaim_ms"].as_f64().unwrap(),
        "{report}"
    );
    let mut reclaim_only = report.clone();
    for key in [
        "phases",
        "vcpus_stuck",
        "console_dropped_bytes",
        "stderr_dropped_lines",
    ] {
        reclaim_only.as_object_mut().unwrap().remove(key);
    }
    assert_eq!(get(&sock, "/reclaim"), reclaim_only);

    let (stdout, stderr) = exits_ok(vmm);
    let (mib, workers, _) = summary(&stderr);
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
/// returns every reply.
fn poll_until_done(sock: &Path) -> Vec<Value> {
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
        // Once a shutdown has begun, reclaim is never "idle": until the
        // executor starts, the reply is the plan with nothing done yet.
        assert!(["running", "done"].contains(&s.as_str()), "state {s}: {r}");
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
    seen
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
    assert_eq!(plan["state"], "running", "{plan}");
    assert_eq!(u(&plan, "address_bytes"), 4096 * MIB, "{plan}");
    let nodes = plan["nodes"].as_array().expect("plan nodes");
    assert!(!nodes.is_empty(), "{plan}");
    assert_eq!(u(&plan, "workers"), nodes.len() as u64, "{plan}");

    // The reply comes before the vCPUs stop.
    let (s, b) = info.request("GET", "/", None).unwrap();
    assert_eq!(s, 200, "{b}");
    let st = json(&b)["state"].as_str().unwrap().to_string();
    assert!(
        ["Shutting down", "Reclaiming", "Stopped"].contains(&st.as_str()),
        "state {st}"
    );

    let seen = poll_until_done(&sock);
    // The progress shown: some poll saw reclaim running part way, with
    // some but not all of the guest's address space done. 4 GiB of touched
    // 4 KiB pages in 64 chunks take far longer than a poll on an open
    // connection, so a reclaim that reports no progress fails here.
    let total = u(&plan, "address_bytes");
    let midway = seen
        .iter()
        .filter(|r| {
            let done = u(r, "address_bytes_done");
            r["state"] == "running" && done > 0 && done < total
        })
        .count();
    assert!(
        midway > 0,
        "none of {} polls saw reclaim part way: {:?}",
        seen.len(),
        seen.iter()
            .map(|r| (r["state"].clone(), u(r, "address_bytes_done")))
            .collect::<Vec<_>>()
    );
    eprintln!("{midway} of {} polls saw reclaim part way", seen.len());
    let last = seen.last().unwrap();
    check_final_report(last, touched);
    assert_eq!(u(last, "workers"), u(&plan, "workers"), "{last}");

    // The process lingers: it still answers, in its final state.
    let (s, b) = info.request("GET", "/", None).unwrap();
    assert_eq!(s, 200, "{b}");
    let st = json(&b)["state"].as_str().unwrap().to_string();
    assert!(st == "Reclaiming" || st == "Stopped", "state {st}");
    let (_, stderr) = exits_ok(vmm);
    let (mib, _, _) = summary(&stderr);
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
    c.send_raw(common::client::format_request("PUT", "/boot-source", Some(&big)).as_bytes())
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

/// A virtio-mem block smaller than the hugetlb page: refused with a 400
/// naming both, whichever of the two sections comes second, and nothing
/// changed; a block of the page's size is taken.
#[test]
fn a_hotplug_block_below_the_huge_page_is_a_400_naming_both() {
    let (vmm, sock, _dir) = start_api("hotplug-huge-block", &[]);
    let gib_pages = r#"{"vcpu_count": 1, "mem_size_mib": 2048, "huge_pages": "1G"}"#;
    let small_block = r#"{"total_size_mib": 4096, "block_size_mib": 2, "slot_size_mib": 1024}"#;
    let names_both = |body: &str| {
        let f = json(body)["fault_message"]
            .as_str()
            .unwrap_or("")
            .to_string();
        assert!(
            f.contains("block_size_mib 2") && f.contains("1024 MiB") && f.contains("huge_pages"),
            "{body}"
        );
    };
    put_ok(&sock, "/machine-config", gib_pages);
    let (s, b) = put(&sock, "/hotplug/memory", small_block);
    assert_eq!(s, 400, "{b}");
    names_both(&b);
    let (s, b) = request(&sock, "GET", "/vm/config", None).unwrap();
    assert_eq!(s, 200, "{b}");
    assert!(json(&b)["memory-hotplug"].is_null(), "nothing changed: {b}");
    // The other order: the machine config is refused.
    put_ok(
        &sock,
        "/machine-config",
        r#"{"vcpu_count": 1, "mem_size_mib": 2048}"#,
    );
    put_ok(&sock, "/hotplug/memory", small_block);
    let (s, b) = put(&sock, "/machine-config", gib_pages);
    assert_eq!(s, 400, "{b}");
    names_both(&b);
    let (s, b) = request(
        &sock,
        "PATCH",
        "/machine-config",
        Some(r#"{"huge_pages": "1G"}"#),
    )
    .unwrap();
    assert_eq!(s, 400, "{b}");
    names_both(&b);
    // A block of the huge page's size is fine.
    put_ok(
        &sock,
        "/hotplug/memory",
        r#"{"total_size_mib": 4096, "block_size_mib": 1024, "slot_size_mib": 1024}"#,
    );
    put_ok(&sock, "/machine-config", gib_pages);
    assert_eq!(state(&sock), "Not started");
    vmm.signal(libc::SIGTERM);
    let (code, _, stderr) = vmm.wait(T);
    assert_eq!(code, 0, "{stderr}");
}
