//! The Firecracker rows of `--peers` (`firecracker-guest-ctrlaltdel`,
//! `firecracker-guest-kill`): the real `firecracker` binary booting the
//! test guest through its PVH entry (`boot-source.kernel_image_path` = the
//! guest ELF, `boot_args` `touch=all`), 2 vCPUs and `--size-gib` of RAM,
//! started with `--config-file` (so the microVM boots at once) and
//! `--api-sock`. Its serial console is its stdout, read by a
//! [`Console`]; once the guest said it touched its RAM and Firecracker
//! holds that much resident, the clock starts and Firecracker is stopped
//! the way its users stop it:
//!
//! - `SendCtrlAltDel` (`PUT /actions` on the API socket, connected before
//!   the clock): Firecracker's i8042 gets the keys, the guest (polling it)
//!   resets through the i8042, and Firecracker exits with status 0;
//! - `SIGKILL`.
//!
//! Each timed until `waitpid` returns. Firecracker has no preallocated
//! guest RAM (no such option: only the guest's own writes make it
//! resident), so it has no `-prealloc-` rows. Its guest RAM is private
//! anonymous memory (it uses a memfd only when a vhost-user device is
//! configured, `vmm/src/resources.rs`), with `huge_pages: "Transparent"`
//! (`MADV_HUGEPAGE`) for the THP case and THP off for the process
//! (`PR_SET_THP_DISABLE`) for the 4 KiB one, as the QEMU rows. Everything
//! runs on the bench's main thread but the console's reader.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use teravm::config::Backing;
use teravm_client::http::Connection;

use crate::guest::{covers_touched, Console};
use crate::model::{Case, Pages, PeerRun, Resident, Stop};
use crate::mrelease::{timed_exit, PidFd, EXIT_TIMEOUT};
use crate::resident::resident_of;

/// Errors of a Firecracker row.
#[derive(Debug, thiserror::Error)]
pub enum FirecrackerError {
    /// Firecracker could not be started, or its guest did not get ready.
    #[error("cannot start firecracker: {why}{stderr}")]
    Start {
        /// Why.
        why: String,
        /// The end of its stderr, `"; it said: ..."`, or empty.
        stderr: String,
    },
    /// Firecracker did not hold what its guest touched.
    #[error("firecracker holds {resident_mib} MiB resident, less than the {touched_mib} MiB its guest touched")]
    NotResident {
        /// What it held.
        resident_mib: u64,
        /// What the guest touched.
        touched_mib: u64,
    },
    /// Firecracker did not stop as asked.
    #[error("firecracker {what}: {why}")]
    Stop {
        /// The stop (`ctrlaltdel`, `kill`).
        what: &'static str,
        /// What happened instead.
        why: String,
    },
}

/// The guest's vCPUs, as many as the other rows' VMs have.
const VCPUS: u32 = 2;

