//! Faults the phase machine and teardown must survive (issue 16, findings 4
//! and 5), injected with `TERAVM_FAULT_INJECT` into the real binary on
//! /dev/kvm with the default flags: a vCPU thread that never stops (guest
//! memory is freed and its range kept reserved, never unmapped under the
//! guest), and job completion events in phases that do not await them.

mod common;

use std::time::{Duration, Instant};

use common::api::*;
use common::*;

/// The mapping of process `pid` that starts at `addr`, as
/// `/proc/<pid>/maps` shows it (its permissions and size).
fn mapping_at(pid: u32, addr: u64) -> Option<(String, u64)> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
    maps.lines().find_map(|l| {
        let mut f = l.split_whitespace();
        let (range, perms) = (f.next()?, f.next()?);
        let (a, b) = range.split_once('-')?;
        let a = u64::from_str_radix(a, 16).ok()?;
        let b = u64::from_str_radix(b, 16).ok()?;
        (a <= addr && addr < b).then(|| (perms.to_string(), b - a))
    })
}

/// The guest RAM mapping: the largest read-write private mapping.
fn guest_mapping(pid: u32, at_least: u64) -> Option<u64> {
    rw_mappings(pid)
        .into_iter()
        .find(|&(a, b)| b - a >= at_least)
        .map(|(a, _)| a)
}

