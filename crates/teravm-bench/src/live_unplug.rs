//! The live unplug methods (`--live`, issue 27): a running microVM's guest,
//! the firmware's virtio-mem driver (`mem`, firmware/mem.S), plugs and
//! touches `--size-gib` of hotplug memory; then the host sets
//! `requested_size_mib` to 0 and the clock runs until `GET /hotplug/memory`
//! says `plugged_size_mib` 0 and teravm's resident size has fallen by the
//! size:
//!
//! - `unplug-serial`: `reclaim.discard_workers_per_node` 0, what
//!   Firecracker does: the device's thread frees each UNPLUG (one `madvise`,
//!   or hole punch) before it answers the guest;
//! - `unplug-teravm-<w>`: teravm's per-node discard pool with `w` workers
//!   per node (each UNPLUG acknowledged at once and freed behind);
//! - `unplug-all-teravm-<w>`: the same pool, the guest sending one
//!   UNPLUG_ALL per device (`mem=unplug-all`) instead of UNPLUGs of 128 MiB.
//!
//! The clock starts before the `PATCH` and stops at the first poll that
//! sees both. The resident size is polled from `/proc/<pid>/statm` (a
//! counter read, cheap enough to poll every millisecond while two cores
//! free memory); `/proc/<pid>/smaps_rollup` (a walk of every page table)
//! gives the figures kept, read once before the `PATCH` and once after the
//! clock stopped. The clock stops once the resident size has fallen by the
//! size less a slack of 1/64 (16 MiB at least). Each run is checked: the
//! firmware's plug and unplug lines, and the per-node discard counters
//! (`nodes[].discarded_bytes`) account for the size.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::args::Args;
use crate::model::{backing_name, BenchError, Case, Live, Method, Pages};
use crate::vm::{spawn, vm_err, RunningVm};
use teravm_client::http::request;

/// The firmware's line once it has plugged (and touched) the size.
pub const PLUGGED_PREFIX: &str = "teravm firmware: mem plugged ";
/// The firmware's line once it has unplugged it.
pub const UNPLUGGED_PREFIX: &str = "teravm firmware: mem unplugged ";
/// The firmware's lines when its driver stops.
const FAIL: [&str; 2] = ["teravm firmware: mem error", "teravm firmware: mem dirty"];
/// Guest RAM: the firmware's own (the hotplug region is the size).
const RAM_MIB: u64 = 128;
/// The most the clock runs before the run is an error.
const UNPLUG_TIMEOUT: Duration = Duration::from_secs(120);
/// How long after the clock stopped the discard counters may take to say
/// the size.
const COUNTED_WITHIN: Duration = Duration::from_secs(30);

/// The unplug methods of a round: serial first, then the pool at each
/// count, then UNPLUG_ALL at each count.
pub fn unplug_methods(workers: &[u32]) -> Vec<Method> {
    let mut out = vec![Method::UnplugSerial];
    out.extend(workers.iter().map(|&w| Method::UnplugTeravm(w)));
    out.extend(workers.iter().map(|&w| Method::UnplugAllTeravm(w)));
    out
}

/// The microVM's config: 2 vCPUs, RAM_MIB of RAM, a hotplug region of
/// `--size-gib` (default block and slot sizes), the firmware's `mem`
/// driver (`mem=unplug-all` for `unplug_all`) and `discard_workers` per
/// node (0: serial).
pub fn unplug_config(
    case: Case,
    args: &Args,
    discard_workers: u32,
    unplug_all: bool,
    bind: bool,
) -> String {
    let huge_pages = match case.pages {
        Pages::FourK => "None",
        Pages::Thp => "Transparent",
    };
    let word = if unplug_all { "mem=unplug-all" } else { "mem" };
    format!(
        r#"{{"machine-config": {{"vcpu_count": 2, "mem_size_mib": {RAM_MIB}, "huge_pages": "{huge_pages}"}},
  "boot-source": {{"boot_args": "{word} then=idle"}},
  "memory": {{"backing": "{backing}", "numa_policy": "{policy}"}},
  "memory-hotplug": {{"total_size_mib": {total}}},
  "reclaim": {{"workers_per_node": {workers}, "discard_workers_per_node": {discard_workers}}}}}"#,
        total = args.size_gib << 10,
        backing = backing_name(case.backing),
        policy = if bind { "bind" } else { "none" },
        workers = discard_workers.max(1),
    )
}

