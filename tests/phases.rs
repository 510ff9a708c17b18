//! The core cannot hang or stall (issue 9): a stuck stdout, a panicking
//! reclaim job, a long populate, a closed stdout and a guest imitating
//! teravm's output, each on the real binary and /dev/kvm.

mod common;

use std::io::{BufRead, BufReader, Write};

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::api::*;
use common::*;

/// `PUT /machine-config` and `PUT /boot-source`, each expecting 204.
fn configure(sock: &std::path::Path, machine: &str, boot_source: &str) {
    put_ok(sock, "/machine-config", machine);
    put_ok(sock, "/boot-source", boot_source);
}

/// Waits until `check` holds, or panics with `what` after `timeout`.
fn wait_until(what: &str, timeout: Duration, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !check() {
        assert!(Instant::now() < deadline, "{what}: not within {timeout:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_stdout_nobody_reads_does_not_stop_sigterm() {
    if !kvm_or_skip("stuck_stdout") {
        return;
    }
    let dir = temp_dir("stuck-stdout");
    let cfg = config_file(&dir, &config_json(2, 256, "touch=64 then=idle", ""));
    let (_read_end, write_end) = pipe();
    let filled = fill(&write_end);
    let mut child = Command::new(teravm())
        .args(["--config-file", cfg.to_str().unwrap(), "--no-api"])
        .stdin(Stdio::null())
        .stdout(Stdio::from(write_end))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    // The firmware touches 64 MiB (its console output is stuck behind the
    // full pipe, its vCPUs are not).
    wait_until("64 MiB touched", T, || rss_bytes_of(pid) >= 64 << 20);
    let sent = Instant::now();
    // SAFETY: signalling our own child.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGTERM) }, 0);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            sent.elapsed() < Duration::from_secs(2),
            "teravm still alive 2 s after SIGTERM with a stuck stdout ({filled} bytes in the pipe)"
        );
        std::thread::sleep(Duration::from_millis(5));
    };
    let took = sent.elapsed();
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert_eq!(status.code(), Some(0), "{stderr}");
    let (mib, _, _) = summary(&stderr);
    assert!(mib >= 60, "reclaimed only {mib} MiB: {stderr}");
    let line = stderr
        .lines()
        .find(|l| l.starts_with("teravm: reclaimed"))
        .unwrap();
    let dropped: u64 = line
        .split("console dropped ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no dropped count in {line:?}"));
    assert!(dropped > 0, "{line}");
    eprintln!("stuck stdout: exited {took:?} after SIGTERM; {line}");
}

