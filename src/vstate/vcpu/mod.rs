//! vCPUs: one thread each (`vcpu0`, `vcpu1`, ...) running a `KVM_RUN` loop.
//!
//! Exits are handled by [`handle_exit`], a plain function over a `VcpuExit`
//! and the port I/O bus, so it is tested with made-up exits. A vCPU that must
//! end the VM (reset, crash, error) sends a [`VcpuEvent`] on an mpsc channel
//! and writes the VMM's `EventFd`. The VMM stops vCPUs with
//! [`VcpuControl::request_stop`] plus a kick: a real-time signal whose
//! handler sets `immediate_exit` in the thread's own `kvm_run`, so a signal
//! that lands just before `KVM_RUN` still makes it return at once.
//!
//! This file is the threads' life: [`VcpuHandle`] (spawn, kick, join with
//! a deadline), the group [`Vcpus`] (pause, resume, stop, joined on drop)
//! and the `KVM_RUN` loop. Beside it: `exit` (what an exit means),
//! `control` (the shared stop, wake and pause requests and the waits out
//! of the guest), `kick` (the signal and its handler) and `setup` (the
//! registers before the first entry).

mod control;
mod exit;
mod kick;
mod save;
mod setup;

use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use kvm_ioctls::VcpuFd;
use vmm_sys_util::eventfd::EventFd;
use vmm_sys_util::signal::Killable;

pub use control::VcpuControl;
pub use exit::{handle_exit, ExitAction, VcpuEvent};
pub use setup::{configure_vcpu, restore_vcpu, GuestEntry};

use crate::devices::Buses;
use crate::memory::GuestLease;
use exit::with_internal_details;
use kick::{install_kick_handler, kick_signal, KvmRunGuard};

/// Errors of vCPU setup.
#[derive(Debug, thiserror::Error)]
pub enum VcpuError {
    /// A register ioctl failed.
    #[error("vCPU {index}: {what} failed: {source}")]
    Setup {
        /// vCPU index.
        index: u8,
        /// Which ioctl.
        what: &'static str,
        /// KVM's error.
        source: kvm_ioctls::Error,
    },
    /// The kick signal handler could not be installed.
    #[error("cannot install the vCPU kick signal handler: {0}")]
    Signal(vmm_sys_util::errno::Error),
    /// A Linux vCPU could not be set up.
    #[error(transparent)]
    Linux(#[from] super::linux::cpu::CpuError),
    /// A snapshot's vCPU state could not be restored.
    #[error(transparent)]
    State(#[from] crate::vstate::snapshot::StateError),
    /// The thread could not be spawned.
    #[error("cannot spawn the thread of vCPU {index}: {source}")]
    Spawn {
        /// vCPU index.
        index: u8,
        /// The OS error.
        source: std::io::Error,
    },
}

/// A running vCPU thread.
pub struct VcpuHandle {
    index: u8,
    thread: Option<JoinHandle<()>>,
    /// Disconnected when the thread ends (its sender drops with it), so the
    /// VMM can wait for it with a deadline.
    ended: Receiver<()>,
}

impl VcpuHandle {
    /// Starts the thread `vcpu{index}` running `fd`.
    pub fn spawn(
        index: u8,
        fd: VcpuFd,
        bus: Arc<Buses>,
        control: Arc<VcpuControl>,
        events: Sender<VcpuEvent>,
        events_ready: EventFd,
        lease: GuestLease,
    ) -> Result<VcpuHandle, VcpuError> {
        install_kick_handler()?;
        let (ended_tx, ended) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name(format!("vcpu{index}"))
            .spawn(move || {
                crate::seccomp::install_thread(crate::seccomp::Role::Vcpu);
                let _ended = ended_tx;
                // Declared after `_ended`, so released before the VMM hears
                // that the thread ended: guest memory may then be unmapped.
                let _lease = lease;
                let run = std::panic::AssertUnwindSafe(|| run_loop(index, fd, &bus, &control));
                let event = std::panic::catch_unwind(run).unwrap_or_else(|_| {
                    Some(VcpuEvent::Crashed {
                        index,
                        reason: "the vCPU thread panicked".into(),
                    })
                });
                if let Some(event) = event {
                    log::debug!("vcpu{index}: {event:?}");
                    // The VMM may already be gone at process exit: nothing to tell.
                    let _ = events.send(event);
                    let _ = events_ready.write(1);
                }
            })
            .map_err(|source| VcpuError::Spawn { index, source })?;
        Ok(VcpuHandle {
            index,
            thread: Some(thread),
            ended,
        })
    }

    /// Interrupts `KVM_RUN` on this vCPU (after [`VcpuControl::request_stop`]).
    pub fn kick(&self) {
        if let Some(thread) = &self.thread {
            if !thread.is_finished() {
                if let Err(e) = thread.kill(kick_signal()) {
                    log::warn!("cannot kick vcpu{}: {e}", self.index);
                }
            }
        }
    }

    /// Waits for the thread until `deadline`.
    fn join_until(mut self, deadline: Instant) -> JoinOutcome {
        let left = deadline.saturating_duration_since(Instant::now());
        match self.ended.recv_timeout(left) {
            Err(RecvTimeoutError::Disconnected) => {}
            Ok(()) | Err(RecvTimeoutError::Timeout) => {
                log::error!(
                    "vcpu{} did not stop in time; leaving its thread behind",
                    self.index
                );
                return JoinOutcome::Stuck;
            }
        }
        match self.thread.take().map(JoinHandle::join) {
            Some(Err(_)) => {
                log::error!("vcpu{} panicked", self.index);
                JoinOutcome::Panicked
            }
            _ => JoinOutcome::Ended,
        }
    }
}

enum JoinOutcome {
    Ended,
    Panicked,
    Stuck,
}

/// How long stopping the vCPUs may take before the VMM goes on without the
/// ones that did not stop (a kicked vCPU leaves `KVM_RUN` in microseconds;
/// one that does not is stuck in the host kernel).
pub const VCPU_STOP_TIMEOUT: Duration = Duration::from_secs(2);

/// What stopping the vCPUs found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VcpuStopReport {
    /// vCPU threads that panicked.
    pub panicked: usize,
    /// vCPU threads that did not end before the deadline (left behind).
    pub stuck: usize,
}

/// A microVM's vCPU threads, stopped and joined (with a deadline) when
/// dropped: whatever path drops them, no vCPU outlives its group, and a
/// VMM that owns the group before the VM and its memory stops the
/// vCPUs before those go.
pub struct Vcpus {
    control: Arc<VcpuControl>,
    handles: Vec<VcpuHandle>,
}

impl Vcpus {
    /// An empty group sharing `control`.
    pub fn new(control: Arc<VcpuControl>) -> Self {
        Vcpus {
            control,
            handles: Vec::new(),
        }
    }

