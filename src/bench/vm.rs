//! The end-to-end case (`--vm`): a real teravm microVM whose firmware dirtied
//! all of its `--size-gib`, either shut down through the API (`Shutdown`,
//! sync: timed from the request until teravm's reply, once its reclaim is
//! done) or killed with `SIGKILL` (timed until `waitpid` returns: what a
//! Firecracker user gets today).
//!
//! Guest memory is populated before boot (untimed, and far faster than the
//! guest's own first touches on a host whose KVM is paging-based), then the
//! firmware writes every page of it. After a sync shutdown the reply is
//! checked (state `done`, resident bytes freed ≥ 90% of what was touched) and
//! so is teravm's own resident size, read while it lingers.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

use super::cli::Args;
use super::{backing_name, BenchError, Case, Method, Pages};
use crate::api::client::request;

/// Longest wait for a microVM to boot and touch its memory.
const BOOT_TIMEOUT: Duration = Duration::from_secs(900);

fn vm_err(what: impl Into<String>) -> BenchError {
    BenchError::Vm(what.into())
}

/// The teravm binary beside the bench binary.
pub fn teravm_binary() -> Result<PathBuf, BenchError> {
    let exe = std::env::current_exe()
        .map_err(|e| vm_err(format!("cannot find the bench binary: {e}")))?;
    let teravm = exe.with_file_name("teravm");
    if !teravm.is_file() {
        return Err(BenchError::VmUnavailable(format!(
            "--vm needs the teravm binary at {} (build it with cargo build --release)",
            teravm.display()
        )));
    }
    if let Err(e) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
    {
        return Err(BenchError::VmUnavailable(format!(
            "--vm needs /dev/kvm: {e}"
        )));
    }
    Ok(teravm)
}

/// The microVM's config: 2 vCPUs, all memory touched, then idle.
pub fn vm_config(case: Case, args: &Args, workers: u32, bind: bool) -> String {
    let huge_pages = match case.pages {
        Pages::FourK => "None",
        Pages::Thp => "Transparent",
    };
    format!(
        r#"{{"machine-config": {{"vcpu_count": 2, "mem_size_mib": {mib}, "huge_pages": "{huge_pages}"}},
  "boot-source": {{"boot_args": "touch=all then=idle"}},
  "memory": {{"backing": "{backing}", "numa_policy": "{policy}", "populate": true}},
  "reclaim": {{"workers_per_node": {workers}, "chunk_mib": {chunk}, "parallel_threshold_mib": 0, "steal": true}}}}"#,
        mib = args.size_gib << 10,
        backing = backing_name(case.backing),
        policy = if bind { "bind" } else { "none" },
        chunk = args.chunk_mib,
    )
}

struct RunningVm {
    child: Child,
    sock: PathBuf,
    dir: PathBuf,
    lines: Receiver<String>,
}