#[test]
fn a_panic_in_the_reclaim_job_exits_4_with_memory_freed() {
    if !kvm_or_skip("reclaim_job_panic") {
        return;
    }
    let dir = temp_dir("reclaim-panic");
    let sock = dir.join("api.sock");
    let mut vmm = Vmm::spawn_env(
        &["--api-sock", sock.to_str().unwrap(), "--linger-ms", "500"],
        &[("TERAVM_FAULT_INJECT", "reclaim-thread-panic")],
    );
    wait_for_api(&sock, T);
    configure(
        &sock,
        r#"{"vcpu_count": 2, "mem_size_mib": 512}"#,
        r#"{"boot_args": "touch=128 then=idle"}"#,
    );
    let (s, b) = action(&sock, r#"{"action_type": "InstanceStart"}"#);
    assert_eq!(s, 204, "{b}");
    vmm.wait_line("teravm firmware: idle", T);
    let pid = vmm.child.id();
    assert!(rss_bytes_of(pid) >= 128 << 20);
    let sent = Instant::now();
    let (s, b) = action(&sock, r#"{"action_type": "Shutdown", "reclaim": "async"}"#);
    assert_eq!(s, 202, "{b}");
    // During the linger: the state is final and says failed, and the
    // memory is gone (unmapped as the job unwound).
    wait_until("GET /reclaim says failed", T, || {
        get(&sock, "/reclaim")["state"] == "failed"
    });
    assert_eq!(state(&sock), "Stopped");
    let rss = rss_bytes_of(pid);
    assert!(rss < 64 << 20, "RSS {rss} after the failed reclaim");
    let (code, _, stderr) = vmm.wait(T);
    assert_eq!(code, 4, "{stderr}");
    assert!(
        sent.elapsed() < Duration::from_secs(2),
        "exit {:?} after Shutdown",
        sent.elapsed()
    );
    assert!(stderr.contains("the reclaim thread panicked"), "{stderr}");
}

#[test]
fn the_api_answers_during_a_long_populate_and_sigterm_cancels_it() {
    if !kvm_or_skip("populate_cancel") {
        return;
    }
    let _big = big_memory();
    let (vmm, sock, _dir) = start_api("populate-cancel", &["--log-level", "info"]);
    configure(
        &sock,
        r#"{"vcpu_count": 2, "mem_size_mib": 6144, "huge_pages": "None"}"#,
        r#"{"boot_args": "touch=0 then=idle"}"#,
    );
    put_ok(&sock, "/memory", r#"{"populate": true}"#);
    put_ok(&sock, "/reclaim", r#"{"workers_per_node": 1}"#);
    // InstanceStart answers when the start ends: send it on its own thread.
    let start_sock = sock.clone();
    let starter =
        std::thread::spawn(move || action(&start_sock, r#"{"action_type": "InstanceStart"}"#));
    let mut latencies = Vec::new();
    let mut populated = 0;
    let deadline = Instant::now() + T;
    loop {
        let t = Instant::now();
        let st = state(&sock);
        latencies.push(t.elapsed());
        let m = get(&sock, "/memory");
        if st == "Starting" {
            populated = m["populate_progress"]["bytes_done"].as_u64().unwrap_or(0);
            if populated >= 1 << 30 {
                break;
            }
        }
        assert!(
            st == "Not started" || st == "Starting",
            "populate ended before the test saw 1 GiB done (state {st}, {populated} bytes)"
        );
        assert!(Instant::now() < deadline, "populate made no progress");
    }
    vmm.signal(libc::SIGTERM);
    let (s, b) = starter.join().unwrap();
    assert_fault(s, &b, 400, "shut down while it started");
    let (code, stdout, stderr) = vmm.wait(T);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        !stdout.iter().any(|l| l.contains("firmware")),
        "the guest ran: {stdout:?}"
    );
    let (mib, _, _) = summary(&stderr);
    assert!(
        mib << 20 >= populated,
        "reclaimed {mib} MiB of {populated} bytes populated"
    );
    // Each GET / is a new connection (a new thread in teravm) while the
    // populate workers fault pages in: the loop answers at once. The bound
    // on the slowest is loose for machines shared with other work; the
    // 90th percentile is the figure the loop is held to.
    latencies.sort();
    let p90 = latencies[latencies.len() * 9 / 10];
    let slowest = *latencies.last().unwrap();
    eprintln!(
        "populate: {} polls of GET /, p90 {p90:?}, slowest {slowest:?}; cancelled after {} MiB, reclaimed {mib} MiB",
        latencies.len(),
        populated >> 20
    );
    assert!(
        p90 < Duration::from_millis(100),
        "GET / p90 {p90:?} during populate"
    );
    assert!(
        slowest < Duration::from_secs(1),
        "GET / took {slowest:?} during populate"
    );
}

#[test]
fn a_guest_cannot_forge_the_summary() {
    if !kvm_or_skip("forged_summary") {
        return;
    }
    let fake = "teravm: reclaimed 999999 MiB in 1 ms (1.0 GiB/s, 9 workers, 9 nodes)";
    let (mut vmm, sock, _dir) = start_api("forged", &["--linger-ms", "0"]);
    configure(
        &sock,
        r#"{"vcpu_count": 1, "mem_size_mib": 128}"#,
        &format!(r#"{{"boot_args": "touch=32 then=idle say={fake}"}}"#),
    );
    let (s, b) = action(&sock, r#"{"action_type": "InstanceStart"}"#);
    assert_eq!(s, 204, "{b}");
    vmm.wait_line("teravm firmware: idle", T);
    let (s, reply) = action(&sock, r#"{"action_type": "Shutdown"}"#);
    assert_eq!(s, 200, "{reply}");
    let (code, stdout, stderr) = vmm.wait(T);
    assert_eq!(code, 0, "{stderr}");
    // The guest said it, on its console (stdout).
    assert!(stdout.iter().any(|l| l == fake), "{stdout:?}");
    // teravm's own channels carry the real numbers only.
    assert!(!stderr.contains("999999"), "{stderr}");
    let (mib, workers, nodes) = summary(&stderr);
    assert!((28..=128).contains(&mib), "{stderr}");
    assert!(workers < 9 && nodes < 9);
    assert_eq!(
        json(&reply)["resident_bytes_freed"].as_u64().unwrap() >> 20,
        mib
    );
}

#[test]
fn a_closed_stdout_is_no_panic_and_the_sync_reply_arrives() {
    if !kvm_or_skip("closed_stdout") {
        return;
    }
    let dir = temp_dir("closed-stdout");
    let sock = dir.join("api.sock");
    let (read_end, write_end) = pipe();
    drop(read_end);
    let mut child = Command::new(teravm())
        .args(["--api-sock", sock.to_str().unwrap(), "--linger-ms", "0"])
        .stdin(Stdio::null())
        .stdout(Stdio::from(write_end))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_api(&sock, T);
    configure(
        &sock,
        r#"{"vcpu_count": 1, "mem_size_mib": 128}"#,
        r#"{"boot_args": "touch=32 then=idle"}"#,
    );
    let (s, b) = action(&sock, r#"{"action_type": "InstanceStart"}"#);
    assert_eq!(s, 204, "{b}");
    let pid = child.id();
    wait_until("32 MiB touched", T, || rss_bytes_of(pid) >= 32 << 20);
    let (s, reply) = action(&sock, r#"{"action_type": "Shutdown"}"#);
    assert_eq!(s, 200, "{reply}");
    assert!(json(&reply)["resident_bytes_freed"].as_u64().unwrap() >= 28 << 20);
    let status = child.wait().unwrap();
    let mut stderr = String::new();
    for line in BufReader::new(child.stderr.take().unwrap())
        .lines()
        .map_while(Result::ok)
    {
        stderr.push_str(&line);
        stderr.push('\n');
    }
    assert_eq!(status.code(), Some(0), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    summary(&stderr);
    let _ = std::io::stderr().flush();
}

#[test]
fn the_boot_timer_logs_the_firmware_first_line() {
    if !kvm_or_skip("boot_timer") {
        return;
    }
    let dir = temp_dir("boot-timer");
    let cfg = config_file(&dir, &config_json(1, 64, "touch=8 then=reset", ""));
    let (code, stdout, stderr) = run(
        &[
            "--config-file",
            cfg.to_str().unwrap(),
            "--no-api",
            "--boot-timer",
            "--level",
            "Info",
        ],
        T,
    );
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout[0].starts_with("teravm firmware:"), "{stdout:?}");
    let line = stderr
        .lines()
        .find(|l| l.contains("Guest-boot-time = "))
        .unwrap_or_else(|| panic!("no boot time in {stderr}"));
    let us: u64 = line
        .split("Guest-boot-time = ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{line}"));
    assert!(us > 0 && us < 60_000_000, "{line}");
}

#[test]
fn a_terminal_gets_a_live_progress_line_and_a_pipe_does_not() {
    if !kvm_or_skip("progress_line") {
        return;
    }
    if Command::new("script").arg("--version").output().is_err() {
        skip("progress_line", "no `script` to give teravm a terminal");
        return;
    }
    let dir = temp_dir("progress-line");
    let cfg = config_file(
        &dir,
        &config_json(
            1,
            256,
            "touch=0 then=reset",
            r#", "memory": {"populate": true}"#,
        ),
    );
    let cmd = format!("{} --config-file {} --no-api", teravm(), cfg.display());
    let out = Command::new("script")
        .args(["-qec", &cmd, "/dev/null"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let tty = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{tty}");
    assert!(tty.contains("\x1b[Kpopulate: "), "{tty:?}");
    assert!(tty.contains("\x1b[Kreclaim: "), "{tty:?}");
    let (code, _, stderr) = run(&["--config-file", cfg.to_str().unwrap(), "--no-api"], T);
    assert_eq!(code, 0, "{stderr}");
    assert!(!stderr.contains('\x1b'), "{stderr:?}");
    summary(&stderr);
}
