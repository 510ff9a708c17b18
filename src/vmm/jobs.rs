//! Jobs: the long phases of a microVM's life (`start`: memory, memslots,
//! populate, vCPUs; `reclaim`: stop, tear down, free) each run on a job
//! runner thread of their own, so the event loop never waits on them.
//!
//! The runners ([`JobRunner`]) are started once, before the main thread
//! installs its seccomp filter, and each installs its own role's filter
//! first thing: the main thread then starts no thread, so its filter need
//! not allow what the jobs do (filters stack onto the threads a thread
//! starts). A job signals its end from a drop guard, so the loop is woken
//! whether the job returns or panics (the panic is caught on the runner,
//! after what the job owned was dropped); the loop then takes the result
//! and moves to the next phase. A runner serves any number of jobs (a
//! start that failed may be retried).

use std::sync::mpsc::{channel, Receiver, Sender};

use vmm_sys_util::eventfd::EventFd;

use crate::seccomp::Role;

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
    /// The runner thread could not be spawned.
    #[error("cannot spawn the {job} thread: {source}")]
    Spawn {
        /// The job.
        job: &'static str,
        /// Why.
        source: std::io::Error,
    },
    /// The runner thread is gone (the job was dropped unrun).
    #[error("the {job} thread is not running")]
    Gone {
        /// The job.
        job: &'static str,
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

type Task = Box<dyn FnOnce() + Send>;

/// A long-lived thread that runs jobs one at a time under its role's filter.
#[derive(Debug)]
pub struct JobRunner {
    name: &'static str,
    tx: Sender<Task>,
}

impl JobRunner {
    /// Starts the runner thread `name`, which installs `role`'s filter.
    pub fn spawn(name: &'static str, role: Role) -> Result<JobRunner, JobError> {
        let (tx, rx) = channel::<Task>();
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                crate::seccomp::install_thread(role);
                while let Ok(task) = rx.recv() {
                    task();
                }
            })
            .map_err(|source| JobError::Spawn { job: name, source })?;
        Ok(JobRunner { name, tx })
    }

    /// Runs `work` on the runner, writing `done` when it ends. On error
    /// `work` is dropped unrun (with whatever it owns: guest memory unmaps
    /// itself, vCPUs stop).
    pub fn run<T: Send + 'static>(
        &self,
        done: &EventFd,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> Result<Job<T>, JobError> {
        let name = self.name;
        let guard = DoneGuard(
            done.try_clone()
                .map_err(|source| JobError::EventFd { job: name, source })?,
        );
        let (result_tx, result) = channel();
        let task: Task = Box::new(move || {
            // Declared first, so dropped last: after the result is sent.
            let _guard = guard;
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)).map_err(|panic| {
                format!(
                    "the {name} thread panicked: {}",
                    crate::util::panic_text(&*panic)
                )
            });
            let _ = result_tx.send(r);
        });
        self.tx
            .send(task)
            .map_err(|_| JobError::Gone { job: name })?;
        Ok(Job { name, result })
    }
}

/// A job on a runner.
#[derive(Debug)]
pub struct Job<T> {
    name: &'static str,
    result: Receiver<Result<T, String>>,
}

impl<T> Job<T> {
    /// The job's result, or what its panic said; `None` while it runs (a
    /// completion event that came early, or twice, takes nothing). Never
    /// blocks.
    pub fn try_join(&self) -> Option<Result<T, String>> {
        match self.result.try_recv() {
            Ok(r) => Some(r),
            Err(std::sync::mpsc::TryRecvError::Empty) => None,
            Err(std::sync::mpsc::TryRecvError::Disconnected) => Some(Err(format!(
                "the {} thread ended without a result",
                self.name
            ))),
        }
    }

    /// The job's result, waiting for it (tests, tools).
    pub fn join(self) -> Result<T, String> {
        self.result
            .recv()
            .unwrap_or_else(|_| Err(format!("the {} thread ended without a result", self.name)))
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
        evt.read().unwrap();
    }

    #[test]
    fn a_job_signals_its_end_and_returns() {
        let runner = JobRunner::spawn("test-job", Role::Reclaim).unwrap();
        let evt = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        let job = runner.run(&evt, || 42).unwrap();
        wait(&evt);
        assert_eq!(job.join(), Ok(42));
    }

    #[test]
    fn a_panicking_job_still_signals_its_end_and_the_runner_goes_on() {
        let runner = JobRunner::spawn("test-panic", Role::Reclaim).unwrap();
        let evt = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        let job = runner.run::<()>(&evt, || panic!("boom")).unwrap();
        wait(&evt);
        let err = job.join().unwrap_err();
        assert!(err.contains("test-panic") && err.contains("boom"), "{err}");
        let job = runner.run(&evt, || "again").unwrap();
        wait(&evt);
        assert_eq!(job.join(), Ok("again"));
    }
}
