//! The MMDS (issue 26) on the real binary, /dev/kvm and the default flags:
//! the test guest's `mmds=<path>` fetches from teravm's MMDS over its
//! virtio-net (V1, V2 with a session token, V2 without one: 401, a nested
//! path, a missing one), the same guest on the real Firecracker with the
//! same configuration prints the same lines, and no MMDS frame reaches the
//! tap (a capture shown to see one: the firmware's without `mmds-config`). And the API: `PUT`/`PATCH`/`GET /mmds`, `PUT /mmds/config`, good
//! and bad bodies, the process alive after each; the MMDS configured over
//! the API (V2, another address) read by the guest, replaced while it runs
//! and read again by the guest, and the `mmds` metrics group counting it.

mod common;

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use common::api::*;
use common::guests::Guest;
use common::netns::{packet_socket, Netns};
use common::peers::{Kind, Launch};
use common::*;

const MAC: &str = "06:00:ac:10:00:02";
/// A value larger than one socket send buffer and many segments.
const BIG: usize = 40_000;

fn metadata() -> Value {
    json!({
        "latest": {"meta-data": {"ami-id": "ami-12345", "local": {"zone": "a1"}}},
        "user-data": "line one\nline two",
        "big": "x".repeat(BIG)
    })
}

/// The cases: (MMDS version, guest words, the line's words after the
/// prefix).
fn cases() -> Vec<(&'static str, &'static str, &'static str)> {
    vec![
        ("V1", "mmds=/latest/meta-data/ami-id", "mmds 200 ami-12345"),
        ("V1", "mmds=/latest/meta-data/", "mmds 200 ami-id local/"),
        ("V1", "mmds=/user-data", "mmds 200 line one line two"),
        (
            "V1",
            "mmds=/latest/nothing",
            "mmds 404 Resource not found: /latest/nothing.",
        ),
        ("V2", "mmds=/latest/meta-data/local/zone", "mmds 200 a1"),
        // The line shows the first 200 bytes; the guest read all 40 000
        // (it prints after Content-Length is met).
        ("V1", "mmds=/big", big_line()),
        (
            "V2",
            "mmds=/latest/meta-data/ami-id mmds-no-token",
            "mmds 401 No MMDS token provided.",
        ),
    ]
}

fn big_line() -> &'static str {
    Box::leak(format!("mmds 200 {}", "x".repeat(200)).into_boxed_str())
}

fn mmds_config(version: &str) -> Value {
    json!({"version": version, "network_interfaces": ["eth0"]})
}

/// Every frame the packet socket has now (non-blocking).
fn frames(fd: &OwnedFd) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut buf = vec![0u8; 65536];
    loop {
        // SAFETY: reads into our buffer of its length, without blocking.
        let n = unsafe {
            libc::recv(
                fd.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_DONTWAIT,
            )
        };
        if n <= 0 {
            return out;
        }
        out.push(buf[..n as usize].to_vec());
    }
}

/// Waits up to `timeout` for a frame on `fd` that [`is_mmds`]; how long
/// it took, or None.
fn wait_mmds_frame(fd: &OwnedFd, timeout: Duration) -> Option<Duration> {
    let start = Instant::now();
    let deadline = start + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return None;
        }
        let mut pfd = libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = left.as_millis().clamp(1, 1000) as i32;
        // SAFETY: one pollfd on our stack.
        if unsafe { libc::poll(&mut pfd, 1, ms) } <= 0 {
            continue;
        }
        if frames(fd).iter().any(|f| is_mmds(f)) {
            return Some(start.elapsed());
        }
    }
}

/// Whether an Ethernet frame is ARP about, or IPv4 to, 169.254.169.254.
fn is_mmds(f: &[u8]) -> bool {
    let ip = [169, 254, 169, 254];
    if f.len() < 14 {
        return false;
    }
    match (f[12], f[13]) {
        (0x08, 0x06) => f.len() >= 42 && f[38..42] == ip,
        (0x08, 0x00) => f.len() >= 34 && f[30..34] == ip,
        _ => false,
    }
}

/// Boots the test guest with `words` on teravm in `ns` (config file,
/// `--metadata`); returns its `mmds` line.
fn teravm_line(ns: &Netns, dir: &Path, version: &str, words: &str) -> String {
    teravm_wait(ns, dir, version, words, "teravm guest: mmds")
}

