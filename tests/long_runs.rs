//! Long runs: many launch–touch–shutdown cycles of a small microVM, one
//! after another and 8 at once, with no file descriptor, thread or child
//! process left behind in the long-lived parent (this test process), and
//! every teravm giving back what its guest touched: its resident size is
//! read while the guest idles, and its reclaim's summary must account for
//! the touched memory. Only teravm's own processes are measured, never the
//! host's MemAvailable, which any other program changes. Alone in its own
//! test binary, so that no other test opens files or threads meanwhile.
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

/// What one teravm process held and gave back.
#[derive(Debug, Clone, Copy)]
struct Cycle {
    /// MiB the firmware touched.
    touched_mib: u64,
    /// teravm's resident size while the guest idled, before the shutdown.
    rss_bytes: u64,
    /// MiB teravm's reclaim reported freed.
    freed_mib: u64,
}

/// Launches the microVM, waits until its firmware has touched its memory
/// and idles, reads teravm's resident size, then shuts it down (SIGTERM)
/// and reads what its reclaim freed.
fn one_cycle(cfg: &std::path::Path) -> Cycle {
    let mut vmm = Vmm::spawn(&["--config-file", cfg.to_str().unwrap(), "--no-api"]);
    let touched_mib = touched_mib(&vmm.wait_line("teravm firmware: touched ", T));
    vmm.wait_line("teravm firmware: idle", T);
    let rss_bytes = vmm.rss_bytes();
    vmm.signal(libc::SIGTERM);
    let (code, _, stderr) = vmm.wait(T);
    assert_eq!(code, 0, "{stderr}");
    let (freed_mib, _, _) = summary(&stderr);
    let cycle = Cycle {
        touched_mib,
        rss_bytes,
        freed_mib,
    };
    // The memory was teravm's, and its reclaim gave it back.
    assert!(touched_mib >= 16, "{cycle:?}");
    assert!(rss_bytes >= touched_mib << 20, "{cycle:?}");
    assert!(freed_mib * 10 >= touched_mib * 9, "{cycle:?}");
    cycle
}

/// The children of this process not yet reaped (none once every teravm has
/// been waited for).
fn children() -> Vec<String> {
    let mut out = Vec::new();
    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        if let Ok(text) = std::fs::read_to_string(task.path().join("children")) {
            out.extend(text.split_whitespace().map(str::to_string));
        }
    }
    out
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
    let cfg = config_file(&dir, &config_json(1, 128, "touch=16 then=idle", ""));
    // Warm up once, so lazily created things of the test process exist.
    let first = one_cycle(&cfg);
    let fds = count_dir("/proc/self/fd");
    let threads = count_dir("/proc/self/task");
    let start = Instant::now();
    let mut cycles_seen = Vec::with_capacity(cycles);
    for _ in 0..cycles {
        cycles_seen.push(one_cycle(&cfg));
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
            cycles_seen.push(w.join().unwrap());
        }
    }
    // The output readers of the last teravm end when its pipes close, a
    // moment after it was reaped: wait for that, with a deadline.
    let deadline = Instant::now() + Duration::from_secs(10);
    let (fds_after, threads_after) = loop {
        let now = (count_dir("/proc/self/fd"), count_dir("/proc/self/task"));
        if (now.0 <= fds && now.1 <= threads) || Instant::now() > deadline {
            break now;
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    let max_rss = cycles_seen.iter().map(|c| c.rss_bytes).max().unwrap_or(0);
    let freed: u64 = cycles_seen.iter().map(|c| c.freed_mib).sum();
    let touched: u64 = cycles_seen.iter().map(|c| c.touched_mib).sum();
    eprintln!(
        "long runs: {cycles} sequential cycles in {sequential:?}, {rounds} rounds of 8 at once; \
         fds {fds} -> {fds_after}, threads {threads} -> {threads_after}; \
         teravm resident before shutdown: first {} MiB, max {} MiB; \
         freed {freed} MiB of {touched} MiB touched",
        first.rss_bytes >> 20,
        max_rss >> 20
    );
    assert_eq!(fds_after, fds, "file descriptors leaked");
    assert!(
        threads_after <= threads,
        "threads leaked: {threads} -> {threads_after}"
    );
    assert!(children().is_empty(), "unreaped children: {:?}", children());
    // A teravm holds what its guest touched plus its own small footprint,
    // the same in every cycle: no cycle's process grows (64 MiB of slack
    // for 8 at once competing for the page cache of the binary).
    assert!(
        max_rss <= first.rss_bytes + (64 << 20),
        "a teravm held {} MiB before shutdown, the first {} MiB",
        max_rss >> 20,
        first.rss_bytes >> 20
    );
    let leftover: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
    assert_eq!(leftover.len(), 1, "files left behind: {leftover:?}");
}
