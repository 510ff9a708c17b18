//! The live methods (`--live`): a running microVM's guest gives `--size-gib`
//! of its touched memory back through virtio-balloon free page reporting,
//! and teravm frees it while the guest runs:
//!
//! - `report-serial`: `reclaim.discard_workers_per_node` 0, what Firecracker
//!   does: the balloon thread frees each batch itself, one `madvise` (or
//!   hole punch) per reported range, then acknowledges it;
//! - `report-teravm-<w>`: teravm's per-node discard pool with `w` workers
//!   per node (ranges merged, cut into parts, freed by the node's workers).
//!
//! The firmware (`touch=<MiB> report=<MiB> balloon then=idle`) reports in
//! chains of up to 32 descriptors of at most 4 MiB, one chain in flight,
//! and times itself: `balloon report took <ms> ms` runs from its first
//! chain built to the last one used (acknowledged), which is what is timed
//! (its clock has a resolution of 1 ms; a run under it counts as 0.5 ms).
//! Each run is checked: the guest reads every reported page back as zero,
//! teravm's discard counters (`GET /balloon/statistics`) account for the
//! size, and teravm's resident size drops by it (sampled every
//! millisecond from start: the lowest after the peak, since memfd pages
//! the guest reads back are allocated again).
//! Beside the time, each run reads the CPU time of teravm's vCPU threads,
//! discard workers and balloon thread over the report ([`crate::cputime`]:
//! from the firmware's device line, right before its first chain, to its
//! `report took` line): a guest that waits for its acknowledgements asleep
//! (the wait port) leaves the cores to the workers.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::args::Args;
use crate::cputime::Ticks;
use crate::model::{backing_name, BenchError, Case, Live, Method, Pages};
use crate::vm::chunk_field;
use crate::vm::{spawn, vm_err};
use teravm_client::http::request;

/// The firmware's line with its reporting time.
pub const TOOK_PREFIX: &str = "teravm firmware: balloon report took ";
/// The firmware's line after its read-back.
pub const REPORTED_PREFIX: &str = "teravm firmware: balloon reported ";
/// The firmware's line right before its report starts.
const DEVICE_PREFIX: &str = "teravm firmware: balloon device at ";
/// The firmware's balloon errors.
const ERROR_PREFIX: &str = "teravm firmware: balloon error";
/// Guest RAM beyond what is reported (the firmware's own, below it).
const HEADROOM_MIB: u64 = 64;

/// The live methods of a round: serial first, then the pool at each count.
pub fn live_methods(workers: &[u32]) -> Vec<Method> {
    let mut out = vec![Method::ReportSerial];
    out.extend(workers.iter().map(|&w| Method::ReportTeravm(w)));
    out
}

/// The microVM's config: 2 vCPUs, `--size-gib` (plus headroom) populated,
/// touched and reported, a balloon with free page reporting, and
/// `discard_workers` per node (0: serial).
pub fn live_config(case: Case, args: &Args, discard_workers: u32, bind: bool) -> String {
    let huge_pages = match case.pages {
        Pages::FourK => "None",
        Pages::Thp => "Transparent",
    };
    let mib = args.size_gib << 10;
    format!(
        r#"{{"machine-config": {{"vcpu_count": 2, "mem_size_mib": {mem}, "huge_pages": "{huge_pages}"}},
  "boot-source": {{"boot_args": "touch={mib} report={mib} balloon then=idle"}},
  "memory": {{"backing": "{backing}", "numa_policy": "{policy}", "populate": true}},
  "balloon": {{"amount_mib": 0, "deflate_on_oom": false, "free_page_reporting": true}},
  "reclaim": {{"workers_per_node": {workers}, {chunk}"discard_workers_per_node": {discard_workers}}}}}"#,
        mem = mib + HEADROOM_MIB,
        backing = backing_name(case.backing),
        policy = if bind { "bind" } else { "none" },
        workers = discard_workers.max(1),
        chunk = chunk_field(args.chunk_mib),
    )
}

/// The milliseconds of the firmware's `balloon report took <ms> ms` line.
pub fn parse_took_ms(line: &str) -> Option<u64> {
    let at = line.find(TOOK_PREFIX)?;
    line[at + TOOK_PREFIX.len()..]
        .strip_suffix(" ms")?
        .trim()
        .parse()
        .ok()
}

/// The MiB of the firmware's `balloon reported <N> MiB, read back zero:
/// yes|no` line, and whether it read back zero.
pub fn parse_reported(line: &str) -> Option<(u64, bool)> {
    let at = line.find(REPORTED_PREFIX)?;
    let rest = &line[at + REPORTED_PREFIX.len()..];
    let (mib, rest) = rest.split_once(" MiB, read back zero: ")?;
    let zero = match rest.trim() {
        "yes" => true,
        "no" => false,
        _ => return None,
    };
    Some((mib.parse().ok()?, zero))
}

/// The resident pages of `/proc/<pid>/statm` (its second field), in bytes.
fn statm_rss_bytes(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/statm")).ok()?;
    let pages: u64 = text.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

/// The largest drop of a series of samples: (the peak before it, the low).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LargestDrop {
    peak: u64,
    low: u64,
    best_peak: u64,
    best_low: u64,
}

impl LargestDrop {
    /// Takes one sample.
    pub fn add(&mut self, v: u64) {
        if v > self.peak {
            self.peak = v;
            self.low = v;
        }
        self.low = self.low.min(v);
        if self.peak - self.low > self.best_peak - self.best_low || self.best_peak == 0 {
            self.best_peak = self.peak;
            self.best_low = self.low;
        }
    }

    /// (peak, low) of the largest drop seen.
    pub fn result(&self) -> (u64, u64) {
        (self.best_peak, self.best_low)
    }
}

