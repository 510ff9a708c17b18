//! The QEMU rows of `--peers` (`qemu-quit`, `qemu-kill`): a real
//! `qemu-system-x86_64` with KVM, a paused q35 guest (`-S`: no vCPU ever
//! runs, so no guest page tables are built) whose RAM is one memory backend
//! preallocated by QEMU itself (`prealloc=on`), stopped with QMP `quit` or
//! `SIGKILL` and timed from the request until `waitpid` returns.
//!
//! The bench listens on a Unix socket in a fresh temp dir and QEMU connects
//! to it as a QMP client (`-chardev socket,...,server=off`), so that no one
//! polls for a socket to appear: the bench waits in `poll` for QEMU's
//! connection or its exit (a pidfd), then for QMP's greeting, which QEMU
//! sends once its main loop runs, after the preallocation. Then
//! `query-status` must say the guest is paused, and QEMU's resident size
//! (`/proc/<pid>/status`, `smaps_rollup`) must cover the guest RAM before
//! the clock starts. QEMU's stderr goes to a file in the temp dir, quoted
//! when it fails. Everything runs on the bench's main thread.

use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use teravm::config::Backing;

use crate::model::{Case, Pages, PeerRun, Resident, Stop};
use crate::mrelease::PidFd;
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
    /// QEMU did not hold all of its guest RAM when the clock was to start.
    #[error("qemu holds {resident_mib} MiB resident, less than its {size_mib} MiB of guest RAM")]
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
/// Longest wait for QEMU to exit once stopped.
const EXIT_TIMEOUT: Duration = Duration::from_secs(300);

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
    let object = match case.backing {
        Backing::Anonymous => format!("memory-backend-ram,id=ram,size={size_mib}M,prealloc=on"),
        Backing::Memfd => {
            format!("memory-backend-memfd,id=ram,size={size_mib}M,share=on,prealloc=on")
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

/// A QEMU the bench started, its guest RAM resident, QMP negotiated.
pub struct RunningQemu {
    child: Child,
    qmp: Qmp,
    dir: PathBuf,
    /// What it held when it was ready.
    pub resident: Resident,
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
    /// Starts `bin` with `size_mib` of guest RAM for `case` and waits until
    /// QMP answers, the guest is paused and all of its RAM is resident.
    pub fn start(bin: &Path, case: Case, size_mib: u64) -> Result<RunningQemu, QemuError> {
        let backend = backend(case, size_mib).map_err(|why| QemuError::Start {
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
        command
            .args(qemu_args(&backend, size_mib, &sock))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr);
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
        let ready = (|| {
            let pidfd =
                PidFd::open(child.id()).map_err(|e| start_err(format!("pidfd_open: {e}"), &dir))?;
            let stream = accept_unless_exited(&listener, &pidfd, CONNECT_TIMEOUT)
                .map_err(|why| start_err(why, &dir))?;
            let mut qmp = Qmp::handshake(stream, GREETING_TIMEOUT, REPLY_TIMEOUT)
                .map_err(|e| start_err(e.to_string(), &dir))?;
            let status = qmp.execute("query-status")?;
            if status["running"] != false {
                return Err(start_err(
                    format!("the guest is not paused: {status}"),
                    &dir,
                ));
            }
            let resident = resident_of(child.id())
                .ok_or_else(|| start_err("its /proc files cannot be read", &dir))?;
            if !covers(&resident, size_mib << 20) {
                return Err(QemuError::NotResident {
                    resident_mib: resident.bytes >> 20,
                    size_mib,
                });
            }
            Ok((qmp, resident))
        })();
        match ready {
            Ok((qmp, resident)) => Ok(RunningQemu {
                child,
                qmp,
                dir,
                resident,
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
        match pidfd.exited_within(EXIT_TIMEOUT) {
            Ok(true) => {}
            Ok(false) => return Err(failed(format!("it did not exit within {EXIT_TIMEOUT:?}"))),
            Err(e) => return Err(failed(format!("poll: {e}"))),
        }
        let status = self
            .child
            .wait()
            .map_err(|e| failed(format!("waitpid: {e}")))?;
        let elapsed = start.elapsed();
        let expected = match stop {
            Stop::Graceful => status.success(),
            Stop::Kill => status.signal() == Some(libc::SIGKILL),
        };
        if !expected {
            return Err(failed(format!("it ended with {status}")));
        }
        Ok(elapsed)
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

/// One timed run of a QEMU row.
pub fn measure(bin: &Path, stop: Stop, case: Case, size_mib: u64) -> Result<PeerRun, QemuError> {
    let qemu = RunningQemu::start(bin, case, size_mib)?;
    let resident = qemu.resident;
    let elapsed = qemu.stop(stop)?;
    Ok(PeerRun {
        seconds: elapsed.as_secs_f64(),
        resident,
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
            let run = measure(&bin, stop, c, 256).unwrap();
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

    #[test]
    fn a_qemu_that_cannot_start_says_why() {
        let Some(bin) = qemu_or_skip("a_qemu_that_cannot_start_says_why") else {
            return;
        };
        // A backend of no size: QEMU refuses it and exits at once.
        let e = RunningQemu::start(&bin, case(Pages::FourK, Backing::Anonymous), 0)
            .err()
            .expect("QEMU started with no RAM")
            .to_string();
        assert!(e.starts_with("cannot start qemu: "), "{e}");
        assert!(e.contains("it said: "), "{e}");
    }
}
