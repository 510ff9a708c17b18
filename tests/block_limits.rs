//! A drive's rate limiter (issue 26), on the real binary and /dev/kvm
//! with the default flags (seccomp on): the test guest's `blk-read=<MiB>`
//! (64 KiB requests, timed by the guest's TSC clock) against a drive with a
//! bandwidth or an ops limit is held to the configured rate within 20%, by
//! the guest's clock and by the host's wall clock; an unlimited read is
//! much faster; a `PATCH /drives` while it runs changes the rate and
//! `GET /vm/config` shows it; the same guest with the same limiter on the
//! real Firecracker is held to the same rate; a guest blocked by its
//! limiter does not hold up the shutdown. And GET_ID: teravm answers what
//! Firecracker answers for the same file (its dev/rdev/inode).

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use common::api::*;
use common::client::request;
use common::guests::Guest;
use common::peers::{firecracker_blk_id, Kind, Launch};
use common::*;

const G: Guest = Guest::TestGuest;

/// 16 MiB/s in 2 MiB buckets (32 requests of 64 KiB).
fn bandwidth_16() -> Value {
    json!({"bandwidth": {"size": 2 << 20, "refill_time": 125}})
}

/// 160 requests a second in buckets of 16: 10 MiB/s of 64 KiB requests.
fn ops_160() -> Value {
    json!({"ops": {"size": 16, "refill_time": 100}})
}

/// The guest's time for `mib` MiB at `mib_s` MiB/s, the first `burst_mib`
/// (a full bucket) free.
fn expected_ms(mib: f64, mib_s: f64, burst_mib: f64) -> f64 {
    (mib - burst_mib) / mib_s * 1000.0
}

/// An 8 MiB drive (the guest's reads go round it).
fn disk(dir: &Path) -> PathBuf {
    let path = dir.join("disk.img");
    let bytes: Vec<u8> = (0..8 << 20).map(|i| (i % 251) as u8).collect();
    std::fs::write(&path, bytes).unwrap();
    path
}

/// The `ms` of a `blk read <MiB> MiB in <ms> ms` line.
fn read_ms(line: &str) -> f64 {
    line.rsplit(" in ")
        .next()
        .and_then(|t| t.strip_suffix(" ms"))
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("not a blk read line: {line:?}"))
}

/// teravm with the test guest reading `mib` MiB from a drive limited by
/// `limiter` (None: no limit), started over the API, with metrics.
struct Run {
    vmm: Vmm,
    sock: PathBuf,
    metrics: PathBuf,
}

fn start(test: &str, mib: u64, limiter: Option<Value>) -> Run {
    let dir = temp_dir(test);
    let path = disk(&dir);
    start_on(&dir, &path, &format!("blk-read={mib} then=idle"), limiter)
}