/// Samples a process's resident size every millisecond until stopped.
struct Sampler {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<LargestDrop>>,
}

impl Sampler {
    fn start(pid: u32) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut drop = LargestDrop::default();
            while !flag.load(Ordering::Relaxed) {
                if let Some(v) = statm_rss_bytes(pid) {
                    drop.add(v);
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            drop
        });
        Sampler {
            stop,
            thread: Some(thread),
        }
    }

    fn finish(mut self) -> (u64, u64) {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or_default()
            .result()
    }
}

impl std::ops::Drop for Sampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// One timed run of a live method: seconds, and what was checked.
pub fn measure_live(
    method: Method,
    case: Case,
    args: &Args,
    teravm: &Path,
    bind: bool,
) -> Result<(f64, Live), BenchError> {
    let discard_workers = match method {
        Method::ReportSerial => 0,
        Method::ReportTeravm(w) => w,
        other => return Err(vm_err(format!("{other} is not a --live method"))),
    };
    let config = live_config(case, args, discard_workers, bind);
    let mut vm = spawn(teravm, &config, &args.sysfs_root, 5000)?;
    let pid = vm.child.id();
    let sampler = Sampler::start(pid);
    vm.wait_line_unless(DEVICE_PREFIX, &[ERROR_PREFIX])?;
    let ticks0 = Ticks::of(pid);
    let took = vm.wait_line_unless(TOOK_PREFIX, &[ERROR_PREFIX])?;
    let cpu = Ticks::of(pid).since(&ticks0);
    let took_ms = parse_took_ms(&took).ok_or_else(|| vm_err(format!("cannot read {took:?}")))?;
    let reported = vm.wait_line_unless(REPORTED_PREFIX, &[ERROR_PREFIX])?;
    let (sampled_peak, rss_after) = sampler.finish();
    let (mib, zero) =
        parse_reported(&reported).ok_or_else(|| vm_err(format!("cannot read {reported:?}")))?;
    let want_mib = args.size_gib << 10;
    if !zero || mib != want_mib {
        return Err(vm_err(format!(
            "{method}: the guest reported {mib} of {want_mib} MiB: {reported:?}"
        )));
    }
    let (status, body) = request(&vm.sock, "GET", "/balloon/statistics", None)
        .map_err(|e| vm_err(format!("GET /balloon/statistics: {e}")))?;
    if status != 200 {
        return Err(vm_err(format!("GET /balloon/statistics: {status} {body}")));
    }
    let stats: serde_json::Value =
        serde_json::from_str(&body).map_err(|e| vm_err(format!("GET /balloon/statistics: {e}")))?;
    let counter = |name: &str| stats["teravm"][name].as_u64().unwrap_or(0);
    let (discarded, rate) = (counter("discarded_bytes"), counter("discard_bytes_per_s"));
    let size = args.size_gib << 30;
    let rss_before = sampled_peak;
    // Nine tenths at least: the peak may come between two samples.
    let enough = |b: u64| b.saturating_mul(10) >= size.saturating_mul(9);
    if discarded < size || !enough(sampled_peak.saturating_sub(rss_after)) {
        return Err(vm_err(format!(
            "{method} {case}: teravm discarded {} MiB and its resident size went from {} to {} MiB \
             for {} MiB reported",
            discarded >> 20,
            sampled_peak >> 20,
            rss_after >> 20,
            size >> 20
        )));
    }
    let seconds = if took_ms == 0 {
        0.0005
    } else {
        took_ms as f64 / 1000.0
    };
    Ok((
        seconds,
        Live {
            discard_bytes_per_s: rate,
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
    use teravm::config::{Backing, VmConfig};

    #[test]
    fn the_live_config_is_valid_and_reports_the_size() {
        let args = Args::try_parse_from(["teravm-bench", "--size-gib", "2", "--live"]).unwrap();
        for (workers, pages, backing) in [
            (0, Pages::FourK, Backing::Anonymous),
            (2, Pages::Thp, Backing::Memfd),
        ] {
            let text = live_config(Case { pages, backing }, &args, workers, false);
            let c = VmConfig::from_json(&text, Path::new("bench")).unwrap();
            assert_eq!(c.machine_config.mem_size_mib, 2048 + HEADROOM_MIB);
            assert_eq!(c.reclaim.discard_workers(), workers);
            assert!(c.balloon.unwrap().free_page_reporting);
            assert_eq!(
                c.boot_source.boot_args,
                "touch=2048 report=2048 balloon then=idle"
            );
            assert_eq!(c.memory.backing, backing);
        }
    }

    #[test]
    fn firmware_lines_are_parsed() {
        assert_eq!(
            parse_took_ms("teravm firmware: balloon report took 427 ms"),
            Some(427)
        );
        assert_eq!(
            parse_took_ms("teravm firmware: balloon report took x ms"),
            None
        );
        assert_eq!(
            parse_reported("teravm firmware: balloon reported 1024 MiB, read back zero: yes"),
            Some((1024, true))
        );
        assert_eq!(
            parse_reported("teravm firmware: balloon reported 8 MiB, read back zero: no"),
            Some((8, false))
        );
        assert_eq!(parse_reported("teravm firmware: balloon reported"), None);
    }

    #[test]
    fn the_largest_drop_is_kept() {
        let mut d = LargestDrop::default();
        // Populate, report (drop), read back (memfd: up again), a blip.
        for v in [10, 500, 1000, 1000, 600, 50, 40, 300, 1000, 990] {
            d.add(v);
        }
        assert_eq!(d.result(), (1000, 40));
    }

    #[test]
    fn live_methods_start_with_serial() {
        assert_eq!(
            live_methods(&[1, 2]),
            [
                Method::ReportSerial,
                Method::ReportTeravm(1),
                Method::ReportTeravm(2)
            ]
        );
    }
}
