//! Pausing the vCPUs (`PATCH /vm {"state": "Paused"}`), as Firecracker
//! pauses them: each vCPU leaves `KVM_RUN` (kicked with the same signal that
//! stops it) and is held before it enters again, until resumed or stopped.
//! The VMM answers the pause once every vCPU is out of the guest: held
//! here, or parked (a parked vCPU, waiting for its devices, runs no guest
//! code either, and one woken while paused is held before `KVM_RUN`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Instant;

/// The pause flag and the count of vCPUs out of the guest.
#[derive(Debug, Default)]
pub struct PauseGate {
    paused: AtomicBool,
    /// vCPUs held by a pause or parked.
    out: Mutex<usize>,
    changed: Condvar,
}

impl PauseGate {
    fn lock(&self) -> MutexGuard<'_, usize> {
        self.out.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether a pause is in force.
    pub fn is_paused(&self) -> bool {
        self.paused.load(Ordering::SeqCst)
    }

    /// Sets or lifts the pause and wakes the vCPUs that wait on it.
    pub fn set(&self, paused: bool) {
        self.paused.store(paused, Ordering::SeqCst);
        let _out = self.lock();
        self.changed.notify_all();
    }

    /// Wakes the held vCPUs to look at `stop` again.
    pub fn wake(&self) {
        let _out = self.lock();
        self.changed.notify_all();
    }

    /// A vCPU thread: while paused and `stop` is false, waits here.
    pub fn hold(&self, stop: impl Fn() -> bool) {
        self.hold_serving(stop, || false, || {});
    }

    /// As [`Self::hold`], and while held, runs `serve` whenever `pending`
    /// (checked under the gate's lock, so a request posted before a
    /// [`Self::wake`] is not missed) says there is work: a snapshot's
    /// request for the vCPU's state. The vCPU stays counted out of the
    /// guest meanwhile.
    pub fn hold_serving(
        &self,
        stop: impl Fn() -> bool,
        pending: impl Fn() -> bool,
        mut serve: impl FnMut(),
    ) {
        if !self.is_paused() {
            return;
        }
        let mut out = self.lock();
        *out += 1;
        self.changed.notify_all();
        while self.is_paused() && !stop() {
            if pending() {
                drop(out);
                serve();
                out = self.lock();
                continue;
            }
            out = self.changed.wait(out).unwrap_or_else(|p| p.into_inner());
        }
        *out -= 1;
    }

    /// A vCPU thread leaves the guest for a while (parks), or comes back.
    pub fn out_of_guest(&self, out_now: bool) {
        let mut out = self.lock();
        if out_now {
            *out += 1;
        } else {
            *out = out.saturating_sub(1);
        }
        self.changed.notify_all();
    }

    /// The VMM: waits until `n` vCPUs are out of the guest, or `deadline`.
    pub fn wait_out(&self, n: usize, deadline: Instant) -> bool {
        let mut out = self.lock();
        while *out < n {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            out = self
                .changed
                .wait_timeout(out, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn held_until_resumed_or_stopped() {
        let gate = Arc::new(PauseGate::default());
        let stop = Arc::new(AtomicBool::new(false));
        let passed = Arc::new(AtomicUsize::new(0));
        gate.set(true);
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let (gate, stop, passed) = (gate.clone(), stop.clone(), passed.clone());
                std::thread::spawn(move || {
                    gate.hold(|| stop.load(Ordering::SeqCst));
                    passed.fetch_add(1, Ordering::SeqCst);
                })
            })
            .collect();
        assert!(gate.wait_out(2, Instant::now() + Duration::from_secs(10)));
        assert_eq!(passed.load(Ordering::SeqCst), 0, "held while paused");
        assert!(!gate.wait_out(3, Instant::now() + Duration::from_millis(20)));
        gate.set(false);
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(passed.load(Ordering::SeqCst), 2);
        // A stop releases a held vCPU too.
        gate.set(true);
        let (g, s) = (gate.clone(), stop.clone());
        let t = std::thread::spawn(move || g.hold(|| s.load(Ordering::SeqCst)));
        assert!(gate.wait_out(1, Instant::now() + Duration::from_secs(10)));
        stop.store(true, Ordering::SeqCst);
        gate.wake();
        t.join().unwrap();
        // Not paused: no wait at all.
        gate.set(false);
        gate.hold(|| false);
    }
}