/// teravm with the test guest on `args` and the drive `path` (read-only).
fn start_on(dir: &Path, path: &Path, args: &str, limiter: Option<Value>) -> Run {
    let sock = dir.join("api.sock");
    let metrics = dir.join("metrics");
    let vmm = Vmm::spawn(&[
        "--api-sock",
        sock.to_str().unwrap(),
        "--metrics-path",
        metrics.to_str().unwrap(),
    ]);
    wait_for_api(&sock, T);
    put_ok(
        &sock,
        "/machine-config",
        r#"{"vcpu_count": 1, "mem_size_mib": 128, "huge_pages": "None"}"#,
    );
    let mut drive = json!({"drive_id": "data", "path_on_host": path,
                           "is_root_device": false, "is_read_only": true});
    if let Some(l) = limiter {
        drive["rate_limiter"] = l;
    }
    put_ok(&sock, "/drives/data", &drive.to_string());
    put_ok(&sock, "/boot-source", &G.boot_source(args));
    let (status, body) = action(&sock, r#"{"action_type": "InstanceStart"}"#);
    assert_eq!(status, 204, "{body}");
    Run { vmm, sock, metrics }
}

impl Run {
    /// Waits for the read: (the guest's ms, the host's ms from the device
    /// line, printed just before the first request, to the result line).
    fn read(&mut self) -> (f64, f64) {
        self.vmm.wait_line(&G.line("blk device at"), T);
        let t0 = Instant::now();
        let line = self.vmm.wait_line(&G.line("blk read"), T);
        let host = t0.elapsed().as_secs_f64() * 1000.0;
        assert!(!line.contains("error"), "{line}");
        (read_ms(&line), host)
    }

    /// The drive's metrics group, as a flush writes it now.
    fn block_metrics(&self) -> Value {
        let (status, body) = action(&self.sock, r#"{"action_type": "FlushMetrics"}"#);
        assert_eq!(status, 204, "{body}");
        let text = std::fs::read_to_string(&self.metrics).unwrap();
        let last: Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
        last["block_data"].clone()
    }

    fn drive_config(&self) -> Value {
        get(&self.sock, "/vm/config")["drives"][0].clone()
    }

    fn shutdown(self) {
        let (status, body) = action(&self.sock, r#"{"action_type": "Shutdown"}"#);
        assert_eq!(status, 200, "{body}");
        let (code, _, stderr) = self.vmm.wait(T);
        assert_eq!(code, 0, "{stderr}");
    }
}

fn within(what: &str, got: f64, want: f64, tolerance: f64) {
    let err = (got - want).abs() / want;
    eprintln!(
        "{what}: {got:.0} ms, expected {want:.0} ms ({:+.1}%)",
        100.0 * (got - want) / want
    );
    assert!(
        err <= tolerance,
        "{what}: {got:.0} ms, expected {want:.0} ms within {:.0}%",
        tolerance * 100.0
    );
}

#[test]
fn a_bandwidth_limit_holds_the_guests_reads_to_its_rate() {
    if !kvm_or_skip("blk_bandwidth") {
        return;
    }
    let _big = big_memory();
    let mut r = start("blk-bw", 32, Some(bandwidth_16()));
    let (guest, host) = r.read();
    let want = expected_ms(32.0, 16.0, 2.0);
    within("teravm, 16 MiB/s, guest clock", guest, want, 0.2);
    within("teravm, 16 MiB/s, host clock", host, want, 0.2);
    let m = r.block_metrics();
    assert!(
        m["rate_limiter_throttled_events"].as_u64().unwrap() > 0,
        "{m}"
    );
    assert!(m["rate_limiter_event_count"].as_u64().unwrap() > 0, "{m}");
    assert_eq!(m["read_bytes"], 32u64 << 20, "{m}");
    // GET /vm/config echoes the limiter it took.
    assert_eq!(
        r.drive_config()["rate_limiter"]["bandwidth"],
        echoed(&bandwidth_16()["bandwidth"])
    );
    r.shutdown();

    // The same read with no limit: much faster, nothing throttled.
    let mut r = start("blk-free", 32, None);
    let (free, _) = r.read();
    eprintln!("teravm, no limit: {free:.0} ms");
    assert!(
        free * 4.0 < want,
        "unlimited {free} ms vs limited {want} ms"
    );
    let m = r.block_metrics();
    assert_eq!(m["rate_limiter_throttled_events"], 0, "{m}");
    assert!(r.drive_config().get("rate_limiter").is_none());
    r.shutdown();
}

#[test]
fn an_ops_limit_holds_the_guests_requests_to_its_rate() {
    if !kvm_or_skip("blk_ops") {
        return;
    }
    let _big = big_memory();
    let mut r = start("blk-ops", 16, Some(ops_160()));
    let (guest, host) = r.read();
    // 256 requests at 160/s, the first 16 free.
    let want = (256.0 - 16.0) / 160.0 * 1000.0;
    within("teravm, 160 ops/s, guest clock", guest, want, 0.2);
    within("teravm, 160 ops/s, host clock", host, want, 0.2);
    r.shutdown();
}

#[test]
fn a_patch_while_reading_changes_the_rate() {
    if !kvm_or_skip("blk_patch") {
        return;
    }
    let _big = big_memory();
    // 2 MiB/s: 16 MiB would take 7.5 s.
    let slow = json!({"bandwidth": {"size": 512 << 10, "refill_time": 250}});
    let mut r = start("blk-patch", 16, Some(slow));
    r.vmm.wait_line(&G.line("blk device at"), T);
    // Wait until the guest is well into its read (throttled), then lift
    // the rate to 64 MiB/s.
    let deadline = Instant::now() + T;
    while r.block_metrics()["read_bytes"].as_u64().unwrap() < 1 << 20 {
        assert!(Instant::now() < deadline, "the guest never read 1 MiB");
        std::thread::sleep(Duration::from_millis(50));
    }
    let fast = json!({"bandwidth": {"size": 8 << 20, "refill_time": 125}});
    let body = json!({"drive_id": "data", "rate_limiter": fast}).to_string();
    let (status, reply) = request(&r.sock, "PATCH", "/drives/data", Some(&body)).unwrap();
    assert_eq!(status, 204, "{reply}");
    assert_eq!(
        r.drive_config()["rate_limiter"]["bandwidth"],
        echoed(&fast["bandwidth"]),
        "GET /vm/config shows the new limiter"
    );
    let line = r.vmm.wait_line(&G.line("blk read"), T);
    let guest = read_ms(&line);
    eprintln!("teravm, 2 MiB/s then 64 MiB/s: {guest:.0} ms (7500 ms unpatched)");
    assert!(guest < 0.6 * expected_ms(16.0, 2.0, 0.5), "{line}");
    // A bad bucket is refused and changes nothing.
    let bad = r#"{"drive_id": "data", "rate_limiter": {"ops": {"size": 1}}}"#;
    let (status, reply) = request(&r.sock, "PATCH", "/drives/data", Some(bad)).unwrap();
    assert_fault(status, &reply, 400, "refill_time");
    assert_eq!(
        r.drive_config()["rate_limiter"]["bandwidth"],
        echoed(&fast["bandwidth"])
    );
    // Removing the bucket (size 0) removes the limit.
    let off =
        r#"{"drive_id": "data", "rate_limiter": {"bandwidth": {"size": 0, "refill_time": 0}}}"#;
    let (status, reply) = request(&r.sock, "PATCH", "/drives/data", Some(off)).unwrap();
    assert_eq!(status, 204, "{reply}");
    assert!(r.drive_config().get("rate_limiter").is_none());
    r.shutdown();
}

#[test]
fn a_guest_blocked_by_its_limiter_does_not_hold_up_the_shutdown() {
    if !kvm_or_skip("blk_blocked_stop") {
        return;
    }
    let _big = big_memory();
    // One request a minute: the guest's second request waits.
    let mut r = start(
        "blk-blocked",
        16,
        Some(json!({"ops": {"size": 1, "refill_time": 60000}})),
    );
    r.vmm.wait_line(&G.line("blk device at"), T);
    let deadline = Instant::now() + T;
    while r.block_metrics()["rate_limiter_throttled_events"]
        .as_u64()
        .unwrap()
        == 0
    {
        assert!(Instant::now() < deadline, "never throttled");
        std::thread::sleep(Duration::from_millis(50));
    }
    let t0 = Instant::now();
    r.shutdown();
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "the shutdown took {:?}",
        t0.elapsed()
    );
}

#[test]
fn firecracker_holds_the_same_guest_to_the_same_rate() {
    let test = "blk_bandwidth_firecracker";
    if !kvm_or_skip(test) {
        return;
    }
    let Some(bin) = firecracker(test) else { return };
    let _big = big_memory();
    let dir = temp_dir(test);
    let path = disk(&dir);
    let mut peer = Launch::new(Kind::Firecracker, &bin, &dir, "blk-read=32 then=idle")
        .mem_mib(128)
        .drive(&path, true, "data")
        .drive_rate_limiter(bandwidth_16())
        .start();
    peer.wait_line(&G.line("blk device at"));
    let t0 = Instant::now();
    let line = peer.wait_line(&G.line("blk read"));
    let host = t0.elapsed().as_secs_f64() * 1000.0;
    let want = expected_ms(32.0, 16.0, 2.0);
    within(
        "Firecracker, 16 MiB/s, guest clock",
        read_ms(&line),
        want,
        0.2,
    );
    within("Firecracker, 16 MiB/s, host clock", host, want, 0.2);
    let _ = peer.vmm.child.kill();
}

#[test]
fn get_id_answers_what_firecracker_answers_for_the_same_file() {
    let test = "blk_get_id_firecracker";
    if !kvm_or_skip(test) {
        return;
    }
    let _big = big_memory();
    let dir = temp_dir(test);
    let path = disk(&dir);
    let want = format!("blk id {}", firecracker_blk_id(&path));
    let mut r = start_on(&dir, &path, "blk then=idle", None);
    let line = r.vmm.wait_line(&G.line("blk id"), T);
    assert!(line.ends_with(&want), "teravm: {line}, want {want}");
    r.shutdown();
    let Some(bin) = firecracker(test) else { return };
    let mut peer = Launch::new(Kind::Firecracker, &bin, &dir, "blk then=idle")
        .mem_mib(128)
        .drive(&path, true, "data")
        .start();
    let fc = peer.wait_line(&G.line("blk id"));
    assert_eq!(fc, line, "Firecracker and teravm answer GET_ID alike");
    let _ = peer.vmm.child.kill();
}

/// A bucket as `GET /vm/config` echoes it, as Firecracker does: with
/// `one_time_burst` `null` when it has none.
fn echoed(bucket: &Value) -> Value {
    let mut b = bucket.clone();
    b.as_object_mut()
        .unwrap()
        .entry("one_time_burst")
        .or_insert(Value::Null);
    b
}
