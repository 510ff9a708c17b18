//! `PATCH /vm` Paused / Resumed, through a guest: the test guest's
//! `tick=<ms>` prints a line every few ms; paused, no line comes (the
//! vCPUs are out of the guest when the 204 comes, so the silence is
//! checked over a window after it); resumed, the next tick comes. Firecracker's
//! answers: a 400 before start, 204 for a pause while paused and a resume
//! while running, `GET /` says `"Paused"`. A shutdown while paused (the
//! API, or SIGTERM) still stops the held vCPUs and reclaims the memory.

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use common::api::*;
use common::client::request;
use common::*;

/// teravm with its API and the lines of its console, read here (the test
/// needs to see that none come for a while).
struct Teravm {
    child: Child,
    lines: Receiver<String>,
    stderr: Receiver<String>,
}

fn lines_of(from: impl std::io::Read + Send + 'static) -> Receiver<String> {
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        for l in BufReader::new(from).lines().map_while(Result::ok) {
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    rx
}

impl Teravm {
    fn start(sock: &Path) -> Teravm {
        let mut child = Command::new(teravm())
            .args(["--api-sock", sock.to_str().unwrap()])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let lines = lines_of(child.stdout.take().unwrap());
        let stderr = lines_of(child.stderr.take().unwrap());
        wait_for_api(sock, T);
        Teravm {
            child,
            lines,
            stderr,
        }
    }

    /// The next `tick <n>`'s n, waiting at most `within`.
    fn tick(&self, within: Duration) -> Result<u64, RecvTimeoutError> {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let l = self.lines.recv_timeout(left)?;
            if let Some(n) = l.strip_prefix("teravm guest: tick ") {
                return Ok(n.parse().unwrap());
            }
        }
    }

    /// Every tick already written, the last one's n: lines are taken until
    /// none comes for 200 ms. A guest that was not paused never goes quiet,
    /// so lines still coming `within` after the call are a failure.
    fn last_tick(&self, within: Duration) -> Option<u64> {
        let deadline = Instant::now() + within;
        let mut last = None;
        while let Ok(l) = self.lines.recv_timeout(Duration::from_millis(200)) {
            if let Some(n) = l.strip_prefix("teravm guest: tick ") {
                last = Some(n.parse().unwrap());
            }
            assert!(
                Instant::now() < deadline,
                "the console still writes {within:?} after the pause's 204 \
                 (last tick {last:?}, last line {l:?}): the vCPUs did not stop"
            );
        }
        last
    }

    /// Waits for the exit: (code, stderr).
    fn wait(mut self) -> (i32, String) {
        let deadline = Instant::now() + T;
        let status = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break s;
            }
            assert!(
                Instant::now() < deadline,
                "teravm did not exit within {T:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        let err: Vec<String> = self.stderr.try_iter().collect();
        (status.code().unwrap_or(-1), err.join("\n"))
    }
}

fn patch_vm(sock: &Path, body: &str) -> (u16, String) {
    request(sock, "PATCH", "/vm", Some(body)).unwrap()
}