/// The cached build of the shared script (`build-firecracker.sh`), where
/// it is: `~/.cache/teravm-peers/firecracker-<rev>/bin/firecracker`.
pub fn cached_build(home: Option<&Path>) -> Option<PathBuf> {
    let root = home?.join(".cache/teravm-peers");
    let mut found: Vec<PathBuf> = std::fs::read_dir(root)
        .ok()?
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with("firecracker-"))
        .map(|e| e.path().join("bin/firecracker"))
        .filter(|p| {
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
        .collect();
    found.sort();
    found.pop()
}

/// Whether Firecracker can run `case`: `Err` says why not.
pub fn supports(case: Case) -> Result<(), String> {
    match case.backing {
        Backing::Anonymous => Ok(()),
        Backing::Memfd => Err(
            "Firecracker backs guest RAM with a memfd only when a vhost-user \
                               device is configured; otherwise it is private anonymous memory"
                .into(),
        ),
        Backing::GuestMemfd => Err("Firecracker has no guest_memfd backing for guest RAM".into()),
    }
}

/// Firecracker's config file for `case`: the guest as its kernel.
pub fn config(case: Case, size_mib: u64, kernel: &Path, boot_args: &str) -> String {
    let huge_pages = match case.pages {
        Pages::FourK => "None",
        Pages::Thp => "Transparent",
    };
    serde_json::json!({
        "boot-source": {"kernel_image_path": kernel.display().to_string(), "boot_args": boot_args},
        "drives": [],
        "machine-config": {"vcpu_count": VCPUS, "mem_size_mib": size_mib, "smt": false,
                           "huge_pages": huge_pages},
    })
    .to_string()
}

/// A Firecracker the bench started, its guest's RAM touched and resident.
pub struct RunningFirecracker {
    child: Child,
    dir: PathBuf,
    sock: PathBuf,
    /// What it held when it was ready.
    pub resident: Resident,
    /// The MiB the guest said it touched.
    pub touched_mib: u64,
    _console: Console,
}

fn start_err(why: impl Into<String>, dir: &Path) -> FirecrackerError {
    let text = std::fs::read_to_string(dir.join("firecracker.stderr")).unwrap_or_default();
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let tail = lines[lines.len().saturating_sub(3)..].join(" | ");
    FirecrackerError::Start {
        why: why.into(),
        stderr: if tail.is_empty() {
            String::new()
        } else {
            format!("; it said: {tail}")
        },
    }
}

impl RunningFirecracker {
    /// Starts `bin` booting `kernel` with `boot_args` and `size_mib` of RAM
    /// for `case`, and waits (at most `timeout`) until the guest says it
    /// touched its RAM; Firecracker must then hold that much.
    pub fn start(
        bin: &Path,
        case: Case,
        size_mib: u64,
        kernel: &Path,
        boot_args: &str,
        timeout: Duration,
    ) -> Result<RunningFirecracker, FirecrackerError> {
        let no_start = |why: String| FirecrackerError::Start {
            why,
            stderr: String::new(),
        };
        supports(case).map_err(no_start)?;
        static STARTS: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "teravm-bench-fc-{}-{}",
            std::process::id(),
            STARTS.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| no_start(format!("{}: {e}", dir.display())))?;
        let cfg = dir.join("vm.json");
        std::fs::write(&cfg, config(case, size_mib, kernel, boot_args))
            .map_err(|e| start_err(format!("{}: {e}", cfg.display()), &dir))?;
        let sock = dir.join("api.sock");
        let stderr = std::fs::File::create(dir.join("firecracker.stderr"))
            .map_err(|e| start_err(format!("firecracker.stderr: {e}"), &dir))?;
        let mut command = Command::new(bin);
        command
            .arg("--api-sock")
            .arg(&sock)
            .arg("--config-file")
            .arg(&cfg)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr);
        if case.pages == Pages::FourK {
            // SAFETY: the closure runs in the child between fork and exec; it
            // makes one system call (prctl, async-signal-safe), allocates
            // nothing and takes no lock.
            unsafe {
                command.pre_exec(|| {
                    if libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let mut child = command
            .spawn()
            .map_err(|e| start_err(format!("cannot run {}: {e}", bin.display()), &dir))?;
        let Some(stdout) = child.stdout.take() else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(start_err("no pipe to its console", &dir));
        };
        let mut console = Console::new(stdout);
        let ready = (|| {
            let touched_mib = console
                .wait_touched(timeout)
                .map_err(|why| start_err(why, &dir))?;
            let resident = resident_of(child.id())
                .ok_or_else(|| start_err("its /proc files cannot be read", &dir))?;
            if !covers_touched(&resident, touched_mib) {
                return Err(FirecrackerError::NotResident {
                    resident_mib: resident.bytes >> 20,
                    touched_mib,
                });
            }
            Ok((resident, touched_mib))
        })();
        match ready {
            Ok((resident, touched_mib)) => Ok(RunningFirecracker {
                child,
                dir,
                sock,
                resident,
                touched_mib,
                _console: console,
            }),
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                let _ = std::fs::remove_dir_all(&dir);
                Err(e)
            }
        }
    }

    /// Stops Firecracker as `stop` says; the time from the request until
    /// `waitpid` returned. `SendCtrlAltDel` must be answered 204 and end in
    /// exit status 0, the kill in `SIGKILL`.
    pub fn stop(mut self, stop: Stop) -> Result<Duration, FirecrackerError> {
        let what = match stop {
            Stop::Graceful => "ctrlaltdel",
            Stop::Kill => "kill",
        };
        let failed = |why: String| FirecrackerError::Stop { what, why };
        // Opened before the clock, as a process manager would hold them.
        let pidfd = PidFd::open(self.child.id()).map_err(|e| failed(format!("pidfd_open: {e}")))?;
        let start = match stop {
            Stop::Graceful => {
                let mut conn = Connection::open(&self.sock)
                    .map_err(|e| failed(format!("connect {}: {e}", self.sock.display())))?;
                let start = Instant::now();
                let (status, body) = conn
                    .request(
                        "PUT",
                        "/actions",
                        Some(r#"{"action_type": "SendCtrlAltDel"}"#),
                    )
                    .map_err(|e| failed(format!("SendCtrlAltDel: {e}")))?;
                if status != 204 {
                    return Err(failed(format!("SendCtrlAltDel: {status} {body}")));
                }
                start
            }
            Stop::Kill => {
                let start = Instant::now();
                self.child.kill().map_err(|e| failed(e.to_string()))?;
                start
            }
        };
        timed_exit(&mut self.child, &pidfd, start, stop, EXIT_TIMEOUT).map_err(failed)
    }
}

impl Drop for RunningFirecracker {
    fn drop(&mut self) {
        // Reaped already after a stop (then this is a no-op).
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One timed run of a Firecracker row.
pub fn measure(
    bin: &Path,
    stop: Stop,
    case: Case,
    size_mib: u64,
    kernel: &Path,
) -> Result<PeerRun, FirecrackerError> {
    let fc = RunningFirecracker::start(
        bin,
        case,
        size_mib,
        kernel,
        crate::guest::BOOT_ARGS,
        crate::guest::BOOT_TIMEOUT,
    )?;
    let resident = fc.resident;
    let touched_mib = fc.touched_mib;
    let elapsed = fc.stop(stop)?;
    Ok(PeerRun {
        seconds: elapsed.as_secs_f64(),
        resident,
        touched_mib: Some(touched_mib),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn case(pages: Pages, backing: Backing) -> Case {
        Case { pages, backing }
    }

    #[test]
    fn the_config_boots_the_guest_with_the_case_s_pages() {
        let text = config(
            case(Pages::Thp, Backing::Anonymous),
            8192,
            Path::new("/g/teravm-guest"),
            "touch=all",
        );
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["boot-source"]["kernel_image_path"], "/g/teravm-guest");
        assert_eq!(v["boot-source"]["boot_args"], "touch=all");
        assert_eq!(v["machine-config"]["mem_size_mib"], 8192);
        assert_eq!(v["machine-config"]["vcpu_count"], 2);
        assert_eq!(v["machine-config"]["huge_pages"], "Transparent");
        let four_k = config(
            case(Pages::FourK, Backing::Anonymous),
            1,
            Path::new("/k"),
            "",
        );
        assert!(four_k.contains(r#""huge_pages":"None""#), "{four_k}");
        assert!(supports(case(Pages::FourK, Backing::Anonymous)).is_ok());
        assert!(supports(case(Pages::Thp, Backing::Memfd)).is_err());
        assert!(supports(case(Pages::FourK, Backing::GuestMemfd)).is_err());
    }

    #[test]
    fn the_cached_build_is_found_under_home() {
        let home = std::env::temp_dir().join(format!("teravm-bench-fchome-{}", std::process::id()));
        let bin = home.join(".cache/teravm-peers/firecracker-abc/bin");
        std::fs::create_dir_all(&bin).unwrap();
        assert_eq!(cached_build(Some(&home)), None);
        let fc = bin.join("firecracker");
        std::fs::write(&fc, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&fc, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(cached_build(Some(&home)), Some(fc));
        assert_eq!(cached_build(None), None);
        let _ = std::fs::remove_dir_all(&home);
    }

    /// Firecracker here (PATH or the shared script's cache), or why the
    /// test cannot run (under `CI=true` that fails it).
    fn firecracker_or_skip(test: &str) -> Option<PathBuf> {
        let home = std::env::var_os("HOME").map(PathBuf::from);
        let path = std::env::var_os("PATH").unwrap_or_default();
        let found = std::env::split_paths(&path)
            .map(|d| d.join("firecracker"))
            .find(|p| p.is_file())
            .or_else(|| cached_build(home.as_deref()));
        let why = match found {
            None => "no firecracker on PATH nor in ~/.cache/teravm-peers \
                     (run ../shared/peers/build-firecracker.sh)"
                .to_string(),
            Some(bin) => match teravm::vstate::vm::Vm::available() {
                Ok(()) => return Some(bin),
                Err(e) => format!("/dev/kvm: {e}"),
            },
        };
        if std::env::var("CI").is_ok_and(|v| v.eq_ignore_ascii_case("true")) {
            panic!("{test} cannot run in CI (CI=true): {why}");
        }
        eprintln!("SKIPPED {test}: {why}");
        None
    }

    #[test]
    fn a_real_firecracker_boots_the_guest_and_takes_ctrl_alt_del_or_a_kill() {
        let Some(bin) = firecracker_or_skip("a_real_firecracker_boots_the_guest") else {
            return;
        };
        let kernel = crate::guest::guest_binary().unwrap();
        for stop in [Stop::Graceful, Stop::Kill] {
            let run = measure(
                &bin,
                stop,
                case(Pages::FourK, Backing::Anonymous),
                256,
                &kernel,
            )
            .unwrap();
            let touched = run.touched_mib.unwrap();
            assert!((200..=256).contains(&touched), "{touched}");
            assert!(run.resident.bytes >= touched << 20, "{:?}", run.resident);
        }
    }

    #[test]
    fn a_firecracker_whose_guest_cannot_boot_says_why_in_bounded_time() {
        let Some(bin) = firecracker_or_skip("a_firecracker_whose_guest_cannot_boot") else {
            return;
        };
        let c = case(Pages::FourK, Backing::Anonymous);
        let kernel = crate::guest::guest_binary().unwrap();
        // No touch=: no touched line; the wait ends.
        let e = RunningFirecracker::start(&bin, c, 128, &kernel, "", Duration::from_secs(3))
            .err()
            .expect("a guest that touched nothing was taken for ready")
            .to_string();
        assert!(
            e.contains("did not say it touched its memory within 3s"),
            "{e}"
        );
        // No kernel at all: Firecracker refuses the config and exits.
        let e = RunningFirecracker::start(
            &bin,
            c,
            128,
            Path::new("/nonexistent/kernel"),
            "touch=all",
            Duration::from_secs(60),
        )
        .err()
        .expect("Firecracker booted no kernel")
        .to_string();
        assert!(e.contains("it exited before the guest said"), "{e}");
    }
}
