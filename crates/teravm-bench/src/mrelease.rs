//! Killing a process that holds guest memory, timed from the kill until
//! `waitpid` returns: plain (`exit`, `vm-kill`), or with the parent reaping
//! the dying process's memory through `process_mrelease(pidfd, 0)` (Linux ≥
//! 5.15; `mrelease`, `vm-mrelease`), which frees in parallel with the
//! process's own exit.
//!
//! The two system calls have no libc wrapper: `pidfd_open` (434) and
//! `process_mrelease` (448) on x86-64, called through `libc::syscall`.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;
use std::process::Child;
use std::time::{Duration, Instant};

use crate::model::{BenchError, Stop};

/// How a killed process is reaped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reap {
    /// `waitpid` alone: the kernel frees the memory in the exiting process.
    Wait,
    /// `process_mrelease` from this process, then `waitpid`.
    Mrelease,
}

/// A pidfd: a file descriptor that refers to one process.
#[derive(Debug)]
pub struct PidFd(OwnedFd);

impl AsRawFd for PidFd {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.0.as_raw_fd()
    }
}

impl PidFd {
    /// `pidfd_open(pid, 0)`.
    pub fn open(pid: u32) -> io::Result<PidFd> {
        let pid =
            libc::pid_t::try_from(pid).map_err(|_| io::Error::from_raw_os_error(libc::ESRCH))?;
        // SAFETY: pidfd_open takes a pid and flags by value and returns a new
        // descriptor or -1; no memory is passed.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let fd = i32::try_from(fd).map_err(|_| io::Error::from_raw_os_error(libc::EBADF))?;
        // SAFETY: `fd` was just returned by pidfd_open and nothing else owns it.
        Ok(PidFd(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Waits up to `timeout` for the process to exit (the pidfd becomes
    /// readable); whether it did. It is not reaped: `waitpid` still follows.
    pub fn exited_within(&self, timeout: Duration) -> io::Result<bool> {
        let deadline = Instant::now() + timeout;
        loop {
            let mut pfd = libc::pollfd {
                fd: self.0.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            let left = deadline.saturating_duration_since(Instant::now());
            let ms = teravm::util::poll_timeout_ms(Some(left));
            // SAFETY: `pfd` is one valid pollfd that lives across the call.
            let rc = unsafe { libc::poll(&mut pfd, 1, ms) };
            match rc {
                0 => return Ok(false),
                n if n > 0 => return Ok(true),
                _ => {
                    let e = io::Error::last_os_error();
                    if e.kind() != io::ErrorKind::Interrupted {
                        return Err(e);
                    }
                }
            }
        }
    }

    /// `process_mrelease(pidfd, 0)`: frees the memory of a process that is
    /// being killed, in the calling thread.
    pub fn mrelease(&self) -> io::Result<()> {
        // SAFETY: process_mrelease takes a descriptor this struct owns and
        // flags by value; no memory is passed.
        let rc = unsafe { libc::syscall(libc::SYS_process_mrelease, self.0.as_raw_fd(), 0) };
        if rc < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    }
}

/// Whether this kernel has `pidfd_open` and `process_mrelease`: asked on
/// this very process, which is not dying, so a kernel that has them answers
/// `EINVAL` and one without answers `ENOSYS`. `Err` says why not, in a few
/// words.
pub fn available() -> Result<(), String> {
    let pidfd = PidFd::open(std::process::id()).map_err(|e| unavailable("pidfd_open", &e))?;
    match pidfd.mrelease() {
        Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => {
            Err(unavailable("process_mrelease", &e))
        }
        // EINVAL (we are not dying) or anything else: the call exists.
        _ => Ok(()),
    }
}

fn unavailable(call: &str, e: &io::Error) -> String {
    if e.raw_os_error() == Some(libc::ENOSYS) {
        format!("{call}: ENOSYS (Linux < 5.15)")
    } else {
        format!("{call}: {e}")
    }
}

/// Kills `child` with `SIGKILL` and reaps it as `reap` says; the time from
/// the kill until `waitpid` returned. For [`Reap::Mrelease`] the pidfd is
/// opened before the clock starts, as a process manager would hold one.
pub fn kill_and_reap(child: &mut Child, reap: Reap) -> Result<Duration, BenchError> {
    let pidfd = match reap {
        Reap::Wait => None,
        Reap::Mrelease => Some(
            PidFd::open(child.id())
                .map_err(|e| BenchError::Mrelease(format!("pidfd_open: {e}")))?,
        ),
    };
    let start = Instant::now();
    child
        .kill()
        .map_err(|e| BenchError::Child(format!("kill: {e}")))?;
    if let Some(pidfd) = &pidfd {
        release(pidfd)?;
    }
    let status = child
        .wait()
        .map_err(|e| BenchError::Child(format!("waitpid: {e}")))?;
    let elapsed = start.elapsed();
    if status.signal() != Some(libc::SIGKILL) {
        return Err(BenchError::Child(format!(
            "it ended with {status} instead of being killed"
        )));
    }
    Ok(elapsed)
}

/// `process_mrelease` on a process just sent `SIGKILL`, retried while the
/// kernel says `EAGAIN` (the reaper lost a race for the mm lock) or `EINTR`.
/// `ESRCH` means the kernel has already let go of the process (seen here on
/// 8 GiB of THP, which an exiting process frees in milliseconds): nothing is
/// left to reap, and `waitpid` follows as for any other run.
fn release(pidfd: &PidFd) -> Result<(), BenchError> {
    let mut tries = 0;
    loop {
        match pidfd.mrelease() {
            Ok(()) => return Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => return Ok(()),
            Err(e)
                if tries < 100
                    && matches!(e.raw_os_error(), Some(libc::EAGAIN) | Some(libc::EINTR)) =>
            {
                tries += 1;
            }
            Err(e) => return Err(BenchError::Mrelease(format!("process_mrelease: {e}"))),
        }
    }
}

/// Longest wait for a stopped VMM (teravm, QEMU, Firecracker) to exit.
pub const EXIT_TIMEOUT: Duration = Duration::from_secs(300);

/// The end of a timed peer stop, shared by the QEMU and Firecracker rows:
/// the stop was asked for at `start` (QMP `quit`, `SendCtrlAltDel`, or
/// SIGKILL); waits at most `limit` for the exit through `pidfd` (opened
/// before the clock), reaps `child`, and checks it ended as `stop` wants
/// (exit status 0, or SIGKILL). The time from `start` until `waitpid`
/// returned, or why not, in words for the caller's error.
pub fn timed_exit(
    child: &mut std::process::Child,
    pidfd: &PidFd,
    start: Instant,
    stop: Stop,
    limit: Duration,
) -> Result<Duration, String> {
    use std::os::unix::process::ExitStatusExt;
    match pidfd.exited_within(limit) {
        Ok(true) => {}
        Ok(false) => return Err(format!("it did not exit within {limit:?}")),
        Err(e) => return Err(format!("poll: {e}")),
    }
    let status = child.wait().map_err(|e| format!("waitpid: {e}"))?;
    let elapsed = start.elapsed();
    let expected = match stop {
        Stop::Graceful => status.success(),
        Stop::Kill => status.signal() == Some(libc::SIGKILL),
    };
    if !expected {
        return Err(format!("it ended with {status}"));
    }
    Ok(elapsed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::process::{Command, Stdio};

    fn sleeper() -> Child {
        // Holds some touched memory: the shell's own.
        let mut child = Command::new("/bin/sh")
            .args(["-c", "echo up; exec sleep 600"])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut up = [0u8; 3];
        child.stdout.take().unwrap().read_exact(&mut up).unwrap();
        child
    }

    #[test]
    fn a_killed_child_is_reaped_both_ways() {
        for reap in [Reap::Wait, Reap::Mrelease] {
            if reap == Reap::Mrelease && available().is_err() {
                eprintln!("SKIPPED mrelease: {}", available().unwrap_err());
                continue;
            }
            let mut child = sleeper();
            let elapsed = kill_and_reap(&mut child, reap).unwrap();
            assert!(elapsed > Duration::ZERO);
            let status = child.try_wait().unwrap().expect("reaped");
            assert_eq!(status.signal(), Some(libc::SIGKILL));
        }
    }

    #[test]
    fn mrelease_of_a_live_process_is_refused() {
        let Ok(()) = available() else {
            return;
        };
        let mut child = sleeper();
        let pidfd = PidFd::open(child.id()).unwrap();
        let e = pidfd.mrelease().unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EINVAL), "{e}");
        child.kill().unwrap();
        child.wait().unwrap();
    }

    #[test]
    fn a_pidfd_says_when_its_process_exits() {
        let mut child = sleeper();
        let pidfd = PidFd::open(child.id()).unwrap();
        assert!(!pidfd.exited_within(Duration::from_millis(20)).unwrap());
        child.kill().unwrap();
        assert!(pidfd.exited_within(Duration::from_secs(30)).unwrap());
        child.wait().unwrap();
    }

    #[test]
    fn a_pid_that_does_not_exist_has_no_pidfd() {
        assert!(PidFd::open(u32::MAX).is_err());
    }
}
