//! The test guest in the `--peers` rows (`<peer>-guest-*`, `vm-guest-*`):
//! `target/<profile>/teravm-guest` beside the bench binary, a PVH ELF that
//! every VMM here boots, started with `touch=all`: it writes one `u64` to
//! every 4 KiB page of its RAM above its own image (on vCPU 0), prints
//! `teravm guest: touched <N> MiB in <ms> ms` on the serial console, then
//! idles, polling the i8042 for a Ctrl-Alt-Del (then it resets through the
//! i8042).
//!
//! Here: where the guest is, its `touched` line, a console read line by
//! line on a thread of its own with every wait bounded (a VMM that exits
//! or a guest that never says it touched its memory is an error, not a
//! hang), and teravm's own guest rows (`Shutdown` through the API, and
//! `SIGTERM`, each timed until `waitpid`).

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use crate::args::Args;
use crate::model::{backing_name, BenchError, Case, Pages, Resident};
use crate::mrelease::PidFd;
use crate::resident::{covers, resident_of};
use crate::vm::{self, vm_err, VmRun};
use teravm_client::host::find_summary;
use teravm_client::http::Connection;

/// What the test guest prints before the MiB it touched.
pub const TOUCHED: &str = "teravm guest: touched ";

/// The test guest's command line in the guest rows.
pub const BOOT_ARGS: &str = "touch=all";

/// Longest wait for a VMM to boot the guest and the guest to touch its RAM
/// (8 GiB takes some 10 s here).
pub const BOOT_TIMEOUT: Duration = Duration::from_secs(600);

/// The MiB in a guest's `touched` line (`teravm guest: touched <N> MiB in
/// <ms> ms`), wherever it is in the line (a VMM may prefix it).
pub fn parse_touched(line: &str) -> Option<u64> {
    let at = line.find(TOUCHED)?;
    let mut words = line[at + TOUCHED.len()..].split_whitespace();
    let mib = words.next()?.parse().ok()?;
    (words.next() == Some("MiB")).then_some(mib)
}

/// The test guest beside the bench binary, or why there is none.
pub fn guest_binary() -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find the bench binary: {e}"))?;
    let guest = exe.with_file_name("teravm-guest");
    // A test binary is in `deps/` below the profile's directory.
    let above = exe
        .parent()
        .and_then(Path::parent)
        .map(|p| p.join("teravm-guest"));
    if guest.is_file() {
        Ok(guest)
    } else if let Some(above) = above.filter(|p| p.is_file()) {
        Ok(above)
    } else {
        Err(format!(
            "no test guest at {} (cargo build --release builds it as \
             target/release/teravm-guest; cargo install does not install it: copy it beside \
             the bench)",
            guest.display()
        ))
    }
}

/// A VMM's serial console, read line by line on a thread of its own.
pub struct Console {
    lines: Receiver<String>,
    seen: Vec<String>,
}

impl Console {
    /// Reads `from` (the VMM's stdout) until it closes.
    pub fn new(from: impl Read + Send + 'static) -> Console {
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(from).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Console {
            lines,
            seen: Vec::new(),
        }
    }

    /// Waits up to `timeout` for the guest's `touched` line; the MiB it
    /// touched. The console closing first (the VMM exited), a guest
    /// `panic`, or the deadline is an error that quotes the last lines.
    pub fn wait_touched(&mut self, timeout: Duration) -> Result<u64, String> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = match self.lines.recv_timeout(left) {
                Ok(line) => line,
                Err(RecvTimeoutError::Timeout) => {
                    return Err(format!(
                        "the guest did not say it touched its memory within {timeout:?}{}",
                        self.tail()
                    ))
                }
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(format!(
                        "it exited before the guest said it touched its memory{}",
                        self.tail()
                    ))
                }
            };
            let line = line.trim_end().to_string();
            self.seen.push(line.clone());
            if let Some(mib) = parse_touched(&line) {
                return Ok(mib);
            }
            if line.contains("teravm guest: panic") {
                return Err(format!("the guest said {line:?}"));
            }
        }
    }

    /// Waits up to `timeout` for a line that holds `word` (the snapshot
    /// rows' first `tick` after a load); the line. The console closing, a
    /// guest `panic` or the deadline is an error that quotes the last lines.
    pub fn wait_word(&mut self, word: &str, timeout: Duration) -> Result<String, String> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = match self.lines.recv_timeout(left) {
                Ok(line) => line.trim_end().to_string(),
                Err(RecvTimeoutError::Timeout) => {
                    return Err(format!(
                        "the guest printed no {word:?} within {timeout:?}{}",
                        self.tail()
                    ))
                }
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(format!(
                        "it exited before the guest printed {word:?}{}",
                        self.tail()
                    ))
                }
            };
            self.seen.push(line.clone());
            if line.contains(word) {
                return Ok(line);
            }
            if line.contains("teravm guest: panic") {
                return Err(format!("the guest said {line:?}"));
            }
        }
    }

    /// `"; the console said: <last lines>"`, or nothing.
    pub fn tail(&self) -> String {
        let lines: Vec<&str> = self
            .seen
            .iter()
            .map(String::as_str)
            .filter(|l| !l.trim().is_empty())
            .collect();
        if lines.is_empty() {
            return String::new();
        }
        format!(
            "; the console said: {}",
            lines[lines.len().saturating_sub(3)..].join(" | ")
        )
    }
}

