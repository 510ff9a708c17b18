//! Devices reach the memory a guest plugs (issue 34): a Linux guest onlines
//! virtio-mem blocks and puts page cache there, so a block request whose
//! buffer lies in plugged memory must be served. The test guest's
//! `mem-blk` word plugs 2 MiB and reads the drive's first sector into it;
//! teravm and the real Firecracker (whose devices reach plugged memory)
//! must both print the sector's bytes.

mod common;

use std::path::{Path, PathBuf};

use common::api::*;
use common::guests::Guest;
use common::peers::{Kind, Launch};
use common::*;

const RAM_MIB: u64 = 256;
const TOTAL_MIB: u64 = 256;
const SLOT_MIB: u64 = 128;
const PLUG_MIB: u64 = 2;
/// The first 16 bytes of the drive.
const SECTOR0: &[u8; 16] = b"mem-blk:sector-0";

fn disk(dir: &Path) -> PathBuf {
    let path = dir.join("disk.img");
    let mut bytes = vec![0x5au8; 1 << 20];
    bytes[..16].copy_from_slice(SECTOR0);
    std::fs::write(&path, &bytes).unwrap();
    path
}

fn want() -> String {
    let hex: String = SECTOR0.iter().map(|b| format!("{b:02x}")).collect();
    format!("teravm guest: mem-blk sector0 {hex}")
}

fn patch(sock: &Path, body: &str) -> (u16, String) {
    common::client::request(sock, "PATCH", "/hotplug/memory", Some(body)).expect("the API answers")
}

/// The guest's buffer in plugged memory gets the sector, on teravm (default
/// flags: seccomp on), and teravm keeps running.
#[test]
fn a_block_read_into_plugged_memory_gets_the_sector() {
    if !kvm_or_skip("mem_blk_teravm") {
        return;
    }
    let _big = big_memory();
    let (mut vmm, sock, dir) = start_api("mem-blk", &[]);
    put_ok(
        &sock,
        "/machine-config",
        &format!(r#"{{"vcpu_count": 1, "mem_size_mib": {RAM_MIB}}}"#),
    );
    put_ok(
        &sock,
        "/boot-source",
        &Guest::TestGuest.boot_source("mem-blk then=idle"),
    );
    put_ok(
        &sock,
        "/drives/disk",
        &format!(
            r#"{{"drive_id": "disk", "path_on_host": "{}", "is_root_device": false, "is_read_only": true}}"#,
            disk(&dir).display()
        ),
    );
    put_ok(
        &sock,
        "/hotplug/memory",
        &format!(r#"{{"total_size_mib": {TOTAL_MIB}, "slot_size_mib": {SLOT_MIB}}}"#),
    );
    let (s, b) = action(&sock, r#"{"action_type": "InstanceStart"}"#);
    assert_eq!(s, 204, "{b}");
    vmm.wait_line("teravm guest: mem-blk waiting for ", T);
    let (s, b) = patch(&sock, &format!(r#"{{"requested_size_mib": {PLUG_MIB}}}"#));
    assert_eq!(s, 204, "{b}");
    let line = vmm.wait_line("teravm guest: mem-blk ", T);
    assert_eq!(line, want(), "teravm: the sector read into plugged memory");
    let status = get(&sock, "/hotplug/memory");
    assert_eq!(status["plugged_size_mib"], PLUG_MIB, "{status}");
    assert_eq!(state(&sock), "Running");
    shutdown_ok(vmm, &sock);
}

/// The same guest on the real Firecracker: the same line.
#[test]
fn firecracker_reads_into_plugged_memory_too() {
    let test = "mem_blk_firecracker";
    if !kvm_or_skip(test) {
        return;
    }
    let Some(bin) = firecracker(test) else {
        return;
    };
    let _big = big_memory();
    let dir = temp_dir("mem-blk-fc");
    let mut peer = Launch::new(Kind::Firecracker, &bin, &dir, "mem-blk then=idle")
        .mem_mib(RAM_MIB)
        .drive(&disk(&dir), true, "disk")
        .section(
            "memory-hotplug",
            serde_json::json!({"total_size_mib": TOTAL_MIB, "slot_size_mib": SLOT_MIB}),
        )
        .start();
    // Firecracker takes the target only once the driver is up.
    peer.wait_line("teravm guest: mem-blk waiting for ");
    let (s, b) = patch(
        peer.api(),
        &format!(r#"{{"requested_size_mib": {PLUG_MIB}}}"#),
    );
    assert_eq!(s, 204, "Firecracker PATCH /hotplug/memory: {b}");
    let line = peer.wait_line("teravm guest: mem-blk ");
    assert_eq!(
        line,
        want(),
        "Firecracker: the sector read into plugged memory"
    );
    let (code, _, err) = peer.stop();
    assert_eq!(code, 0, "Firecracker's exit: {err}");
}
