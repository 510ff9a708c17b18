//! Nothing on the host side can hang teravm (issue 16, item 3): a stderr
//! nobody reads, stdout and stderr both full, a log FIFO nobody reads. Each
//! on the real binary and /dev/kvm, with the default flags (seccomp on):
//! SIGTERM ends the VM within 2 s with exit 0 and the memory reclaimed (the
//! final metrics line says so; stderr cannot), and what stderr did not take
//! is counted.

mod common;

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::api::*;
use common::*;
use serde_json::Value;

/// What a test allows between SIGTERM and the exit.
const EXIT_WITHIN: Duration = Duration::from_secs(2);

/// The firmware touches this much before the signal.
const TOUCH_MIB: u64 = 64;

/// A full pipe that nobody reads: (its read end, kept open so that writes
/// wait rather than fail; its write end, for the child).
fn full_pipe() -> (OwnedFd, OwnedFd, usize) {
    let (r, w) = pipe();
    let filled = fill(&w);
    (r, w, filled)
}

/// Spawns teravm on a 2-vCPU, 256 MiB firmware guest that touches
/// [`TOUCH_MIB`] (plus `boot_args`), with metrics to a file and `extra`
/// flags; returns the child and the metrics path.
fn spawn(
    dir: &Path,
    boot_args: &str,
    extra: &[&str],
    stdout: Stdio,
    stderr: Stdio,
) -> (Child, PathBuf) {
    let args = format!("touch={TOUCH_MIB} {boot_args}");
    let cfg = config_file(dir, &config_json(2, 256, args.trim(), ""));
    let metrics = dir.join("metrics.json");
    let child = Command::new(teravm())
        .args(["--config-file", cfg.to_str().unwrap(), "--no-api"])
        .args(["--metrics-path", metrics.to_str().unwrap()])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(stderr)
        .spawn()
        .unwrap();
    (child, metrics)
}

/// How long the `output` thread must have been blocked in one write before
/// teravm counts what it is given as dropped: more than its
/// `output::STALL_AFTER` (100 ms).
const STALLED_FOR: Duration = Duration::from_millis(150);

/// The tid of `pid`'s thread named `name`.
fn thread_named(pid: u32, name: &str) -> Option<String> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .ok()?
        .find_map(|t| {
            let t = t.ok()?.file_name().into_string().ok()?;
            let comm = std::fs::read_to_string(format!("/proc/{pid}/task/{t}/comm")).ok()?;
            (comm.trim() == name).then_some(t)
        })
}

