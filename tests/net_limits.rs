//! The network interface's rate limiters on the real binary and /dev/kvm
//! with the default flags (seccomp on): the test guest sends frames
//! (`net-send=<N>x<bytes>`) or echoes the host's (`net=echo`) through a tap
//! in a network namespace, and the host times what arrives on the tap.
//! Held to the configured rate within 20%; without a limiter much faster;
//! a `PATCH` while running changes the rate and `GET /vm/config` shows it.

mod common;

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;
use std::time::Instant;

use common::api::*;
use common::netns::{next_frame, packet_socket, start_on, start_program_on, Netns};
use common::*;

const MAC: &str = "06:00:ac:10:00:02";
/// The guest's frames' size after the virtio-net header (the limiter
/// counts the 12-byte header too).
const FRAME: usize = 1000;
const WIRE: f64 = (FRAME + 12) as f64;

/// teravm in `ns` with eth0 on its tap0 (`iface` extra fields), the test
/// guest running `args`: (teravm, API socket).
fn start(ns: &Netns, dir: &Path, iface: &str, args: &str) -> (Vmm, std::path::PathBuf) {
    start_on(
        ns,
        dir,
        "tap0",
        &format!(r#", "guest_mac": "{MAC}"{iface}"#),
        args,
    )
}

/// The `net_eth0` metrics group after a flush.
fn net_metrics(sock: &Path, dir: &Path) -> serde_json::Value {
    let (s, b) = action(sock, r#"{"action_type": "FlushMetrics"}"#);
    assert_eq!(s, 204, "{b}");
    let text = std::fs::read_to_string(dir.join("metrics")).unwrap();
    let last = json(text.lines().last().expect("a metrics line"));
    last["net_eth0"].clone()
}

/// Arrival times of `n` frames on `fd` that `pick` takes (guest frames by
/// their source MAC), each within `T`.
fn arrivals(fd: &OwnedFd, n: usize, pick: impl Fn(&[u8]) -> bool) -> Vec<Instant> {
    let mut at = Vec::with_capacity(n);
    while at.len() < n {
        let f = next_frame(fd, T).unwrap_or_else(|| panic!("frame {} of {n} never came", at.len()));
        if pick(&f) {
            at.push(Instant::now());
        }
    }
    at
}

fn from_guest(f: &[u8]) -> bool {
    f[6..12] == [6, 0, 0xac, 0x10, 0, 2] && f.len() >= FRAME
}

/// Frames per second between arrivals `from` and the last.
fn fps(at: &[Instant], from: usize) -> f64 {
    let span = at[at.len() - 1] - at[from];
    (at.len() - 1 - from) as f64 / span.as_secs_f64()
}

fn within(what: &str, got: f64, want: f64) {
    let off = (got - want).abs() / want;
    eprintln!(
        "{what}: {got:.0} (configured {want:.0}, {:.1}% off)",
        off * 100.0
    );
    assert!(off <= 0.2, "{what}: {got:.0}, configured {want:.0}");
}

fn netns_or_skip(test: &str) -> Option<Netns> {
    if !kvm_or_skip(test) {
        return None;
    }
    let ns = Netns::new(test);
    if ns.is_none() {
        skip(
            test,
            "cannot make a network namespace with a tap (ip, root)",
        );
    }
    ns
}

/// N frames through a tx limiter `limiter`: (their arrival times (the
/// short hello is not counted), the net metrics, the interface in `GET /vm/config`).
fn send_through(
    test: &str,
    ns: &Netns,
    limiter: &str,
    n: usize,
) -> (Vec<Instant>, serde_json::Value, serde_json::Value) {
    let (at, m, iface, _) = send_through_on(teravm(), test, ns, limiter, n);
    (at, m, iface)
}

/// What a run of [`send_through_on`] saw: the arrival times, the net
/// metrics, the interface in `GET /vm/config`, and the answer to a `PATCH`
/// of an interface that does not exist, made while running (status, and
/// whether a `fault_message` came).
type Sent = (
    Vec<Instant>,
    serde_json::Value,
    serde_json::Value,
    (u16, bool),
);

/// [`send_through`] on `program`: teravm, or the real Firecracker (the same
/// requests; it is stopped by a kill, having no `Shutdown`).
fn send_through_on(program: &str, test: &str, ns: &Netns, limiter: &str, n: usize) -> Sent {
    let dir = temp_dir(test);
    let fd = packet_socket(ns);
    let (mut vmm, sock) = start_program_on(
        program,
        ns,
        &dir,
        "tap0",
        &format!(r#", "guest_mac": "{MAC}"{limiter}"#),
        &format!("net-send={n}x{FRAME} then=idle"),
    );
    let at = arrivals(&fd, n, from_guest);
    vmm.wait_line(
        &format!("teravm guest: net sent {n} frames of {FRAME} bytes"),
        T,
    );
    let m = net_metrics(&sock, &dir);
    let iface = get(&sock, "/vm/config")["network-interfaces"][0].clone();
    let (s, b) = common::client::request(
        &sock,
        "PATCH",
        "/network-interfaces/eth9",
        Some(
            r#"{"iface_id": "eth9", "tx_rate_limiter": {"ops": {"size": 1, "refill_time": 100}}}"#,
        ),
    )
    .unwrap();
    let eth9 = (s, common::fc_api::has_fault(&b));
    if program == teravm() {
        shutdown_ok(vmm, &sock);
    }
    (at, m, iface, eth9)
}

#[test]
fn tx_bandwidth_is_held_to_the_limit_and_unlimited_is_faster() {
    let Some(ns) = netns_or_skip("net-tx-bw") else {
        return;
    };
    let _big = big_memory();
    // 200 000 bytes/s in buckets of 20 000: 400 frames of 1012 bytes take
    // about 2 s after the first bucket.
    let limiter = r#", "tx_rate_limiter": {"bandwidth": {"size": 20000, "refill_time": 100}}"#;
    let (at, m, iface) = send_through("net-tx-bw", &ns, limiter, 400);
    // Skip the first bucket (sent at once), then time the rest.
    within("tx bytes/s", fps(&at, 20) * WIRE, 200_000.0);
    assert!(u(&m, "tx_rate_limiter_throttled") >= 5, "{m}");
    assert!(u(&m, "tx_rate_limiter_event_count") >= 5, "{m}");
    // The hello, the 400, and echoes of what the host's stack sends.
    assert!(u(&m, "tx_packets_count") >= 401, "{m}");
    assert_eq!(
        iface["tx_rate_limiter"]["bandwidth"],
        serde_json::json!({"size": 20000, "one_time_burst": null, "refill_time": 100}),
        "{iface}"
    );
    // The same frames with no limiter: the limit was what held them.
    let (free, m, _) = send_through("net-tx-free", &ns, "", 400);
    let free_rate = fps(&free, 20) * WIRE;
    eprintln!("tx bytes/s unlimited: {free_rate:.0}");
    assert!(free_rate > 2.0 * 200_000.0, "unlimited: {free_rate:.0}");
    assert_eq!(u(&m, "tx_rate_limiter_throttled"), 0, "{m}");
}

#[test]
fn tx_ops_limit_changes_with_a_patch_while_running() {
    let Some(ns) = netns_or_skip("net-tx-ops") else {
        return;
    };
    let _big = big_memory();
    let dir = temp_dir("net-tx-ops");
    let fd = packet_socket(&ns);
    // 100 frames/s, then PATCHed to 400 frames/s.
    let (mut vmm, sock) = start(
        &ns,
        &dir,
        r#", "tx_rate_limiter": {"ops": {"size": 10, "refill_time": 100}}"#,
        &format!("net-send=600x{FRAME} then=idle"),
    );
    let slow = arrivals(&fd, 150, from_guest);
    within("tx frames/s before the PATCH", fps(&slow, 20), 100.0);
    let (s, b) = common::client::request(
        &sock,
        "PATCH",
        "/network-interfaces/eth0",
        Some(
            r#"{"iface_id": "eth0", "tx_rate_limiter": {"ops": {"size": 40, "refill_time": 100}}}"#,
        ),
    )
    .unwrap();
    assert_eq!(s, 204, "{b}");
    // A new bucket starts full: skip it, then time the rest.
    let fast = arrivals(&fd, 450, from_guest);
    within("tx frames/s after the PATCH", fps(&fast, 60), 400.0);
    vmm.wait_line("teravm guest: net sent 600 frames", T);
    let iface = get(&sock, "/vm/config")["network-interfaces"][0].clone();
    assert_eq!(
        iface["tx_rate_limiter"]["ops"],
        serde_json::json!({"size": 40, "one_time_burst": null, "refill_time": 100}),
        "{iface}"
    );
    // A PATCH for an interface that does not exist changes nothing.
    let (s, b) = common::client::request(
        &sock,
        "PATCH",
        "/network-interfaces/eth9",
        Some(
            r#"{"iface_id": "eth9", "tx_rate_limiter": {"ops": {"size": 1, "refill_time": 100}}}"#,
        ),
    )
    .unwrap();
    assert_fault(s, &b, 400, "no interface \"eth9\"");
    shutdown_ok(vmm, &sock);
}

#[test]
fn rx_ops_are_held_to_the_limit() {
    let Some(ns) = netns_or_skip("net-rx-ops") else {
        return;
    };
    let _big = big_memory();
    let dir = temp_dir("net-rx-ops");
    let fd = packet_socket(&ns);
    // 100 frames/s received; the echoes (unlimited) show the pace. Small
    // frames: the test guest's echo of long ones is not reliable.
    let (mut vmm, sock) = start(
        &ns,
        &dir,
        r#", "rx_rate_limiter": {"ops": {"size": 10, "refill_time": 100}}"#,
        "net=echo then=idle",
    );
    vmm.wait_line("teravm guest: net sent hello", T);
    let n = 200;
    let mut frame = vec![6, 0, 0xac, 0x10, 0, 2, 2, 0, 0, 0, 0, 9, 0x88, 0xB5];
    frame.extend_from_slice(b"from the host side");
    for _ in 0..n {
        // SAFETY: sends our buffer on our bound socket.
        let sent = unsafe { libc::send(fd.as_raw_fd(), frame.as_ptr().cast(), frame.len(), 0) };
        assert_eq!(sent as usize, frame.len());
    }
    let echoes = arrivals(&fd, n, |f| f[..6] == [2, 0, 0, 0, 0, 9]);
    within("rx frames/s", fps(&echoes, 10), 100.0);
    let m = net_metrics(&sock, &dir);
    assert!(u(&m, "rx_rate_limiter_throttled") >= 5, "{m}");
    assert_eq!(u(&m, "rx_dropped_frames"), 0, "{m}");
    shutdown_ok(vmm, &sock);
}

/// The tx bandwidth limiter of [`tx_bandwidth_is_held_to_the_limit_and_unlimited_is_faster`]
/// on the real Firecracker: the same requests, the same guest sending the
/// same frames through the same limiter. Firecracker holds them to the
/// limit (within 20%), and teravm's rate is within 20% of Firecracker's;
/// both count the throttling in `net_eth0`, and `GET /vm/config` shows the
/// same interface on both (the limiter with `"one_time_burst": null`). A
/// `PATCH` of an interface that does not exist is a 400 with a fault on
/// both.
#[test]
fn firecracker_holds_the_same_tx_limit_as_teravm() {
    let test = "net_tx_bw_as_firecracker";
    let Some(fc) = firecracker(test) else {
        return;
    };
    let Some(ns) = netns_or_skip(test) else {
        return;
    };
    let _big = big_memory();
    let limiter = r#", "tx_rate_limiter": {"bandwidth": {"size": 20000, "refill_time": 100}}"#;
    let fc = fc.display().to_string();
    let (fc_at, fc_m, fc_iface, fc_eth9) = send_through_on(&fc, "net-tx-bw-fc", &ns, limiter, 400);
    let fc_rate = fps(&fc_at, 20) * WIRE;
    within("Firecracker tx bytes/s", fc_rate, 200_000.0);
    assert!(u(&fc_m, "tx_rate_limiter_throttled") >= 5, "{fc_m}");
    let (at, m, iface, eth9) = send_through_on(teravm(), "net-tx-bw-tv", &ns, limiter, 400);
    within(
        "teravm tx bytes/s against Firecracker's",
        fps(&at, 20) * WIRE,
        fc_rate,
    );
    assert!(u(&m, "tx_rate_limiter_throttled") >= 5, "{m}");
    let d = common::fc_api::field_differences(&fc_iface, &iface, &[]);
    assert!(
        d.is_empty(),
        "GET /vm/config network-interfaces[0]: {d:?}\nFirecracker {fc_iface}\nteravm {iface}"
    );
    // A PATCH, while running, of an interface that does not exist.
    assert_eq!(eth9, fc_eth9, "PATCH eth9: teravm, Firecracker");
    assert_eq!(eth9, (400, true));
}
