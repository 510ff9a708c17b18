//! `PUT /serial` (`serial_out_path`) on the real binary with the default
//! flags: the guest's serial output goes to that file and not to stdout; a
//! path that cannot be opened is a 400; a FIFO nobody reads does not block
//! the guest (which writes well over what the pipe and teravm's console
//! buffer hold) or what comes after.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::api::*;
use common::guests::Guest;
use common::*;

/// Boots the firmware (`touch=8 then=idle`) with `PUT /serial` at `path`.
fn boot_with_serial(name: &str, path: &Path) -> (Vmm, std::path::PathBuf) {
    let (vmm, sock, _dir) = start_api(name, &[]);
    put_ok(
        &sock,
        "/machine-config",
        r#"{"vcpu_count": 1, "mem_size_mib": 64, "huge_pages": "None"}"#,
    );
    put_ok(
        &sock,
        "/serial",
        &format!(r#"{{"serial_out_path": "{}"}}"#, path.display()),
    );
    put_ok(
        &sock,
        "/boot-source",
        r#"{"boot_args": "touch=8 then=idle"}"#,
    );
    let (s, b) = action(&sock, r#"{"action_type": "InstanceStart"}"#);
    assert_eq!(s, 204, "{b}");
    (vmm, sock)
}

#[test]
fn the_guests_lines_go_to_the_file_not_to_stdout() {
    if !kvm_or_skip("serial_out") {
        return;
    }
    let dir = temp_dir("serial-out");
    let path = dir.join("serial.log");
    let (vmm, sock) = boot_with_serial("serial-out-vmm", &path);
    let deadline = Instant::now() + T;
    loop {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        if text.contains("teravm firmware: idle") {
            break;
        }
        assert!(Instant::now() < deadline, "the serial file has: {text:?}");
        std::thread::yield_now();
    }
    let stdout = shutdown_ok(vmm, &sock);
    assert!(
        !stdout.iter().any(|l| l.contains("teravm firmware:")),
        "{stdout:?}"
    );
}

#[test]
fn a_path_that_cannot_be_opened_is_a_400() {
    let (vmm, sock, dir) = start_api("serial-bad", &[]);
    for (body, needle) in [
        (
            format!(r#"{{"serial_out_path": "{}"}}"#, dir.display()),
            "serial.serial_out_path",
        ),
        (
            r#"{"serial_out_path": "/no/such/dir/serial.log"}"#.to_string(),
            "serial.serial_out_path",
        ),
        (
            r#"{"serial_out_path": ""}"#.to_string(),
            "serial.serial_out_path",
        ),
        (r#"{"path": "x"}"#.to_string(), "unknown field"),
    ] {
        let (s, b) = put(&sock, "/serial", &body);
        assert_fault(s, &b, 400, needle);
    }
    assert_eq!(state(&sock), "Not started");
    drop(vmm);
}

/// The hostile paths of [`a_path_that_cannot_be_opened_is_a_400`], asked
/// of the real Firecracker: the same requests to it and to teravm. Neither
/// runs a guest writing there: Firecracker takes the `PUT /serial` (204)
/// and refuses the `InstanceStart` (400, the path is opened only then),
/// teravm refuses the `PUT` itself (400: it opens the path at once,
/// docs/firecracker.md); both with a `fault_message`, both still "Not
/// started", nothing made at the path. An unknown field is a 400 at the
/// `PUT` on both. And a good path: both take it, start, and the guest's
/// line lands in the file, not on stdout.
#[test]
fn hostile_paths_are_refused_as_firecracker_refuses_them() {
    let test = "serial_hostile_as_firecracker";
    if !kvm_or_skip(test) {
        return;
    }
    let Some(fc) = firecracker(test) else {
        return;
    };
    let machine = r#"{"vcpu_count": 1, "mem_size_mib": 128, "huge_pages": "None"}"#;
    let boot = Guest::TestGuest.boot_source("then=idle");
    let both = common::fc_api::Both::start(test, &fc, &[]);
    both.put_ok("/machine-config", machine);
    both.put_ok("/boot-source", &boot);
    let dir = temp_dir("serial-hostile-paths");
    let missing = dir.join("no/such/dir/serial.log");
    for path in [
        dir.display().to_string(),
        missing.display().to_string(),
        String::new(),
    ] {
        let body = format!(r#"{{"serial_out_path": "{path}"}}"#);
        let ((fs, fb), (ts, tb)) = both.ask("PUT", "/serial", Some(&body));
        assert_eq!(fs, 204, "Firecracker PUT /serial {path:?}: {fb}");
        assert_fault(ts, &tb, 400, "serial.serial_out_path");
        let (fs, fb) = both.fc.ask(
            "PUT",
            "/actions",
            Some(r#"{"action_type": "InstanceStart"}"#),
        );
        assert_eq!(
            fs, 400,
            "Firecracker started with serial_out_path {path:?}: {fb}"
        );
        assert!(common::fc_api::has_fault(&fb), "{fb}");
        assert_eq!(
            (both.fc.state(), both.tv.state()),
            ("Not started".to_string(), "Not started".to_string()),
            "{path:?}"
        );
    }
    assert!(!missing.exists() && !dir.join("no").exists());
    let (s, _) = both.same("PUT", "/serial", Some(r#"{"path": "x"}"#));
    assert_eq!(s, 400);
    drop(both);

    // A good path, on a fresh pair: taken, started, written.
    let both = common::fc_api::Both::start(test, &fc, &[]);
    let mut files = Vec::new();
    for side in [&both.fc, &both.tv] {
        let file = side.dir.join("serial.log");
        let body = format!(r#"{{"serial_out_path": "{}"}}"#, file.display());
        side.put_ok("/serial", &body);
        files.push(file);
    }
    both.boot_test_guest(machine, "then=idle");
    let deadline = Instant::now() + T;
    for file in &files {
        loop {
            let text = std::fs::read_to_string(file).unwrap_or_default();
            if text.contains("teravm guest: idle") {
                break;
            }
            assert!(Instant::now() < deadline, "{}: {text:?}", file.display());
            std::thread::yield_now();
        }
    }
}

/// Bytes of the test guest's `rng data` lines for `bytes` bytes of
/// `rng-dump` (128 bytes, 256 hex digits, a line).
fn dump_bytes(bytes: usize) -> usize {
    (0..bytes)
        .step_by(128)
        .map(|off| format!("teravm guest: rng data {off} ").len() + 256 + 1)
        .sum()
}

/// What the host side can hold of a console nobody reads before it drops:
/// the console buffer (64 KiB), the batch its writer is stuck writing (at
/// most as much) and the pipe (64 KiB).
const HELD_AT_MOST: usize = 3 * 64 * 1024;

/// `teravm.console.bytes_dropped` of a fresh metrics line.
fn console_dropped(sock: &Path, metrics: &Path) -> u64 {
    let (s, b) = action(sock, r#"{"action_type": "FlushMetrics"}"#);
    assert_eq!(s, 204, "{b}");
    let text = std::fs::read_to_string(metrics).unwrap();
    u(
        &json(text.lines().last().unwrap())["teravm"]["console"],
        "bytes_dropped",
    )
}

#[test]
fn a_fifo_nobody_reads_does_not_block_the_guest() {
    // The test guest prints 256 KiB of random bytes in hex (some 570 KiB,
    // three times what the host side can hold) into a FIFO nobody reads:
    // a vCPU that waited for the reader would stop once the pipe is full.
    // It must run on to its end (the host drops and counts what does not
    // fit), park, and still answer a Ctrl-Alt-Del (a reset, which ends
    // teravm).
    if !kvm_or_skip("serial_fifo") {
        return;
    }
    assert!(guest().is_file(), "no test guest at {}", guest().display());
    let dir = temp_dir("serial-fifo");
    let fifo = dir.join("serial.fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let (mut vmm, sock, _) = start_api("serial-fifo-vmm", &[]);
    put_ok(
        &sock,
        "/machine-config",
        r#"{"vcpu_count": 1, "mem_size_mib": 128, "huge_pages": "None"}"#,
    );
    let metrics = dir.join("metrics");
    put_ok(
        &sock,
        "/metrics",
        &format!(r#"{{"metrics_path": "{}"}}"#, metrics.display()),
    );
    put_ok(&sock, "/entropy", "{}");
    put_ok(
        &sock,
        "/serial",
        &format!(r#"{{"serial_out_path": "{}"}}"#, fifo.display()),
    );
    const RNG: usize = 256 << 10;
    put_ok(
        &sock,
        "/boot-source",
        &Guest::TestGuest.boot_source(&format!("rng={RNG} rng-dump then=idle")),
    );
    let (s, b) = action(&sock, r#"{"action_type": "InstanceStart"}"#);
    assert_eq!(s, 204, "{b}");
    // The guest wrote all but the host's share of its dump with nobody
    // reading: what the host dropped says how far the vCPU got.
    let want = (dump_bytes(RNG) - HELD_AT_MOST) as u64;
    let deadline = Instant::now() + T;
    let mut dropped = 0;
    while dropped < want {
        assert!(
            Instant::now() < deadline,
            "the guest's console got only {dropped} bytes past a full FIFO within {T:?} \
             (of at least {want}): the vCPU stopped on the host's pipe"
        );
        assert!(
            vmm.child.try_wait().unwrap().is_none(),
            "teravm exited: {:?}",
            vmm.drain(Duration::from_millis(100)).1
        );
        // A look every 50 ms: each look is a metrics line in the file.
        std::thread::sleep(Duration::from_millis(50));
        dropped = console_dropped(&sock, &metrics);
    }
    assert_eq!(state(&sock), "Running");
    // A reader now gets what the pipe held: the guest's first lines.
    let mut reader = {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&fifo)
            .unwrap()
    };
    let deadline = Instant::now() + T;
    let mut text = Vec::new();
    let mut buf = [0u8; 65536];
    while !String::from_utf8_lossy(&text).contains("teravm guest: rng data 0 ") {
        assert!(
            Instant::now() < deadline,
            "no first data line from the FIFO; it has: {:?}",
            String::from_utf8_lossy(&text)
        );
        match std::io::Read::read(&mut reader, &mut buf) {
            Ok(n) => text.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::thread::yield_now(),
            Err(e) => panic!("{e}"),
        }
    }
    assert!(text.starts_with(b"teravm guest: "), "{:?}", &text[..80]);
    // And the vCPU still runs the guest: parked after its last line, it
    // takes a Ctrl-Alt-Del and resets, which ends teravm.
    let (s, b) = action(&sock, r#"{"action_type": "SendCtrlAltDel"}"#);
    assert_eq!(s, 204, "{b}");
    let (code, stdout, stderr) = vmm.wait(T);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        !stdout.iter().any(|l| l.contains("teravm guest:")),
        "the guest's lines went to stdout too: {stdout:?}"
    );
}