/// The N and T of `teravm firmware: mem plugged|unplugged <N> MiB (<T> MiB
/// plugged)` after `prefix`.
pub fn parse_round(line: &str, prefix: &str) -> Option<(u64, u64)> {
    let at = line.find(prefix)?;
    let (n, rest) = line[at + prefix.len()..].split_once(" MiB (")?;
    let t = rest.strip_suffix(" MiB plugged)")?;
    Some((n.trim().parse().ok()?, t.trim().parse().ok()?))
}

/// The `Rss:` of `/proc/<pid>/smaps_rollup`, in bytes.
fn rollup_rss_bytes(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
    let kib: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("Rss:"))?
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse()
        .ok()?;
    Some(kib << 10)
}

/// The resident pages of `/proc/<pid>/statm` (its second field), in bytes.
fn statm_rss_bytes(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/statm")).ok()?;
    let pages: u64 = text.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

/// `GET /hotplug/memory`.
fn hotplug_status(vm: &RunningVm) -> Result<serde_json::Value, BenchError> {
    let (status, body) = request(&vm.sock, "GET", "/hotplug/memory", None)
        .map_err(|e| vm_err(format!("GET /hotplug/memory: {e}")))?;
    if status != 200 {
        return Err(vm_err(format!("GET /hotplug/memory: {status} {body}")));
    }
    serde_json::from_str(&body).map_err(|e| vm_err(format!("GET /hotplug/memory: {e}")))
}

/// `PATCH /hotplug/memory` with `requested_size_mib`.
fn request_mib(vm: &RunningVm, mib: u64) -> Result<(), BenchError> {
    let body = format!(r#"{{"requested_size_mib": {mib}}}"#);
    let (status, reply) = request(&vm.sock, "PATCH", "/hotplug/memory", Some(&body))
        .map_err(|e| vm_err(format!("PATCH /hotplug/memory: {e}")))?;
    if status != 204 {
        return Err(vm_err(format!(
            "PATCH /hotplug/memory {body}: {status} {reply}"
        )));
    }
    Ok(())
}

/// The bytes the per-node discard workers freed, all nodes.
fn discarded_bytes(status: &serde_json::Value) -> u64 {
    status["nodes"]
        .as_array()
        .map(|nodes| {
            nodes
                .iter()
                .filter_map(|n| n["discarded_bytes"].as_u64())
                .sum()
        })
        .unwrap_or(0)
}

/// One timed run of an unplug method: seconds, and what was checked.
pub fn measure_unplug(
    method: Method,
    case: Case,
    args: &Args,
    teravm: &Path,
    bind: bool,
) -> Result<(f64, Live), BenchError> {
    let (discard_workers, unplug_all) = match method {
        Method::UnplugSerial => (0, false),
        Method::UnplugTeravm(w) => (w, false),
        Method::UnplugAllTeravm(w) => (w, true),
        other => return Err(vm_err(format!("{other} is not an unplug method"))),
    };
    let config = unplug_config(case, args, discard_workers, unplug_all, bind);
    let mut vm = spawn(teravm, &config, &args.sysfs_root, 5000)?;
    vm.wait_line_unless("teravm firmware: idle", &FAIL)?;
    let mib = args.size_gib << 10;
    let size = args.size_gib << 30;
    request_mib(&vm, mib)?;
    let line = vm.wait_line_unless(PLUGGED_PREFIX, &FAIL)?;
    if parse_round(&line, PLUGGED_PREFIX) != Some((mib, mib)) {
        return Err(vm_err(format!("{method}: asked for {mib} MiB: {line:?}")));
    }
    let pid = vm.child.id();
    let rss_before = rollup_rss_bytes(pid).unwrap_or(0);
    let discarded_before = discarded_bytes(&hotplug_status(&vm)?);
    // All of it, but for a slack of 1/64 (16 MiB at least): the guest's
    // RAM and teravm's own pages move a little meanwhile.
    let low_enough = rss_before.saturating_sub(size) + (size / 64).max(16 << 20);

    let ticks0 = crate::cputime::Ticks::of(pid);
    let t0 = Instant::now();
    request_mib(&vm, 0)?;
    let mut unplugged = false;
    let end = loop {
        if !unplugged {
            unplugged = hotplug_status(&vm)?["plugged_size_mib"].as_u64() == Some(0);
        }
        if unplugged && statm_rss_bytes(pid).unwrap_or(u64::MAX) <= low_enough {
            break Instant::now();
        }
        if t0.elapsed() > UNPLUG_TIMEOUT {
            return Err(vm_err(format!(
                "{method} {case}: after {UNPLUG_TIMEOUT:?} plugged_size_mib is 0: {unplugged}, \
                 RSS {} MiB, from {} MiB",
                statm_rss_bytes(pid).unwrap_or(0) >> 20,
                rss_before >> 20
            )));
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    let seconds = end.duration_since(t0).as_secs_f64();
    let cpu = crate::cputime::Ticks::of(pid).since(&ticks0);
    let rss_after = rollup_rss_bytes(pid).unwrap_or(0);
    let line = vm.wait_line_unless(UNPLUGGED_PREFIX, &FAIL)?;
    if parse_round(&line, UNPLUGGED_PREFIX) != Some((mib, 0)) {
        return Err(vm_err(format!("{method}: unplugged {mib} MiB: {line:?}")));
    }
    // The counters follow the last parts freed (not timed: the RSS said).
    let counted = Instant::now();
    let discarded = loop {
        let d = discarded_bytes(&hotplug_status(&vm)?).saturating_sub(discarded_before);
        if d >= size {
            break d;
        }
        if counted.elapsed() > COUNTED_WITHIN {
            return Err(vm_err(format!(
                "{method} {case}: the discard workers counted {} MiB of {} MiB unplugged",
                d >> 20,
                size >> 20
            )));
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    Ok((
        seconds,
        Live {
            // Over the clock's run: the pool's busy time is not in the
            // hotplug status.
            discard_bytes_per_s: (size as f64 / seconds.max(1e-6)) as u64,
            discarded_bytes: discarded,
            rss_before_bytes: rss_before,
            rss_after_bytes: rss_after,
            cpu,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[test]
    fn the_unplug_config_names_the_region_and_the_word() {
        let args = Args::try_parse_from(["teravm-bench", "--size-gib", "2", "--live"]).unwrap();
        let case = Case {
            pages: Pages::FourK,
            backing: teravm::config::Backing::Anonymous,
        };
        let text = unplug_config(case, &args, 0, false, false);
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["memory-hotplug"]["total_size_mib"], 2048);
        assert_eq!(v["boot-source"]["boot_args"], "mem then=idle");
        assert_eq!(v["reclaim"]["discard_workers_per_node"], 0);
        let text = unplug_config(case, &args, 2, true, false);
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["boot-source"]["boot_args"], "mem=unplug-all then=idle");
        assert_eq!(v["reclaim"]["discard_workers_per_node"], 2);
    }

    #[test]
    fn round_lines_are_parsed() {
        assert_eq!(
            parse_round(
                "teravm firmware: mem plugged 2048 MiB (2048 MiB plugged)",
                PLUGGED_PREFIX
            ),
            Some((2048, 2048))
        );
        assert_eq!(
            parse_round(
                "teravm firmware: mem unplugged 2048 MiB (0 MiB plugged)",
                UNPLUGGED_PREFIX
            ),
            Some((2048, 0))
        );
        assert_eq!(
            parse_round("teravm firmware: mem plugged 2048 MiB", PLUGGED_PREFIX),
            None
        );
    }

    #[test]
    fn unplug_methods_start_with_serial() {
        assert_eq!(
            unplug_methods(&[2]),
            [
                Method::UnplugSerial,
                Method::UnplugTeravm(2),
                Method::UnplugAllTeravm(2)
            ]
        );
        assert_eq!(
            Method::UnplugAllTeravm(2).to_string(),
            "unplug-all-teravm-2"
        );
        assert_eq!(Method::UnplugSerial.workers(), 0);
        assert!(Method::UnplugTeravm(1).is_live());
    }

    #[test]
    fn discarded_bytes_add_up_over_the_nodes() {
        let v = serde_json::json!({"nodes": [{"discarded_bytes": 3}, {"discarded_bytes": 4}]});
        assert_eq!(discarded_bytes(&v), 7);
        assert_eq!(discarded_bytes(&serde_json::json!({})), 0);
    }
}