/// Whether `resident` covers what the guest touched.
pub fn covers_touched(resident: &Resident, touched_mib: u64) -> bool {
    covers(resident, touched_mib << 20)
}

/// teravm's config for a guest row: the test guest as its kernel, nothing
/// populated (the guest's own writes make its RAM resident, as in the
/// peers), 2 vCPUs as the other rows.
pub fn teravm_config(case: Case, args: &Args, workers: u32, bind: bool, guest: &Path) -> String {
    let huge_pages = match case.pages {
        Pages::FourK => "None",
        Pages::Thp => "Transparent",
    };
    let config = serde_json::json!({
        "machine-config": {"vcpu_count": 2, "mem_size_mib": args.size_gib << 10,
                           "huge_pages": huge_pages},
        "boot-source": {"kernel_image_path": guest.display().to_string(), "boot_args": BOOT_ARGS},
        "memory": {"backing": backing_name(case.backing),
                   "numa_policy": if bind { "bind" } else { "none" }, "populate": false},
    });
    let mut text = config.to_string();
    // The reclaim section as the other microVM rows write it.
    text.pop();
    text.push_str(&format!(
        r#","reclaim": {{"workers_per_node": {workers}, {}"parallel_threshold_mib": 0, "steal": true}}}}"#,
        vm::chunk_field(args.chunk_mib)
    ));
    text
}

