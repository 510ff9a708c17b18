//! The entropy device (virtio-rng) on the real binary and /dev/kvm with the
//! default flags, driven by the test guest's `rng=<bytes> rng-dump`; the
//! same guest on the real Firecracker. The guest gets its bytes (every one
//! of them, as the guest prints them, is looked at: no 4 KiB block is all
//! zero, no two blocks are alike, the byte values are spread as random
//! bytes' are), two runs differ, and a rate limiter holds the guest's reads
//! to its rate within 20%.

mod common;

use std::path::Path;

use common::api::*;
use common::guests::Guest;
use common::peers::{Kind, Launch};
use common::*;

/// teravm with the entropy device (`entropy` body) and the test guest
/// reading `bytes`: (the bytes, the ms the guest took, the `entropy`
/// metrics group).
fn teravm_reads(name: &str, entropy: &str, bytes: u64) -> (Vec<u8>, u64, serde_json::Value) {
    let dir = temp_dir(name);
    let sock = dir.join("api.sock");
    let mut vmm = Vmm::spawn(&["--api-sock", sock.to_str().unwrap()]);
    wait_for_api(&sock, T);
    put_ok(
        &sock,
        "/machine-config",
        r#"{"vcpu_count": 1, "mem_size_mib": 128, "huge_pages": "None"}"#,
    );
    let metrics = dir.join("metrics");
    put_ok(
        &sock,
        "/metrics",
        &format!(r#"{{"metrics_path": "{}"}}"#, metrics.display()),
    );
    put_ok(&sock, "/entropy", entropy);
    put_ok(
        &sock,
        "/boot-source",
        &Guest::TestGuest.boot_source(&format!("rng={bytes} rng-dump then=idle")),
    );
    let (s, b) = action(&sock, r#"{"action_type": "InstanceStart"}"#);
    assert_eq!(s, 204, "{b}");
    let (got, ms) = result(|n| vmm.wait_line(n, T), bytes);
    // After the start the device cannot be changed.
    let (s, b) = put(&sock, "/entropy", "{}");
    assert_fault(s, &b, 400, "not allowed");
    let (s, b) = action(&sock, r#"{"action_type": "FlushMetrics"}"#);
    assert_eq!(s, 204, "{b}");
    let text = std::fs::read_to_string(&metrics).unwrap();
    let m = json(text.lines().last().unwrap())["entropy"].clone();
    let (s, b) = action(&sock, r#"{"action_type": "Shutdown"}"#);
    assert_eq!(s, 200, "{b}");
    let (code, _, stderr) = vmm.wait(T);
    assert_eq!(code, 0, "{stderr}");
    (got, ms, m)
}

/// The guest's `rng` lines: (the bytes it read, as its `rng data` lines
/// print them, checked; ms taken).
fn result(mut wait: impl FnMut(&str) -> String, bytes: u64) -> (Vec<u8>, u64) {
    let line = wait(&format!("teravm guest: rng {bytes} bytes "));
    let first = line.rsplit(' ').next().unwrap().to_string();
    assert_eq!(first.len(), 32, "{line}");
    let took = wait("teravm guest: rng took ");
    let ms = took.split(' ').nth(4).unwrap().parse().unwrap();
    let mut got = Vec::new();
    loop {
        let line = wait("teravm guest: rng data ");
        let words: Vec<&str> = line.split(' ').collect();
        if words[4] == "end" {
            assert_eq!(words[5], got.len().to_string(), "{line}");
            break;
        }
        assert_eq!(words[4], got.len().to_string(), "a gap before {line}");
        got.extend(from_hex(words[5]).unwrap_or_else(|| panic!("not hex: {line}")));
    }
    assert_eq!(
        got.len() as u64,
        bytes,
        "the guest printed {} bytes",
        got.len()
    );
    assert_eq!(to_hex(&got[..16]), first, "the first 16 bytes");
    looks_random(&got);
    (got, ms)
}

fn from_hex(s: &str) -> Option<Vec<u8>> {
    if s.is_empty() || s.len() % 2 != 0 {
        return None;
    }
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok())
        .collect()
}

fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Every byte: no 4 KiB block all zero, no two blocks alike, and the
/// values spread as random bytes' are (Pearson's chi-square over the 256
/// values, 255 degrees of freedom: mean 255, deviation 22.6; 400 is more
/// than 6 deviations off, which random bytes do not reach).
fn looks_random(bytes: &[u8]) {
    let mut seen = std::collections::HashMap::new();
    for (i, block) in bytes.chunks(4096).enumerate() {
        assert!(
            block.iter().any(|&b| b != 0),
            "block {i} (of 4 KiB) is all zero"
        );
        if let Some(j) = seen.insert(block, i) {
            panic!("blocks {j} and {i} (of 4 KiB) are the same bytes");
        }
    }
    let mut count = [0u64; 256];
    for &b in bytes {
        count[usize::from(b)] += 1;
    }
    let expected = bytes.len() as f64 / 256.0;
    let chi2: f64 = count
        .iter()
        .map(|&c| (c as f64 - expected).powi(2) / expected)
        .sum();
    eprintln!(
        "{} bytes: chi-square {chi2:.0} (255 degrees of freedom)",
        bytes.len()
    );
    assert!(
        chi2 < 400.0,
        "{} bytes are not spread as random bytes are: chi-square {chi2:.0}, counts {count:?}",
        bytes.len()
    );
}

fn kvm_and_guest(test: &str) -> bool {
    if !kvm_or_skip(test) {
        return false;
    }
    assert!(guest().is_file(), "no test guest at {}", guest().display());
    true
}

/// 8192 bytes/s in buckets of 4096: 20480 bytes take 2 s after the first
/// bucket.
const LIMITED: &str = r#"{"bandwidth": {"size": 4096, "refill_time": 500}}"#;
const BYTES: u64 = 20480;
const WANT_MS: f64 = (BYTES - 4096) as f64 / 8192.0 * 1000.0;

fn within(what: &str, ms: u64) {
    let off = (ms as f64 - WANT_MS).abs() / WANT_MS;
    eprintln!(
        "{what}: {ms} ms (configured {WANT_MS:.0} ms, {:.1}% off)",
        off * 100.0
    );
    assert!(off <= 0.2, "{what}: {ms} ms, configured {WANT_MS:.0}");
}

#[test]
fn the_guest_gets_random_bytes_and_the_limiter_holds_its_rate() {
    if !kvm_and_guest("entropy") {
        return;
    }
    let _big = big_memory();
    let (a, _, m) = teravm_reads("rng-a", "{}", 65536);
    let (b, fast_ms, _) = teravm_reads("rng-b", r#"{"rate_limiter": null}"#, 65536);
    assert_ne!(a, b, "two runs gave the same bytes");
    assert_eq!(u(&m, "entropy_bytes"), 65536, "{m}");
    assert_eq!(u(&m, "entropy_rate_limiter_throttled"), 0, "{m}");
    let (_, ms, m) = teravm_reads(
        "rng-limited",
        &format!(r#"{{"rate_limiter": {LIMITED}}}"#),
        BYTES,
    );
    within("teravm, limited", ms);
    assert!(fast_ms * 4 < ms, "unlimited took {fast_ms} ms of {ms}");
    assert!(u(&m, "entropy_rate_limiter_throttled") >= 1, "{m}");
    assert!(u(&m, "rate_limiter_event_count") >= 1, "{m}");
}

#[test]
fn bad_entropy_bodies_are_400s() {
    let (vmm, sock, _dir) = start_api("rng-bad", &[]);
    for (body, needle) in [
        (r#"{"rate": 1}"#, "unknown field `rate`"),
        (
            r#"{"rate_limiter": {"ops": {"size": 1, "refill_time": 18446744073709551615}}}"#,
            "entropy.rate_limiter",
        ),
    ] {
        let (s, b) = put(&sock, "/entropy", body);
        assert_fault(s, &b, 400, needle);
    }
    drop(vmm);
}

fn firecracker_reads(
    test: &str,
    dir: &Path,
    limiter: serde_json::Value,
    bytes: u64,
) -> (Vec<u8>, u64) {
    let bin = firecracker(test).unwrap();
    std::fs::create_dir_all(dir).unwrap();
    let mut peer = Launch::new(
        Kind::Firecracker,
        &bin,
        dir,
        &format!("rng={bytes} rng-dump then=idle"),
    )
    .entropy(limiter)
    .start();
    let r = result(|n| peer.wait_line(n), bytes);
    peer.stop();
    r
}

#[test]
fn on_firecracker_the_same_guest_gets_bytes_held_to_the_same_rate() {
    if !kvm_and_guest("entropy_firecracker") || firecracker("entropy_firecracker").is_none() {
        return;
    }
    let _big = big_memory();
    let dir = temp_dir("rng-fc");
    let (a, _) = firecracker_reads(
        "entropy_firecracker",
        &dir.join("a"),
        serde_json::Value::Null,
        4096,
    );
    let (b, _) = firecracker_reads(
        "entropy_firecracker",
        &dir.join("b"),
        serde_json::Value::Null,
        4096,
    );
    assert_ne!(a, b);
    let (_, ms) = firecracker_reads(
        "entropy_firecracker",
        &dir.join("c"),
        serde_json::from_str(LIMITED).unwrap(),
        BYTES,
    );
    within("Firecracker, limited", ms);
}
