//! Holding the device threads still (a snapshot): the [`Gate`] every
//! device loop of a microVM passes before each pass.
//!
//! Each pass enters the gate before it looks at its event and leaves it
//! when it ends ([`Gate::enter`]); while the gate is closed, a pass waits
//! at the entry. [`Gate::close`] closes it and waits (with a deadline)
//! until no pass is inside: from then on no device thread touches its
//! queues or guest memory until the gate opens. Entering and closing take
//! the one lock, so no pass slips in between a close and its wait. A pass
//! that waits has not looked at its event yet (a queue eventfd is read, the
//! wake's pending queues taken, after the entry), so nothing that came
//! while closed is lost: it is served when the gate opens.
//!
//! The waits are a condition variable (`futex`, which every device role
//! already allows).

use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

/// Whether the device loops may run their passes.
#[derive(Debug, Default)]
pub struct Gate {
    state: Mutex<GateState>,
    changed: Condvar,
}

#[derive(Debug, Default)]
struct GateState {
    closed: bool,
    /// Opened for good (the devices stop): never waits again.
    gone: bool,
    /// Passes inside now.
    inside: usize,
}

/// A pass inside the gate; it leaves when this is dropped.
#[derive(Debug)]
pub struct Inside<'a>(&'a Gate);

impl Drop for Inside<'_> {
    fn drop(&mut self) {
        let mut s = self.0.state();
        s.inside -= 1;
        if s.inside == 0 {
            self.0.changed.notify_all();
        }
    }
}

impl Gate {
    /// An open gate.
    pub fn new() -> Gate {
        Gate::default()
    }

    fn state(&self) -> MutexGuard<'_, GateState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A pass enters: waits while the gate is closed, then is inside until
    /// the returned guard is dropped.
    pub fn enter(&self) -> Inside<'_> {
        let mut s = self.state();
        while s.closed {
            s = self.changed.wait(s).unwrap_or_else(PoisonError::into_inner);
        }
        s.inside += 1;
        Inside(self)
    }

    /// Closes it (unless it is gone) and waits until no pass is inside, at
    /// most until `deadline`; false if one still was then (the gate stays
    /// closed: [`Gate::open`] it).
    pub fn close(&self, deadline: Instant) -> bool {
        let mut s = self.state();
        if s.gone {
            return true;
        }
        s.closed = true;
        while s.inside > 0 {
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
        true
    }

    /// Opens it: the passes waiting go on.
    pub fn open(&self) {
        self.state().closed = false;
        self.changed.notify_all();
    }

    /// Opens it for good (the device threads are being stopped: none may
    /// wait here for a holder that will not come back).
    pub fn open_for_good(&self) {
        {
            let mut s = self.state();
            s.closed = false;
            s.gone = true;
        }
        self.changed.notify_all();
    }

    /// Whether it is closed.
    pub fn is_closed(&self) -> bool {
        self.state().closed
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_close_waits_for_the_pass_inside_and_holds_the_next_at_the_entry() {
        let gate = Arc::new(Gate::new());
        let inside = gate.enter();
        assert!(
            !gate.close(Instant::now() + Duration::from_millis(20)),
            "closed with a pass inside"
        );
        let (tx, rx) = std::sync::mpsc::channel();
        let g = gate.clone();
        let next = std::thread::spawn(move || {
            let _inside = g.enter();
            tx.send(()).unwrap();
        });
        drop(inside);
        assert!(gate.close(Instant::now() + Duration::from_secs(10)));
        assert!(
            rx.recv_timeout(Duration::from_millis(50)).is_err(),
            "a pass entered a closed gate"
        );
        gate.open();
        rx.recv_timeout(Duration::from_secs(10)).unwrap();
        next.join().unwrap();
        gate.open_for_good();
        assert!(gate.close(Instant::now()));
        assert!(!gate.is_closed());
        drop(gate.enter());
    }
}
