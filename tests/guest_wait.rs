//! A guest that waits like Linux (issue 27): while the balloon holds a free
//! page report (each discard made 2 s slow by the `slow-discard` fault),
//! the guest's driver waits on the wait port (0xf0c) and the vCPU thread
//! sleeps in teravm instead of spinning on the used ring. Measured as the
//! CPU time of the `vcpu0` thread (`/proc/<pid>/task/*/stat`, utime +
//! stime) against the wall time of the wait; the polling drivers this
//! replaced took a whole core for it. A pause during the wait is answered
//! at once (the wait does not hold the vCPU from the pause), and the VM
//! shuts down promptly.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::api::*;
use common::guests::Guest;
use common::*;

/// Ticks (utime + stime) of `pid`'s thread named `name`.
fn thread_ticks(pid: u32, name: &str) -> u64 {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).expect("teravm's tasks");
    for t in tasks.flatten() {
        let Ok(stat) = std::fs::read_to_string(t.path().join("stat")) else {
            continue;
        };
        // "tid (comm) state ppid ...": utime and stime are fields 14 and 15.
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        if &stat[open + 1..close] != name {
            continue;
        }
        let f: Vec<&str> = stat[close + 2..].split_whitespace().collect();
        let utime: u64 = f[11].parse().expect("utime");
        let stime: u64 = f[12].parse().expect("stime");
        return utime + stime;
    }
    panic!("no thread {name} in teravm {pid}");
}

/// Clock ticks a second.
fn ticks_per_sec() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    u64::try_from(t).ok().filter(|&t| t > 0).unwrap_or(100)
}

fn patch(sock: &Path, path: &str, body: &str) -> (u16, String) {
    common::client::request(sock, "PATCH", path, Some(body)).expect("the API answers")
}

fn a_vcpu_waiting_for_a_slow_report_sleeps(g: Guest) {
    if !kvm_or_skip("guest_wait_report") {
        return;
    }
    let _big = big_memory();
    let dir = temp_dir("guest-wait-report");
    let sock = dir.join("api.sock");
    let mut vmm = Vmm::spawn_env(
        &["--api-sock", sock.to_str().unwrap()],
        &[("TERAVM_FAULT_INJECT", "slow-discard")],
    );
    wait_for_api(&sock, T);
    put_ok(
        &sock,
        "/machine-config",
        r#"{"vcpu_count": 1, "mem_size_mib": 256, "huge_pages": "None"}"#,
    );
    put_ok(
        &sock,
        "/balloon",
        r#"{"amount_mib": 0, "deflate_on_oom": false, "free_page_reporting": true}"#,
    );
    put_ok(
        &sock,
        "/boot-source",
        &g.boot_source("touch=64 report=32 balloon then=idle"),
    );
    let (status, body) = action(&sock, r#"{"action_type": "InstanceStart"}"#);
    assert_eq!(status, 204, "{body}");
    // The report starts right after the device line; its chain comes back
    // only once the (2 s) discards ran.
    vmm.wait_line(&g.line("balloon device at"), T);
    let pid = vmm.child.id();
    let (t0, ticks0) = (Instant::now(), thread_ticks(pid, "vcpu0"));
    // A pause while the vCPU waits is answered at once, and the wait goes on
    // after the resume.
    let (p, paused) = {
        let t = Instant::now();
        (patch(&sock, "/vm", r#"{"state": "Paused"}"#), t.elapsed())
    };
    assert_eq!(p.0, 204, "{}", p.1);
    assert!(paused < Duration::from_millis(500), "pause took {paused:?}");
    let (status, body) = patch(&sock, "/vm", r#"{"state": "Resumed"}"#);
    assert_eq!(status, 204, "{body}");
    let took = vmm.wait_line(&g.line("balloon report took"), T);
    let (wall, ticks) = (t0.elapsed(), thread_ticks(pid, "vcpu0") - ticks0);
    let cpu = Duration::from_millis(ticks * 1000 / ticks_per_sec());
    eprintln!("{took}: vcpu0 used {cpu:?} of CPU in {wall:?}");
    assert!(
        wall >= Duration::from_millis(1500),
        "the report waited for the slow discard: {took} after {wall:?}"
    );
    // Polling, the vCPU thread was on a core all the time (cpu ~ wall).
    assert!(
        cpu * 4 < wall,
        "vcpu0 used {cpu:?} of CPU while it waited {wall:?} ({took})"
    );
    let line = vmm.wait_line(&g.line("balloon reported"), T);
    assert!(
        line.ends_with("balloon reported 32 MiB, read back zero: yes"),
        "{line}"
    );
    // Idle serving the balloon, it still sleeps: 1 s of wall, little CPU.
    let (t1, ticks1) = (Instant::now(), thread_ticks(pid, "vcpu0"));
    // A measurement window, not a synchronisation: nothing is waited for.
    std::thread::sleep(Duration::from_secs(1));
    let idle =
        Duration::from_millis((thread_ticks(pid, "vcpu0") - ticks1) * 1000 / ticks_per_sec());
    assert!(
        idle * 4 < t1.elapsed(),
        "vcpu0 used {idle:?} of CPU serving an idle balloon for {:?}",
        t1.elapsed()
    );
    let stop = Instant::now();
    shutdown_ok(vmm, &sock);
    assert!(stop.elapsed() < T, "shutdown took {:?}", stop.elapsed());
}

both_guests!(a_vcpu_waiting_for_a_slow_report_sleeps);
