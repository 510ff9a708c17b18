//! Jobs: the long phases of a microVM's life (`start`: memory, memslots,
//! populate, vCPUs; `reclaim`: stop, tear down, free) each run on a thread
//! of their own, so the event loop never waits on them. A job signals its
//! end from a drop guard, so the loop is woken whether the job returns or
//! panics; the loop then joins it (at once: the guard drops last) and moves
//! to the next phase.

use std::thread::JoinHandle;

use vmm_sys_util::eventfd::EventFd;

/// Errors of starting a job.
#[derive(Debug, thiserror::Error)]
pub enum JobError {
    /// The completion `EventFd` could not be cloned for the job.
    #[error("cannot clone the completion eventfd of the {job} job: {source}")]
    EventFd {
        /// The job.
        job: &'static str,
        /// Why.
        source: std::io::Error,
    },
    /// The thread could not be spawned.
    #[error("cannot spawn the {job} thread: {source}")]
    Spawn {
        /// The job.
        job: &'static str,
        /// Why.
        source: std::io::Error,
    },
}

/// Writes the completion event when dropped: on return and on unwind.
struct DoneGuard(EventFd);

impl Drop for DoneGuard {
    fn drop(&mut self) {
        if let Err(e) = self.0.write(1) {
            // Nothing else can wake the loop; say so loudly.
            log::error!("cannot signal the end of a job: {e}");
        }
    }
}

/// A job running on its own thread.
#[derive(Debug)]
pub struct Job<T> {
    name: &'static str,
    thread: JoinHandle<T>,
}

impl<T: Send + 'static> Job<T> {
    /// Runs `work` on a thread called `name`, writing `done` when it ends.
    /// On error `work` is dropped unrun (with whatever it owns: guest memory
    /// unmaps itself, vCPUs stop).
    pub fn spawn(
        name: &'static str,
        done: &EventFd,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> Result<Job<T>, JobError> {
        let guard = DoneGuard(
            done.try_clone()
                .map_err(|source| JobError::EventFd { job: name, source })?,
        );
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                // Declared first, so dropped last: after everything the work
                // owned, whether it returned or unwound.
                let _guard = guard;
                crate::seccomp::install_thread(crate::seccomp::Role::of_job(name));
                work()
            })
            .map_err(|source| JobError::Spawn { job: name, source })?;
        Ok(Job { name, thread })
    }

    /// Whether the job has ended (its completion event was written).
    pub fn is_finished(&self) -> bool {
        self.thread.is_finished()
    }

    /// The job's result, or what its panic said. Call it once the completion
    /// event was seen and [`Job::is_finished`] holds.
    pub fn join(self) -> Result<T, String> {
        self.thread.join().map_err(|panic| {
            let what = crate::util::panic_text(&*panic);
            format!("the {} thread panicked: {what}", self.name)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wait(evt: &EventFd) {
        let mut pfd = libc::pollfd {
            fd: std::os::fd::AsRawFd::as_raw_fd(evt),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd on our stack.
        let n = unsafe { libc::poll(&mut pfd, 1, 10_000) };
        assert_eq!(n, 1, "the job's end was never signalled");
    }

    #[test]
    fn a_job_signals_its_end_and_returns() {
        let evt = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        let job = Job::spawn("test-job", &evt, || 42).unwrap();
        wait(&evt);
        assert_eq!(job.join(), Ok(42));
    }

    #[test]
    fn a_panicking_job_still_signals_its_end() {
        let evt = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        let job = Job::<()>::spawn("test-panic", &evt, || panic!("boom")).unwrap();
        wait(&evt);
        let err = job.join().unwrap_err();
        assert!(err.contains("test-panic") && err.contains("boom"), "{err}");
    }
}
