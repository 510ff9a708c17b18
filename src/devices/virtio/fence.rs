//! The reset fence: what a vCPU waits for after it wrote 0 to a device's
//! Status while work the device started may still touch guest memory (the
//! balloon's discards in flight).
//!
//! Linux's virtio-mmio `vm_reset()` writes 0 to Status and returns; it
//! never polls Status for the reset to complete (virtio 1.2, 2.4 lets a
//! driver poll; Linux's does not). A kernel started by kexec after
//! `virtio_dev_shutdown` reuses every page at once, so a discard queued
//! before the reset must not run after the write returns. The device
//! counts its work ([`ResetFence::begin`], [`ResetFence::end`], from any
//! thread); the transport hands the fence to the bus when a reset leaves
//! work in flight, and the bus waits on it after it has let go of every
//! lock ([`crate::devices::bus::mmio::MmioBus::write`]), so the device's own
//! threads finish meanwhile. A shutdown cancels the wait
//! ([`ResetFence::cancel`]); a deadline bounds it.

use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// Longest a vCPU waits in one reset (past it the write returns, logged).
/// A real discard takes milliseconds; the worst the balloon can have in
/// flight under `slow-discard` (16 batches at 2 s a part) takes 16 s on two
/// workers a node, 32 s on one.
pub const RESET_WAIT: Duration = Duration::from_secs(30);

#[derive(Debug, Default)]
struct State {
    pending: usize,
    cancelled: bool,
}

/// Work of a device that a reset waits for.
#[derive(Debug, Default)]
pub struct ResetFence {
    state: Mutex<State>,
    changed: Condvar,
}

impl ResetFence {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// One more piece of work may touch guest memory.
    pub fn begin(&self) {
        self.lock().pending += 1;
    }

    /// One piece ended.
    pub fn end(&self) {
        let mut s = self.lock();
        s.pending = s.pending.saturating_sub(1);
        if s.pending == 0 {
            drop(s);
            self.changed.notify_all();
        }
    }

    /// Work in flight now.
    pub fn pending(&self) -> usize {
        self.lock().pending
    }

    /// Ends every wait now and later (the VM is stopping).
    pub fn cancel(&self) {
        self.lock().cancelled = true;
        self.changed.notify_all();
    }

    /// Waits until no work is in flight, the fence is cancelled or
    /// `deadline` passes; whether the work ended (or was cancelled).
    pub fn wait(&self, deadline: Instant) -> bool {
        let mut s = self.lock();
        loop {
            if s.pending == 0 || s.cancelled {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            s = self
                .changed
                .wait_timeout(s, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_wait_ends_when_the_work_ends_or_is_cancelled_and_never_past_its_deadline() {
        let f = Arc::new(ResetFence::default());
        assert!(f.wait(Instant::now()), "nothing in flight");
        f.begin();
        f.begin();
        assert_eq!(f.pending(), 2);
        let t = Instant::now();
        assert!(!f.wait(t + Duration::from_millis(20)));
        assert!(t.elapsed() >= Duration::from_millis(20));
        let ender = {
            let f = f.clone();
            std::thread::spawn(move || {
                f.end();
                f.end();
            })
        };
        assert!(f.wait(Instant::now() + Duration::from_secs(30)));
        ender.join().unwrap();
        assert_eq!(f.pending(), 0);
        f.end();
        assert_eq!(f.pending(), 0, "never below zero");
        f.begin();
        let canceller = {
            let f = f.clone();
            std::thread::spawn(move || f.cancel())
        };
        assert!(f.wait(Instant::now() + Duration::from_secs(30)));
        canceller.join().unwrap();
        assert!(f.wait(Instant::now()), "cancelled for good");
    }
}
