//! The QEMU rows of `--peers`: a real `qemu-system-x86_64` with KVM whose
//! RAM is one memory backend, stopped with QMP `quit` or `SIGKILL` and timed
//! from the request until `waitpid` returns. Two kinds:
//!
//! - `qemu-prealloc-quit`, `qemu-prealloc-kill`: a paused q35 guest (`-S`:
//!   no vCPU ever runs, so no guest page tables are built), its RAM
//!   preallocated by QEMU itself (`prealloc=on`);
//! - `qemu-guest-quit`, `qemu-guest-kill`: `-M microvm` booting the test
//!   guest (`-kernel teravm-guest -append touch=all`, PVH entry), which
//!   writes all its RAM itself; the clock starts once its `touched` line
//!   came on the serial console (QEMU's stdout, [`crate::guest::Console`]).
//!   microvm has no i8042 unless asked: `-device i8042` gives the guest
//!   the controller it polls for a Ctrl-Alt-Del (without one the port
//!   reads 0xff, which the guest takes for a key press).
//!
//! The bench listens on a Unix socket in a fresh temp dir and QEMU connects
//! to it as a QMP client (`-chardev socket,...,server=off`), so that no one
//! polls for a socket to appear: the bench waits in `poll` for QEMU's
//! connection or its exit (a pidfd), then for QMP's greeting, which QEMU
//! sends once its main loop runs, after the preallocation. Then
//! `query-status` must say the guest is paused (running, for the guest
//! rows), and QEMU's resident size (`/proc/<pid>/status`, `smaps_rollup`)
//! must cover the guest RAM (what the guest touched) before the clock
//! starts. QEMU's stderr goes to a file in the temp dir, quoted
//! when it fails. Everything runs on the bench's main thread.

use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use teravm::config::Backing;

use crate::guest::{covers_touched, Console};
use crate::model::{Case, Pages, PeerRun, Resident, Stop};
use crate::mrelease::{timed_exit, PidFd, EXIT_TIMEOUT};
use crate::qmp::{Qmp, QmpError};
use crate::resident::{covers, resident_of};

/// Errors of a QEMU row.
#[derive(Debug, thiserror::Error)]
pub enum QemuError {
    /// QEMU could not be started, or died before it was ready.
    #[error("cannot start qemu: {why}{stderr}")]
    Start {
        /// Why.
        why: String,
        /// The end of its stderr, `"; it said: ..."`, or empty.
        stderr: String,
    },
    /// Talking to QEMU over QMP failed.
    #[error(transparent)]
    Qmp(#[from] QmpError),
    /// QEMU did not hold all of its guest RAM (what its guest touched) when
    /// the clock was to start.
    #[error("qemu holds {resident_mib} MiB resident, less than the {size_mib} MiB of guest RAM it should")]
    NotResident {
        /// What it held.
        resident_mib: u64,
        /// Its guest RAM.
        size_mib: u64,
    },
    /// QEMU did not stop as asked.
    #[error("qemu {what}: {why}")]
    Stop {
        /// The stop (`quit`, `kill`).
        what: &'static str,
        /// What happened instead.
        why: String,
    },
}

/// Longest wait for QEMU to connect to the QMP socket (it does at once).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(60);
/// Longest wait for QMP's greeting: QEMU preallocates guest RAM first.
const GREETING_TIMEOUT: Duration = Duration::from_secs(900);
/// Longest wait for a reply to a command.
const REPLY_TIMEOUT: Duration = Duration::from_secs(30);

/// The guest's vCPUs, as many as teravm's microVMs in the bench have.
const VCPUS: u32 = 2;

/// QEMU's guest RAM for a case.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QemuBackend {
    /// The `-object` argument (id `ram`, preallocated).
    pub object: String,
    /// Whether QEMU runs with `prctl(PR_SET_THP_DISABLE)`: QEMU advises
    /// huge pages on guest RAM itself (`MADV_HUGEPAGE`), so 4 KiB rows
    /// need THP off for the whole process.
    pub thp_disable: bool,
}

