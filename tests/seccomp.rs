//! seccomp on the real binary and /dev/kvm: every thread of a running
//! microVM is filtered; a vCPU that makes a forbidden call ends the process
//! with the documented code and a line naming the call and the thread;
//! `--no-seccomp` leaves every thread unfiltered.

mod common;

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use common::api::*;
use common::*;

/// `(comm, Seccomp mode)` of every thread of `pid`.
fn thread_modes(pid: u32) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let dir = entry.unwrap().path();
        let (Ok(comm), Ok(status)) = (
            std::fs::read_to_string(dir.join("comm")),
            std::fs::read_to_string(dir.join("status")),
        ) else {
            continue; // the thread ended between the listing and the read
        };
        let mode = status
            .lines()
            .find_map(|l| l.strip_prefix("Seccomp:"))
            .unwrap_or("?")
            .trim()
            .to_string();
        out.push((comm.trim_end().to_string(), mode));
    }
    out.sort();
    out
}

/// Waits until `pid` has threads with each of `names`; returns them all.
fn wait_threads(pid: u32, names: &[&str]) -> Vec<(String, String)> {
    let deadline = Instant::now() + T;
    loop {
        let threads = thread_modes(pid);
        if names.iter().all(|n| threads.iter().any(|(c, _)| c == n)) {
            return threads;
        }
        assert!(Instant::now() < deadline, "no {names:?} in {threads:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A running microVM with an API connection open mid-request, so that
/// every kind of thread it has while running is there: `teravm`, `api`,
/// `api-conn`, `vcpu0`, `vcpu1`, `console`. Returns the threads and their
/// modes.
fn running_threads(name: &str, extra: &[&str]) -> Vec<(String, String)> {
    let (mut vmm, sock) = start_configured(
        name,
        &config_json(2, 128, "touch=16 then=idle", ""),
        &[&["--linger-ms", "0"], extra].concat(),
    );
    let (s, b) = action(&sock, r#"{"action_type": "InstanceStart"}"#);
    assert_eq!(s, 204, "{b}");
    vmm.wait_line("teravm firmware: idle", T);
    // A client that sent half a request holds its api-conn thread.
    let mut half = UnixStream::connect(&sock).unwrap();
    half.write_all(b"GET / HTTP/1.1\r\n").unwrap();
    let threads = wait_threads(
        vmm.child.id(),
        &["teravm", "api", "api-conn", "vcpu0", "vcpu1", "console"],
    );
    drop(half);
    let (s, b) = action(&sock, r#"{"action_type": "Shutdown", "reclaim": "sync"}"#);
    assert_eq!(s, 200, "{b}");
    exits_ok(vmm);
    threads
}

#[test]
fn every_thread_of_a_running_microvm_is_filtered() {
    if !kvm_or_skip("every_thread_of_a_running_microvm_is_filtered") {
        return;
    }
    let threads = running_threads("seccomp-on", &[]);
    for (comm, mode) in &threads {
        assert_eq!(mode, "2", "thread {comm} is not filtered: {threads:?}");
    }
}

#[test]
fn no_seccomp_leaves_every_thread_unfiltered() {
    if !kvm_or_skip("no_seccomp_leaves_every_thread_unfiltered") {
        return;
    }
    let threads = running_threads("seccomp-off", &["--no-seccomp"]);
    for (comm, mode) in &threads {
        assert_eq!(mode, "0", "thread {comm} is filtered: {threads:?}");
    }
}

#[test]
fn a_forbidden_call_on_a_vcpu_ends_the_process_with_148() {
    if !kvm_or_skip("a_forbidden_call_on_a_vcpu_ends_the_process_with_148") {
        return;
    }
    let dir = temp_dir("seccomp-trap");
    let cfg = config_file(&dir, &config_json(1, 128, "touch=16 then=reset", ""));
    let args = ["--config-file", cfg.to_str().unwrap(), "--no-api"];
    let env = [("TERAVM_FAULT_INJECT", "vcpu-forbidden-syscall")];
    let (code, stdout, stderr) = Vmm::spawn_env(&args, &env).wait(T);
    assert_eq!(
        code,
        teravm::vmm::EXIT_BAD_SYSCALL,
        "stdout {stdout:?} stderr {stderr}"
    );
    assert_eq!(code, 148);
    let line = stderr
        .lines()
        .find(|l| l.starts_with("teravm: seccomp: "))
        .unwrap_or_else(|| panic!("no seccomp line in {stderr}"));
    assert!(
        line.starts_with("teravm: seccomp: thread vcpu0 made a forbidden system call 41 (socket)"),
        "{line}"
    );
    assert!(line.ends_with("; exiting with code 148"), "{line}");
    // The vCPU never ran the guest.
    assert!(
        !stdout
            .iter()
            .any(|l| l.contains("teravm firmware: touched")),
        "{stdout:?}"
    );

    // The same fault without filters: the call is made and the VM runs on.
    let no_seccomp = [&args[..], &["--no-seccomp"]].concat();
    let (code, stdout, stderr) = Vmm::spawn_env(&no_seccomp, &env).wait(T);
    assert_eq!(code, 0, "stdout {stdout:?} stderr {stderr}");
    assert!(stderr.contains("socket() succeeded"), "{stderr}");
    assert!(
        stdout.iter().any(|l| l.contains("teravm firmware: reset")),
        "{stdout:?}"
    );
}