impl RunningVm {
    fn wait_line(&self, prefix: &str) -> Result<String, BenchError> {
        let deadline = Instant::now() + BOOT_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.starts_with(prefix) => return Ok(line),
                Ok(_) => {}
                Err(_) => return Err(vm_err(format!("the microVM never printed {prefix:?}"))),
            }
        }
    }

    fn rss_bytes(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).ok()?;
        let kib: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))?
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .ok()?;
        Some(kib << 10)
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
fn boot(teravm: &Path, config: &str, sysfs_root: &Path) -> Result<(RunningVm, u64), BenchError> {
    let dir = std::env::temp_dir().join(format!("teravm-bench-vm-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| vm_err(format!("{}: {e}", dir.display())))?;
    let cfg = dir.join("vm.json");
    std::fs::write(&cfg, config).map_err(|e| vm_err(format!("{}: {e}", cfg.display())))?;
    let sock = dir.join("api.sock");
    let mut child = Command::new(teravm)
        .arg("--api-sock")
        .arg(&sock)
        .arg("--config-file")
        .arg(&cfg)
        .arg("--sysfs-root")
        .arg(sysfs_root)
        .args(["--linger-ms", "5000"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| vm_err(format!("cannot run {}: {e}", teravm.display())))?;
    let out = child.stdout.take().ok_or_else(|| vm_err("no stdout"))?;
    let (tx, lines) = channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let vm = RunningVm {
        child,
        sock,
        dir,
        lines,
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while request(&vm.sock, "GET", "/", None).is_err() {
        if Instant::now() > deadline {
            return Err(vm_err("the API socket never answered"));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let start = r#"{"action_type": "InstanceStart"}"#;
    match request(&vm.sock, "PUT", "/actions", Some(start)) {
        Ok((204, _)) => {}
        Ok((status, body)) => return Err(vm_err(format!("InstanceStart: {status} {body}"))),
        Err(e) => return Err(vm_err(format!("InstanceStart: {e}"))),
    }
    let touched = vm.wait_line("teravm firmware: touched ")?;
    let mib = touched
        .split_whitespace()
        .nth(3)
        .and_then(|m| m.parse().ok())
        .ok_or_else(|| vm_err(format!("cannot read {touched:?}")))?;
    vm.wait_line("teravm firmware: idle")?;
    Ok((vm, mib))
}

/// One timed run of a `--vm` method, in seconds.
pub fn measure_vm(
    method: Method,
    case: Case,
    args: &Args,
    teravm: &Path,
    bind: bool,
) -> Result<f64, BenchError> {
    let workers = match method {
        Method::VmShutdown(w) => w,
        _ => 1,
    };
    let (mut vm, touched_mib) = boot(
        teravm,
        &vm_config(case, args, workers, bind),
        &args.sysfs_root,
    )?;
    match method {
        Method::VmKill => {
            let start = Instant::now();
            vm.child.kill().map_err(|e| vm_err(format!("kill: {e}")))?;
            vm.child
                .wait()
                .map_err(|e| vm_err(format!("waitpid: {e}")))?;
            Ok(start.elapsed().as_secs_f64())
        }
        Method::VmShutdown(_) => {
            let body = r#"{"action_type": "Shutdown", "reclaim": "sync"}"#;
            let start = Instant::now();
            let (status, reply) = request(&vm.sock, "PUT", "/actions", Some(body))
                .map_err(|e| vm_err(format!("Shutdown: {e}")))?;
            let seconds = start.elapsed().as_secs_f64();
            if status != 200 {
                return Err(vm_err(format!("Shutdown: {status} {reply}")));
            }
            let report: serde_json::Value =
                serde_json::from_str(&reply).map_err(|e| vm_err(format!("Shutdown reply: {e}")))?;
            let freed = report["resident_bytes_freed"].as_u64().unwrap_or(0);
            if report["state"] != "done" || freed * 10 < (touched_mib << 20) * 9 {
                return Err(vm_err(format!(
                    "the reclaim reply does not account for the {touched_mib} MiB touched: {reply}"
                )));
            }
            // teravm lingers after reclaim: its own resident size must be small now.
            let rss = vm.rss_bytes().unwrap_or(0);
            if rss > (args.size_gib << 30) / 20 + (64 << 20) {
                return Err(vm_err(format!(
                    "teravm still has {} MiB resident after its reclaim",
                    rss >> 20
                )));
            }
            Ok(seconds)
        }
        other => Err(vm_err(format!("{other} is not a --vm method"))),
    }
}

/// The `--vm` methods, in the order they alternate.
pub fn vm_methods(workers: &[u32]) -> Vec<Method> {
    let mut out = vec![Method::VmKill];
    out.extend(workers.iter().map(|&w| Method::VmShutdown(w)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Backing, VmConfig};
    use clap::Parser;

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
    fn vm_methods_start_with_the_kill_baseline() {
        assert_eq!(
            vm_methods(&[1, 2]),
            vec![Method::VmKill, Method::VmShutdown(1), Method::VmShutdown(2)]
        );
    }
}
