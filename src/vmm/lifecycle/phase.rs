//! The microVM's life as phases, and the one place where it moves between
//! them: `Configuring → Starting(job) → Running(MicroVm) → Reclaiming(job)
//! → Stopped`. Each phase owns what it needs (a running microVM cannot be
//! written without its vCPUs and memory); the long steps run as jobs, so
//! the event loop only ever moves between phases and never waits.

use std::sync::atomic::AtomicBool;
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::time::Instant;

use super::builder::{MicroVm, StartError, Started};
use super::report::ShutdownReport;
use crate::api::ActionResult;
use crate::memory::ReclaimState;
use crate::vmm::jobs::Job;
use crate::vmm::Vmm;

/// Why the microVM is shutting down.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ShutdownReason {
    /// The guest asked for a reset.
    GuestReset,
    /// SIGTERM, SIGINT or SIGHUP.
    Signal(i32),
    /// The API's `Shutdown` action.
    Api,
    /// The guest or its vCPU failed.
    GuestCrashed(String),
}

/// A start under way.
pub struct Starting {
    pub(super) job: Job<Result<Started, StartError>>,
    pub(super) cancel: Arc<AtomicBool>,
    /// `InstanceStart` replies, sent when the start ends.
    pub(super) waiters: Vec<Sender<ActionResult>>,
    /// A shutdown asked for during the start.
    pub(super) shutdown: Option<(ShutdownReason, Instant)>,
}

/// A snapshot being created: the job holds the paused microVM and hands
/// it back.
pub struct Snapshotting {
    pub(in crate::vmm) job: Job<super::snapshot::CreateOutcome>,
    /// The `PUT /snapshot/create` reply.
    pub(in crate::vmm) reply: Sender<ActionResult>,
    /// A Full create, not a Diff (for the latency metric).
    pub(in crate::vmm) full: bool,
    /// A shutdown asked for meanwhile, begun when the job hands the
    /// microVM back.
    pub(in crate::vmm) shutdown: Option<(ShutdownReason, Instant)>,
}

/// A shutdown under way.
pub struct Reclaiming {
    pub(super) job: Job<ShutdownReport>,
}

/// Where the microVM is in its life.
pub enum Phase {
    /// Being configured; waits for `InstanceStart`.
    Configuring,
    /// The `start` job builds it.
    Starting(Starting),
    /// vCPUs run.
    Running(Box<MicroVm>),
    /// The `start` job runner writes a snapshot of the paused microVM.
    Snapshotting(Snapshotting),
    /// The `reclaim` job stops and frees it.
    Reclaiming(Reclaiming),
    /// Memory freed; the process exits (after a linger, for API shutdowns).
    Stopped,
}

/// Where the microVM is in its life, as `GET /` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VmState {
    /// Configured (or not yet), waiting for `InstanceStart`.
    NotStarted,
    /// Building the microVM (memory, memslots, populate, vCPUs).
    Starting,
    /// vCPUs running.
    Running,
    /// vCPUs held out of the guest (`PATCH /vm`).
    Paused,
    /// Stopping the vCPUs and closing KVM.
    ShuttingDown,
    /// Freeing guest memory.
    Reclaiming,
    /// Memory freed; the process is about to exit.
    Stopped,
}

impl Phase {
    /// The `start` job, while starting.
    pub(super) fn start_job(&self) -> Option<&Job<Result<Started, StartError>>> {
        match self {
            Phase::Starting(s) => Some(&s.job),
            _ => None,
        }
    }

    /// The snapshot job, while snapshotting.
    pub(in crate::vmm) fn snapshot_job(&self) -> Option<&Job<super::snapshot::CreateOutcome>> {
        match self {
            Phase::Snapshotting(s) => Some(&s.job),
            _ => None,
        }
    }

    /// The `reclaim` job, while reclaiming.
    pub(super) fn reclaim_job(&self) -> Option<&Job<ShutdownReport>> {
        match self {
            Phase::Reclaiming(r) => Some(&r.job),
            _ => None,
        }
    }
}

impl VmState {
    /// The API's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            VmState::NotStarted => "Not started",
            VmState::Starting => "Starting",
            VmState::Running => "Running",
            VmState::Paused => "Paused",
            VmState::ShuttingDown => "Shutting down",
            VmState::Reclaiming => "Reclaiming",
            VmState::Stopped => "Stopped",
        }
    }
}

impl Vmm {
    /// The state `GET /` shows.
    pub(in crate::vmm) fn state(&self) -> VmState {
        match &self.phase {
            Phase::Configuring => VmState::NotStarted,
            Phase::Starting(_) => VmState::Starting,
            Phase::Running(m) if m.vcpus().is_some_and(|v| v.paused()) => VmState::Paused,
            Phase::Running(_) => VmState::Running,
            Phase::Snapshotting(_) => VmState::Paused,
            Phase::Reclaiming(_) if self.progress.snapshot().state == ReclaimState::Idle => {
                VmState::ShuttingDown
            }
            Phase::Reclaiming(_) => VmState::Reclaiming,
            Phase::Stopped => VmState::Stopped,
        }
    }

    /// The result of the job the phase awaits (`Some` once it ended), taken
    /// on its completion event. An event no job of this phase explains (a
    /// phase that awaits none, a job not ended: the fault
    /// `spurious-job-events`) is logged and ignored.
    pub(in crate::vmm) fn job_result<T>(
        &self,
        job: fn(&Phase) -> Option<&Job<T>>,
        what: &str,
    ) -> Option<Result<T, String>> {
        let result = job(&self.phase).and_then(Job::try_join);
        if result.is_none() {
            log::warn!(
                "a {what}-job completion event while {} with no result: ignored",
                self.state().as_str()
            );
        }
        result
    }
}