/// Boots the test guest with `words` and the MMDS on; returns the first
/// console line with `needle`.
fn teravm_wait(ns: &Netns, dir: &Path, version: &str, words: &str, needle: &str) -> String {
    teravm_wait_with(Guest::TestGuest, ns, dir, version, words, needle)
}

/// [`teravm_wait`] with either guest.
fn teravm_wait_with(
    who: Guest,
    ns: &Netns,
    dir: &Path,
    version: &str,
    words: &str,
    needle: &str,
) -> String {
    let mut vmm = teravm_spawn(who, ns, dir, Some(version), words);
    let line = vmm.wait_line(needle, T);
    let _ = vmm.child.kill();
    let _ = vmm.child.wait();
    line
}

/// teravm in `ns` with `who` running `words`, eth0 on the tap, the MMDS
/// of `version` on eth0 (none: no `mmds-config`) and `--metadata`.
fn teravm_spawn(who: Guest, ns: &Netns, dir: &Path, version: Option<&str>, words: &str) -> Vmm {
    let metadata_path = dir.join("metadata.json");
    std::fs::write(&metadata_path, metadata().to_string()).unwrap();
    let boot: Value = serde_json::from_str(&who.boot_source(words)).unwrap();
    let mut config = json!({
        "machine-config": {"vcpu_count": 1, "mem_size_mib": 128},
        "boot-source": boot,
        "network-interfaces": [{"iface_id": "eth0", "host_dev_name": "tap0", "guest_mac": MAC}],
    });
    if let Some(version) = version {
        config["mmds-config"] = mmds_config(version);
    }
    let config_path = config_file(dir, &config.to_string());
    let mut cmd = Command::new("ip");
    cmd.args([
        "netns",
        "exec",
        &ns.name,
        teravm(),
        "--no-api",
        "--config-file",
    ])
    .arg(&config_path)
    .arg("--metadata")
    .arg(&metadata_path);
    Vmm::spawn_command(cmd)
}

fn words_of(line: &str) -> &str {
    line.split_once("teravm guest: ")
        .or_else(|| line.split_once("teravm firmware: "))
        .map_or(line, |(_, w)| w)
        .trim_end()
}

/// The firmware's `mmds=` (its own ARP, TCP and HTTP client, tested in
/// tests/firmware_words.rs against Linux's stack) against teravm's MMDS:
/// the same cases and lines as the test guest's, but the one that needs the
/// test guest's `mmds-no-token` word.
#[test]
fn the_firmware_fetches_from_teravms_mmds_as_the_test_guest_does() {
    if !kvm_or_skip("mmds_firmware") {
        return;
    }
    let Some(ns) = Netns::new("mmdsfw") else {
        skip(
            "mmds_firmware",
            "cannot make a network namespace with a tap (ip, root)",
        );
        return;
    };
    let _big = big_memory();
    let dir = temp_dir("mmds-firmware");
    let fd = packet_socket(&ns);
    for (version, words, want) in cases() {
        if words.contains("mmds-no-token") {
            continue;
        }
        let line = teravm_wait_with(
            Guest::Firmware,
            &ns,
            &dir,
            version,
            words,
            "teravm firmware: mmds",
        );
        let got = words_of(&line);
        eprintln!("firmware {version} {words}: {got}");
        assert!(
            got.starts_with(want),
            "{version} {words}: {got:?}, want {want:?}"
        );
    }
    let seen = frames(&fd);
    assert!(
        !seen.iter().any(|f| is_mmds(f)),
        "an MMDS frame of the firmware's reached the tap"
    );
    // The control: the same firmware word on the same tap without
    // `mmds-config` sends its frames (ARP for 169.254.169.254) to the tap,
    // and the same capture sees them; so the check above could have seen
    // one.
    let mut control = teravm_spawn(
        Guest::Firmware,
        &ns,
        &dir,
        None,
        "mmds=/latest/meta-data/ami-id then=idle",
    );
    let took = wait_mmds_frame(&fd, T);
    let _ = control.child.kill();
    let _ = control.child.wait();
    let took = took.unwrap_or_else(|| {
        panic!("control: no MMDS frame on the tap within {T:?} from a firmware without mmds-config")
    });
    eprintln!("control: the capture saw an MMDS frame after {took:?}");
}

