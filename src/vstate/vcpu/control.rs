//! The stop, wake and pause requests the VMM and every vCPU thread share
//! ([`VcpuControl`]), and the waits a vCPU makes out of the guest: parked
//! (`hlt`, the firmware's park port) or on a device (the wait port).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use kvm_ioctls::VcpuFd;

use super::save::SaveBoard;
use crate::devices::{WaitEnd, WakeHub};
use crate::vstate::pause::PauseGate;

/// Stop and wake requests shared by the VMM and all vCPU threads.
#[derive(Debug, Default)]
pub struct VcpuControl {
    stop: AtomicBool,
    wake_generation: Mutex<u64>,
    wake: Condvar,
    /// `PATCH /vm` Paused / Resumed.
    pause: PauseGate,
    /// The wake hub the vCPUs wait on (port 0xf0c), kicked with every
    /// stop, pause and wake; set by the first vCPU that runs.
    hub: Mutex<Option<Arc<WakeHub>>>,
    /// Requests for the vCPUs' state (snapshots), answered while paused.
    pub(super) save: SaveBoard,
}

impl VcpuControl {
    /// A control with nothing requested.
    pub fn new() -> Self {
        Self::default()
    }

    /// Asks every vCPU to stop; parked ones return at once. Kick the running
    /// ones with [`super::VcpuHandle::kick`].
    pub fn request_stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        {
            let _guard = self
                .wake_generation
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            self.wake.notify_all();
        }
        self.pause.wake();
        self.save.wake();
        self.kick_waits();
    }

    /// Wakes the held and parked vCPUs to answer a save request (without a
    /// wake a parked vCPU would take as its devices' news).
    pub(super) fn wake_for_save(&self) {
        {
            let _guard = self
                .wake_generation
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            self.wake.notify_all();
        }
        self.pause.wake();
    }

    /// vCPU `index` (its `fd`): held while paused, answering save requests.
    pub(super) fn hold(&self, index: u8, fd: &mut VcpuFd) {
        self.pause.hold_serving(
            || self.stop_requested(),
            || self.save.pending(index),
            || self.save.serve(index, fd),
        );
    }

    /// Ends the device waits in progress (they look at the flags again).
    pub(super) fn kick_waits(&self) {
        if let Some(hub) = self.hub.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
            hub.kick();
        }
    }

    /// The wake hub the vCPUs wait on: kicked by stop, pause and wake.
    pub(super) fn watch_hub(&self, hub: &Arc<WakeHub>) {
        let mut h = self.hub.lock().unwrap_or_else(|p| p.into_inner());
        if h.is_none() {
            *h = Some(hub.clone());
        }
    }

    /// Sleeps until the device in `slot` interrupts, `timeout`, or a stop,
    /// pause or wake (the firmware's wait port). Out of the guest meanwhile,
    /// as a parked vCPU is. The hub must be the one [`Self::watch_hub`] set.
    pub(super) fn wait_device(&self, hub: &WakeHub, slot: u16, timeout: Duration) -> WaitEnd {
        let generation = *self
            .wake_generation
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let woken = || {
            self.stop_requested()
                || self.pause.is_paused()
                || *self
                    .wake_generation
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    != generation
        };
        self.pause.out_of_guest(true);
        let end = hub.wait(usize::from(slot), timeout, woken);
        self.pause.out_of_guest(false);
        end
    }

    /// The pause gate the vCPUs wait at.
    pub fn pause_gate(&self) -> &PauseGate {
        &self.pause
    }

    /// Whether a stop was requested.
    pub fn stop_requested(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    /// Wakes parked vCPUs so they look at their devices again (e.g. after a
    /// Ctrl-Alt-Del was queued).
    pub fn wake_all(&self) {
        let mut generation = self
            .wake_generation
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        *generation += 1;
        self.wake.notify_all();
        drop(generation);
        self.kick_waits();
    }

    /// Parks until a wake this vCPU has not seen yet (`seen` is the wake
    /// generation it saw last, updated here) or a stop. A wake that came
    /// while the vCPU was running (e.g. a Ctrl-Alt-Del sent while the
    /// firmware was busy) makes the next park return at once, so the guest
    /// looks at its devices again instead of sleeping on a lost wakeup.
    /// With `vcpu` (its index and fd), a parked vCPU answers save requests
    /// and parks again.
    pub(super) fn park(&self, seen: &mut u64, mut vcpu: Option<(u8, &mut VcpuFd)>) {
        self.pause.out_of_guest(true);
        let mut generation = self
            .wake_generation
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        while !self.stop_requested() && *generation == *seen {
            if let Some((index, fd)) = vcpu.as_mut().filter(|(index, _)| self.save.pending(*index))
            {
                drop(generation);
                self.save.serve(*index, fd);
                generation = self
                    .wake_generation
                    .lock()
                    .unwrap_or_else(|p| p.into_inner());
                continue;
            }
            generation = self
                .wake
                .wait(generation)
                .unwrap_or_else(|p| p.into_inner());
        }
        *seen = *generation;
        drop(generation);
        self.pause.out_of_guest(false);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

    /// Spawns `f` on a thread that first sends its tid, and returns once
    /// that thread is asleep in the kernel (state `S` in
    /// `/proc/self/task/<tid>/stat`): blocked in `park`, the only thing it
    /// can sleep in. Panics if the thread ends first (a park that returned
    /// without a wake or stop) or is not asleep within 10 s.
    fn spawn_parked<T: Send + 'static>(
        f: impl FnOnce() -> T + Send + 'static,
    ) -> std::thread::JoinHandle<T> {
        let (tx, rx) = std::sync::mpsc::channel();
        let t = std::thread::spawn(move || {
            // SAFETY: gettid has no preconditions.
            tx.send(unsafe { libc::gettid() }).unwrap();
            f()
        });
        let tid = rx.recv().unwrap();
        let stat = format!("/proc/self/task/{tid}/stat");
        let deadline = Instant::now() + std::time::Duration::from_secs(10);
        loop {
            assert!(!t.is_finished(), "park returned without a wake or a stop");
            let state = std::fs::read_to_string(&stat)
                .ok()
                .and_then(|s| s.rsplit_once(") ")?.1.chars().next());
            if state == Some('S') {
                // Asleep, and still not returned.
                assert!(!t.is_finished(), "park returned without a wake or a stop");
                return t;
            }
            assert!(
                Instant::now() < deadline,
                "the thread never parked ({state:?})"
            );
            std::thread::yield_now();
        }
    }

    #[test]
    fn park_returns_on_wake_and_stop() {
        let control = Arc::new(VcpuControl::new());
        let c = control.clone();
        // Parked with no wake: it stays parked until the wake.
        let t = spawn_parked(move || {
            let mut seen = 0;
            c.park(&mut seen, None);
            seen
        });
        control.wake_all();
        assert_eq!(t.join().unwrap(), 1);
        // Parked again after that wake, it stays parked until the stop,
        // after which a park returns at once.
        let c = control.clone();
        let t = spawn_parked(move || {
            let mut seen = 1;
            c.park(&mut seen, None);
            c.park(&mut seen, None);
        });
        control.request_stop();
        t.join().unwrap();
        assert!(control.stop_requested());
    }

    #[test]
    fn a_wake_before_the_park_is_not_lost() {
        let control = VcpuControl::new();
        let mut seen = 0;
        // Woken while running (e.g. Ctrl-Alt-Del while the firmware was busy).
        control.wake_all();
        control.park(&mut seen, None); // returns at once
        assert_eq!(seen, 1);
        control.wake_all();
        control.wake_all();
        control.park(&mut seen, None);
        assert_eq!(seen, 3);
    }
}