#[test]
fn a_vcpu_that_never_stops_gets_its_memory_freed_and_its_range_kept_reserved() {
    if !kvm_or_skip("vcpu_ignores_stop") {
        return;
    }
    let _big = big_memory();
    let mem = 256u64;
    let dir = temp_dir("vcpu-ignores-stop");
    let sock = dir.join("api.sock");
    let mut vmm = Vmm::spawn_env(
        &["--api-sock", sock.to_str().unwrap(), "--linger-ms", "10000"],
        &[("TERAVM_FAULT_INJECT", "vcpu-ignores-stop")],
    );
    wait_for_api(&sock, T);
    put_ok(
        &sock,
        "/machine-config",
        &format!(r#"{{"vcpu_count": 2, "mem_size_mib": {mem}, "huge_pages": "None"}}"#),
    );
    put_ok(
        &sock,
        "/boot-source",
        r#"{"boot_args": "touch=all keep=writing"}"#,
    );
    let (status, body) = action(&sock, r#"{"action_type": "InstanceStart"}"#);
    assert_eq!(status, 204, "{body}");
    let line = vmm.wait_line("touched", T);
    assert!(touched_mib(&line) > 0, "{line}");
    let pid = vmm.child.id();
    let guest = guest_mapping(pid, mem << 20).expect("the guest RAM mapping");
    let held = rss_bytes_of(pid);
    assert!(held > (mem << 20) / 2, "the guest touched its RAM: {held}");
    let t = Instant::now();
    let (status, body) = action(&sock, r#"{"action_type": "Shutdown"}"#);
    assert_eq!(status, 200, "{body}");
    let reply = json(&body);
    // vCPU 1 ignored the stop: the VMM waited for it, then went on.
    assert_eq!(u(&reply, "vcpus_stuck"), 1, "{reply}");
    assert!(t.elapsed() >= Duration::from_secs(2), "{:?}", t.elapsed());
    // Its memory was freed all the same, and the range kept reserved.
    assert!(
        u(&reply, "resident_bytes_freed") >= (mem << 20) / 2,
        "{reply}"
    );
    assert_eq!(u(&reply, "reserved_bytes"), mem << 20, "{reply}");
    let (perms, len) = mapping_at(pid, guest).expect("the range is still mapped");
    assert!(perms.starts_with("---p"), "{perms}");
    assert!(len >= mem << 20, "{len}");
    assert!(
        rss_bytes_of(pid) < held / 2,
        "{} of {held}",
        rss_bytes_of(pid)
    );
    let summary = vmm.wait_err_line("teravm: reclaimed", T);
    assert!(
        summary.contains("1 vCPUs did not stop") && summary.contains("kept reserved until exit"),
        "{summary}"
    );
    // The process still serves and exits at a signal.
    assert_eq!(state(&sock), "Stopped");
    vmm.signal(libc::SIGTERM);
    let (code, _, stderr) = vmm.wait(T);
    assert_eq!(code, 0, "{stderr}");
}

#[test]
fn job_events_in_the_wrong_phase_change_nothing() {
    if !kvm_or_skip("spurious_job_events") {
        return;
    }
    let _big = big_memory();
    let dir = temp_dir("spurious-job-events");
    let sock = dir.join("api.sock");
    let mut vmm = Vmm::spawn_env(
        &["--api-sock", sock.to_str().unwrap()],
        &[("TERAVM_FAULT_INJECT", "spurious-job-events")],
    );
    wait_for_api(&sock, T);
    // A populated guest: the start takes a while, and the spurious events
    // arrive while it runs (they are written as the start begins).
    put_ok(
        &sock,
        "/machine-config",
        r#"{"vcpu_count": 1, "mem_size_mib": 1024, "huge_pages": "None"}"#,
    );
    put_ok(&sock, "/memory", r#"{"populate": true}"#);
    put_ok(&sock, "/boot-source", r#"{"boot_args": "touch=16"}"#);
    let (status, body) = action(&sock, r#"{"action_type": "InstanceStart"}"#);
    assert_eq!(status, 204, "{body}");
    vmm.wait_line("touched", T);
    // The events written once it runs, each seen and ignored in the Running
    // phase (the ones written as the start began are logged "while
    // Starting" before these, and do not match).
    let mut seen = Vec::new();
    while seen.len() < 2 {
        let line = vmm.wait_err_line("completion event while Running with no result: ignored", T);
        let job = if line.contains("a start-job") {
            "start"
        } else if line.contains("a reclaim-job") {
            "reclaim"
        } else {
            panic!("which job? {line}")
        };
        assert!(!seen.contains(&job), "twice: {line}");
        seen.push(job);
    }
    // Still Running, a second start refused, nothing lost.
    assert_eq!(state(&sock), "Running");
    let (status, body) = action(&sock, r#"{"action_type": "InstanceStart"}"#);
    assert_fault(status, &body, 400, "Running");
    let (status, body) = action(&sock, r#"{"action_type": "Shutdown"}"#);
    assert_eq!(status, 200, "{body}");
    let reply = json(&body);
    assert_eq!(reply["state"], "done", "{reply}");
    assert_eq!(u(&reply, "address_bytes_done"), 1024 << 20, "{reply}");
    assert_eq!(state(&sock), "Stopped");
    let (code, _, stderr) = vmm.wait(T);
    assert_eq!(code, 0, "{stderr}");
}

#[test]
fn an_async_shutdown_during_start_replies_with_what_will_be_freed() {
    if !kvm_or_skip("async_shutdown_during_start") {
        return;
    }
    let _big = big_memory();
    let dir = temp_dir("async-during-start");
    let sock = dir.join("api.sock");
    let vmm = Vmm::spawn(&["--api-sock", sock.to_str().unwrap()]);
    wait_for_api(&sock, T);
    put_ok(
        &sock,
        "/machine-config",
        r#"{"vcpu_count": 1, "mem_size_mib": 2048, "huge_pages": "None"}"#,
    );
    put_ok(&sock, "/memory", r#"{"populate": true}"#);
    // InstanceStart answers when the start ends: send it on its own thread
    // and wait until the VMM says it is starting.
    let s = sock.clone();
    let start = std::thread::spawn(move || action(&s, r#"{"action_type": "InstanceStart"}"#));
    let deadline = Instant::now() + T;
    while state(&sock) != "Starting" {
        assert!(Instant::now() < deadline, "never Starting");
    }
    let (status, body) = action(&sock, r#"{"action_type": "Shutdown", "reclaim": "async"}"#);
    assert_eq!(status, 202, "{body}");
    let plan = json(&body);
    // The plan of the configuration: all 2 GiB, before any slice exists.
    assert_eq!(u(&plan, "address_bytes"), 2048 << 20, "{plan}");
    assert_eq!(u(&plan, "address_bytes_done"), 0, "{plan}");
    let (status, _) = start.join().unwrap();
    assert_eq!(status, 400, "the start was cut short");
    let (code, _, stderr) = vmm.wait(T);
    assert_eq!(code, 0, "{stderr}");
}
