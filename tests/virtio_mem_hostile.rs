//! The hostile virtio-mem guest (issue 27) on the real binary, /dev/kvm and
//! the default flags (seccomp on): the test guest's `vmem-hostile` sends
//! requests outside the region, unaligned, of zero blocks, overflowing,
//! beyond the requested size, overlapping, of an unknown type, a flood of
//! 10 000 STATE requests, and reads and writes a block never plugged in a
//! slot never plugged. teravm refuses each as the virtio spec says (ERROR),
//! answers the rest (ACK, with the right state), frees nothing outside the
//! one block the guest plugged, stays alive and small, and shuts down
//! cleanly. The same guest on the real Firecracker, where its answers that
//! differ are recorded as its documented behaviour.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::api::*;
use common::guests::Guest;
use common::peers::{Kind, Launch};
use common::*;

/// The guest's RAM, the region, its slots, the target.
const RAM_MIB: u64 = 256;
const TOTAL_MIB: u64 = 1024;
const SLOT_MIB: u64 = 128;
const REQUESTED_MIB: u64 = 4;
/// One block (2 MiB, the default): all the guest plugs.
const BLOCK_BYTES: u64 = 2 * MIB;
const DONE: &str = "teravm guest: vmem-hostile done ";
/// The checks the guest makes (vmem.rs), by name.
const CHECKS: &[&str] = &[
    "plug-past-end",
    "plug-straddling-end",
    "plug-below-region",
    "plug-unaligned",
    "plug-zero-blocks",
    "plug-overflow",
    "plug-beyond-requested",
    "unplug-never-plugged",
    "plug-one",
    "plug-overlapping",
    "plug-overlapping-two",
    "state-plugged",
    "state-mixed",
    "state-outside",
    "state-flood",
    "plugged-readback",
    "unplug-two-one-plugged",
    "unplug-one",
    "state-after-unplug",
    "unplug-all",
    "unknown-type",
    "unplugged-read",
    "unplugged-write-dropped",
];

fn patch(sock: &Path, path: &str, body: &str) -> (u16, String) {
    common::client::request(sock, "PATCH", path, Some(body)).expect("the API answers")
}

/// The `vmem <check> ...` lines, by check: `ok` or the failure's words.
fn results(lines: &[String]) -> Vec<(String, String)> {
    lines
        .iter()
        .filter_map(|l| l.strip_prefix("teravm guest: vmem "))
        .filter_map(|rest| rest.split_once(' '))
        .filter(|(name, _)| CHECKS.contains(name))
        .map(|(n, r)| (n.to_string(), r.to_string()))
        .collect()
}

