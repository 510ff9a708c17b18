//! Long runs: many launch–touch–shutdown cycles of a small microVM, one
//! after another and 8 at once, each teravm giving back everything it took
//! for its microVM: the file descriptors and threads of the teravm process
//! itself (`/proc/<pid>/fd`, `/proc/<pid>/task`), counted before the start
//! and again once its sync shutdown is done (the process lingers, so it
//! can be looked at), must be the same; and the memory its guest touched:
//! its resident size is read while the guest idles, and its reclaim's
//! summary must account for the touched memory. Only teravm's own
//! processes are measured, never the host's MemAvailable, which any other
//! program changes. The test process must be left with no unreaped child.
//!
//! CI runs a reduced count (40 cycles); the full run is
//! `TERAVM_LONG_CYCLES=200 cargo test --release --test long_runs`.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::api::{json, u};
use common::client::Connection;
use common::*;

const T: Duration = Duration::from_secs(180);

/// The number of entries of `/proc/<pid>/<what>` (`fd` or `task`).
fn count(pid: u32, what: &str) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/{what}"))
        .unwrap_or_else(|e| panic!("/proc/{pid}/{what}: {e}"))
        .count()
}

/// teravm's own (file descriptors, threads).
fn held(pid: u32) -> (usize, usize) {
    (count(pid, "fd"), count(pid, "task"))
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
    /// teravm's (fds, threads) configured, before `InstanceStart`.
    before: (usize, usize),
    /// The same while the guest idled.
    running: (usize, usize),
    /// The same once the sync shutdown had answered and teravm settled.
    after: (usize, usize),
}

/// `request` on `conn`, expecting `status`; returns the body.
fn call(conn: &mut Connection, method: &str, path: &str, body: &str, status: u16) -> String {
    let (s, b) = conn.request(method, path, Some(body)).unwrap();
    assert_eq!(s, status, "{method} {path} {body}: {b}");
    b
}

/// Launches the microVM over the API (one connection for the whole
/// cycle, so that exactly one connection thread is there throughout),
/// counts teravm's fds and threads, waits until its firmware has touched
/// its memory and idles, reads teravm's resident size and counts again,
/// shuts it down (sync), waits until teravm holds no more than before the
/// start, then ends the linger with SIGTERM and reads what its reclaim
/// freed.
fn one_cycle(dir: &Path, i: usize) -> Cycle {
    let sock = dir.join(format!("api-{i}.sock"));
    let mut vmm = Vmm::spawn(&[
        "--api-sock",
        sock.to_str().unwrap(),
        "--linger-ms",
        "600000",
    ]);
    let pid = vmm.child.id();
    // Not `wait_for_api`: its connection's thread could still be ending
    // when the counts are taken.
    let deadline = Instant::now() + T;
    let mut conn = loop {
        match Connection::open(&sock) {
            Ok(c) => break c,
            Err(e) => assert!(Instant::now() < deadline, "no API on {sock:?}: {e}"),
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    call(
        &mut conn,
        "PUT",
        "/machine-config",
        r#"{"vcpu_count": 1, "mem_size_mib": 128}"#,
        204,
    );
    call(
        &mut conn,
        "PUT",
        "/boot-source",
        r#"{"boot_args": "touch=16 then=idle"}"#,
        204,
    );
    let before = held(pid);
    call(
        &mut conn,
        "PUT",
        "/actions",
        r#"{"action_type": "InstanceStart"}"#,
        204,
    );
    let touched_mib = touched_mib(&vmm.wait_line("teravm firmware: touched ", T));
    vmm.wait_line("teravm firmware: idle", T);
    let rss_bytes = vmm.rss_bytes();
    let running = held(pid);
    let report = json(&call(
        &mut conn,
        "PUT",
        "/actions",
        r#"{"action_type": "Shutdown", "reclaim": "sync"}"#,
        200,
    ));
    assert_eq!(report["state"], "done", "{report}");
    // The reply comes once memory is back; the reclaim job's own thread
    // may still be ending: wait for teravm to settle, with a deadline.
    let deadline = Instant::now() + Duration::from_secs(10);
    let after = loop {
        let now = held(pid);
        if (now.0 <= before.0 && now.1 <= before.1) || Instant::now() > deadline {
            break now;
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    drop(conn);
    vmm.signal(libc::SIGTERM);
    let (code, _, stderr) = vmm.wait(T);
    assert_eq!(code, 0, "{stderr}");
    let (freed_mib, _, _) = summary(&stderr);
    let cycle = Cycle {
        touched_mib,
        rss_bytes,
        freed_mib,
        before,
        running,
        after,
    };
    // The memory was teravm's, and its reclaim gave it back.
    assert!(touched_mib >= 16, "{cycle:?}");
    assert!(rss_bytes >= touched_mib << 20, "{cycle:?}");
    assert!(freed_mib * 10 >= touched_mib * 9, "{cycle:?}");
    assert_eq!(
        freed_mib,
        u(&report, "resident_bytes_freed") >> 20,
        "{cycle:?}"
    );
    // The counts see the microVM (its vCPU thread, the VM's descriptors),
    // and the shutdown gave all of them back.
    assert!(running.0 > before.0 && running.1 > before.1, "{cycle:?}");
    assert_eq!(
        after.0, before.0,
        "teravm leaked file descriptors: {cycle:?}"
    );
    assert_eq!(after.1, before.1, "teravm leaked threads: {cycle:?}");
    assert!(!sock.exists(), "the socket outlived teravm");
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
    let first = one_cycle(&dir, 0);
    let start = Instant::now();
    let mut cycles_seen = Vec::with_capacity(cycles);
    for i in 0..cycles {
        cycles_seen.push(one_cycle(&dir, 1 + i));
    }
    let sequential = start.elapsed();
    let rounds = (cycles / 25).max(1);
    for r in 0..rounds {
        let workers: Vec<_> = (0..8)
            .map(|w| {
                let dir = dir.clone();
                std::thread::spawn(move || one_cycle(&dir, 1 + cycles + r * 8 + w))
            })
            .collect();
        for w in workers {
            cycles_seen.push(w.join().unwrap());
        }
    }
    let max_rss = cycles_seen.iter().map(|c| c.rss_bytes).max().unwrap_or(0);
    let freed: u64 = cycles_seen.iter().map(|c| c.freed_mib).sum();
    let touched: u64 = cycles_seen.iter().map(|c| c.touched_mib).sum();
    eprintln!(
        "long runs: {cycles} sequential cycles in {sequential:?}, {rounds} rounds of 8 at once; \
         teravm (fds, threads): {:?} configured, {:?} running, {:?} after shutdown; \
         teravm resident before shutdown: first {} MiB, max {} MiB; \
         freed {freed} MiB of {touched} MiB touched",
        first.before,
        first.running,
        first.after,
        first.rss_bytes >> 20,
        max_rss >> 20
    );
    // Every teravm holds the same, configured and running: none depends on
    // what the ones before it did.
    for c in &cycles_seen {
        assert_eq!(
            (c.before, c.running),
            (first.before, first.running),
            "{c:?}"
        );
    }
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
    assert!(leftover.is_empty(), "files left behind: {leftover:?}");
}