    /// Adds a started vCPU.
    pub fn push(&mut self, handle: VcpuHandle) {
        self.handles.push(handle);
    }

    /// How many vCPUs run.
    pub fn len(&self) -> usize {
        self.handles.len()
    }

    /// Whether the group has no vCPU.
    pub fn is_empty(&self) -> bool {
        self.handles.is_empty()
    }

    /// The stop and wake requests of the group.
    pub fn control(&self) -> &Arc<VcpuControl> {
        &self.control
    }

    /// Pauses every vCPU: each leaves `KVM_RUN` (kicked) and waits before
    /// entering it again. True once all are out of the guest within
    /// `timeout`. Idempotent.
    pub fn pause(&self, timeout: Duration) -> bool {
        self.control.pause_gate().set(true);
        self.control.kick_waits();
        for h in &self.handles {
            h.kick();
        }
        let live = self
            .handles
            .iter()
            .filter(|h| h.thread.as_ref().is_some_and(|t| !t.is_finished()))
            .count();
        self.control
            .pause_gate()
            .wait_out(live, Instant::now() + timeout)
    }

    /// Lets the vCPUs enter the guest again. Idempotent.
    pub fn resume(&self) {
        self.control.pause_gate().set(false);
    }

    /// Whether a pause is in force.
    pub fn paused(&self) -> bool {
        self.control.pause_gate().is_paused()
    }

    /// Stops every vCPU: request, kick, join, waiting at most `timeout` in
    /// all. Idempotent.
    pub fn stop(&mut self, timeout: Duration) -> VcpuStopReport {
        self.control.request_stop();
        for h in &self.handles {
            h.kick();
        }
        let deadline = Instant::now() + timeout;
        let mut report = VcpuStopReport::default();
        for h in self.handles.drain(..) {
            match h.join_until(deadline) {
                JoinOutcome::Ended => {}
                JoinOutcome::Panicked => report.panicked += 1,
                JoinOutcome::Stuck => report.stuck += 1,
            }
        }
        report
    }
}

impl Drop for Vcpus {
    fn drop(&mut self) {
        if !self.handles.is_empty() {
            self.stop(VCPU_STOP_TIMEOUT);
        }
    }
}

fn run_loop(index: u8, mut fd: VcpuFd, bus: &Buses, control: &VcpuControl) -> Option<VcpuEvent> {
    // Declared after `fd` is bound (a parameter), so it is dropped first.
    let _guard = KvmRunGuard::arm(&mut fd);
    let inject_panic = index == 0 && crate::faults::injected("vcpu-panic");
    let ignore_stop = index == 1 && crate::faults::injected(crate::faults::VCPU_IGNORES_STOP);
    let mut seen_wake = 0;
    control.watch_hub(bus.mmio.wake_hub());
    let event = loop {
        if control.stop_requested() && !ignore_stop {
            break None;
        }
        control.hold(index, &mut fd);
        if control.stop_requested() && !ignore_stop {
            break None;
        }
        match fd.run() {
            Ok(exit) => match handle_exit(index, exit, bus) {
                ExitAction::Continue if inject_panic => {
                    panic!("injected vCPU panic ({})", crate::faults::FAULT_INJECT_ENV)
                }
                ExitAction::Continue => {}
                ExitAction::Park => control.park(&mut seen_wake, Some((index, &mut fd))),
                ExitAction::WaitDevice { slot, timeout } => {
                    control.wait_device(bus.mmio.wake_hub(), slot, timeout);
                }
                ExitAction::Stop(event) => break Some(with_internal_details(&mut fd, event)),
            },
            Err(e) if e.errno() == libc::EINTR => fd.set_kvm_immediate_exit(0),
            Err(e) if e.errno() == libc::EAGAIN => {}
            Err(e) => {
                break Some(VcpuEvent::RunFailed {
                    index,
                    error: format!("KVM_RUN failed: {e}"),
                })
            }
        }
    };
    if ignore_stop {
        // The injected fault: a thread that never ends, holding its vCPU fd
        // (and so the VM and its memslots) and its lease on guest memory,
        // as one stuck in the host kernel would; the process exit ends it.
        log::warn!(
            "vcpu{index}: {}: never ending",
            crate::faults::VCPU_IGNORES_STOP
        );
        loop {
            std::thread::park();
        }
    }
    event
}

#[cfg(test)]
mod wait_tests;