/// QEMU's memory backend for `case`, `size_mib` of it: the one place where
/// a backing becomes QEMU arguments. A backing QEMU lacks is `Err` with the
/// reason, and the QEMU rows skip that case.
pub fn backend(case: Case, size_mib: u64) -> Result<QemuBackend, String> {
    backend_with(case, size_mib, true)
}

/// The same, preallocated by QEMU (`prealloc=on`) or not (the guest rows:
/// the guest's writes make it resident).
pub fn backend_with(case: Case, size_mib: u64, prealloc: bool) -> Result<QemuBackend, String> {
    let pre = if prealloc { ",prealloc=on" } else { "" };
    let object = match case.backing {
        Backing::Anonymous => format!("memory-backend-ram,id=ram,size={size_mib}M{pre}"),
        Backing::Memfd => {
            format!("memory-backend-memfd,id=ram,size={size_mib}M,share=on{pre}")
        }
        Backing::GuestMemfd => {
            return Err(
                "QEMU has no guest_memfd backend for an ordinary guest (it creates guest_memfd only for confidential ones)"
                    .into(),
            )
        }
    };
    Ok(QemuBackend {
        object,
        thp_disable: case.pages == Pages::FourK,
    })
}

/// QEMU's command line (after the binary) for `backend` of `size_mib`, its
/// QMP client socket at `qmp_sock`.
pub fn qemu_args(backend: &QemuBackend, size_mib: u64, qmp_sock: &Path) -> Vec<String> {
    [
        "-S",
        "-nodefaults",
        "-nographic",
        "-display",
        "none",
        "-machine",
        "q35,accel=kvm,memory-backend=ram",
        "-smp",
        &VCPUS.to_string(),
        "-m",
        &format!("{size_mib}M"),
        "-object",
        &backend.object,
        "-chardev",
        &format!("socket,id=qmp,path={},server=off", qmp_sock.display()),
        "-mon",
        "chardev=qmp,mode=control",
    ]
    .map(str::to_string)
    .to_vec()
}

/// QEMU's command line (after the binary) for the guest rows: `-M
/// microvm` booting `kernel` with `boot_args`, its console on stdout.
pub fn qemu_guest_args(
    backend: &QemuBackend,
    size_mib: u64,
    qmp_sock: &Path,
    kernel: &Path,
    boot_args: &str,
) -> Vec<String> {
    [
        "-nodefaults",
        "-display",
        "none",
        "-machine",
        "microvm,x-option-roms=off,rtc=off,acpi=off,accel=kvm,memory-backend=ram",
        "-cpu",
        // arch-capabilities off: QEMU 7.2 sets MSR 0x10a, which KVM on
        // an AMD PVM host refuses (an assertion kills QEMU at start).
        "host,arch-capabilities=off",
        "-smp",
        &VCPUS.to_string(),
        "-m",
        &format!("{size_mib}M"),
        "-object",
        &backend.object,
        "-device",
        "i8042",
        "-serial",
        "stdio",
        "-kernel",
        &kernel.display().to_string(),
        "-append",
        boot_args,
        "-chardev",
        &format!("socket,id=qmp,path={},server=off", qmp_sock.display()),
        "-mon",
        "chardev=qmp,mode=control",
    ]
    .map(str::to_string)
    .to_vec()
}

/// The test guest a QEMU guest row boots, and how long it may take to say
/// it touched its memory.
#[derive(Debug, Clone)]
pub struct GuestBoot {
    /// The guest ELF (PVH entry).
    pub kernel: PathBuf,
    /// Its command line.
    pub boot_args: String,
    /// Longest wait for its `touched` line.
    pub timeout: Duration,
}

/// A QEMU the bench started, its guest RAM resident, QMP negotiated.
pub struct RunningQemu {
    child: Child,
    qmp: Qmp,
    dir: PathBuf,
    /// What it held when it was ready.
    pub resident: Resident,
    /// With the test guest: the MiB it said it touched.
    pub touched_mib: Option<u64>,
    // Kept so that the guest's console is read to the end.
    _console: Option<Console>,
}

fn start_err(why: impl Into<String>, dir: &Path) -> QemuError {
    let text = std::fs::read_to_string(dir.join("qemu.stderr")).unwrap_or_default();
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let tail = lines[lines.len().saturating_sub(3)..].join(" | ");
    QemuError::Start {
        why: why.into(),
        stderr: if tail.is_empty() {
            String::new()
        } else {
            format!("; it said: {tail}")
        },
    }
}