/// Waits until teravm's `output` thread is stalled: blocked in one pipe
/// write (same `wchan`, no context switch) for [`STALLED_FOR`]; the event
/// a full stderr causes, observed in /proc rather than slept for.
fn wait_output_stalled(pid: u32, what: &str) {
    let deadline = Instant::now() + T;
    let mut since: Option<(Instant, String)> = None;
    loop {
        assert!(
            Instant::now() < deadline,
            "{what}: the output thread never stalled"
        );
        let Some(tid) = thread_named(pid, "output") else {
            std::thread::sleep(Duration::from_millis(5));
            continue;
        };
        let task = format!("/proc/{pid}/task/{tid}");
        let wchan = std::fs::read_to_string(format!("{task}/wchan")).unwrap_or_default();
        let switches = std::fs::read_to_string(format!("{task}/status"))
            .unwrap_or_default()
            .lines()
            .find(|l| l.starts_with("voluntary_ctxt_switches"))
            .unwrap_or_default()
            .to_string();
        if wchan.contains("pipe_write") {
            match &since {
                Some((t, s)) if *s == switches => {
                    if t.elapsed() >= STALLED_FOR {
                        return;
                    }
                }
                _ => since = Some((Instant::now(), switches)),
            }
        } else {
            since = None;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Waits for the guest to touch its memory (and, with `stalled`, for the
/// output thread to stall on the full stderr), sends SIGTERM,
/// and asserts that teravm exits 0 within [`EXIT_WITHIN`]; returns how long
/// it took.
fn sigterm_ends_it(child: &mut Child, what: &str, stalled: bool) -> Duration {
    let pid = child.id();
    let deadline = Instant::now() + T;
    while rss_bytes_of(pid) < TOUCH_MIB << 20 {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("{what}: the guest did not touch {TOUCH_MIB} MiB within {T:?}");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    if stalled {
        wait_output_stalled(pid, what);
    }
    let sent = Instant::now();
    // SAFETY: signalling our own child.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGTERM) }, 0);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if sent.elapsed() > EXIT_WITHIN {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what}: teravm still alive {EXIT_WITHIN:?} after SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let took = sent.elapsed();
    assert_eq!(status.code(), Some(0), "{what}: {status:?}");
    took
}

/// The last line of the metrics file: written when the VM stopped.
fn final_metrics(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap();
    let last = text.lines().last().unwrap_or_else(|| panic!("no metrics"));
    serde_json::from_str(last).unwrap()
}

/// The final metrics say the VM stopped with its touched memory freed;
/// returns the lines stderr dropped (their running total).
fn assert_reclaimed(metrics: &Value, what: &str) -> u64 {
    let teravm = &metrics["teravm"];
    assert_eq!(teravm["state"], "Stopped", "{what}: {metrics}");
    assert_eq!(teravm["reclaim"]["state"], "done", "{what}: {metrics}");
    let freed = u(&teravm["reclaim"], "resident_bytes_freed");
    assert!(
        freed >= (TOUCH_MIB - 4) << 20,
        "{what}: only {freed} bytes freed: {metrics}"
    );
    u(&teravm["stderr"], "lines_dropped")
}

#[test]
fn a_stderr_nobody_reads_does_not_stop_sigterm() {
    if !kvm_or_skip("stuck_stderr") {
        return;
    }
    let _big = big_memory();
    let dir = temp_dir("stuck-stderr");
    let (_read_end, write_end, filled) = full_pipe();
    // Info lines from the event loop and the reclaim job, and a vCPU that
    // keeps writing a port with no device (a warning from the vCPU thread).
    let (mut child, metrics) = spawn(
        &dir,
        "fault=ports",
        &["--level", "Info"],
        Stdio::null(),
        Stdio::from(write_end),
    );
    let took = sigterm_ends_it(&mut child, "stuck stderr", true);
    let m = final_metrics(&metrics);
    let dropped = assert_reclaimed(&m, "stuck stderr");
    assert!(dropped > 0, "no stderr line counted as dropped: {m}");
    eprintln!(
        "stuck stderr ({filled} bytes in the pipe): exited {took:?} after SIGTERM; \
         {dropped} lines dropped"
    );
}

#[test]
fn stdout_and_stderr_both_full_do_not_stop_sigterm() {
    if !kvm_or_skip("stuck_stdout_and_stderr") {
        return;
    }
    let _big = big_memory();
    let dir = temp_dir("stuck-both");
    let (_out_read, out_write, _) = full_pipe();
    let (_err_read, err_write, _) = full_pipe();
    let (mut child, metrics) = spawn(
        &dir,
        "then=idle",
        &["--level", "Info"],
        Stdio::from(out_write),
        Stdio::from(err_write),
    );
    let took = sigterm_ends_it(&mut child, "stuck stdout and stderr", true);
    let m = final_metrics(&metrics);
    let dropped = assert_reclaimed(&m, "stuck stdout and stderr");
    assert!(dropped > 0, "no stderr line counted as dropped: {m}");
    let console = u(&m["teravm"]["console"], "bytes_dropped");
    assert!(console > 0, "no console byte counted as dropped: {m}");
    eprintln!(
        "stuck stdout and stderr: exited {took:?} after SIGTERM; {dropped} stderr lines \
         and {console} console bytes dropped"
    );
}

#[test]
fn a_log_fifo_nobody_reads_does_not_stop_sigterm() {
    if !kvm_or_skip("stuck_log_fifo") {
        return;
    }
    let _big = big_memory();
    let dir = temp_dir("stuck-log-fifo");
    let fifo = dir.join("log.fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path; the result is checked.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    // Held open read-write and never read: the FIFO has a reader, so
    // teravm's open succeeds, and it starts full.
    let held = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&fifo)
        .unwrap();
    let held = OwnedFd::from(held);
    let filled = fill(&held);
    let (mut child, metrics) = spawn(
        &dir,
        "then=idle",
        &["--level", "Debug", "--log-path", fifo.to_str().unwrap()],
        Stdio::null(),
        Stdio::piped(),
    );
    let took = sigterm_ends_it(&mut child, "stuck log FIFO", false);
    let m = final_metrics(&metrics);
    assert_reclaimed(&m, "stuck log FIFO");
    let missed = u(&m["logger"], "missed_log_count");
    assert!(missed > 0, "no log line counted as missed: {m}");
    // stderr is read: the summary reached it.
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    let (mib, _, _) = summary(&stderr);
    assert!(mib >= TOUCH_MIB - 4, "{stderr}");
    eprintln!(
        "stuck log FIFO ({filled} bytes in it): exited {took:?} after SIGTERM; \
         {missed} log lines missed"
    );
}