#[test]
fn the_guest_fetches_from_teravms_mmds_and_the_tap_sees_none_of_it() {
    if !kvm_or_skip("mmds") {
        return;
    }
    let Some(ns) = Netns::new("mmds") else {
        skip(
            "mmds",
            "cannot make a network namespace with a tap (ip, root)",
        );
        return;
    };
    let _big = big_memory();
    let dir = temp_dir("mmds-teravm");
    let fd = packet_socket(&ns);
    for (version, words, want) in cases() {
        let line = teravm_line(&ns, &dir, version, words);
        let got = words_of(&line);
        eprintln!("teravm {version} {words}: {got}");
        assert!(
            got.starts_with(want),
            "{version} {words}: {got:?}, want {want:?}"
        );
    }
    // The socket does see the guest's other frames: its net hello (with
    // the MMDS on) reaches the tap.
    teravm_wait(&ns, &dir, "V1", "net=echo then=idle", "net sent hello");
    let seen = frames(&fd);
    assert!(
        seen.iter()
            .any(|f| f.len() > 14 && f[12] == 0x88 && f[13] == 0xb5),
        "no hello among {} frames on the tap",
        seen.len()
    );
    let mmds: Vec<_> = seen.iter().filter(|f| is_mmds(f)).collect();
    assert!(
        mmds.is_empty(),
        "{} of {} frames on the tap were the MMDS's: {:02x?}",
        mmds.len(),
        seen.len(),
        mmds.first()
    );
}

#[test]
fn the_same_guest_on_firecracker_prints_the_same_lines() {
    if !kvm_or_skip("mmds_firecracker") {
        return;
    }
    let Some(fc) = firecracker("mmds_firecracker") else {
        return;
    };
    let Some(ns) = Netns::new("mmdsfc") else {
        skip(
            "mmds_firecracker",
            "cannot make a network namespace with a tap (ip, root)",
        );
        return;
    };
    let _big = big_memory();
    let dir = temp_dir("mmds-fc");
    let metadata_path = dir.join("metadata.json");
    std::fs::write(&metadata_path, metadata().to_string()).unwrap();
    for (version, words, want) in cases() {
        let teravm = teravm_line(&ns, &dir, version, words);
        let _ = std::fs::remove_file(dir.join("fc.sock"));
        let mut peer = Launch::new(Kind::Firecracker, &fc, &dir, words)
            .mem_mib(128)
            .tap(&ns, MAC)
            .mmds(mmds_config(version), Some(&metadata_path))
            .start();
        let line = peer.wait_line("teravm guest: mmds");
        eprintln!("firecracker {version} {words}: {}", words_of(&line));
        let _ = peer.vmm.child.kill();
        let _ = peer.vmm.child.wait();
        assert_eq!(
            words_of(&line),
            words_of(&teravm),
            "{version} {words}: Firecracker and teravm differ"
        );
        assert!(words_of(&line).starts_with(want), "{line:?}");
    }
}