/// Configures the test guest with `word`, RAM_MIB of RAM, a hotplug region
/// of `total_mib` in slots of `slot_mib` and a metrics file, and starts it;
/// returns the metrics file.
fn boot(sock: &Path, dir: &Path, word: &str, total_mib: u64, slot_mib: u64) -> PathBuf {
    put_ok(
        sock,
        "/machine-config",
        &format!(r#"{{"vcpu_count": 1, "mem_size_mib": {RAM_MIB}}}"#),
    );
    put_ok(
        sock,
        "/boot-source",
        &Guest::TestGuest.boot_source(&format!("{word} then=idle")),
    );
    put_ok(
        sock,
        "/hotplug/memory",
        &format!(r#"{{"total_size_mib": {total_mib}, "slot_size_mib": {slot_mib}}}"#),
    );
    let metrics = dir.join("metrics");
    put_ok(
        sock,
        "/metrics",
        &format!(r#"{{"metrics_path": "{}"}}"#, metrics.display()),
    );
    let (s, b) = action(sock, r#"{"action_type": "InstanceStart"}"#);
    assert_eq!(s, 204, "{b}");
    metrics
}

#[test]
fn teravm_refuses_each_hostile_request_and_frees_nothing_outside_the_region() {
    if !kvm_or_skip("vmem_hostile") {
        return;
    }
    let _big = big_memory();
    let (mut vmm, sock, dir) = start_api("vmem-hostile", &[]);
    // All of RAM written first, and read back by the guest at the end
    // (`touch-check`): a discard that strayed outside the region would
    // take what it wrote away (the guest's word and the kernel's count,
    // not teravm's counters).
    let metrics = boot(
        &sock,
        &dir,
        "touch=all vmem-hostile touch-check",
        TOTAL_MIB,
        SLOT_MIB,
    );
    // teravm takes the target as soon as it runs, the driver up or not.
    let (s, b) = patch(
        &sock,
        "/hotplug/memory",
        &format!(r#"{{"requested_size_mib": {REQUESTED_MIB}}}"#),
    );
    assert_eq!(s, 204, "{b}");
    let device = vmm.wait_line("teravm guest: vmem device at ", T);
    let rss_before = vmm.rss_bytes();
    let done = vmm.wait_line(DONE, T);
    let rss_after = vmm.rss_bytes();
    let res = results(&vmm.stdout);
    let names: Vec<&str> = res.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, CHECKS, "every check, in order: {:?}", vmm.stdout);
    for (name, r) in &res {
        assert_eq!(r, "ok", "vmem {name}: {r}");
    }
    assert_eq!(done, format!("{DONE}{} checks", CHECKS.len()));
    // The region the guest was told is the one teravm placed.
    let st = get(&sock, "/hotplug/memory");
    let node = &st["nodes"][0];
    let region = format!(
        "region {:#x}+{:#x}",
        u(node, "guest_addr"),
        u(node, "size_mib") * MIB
    );
    assert!(device.contains(&region), "{device} lacks {region}");
    assert!(
        device.contains(&format!("block {BLOCK_BYTES:#x}")),
        "{device}"
    );
    // Alive, running, nothing left plugged.
    assert_eq!(state(&sock), "Running");
    assert_eq!(u(&st, "plugged_size_mib"), 0, "{st}");
    assert_eq!(u(&st, "requested_size_mib"), REQUESTED_MIB, "{st}");
    // Nothing outside the one plugged block was freed, once every
    // discard has ended (UNPLUG is answered at once and freed behind).
    let st = discards_done(&sock);
    let discarded: u64 = st["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| u(n, "discarded_bytes"))
        .sum();
    assert!(
        discarded <= BLOCK_BYTES,
        "{discarded} bytes discarded; the guest plugged {BLOCK_BYTES}: {st}"
    );
    // The flood, the unplugged reads: no growth beyond the one block and
    // a little.
    let grew = rss_after.saturating_sub(rss_before);
    eprintln!(
        "teravm: discarded {discarded} bytes; RSS {rss_before} -> {rss_after} across the checks"
    );
    assert!(
        grew <= 8 * MIB,
        "RSS grew {} KiB ({rss_before} -> {rss_after})",
        grew >> 10
    );
    // Nor did it fall by more than the one block the guest plugged and
    // unplugged: the RAM it wrote is all still there.
    let check = vmm.wait_line("teravm guest: touch check ", T);
    assert!(
        check.starts_with("teravm guest: touch check 0 bad of ") && !check.ends_with(" of 0 pages"),
        "{check}"
    );
    let rss_end = vmm.rss_bytes();
    assert!(
        rss_before >= (RAM_MIB - 32) * MIB && rss_end + BLOCK_BYTES + 4 * MIB >= rss_before,
        "RSS {} -> {} MiB: something outside the unplugged block was freed",
        rss_before >> 20,
        rss_end >> 20
    );
    // The guest's read, write and read of never-plugged memory: three
    // accesses, counted.
    let (s, b) = action(&sock, r#"{"action_type": "FlushMetrics"}"#);
    assert_eq!(s, 204, "{b}");
    let text = std::fs::read_to_string(&metrics).unwrap();
    let m = json(text.lines().last().unwrap())["memory_hotplug"].clone();
    assert_eq!(u(&m, "unplugged_accesses"), 3, "{m}");
    shutdown_ok(vmm, &sock);
}

/// A guest that touches what it unplugged as soon as the UNPLUG is
/// answered (`vmem-touch-unplugged`): the emptied slot leaves KVM on a
/// discard worker after the answer, before its blocks are freed, so
/// whatever the guest touched before the slot left is freed with the rest
/// (teravm's resident size falls by all of it) and what it touched after
/// is MMIO (counted, read as zeros). Run as it comes, and under
/// `slow-discard`, where the slot stays in KVM 2 s after the answer: the
/// guest then touches every page inside it, and they must still all go.
#[test]
fn a_guest_touching_what_it_unplugged_keeps_nothing_and_reaches_nothing() {
    if !kvm_or_skip("vmem_touch_unplugged") {
        return;
    }
    touch_unplugged(None);
    touch_unplugged(Some("slow-discard"));
}

fn touch_unplugged(fault: Option<&str>) {
    let _big = big_memory();
    // One slot (the smallest Firecracker takes), all of it plugged: the
    // UNPLUG empties it.
    const PLUG_MIB: u64 = SLOT_MIB;
    const REGION_MIB: u64 = 2 * SLOT_MIB;
    let env: Vec<(&str, &str)> = fault
        .map(|f| ("TERAVM_FAULT_INJECT", f))
        .into_iter()
        .collect();
    let (mut vmm, sock, dir) = start_api_env("vmem-touch", &[], &env);
    let metrics = boot(&sock, &dir, "vmem-touch-unplugged", REGION_MIB, PLUG_MIB);
    let requested = format!(r#"{{"requested_size_mib": {PLUG_MIB}}}"#);
    let (s, b) = patch(&sock, "/hotplug/memory", &requested);
    assert_eq!(s, 204, "{b}");
    let plugged = vmm.wait_line("teravm guest: vmem touch-unplugged plugged ", T);
    assert!(
        plugged.ends_with(&format!(" {}", PLUG_MIB * MIB)),
        "{plugged}"
    );
    let rss_plugged = vmm.rss_bytes();
    let (s, b) = patch(&sock, "/hotplug/memory", r#"{"requested_size_mib": 0}"#);
    assert_eq!(s, 204, "{b}");
    let done = vmm.wait_line("teravm guest: vmem touch-unplugged done ", T);
    let words: Vec<&str> = done.split_whitespace().collect();
    let (kept, pages): (u64, u64) = (words[5].parse().unwrap(), words[7].parse().unwrap());
    assert_eq!(pages, PLUG_MIB * MIB / 4096, "{done}");
    discards_done(&sock);
    // Every page of the block is gone from teravm, those the guest wrote
    // behind the answer included (a free before the slot left would let
    // the guest's next round fault them back in, and they would stay).
    let rss_after = vmm.rss_bytes();
    eprintln!(
        "teravm ({fault:?}): {kept} of {pages} pages touched before the slot left; RSS {} -> {} MiB",
        rss_plugged >> 20,
        rss_after >> 20
    );
    assert!(
        done.ends_with(" 0 refaulted"),
        "a page was freed while the guest could still reach it: {done}"
    );
    if fault.is_some() {
        assert_eq!(
            kept, pages,
            "the slot left KVM before its slow discard: {done}"
        );
        assert!(!done.contains(" 1 rounds"), "{done}");
    }
    assert!(
        rss_after + PLUG_MIB * MIB <= rss_plugged + 4 * MIB,
        "RSS {rss_plugged} -> {rss_after}: the unplugged block was not all freed ({done})"
    );
    // What the guest touched after the slot left was MMIO: each such page's
    // read (zeros: not kept) was counted.
    let (s, b) = action(&sock, r#"{"action_type": "FlushMetrics"}"#);
    assert_eq!(s, 204, "{b}");
    let text = std::fs::read_to_string(&metrics).unwrap();
    let m = json(text.lines().last().unwrap())["memory_hotplug"].clone();
    assert!(
        u(&m, "unplugged_accesses") >= pages - kept,
        "{} pages read back zeros, {m}",
        pages - kept
    );
    assert_eq!(u(&get(&sock, "/hotplug/memory"), "plugged_size_mib"), 0);
    assert_eq!(state(&sock), "Running");
    shutdown_ok(vmm, &sock);
}

/// The same guest on Firecracker (main, with virtio-mem): its answers,
/// checked against what differs where it documents it.
#[test]
fn firecracker_answers_the_hostile_guest() {
    let test = "vmem_hostile_firecracker";
    if !kvm_or_skip(test) {
        return;
    }
    let Some(bin) = firecracker(test) else {
        return;
    };
    let _big = big_memory();
    let dir = temp_dir("vmem-hostile-fc");
    let launch =
        Launch::new(Kind::Firecracker, &bin, &dir, "vmem-hostile then=idle").mem_mib(RAM_MIB);
    let mut config = launch.firecracker_config();
    config["memory-hotplug"] = serde_json::json!({
        "total_size_mib": TOTAL_MIB, "slot_size_mib": SLOT_MIB,
    });
    let cfg = dir.join("fc-vmem.json");
    std::fs::write(&cfg, config.to_string()).unwrap();
    let sock = dir.join("fc.sock");
    let log = dir.join("fc.log");
    std::fs::write(&log, "").unwrap();
    let mut cmd = std::process::Command::new(&bin);
    cmd.arg("--api-sock")
        .arg(&sock)
        .arg("--config-file")
        .arg(&cfg)
        .arg("--log-path")
        .arg(&log);
    let mut vmm = Vmm::spawn_command(cmd);
    wait_for_api(&sock, T);
    // Firecracker refuses the target until the driver is up ("Device is
    // not active"; teravm takes it at once); the guest waits for it.
    vmm.wait_line("teravm guest: vmem device at ", T);
    let (s, b) = patch(
        &sock,
        "/hotplug/memory",
        &format!(r#"{{"requested_size_mib": {REQUESTED_MIB}}}"#),
    );
    assert_eq!(s, 204, "Firecracker PATCH /hotplug/memory: {b}");
    vmm.wait_line("teravm guest: vmem reading unplugged memory", T);
    // Firecracker documents that a guest touching unplugged memory may
    // crash it: the lines after this one may never come. Take what comes
    // until the guest goes quiet or Firecracker exits.
    let (lines, _) = vmm.drain(Duration::from_secs(5));
    let exited = vmm.child.try_wait().unwrap();
    let res = results(&lines);
    let answer = |name: &str| res.iter().find(|(n, _)| n == name).map(|(_, r)| r.clone());
    let fc_log = std::fs::read_to_string(&log).unwrap_or_default();
    eprintln!("Firecracker's answers: {res:?}\nexit: {exited:?}");
    // What Firecracker refuses and answers as teravm does.
    for name in &CHECKS[..CHECKS.len() - 3] {
        assert_eq!(
            answer(name).as_deref(),
            Some("ok"),
            "Firecracker, vmem {name}: {lines:?}\nlog {fc_log}"
        );
    }
    // An unknown request type: Firecracker's queue handler returns an
    // error and the chain is never used (no ERROR reaches the guest).
    let unknown = answer("unknown-type").unwrap_or_default();
    assert!(
        unknown == "ok" || unknown.contains("no answer"),
        "unknown-type: {unknown}"
    );
    // The read of never-plugged memory: zeros, or (documented) the end of
    // Firecracker.
    match answer("unplugged-read") {
        Some(r) => eprintln!("Firecracker, unplugged-read: {r}"),
        None => assert!(
            exited.is_some() || !lines.iter().any(|l| l.starts_with(DONE)),
            "{lines:?}"
        ),
    }
    if exited.is_none() {
        let _ = vmm.child.kill();
        let _ = vmm.child.wait();
    }
}
