//! Holding the device threads still (a snapshot): the [`Gate`] every
//! device loop of a microVM waits at before each pass while it is closed.
//!
//! Closing it stops no pass that runs: the holder closes it, then waits
//! for the passes running then to end
//! ([`crate::devices::virtio::worker::PassWatch::wait_pass_end`]); from
//! then on no device thread touches its queues or guest memory until the
//! gate opens. A pass that waits here has not looked at its event yet (a
//! queue eventfd is read, the wake's pending queues taken, after the
//! wait), so nothing that came while closed is lost: it is served when the
//! gate opens.
//!
//! The wait is a condition variable (`futex`, which every device role
//! already allows).

use std::sync::{Condvar, Mutex, PoisonError};

/// Whether the device loops may run their passes.
#[derive(Debug, Default)]
pub struct Gate {
    state: Mutex<GateState>,
    opened: Condvar,
}

#[derive(Debug, Default)]
struct GateState {
    closed: bool,
    /// Opened for good (the devices stop): never waits again.
    gone: bool,
}

impl Gate {
    /// An open gate.
    pub fn new() -> Gate {
        Gate::default()
    }

    fn state(&self) -> std::sync::MutexGuard<'_, GateState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Closes it: passes that start from now on wait (unless it is gone).
    pub fn close(&self) {
        let mut s = self.state();
        if !s.gone {
            s.closed = true;
        }
    }

    /// Opens it: the passes waiting go on.
    pub fn open(&self) {
        self.state().closed = false;
        self.opened.notify_all();
    }

    /// Opens it for good (the device threads are being stopped: none may
    /// wait here for a holder that will not come back).
    pub fn open_for_good(&self) {
        {
            let mut s = self.state();
            s.closed = false;
            s.gone = true;
        }
        self.opened.notify_all();
    }

    /// Whether it is closed.
    pub fn is_closed(&self) -> bool {
        self.state().closed
    }

    /// Waits while it is closed (a device loop, before a pass).
    pub fn wait_open(&self) {
        let mut s = self.state();
        while s.closed {
            s = self.opened.wait(s).unwrap_or_else(PoisonError::into_inner);
        }
    }
}
