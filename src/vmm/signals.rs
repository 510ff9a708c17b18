//! SIGTERM, SIGINT and SIGHUP as events: blocked in every thread (the mask
//! is set on the main thread before any other thread is spawned, and
//! inherited) and read from a `signalfd` on the event loop. All three take
//! the same path: stop the guest, reclaim, print the summary, exit 0
//! (flintlock stops a Firecracker VM with SIGHUP).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// Errors of signal setup and reading.
#[derive(Debug, thiserror::Error)]
pub enum SignalError {
    /// `pthread_sigmask` failed.
    #[error("cannot block SIGTERM, SIGINT and SIGHUP: {0}")]
    Block(io::Error),
    /// `signalfd` failed.
    #[error("cannot create a signalfd: {0}")]
    Create(io::Error),
}

/// A non-blocking signalfd for SIGTERM, SIGINT and SIGHUP.
#[derive(Debug)]
pub struct ShutdownSignals {
    fd: OwnedFd,
}

fn shutdown_set() -> libc::sigset_t {
    // SAFETY: sigemptyset initialises the set it is given; the set is a
    // plain value on our stack.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGHUP);
        set
    }
}

/// Blocks SIGTERM, SIGINT and SIGHUP in the calling thread and so in every
/// thread it starts afterwards: the first thing `main` does, before any
/// thread exists (a thread without the mask would take the signal's
/// default action, ending the process without a reclaim). What arrives
/// meanwhile stays pending for [`ShutdownSignals`].
pub fn block() -> Result<(), SignalError> {
    let set = shutdown_set();
    // SAFETY: `set` is a valid, initialised sigset; the old mask is not wanted.
    let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    if rc != 0 {
        return Err(SignalError::Block(io::Error::from_raw_os_error(rc)));
    }
    Ok(())
}

impl ShutdownSignals {
    /// Blocks SIGTERM, SIGINT and SIGHUP in the calling thread (and so in every
    /// thread it spawns afterwards) and opens a signalfd for them. Call it
    /// before spawning any thread.
    pub fn new() -> Result<ShutdownSignals, SignalError> {
        block()?;
        let set = shutdown_set();
        // SAFETY: -1 asks for a new fd; `set` is valid; the result is checked.
        let fd = unsafe { libc::signalfd(-1, &set, libc::SFD_NONBLOCK | libc::SFD_CLOEXEC) };
        if fd < 0 {
            return Err(SignalError::Create(io::Error::last_os_error()));
        }
        // SAFETY: `fd` is a new descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(ShutdownSignals { fd })
    }

    /// The next pending signal's number, if any (counted in the metrics).
    pub fn read(&self) -> Option<i32> {
        // SAFETY: signalfd_siginfo is plain data; zeroed is a valid value.
        let mut info: libc::signalfd_siginfo = unsafe { std::mem::zeroed() };
        let size = std::mem::size_of::<libc::signalfd_siginfo>();
        // SAFETY: we read at most `size` bytes into `info`, which has that size.
        let n = unsafe {
            libc::read(
                self.fd.as_raw_fd(),
                (&mut info as *mut libc::signalfd_siginfo).cast(),
                size,
            )
        };
        let signo = (n == size as isize).then_some(info.ssi_signo as i32)?;
        crate::metrics::record_signal(signo);
        Some(signo)
    }
}

impl AsRawFd for ShutdownSignals {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// The name of a signal, for log lines.
pub fn signal_name(signo: i32) -> &'static str {
    match signo {
        libc::SIGTERM => "SIGTERM",
        libc::SIGINT => "SIGINT",
        libc::SIGHUP => "SIGHUP",
        _ => "a signal",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sighup_is_a_shutdown_signal() {
        let set = shutdown_set();
        for signo in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
            // SAFETY: `set` is an initialised sigset.
            assert_eq!(unsafe { libc::sigismember(&set, signo) }, 1, "{signo}");
        }
        assert_eq!(signal_name(libc::SIGHUP), "SIGHUP");
    }
}