/// Waits until `listener` has a connection or the process of `pidfd` has
/// exited, at most `timeout`; the connection.
fn accept_unless_exited(
    listener: &UnixListener,
    pidfd: &PidFd,
    timeout: Duration,
) -> Result<UnixStream, String> {
    let mut fds = [
        libc::pollfd {
            fd: listener.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: pidfd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    let deadline = Instant::now() + timeout;
    loop {
        let ms =
            teravm::util::poll_timeout_ms(Some(deadline.saturating_duration_since(Instant::now())));
        // SAFETY: `fds` is an array of two valid pollfds that lives across
        // the call, and its length is passed with it.
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
        if rc < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(format!("poll: {e}"));
        }
        if rc == 0 {
            return Err(format!("it did not connect to QMP within {timeout:?}"));
        }
        if fds[0].revents & libc::POLLIN != 0 {
            return listener
                .accept()
                .map(|(s, _)| s)
                .map_err(|e| format!("accept: {e}"));
        }
        if fds[1].revents != 0 {
            return Err("it exited before it connected to QMP".into());
        }
    }
}

impl RunningQemu {
    /// Starts `bin` with `size_mib` of guest RAM for `case`: paused and
    /// preallocated, or booting `guest`; waits until QMP answers and the
    /// RAM is resident (for a guest: until it said it touched it, and
    /// QEMU holds that much).
    pub fn start_with(
        bin: &Path,
        case: Case,
        size_mib: u64,
        guest: Option<&GuestBoot>,
    ) -> Result<RunningQemu, QemuError> {
        let backend =
            backend_with(case, size_mib, guest.is_none()).map_err(|why| QemuError::Start {
                why,
                stderr: String::new(),
            })?;
        static STARTS: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "teravm-bench-qemu-{}-{}",
            std::process::id(),
            STARTS.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)
            .map_err(|e| start_err(format!("{}: {e}", dir.display()), &dir))?;
        let sock = dir.join("qmp.sock");
        let listener = UnixListener::bind(&sock)
            .map_err(|e| start_err(format!("{}: {e}", sock.display()), &dir))?;
        let stderr = std::fs::File::create(dir.join("qemu.stderr"))
            .map_err(|e| start_err(format!("qemu.stderr: {e}"), &dir))?;
        let mut command = Command::new(bin);
        match guest {
            None => command
                .args(qemu_args(&backend, size_mib, &sock))
                .stdout(Stdio::null()),
            Some(g) => command
                .args(qemu_guest_args(
                    &backend,
                    size_mib,
                    &sock,
                    &g.kernel,
                    &g.boot_args,
                ))
                .stdout(Stdio::piped()),
        };
        command.stdin(Stdio::null()).stderr(stderr);
        if backend.thp_disable {
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
        let mut console = child.stdout.take().map(Console::new);
        let ready = (|| {
            let pidfd =
                PidFd::open(child.id()).map_err(|e| start_err(format!("pidfd_open: {e}"), &dir))?;
            let stream = accept_unless_exited(&listener, &pidfd, CONNECT_TIMEOUT)
                .map_err(|why| start_err(why, &dir))?;
            let mut qmp = Qmp::handshake(stream, GREETING_TIMEOUT, REPLY_TIMEOUT)
                .map_err(|e| start_err(e.to_string(), &dir))?;
            let status = qmp.execute("query-status")?;
            if status["running"] != guest.is_some() {
                return Err(start_err(
                    format!(
                        "the guest is not {}: {status}",
                        if guest.is_some() { "running" } else { "paused" }
                    ),
                    &dir,
                ));
            }
            let touched = match (guest, console.as_mut()) {
                (Some(g), Some(c)) => Some(
                    c.wait_touched(g.timeout)
                        .map_err(|why| start_err(why, &dir))?,
                ),
                _ => None,
            };
            let resident = resident_of(child.id())
                .ok_or_else(|| start_err("its /proc files cannot be read", &dir))?;
            let (ok, want_mib) = match touched {
                Some(mib) => (covers_touched(&resident, mib), mib),
                None => (covers(&resident, size_mib << 20), size_mib),
            };
            if !ok {
                return Err(QemuError::NotResident {
                    resident_mib: resident.bytes >> 20,
                    size_mib: want_mib,
                });
            }
            Ok((qmp, resident, touched))
        })();
        match ready {
            Ok((qmp, resident, touched_mib)) => Ok(RunningQemu {
                child,
                qmp,
                dir,
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

    /// Stops QEMU as `stop` says; the time from the request until `waitpid`
    /// returned. `quit` must end in exit status 0, the kill in `SIGKILL`.
    pub fn stop(mut self, stop: Stop) -> Result<Duration, QemuError> {
        let what = match stop {
            Stop::Graceful => "quit",
            Stop::Kill => "kill",
        };
        let failed = |why: String| QemuError::Stop { what, why };
        // Opened before the clock, as a process manager would hold one.
        let pidfd = PidFd::open(self.child.id()).map_err(|e| failed(format!("pidfd_open: {e}")))?;
        let start = match stop {
            Stop::Graceful => {
                let start = Instant::now();
                self.qmp.send("quit")?;
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

impl Drop for RunningQemu {
    fn drop(&mut self) {
        // Reaped already after a stop (then this is a no-op).
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One timed run of a QEMU row: preallocated, or booting `guest`.
pub fn measure(
    bin: &Path,
    stop: Stop,
    case: Case,
    size_mib: u64,
    guest: Option<&GuestBoot>,
) -> Result<PeerRun, QemuError> {
    let qemu = RunningQemu::start_with(bin, case, size_mib, guest)?;
    let resident = qemu.resident;
    let touched_mib = qemu.touched_mib;
    let elapsed = qemu.stop(stop)?;
    Ok(PeerRun {
        seconds: elapsed.as_secs_f64(),
        resident,
        touched_mib,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn case(pages: Pages, backing: Backing) -> Case {
        Case { pages, backing }
    }

    #[test]
    fn each_backing_is_one_memory_backend() {
        let b = backend(case(Pages::FourK, Backing::Anonymous), 8192).unwrap();
        assert_eq!(b.object, "memory-backend-ram,id=ram,size=8192M,prealloc=on");
        assert!(b.thp_disable);
        let b = backend(case(Pages::Thp, Backing::Memfd), 1024).unwrap();
        assert_eq!(
            b.object,
            "memory-backend-memfd,id=ram,size=1024M,share=on,prealloc=on"
        );
        assert!(!b.thp_disable);
    }

    #[test]
    fn the_guest_is_paused_and_its_ram_the_backend() {
        let b = backend(case(Pages::Thp, Backing::Anonymous), 256).unwrap();
        let args = qemu_args(&b, 256, Path::new("/tmp/x/qmp.sock")).join(" ");
        assert_eq!(
            args,
            "-S -nodefaults -nographic -display none -machine q35,accel=kvm,memory-backend=ram \
             -smp 2 -m 256M -object memory-backend-ram,id=ram,size=256M,prealloc=on \
             -chardev socket,id=qmp,path=/tmp/x/qmp.sock,server=off -mon chardev=qmp,mode=control"
        );
    }

    /// QEMU on this host, or why the test cannot run (in CI, where QEMU is
    /// installed, that fails the test, as `tests/common` `skip` does).
    fn qemu_or_skip(test: &str) -> Option<PathBuf> {
        let why = match crate::peers::find_on_path(
            "qemu-system-x86_64",
            std::env::var_os("PATH").as_deref(),
        ) {
            None => "no qemu-system-x86_64 on PATH (apt-get install qemu-system-x86)".to_string(),
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
    fn a_real_qemu_holds_its_ram_and_quits_or_is_killed() {
        let Some(bin) = qemu_or_skip("a_real_qemu_holds_its_ram_and_quits_or_is_killed") else {
            return;
        };
        for (c, stop) in [
            (case(Pages::FourK, Backing::Anonymous), Stop::Graceful),
            (case(Pages::FourK, Backing::Memfd), Stop::Kill),
        ] {
            let run = measure(&bin, stop, c, 256, None).unwrap();
            assert!(run.seconds > 0.0);
            assert!(run.resident.bytes >= 256 << 20, "{c}: {:?}", run.resident);
            // THP off for the 4 KiB rows: none of it in huge pages.
            assert!(
                run.resident.huge_bytes < 16 << 20,
                "{c}: {:?}",
                run.resident
            );
        }
    }

    fn guest(boot_args: &str, timeout: Duration) -> GuestBoot {
        GuestBoot {
            kernel: crate::guest::guest_binary().unwrap(),
            boot_args: boot_args.into(),
            timeout,
        }
    }

    #[test]
    fn a_real_qemu_boots_the_guest_which_touches_its_ram() {
        let Some(bin) = qemu_or_skip("a_real_qemu_boots_the_guest_which_touches_its_ram") else {
            return;
        };
        let g = guest(crate::guest::BOOT_ARGS, crate::guest::BOOT_TIMEOUT);
        for (c, stop) in [
            (case(Pages::FourK, Backing::Anonymous), Stop::Graceful),
            (case(Pages::FourK, Backing::Memfd), Stop::Kill),
        ] {
            let run = measure(&bin, stop, c, 256, Some(&g)).unwrap();
            // The guest's touched line came: all of its RAM but its image
            // and what lies below it.
            let touched = run.touched_mib.expect("no touched line");
            assert!((200..=256).contains(&touched), "{c}: {touched}");
            // Resident as the guest said, not preallocated.
            assert!(
                run.resident.bytes >= touched << 20,
                "{c}: {:?}",
                run.resident
            );
            assert!(run.seconds > 0.0);
        }
    }

    #[test]
    fn a_guest_that_never_touches_or_cannot_boot_is_an_error_in_bounded_time() {
        let Some(bin) = qemu_or_skip("a_guest_that_never_touches") else {
            return;
        };
        let c = case(Pages::FourK, Backing::Anonymous);
        // No touch=: the guest idles without the line; the wait ends.
        let t0 = Instant::now();
        let e = RunningQemu::start_with(&bin, c, 128, Some(&guest("", Duration::from_secs(3))))
            .err()
            .expect("a guest that touched nothing was taken for ready")
            .to_string();
        assert!(
            e.contains("did not say it touched its memory within 3s"),
            "{e}"
        );
        assert!(t0.elapsed() < Duration::from_secs(60));
        // A kernel that is no kernel: QEMU exits, and says why.
        let dir =
            std::env::temp_dir().join(format!("teravm-bench-nokernel-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let bogus = dir.join("kernel");
        std::fs::write(&bogus, b"not a kernel").unwrap();
        let g = GuestBoot {
            kernel: bogus,
            boot_args: "touch=all".into(),
            timeout: Duration::from_secs(60),
        };
        let e = RunningQemu::start_with(&bin, c, 128, Some(&g))
            .err()
            .expect("QEMU booted no kernel")
            .to_string();
        assert!(e.starts_with("cannot start qemu: "), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_guest_rows_boot_microvm_unpreallocated() {
        let b = backend_with(case(Pages::FourK, Backing::Memfd), 512, false).unwrap();
        assert_eq!(b.object, "memory-backend-memfd,id=ram,size=512M,share=on");
        let args = qemu_guest_args(
            &b,
            512,
            Path::new("/s/qmp.sock"),
            Path::new("/g/teravm-guest"),
            "touch=all",
        )
        .join(" ");
        assert!(args.contains("-machine microvm,"), "{args}");
        assert!(args.contains("-device i8042 -serial stdio"), "{args}");
        assert!(
            args.contains("-kernel /g/teravm-guest -append touch=all"),
            "{args}"
        );
        assert!(!args.contains("-S "), "{args}");
    }

    #[test]
    fn a_qemu_that_cannot_start_says_why() {
        let Some(bin) = qemu_or_skip("a_qemu_that_cannot_start_says_why") else {
            return;
        };
        // A backend of no size: QEMU refuses it and exits at once.
        let e = RunningQemu::start_with(&bin, case(Pages::FourK, Backing::Anonymous), 0, None)
            .err()
            .expect("QEMU started with no RAM")
            .to_string();
        assert!(e.starts_with("cannot start qemu: "), "{e}");
        assert!(e.contains("it said: "), "{e}");
    }
}
