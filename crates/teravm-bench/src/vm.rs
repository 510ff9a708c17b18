//! The end-to-end methods (`--vm`): a real teravm microVM whose firmware
//! dirtied all of its `--size-gib`, then
//!
//! - killed with `SIGKILL` (`vm-kill`: what a Firecracker user gets today) or
//!   killed and reaped with `process_mrelease` (`vm-mrelease`), timed until
//!   `waitpid` returns;
//! - shut down through the API with `"reclaim": "sync"` (`vm-teravm-<w>`),
//!   timed from the request until teravm's reply, once its reclaim is done;
//!   the reply is checked (state `done`, resident bytes freed ≥ 90% of what
//!   was touched), and so is teravm's own resident size while it lingers;
//!   the reply's `phases` (when teravm reports them) are kept;
//! - shut down with `"reclaim": "async"` (`vm-async-<w>`), timed from the
//!   request until the process is gone (`waitpid`, teravm started with
//!   `--linger-ms 0`); the reply's latency (request sent → 202 received) is
//!   kept apart, and teravm's summary line (stderr, or stdout before teravm
//!   moved it) must account for the memory touched;
//! - `--peers`' teravm row beside the peer VMMs (`vm-prealloc-teravm-<w>`):
//!   all RAM populated before boot and the firmware touching nothing
//!   (`touch=0`), as a peer whose RAM is preallocated and whose guest never
//!   ran, teravm started with `--no-api`; its resident size must cover the
//!   RAM; then `SIGTERM` (teravm reclaims with `w` workers per node and
//!   exits), timed until `waitpid`, the summary line accounting for the RAM.
//!
//! Guest memory is populated before boot (untimed, and far faster than the
//! guest's own first touches on a host whose KVM is paging-based), then the
//! firmware writes every page of it. The guest console (stdout) and teravm's
//! own lines (stderr) are read by one thread each into one channel.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::time::{Duration, Instant};

use crate::args::Args;
use crate::model::{backing_name, BenchError, Case, Method, Pages, Phases, Resident, PHASE_NAMES};
pub use crate::mrelease::EXIT_TIMEOUT;
use crate::mrelease::{kill_and_reap, PidFd, Reap};
use crate::resident::{covers, resident_of};
use teravm_client::host::{
    find_summary, parse_touched_mib, rss_bytes, SUMMARY_PREFIX, TOUCHED_PREFIX,
};
use teravm_client::http::{request, Connection};

/// Longest wait for a microVM to boot and touch its memory.
const BOOT_TIMEOUT: Duration = Duration::from_secs(900);

/// A `--vm` (or `--live`) run's error.
pub fn vm_err(what: impl Into<String>) -> BenchError {
    BenchError::Vm(what.into())
}

/// The teravm binary beside the bench binary; `/dev/kvm` must be usable.
pub fn teravm_binary() -> Result<PathBuf, BenchError> {
    let exe = std::env::current_exe()
        .map_err(|e| vm_err(format!("cannot find the bench binary: {e}")))?;
    let teravm = exe.with_file_name("teravm");
    if !teravm.is_file() {
        return Err(BenchError::VmUnavailable(format!(
            "--vm and --live need the teravm binary at {} (build it with cargo build --release)",
            teravm.display()
        )));
    }
    teravm::vstate::vm::Vm::available()
        .map_err(|e| BenchError::VmUnavailable(format!("--vm and --live need /dev/kvm: {e}")))?;
    Ok(teravm)
}

/// The microVM's config: 2 vCPUs, all memory touched, then idle.
pub fn vm_config(case: Case, args: &Args, workers: u32, bind: bool) -> String {
    config_booting(case, args, workers, bind, "touch=all then=idle")
}

/// The config of `vm-prealloc-teravm-<w>`: the same, but the firmware
/// touches nothing (all memory is populated before boot all the same).
pub fn prealloc_config(case: Case, args: &Args, workers: u32, bind: bool) -> String {
    config_booting(case, args, workers, bind, "touch=0 then=idle")
}

