//! Bad API input over the real socket against a running microVM: every
//! class gets the right 4xx (or the connection is simply closed), nothing
//! panics, the guest keeps running and the next request is answered.

mod common;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::client::{request, Connection};
use common::*;

const T: Duration = Duration::from_secs(60);

struct Running {
    vmm: Vmm,
    sock: PathBuf,
    _dir: PathBuf,
}

fn running_vm() -> Running {
    let dir = temp_dir("badinput");
    let sock = dir.join("api.sock");
    let cfg = config_file(&dir, &config_json(2, 256, "touch=32 then=idle", ""));
    let mut vmm = Vmm::spawn(&[
        "--api-sock",
        sock.to_str().unwrap(),
        "--config-file",
        cfg.to_str().unwrap(),
        "--linger-ms",
        "0",
    ]);
    // A config file starts the microVM at once, as in Firecracker.
    vmm.wait_line("teravm firmware: idle", T);
    Running {
        vmm,
        sock,
        _dir: dir,
    }
}

fn assert_alive(sock: &Path) {
    let (status, body) = request(sock, "GET", "/", None).expect("the API stopped answering");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(r#""state":"Running""#), "{body}");
}

/// Sends raw bytes on a fresh connection; returns the status line's code, or
/// None if the server closed without a reply.
fn raw(sock: &Path, bytes: &[u8]) -> Option<u16> {
    let mut s = UnixStream::connect(sock).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    // The server may close before everything is written (e.g. a huge header).
    let _ = s.write_all(bytes);
    let _ = s.shutdown(std::net::Shutdown::Write);
    let mut reply = Vec::new();
    let _ = s.read_to_end(&mut reply);
    let text = String::from_utf8_lossy(&reply);
    text.split_whitespace().nth(1).and_then(|c| c.parse().ok())
}

fn put(sock: &Path, path: &str, body: &str) -> (u16, String) {
    request(sock, "PUT", path, Some(body)).unwrap()
}

fn assert_400(sock: &Path, path: &str, body: &str, needle: &str) {
    let (status, reply) = put(sock, path, body);
    assert_eq!(status, 400, "{path} {body} -> {reply}");
    let v: serde_json::Value = serde_json::from_str(&reply).unwrap();
    let msg = v["fault_message"].as_str().unwrap();
    assert!(msg.contains(needle), "{msg:?} lacks {needle:?}");
}

#[test]
fn bad_input_classes_get_4xx_and_the_vm_keeps_running() {
    if !kvm_or_skip("bad_input_classes") {
        return;
    }
    let r = running_vm();
    let s = r.sock.as_path();

    // Truncated requests: the client goes away; nothing is answered.
    for truncated in [
        &b"GET / HTTP/1.1\r\nHost: x\r\n"[..],
        &b"PUT /reclaim HTTP/1.1\r\nContent-Length: 50\r\n\r\n{\"steal\""[..],
        &b"PUT /rec"[..],
    ] {
        let status = raw(s, truncated);
        assert!(matches!(status, None | Some(400)), "{status:?}");
    }
    assert_alive(s);

    // A 1 MiB header line, and a body over the limit.
    let mut huge = b"GET / HTTP/1.1\r\nX-Big: ".to_vec();
    huge.extend(std::iter::repeat_n(b'a', 1 << 20));
    huge.extend(b"\r\n\r\n");
    assert!(matches!(raw(s, &huge), Some(400) | None));
    let body = format!("{{\"steal\": true, \"pad\": \"{}\"}}", "x".repeat(70 << 10));
    assert_eq!(put(s, "/reclaim", &body).0, 413);
    assert_eq!(raw(s, b"NOT A REQUEST\r\n\r\n"), Some(400));
    assert_eq!(
        raw(s, b"GET / HTTP/1.1\r\nContent-Length: -5\r\n\r\n"),
        Some(400)
    );
    assert_alive(s);

    // Wrong JSON types, unknown fields, numbers out of range.
    assert_400(
        s,
        "/reclaim",
        r#"{"workers_per_node": "two"}"#,
        "workers_per_node",
    );
    assert_400(s, "/reclaim", r#"{"workers": 2}"#, "unknown field");
    assert_400(s, "/reclaim", r#"{"chunk_mib": 0}"#, "chunk_mib");
    assert_400(
        s,
        "/reclaim",
        r#"{"workers_per_node": 4294967296}"#,
        "workers_per_node",
    );
    for body in [
        r#"{"vcpu_count": 0, "mem_size_mib": 128}"#,
        r#"{"vcpu_count": 10000, "mem_size_mib": 128}"#,
        r#"{"vcpu_count": 1, "mem_size_mib": 0}"#,
        r#"{"vcpu_count": 1, "mem_size_mib": 1099511627776}"#,
    ] {
        let (status, reply) = put(s, "/machine-config", body);
        assert_eq!(status, 400, "{body} -> {reply}");
        assert!(reply.contains("fault_message"), "{reply}");
    }
    // NUL and invalid UTF-8 in strings.
    assert_400(
        s,
        "/boot-source",
        "{\"boot_args\": \"a\\u0000b\"}",
        "boot_args",
    );
    let body = b"{\"boot_args\": \"\xff\xfe\"}";
    let mut bad_utf8 = format!(
        "PUT /boot-source HTTP/1.1\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    bad_utf8.extend(body);
    assert_eq!(raw(s, &bad_utf8), Some(400));
    assert_eq!(raw(s, b"GET /\x00 HTTP/1.1\r\n\r\n"), Some(400));
    assert_alive(s);

    // The guest was running all along and the config is untouched.
    let (_, cfg) = request(s, "GET", "/vm/config", None).unwrap();
    assert!(cfg.contains(r#""vcpu_count":2"#), "{cfg}");
    assert!(cfg.contains("touch=32 then=idle"), "{cfg}");

    let (status, reply) = put(s, "/actions", r#"{"action_type":"Shutdown"}"#);
    assert_eq!(status, 200, "{reply}");
    let (code, _, stderr) = r.vmm.wait(T);
    assert_eq!(code, 0, "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn many_requests_many_clients_and_clients_that_go_away() {
    if !kvm_or_skip("many_requests") {
        return;
    }
    let r = running_vm();
    let s = r.sock.clone();

    // 1,000 requests on one connection.
    let mut c = Connection::open(&s).unwrap();
    for i in 0..1000 {
        let (status, _) = c.request("GET", "/reclaim", None).unwrap();
        assert_eq!(status, 200, "request {i}");
    }
    drop(c);

    // 64 clients at once, each with a few requests, while others send half a
    // request and go away.
    let clients: Vec<_> = (0..64)
        .map(|i| {
            let s = s.clone();
            std::thread::spawn(move || {
                if i % 8 == 0 {
                    let mut half = UnixStream::connect(&s).unwrap();
                    let _ = half.write_all(b"PUT /reclaim HTTP/1.1\r\nContent-Le");
                    return 0;
                }
                let mut ok = 0;
                // The server keeps at most 64 connections: a refused or
                // closed connection is retried.
                for _ in 0..200 {
                    if ok == 5 {
                        break;
                    }
                    match request(&s, "GET", "/", None) {
                        Ok((200, _)) => ok += 1,
                        // All 64 slots taken and this connection the slowest
                        // (a loaded host): shed with a 503 that says retry.
                        Ok((503, body)) if body.contains("retry") => {
                            std::thread::sleep(Duration::from_millis(10))
                        }
                        Ok((status, body)) => panic!("{status} {body}"),
                        Err(_) => std::thread::sleep(Duration::from_millis(10)),
                    }
                }
                ok
            })
        })
        .collect();
    let answered: usize = clients.into_iter().map(|t| t.join().unwrap()).sum();
    assert_eq!(answered, 56 * 5);
    assert_alive(&s);

    let (status, reply) = put(
        &s,
        "/actions",
        r#"{"action_type":"Shutdown","reclaim":"sync"}"#,
    );
    assert_eq!(status, 200, "{reply}");
    let (code, _, stderr) = r.vmm.wait(T);
    assert_eq!(code, 0, "{stderr}");
}

#[test]
fn a_symlink_at_the_socket_path_is_refused() {
    let dir = temp_dir("symlink");
    let target = dir.join("elsewhere");
    std::fs::write(&target, b"precious").unwrap();
    let sock = dir.join("api.sock");
    std::os::unix::fs::symlink(&target, &sock).unwrap();
    let (code, _, stderr) = run(&["--api-sock", sock.to_str().unwrap()], T);
    assert_eq!(code, 1, "{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert!(
        stderr.to_lowercase().contains("symlink") || stderr.contains("symbolic link"),
        "{stderr}"
    );
    assert_eq!(std::fs::read(&target).unwrap(), b"precious");
    assert!(std::fs::symlink_metadata(&sock)
        .unwrap()
        .file_type()
        .is_symlink());
}

#[test]
fn too_many_worker_threads_in_all_are_refused_before_start() {
    if !kvm_or_skip("worker_cap") {
        return;
    }
    let dir = temp_dir("worker-cap");
    let sys = fake_sysfs(&dir, 8);
    let cfg = config_file(
        &dir,
        &config_json(
            1,
            64,
            "touch=8 then=reset",
            r#", "memory": {"numa_policy": "none"}, "reclaim": {"workers_per_node": 256}"#,
        ),
    );
    let (code, stdout, stderr) = run(
        &[
            "--config-file",
            cfg.to_str().unwrap(),
            "--no-api",
            "--sysfs-root",
            sys.to_str().unwrap(),
        ],
        T,
    );
    assert_eq!(code, 1, "{stderr}");
    assert!(stdout.is_empty(), "the guest ran: {stdout:?}");
    assert!(stderr.contains("2048 threads"), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
}

#[test]
fn a_bad_memory_hotplug_section_is_one_line_and_exit_1() {
    if !kvm_or_skip("hotplug_section") {
        return;
    }
    let dir = temp_dir("hotplug-section");
    for (section, says) in [
        (r#"{"total_size_mib": 1000}"#, "multiple of slot size"),
        (
            r#"{"total_size_mib": 1024, "block_size_mib": 3}"#,
            "power of 2",
        ),
        (r#"{"total_size_mib": 4294967168}"#, "64 TiB"),
        (
            r#"{"total_size_mib": 1024, "requested_size_mib": 0}"#,
            "requested_size_mib",
        ),
    ] {
        let cfg = config_file(
            &dir,
            &config_json(
                1,
                64,
                "then=reset",
                &format!(r#", "memory-hotplug": {section}"#),
            ),
        );
        let (code, stdout, stderr) = run(&["--config-file", cfg.to_str().unwrap(), "--no-api"], T);
        assert_eq!(code, 1, "{section}: {stderr}");
        assert!(stdout.is_empty(), "the guest ran: {stdout:?}");
        assert!(
            stderr.contains("memory-hotplug") || stderr.contains(says),
            "{stderr}"
        );
        assert!(stderr.contains(says), "{section}: {stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    }
    // A good one is taken with Firecracker's defaults and shown.
    let sock = dir.join("api.sock");
    let cfg = config_file(
        &dir,
        &config_json(
            1,
            64,
            "then=idle",
            r#", "memory-hotplug": {"total_size_mib": 1024}"#,
        ),
    );
    let mut vmm = Vmm::spawn(&[
        "--api-sock",
        sock.to_str().unwrap(),
        "--config-file",
        cfg.to_str().unwrap(),
        "--linger-ms",
        "0",
    ]);
    vmm.wait_line("teravm firmware: idle", T);
    let (status, body) = request(&sock, "GET", "/vm/config", None).unwrap();
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        v["memory-hotplug"],
        serde_json::json!({"total_size_mib": 1024, "block_size_mib": 2, "slot_size_mib": 128})
    );
    let (status, body) = put(&sock, "/hotplug/memory", r#"{"total_size_mib": 2048}"#);
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("not allowed in state"), "{body}");
    assert_alive(&sock);
    common::api::shutdown_ok(vmm, &sock);
}
