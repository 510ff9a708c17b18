//! Helpers of the API integration tests (`tests/api.rs`, `tests/api_process.rs`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::client::request;
use serde_json::Value;

use super::*;

pub const T: Duration = Duration::from_secs(60);
pub const MIB: u64 = 1 << 20;

/// Starts teravm with an API socket in a fresh temp dir; returns once the
/// API answers.
pub fn start_api(name: &str, extra: &[&str]) -> (Vmm, PathBuf, PathBuf) {
    start_api_env(name, extra, &[])
}

/// [`start_api`] with `env` set for teravm (a fault to inject).
pub fn start_api_env(name: &str, extra: &[&str], env: &[(&str, &str)]) -> (Vmm, PathBuf, PathBuf) {
    let dir = temp_dir(name);
    let sock = dir.join("api.sock");
    let mut args = vec!["--api-sock", sock.to_str().unwrap()];
    args.extend_from_slice(extra);
    let vmm = Vmm::spawn_env(&args, env);
    wait_for_api(&sock, T);
    (vmm, sock, dir)
}

/// Starts teravm with an API socket and configures it from `json` (the
/// config file's sections) over the API, not started yet. (A config file
/// on the command line starts the microVM at once, as in Firecracker.)
pub fn start_configured(name: &str, json: &str, extra: &[&str]) -> (Vmm, PathBuf) {
    let (vmm, sock, _dir) = start_api(name, extra);
    let config: Value = serde_json::from_str(json).expect("a JSON config");
    for (section, body) in config.as_object().expect("a JSON object") {
        let (status, reply) = put(&sock, &format!("/{section}"), &body.to_string());
        assert_eq!(status, 204, "PUT /{section} {body}: {reply}");
    }
    (vmm, sock)
}

pub fn json(body: &str) -> Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body:?}"))
}

/// `GET path`, expecting 200 and a JSON body.
pub fn get(sock: &Path, path: &str) -> Value {
    let (status, body) = request(sock, "GET", path, None).unwrap();
    assert_eq!(status, 200, "GET {path}: {body}");
    json(&body)
}

pub fn put(sock: &Path, path: &str, body: &str) -> (u16, String) {
    request(sock, "PUT", path, Some(body)).unwrap()
}

/// `PUT path` expecting 204 and no body.
pub fn put_ok(sock: &Path, path: &str, body: &str) {
    let (status, reply) = put(sock, path, body);
    assert_eq!(status, 204, "PUT {path} {body}: {reply}");
    assert!(reply.is_empty(), "204 with a body: {reply:?}");
}

pub fn action(sock: &Path, body: &str) -> (u16, String) {
    put(sock, "/actions", body)
}

pub fn state(sock: &Path) -> String {
    get(sock, "/")["state"].as_str().unwrap().to_string()
}

/// A 400 whose `fault_message` contains `needle`.
pub fn assert_fault(status: u16, body: &str, code: u16, needle: &str) {
    assert_eq!(status, code, "{body}");
    let msg = json(body)["fault_message"]
        .as_str()
        .unwrap_or_else(|| panic!("no fault_message in {body}"))
        .to_string();
    assert!(msg.contains(needle), "{msg:?} lacks {needle:?}");
}

/// The N of the firmware's `touched N MiB in ...` line, in bytes.
pub fn touched_bytes(line: &str) -> u64 {
    touched_mib(line) * MIB
}

pub fn u(v: &Value, key: &str) -> u64 {
    v[key]
        .as_u64()
        .unwrap_or_else(|| panic!("no number {key} in {v}"))
}

/// Waits (at most [`T`]) until no discard of a live-memory device is in
/// flight (`GET /hotplug/memory`'s `discards_in_flight`); returns that
/// status.
pub fn discards_done(sock: &Path) -> Value {
    let deadline = std::time::Instant::now() + T;
    loop {
        let st = get(sock, "/hotplug/memory");
        if u(&st, "discards_in_flight") == 0 {
            return st;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "discards still running: {st}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// `Shutdown` through the API (answered 200), then exit 0; returns the
/// stdout lines.
pub fn shutdown_ok(vmm: Vmm, sock: &Path) -> Vec<String> {
    let (status, body) = action(sock, r#"{"action_type": "Shutdown"}"#);
    assert_eq!(status, 200, "{body}");
    exits_ok(vmm).0
}

/// Waits for exit 0 and returns (stdout lines, stderr).
pub fn exits_ok(vmm: Vmm) -> (Vec<String>, String) {
    let (code, stdout, stderr) = vmm.wait(T);
    assert_eq!(code, 0, "stdout {stdout:?} stderr {stderr}");
    (stdout, stderr)
}
