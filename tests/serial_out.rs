//! `PUT /serial` (`serial_out_path`) on the real binary with the default
//! flags: the guest's serial output goes to that file and not to stdout; a
//! path that cannot be opened is a 400; a FIFO nobody reads does not block
//! the guest or the shutdown.

mod common;

use std::path::Path;
use std::time::Instant;

use common::api::*;
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

#[test]
fn a_fifo_nobody_reads_does_not_block_the_guest() {
    if !kvm_or_skip("serial_fifo") {
        return;
    }
    let dir = temp_dir("serial-fifo");
    let fifo = dir.join("serial.fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let (vmm, sock) = boot_with_serial("serial-fifo-vmm", &fifo);
    // The guest ran to its end with nobody reading: a reader opened now
    // finds its lines in the pipe. The shutdown is prompt.
    assert_eq!(state(&sock), "Running");
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
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&text).contains("teravm firmware: idle") {
        assert!(
            Instant::now() < deadline,
            "{:?}",
            String::from_utf8_lossy(&text)
        );
        match std::io::Read::read(&mut reader, &mut buf) {
            Ok(n) => text.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::thread::yield_now(),
            Err(e) => panic!("{e}"),
        }
    }
    shutdown_ok(vmm, &sock);
}