/// The microVM's config with the firmware's `boot_args`.
/// The config's `"chunk_mib": N, ` when `--chunk-mib` was given; nothing
/// (teravm's default) otherwise.
pub fn chunk_field(chunk_mib: Option<u64>) -> String {
    chunk_mib.map_or(String::new(), |c| format!(r#""chunk_mib": {c}, "#))
}

fn config_booting(case: Case, args: &Args, workers: u32, bind: bool, boot_args: &str) -> String {
    let huge_pages = match case.pages {
        Pages::FourK => "None",
        Pages::Thp => "Transparent",
    };
    format!(
        r#"{{"machine-config": {{"vcpu_count": 2, "mem_size_mib": {mib}, "huge_pages": "{huge_pages}"}},
  "boot-source": {{"boot_args": "{boot_args}"}},
  "memory": {{"backing": "{backing}", "numa_policy": "{policy}", "populate": true}},
  "reclaim": {{"workers_per_node": {workers}, {chunk}"parallel_threshold_mib": 0, "steal": true}}}}"#,
        mib = args.size_gib << 10,
        backing = backing_name(case.backing),
        policy = if bind { "bind" } else { "none" },
        chunk = chunk_field(args.chunk_mib),
    )
}

/// Which of teravm's streams a line came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stream {
    /// The guest console.
    Stdout,
    /// teravm's own lines.
    Stderr,
}

/// A teravm process the bench started, its guest console and own lines.
pub struct RunningVm {
    /// The process.
    pub child: Child,
    /// Its API socket.
    pub sock: PathBuf,
    dir: PathBuf,
    lines: Receiver<(Stream, String)>,
    /// Every line seen so far, in order.
    seen: Vec<(Stream, String)>,
}

/// Whether a line of teravm's stderr is shown on the bench's stderr too:
/// its warnings and errors, not its summary nor its info lines (teravm runs
/// at level info so that the populate's time can be read).
fn shown(line: &str) -> bool {
    let level = line
        .strip_prefix('[')
        .and_then(|l| l.split_once(']'))
        .and_then(|(head, _)| head.split_whitespace().nth(1));
    !line.contains(SUMMARY_PREFIX) && !matches!(level, Some("INFO" | "DEBUG" | "TRACE"))
}

/// Reads `from` line by line into `tx`; teravm's own warnings and errors
/// are shown on the bench's stderr too ([`shown`]).
fn forward(from: impl Read + Send + 'static, stream: Stream, tx: Sender<(Stream, String)>) {
    std::thread::spawn(move || {
        for line in BufReader::new(from).lines().map_while(Result::ok) {
            if stream == Stream::Stderr && shown(&line) {
                eprintln!("{line}");
            }
            if tx.send((stream, line)).is_err() {
                break;
            }
        }
    });
}

impl RunningVm {
    /// Waits for a guest console line that starts with `prefix`.
    fn wait_line(&mut self, prefix: &str) -> Result<String, BenchError> {
        self.wait_line_unless(prefix, &[])
    }

    /// Waits for a guest console line that starts with `prefix`; a line
    /// that starts with one of `fail` first is an error (the firmware said
    /// something went wrong).
    pub fn wait_line_unless(&mut self, prefix: &str, fail: &[&str]) -> Result<String, BenchError> {
        let deadline = Instant::now() + BOOT_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok((stream, line)) => {
                    self.seen.push((stream, line.clone()));
                    if stream == Stream::Stdout && line.starts_with(prefix) {
                        return Ok(line);
                    }
                    if stream == Stream::Stdout && fail.iter().any(|f| line.starts_with(f)) {
                        return Err(vm_err(format!("the microVM said {line:?}")));
                    }
                }
                Err(_) => return Err(vm_err(format!("the microVM never printed {prefix:?}"))),
            }
        }
    }

    /// Waits up to `timeout` for the process to exit (its pidfd becomes
    /// readable), then reaps it; the moment `waitpid` returned. It must
    /// exit with status 0.
    pub fn wait_exit(&mut self, pidfd: &PidFd, timeout: Duration) -> Result<Instant, BenchError> {
        match pidfd.exited_within(timeout) {
            Ok(true) => {}
            Ok(false) => {
                return Err(vm_err(format!(
                    "teravm did not exit within {timeout:?} after it was stopped"
                )))
            }
            Err(e) => return Err(vm_err(format!("poll: {e}"))),
        }
        let status = self
            .child
            .wait()
            .map_err(|e| vm_err(format!("waitpid: {e}")))?;
        let end = Instant::now();
        if !status.success() {
            return Err(vm_err(format!("teravm ended with {status}")));
        }
        Ok(end)
    }

    /// The lines still to come, once the process is gone (its pipes close).
    pub fn drain(&mut self) {
        while let Ok(line) = self.lines.recv_timeout(Duration::from_secs(5)) {
            self.seen.push(line);
        }
    }

    /// Every line seen so far, both streams, in order.
    pub fn seen_lines(&self) -> impl Iterator<Item = &str> {
        self.seen.iter().map(|(_, l)| l.as_str())
    }
}