/// Starts the guest ticking every 10 ms on 2 vCPUs, after touching 32 MiB.
fn ticking(name: &str) -> (Teravm, std::path::PathBuf) {
    let dir = temp_dir(name);
    let sock = dir.join("api.sock");
    let vm = Teravm::start(&sock);
    let (s, b) = patch_vm(&sock, r#"{"state": "Paused"}"#);
    assert_fault(s, &b, 400, "before starting");
    put_ok(
        &sock,
        "/machine-config",
        r#"{"vcpu_count": 2, "mem_size_mib": 256}"#,
    );
    put_ok(
        &sock,
        "/boot-source",
        &format!(
            r#"{{"kernel_image_path": "{}", "boot_args": "touch=32 tick=10"}}"#,
            guest().display()
        ),
    );
    let (s, b) = action(&sock, r#"{"action_type": "InstanceStart"}"#);
    assert_eq!(s, 204, "{b}");
    (vm, sock)
}

/// Pauses, checks the silence, and returns the last tick before it
/// (`seen` if none came after that one).
fn pause(vm: &Teravm, sock: &Path, seen: u64) -> u64 {
    let (s, b) = patch_vm(sock, r#"{"state": "Paused"}"#);
    assert_eq!(s, 204, "{b}");
    assert_eq!(state(sock), "Paused");
    // What was written before the vCPUs left the guest still drains.
    let last = vm.last_tick(Duration::from_secs(5)).unwrap_or(seen);
    // Then nothing: a guest that ran would print 50 ticks in this window.
    assert_eq!(
        vm.tick(Duration::from_millis(500)),
        Err(RecvTimeoutError::Timeout),
        "a tick while paused"
    );
    last
}

#[test]
fn paused_guest_stops_and_resumes() {
    if !kvm_or_skip("paused_guest_stops_and_resumes") {
        return;
    }
    let (vm, sock) = ticking("pause");
    let first = vm.tick(T).expect("the guest ticks");
    assert_eq!(state(&sock), "Running");
    // A resume while running: nothing to do, 204 (as Firecracker).
    assert_eq!(patch_vm(&sock, r#"{"state": "Resumed"}"#).0, 204);
    let last = pause(&vm, &sock, first);
    // A pause while paused: 204, still paused. Bad bodies: 400.
    assert_eq!(patch_vm(&sock, r#"{"state": "Paused"}"#).0, 204);
    for bad in [
        r#"{"state": "Running"}"#,
        r#"{"state": "Paused", "x": 1}"#,
        r#"{}"#,
        "",
    ] {
        let (s, b) = patch_vm(&sock, bad);
        assert_fault(s, &b, 400, "vm");
    }
    assert_eq!(state(&sock), "Paused");
    let (s, b) = patch_vm(&sock, r#"{"state": "Resumed"}"#);
    assert_eq!(s, 204, "{b}");
    assert_eq!(state(&sock), "Running");
    let next = vm.tick(T).expect("a tick after the resume");
    assert_eq!(next, last + 1, "the guest goes on where it stopped");
    // Paused again, then shut down through the API: the held vCPUs stop
    // and the memory comes back.
    pause(&vm, &sock, next);
    let (s, b) = action(&sock, r#"{"action_type": "Shutdown", "reclaim": "sync"}"#);
    assert_eq!(s, 200, "{b}");
    let (code, err) = vm.wait();
    assert_eq!(code, 0, "{err}");
    let (mib, _, _) = summary(&err);
    assert!(mib >= 28, "reclaimed only {mib} MiB: {err}");
}

#[test]
fn sigterm_while_paused_reclaims() {
    if !kvm_or_skip("sigterm_while_paused_reclaims") {
        return;
    }
    let (vm, sock) = ticking("pause-term");
    let first = vm.tick(T).expect("the guest ticks");
    pause(&vm, &sock, first);
    // SAFETY: kill(2) on the child we started.
    assert_eq!(
        unsafe { libc::kill(vm.child.id() as i32, libc::SIGTERM) },
        0
    );
    let (code, err) = vm.wait();
    assert_eq!(code, 0, "{err}");
    let (mib, _, _) = summary(&err);
    assert!(mib >= 28, "reclaimed only {mib} MiB: {err}");
}

/// Every console line already written is taken (until none comes for
/// 200 ms, within 5 s: a guest still running never goes quiet), then none
/// may come for 500 ms (a guest that ran would print 50 ticks). `who`
/// names the VMM.
fn falls_silent(vmm: &mut Vmm, who: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while let Some(l) = vmm.next_line(Duration::from_millis(200)) {
        assert!(
            Instant::now() < deadline,
            "{who}: the console still writes 5 s after the pause's 204 ({l:?})"
        );
    }
    assert_eq!(
        vmm.next_line(Duration::from_millis(500)),
        None,
        "{who}: a line while paused"
    );
}

/// The answers this file's tests take as Firecracker's, asked of the real
/// Firecracker: the same requests to it and to teravm, the test guest
/// ticking on each (`tick=10`), and each must answer alike (status, and a
/// `fault_message` or none), say the same state in `GET /`, fall silent
/// while paused and tick again once resumed.
#[test]
fn firecracker_answers_the_pause_requests_as_teravm_does() {
    let test = "pause_as_firecracker";
    if !kvm_or_skip(test) {
        return;
    }
    let Some(fc) = firecracker(test) else {
        return;
    };
    let mut both = common::fc_api::Both::start(test, &fc, &[]);
    let patch = |both: &common::fc_api::Both, body: &str| both.same("PATCH", "/vm", Some(body));
    // Before start: a 400 on both.
    assert_eq!(patch(&both, r#"{"state": "Paused"}"#).0, 400);
    both.boot_test_guest(
        r#"{"vcpu_count": 1, "mem_size_mib": 128, "huge_pages": "None"}"#,
        "tick=10",
    );
    for side in [&mut both.fc, &mut both.tv] {
        side.vmm.wait_line("teravm guest: tick", T);
    }
    let states = |both: &common::fc_api::Both, want: &str| {
        assert_eq!(
            (both.fc.state(), both.tv.state()),
            (want.to_string(), want.to_string())
        );
    };
    states(&both, "Running");
    // A resume while running, a pause, a pause while paused.
    assert_eq!(patch(&both, r#"{"state": "Resumed"}"#).0, 204);
    assert_eq!(patch(&both, r#"{"state": "Paused"}"#).0, 204);
    states(&both, "Paused");
    falls_silent(&mut both.fc.vmm, "firecracker");
    falls_silent(&mut both.tv.vmm, "teravm");
    assert_eq!(patch(&both, r#"{"state": "Paused"}"#).0, 204);
    for bad in [
        r#"{"state": "Running"}"#,
        r#"{"state": "Paused", "x": 1}"#,
        r#"{}"#,
        "",
    ] {
        assert_eq!(patch(&both, bad).0, 400, "{bad:?}");
    }
    states(&both, "Paused");
    assert_eq!(patch(&both, r#"{"state": "Resumed"}"#).0, 204);
    states(&both, "Running");
    for side in [&mut both.fc, &mut both.tv] {
        side.vmm.wait_line("teravm guest: tick", T);
    }
}