#[test]
fn the_api_takes_good_mmds_bodies_and_refuses_bad_ones() {
    let Some(ns) = Netns::new("mmdsapi") else {
        skip(
            "mmds_api",
            "cannot make a network namespace with a tap (ip, root)",
        );
        return;
    };
    let dir = temp_dir("mmds-api");
    let sock = dir.join("api.sock");
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", &ns.name, teravm(), "--api-sock"])
        .arg(&sock)
        .args(["--mmds-size-limit", "200"]);
    let vmm = Vmm::spawn_command(cmd);
    wait_for_api(&sock, T);
    let req = |m: &str, p: &str, b: Option<&str>| client::request(&sock, m, p, b).unwrap();

    // The store: empty, then PUT, PATCH, GET.
    assert_eq!(get(&sock, "/mmds"), json!({}));
    let (s, r) = req("PATCH", "/mmds", Some(r#"{"a": 1}"#));
    assert_fault(s, &r, 400, "not initialized");
    assert_eq!(
        req("PUT", "/mmds", Some(r#"{"a": {"b": 1}, "c": 2}"#)).0,
        204
    );
    assert_eq!(
        req("PATCH", "/mmds", Some(r#"{"a": {"b": null, "d": "x"}}"#)).0,
        204
    );
    assert_eq!(get(&sock, "/mmds"), json!({"a": {"d": "x"}, "c": 2}));
    for (method, body, code, needle) in [
        ("PUT", "", 400, "JSON body"),
        ("PUT", "{nope", 400, "invalid mmds body"),
        ("PATCH", "[1,", 400, "invalid mmds body"),
    ] {
        let (s, r) = req(method, "/mmds", Some(body));
        assert_fault(s, &r, code, needle);
    }
    // Past --mmds-size-limit: 413, nothing changed.
    let big = json!({"k": "x".repeat(300)}).to_string();
    let (s, r) = req("PUT", "/mmds", Some(&big));
    assert_fault(s, &r, 413, "doesn't fit");
    let (s, r) = req("PATCH", "/mmds", Some(&big));
    assert_fault(s, &r, 413, "doesn't fit");
    assert_eq!(get(&sock, "/mmds"), json!({"a": {"d": "x"}, "c": 2}));
    assert_eq!(req("DELETE", "/mmds", None).0, 405);

    // The configuration: refused without the interface, then taken.
    for (body, needle) in [
        (r#"{}"#, "network_interfaces"),
        (r#"{"network_interfaces": []}"#, "is empty"),
        (r#"{"network_interfaces": ["eth0"]}"#, "does not correspond"),
        (
            r#"{"network_interfaces": ["eth0"], "ipv4_address": "10.0.0.1"}"#,
            "not link local",
        ),
        (
            r#"{"network_interfaces": ["eth0"], "ipv4_address": "169.254.0.1"}"#,
            "not link local",
        ),
        (
            r#"{"network_interfaces": ["eth0"], "version": "V3"}"#,
            "version",
        ),
        (
            r#"{"network_interfaces": ["eth0"], "x": 1}"#,
            "unknown field",
        ),
    ] {
        let (s, r) = req("PUT", "/mmds/config", Some(body));
        assert_fault(s, &r, 400, needle);
    }
    put_ok(
        &sock,
        "/network-interfaces/eth0",
        &format!(r#"{{"iface_id": "eth0", "host_dev_name": "tap0", "guest_mac": "{MAC}"}}"#),
    );
    put_ok(
        &sock,
        "/mmds/config",
        r#"{"network_interfaces": ["eth0"], "version": "V2", "ipv4_address": "169.254.170.2", "imds_compat": true}"#,
    );
    let config = get(&sock, "/vm/config");
    assert_eq!(
        config["mmds-config"],
        json!({"version": "V2", "network_interfaces": ["eth0"],
               "ipv4_address": "169.254.170.2", "imds_compat": true}),
        "{config}"
    );
    assert_eq!(req("GET", "/mmds/config", None).0, 405);
    assert_eq!(state(&sock), "Not started");
    drop(vmm);
}

/// Past `--mmds-size-limit`, `PUT` and `PATCH /mmds` are a 413 with a
/// `fault_message` and change nothing: asked of the real Firecracker with
/// the same flag and the same requests, and teravm must answer alike.
#[test]
fn past_the_size_limit_a_413_as_on_firecracker() {
    let test = "mmds_413_as_firecracker";
    let Some(fc) = firecracker(test) else {
        return;
    };
    let both = common::fc_api::Both::start(test, &fc, &["--mmds-size-limit", "200"]);
    let small = r#"{"a": {"b": 1}, "c": 2}"#;
    assert_eq!(both.same("PUT", "/mmds", Some(small)).0, 204);
    let big = json!({"k": "x".repeat(300)}).to_string();
    // A body that fits once merged is taken: the limit is on the store.
    let fits = json!({"c": "y".repeat(100)}).to_string();
    for (method, body, code) in [
        ("PUT", &big, 413),
        ("PATCH", &big, 413),
        ("PATCH", &fits, 204),
        ("PUT", &small.to_string(), 204),
    ] {
        let (s, b) = both.same(method, "/mmds", Some(body));
        assert_eq!(s, code, "{method} {} bytes: {b}", body.len());
        if code == 413 {
            assert_fault(s, &b, 413, "doesn't fit");
        }
        // Nothing changed by a refused body; both stores alike.
        both.same_json("/mmds");
    }
    assert_eq!(both.same_json("/mmds"), json!({"a": {"b": 1}, "c": 2}));
}

#[test]
fn a_bad_metadata_file_is_one_line_and_exit_1() {
    let dir = temp_dir("mmds-bad-metadata");
    let bad = dir.join("bad.json");
    std::fs::write(&bad, "{not json").unwrap();
    let (code, _, stderr) = run(
        &[
            "--no-api",
            "--config-file",
            config_file(&dir, &config_json(1, 64, "then=reset", ""))
                .to_str()
                .unwrap(),
            "--metadata",
            bad.to_str().unwrap(),
        ],
        Duration::from_secs(30),
    );
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("--metadata") && stderr.contains("not valid JSON"),
        "{stderr}"
    );
}

#[test]
fn configured_over_the_api_the_guest_reads_it_and_the_metrics_count_it() {
    if !kvm_or_skip("mmds_api_guest") {
        return;
    }
    let Some(ns) = Netns::new("mmdsapig") else {
        skip(
            "mmds_api_guest",
            "cannot make a network namespace with a tap (ip, root)",
        );
        return;
    };
    let _big = big_memory();
    let dir = temp_dir("mmds-api-guest");
    let sock = dir.join("api.sock");
    let metrics = dir.join("metrics");
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", &ns.name, teravm(), "--api-sock"])
        .arg(&sock)
        .arg("--metrics-path")
        .arg(&metrics);
    let mut vmm = Vmm::spawn_command(cmd);
    wait_for_api(&sock, T);
    put_ok(
        &sock,
        "/machine-config",
        r#"{"vcpu_count": 1, "mem_size_mib": 128}"#,
    );
    put_ok(
        &sock,
        "/boot-source",
        &json!({"kernel_image_path": guest(),
                "boot_args": "mmds=/a/b mmds-addr=169.254.170.2 mmds-watch"})
        .to_string(),
    );
    put_ok(
        &sock,
        "/network-interfaces/eth0",
        &format!(r#"{{"iface_id": "eth0", "host_dev_name": "tap0", "guest_mac": "{MAC}"}}"#),
    );
    put_ok(
        &sock,
        "/mmds/config",
        r#"{"network_interfaces": ["eth0"], "version": "V2", "ipv4_address": "169.254.170.2"}"#,
    );
    put_ok(&sock, "/mmds", r#"{"a": {"b": "from the API"}}"#);
    let (s, r) = action(&sock, r#"{"action_type": "InstanceStart"}"#);
    assert_eq!(s, 204, "{r}");
    let line = vmm.wait_line("teravm guest: mmds", T);
    assert_eq!(words_of(&line), "mmds 200 from the API");
    // Replaced while running (as Firecracker allows): the guest, asking
    // again and again (`mmds-watch`), reads the new value; then the
    // configuration refused once started.
    put_ok(&sock, "/mmds", r#"{"a": {"b": "new"}}"#);
    assert_eq!(get(&sock, "/mmds"), json!({"a": {"b": "new"}}));
    let line = vmm.wait_line("teravm guest: mmds", T);
    assert_eq!(words_of(&line), "mmds 200 new", "after PUT /mmds");
    let line = vmm.wait_line("teravm guest: mmds watched", T);
    let gets: u64 = words_of(&line)
        .strip_prefix("mmds watched ")
        .and_then(|w| w.strip_suffix(" gets"))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{line:?}"));
    let (s, r) = req_put_config(&sock);
    assert_fault(s, &r, 400, "not allowed in state");
    let (s, r) = action(&sock, r#"{"action_type": "FlushMetrics"}"#);
    assert_eq!(s, 204, "{r}");
    let text = std::fs::read_to_string(&metrics).unwrap();
    let last: Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    let m = &last["mmds"];
    // The token PUT, the first GET and the watch's GETs, all on V2 with
    // the token: no token counted missing or invalid, nothing dropped.
    assert_eq!(m["rx_count"], 2 + gets, "{last}");
    assert!(m["rx_accepted"].as_u64().unwrap() >= 6, "{m}");
    assert!(m["tx_frames"].as_u64().unwrap() >= 6, "{m}");
    assert_eq!(m["tx_dropped"], 0, "{m}");
    assert_eq!(m["rx_no_token"], 0, "{m}");
    assert_eq!(m["rx_invalid_token"], 0, "{m}");
    let _ = vmm.child.kill();
    let _ = vmm.child.wait();
}

fn req_put_config(sock: &Path) -> (u16, String) {
    put(sock, "/mmds/config", r#"{"network_interfaces": ["eth0"]}"#)
}