/// One timed run of `vm-guest-teravm-<w>` (`shutdown`: `PUT /actions
/// {"action_type": "Shutdown"}`, teravm's default sync reclaim, no
/// lingering) or `vm-guest-sigterm-<w>` (`SIGTERM`, no API), each timed
/// from the request until `waitpid`; exit status 0 and teravm's summary
/// line accounting for what the guest touched are required.
pub fn measure_teravm(
    shutdown: bool,
    workers: u32,
    case: Case,
    args: &Args,
    teravm: &Path,
    bind: bool,
    guest: &Path,
) -> Result<VmRun, BenchError> {
    let config = teravm_config(case, args, workers, bind, guest);
    let linger = shutdown.then_some(0);
    let mut running = vm::launch(teravm, &config, &args.sysfs_root, linger)?;
    let line = running.wait_line_unless(TOUCHED, &["teravm guest: panic"])?;
    let touched_mib =
        parse_touched(&line).ok_or_else(|| vm_err(format!("cannot read {line:?}")))?;
    let resident = resident_of(running.child.id())
        .ok_or_else(|| vm_err("teravm's /proc files cannot be read"))?;
    if !covers_touched(&resident, touched_mib) {
        return Err(vm_err(format!(
            "teravm holds {} MiB resident, less than the {touched_mib} MiB its guest touched",
            resident.bytes >> 20
        )));
    }
    let pidfd = PidFd::open(running.child.id()).map_err(|e| vm_err(format!("pidfd_open: {e}")))?;
    let start = if shutdown {
        let mut conn =
            Connection::open(&running.sock).map_err(|e| vm_err(format!("connect: {e}")))?;
        let start = Instant::now();
        let (status, reply) = conn
            .request("PUT", "/actions", Some(r#"{"action_type": "Shutdown"}"#))
            .map_err(|e| vm_err(format!("Shutdown: {e}")))?;
        if !(200..300).contains(&status) {
            return Err(vm_err(format!("Shutdown: {status} {reply}")));
        }
        start
    } else {
        let pid =
            libc::pid_t::try_from(running.child.id()).map_err(|_| vm_err("pid out of range"))?;
        let start = Instant::now();
        // SAFETY: kill takes a pid and a signal by value; the pid is our
        // child's, not yet reaped, so it names no other process.
        if unsafe { libc::kill(pid, libc::SIGTERM) } != 0 {
            return Err(vm_err(format!(
                "SIGTERM: {}",
                std::io::Error::last_os_error()
            )));
        }
        start
    };
    let end = running.wait_exit(&pidfd, vm::EXIT_TIMEOUT)?;
    let seconds = end.duration_since(start).as_secs_f64();
    running.drain();
    let summary = find_summary(running.seen_lines())
        .ok_or_else(|| vm_err("no summary line after the guest row's stop"))?;
    if !vm::accounts_for(summary.mib << 20, touched_mib) {
        return Err(vm_err(format!(
            "teravm reclaimed {} MiB of the {touched_mib} MiB its guest touched",
            summary.mib
        )));
    }
    Ok(VmRun {
        seconds,
        reply_ms: None,
        phases: [None; 4],
        resident: Some(resident),
        populate_ms: None,
        touched_mib: Some(touched_mib),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use teravm::config::{Backing, VmConfig};

    #[test]
    fn the_touched_line_is_read_wherever_it_is() {
        assert_eq!(
            parse_touched("teravm guest: touched 8170 MiB in 9876 ms"),
            Some(8170)
        );
        assert_eq!(
            parse_touched("\r[  0.1] teravm guest: touched 0 MiB in 0 ms\r"),
            Some(0)
        );
        assert_eq!(
            parse_touched("teravm firmware: touched 12 MiB in 1 ms"),
            None
        );
        assert_eq!(parse_touched("teravm guest: touched lots"), None);
        assert_eq!(parse_touched("teravm guest: touched 12 GiB"), None);
    }

    #[test]
    fn a_console_gives_the_touched_line_or_says_why_not() {
        let text = b"teravm guest: mem_mib=1023 pvh\nteravm guest: touched 1006 MiB in 12 ms\n";
        let mut c = Console::new(&text[..]);
        assert_eq!(c.wait_touched(Duration::from_secs(5)), Ok(1006));
        // Closed before the line: the VMM exited.
        let mut c = Console::new(&b"qemu: no kernel\n"[..]);
        let e = c.wait_touched(Duration::from_secs(5)).unwrap_err();
        assert!(e.starts_with("it exited before"), "{e}");
        assert!(e.contains("the console said: qemu: no kernel"), "{e}");
        let mut c = Console::new(&b"teravm guest: panic: at mem.rs\n"[..]);
        assert!(c
            .wait_touched(Duration::from_secs(5))
            .unwrap_err()
            .contains("panic"));
        // Nothing said and nothing closed: bounded by the deadline.
        let (_keep, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        let mut c = Console::new(theirs);
        let t0 = Instant::now();
        let e = c.wait_touched(Duration::from_millis(200)).unwrap_err();
        assert!(e.contains("within 200ms"), "{e}");
        assert!(t0.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn residency_must_cover_what_the_guest_touched() {
        let r = |mib: u64| Resident {
            bytes: mib << 20,
            huge_bytes: 0,
        };
        assert!(covers_touched(&r(1011), 1006));
        assert!(covers_touched(&r(1006), 1006));
        assert!(!covers_touched(&r(1005), 1006));
    }

    #[test]
    fn the_teravm_config_boots_the_guest_unpopulated() {
        let args = Args::try_parse_from(["teravm-bench", "--size-gib", "2"]).unwrap();
        let case = Case {
            pages: Pages::Thp,
            backing: Backing::Memfd,
        };
        let text = teravm_config(case, &args, 2, false, Path::new("/x/teravm-guest"));
        let c = VmConfig::from_json(&text, Path::new("bench")).unwrap();
        assert!(!c.memory.populate);
        assert_eq!(c.machine_config.mem_size_mib, 2048);
        assert_eq!(c.reclaim.workers_per_node, 2);
        assert_eq!(c.memory.backing, Backing::Memfd);
        assert!(text.contains(r#""boot_args":"touch=all""#), "{text}");
        assert!(
            text.contains(r#""kernel_image_path":"/x/teravm-guest""#),
            "{text}"
        );
    }
}
