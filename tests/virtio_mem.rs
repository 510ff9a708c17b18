//! virtio-mem on the real binary and /dev/kvm with the default flags (issue
//! 27): the built-in firmware's driver (`mem`, `mem=unplug-all`,
//! firmware/mem.S) against teravm's device, driven by `PATCH
//! /hotplug/memory`; what the guest unplugs goes back to the host through
//! the per-node discard pool while the guest runs.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::api::*;
use common::*;
use serde_json::Value;

/// Unplugged memory leaves teravm's RSS within this.
const FREED_WITHIN: Duration = Duration::from_secs(10);

fn patch(sock: &Path, body: &str) -> (u16, String) {
    common::client::request(sock, "PATCH", "/hotplug/memory", Some(body)).expect("the API answers")
}

/// `PATCH /hotplug/memory` with `requested_size_mib`, expecting 204.
fn request_mib(sock: &Path, mib: u64) {
    let (status, body) = patch(sock, &format!(r#"{{"requested_size_mib": {mib}}}"#));
    assert_eq!(status, 204, "PATCH requested_size_mib {mib}: {body}");
}

/// teravm with an API socket: 1 vCPU, 256 MiB of RAM, a hotplug region of
/// `total_mib` (default block and slot sizes), the firmware with `args`,
/// started; returns once the driver has set its devices up and waits.
fn started(name: &str, total_mib: u64, args: &str) -> (Vmm, PathBuf) {
    started_on(name, 256, total_mib, args, &[])
}

/// `started` with `ram_mib` of RAM and teravm's `extra` flags; with
/// `--sysfs-root` (a fake host), bound to no node.
fn started_on(
    name: &str,
    ram_mib: u64,
    total_mib: u64,
    args: &str,
    extra: &[&str],
) -> (Vmm, PathBuf) {
    started_env(name, ram_mib, total_mib, args, extra, &[])
}

fn started_env(
    name: &str,
    ram_mib: u64,
    total_mib: u64,
    args: &str,
    extra: &[&str],
    env: &[(&str, &str)],
) -> (Vmm, PathBuf) {
    let (mut vmm, sock, _dir) = start_api_env(name, extra, env);
    put_ok(
        &sock,
        "/machine-config",
        &format!(r#"{{"vcpu_count": 1, "mem_size_mib": {ram_mib}, "huge_pages": "None"}}"#),
    );
    if extra.contains(&"--sysfs-root") {
        put_ok(&sock, "/memory", r#"{"numa_policy": "none"}"#);
    }
    put_ok(
        &sock,
        "/hotplug/memory",
        &format!(r#"{{"total_size_mib": {total_mib}}}"#),
    );
    put_ok(
        &sock,
        "/boot-source",
        &format!(r#"{{"boot_args": "{args}"}}"#),
    );
    let (status, body) = action(&sock, r#"{"action_type": "InstanceStart"}"#);
    assert_eq!(status, 204, "{body}");
    vmm.wait_line("teravm firmware: mem device at", T);
    vmm.wait_line("teravm firmware: idle", T);
    (vmm, sock)
}

/// Polls `GET /hotplug/memory` until `plugged_size_mib` is `mib`; returns
/// the last answer.
fn plugged_until(sock: &Path, mib: u64) -> Value {
    let deadline = Instant::now() + T;
    loop {
        let v = get(sock, "/hotplug/memory");
        if v["plugged_size_mib"].as_u64() == Some(mib) {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "plugged_size_mib never {mib}: {v}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Polls teravm's RSS until it is at most `at_most`, for FREED_WITHIN;
/// returns it.
fn rss_falls_to(pid: u32, at_most: u64, what: &str) -> u64 {
    let deadline = Instant::now() + FREED_WITHIN;
    loop {
        let rss = rss_bytes_of(pid);
        if rss <= at_most {
            return rss;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: RSS {} MiB, not down to {} MiB within {FREED_WITHIN:?}",
            rss >> 20,
            at_most >> 20
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// No line says the driver stopped.
fn assert_no_driver_error(lines: &[String]) {
    for l in lines {
        assert!(
            !l.contains("teravm firmware: mem dirty") && !l.contains("teravm firmware: mem error"),
            "{l:?} in {lines:?}"
        );
    }
}

/// The defaults a `PUT /hotplug/memory` with only `total_size_mib` takes
/// (block 2 MiB, slot 128 MiB), asked of the real Firecracker: the same
/// requests to it and to teravm, each booting the test guest, and each
/// must answer alike before the start (`GET /hotplug/memory`, the
/// `memory-hotplug` of `GET /vm/config`) and after it (Firecracker's fields
/// of `GET /hotplug/memory`, equal), and refuse a second `PUT` once started.
#[test]
fn the_hotplug_defaults_are_firecrackers() {
    let test = "hotplug_defaults_as_firecracker";
    if !kvm_or_skip(test) {
        return;
    }
    let Some(fc) = firecracker(test) else {
        return;
    };
    let both = common::fc_api::Both::start(test, &fc, &[]);
    let put = r#"{"total_size_mib": 1024}"#;
    assert_eq!(both.same("PUT", "/hotplug/memory", Some(put)).0, 204);
    both.same("GET", "/hotplug/memory", None);
    let config = |side: &common::fc_api::Side| side.get("/vm/config")["memory-hotplug"].clone();
    assert_eq!(
        config(&both.fc),
        config(&both.tv),
        "memory-hotplug before start"
    );
    both.boot_test_guest(
        r#"{"vcpu_count": 1, "mem_size_mib": 128, "huge_pages": "None"}"#,
        "then=idle",
    );
    // teravm adds `nodes` and `discards_in_flight` (docs/firecracker.md).
    let v = both.same_fields("/hotplug/memory", &["nodes", "discards_in_flight"]);
    assert_eq!(u(&v, "block_size_mib"), 2, "{v}");
    assert_eq!(u(&v, "slot_size_mib"), 128, "{v}");
    assert_eq!(
        config(&both.fc),
        config(&both.tv),
        "memory-hotplug after start"
    );
    let (s, _) = both.same("PUT", "/hotplug/memory", Some(put));
    assert_eq!(s, 400);
}

#[test]
fn plug_touches_unplug_frees_and_a_replug_reads_zeros() {
    if !kvm_or_skip("virtio_mem_plug") {
        return;
    }
    let _big = big_memory();
    let (mut vmm, sock) = started("mem-plug", 1024, "mem then=idle");
    let pid = vmm.child.id();
    let v = get(&sock, "/hotplug/memory");
    assert_eq!(u(&v, "total_size_mib"), 1024, "{v}");
    assert_eq!(u(&v, "block_size_mib"), 2, "{v}");
    assert_eq!(u(&v, "slot_size_mib"), 128, "{v}");
    assert_eq!(u(&v, "plugged_size_mib"), 0, "{v}");
    assert_eq!(u(&v, "requested_size_mib"), 0, "{v}");
    let before = rss_bytes_of(pid);

    // Plug: the guest touches every page of it.
    request_mib(&sock, 512);
    vmm.wait_line("teravm firmware: mem plugged 512 MiB (512 MiB plugged)", T);
    let v = plugged_until(&sock, 512);
    assert_eq!(u(&v, "requested_size_mib"), 512, "{v}");
    let plugged = rss_bytes_of(pid);
    assert!(
        plugged >= before + (500 << 20),
        "RSS {} MiB after plugging 512 MiB, {} MiB before",
        plugged >> 20,
        before >> 20
    );

    // Unplug: the host gets it back within seconds.
    request_mib(&sock, 0);
    vmm.wait_line("teravm firmware: mem unplugged 512 MiB (0 MiB plugged)", T);
    plugged_until(&sock, 0);
    rss_falls_to(pid, plugged - (480 << 20), "after unplugging 512 MiB");

    // A replug reads zeros: the driver checks every page before it writes
    // it and says `mem dirty` otherwise.
    request_mib(&sock, 256);
    vmm.wait_line("teravm firmware: mem plugged 256 MiB (256 MiB plugged)", T);
    plugged_until(&sock, 256);
    let lines = shutdown_ok(vmm, &sock);
    assert_no_driver_error(&lines);
}

/// An UNPLUG whose discard fails (`discard-fails-once`: as a failed
/// `madvise` would) is retried at once and the memory still goes back;
/// one that fails again (`discard-fails-twice`) is said (an error line,
/// `unplug_discard_fails`), the memory stays taken, and the PLUG that takes
/// those blocks again frees them first: the firmware, which checks every
/// page it plugs reads zero (`mem dirty` otherwise), finds zeros either way.
#[test]
fn a_failed_unplug_discard_is_retried_then_said_and_a_replug_still_reads_zeros() {
    if !kvm_or_skip("virtio_mem_discard_fails") {
        return;
    }
    let _big = big_memory();
    for fault in ["discard-fails-once", "discard-fails-twice"] {
        let env = [("TERAVM_FAULT_INJECT", fault)];
        let (mut vmm, sock) = started_env(fault, 256, 1024, "mem then=idle", &[], &env);
        let pid = vmm.child.id();
        request_mib(&sock, 512);
        vmm.wait_line("teravm firmware: mem plugged 512 MiB (512 MiB plugged)", T);
        plugged_until(&sock, 512);
        let plugged = rss_bytes_of(pid);
        request_mib(&sock, 0);
        vmm.wait_line("teravm firmware: mem unplugged 512 MiB (0 MiB plugged)", T);
        plugged_until(&sock, 0);
        discards_done(&sock);
        let after = rss_bytes_of(pid);
        eprintln!(
            "{fault}: RSS {} MiB plugged, {} MiB after the unplug",
            plugged >> 20,
            after >> 20
        );
        if fault == "discard-fails-once" {
            rss_falls_to(pid, plugged - (480 << 20), "after a retried discard");
        } else {
            // The first UNPLUG (the firmware unplugs 128 MiB at a time from
            // the top) failed twice: its 128 MiB stay; the rest went.
            let said = vmm.wait_err_line("discard failed twice", T);
            assert!(said.contains("virtio-mem"), "{said}");
            assert!(
                after + (384 << 20) >= plugged && after + (360 << 20) <= plugged,
                "{fault}: RSS {} -> {} MiB: not 128 MiB kept",
                plugged >> 20,
                after >> 20
            );
        }
        // A replug of it all reads zeros (the firmware says `mem dirty`
        // otherwise): the PLUG of the top freed what was left first.
        request_mib(&sock, 512);
        vmm.wait_line("teravm firmware: mem plugged 512 MiB (512 MiB plugged)", T);
        plugged_until(&sock, 512);
        let lines = shutdown_ok(vmm, &sock);
        assert_no_driver_error(&lines);
    }
}

#[test]
fn bad_targets_are_refused_and_change_nothing() {
    if !kvm_or_skip("virtio_mem_bad") {
        return;
    }
    let _big = big_memory();
    let (mut vmm, sock) = started("mem-bad", 1024, "mem then=idle");
    // Each refusal names the value and what is wrong with it.
    let above = "above total_size_mib (1024)";
    let not_blocks = "not a multiple of block_size_mib (2)";
    for (body, says) in [
        (r#"{"requested_size_mib": 2048}"#, above),
        (r#"{"requested_size_mib": 1026}"#, above), // above by one block
        (r#"{"requested_size_mib": 3}"#, not_blocks),
        (r#"{"requested_size_mib": 129}"#, not_blocks),
    ] {
        let (status, reply) = patch(&sock, body);
        assert_eq!(status, 400, "PATCH {body}: {reply}");
        let msg = json(&reply)["fault_message"]
            .as_str()
            .unwrap_or_else(|| panic!("no fault_message in {reply}"))
            .to_string();
        let value = &body[body.find(':').unwrap() + 2..body.len() - 1];
        let want = format!("requested_size_mib {value} is invalid: {says}");
        assert!(msg.contains(&want), "PATCH {body}: {msg:?}, not {want:?}");
        // Alive, running, nothing requested.
        assert_eq!(state(&sock), "Running");
        let v = get(&sock, "/hotplug/memory");
        assert_eq!(u(&v, "requested_size_mib"), 0, "after {body}: {v}");
        assert_eq!(u(&v, "plugged_size_mib"), 0, "after {body}: {v}");
    }
    // A good target still works.
    request_mib(&sock, 1024);
    vmm.wait_line(
        "teravm firmware: mem plugged 1024 MiB (1024 MiB plugged)",
        T,
    );
    plugged_until(&sock, 1024);
    let lines = shutdown_ok(vmm, &sock);
    assert_no_driver_error(&lines);
}

#[test]
fn unplug_all_frees_what_is_left_in_one_request() {
    if !kvm_or_skip("virtio_mem_unplug_all") {
        return;
    }
    let _big = big_memory();
    let (mut vmm, sock) = started("mem-unplug-all", 1024, "mem=unplug-all then=idle");
    let pid = vmm.child.id();
    request_mib(&sock, 512);
    vmm.wait_line("teravm firmware: mem plugged 512 MiB (512 MiB plugged)", T);
    plugged_until(&sock, 512);
    let plugged = rss_bytes_of(pid);
    // Down but not to 0: UNPLUG from the top, as without unplug-all.
    request_mib(&sock, 256);
    vmm.wait_line(
        "teravm firmware: mem unplugged 256 MiB (256 MiB plugged)",
        T,
    );
    plugged_until(&sock, 256);
    let half = rss_falls_to(pid, plugged - (240 << 20), "after unplugging 256 MiB");
    // To 0: one UNPLUG_ALL.
    request_mib(&sock, 0);
    vmm.wait_line("teravm firmware: mem unplugged 256 MiB (0 MiB plugged)", T);
    plugged_until(&sock, 0);
    rss_falls_to(pid, half - (240 << 20), "after UNPLUG_ALL");
    let lines = shutdown_ok(vmm, &sock);
    assert_no_driver_error(&lines);
}

#[test]
fn two_nodes_each_plug_their_part_and_their_own_workers_free_it() {
    if !kvm_or_skip("virtio_mem_two_nodes") {
        return;
    }
    let _big = big_memory();
    let dir = temp_dir("mem-nodes-sys");
    let sysfs = fake_sysfs(&dir, 2);
    let (mut vmm, sock) = started_on(
        "mem-nodes",
        2048,
        1024,
        "mem then=idle",
        &["--sysfs-root", sysfs.to_str().unwrap()],
    );
    // One device per guest node: the driver said both.
    let devices = vmm
        .stdout
        .iter()
        .filter(|l| l.contains("teravm firmware: mem device at"))
        .count();
    assert_eq!(devices, 2, "{:?}", vmm.stdout);
    let v = get(&sock, "/hotplug/memory");
    let nodes = v["nodes"].as_array().expect("nodes").clone();
    assert_eq!(nodes.len(), 2, "{v}");
    let pid = vmm.child.id();
    let before = rss_bytes_of(pid);
    request_mib(&sock, 1024);
    vmm.wait_line(
        "teravm firmware: mem plugged 1024 MiB (1024 MiB plugged)",
        T,
    );
    let v = plugged_until(&sock, 1024);
    for n in v["nodes"].as_array().unwrap() {
        assert_eq!(u(n, "plugged_size_mib"), 512, "{v}");
    }
    // The guest wrote both parts: the process holds them (not teravm's
    // counters: the kernel's).
    let plugged = rss_bytes_of(pid);
    assert!(
        plugged >= before + (1000 << 20),
        "RSS {} -> {} MiB after plugging 512 MiB on each node",
        before >> 20,
        plugged >> 20
    );
    request_mib(&sock, 0);
    vmm.wait_line("teravm firmware: mem unplugged 1024 MiB (0 MiB plugged)", T);
    plugged_until(&sock, 0);
    // Both parts went back: more than either part alone holds.
    rss_falls_to(pid, plugged - (1000 << 20), "after unplugging both parts");
    // Each node's part freed by its own workers.
    let deadline = Instant::now() + FREED_WITHIN;
    loop {
        let v = get(&sock, "/hotplug/memory");
        let nodes = v["nodes"].as_array().unwrap();
        if nodes.iter().all(|n| u(n, "discarded_bytes") >= 512 << 20) {
            break;
        }
        assert!(Instant::now() < deadline, "per-node discards: {v}");
        std::thread::sleep(Duration::from_millis(20));
    }
    let lines = shutdown_ok(vmm, &sock);
    assert_no_driver_error(&lines);
}