impl Drop for RunningVm {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Starts a microVM and waits until its firmware has touched all its memory.
/// Returns it and the MiB the firmware touched.
fn boot(
    teravm: &Path,
    config: &str,
    sysfs_root: &Path,
    linger_ms: u64,
) -> Result<(RunningVm, u64), BenchError> {
    let mut vm = spawn(teravm, config, sysfs_root, linger_ms)?;
    // A config file starts the microVM at once (as in Firecracker): no
    // InstanceStart; the firmware's lines say when it has dirtied its RAM.
    let touched = vm.wait_line(TOUCHED_PREFIX)?;
    let mib =
        parse_touched_mib(&touched).ok_or_else(|| vm_err(format!("cannot read {touched:?}")))?;
    vm.wait_line("teravm firmware: idle")?;
    Ok((vm, mib))
}

/// Starts teravm with `config` as its config file (so the microVM starts
/// at once) and waits until its API socket answers.
pub fn spawn(
    teravm: &Path,
    config: &str,
    sysfs_root: &Path,
    linger_ms: u64,
) -> Result<RunningVm, BenchError> {
    launch(teravm, config, sysfs_root, Some(linger_ms))
}

/// Starts teravm with `config` as its config file: with an API socket
/// (lingering `linger_ms` after an API shutdown), waiting until it answers;
/// or, for `None`, with `--no-api` (stopped by a signal).
pub fn launch(
    teravm: &Path,
    config: &str,
    sysfs_root: &Path,
    linger_ms: Option<u64>,
) -> Result<RunningVm, BenchError> {
    let dir = std::env::temp_dir().join(format!("teravm-bench-vm-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| vm_err(format!("{}: {e}", dir.display())))?;
    let cfg = dir.join("vm.json");
    std::fs::write(&cfg, config).map_err(|e| vm_err(format!("{}: {e}", cfg.display())))?;
    let sock = dir.join("api.sock");
    let mut command = Command::new(teravm);
    match linger_ms {
        Some(ms) => command
            .arg("--api-sock")
            .arg(&sock)
            .args(["--linger-ms", &ms.to_string()]),
        None => command.arg("--no-api"),
    };
    // Info lines too: the populate's time is read from them.
    command.args(["--level", "Info"]);
    let mut child = command
        .arg("--config-file")
        .arg(&cfg)
        .arg("--sysfs-root")
        .arg(sysfs_root)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| vm_err(format!("cannot run {}: {e}", teravm.display())))?;
    let (tx, lines) = channel();
    if let Some(out) = child.stdout.take() {
        forward(out, Stream::Stdout, tx.clone());
    }
    if let Some(err) = child.stderr.take() {
        forward(err, Stream::Stderr, tx);
    }
    let vm = RunningVm {
        child,
        sock,
        dir,
        lines,
        seen: Vec::new(),
    };
    if linger_ms.is_none() {
        return Ok(vm);
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while request(&vm.sock, "GET", "/", None).is_err() {
        if Instant::now() > deadline {
            return Err(vm_err("the API socket never answered"));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(vm)
}

/// One timed run of a `--vm` method.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct VmRun {
    /// Seconds the method took.
    pub seconds: f64,
    /// `vm-async`: the reply's latency, milliseconds.
    pub reply_ms: Option<f64>,
    /// `vm-teravm`: the phases of the shutdown, from the reply.
    pub phases: Phases,
    /// `vm-prealloc-teravm`: what teravm held when the clock started.
    pub resident: Option<Resident>,
    /// How long teravm's populate of guest RAM took (its per-node workers,
    /// before boot), milliseconds, from its log line.
    pub populate_ms: Option<f64>,
    /// `vm-guest-*`: the MiB the test guest said it touched.
    pub touched_mib: Option<u64>,
}

/// The populate time in teravm's log (`… populated <n> MiB in <ms> ms with
/// <w> workers`, at level info), milliseconds.
pub fn populate_ms_of<'a>(lines: impl IntoIterator<Item = &'a str>) -> Option<f64> {
    lines.into_iter().find_map(|line| {
        let rest = line.split_once("] populated ")?.1;
        let words: Vec<&str> = rest.split_whitespace().collect();
        match words.as_slice() {
            [_, "MiB", "in", ms, "ms", ..] => ms.parse().ok(),
            _ => None,
        }
    })
}

/// The phases in a sync `Shutdown` reply, where it has them.
pub fn phases_of(reply: &serde_json::Value) -> Phases {
    PHASE_NAMES.map(|name| reply["phases"][name].as_f64())
}

/// Whether `freed_bytes` accounts for the `touched_mib` the firmware dirtied
/// (at least 90% of it).
pub fn accounts_for(freed_bytes: u64, touched_mib: u64) -> bool {
    freed_bytes.saturating_mul(10) >= (touched_mib << 20).saturating_mul(9)
}

/// One timed run of a `--vm` method.
pub fn measure_vm(
    method: Method,
    case: Case,
    args: &Args,
    teravm: &Path,
    bind: bool,
) -> Result<VmRun, BenchError> {
    // An async shutdown is timed until the process is gone: no lingering.
    let linger_ms = if matches!(method, Method::VmAsync(_)) {
        0
    } else {
        5000
    };
    let config = vm_config(case, args, method.workers(), bind);
    let (mut vm, touched_mib) = boot(teravm, &config, &args.sysfs_root, linger_ms)?;
    let populate_ms = populate_ms_of(vm.seen.iter().map(|(_, l)| l.as_str()));
    let plain = |seconds: f64| VmRun {
        seconds,
        reply_ms: None,
        phases: [None; 4],
        resident: None,
        populate_ms,
        touched_mib: None,
    };
    match method {
        Method::VmKill => Ok(plain(
            kill_and_reap(&mut vm.child, Reap::Wait)?.as_secs_f64(),
        )),
        Method::VmMrelease => Ok(plain(
            kill_and_reap(&mut vm.child, Reap::Mrelease)?.as_secs_f64(),
        )),
        Method::VmShutdown(_) => {
            let body = r#"{"action_type": "Shutdown", "reclaim": "sync"}"#;
            let mut conn =
                Connection::open(&vm.sock).map_err(|e| vm_err(format!("connect: {e}")))?;
            let start = Instant::now();
            let (status, reply) = conn
                .request("PUT", "/actions", Some(body))
                .map_err(|e| vm_err(format!("Shutdown: {e}")))?;
            let seconds = start.elapsed().as_secs_f64();
            if status != 200 {
                return Err(vm_err(format!("Shutdown: {status} {reply}")));
            }
            let report: serde_json::Value =
                serde_json::from_str(&reply).map_err(|e| vm_err(format!("Shutdown reply: {e}")))?;
            let freed = report["resident_bytes_freed"].as_u64().unwrap_or(0);
            if report["state"] != "done" || !accounts_for(freed, touched_mib) {
                return Err(vm_err(format!(
                    "the reclaim reply does not account for the {touched_mib} MiB touched: {reply}"
                )));
            }
            // teravm lingers after reclaim: its own resident size must be small now.
            let rss = rss_bytes(vm.child.id()).unwrap_or(0);
            if rss > (args.size_gib << 30) / 20 + (64 << 20) {
                return Err(vm_err(format!(
                    "teravm still has {} MiB resident after its reclaim",
                    rss >> 20
                )));
            }
            Ok(VmRun {
                seconds,
                reply_ms: None,
                phases: phases_of(&report),
                resident: None,
                populate_ms,
                touched_mib: None,
            })
        }
        Method::VmAsync(_) => {
            let body = r#"{"action_type": "Shutdown", "reclaim": "async"}"#;
            let pidfd =
                PidFd::open(vm.child.id()).map_err(|e| vm_err(format!("pidfd_open: {e}")))?;
            let mut conn =
                Connection::open(&vm.sock).map_err(|e| vm_err(format!("connect: {e}")))?;
            let start = Instant::now();
            let (status, reply) = conn
                .request("PUT", "/actions", Some(body))
                .map_err(|e| vm_err(format!("Shutdown: {e}")))?;
            let reply_ms = start.elapsed().as_secs_f64() * 1000.0;
            if status != 202 {
                return Err(vm_err(format!("async Shutdown: {status} {reply}")));
            }
            let end = vm.wait_exit(&pidfd, EXIT_TIMEOUT)?;
            let seconds = end.duration_since(start).as_secs_f64();
            vm.drain();
            // The summary: teravm's stderr, or its stdout before it moved.
            let summary = find_summary(vm.seen.iter().map(|(_, l)| l.as_str()))
                .ok_or_else(|| vm_err("no summary line after an async Shutdown"))?;
            if !accounts_for(summary.mib << 20, touched_mib) {
                return Err(vm_err(format!(
                    "teravm reclaimed {} MiB of the {touched_mib} MiB touched",
                    summary.mib
                )));
            }
            Ok(VmRun {
                seconds,
                reply_ms: Some(reply_ms),
                phases: [None; 4],
                resident: None,
                populate_ms,
                touched_mib: None,
            })
        }
        other => Err(vm_err(format!("{other} is not a --vm method"))),
    }
}

/// One timed run of `vm-prealloc-teravm-<w>`: teravm with all RAM
/// populated and the firmware touching nothing, stopped with `SIGTERM`,
/// timed until `waitpid`.
pub fn measure_prealloc(
    workers: u32,
    case: Case,
    args: &Args,
    teravm: &Path,
    bind: bool,
) -> Result<VmRun, BenchError> {
    let config = prealloc_config(case, args, workers, bind);
    // No API socket: stopped by SIGTERM, ready when the firmware says so.
    let mut vm = launch(teravm, &config, &args.sysfs_root, None)?;
    let touched = vm.wait_line(TOUCHED_PREFIX)?;
    if parse_touched_mib(&touched) != Some(0) {
        return Err(vm_err(format!(
            "the firmware was to touch nothing: {touched:?}"
        )));
    }
    vm.wait_line("teravm firmware: idle")?;
    let size_bytes = args.size_gib << 30;
    let resident =
        resident_of(vm.child.id()).ok_or_else(|| vm_err("teravm's /proc files cannot be read"))?;
    if !covers(&resident, size_bytes) {
        return Err(vm_err(format!(
            "teravm holds {} MiB resident, less than its {} MiB of guest RAM",
            resident.bytes >> 20,
            size_bytes >> 20
        )));
    }
    let pid = libc::pid_t::try_from(vm.child.id()).map_err(|_| vm_err("pid out of range"))?;
    let pidfd = PidFd::open(vm.child.id()).map_err(|e| vm_err(format!("pidfd_open: {e}")))?;
    let start = Instant::now();
    // SAFETY: kill takes a pid and a signal by value; the pid is our child's,
    // not yet reaped, so it names no other process.
    if unsafe { libc::kill(pid, libc::SIGTERM) } != 0 {
        return Err(vm_err(format!(
            "SIGTERM: {}",
            std::io::Error::last_os_error()
        )));
    }
    let end = vm.wait_exit(&pidfd, EXIT_TIMEOUT)?;
    let seconds = end.duration_since(start).as_secs_f64();
    vm.drain();
    let summary = find_summary(vm.seen.iter().map(|(_, l)| l.as_str()))
        .ok_or_else(|| vm_err("no summary line after SIGTERM"))?;
    if !accounts_for(summary.mib << 20, size_bytes >> 20) {
        return Err(vm_err(format!(
            "teravm reclaimed {} MiB of the {} MiB populated",
            summary.mib,
            size_bytes >> 20
        )));
    }
    Ok(VmRun {
        seconds,
        reply_ms: None,
        phases: [None; 4],
        resident: Some(resident),
        populate_ms: populate_ms_of(vm.seen.iter().map(|(_, l)| l.as_str())),
        touched_mib: None,
    })
}

/// The `--vm` methods, in the order they alternate: the baselines, sync
/// shutdowns at every worker count, and one async shutdown at the largest.
pub fn vm_methods(workers: &[u32], mrelease: bool) -> Vec<Method> {
    let mut out = vec![Method::VmKill];
    if mrelease {
        out.push(Method::VmMrelease);
    }
    out.extend(workers.iter().map(|&w| Method::VmShutdown(w)));
    if let Some(&max) = workers.iter().max() {
        out.push(Method::VmAsync(max));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use teravm::config::{Backing, VmConfig};

    #[test]
    fn only_warnings_and_errors_are_echoed() {
        assert!(shown("[   0.001s WARN  start] guest_memfd: …"));
        assert!(shown("[   9.000s ERROR main] guest crashed"));
        assert!(shown("teravm: cannot open /dev/kvm"));
        assert!(!shown(
            "[   0.488s INFO  start] populated 4096 MiB in 484 ms"
        ));
        assert!(!shown("teravm: reclaimed 4096 MiB in 232 ms (…)"));
    }

    #[test]
    fn the_populate_time_is_read_from_teravms_log() {
        let lines = [
            "[   0.001s WARN  start] guest_memfd: this kernel ignores …",
            "[   0.488s INFO  start] populated 4096 MiB in 484 ms with 2 workers",
        ];
        assert_eq!(populate_ms_of(lines), Some(484.0));
        assert_eq!(
            populate_ms_of(["teravm firmware: touched 0 MiB in 0 ms"]),
            None
        );
        assert_eq!(populate_ms_of(["[ 1s INFO  start] populated lots"]), None);
    }

    #[test]
    fn guest_memfd_runs_only_as_a_microvm_and_at_4k() {
        let gmem = |pages| Case {
            pages,
            backing: Backing::GuestMemfd,
        };
        for m in [
            Method::Munmap,
            Method::Exit,
            Method::Mrelease,
            Method::Teravm(2),
        ] {
            assert!(m.unsupported(gmem(Pages::FourK)).is_some(), "{m}");
        }
        for m in [
            Method::VmKill,
            Method::VmShutdown(2),
            Method::VmAsync(2),
            Method::VmPrealloc(1),
        ] {
            assert_eq!(m.unsupported(gmem(Pages::FourK)), None, "{m}");
            assert!(m.unsupported(gmem(Pages::Thp)).is_some(), "{m}");
        }
        assert!(Method::ReportTeravm(2)
            .unsupported(gmem(Pages::FourK))
            .is_some());
        let anon = Case {
            pages: Pages::Thp,
            backing: Backing::Anonymous,
        };
        assert_eq!(Method::Munmap.unsupported(anon), None);
    }

    #[test]
    fn the_vm_config_is_valid() {
        let args = Args::try_parse_from(["teravm-bench", "--size-gib", "2", "--vm"]).unwrap();
        for pages in [Pages::FourK, Pages::Thp] {
            for backing in [Backing::Anonymous, Backing::Memfd] {
                let text = vm_config(Case { pages, backing }, &args, 2, true);
                let c = VmConfig::from_json(&text, Path::new("bench")).unwrap();
                assert_eq!(c.machine_config.mem_size_mib, 2048);
                assert_eq!(c.reclaim.workers_per_node, 2);
                assert!(c.memory.populate);
                assert_eq!(c.memory.backing, backing);
            }
        }
    }

    #[test]
    fn the_prealloc_config_populates_and_touches_nothing() {
        let args = Args::try_parse_from(["teravm-bench", "--size-gib", "2"]).unwrap();
        let case = Case {
            pages: Pages::Thp,
            backing: Backing::Memfd,
        };
        let text = prealloc_config(case, &args, 4, false);
        let c = VmConfig::from_json(&text, Path::new("bench")).unwrap();
        assert!(c.memory.populate);
        assert_eq!(c.reclaim.workers_per_node, 4);
        assert!(
            text.contains(r#""boot_args": "touch=0 then=idle""#),
            "{text}"
        );
        assert!(vm_config(case, &args, 4, false).contains("touch=all then=idle"));
    }

    #[test]
    fn vm_methods_start_with_the_baselines_and_end_with_async() {
        assert_eq!(
            vm_methods(&[1, 2], true),
            vec![
                Method::VmKill,
                Method::VmMrelease,
                Method::VmShutdown(1),
                Method::VmShutdown(2),
                Method::VmAsync(2)
            ]
        );
        assert_eq!(
            vm_methods(&[4], false),
            vec![Method::VmKill, Method::VmShutdown(4), Method::VmAsync(4)]
        );
    }

    #[test]
    fn phases_are_read_where_the_reply_has_them() {
        let reply = serde_json::json!({"state": "done", "phases": {
            "stop_vcpus_ms": 1.5, "close_vm_ms": 0.25, "reclaim_ms": 300.0, "unmap_ms": 2.0}});
        assert_eq!(
            phases_of(&reply),
            [Some(1.5), Some(0.25), Some(300.0), Some(2.0)]
        );
        let partial = serde_json::json!({"phases": {"reclaim_ms": 7}});
        assert_eq!(phases_of(&partial), [None, None, Some(7.0), None]);
        assert_eq!(phases_of(&serde_json::json!({"state": "done"})), [None; 4]);
    }

    #[test]
    fn freed_memory_must_cover_nine_tenths_of_the_touched() {
        assert!(accounts_for(1024 << 20, 1024));
        assert!(accounts_for(922 << 20, 1024));
        assert!(!accounts_for(900 << 20, 1024));
        assert!(accounts_for(0, 0));
    }
}
