//! Saving the vCPUs' state on their own threads while paused: the VMM
//! posts a request in the shared [`SaveBoard`] (a generation and a result
//! slot per vCPU), the held or parked vCPU threads wake, read their state
//! with their own fd, answer into their slot and wait again; the VMM waits
//! for every answer with a deadline. A request the VMM gave up on is taken
//! down, and an answer to it is dropped (its generation is gone).

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use kvm_ioctls::VcpuFd;

use super::Vcpus;
use crate::vstate::snapshot::{complete_pending_io, StateError, VcpuState};

/// The request in force, if any, and its answers.
#[derive(Debug, Default)]
struct Board {
    /// Bumped with every request.
    generation: u64,
    request: Option<Request>,
}

#[derive(Debug)]
struct Request {
    msr_indices: Arc<[u32]>,
    /// By vCPU index: `None` until that vCPU answers.
    results: Vec<Option<Result<VcpuState, StateError>>>,
}

/// Where the VMM asks the vCPUs for their state and they answer.
#[derive(Debug, Default)]
pub(super) struct SaveBoard {
    board: Mutex<Board>,
    answered: Condvar,
}

impl SaveBoard {
    fn lock(&self) -> MutexGuard<'_, Board> {
        self.board.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether vCPU `index` has a request to answer.
    pub(super) fn pending(&self, index: u8) -> bool {
        self.lock().request.as_ref().is_some_and(|r| {
            r.results
                .get(usize::from(index))
                .is_some_and(Option::is_none)
        })
    }

    /// vCPU `index`: answers the request in force, if it has one, with its
    /// state read through `fd` (outside the lock), once its last exit is
    /// complete ([`complete_pending_io`]).
    pub(super) fn serve(&self, index: u8, fd: &mut VcpuFd) {
        let (generation, msr_indices) = {
            let board = self.lock();
            match &board.request {
                Some(r)
                    if r.results
                        .get(usize::from(index))
                        .is_some_and(Option::is_none) =>
                {
                    (board.generation, r.msr_indices.clone())
                }
                _ => return,
            }
        };
        let state =
            complete_pending_io(fd, index).and_then(|()| VcpuState::save(fd, index, &msr_indices));
        let mut board = self.lock();
        if board.generation == generation {
            if let Some(slot) = board
                .request
                .as_mut()
                .and_then(|r| r.results.get_mut(usize::from(index)))
            {
                *slot = Some(state);
            }
        }
        self.answered.notify_all();
    }

    /// Wakes the VMM waiting for answers (to see a stop).
    pub(super) fn wake(&self) {
        let _board = self.lock();
        self.answered.notify_all();
    }
}

impl Vcpus {
    /// Reads every vCPU's KVM state, on its own thread, in vCPU index
    /// order, with the MSRs of `msr_indices` (the host's list,
    /// [`crate::vstate::vm::KvmDevice::msr_index_list`]). Only while paused
    /// ([`Vcpus::pause`]); a vCPU that has not answered within `timeout` is
    /// an error naming it.
    pub fn save_states(
        &self,
        msr_indices: &[u32],
        timeout: Duration,
    ) -> Result<Vec<VcpuState>, StateError> {
        if !self.paused() {
            return Err(StateError::NotPaused);
        }
        if let Some(h) = self
            .handles
            .iter()
            .find(|h| h.thread.as_ref().is_none_or(|t| t.is_finished()))
        {
            return Err(StateError::Ended { index: h.index });
        }
        let mut indices: Vec<u8> = self.handles.iter().map(|h| h.index).collect();
        indices.sort_unstable();
        let slots = indices.last().map_or(0, |&i| usize::from(i) + 1);
        let save = &self.control.save;
        {
            let mut board = save.lock();
            if board.request.is_some() {
                return Err(StateError::SaveInProgress);
            }
            board.generation += 1;
            board.request = Some(Request {
                msr_indices: msr_indices.into(),
                results: (0..slots).map(|_| None).collect(),
            });
        }
        self.control.wake_for_save();
        let deadline = Instant::now() + timeout;
        let mut board = save.lock();
        let answered = |b: &Board| {
            b.request
                .as_ref()
                .is_some_and(|r| indices.iter().all(|&i| r.results[usize::from(i)].is_some()))
        };
        while !answered(&board) && !self.control.stop_requested() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            board = save
                .answered
                .wait_timeout(board, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        // Taken down whatever the outcome: a late answer finds no request.
        let mut results = board.request.take().map(|r| r.results).unwrap_or_default();
        drop(board);
        let missing: Vec<u8> = indices
            .iter()
            .copied()
            .filter(|&i| results[usize::from(i)].is_none())
            .collect();
        if !missing.is_empty() {
            if self.control.stop_requested() {
                return Err(StateError::Stopped);
            }
            return Err(StateError::NoAnswer {
                indices: missing,
                timeout,
            });
        }
        indices
            .iter()
            .map(|&i| results[usize::from(i)].take().expect("checked above"))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::super::kick::install_kick_handler;
    use super::super::{VcpuControl, VcpuHandle};
    use super::*;

    #[test]
    fn a_vcpu_that_does_not_answer_is_named_and_its_request_taken_down() {
        install_kick_handler().unwrap();
        let mut vcpus = Vcpus::new(Arc::new(VcpuControl::new()));
        // A "vCPU" thread that never reaches the hold (stuck elsewhere),
        // until told to end.
        let (release, stuck) = std::sync::mpsc::channel::<()>();
        let (ended_tx, ended) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            let _ended = ended_tx;
            let _ = stuck.recv();
        });
        vcpus.push(VcpuHandle {
            index: 0,
            thread: Some(thread),
            ended,
        });
        assert!(!vcpus.pause(Duration::from_millis(10)));
        match vcpus.save_states(&[], Duration::from_millis(50)) {
            Err(StateError::NoAnswer { indices, .. }) => assert_eq!(indices, [0]),
            other => panic!("{other:?}"),
        }
        // Nothing left for a late answer, and a new request may be posted.
        assert!(!vcpus.control.save.pending(0));
        assert!(vcpus.control.save.lock().request.is_none());
        release.send(()).unwrap();
        assert_eq!(vcpus.stop(Duration::from_secs(10)).stuck, 0);
    }
}
