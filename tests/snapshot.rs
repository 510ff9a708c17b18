//! Snapshots end to end (issue 36), on the real binary, /dev/kvm and the
//! default flags (seccomp on): the test guest touches memory and verifies
//! it every 100 ms (`verify-every=`), with a drive, a tap (in a network
//! namespace of the test's own) and a balloon; it is paused and
//! snapshotted by one teravm, which then shuts down; a new teravm loads
//! the snapshot (the memory file lazily, eagerly, or through each of
//! Firecracker's own uffd handlers) and the guest goes on: it says
//! `verify 64 MiB ok` (every page it touched holds what it wrote) and
//! echoes a frame sent through the tap. A guest that drives its balloon
//! alone inflates it when asked after a restore (the test guest serves
//! the balloon beside `net=echo` too slowly to inflate it, restored or
//! not: the balloon is attached and restored there, not driven).

mod common;

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::Command;

use common::api::*;
use common::guests::Guest;
use common::netns::{next_frame, packet_socket, packet_socket_on, Netns};
use common::*;

const RAM_MIB: u64 = 256;
const TOUCH_MIB: u64 = 64;
const MAC: &str = "06:00:ac:10:00:02";

fn verify_ok() -> String {
    format!("teravm guest: verify {TOUCH_MIB} MiB ok")
}

/// teravm in `ns` with an API socket in `dir` (a name of its own per
/// process), answering.
fn spawn_in(ns: &Netns, dir: &Path, name: &str) -> (Vmm, PathBuf) {
    let sock = dir.join(format!("api-{name}.sock"));
    let mut cmd = ns.command(teravm());
    cmd.arg("--api-sock").arg(&sock);
    let vmm = Vmm::spawn_command(cmd);
    wait_for_api(&sock, T);
    (vmm, sock)
}

