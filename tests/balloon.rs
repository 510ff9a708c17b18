//! The balloon on the real binary and /dev/kvm with the default flags
//! (issue 17): the built-in firmware's driver (`balloon`,
//! `report=<MiB>`) against teravm's virtio-mmio balloon, freed by the
//! per-node discard pool while the guest runs.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::api::*;
use common::guests::Guest;
use common::*;
use serde_json::Value;

/// Polls `GET /balloon/statistics` until `check` holds, or panics.
fn stats_until(sock: &Path, what: &str, mut check: impl FnMut(&Value) -> bool) -> Value {
    let deadline = Instant::now() + T;
    loop {
        let v = get(sock, "/balloon/statistics");
        if check(&v) {
            return v;
        }
        assert!(Instant::now() < deadline, "{what}: last {v}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn patch(sock: &Path, path: &str, body: &str) -> (u16, String) {
    common::client::request(sock, "PATCH", path, Some(body)).expect("the API answers")
}

/// teravm with an API socket, configured with `machine`, `balloon` and the
/// firmware's `args`, started; returns once the firmware touched its RAM.
fn started(
    g: Guest,
    name: &str,
    machine: &str,
    balloon: &str,
    args: &str,
    extra: &[&str],
) -> (Vmm, std::path::PathBuf) {
    started_env(g, name, machine, balloon, args, extra, &[])
}

/// `started` with environment variables (faults) for teravm.
fn started_env(
    g: Guest,
    name: &str,
    machine: &str,
    balloon: &str,
    args: &str,
    extra: &[&str],
    env: &[(&str, &str)],
) -> (Vmm, std::path::PathBuf) {
    let dir = temp_dir(name);
    let sock = dir.join("api.sock");
    let mut a = vec!["--api-sock", sock.to_str().unwrap()];
    a.extend_from_slice(extra);
    let mut vmm = Vmm::spawn_env(&a, env);
    wait_for_api(&sock, T);
    put_ok(&sock, "/machine-config", machine);
    if extra.contains(&"--sysfs-root") {
        // A fake host: its nodes cannot be bound to.
        put_ok(&sock, "/memory", r#"{"numa_policy": "none"}"#);
    }
    put_ok(&sock, "/balloon", balloon);
    put_ok(&sock, "/boot-source", &g.boot_source(args));
    let (status, body) = action(&sock, r#"{"action_type": "InstanceStart"}"#);
    assert_eq!(status, 204, "{body}");
    vmm.wait_line("touched", T);
    (vmm, sock)
}

fn inflate_by_patch_frees_the_pages_and_deflate_gives_them_back(g: Guest) {
    if !kvm_or_skip("balloon_inflate") {
        return;
    }
    let _big = big_memory();
    let (mut vmm, sock) = started(
        g,
        "balloon-inflate",
        r#"{"vcpu_count": 1, "mem_size_mib": 512, "huge_pages": "None"}"#,
        r#"{"amount_mib": 0, "deflate_on_oom": false}"#,
        "touch=384 balloon then=idle",
        &[],
    );
    vmm.wait_line(&g.line("balloon device at"), T);
    let pid = vmm.child.id();
    let before = rss_bytes_of(pid);
    assert!(before > 380 << 20, "the guest touched 384 MiB: {before}");
    let (status, body) = patch(&sock, "/balloon", r#"{"amount_mib": 256}"#);
    assert_eq!(status, 204, "{body}");
    let s = stats_until(&sock, "inflate to 256 MiB", |v| v["actual_mib"] == 256);
    assert_eq!(s["target_mib"], 256, "{s}");
    assert_eq!(s["target_pages"], 256 * 256, "{s}");
    // The pages went back to the host, counted by the pool.
    let deadline = Instant::now() + T;
    while rss_bytes_of(pid) > before - (240 << 20) {
        assert!(
            Instant::now() < deadline,
            "RSS {} of {before}",
            rss_bytes_of(pid)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let s = stats_until(&sock, "discard counted", |v| {
        v["teravm"]["discarded_bytes"].as_u64() >= Some(256 << 20)
    });
    assert!(s["teravm"]["ranges"].as_u64().unwrap() > 0, "{s}");
    let (status, body) = patch(&sock, "/balloon", r#"{"amount_mib": 0}"#);
    assert_eq!(status, 204, "{body}");
    stats_until(&sock, "deflate to 0", |v| v["actual_mib"] == 0);
    // A target above RAM is refused and changes nothing.
    let (status, body) = patch(&sock, "/balloon", r#"{"amount_mib": 4096}"#);
    assert_fault(status, &body, 400, "512");
    assert_eq!(get(&sock, "/balloon")["amount_mib"], 0);
    // After start the balloon cannot be put again.
    let (status, body) = put(
        &sock,
        "/balloon",
        r#"{"amount_mib": 1, "deflate_on_oom": false}"#,
    );
    assert_fault(status, &body, 400, "Running");
    let (status, body) = action(&sock, r#"{"action_type": "Shutdown"}"#);
    assert_eq!(status, 200, "{body}");
    let reply = json(&body);
    // The device let go of guest memory: shutdown freed with every worker.
    assert_eq!(reply["state"], "done", "{reply}");
    assert_eq!(u(&reply, "address_bytes_done"), 512 << 20, "{reply}");
    assert_eq!(u(&reply, "workers"), 1, "{reply}");
    let (code, _, stderr) = vmm.wait(T);
    assert_eq!(code, 0, "{stderr}");
}

fn reported_ranges_are_freed_in_both_nodes_slices_and_read_back_zero(g: Guest) {
    if !kvm_or_skip("balloon_report") {
        return;
    }
    let _big = big_memory();
    let dir = temp_dir("balloon-report-sys");
    let sysfs = fake_sysfs(&dir, 2);
    let (mut vmm, sock) = started(
        g,
        "balloon-report",
        r#"{"vcpu_count": 1, "mem_size_mib": 2048, "huge_pages": "None"}"#,
        r#"{"amount_mib": 0, "deflate_on_oom": false, "free_page_reporting": true}"#,
        "touch=1536 report=1024 balloon then=idle",
        &["--sysfs-root", sysfs.to_str().unwrap()],
    );
    let line = vmm.wait_line(&g.line("balloon reported"), T);
    assert!(
        line.ends_with("balloon reported 1024 MiB, read back zero: yes"),
        "{line}"
    );
    let s = get(&sock, "/balloon/statistics");
    let per_node = s["teravm"]["discarded_bytes_per_node"]
        .as_array()
        .unwrap()
        .clone();
    // Touched [6 MiB, 1542 MiB) (the test guest: [18 MiB, 1554 MiB)),
    // reported from the top down: [518, 1542) MiB, across the two 1 GiB
    // slices.
    assert_eq!(per_node.len(), 2, "{s}");
    for n in &per_node {
        assert!(n["bytes"].as_u64().unwrap() >= 400 << 20, "{s}");
    }
    assert!(
        s["teravm"]["discarded_bytes"].as_u64().unwrap() >= 1000 << 20,
        "{s}"
    );
    vmm.signal(libc::SIGTERM);
    let (code, _, stderr) = vmm.wait(T);
    assert_eq!(code, 0, "{stderr}");
    // The balloon and its pool let go of guest memory before reclaim: every
    // worker of both nodes freed it (a view still held would refuse).
    assert!(stderr.contains("4 workers, 2 nodes"), "{stderr}");
}

/// The balloon's `stats_updates_count` now, by a `FlushMetrics`.
fn stats_updates(sock: &Path, metrics: &Path) -> u64 {
    let (status, body) = action(sock, r#"{"action_type": "FlushMetrics"}"#);
    assert_eq!(status, 204, "{body}");
    let text = std::fs::read_to_string(metrics).unwrap();
    let last: Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    last["balloon"]["stats_updates_count"].as_u64().unwrap()
}

/// The gaps between the next `n + 1` statistics updates the guest gives
/// (polled every 20 ms).
fn update_gaps(sock: &Path, metrics: &Path, n: usize) -> Vec<Duration> {
    let deadline = Instant::now() + T;
    let mut last = stats_updates(sock, metrics);
    let mut at: Vec<Instant> = Vec::new();
    while at.len() <= n {
        assert!(Instant::now() < deadline, "updates so far at {at:?}");
        std::thread::sleep(Duration::from_millis(20));
        let now = stats_updates(sock, metrics);
        if now > last {
            at.push(Instant::now());
            last = now;
        }
    }
    at.windows(2).map(|w| w[1] - w[0]).collect()
}

fn statistics_come_from_the_guest_at_the_polling_interval(g: Guest) {
    if !kvm_or_skip("balloon_stats") {
        return;
    }
    let _big = big_memory();
    let dir = temp_dir("balloon-stats-metrics");
    let metrics = dir.join("metrics");
    let (vmm, sock) = started(
        g,
        "balloon-stats",
        r#"{"vcpu_count": 1, "mem_size_mib": 256, "huge_pages": "None"}"#,
        r#"{"amount_mib": 0, "deflate_on_oom": false, "stats_polling_interval_s": 1}"#,
        "touch=64 balloon then=idle",
        &["--metrics-path", metrics.to_str().unwrap()],
    );
    let s = stats_until(&sock, "the guest's counters", |v| {
        v["total_memory"].as_u64().is_some() && v["free_memory"].as_u64().is_some()
    });
    // The firmware counts all of its RAM; the test guest the RAM of the
    // memory map, less the hole below 1 MiB, as Linux would.
    let total = s["total_memory"].as_u64().unwrap();
    match g {
        Guest::Firmware => assert_eq!(total, 256u64 << 20, "{s}"),
        Guest::TestGuest => assert!((255 << 20..=256 << 20).contains(&total), "{s}"),
    }
    assert!(s["free_memory"].as_u64().unwrap() < 256 << 20, "{s}");
    // Updates come every second, then every 2 s once PATCHed.
    let near = |gaps: &[Duration], secs: f64| {
        for g in gaps {
            let g = g.as_secs_f64();
            assert!(
                g > secs - 0.3 && g < secs + 0.5,
                "gaps {gaps:?}, not {secs} s"
            );
        }
    };
    near(&update_gaps(&sock, &metrics, 2), 1.0);
    let (status, body) = patch(
        &sock,
        "/balloon/statistics",
        r#"{"stats_polling_interval_s": 2}"#,
    );
    assert_eq!(status, 204, "{body}");
    assert_eq!(get(&sock, "/balloon")["stats_polling_interval_s"], 2);
    // The first update after the PATCH may come at either pace.
    let _ = update_gaps(&sock, &metrics, 0);
    near(&update_gaps(&sock, &metrics, 2), 2.0);
    vmm.signal(libc::SIGTERM);
    let (code, _, stderr) = vmm.wait(T);
    assert_eq!(code, 0, "{stderr}");
}

// The three slow-discard tests below drive the firmware only: their
// `bcheck-deflate` / `bcheck-reset` words are the firmware's instruments
// (timed register reads during a deflate, a timed reset), which the test
// guest does not have.

/// Every discard of the balloon's pool waits 2 s before it frees.
const SLOW_DISCARD: (&str, &str) = ("TERAVM_FAULT_INJECT", "slow-discard");

/// The N of a firmware line "... took N ms".
fn took_ms(line: &str) -> u64 {
    let t = line
        .split(" took ")
        .nth(1)
        .unwrap_or_else(|| panic!("{line}"));
    t.trim_end_matches(" ms")
        .parse()
        .unwrap_or_else(|_| panic!("{line}"))
}

/// How long `f` took.
fn timed<T>(f: impl FnOnce() -> T) -> (T, Duration) {
    let t = Instant::now();
    let v = f();
    (v, t.elapsed())
}

/// Prompt: what a vCPU register access, an API request or a shutdown may
/// take while a discard runs (the slow one takes 2 s).
const PROMPT: Duration = Duration::from_millis(500);

#[test]
fn a_slow_discard_stalls_no_register_read_nor_the_api_and_deflated_pages_keep_their_contents() {
    if !kvm_or_skip("balloon_slow_deflate") {
        return;
    }
    let _big = big_memory();
    let (mut vmm, sock) = started_env(
        Guest::Firmware,
        "balloon-slow-deflate",
        r#"{"vcpu_count": 1, "mem_size_mib": 256, "huge_pages": "None"}"#,
        r#"{"amount_mib": 0, "deflate_on_oom": false}"#,
        "touch=64 balloon bcheck-deflate then=idle",
        &[],
        &[SLOW_DISCARD],
    );
    // Inflated, then deflated at once: the deflate waits for the discard.
    let regs = vmm.wait_line("balloon register reads took", T);
    let (_, api) = timed(|| get(&sock, "/"));
    let (s, stats) = timed(|| get(&sock, "/balloon/statistics"));
    assert!(
        api < PROMPT && stats < PROMPT,
        "GET / {api:?}, statistics {stats:?}"
    );
    assert!(
        took_ms(&regs) < PROMPT.as_millis() as u64,
        "2000 register reads while the deflate waits: {regs}"
    );
    let line = vmm.wait_line("balloon deflate took", T);
    assert!(
        took_ms(&line) >= 1000,
        "the deflate waited for the discard: {line}"
    );
    let line = vmm.wait_line("balloon deflate pattern", T);
    assert!(line.ends_with("balloon deflate pattern ok"), "{line}");
    assert!(s["teravm"]["failures"].as_u64() == Some(0), "{s}");
    vmm.signal(libc::SIGTERM);
    let (code, _, stderr) = vmm.wait(T);
    assert_eq!(code, 0, "{stderr}");
}

#[test]
fn a_driver_reset_completes_only_once_the_discards_end_and_the_pages_keep_their_contents() {
    if !kvm_or_skip("balloon_slow_reset") {
        return;
    }
    let _big = big_memory();
    let (mut vmm, _sock) = started_env(
        Guest::Firmware,
        "balloon-slow-reset",
        r#"{"vcpu_count": 1, "mem_size_mib": 256, "huge_pages": "None"}"#,
        r#"{"amount_mib": 0, "deflate_on_oom": false}"#,
        "touch=64 balloon bcheck-reset then=idle",
        &[],
        &[SLOW_DISCARD],
    );
    let line = vmm.wait_line("balloon reset took", T);
    assert!(
        took_ms(&line) >= 1000,
        "Status read 0 before the discard ended: {line}"
    );
    // Set up again, the pages written: a late discard would zero them.
    let line = vmm.wait_line("balloon reset pattern", T);
    assert!(line.ends_with("balloon reset pattern ok"), "{line}");
    vmm.signal(libc::SIGTERM);
    let (code, _, stderr) = vmm.wait(T);
    assert_eq!(code, 0, "{stderr}");
}

#[test]
fn sigterm_during_a_slow_discard_ends_promptly_with_the_memory_freed() {
    if !kvm_or_skip("balloon_slow_sigterm") {
        return;
    }
    let _big = big_memory();
    let (mut vmm, _sock) = started_env(
        Guest::Firmware,
        "balloon-slow-sigterm",
        r#"{"vcpu_count": 1, "mem_size_mib": 256, "huge_pages": "None"}"#,
        r#"{"amount_mib": 0, "deflate_on_oom": false}"#,
        "touch=64 balloon bcheck-deflate then=idle",
        &[],
        &[SLOW_DISCARD],
    );
    // The inflate's discard waits its 2 s, the deflate waits for it.
    vmm.wait_line("balloon register reads took", T);
    let t = Instant::now();
    vmm.signal(libc::SIGTERM);
    let (code, stdout, stderr) = vmm.wait(T);
    let took = t.elapsed();
    assert_eq!(code, 0, "{stderr}");
    assert!(
        !stdout.iter().any(|l| l.contains("deflate took")),
        "the discard ended before the signal: {stdout:?}"
    );
    assert!(
        took < Duration::from_millis(1500),
        "exit took {took:?}: {stderr}"
    );
    // Reclaim freed the guest: no view of it was left with the pool.
    // The 64 MiB touched, less the MiB the balloon may have freed.
    assert!(summary(&stderr).0 >= 63, "{stderr}");
}

#[test]
fn hinting_is_refused_with_its_reason() {
    let (vmm, sock, _dir) = start_api("balloon-hinting", &[]);
    let (status, body) = put(
        &sock,
        "/balloon",
        r#"{"amount_mib": 0, "deflate_on_oom": false, "free_page_hinting": true}"#,
    );
    assert_fault(status, &body, 400, "free_page_reporting");
    for path in ["/balloon/hinting/start", "/balloon/hinting/stop"] {
        let (status, body) = patch(&sock, path, "{}");
        assert_fault(status, &body, 400, "hint");
    }
    let (status, body) =
        common::client::request(&sock, "GET", "/balloon/hinting/status", None).unwrap();
    assert_fault(status, &body, 400, "hint");
    // Nothing was configured: GET /balloon says so, and the VMM lives.
    let (status, _) = common::client::request(&sock, "GET", "/balloon", None).unwrap();
    assert_eq!(status, 400);
    assert_eq!(state(&sock), "Not started");
    drop(vmm);
}

fn a_guest_that_never_drives_the_balloon_still_shuts_down_with_reclaim(g: Guest) {
    if !kvm_or_skip("balloon_undriven") {
        return;
    }
    let _big = big_memory();
    let dir = temp_dir("balloon-undriven-metrics");
    let metrics = dir.join("metrics");
    let (mut vmm, sock) = started(
        g,
        "balloon-undriven",
        r#"{"vcpu_count": 2, "mem_size_mib": 1024, "huge_pages": "None"}"#,
        r#"{"amount_mib": 64, "deflate_on_oom": true, "stats_polling_interval_s": 1}"#,
        // No `balloon` word: the device is there, no driver ever acks.
        "touch=512 then=idle",
        &["--metrics-path", metrics.to_str().unwrap()],
    );
    vmm.wait_line("idle", T);
    let (status, body) = patch(&sock, "/balloon", r#"{"amount_mib": 512}"#);
    assert_eq!(status, 204, "{body}");
    let s = get(&sock, "/balloon/statistics");
    assert_eq!(s["target_mib"], 512, "{s}");
    assert_eq!(s["actual_mib"], 0, "{s}");
    assert!(s.get("total_memory").is_none(), "no guest counters: {s}");
    let (status, body) = action(&sock, r#"{"action_type": "FlushMetrics"}"#);
    assert_eq!(status, 204, "{body}");
    let text = std::fs::read_to_string(&metrics).unwrap();
    let last: Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    assert_eq!(last["balloon"]["inflate_count"], 0, "{last}");
    assert_eq!(last["balloon"]["activate_fails"], 0, "{last}");
    let (status, body) = action(&sock, r#"{"action_type": "Shutdown"}"#);
    assert_eq!(status, 200, "{body}");
    let reply = json(&body);
    assert_eq!(u(&reply, "address_bytes_done"), 1024 << 20, "{reply}");
    // 1 GiB on one node: the parallel threshold is met, both workers free.
    assert_eq!(u(&reply, "workers"), 2, "{reply}");
    assert!(u(&reply, "resident_bytes_freed") >= 500 << 20, "{reply}");
    let (code, _, stderr) = vmm.wait(T);
    assert_eq!(code, 0, "{stderr}");
}

both_guests!(
    inflate_by_patch_frees_the_pages_and_deflate_gives_them_back,
    reported_ranges_are_freed_in_both_nodes_slices_and_read_back_zero,
    statistics_come_from_the_guest_at_the_polling_interval,
    a_guest_that_never_drives_the_balloon_still_shuts_down_with_reclaim,
);
