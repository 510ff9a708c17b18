//! Long runs: many launch–touch–shutdown cycles of a small microVM, one
//! after another and 8 at once, with no file descriptor, thread or memory
//! left behind in the long-lived parent (this test process). Alone in its
//! own test binary, so that no other test opens files or threads meanwhile.
//!
//! CI runs a reduced count (40 cycles); the full run is
//! `TERAVM_LONG_CYCLES=200 cargo test --release --test long_runs`.

mod common;

use std::time::{Duration, Instant};

use common::*;

const T: Duration = Duration::from_secs(180);

fn count_dir(path: &str) -> usize {
    std::fs::read_dir(path).map(|d| d.count()).unwrap_or(0)
}

fn mem_available_kib() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

fn one_cycle(cfg: &std::path::Path) {
    let (code, stdout, stderr) = run(&["--config-file", cfg.to_str().unwrap(), "--no-api"], T);
    assert_eq!(code, 0, "{stderr}");
    let (mib, _, _) = summary(&stderr);
    assert!(mib >= 14, "{stdout:?}");
}

#[test]
fn long_runs_leave_nothing_behind() {
    if !kvm_or_skip("long_runs") {
        return;
    }
    let _big = big_memory();
    let cycles: usize = std::env::var("TERAVM_LONG_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(40);
    let dir = temp_dir("long");
    let cfg = config_file(&dir, &config_json(1, 128, "touch=16 then=reset", ""));
    // Warm up once, so lazily created things of the test process exist.
    one_cycle(&cfg);
    let fds = count_dir("/proc/self/fd");
    let threads = count_dir("/proc/self/task");
    let avail = mem_available_kib();
    let start = Instant::now();
    for _ in 0..cycles {
        one_cycle(&cfg);
    }
    let sequential = start.elapsed();
    let rounds = (cycles / 25).max(1);
    for _ in 0..rounds {
        let workers: Vec<_> = (0..8)
            .map(|_| {
                let cfg = cfg.clone();
                std::thread::spawn(move || one_cycle(&cfg))
            })
            .collect();
        for w in workers {
            w.join().unwrap();
        }
    }
    std::thread::sleep(Duration::from_millis(200));
    let fds_after = count_dir("/proc/self/fd");
    let threads_after = count_dir("/proc/self/task");
    let avail_after = mem_available_kib();
    eprintln!(
        "long runs: {cycles} sequential cycles in {sequential:?}, {rounds} rounds of 8 at once; \
         fds {fds} -> {fds_after}, threads {threads} -> {threads_after}, \
         MemAvailable {} -> {} MiB",
        avail >> 10,
        avail_after >> 10
    );
    assert_eq!(fds_after, fds, "file descriptors leaked");
    assert!(
        threads_after <= threads,
        "threads leaked: {threads} -> {threads_after}"
    );
    // Tolerance: 256 MiB, for page cache and per-CPU free lists.
    assert!(
        avail_after + (256 << 10) >= avail,
        "MemAvailable fell by {} MiB",
        (avail - avail_after) >> 10
    );
    let leftover: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
    assert_eq!(leftover.len(), 1, "files left behind: {leftover:?}");
}
