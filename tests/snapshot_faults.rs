//! Snapshots' bad input and faults (issue 36), on the real binary and the
//! default flags: a create while running, a full disk mid-create (a
//! size-limited tmpfs), a load after configuring; a corrupt, truncated,
//! other-version, hostile state file; a memory file shorter than the
//! state's memory; Firecracker's malicious uffd handler. Each is a 400
//! saying which, nothing is left behind, the process keeps answering, and
//! where a guest was running it goes on whole.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::api::*;
use common::guests::Guest;
use common::*;

const RAM_MIB: u64 = 128;
const TOUCH_MIB: u64 = 32;

fn verify_ok() -> String {
    format!("teravm guest: verify {TOUCH_MIB} MiB ok")
}

fn patch(sock: &Path, path: &str, body: &str) -> (u16, String) {
    common::client::request(sock, "PATCH", path, Some(body)).unwrap()
}

fn boot(name: &str) -> (Vmm, PathBuf, PathBuf) {
    let (mut vmm, sock, dir) = start_api(name, &[]);
    put_ok(
        &sock,
        "/machine-config",
        &format!(r#"{{"vcpu_count": 1, "mem_size_mib": {RAM_MIB}}}"#),
    );
    let words = format!("touch={TOUCH_MIB} verify-every=100");
    put_ok(&sock, "/boot-source", &Guest::TestGuest.boot_source(&words));
    let (s, b) = action(&sock, r#"{"action_type": "InstanceStart"}"#);
    assert_eq!(s, 204, "{b}");
    assert_eq!(vmm.wait_line("teravm guest: verify ", T), verify_ok());
    (vmm, sock, dir)
}

fn create_body(state: &Path, mem: &Path) -> String {
    format!(
        r#"{{"snapshot_path": "{}", "mem_file_path": "{}"}}"#,
        state.display(),
        mem.display()
    )
}

fn files_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// A good snapshot of a small guest in `dir` (the guest is then shut down).
fn good_snapshot(name: &str) -> (PathBuf, PathBuf, PathBuf) {
    let (vmm, sock, dir) = boot(name);
    let (s, b) = patch(&sock, "/vm", r#"{"state": "Paused"}"#);
    assert_eq!(s, 204, "{b}");
    let (state, mem) = (dir.join("vm.state"), dir.join("vm.mem"));
    let (s, b) = put(&sock, "/snapshot/create", &create_body(&state, &mem));
    assert_eq!(s, 204, "{b}");
    shutdown_ok(vmm, &sock);
    (dir, state, mem)
}

#[test]
fn a_create_while_running_is_refused_and_a_full_disk_leaves_nothing_and_the_guest_goes_on() {
    if !kvm_or_skip("snap_create_faults") {
        return;
    }
    let _big = big_memory();
    let (mut vmm, sock, dir) = boot("snap-create-faults");
    let (state, mem) = (dir.join("vm.state"), dir.join("vm.mem"));
    // Running: Firecracker's refusal, nothing written.
    let (s, b) = put(&sock, "/snapshot/create", &create_body(&state, &mem));
    assert_fault(s, &b, 400, "unavailable while running");
    assert!(!state.exists() && !mem.exists());
    // A tmpfs too small for the memory file.
    let small = dir.join("small");
    std::fs::create_dir(&small).unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=8m", "tmpfs"])
        .arg(&small)
        .status()
        .is_ok_and(|s| s.success());
    let (s, b) = patch(&sock, "/vm", r#"{"state": "Paused"}"#);
    assert_eq!(s, 204, "{b}");
    if mounted {
        let (st, me) = (small.join("vm.state"), small.join("vm.mem"));
        let (s, b) = put(&sock, "/snapshot/create", &create_body(&st, &me));
        assert_fault(s, &b, 400, &me.display().to_string());
        assert_eq!(
            files_in(&small),
            Vec::<String>::new(),
            "nothing left on the full disk"
        );
        assert_eq!(common::api::state(&sock), "Paused");
        let _ = Command::new("umount").arg(&small).status();
    } else {
        not_possible("snap_create_full_disk", "cannot mount a tmpfs (not root)");
    }
    // A directory that does not exist: a 400 naming the path.
    let nowhere = dir.join("no/such/dir/vm.mem");
    let (s, b) = put(&sock, "/snapshot/create", &create_body(&state, &nowhere));
    assert_fault(s, &b, 400, "no/such/dir");
    assert!(!state.exists());
    // The guest resumes whole.
    let (s, b) = patch(&sock, "/vm", r#"{"state": "Resumed"}"#);
    assert_eq!(s, 204, "{b}");
    for _ in 0..2 {
        assert_eq!(vmm.wait_line("teravm guest: verify ", T), verify_ok());
    }
    shutdown_ok(vmm, &sock);
}

fn load_body(state: &Path, mem: &Path) -> String {
    format!(
        r#"{{"snapshot_path": "{}", "mem_backend": {{"backend_type": "File", "backend_path": "{}"}}, "resume_vm": true}}"#,
        state.display(),
        mem.display()
    )
}

/// Loads `body` into a fresh teravm expecting a 400 containing `needle`;
/// the process is then still fresh: `GET /` answers "Not started" and a
/// good load succeeds.
fn refused_then_good(name: &str, body: &str, needle: &str, good: &str) {
    let (mut vmm, sock, _dir) = start_api(name, &[]);
    let (s, b) = put(&sock, "/snapshot/load", body);
    assert_fault(s, &b, 400, needle);
    assert_eq!(common::api::state(&sock), "Not started");
    let (s, b) = put(&sock, "/snapshot/load", good);
    assert_eq!(s, 204, "{b}");
    assert_eq!(vmm.wait_line("teravm guest: verify ", T), verify_ok());
    shutdown_ok(vmm, &sock);
}

#[test]
fn bad_state_files_and_short_memory_files_are_400s_and_the_process_stays_fresh() {
    if !kvm_or_skip("snap_load_faults") {
        return;
    }
    let _big = big_memory();
    let (dir, state, mem) = good_snapshot("snap-load-faults");
    let good = load_body(&state, &mem);
    let bytes = std::fs::read(&state).unwrap();
    let variant = |name: &str, b: &[u8]| {
        let p = dir.join(name);
        std::fs::write(&p, b).unwrap();
        p
    };
    let mut corrupt = bytes.clone();
    let mid = corrupt.len() / 2;
    corrupt[mid] ^= 0x20;
    let mut version = bytes.clone();
    version[8] = 9;
    // A hostile file: a whole envelope (right CRC) around numbers that
    // would allocate terabytes if believed.
    let hostile_payload = br#"{"teravm_version":"x","config":{"machine-config":{"vcpu_count":255,"mem_size_mib":1099511627776}},"memory":[],"vcpus":[],"vm":{},"devices":{}}"#;
    let hostile = teravm::snapshot::state_file::encode(
        &serde_json::from_slice::<serde_json::Value>(hostile_payload).unwrap(),
    )
    .unwrap();
    for (name, content, needle) in [
        ("corrupt.state", corrupt, "corrupt"),
        (
            "short.state",
            bytes[..bytes.len() - 100].to_vec(),
            "truncated",
        ),
        ("v9.state", version, "version 9"),
        (
            "other.state",
            b"not a snapshot at all".to_vec(),
            "not a teravm snapshot",
        ),
        ("hostile.state", hostile, "invalid"),
    ] {
        let p = variant(name, &content);
        refused_then_good(name, &load_body(&p, &mem), needle, &good);
    }
    // A memory file shorter than the state's memory.
    let short = dir.join("short.mem");
    std::fs::copy(&mem, &short).unwrap();
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&short)
        .unwrap();
    f.set_len(RAM_MIB * MIB / 2).unwrap();
    refused_then_good("short-mem", &load_body(&state, &short), "bytes", &good);
}

#[test]
fn a_load_after_configuring_is_refused() {
    if !kvm_or_skip("snap_load_configured") {
        return;
    }
    let _big = big_memory();
    let (_dir, state, mem) = good_snapshot("snap-load-configured");
    let (vmm, sock, _d) = start_api("snap-load-configured-2", &[]);
    put_ok(
        &sock,
        "/machine-config",
        r#"{"vcpu_count": 1, "mem_size_mib": 128}"#,
    );
    let (s, b) = put(&sock, "/snapshot/load", &load_body(&state, &mem));
    assert_fault(s, &b, 400, "");
    assert_eq!(common::api::state(&sock), "Not started");
    drop(vmm);
}

#[test]
fn firecrackers_malicious_uffd_handler_leaves_teravm_answering() {
    if !kvm_or_skip("snap_uffd_malicious") {
        return;
    }
    let Some(fc) = firecracker("snap_uffd_malicious") else {
        return;
    };
    let _big = big_memory();
    let (dir, state, mem) = good_snapshot("snap-uffd-malicious");
    let socket = dir.join("malicious.sock");
    let malicious = fc.parent().unwrap().join("uffd_malicious_handler");
    let mut h = common::peers::uffd_handler(&malicious, &socket, &mem);
    let (vmm, sock, _d) = start_api("snap-uffd-malicious-2", &[]);
    let body = format!(
        r#"{{"snapshot_path": "{}", "mem_backend": {{"backend_type": "Uffd", "backend_path": "{}"}}, "resume_vm": true}}"#,
        state.display(),
        socket.display()
    );
    let (s, b) = put(&sock, "/snapshot/load", &body);
    // The handler took the regions: the load is done. Its first fault
    // kills it; teravm sees it hang up and ends the microVM (Firecracker
    // freezes), answering meanwhile, its memory freed.
    assert_eq!(s, 204, "{b}");
    let _ = get(&sock, "/");
    let (code, _out, err) = vmm.wait(T);
    let _ = h.kill();
    let _ = h.wait();
    assert_eq!(code, 3, "exit code of a guest that crashed: {err}");
    assert!(err.contains("the uffd page fault handler hung up"), "{err}");
    assert!(err.contains("teravm: reclaimed"), "{err}");
}