/// The source microVM: `vcpus` vCPUs, a drive, eth0 on `tap0`, a balloon,
/// the test guest touching and verifying; running and verified once.
fn boot_source(ns: &Netns, dir: &Path, vcpus: u32) -> (Vmm, PathBuf) {
    let (mut vmm, sock) = spawn_in(ns, dir, "source");
    put_ok(
        &sock,
        "/machine-config",
        &format!(r#"{{"vcpu_count": {vcpus}, "mem_size_mib": {RAM_MIB}}}"#),
    );
    let disk = dir.join("disk.img");
    std::fs::write(&disk, vec![0x5a; 1 << 20]).unwrap();
    put_ok(
        &sock,
        "/drives/rootfs",
        &format!(
            r#"{{"drive_id": "rootfs", "path_on_host": "{}", "is_root_device": true, "is_read_only": false}}"#,
            disk.display()
        ),
    );
    put_ok(
        &sock,
        "/network-interfaces/eth0",
        &format!(r#"{{"iface_id": "eth0", "host_dev_name": "tap0", "guest_mac": "{MAC}"}}"#),
    );
    put_ok(
        &sock,
        "/balloon",
        r#"{"amount_mib": 0, "deflate_on_oom": false, "stats_polling_interval_s": 0}"#,
    );
    let words = format!("touch={TOUCH_MIB} verify-every=100 blk balloon net=echo");
    put_ok(&sock, "/boot-source", &Guest::TestGuest.boot_source(&words));
    let (s, b) = action(&sock, r#"{"action_type": "InstanceStart"}"#);
    assert_eq!(s, 204, "{b}");
    vmm.wait_line("teravm guest: blk ", T);
    vmm.wait_line("teravm guest: net sent hello", T);
    assert_eq!(vmm.wait_line("teravm guest: verify ", T), verify_ok());
    (vmm, sock)
}

/// Pauses the source, snapshots it to `dir/{vm.state,vm.mem}` and shuts it
/// down (its tap is then free for the loads).
fn snapshot_and_stop(vmm: Vmm, sock: &Path, dir: &Path) -> (PathBuf, PathBuf) {
    let (s, b) = request_patch(sock, "/vm", r#"{"state": "Paused"}"#);
    assert_eq!(s, 204, "{b}");
    let state = dir.join("vm.state");
    let mem = dir.join("vm.mem");
    let (s, b) = put(
        sock,
        "/snapshot/create",
        &format!(
            r#"{{"snapshot_type": "Full", "snapshot_path": "{}", "mem_file_path": "{}"}}"#,
            state.display(),
            mem.display()
        ),
    );
    assert_eq!(s, 204, "{b}");
    assert_eq!(common::api::state(sock), "Paused");
    assert_eq!(
        std::fs::metadata(&mem).unwrap().len(),
        RAM_MIB * MIB,
        "the memory file is the size of RAM"
    );
    // Sparse: what the guest touched and its own image, not all of RAM.
    let on_disk = allocated_bytes(&mem);
    assert!(
        on_disk < (RAM_MIB - 64) * MIB,
        "the memory file has {on_disk} bytes on disk of {RAM_MIB} MiB"
    );
    assert!(on_disk >= TOUCH_MIB * MIB, "{on_disk}");
    // No temporary file is left beside them.
    let names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(!names.iter().any(|n| n.contains(".partial")), "{names:?}");
    shutdown_ok(vmm, sock);
    (state, mem)
}

fn allocated_bytes(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).unwrap().blocks() * 512
}

fn request_patch(sock: &Path, path: &str, body: &str) -> (u16, String) {
    common::client::request(sock, "PATCH", path, Some(body)).unwrap()
}

/// Loads `body` into a new teravm in `ns`; the guest resumes.
fn load(ns: &Netns, dir: &Path, name: &str, body: &str) -> (Vmm, PathBuf) {
    let (vmm, sock) = spawn_in(ns, dir, name);
    let (s, b) = put(&sock, "/snapshot/load", body);
    assert_eq!(s, 204, "{b}");
    assert_eq!(common::api::state(&sock), "Running");
    (vmm, sock)
}

/// The restored guest goes on: verifies ok and echoes a frame sent
/// through the tap.
fn goes_on(vmm: &mut Vmm, tap: &OwnedFd) {
    for _ in 0..2 {
        assert_eq!(vmm.wait_line("teravm guest: verify ", T), verify_ok());
    }
    let mut frame = vec![6, 0, 0xac, 0x10, 0, 2, 2, 0, 0, 0, 0, 9, 0x88, 0xB5];
    frame.extend_from_slice(b"after the restore");
    // SAFETY: sends our buffer on our bound socket.
    let n = unsafe { libc::send(tap.as_raw_fd(), frame.as_ptr().cast(), frame.len(), 0) };
    assert_eq!(n as usize, frame.len());
    let echo = loop {
        let f = next_frame(tap, T).expect("the echo of the restored guest");
        if f[..6] == [2, 0, 0, 0, 0, 9] {
            break f;
        }
    };
    assert!(echo.windows(17).any(|w| w == b"after the restore"));
    assert_eq!(vmm.wait_line("teravm guest: verify ", T), verify_ok());
}

fn netns_or_skip(test: &str) -> Option<Netns> {
    let ns = Netns::new(test);
    if ns.is_none() {
        skip(
            test,
            "cannot make a network namespace with a tap (ip, root)",
        );
    }
    ns
}

fn file_body(state: &Path, mem: &Path, load: &str, more: &str) -> String {
    format!(
        r#"{{"snapshot_path": "{}", "mem_backend": {{"backend_type": "File", "backend_path": "{}"}}, "resume_vm": true, "memory_load": "{load}"{more}}}"#,
        state.display(),
        mem.display()
    )
}

fn file_loads(test: &str, vcpus: u32) {
    if !kvm_or_skip(test) {
        return;
    }
    let Some(ns) = netns_or_skip(test) else {
        return;
    };
    let _big = big_memory();
    let dir = temp_dir(test);
    let tap = packet_socket(&ns);
    let (vmm, sock) = boot_source(&ns, &dir, vcpus);
    let (state, mem) = snapshot_and_stop(vmm, &sock, &dir);
    let (mut vmm, sock) = load(&ns, &dir, "lazy", &file_body(&state, &mem, "Lazy", ""));
    goes_on(&mut vmm, &tap);
    shutdown_ok(vmm, &sock);
    // Eager, with eth0 moved to another tap (`network_overrides`).
    let made = Command::new("ip")
        .args([
            "-n", &ns.name, "tuntap", "add", "dev", "tap1", "mode", "tap",
        ])
        .status()
        .is_ok_and(|s| s.success())
        && Command::new("ip")
            .args(["-n", &ns.name, "link", "set", "tap1", "up"])
            .status()
            .is_ok_and(|s| s.success());
    assert!(made, "a second tap in the test's namespace");
    let tap1 = packet_socket_on(&ns, "tap1");
    let overrides = r#", "network_overrides": [{"iface_id": "eth0", "host_dev_name": "tap1"}]"#;
    let body = file_body(&state, &mem, "Eager", overrides);
    let (mut vmm, sock) = load(&ns, &dir, "eager", &body);
    goes_on(&mut vmm, &tap1);
    shutdown_ok(vmm, &sock);
}

#[test]
fn a_snapshot_loads_lazily_and_eagerly_and_the_guest_verifies_1_vcpu() {
    file_loads("snap_file_1", 1);
}

#[test]
fn a_snapshot_loads_lazily_and_eagerly_and_the_guest_verifies_2_vcpus() {
    file_loads("snap_file_2", 2);
}

fn uffd_body(state: &Path, socket: &Path) -> String {
    format!(
        r#"{{"snapshot_path": "{}", "mem_backend": {{"backend_type": "Uffd", "backend_path": "{}"}}, "resume_vm": true}}"#,
        state.display(),
        socket.display()
    )
}

fn uffd_loads(test: &str, vcpus: u32) {
    if !kvm_or_skip(test) {
        return;
    }
    let Some(fc) = firecracker(test) else {
        return;
    };
    let Some(ns) = netns_or_skip(test) else {
        return;
    };
    let _big = big_memory();
    let dir = temp_dir(test);
    let tap = packet_socket(&ns);
    let (vmm, sock) = boot_source(&ns, &dir, vcpus);
    let (state, mem) = snapshot_and_stop(vmm, &sock, &dir);
    for name in ["uffd_on_demand_handler", "uffd_fault_all_handler"] {
        let bin = fc.parent().unwrap().join(name);
        let socket = dir.join(format!("{name}.sock"));
        let mut h = common::peers::uffd_handler(&bin, &socket, &mem);
        let (mut vmm, sock) = load(&ns, &dir, name, &uffd_body(&state, &socket));
        goes_on(&mut vmm, &tap);
        shutdown_ok(vmm, &sock);
        let _ = h.kill();
        let _ = h.wait();
    }
}

#[test]
fn firecrackers_uffd_handlers_serve_a_teravm_snapshot_1_vcpu() {
    uffd_loads("snap_uffd_1", 1);
}

#[test]
fn firecrackers_uffd_handlers_serve_a_teravm_snapshot_2_vcpus() {
    uffd_loads("snap_uffd_2", 2);
}

/// A guest driving its balloon alone: restored lazily, it inflates when
/// asked and its memory still verifies.
#[test]
fn a_restored_balloon_inflates_when_asked() {
    let test = "snap_balloon";
    if !kvm_or_skip(test) {
        return;
    }
    let _big = big_memory();
    let (mut vmm, sock, dir) = start_api(test, &[]);
    put_ok(
        &sock,
        "/machine-config",
        &format!(r#"{{"vcpu_count": 1, "mem_size_mib": {RAM_MIB}}}"#),
    );
    put_ok(
        &sock,
        "/balloon",
        r#"{"amount_mib": 0, "deflate_on_oom": false, "stats_polling_interval_s": 0}"#,
    );
    let words = format!("touch={TOUCH_MIB} verify-every=100 balloon");
    put_ok(&sock, "/boot-source", &Guest::TestGuest.boot_source(&words));
    let (s, b) = action(&sock, r#"{"action_type": "InstanceStart"}"#);
    assert_eq!(s, 204, "{b}");
    vmm.wait_line("teravm guest: balloon device at", T);
    assert_eq!(vmm.wait_line("teravm guest: verify ", T), verify_ok());
    let (s, b) = request_patch(&sock, "/vm", r#"{"state": "Paused"}"#);
    assert_eq!(s, 204, "{b}");
    let (state, mem) = (dir.join("vm.state"), dir.join("vm.mem"));
    let (s, b) = put(
        &sock,
        "/snapshot/create",
        &format!(
            r#"{{"snapshot_path": "{}", "mem_file_path": "{}"}}"#,
            state.display(),
            mem.display()
        ),
    );
    assert_eq!(s, 204, "{b}");
    shutdown_ok(vmm, &sock);
    let (mut vmm, sock, _d) = start_api("snap-balloon-2", &[]);
    let (s, b) = put(
        &sock,
        "/snapshot/load",
        &file_body(&state, &mem, "Lazy", ""),
    );
    assert_eq!(s, 204, "{b}");
    assert_eq!(vmm.wait_line("teravm guest: verify ", T), verify_ok());
    let (s, b) = request_patch(&sock, "/balloon", r#"{"amount_mib": 8}"#);
    assert_eq!(s, 204, "{b}");
    vmm.wait_line("teravm guest: balloon actual 2048 pages", T);
    assert_eq!(vmm.wait_line("teravm guest: verify ", T), verify_ok());
    shutdown_ok(vmm, &sock);
}
