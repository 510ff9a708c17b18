//! The wake hub: what lets a vCPU thread sleep until a virtio device
//! interrupts, standing in for `sti; hlt` of a Linux vCPU with KVM's
//! in-kernel irqchip.
//!
//! teravm's firmware (and the test guest) run at CPL3 without an irqchip
//! and cannot halt; they wait for a device through the firmware port
//! 0xf0c ([`super::firmware_ports`]). The vCPU thread then waits here, on one
//! Mutex + Condvar per VM, until the device's `InterruptStatus` is non-zero
//! (a used-buffer or config-change interrupt the guest has not
//! acknowledged), a timeout, or a kick ([`WakeHub::kick`]: a stop, a pause,
//! a Ctrl-Alt-Del). Each transport's [`IrqTrigger`] notifies the hub right
//! after it sets the status bit ([`WakeHub::notify`]); the notification
//! costs an atomic load when no vCPU waits.
//!
//! The hub knows each slot's `InterruptStatus` (registered by the device
//! manager as it attaches the transports, `IrqTrigger::wake_on`, which
//! calls [`WakeHub::watch`]); it holds no device and no guest memory.
//!
//! [`IrqTrigger`]: super::virtio::IrqTrigger

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// How a wait ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitEnd {
    /// The device's `InterruptStatus` was non-zero (at once or after a sleep).
    Interrupt,
    /// The slot has no device: returned at once.
    NoDevice,
    /// The timeout passed.
    TimedOut,
    /// A kick (stop, pause, wake) or the caller's `cancel` ended it.
    Kicked,
}

/// Counts of the waits (for tests and the logs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WaitStats {
    /// Waits asked for.
    pub waits: u64,
    /// Of them, ended by the device's interrupt after sleeping.
    pub woken: u64,
    /// Of them, returned at once (status already set, or no device).
    pub immediate: u64,
    /// Of them, ended by the timeout.
    pub timed_out: u64,
}

/// One VM's wake hub.
#[derive(Debug, Default)]
pub struct WakeHub {
    /// Bumped by every kick; waiters also sleep on it.
    kicks: Mutex<u64>,
    changed: Condvar,
    /// vCPUs inside [`WakeHub::wait`]: a notification with none skips the lock.
    waiters: AtomicUsize,
    /// Each slot's `InterruptStatus`, by slot index.
    slots: Mutex<Vec<Option<Arc<AtomicU32>>>>,
    waits: AtomicU64,
    woken: AtomicU64,
    immediate: AtomicU64,
    timed_out: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl WakeHub {
    /// A hub with no slot.
    pub fn new() -> Self {
        Self::default()
    }

    /// Lets vCPUs wait on `status`, the `InterruptStatus` of the transport
    /// in slot `slot` (whose interrupt then notifies this hub).
    pub fn watch(&self, slot: usize, status: Arc<AtomicU32>) {
        let mut slots = lock(&self.slots);
        if slots.len() <= slot {
            slots.resize(slot + 1, None);
        }
        slots[slot] = Some(status);
    }

    /// A device set an `InterruptStatus` bit: wakes the waiting vCPUs to
    /// look at their devices' status. Called after the bit is set.
    pub fn notify(&self) {
        // SeqCst pairs with the waiter's increment and status check: either
        // this sees the waiter, or the waiter sees the bit.
        if self.waiters.load(Ordering::SeqCst) == 0 {
            return;
        }
        let _kicks = lock(&self.kicks);
        self.changed.notify_all();
    }

    /// Ends every wait in progress (a stop, a pause, a wake of the vCPUs):
    /// the vCPUs go back to their loop and look at their flags.
    pub fn kick(&self) {
        let mut kicks = lock(&self.kicks);
        *kicks += 1;
        self.changed.notify_all();
    }

    /// Sleeps until slot `slot`'s `InterruptStatus` is non-zero, `timeout`
    /// passes, a [`WakeHub::kick`] comes or `cancel` is true (it is checked
    /// under the hub's lock, so a kick after the flag it reads was set is
    /// never lost). Returns at once if the status is already non-zero or
    /// the slot has no device.
    pub fn wait(&self, slot: usize, timeout: Duration, cancel: impl Fn() -> bool) -> WaitEnd {
        self.waits.fetch_add(1, Ordering::Relaxed);
        let status = lock(&self.slots).get(slot).cloned().flatten();
        let Some(status) = status else {
            self.immediate.fetch_add(1, Ordering::Relaxed);
            return WaitEnd::NoDevice;
        };
        if status.load(Ordering::SeqCst) != 0 {
            self.immediate.fetch_add(1, Ordering::Relaxed);
            return WaitEnd::Interrupt;
        }
        let deadline = Instant::now() + timeout;
        let mut kicks = lock(&self.kicks);
        let seen = *kicks;
        self.waiters.fetch_add(1, Ordering::SeqCst);
        let end = loop {
            if status.load(Ordering::SeqCst) != 0 {
                break WaitEnd::Interrupt;
            }
            if *kicks != seen || cancel() {
                break WaitEnd::Kicked;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break WaitEnd::TimedOut;
            }
            kicks = self
                .changed
                .wait_timeout(kicks, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        };
        self.waiters.fetch_sub(1, Ordering::SeqCst);
        drop(kicks);
        match end {
            WaitEnd::Interrupt => &self.woken,
            WaitEnd::TimedOut => &self.timed_out,
            _ => return end,
        }
        .fetch_add(1, Ordering::Relaxed);
        end
    }

    /// The counts so far.
    pub fn stats(&self) -> WaitStats {
        WaitStats {
            waits: self.waits.load(Ordering::Relaxed),
            woken: self.woken.load(Ordering::Relaxed),
            immediate: self.immediate.load(Ordering::Relaxed),
            timed_out: self.timed_out.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::virtio::{IrqTrigger, VirtioInterrupt, VirtioInterruptType};
    use std::sync::atomic::AtomicBool;
    use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

    fn hub_with_device() -> (Arc<WakeHub>, Arc<IrqTrigger>) {
        let hub = Arc::new(WakeHub::new());
        let irq = Arc::new(IrqTrigger::new(EventFd::new(EFD_NONBLOCK).unwrap()));
        irq.wake_on(&hub, 1);
        (hub, irq)
    }

    /// Runs `wait` on a thread and returns once that thread sleeps in the
    /// hub (it counts as a waiter), so what the test does next happens
    /// during the sleep.
    fn spawn_waiting(
        hub: &Arc<WakeHub>,
        wait: impl FnOnce(&WakeHub) -> WaitEnd + Send + 'static,
    ) -> std::thread::JoinHandle<(WaitEnd, Duration)> {
        let h = hub.clone();
        let t = std::thread::spawn(move || {
            let t0 = Instant::now();
            let end = wait(&h);
            (end, t0.elapsed())
        });
        let deadline = Instant::now() + Duration::from_secs(10);
        while hub.waiters.load(Ordering::SeqCst) == 0 {
            assert!(!t.is_finished(), "the wait returned before sleeping");
            assert!(Instant::now() < deadline, "the thread never waited");
            std::thread::yield_now();
        }
        t
    }

    #[test]
    fn status_already_set_or_no_device_returns_at_once() {
        let (hub, irq) = hub_with_device();
        irq.trigger(VirtioInterruptType::Queue(0)).unwrap();
        let long = Duration::from_secs(60);
        assert_eq!(hub.wait(1, long, || false), WaitEnd::Interrupt);
        assert_eq!(hub.wait(0, long, || false), WaitEnd::NoDevice);
        assert_eq!(hub.wait(9, long, || false), WaitEnd::NoDevice);
        let s = hub.stats();
        assert_eq!((s.waits, s.immediate, s.woken), (3, 3, 0));
    }

    #[test]
    fn a_trigger_from_another_thread_wakes_it() {
        let (hub, irq) = hub_with_device();
        let t = spawn_waiting(&hub, |h| h.wait(1, Duration::from_secs(60), || false));
        irq.trigger(VirtioInterruptType::Config).unwrap();
        let (end, took) = t.join().unwrap();
        assert_eq!(end, WaitEnd::Interrupt);
        assert!(took < Duration::from_secs(30), "{took:?}");
        assert_eq!(hub.stats().woken, 1);
        // Acknowledged, the next wait sleeps again (here until its timeout).
        irq.ack(irq.status());
        assert_eq!(
            hub.wait(1, Duration::from_millis(30), || false),
            WaitEnd::TimedOut
        );
    }

    #[test]
    fn the_timeout_ends_it() {
        let (hub, _irq) = hub_with_device();
        let t0 = Instant::now();
        assert_eq!(
            hub.wait(1, Duration::from_millis(50), || false),
            WaitEnd::TimedOut
        );
        assert!(t0.elapsed() >= Duration::from_millis(50));
        assert_eq!(hub.stats().timed_out, 1);
    }

    #[test]
    fn a_kick_or_a_stop_flag_ends_it() {
        let (hub, _irq) = hub_with_device();
        let t = spawn_waiting(&hub, |h| h.wait(1, Duration::from_secs(60), || false));
        hub.kick();
        let (end, took) = t.join().unwrap();
        assert_eq!(end, WaitEnd::Kicked);
        assert!(took < Duration::from_secs(30), "{took:?}");
        // A flag set before the kick: seen under the lock.
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let t = spawn_waiting(&hub, move |h| {
            h.wait(1, Duration::from_secs(60), || s.load(Ordering::SeqCst))
        });
        stop.store(true, Ordering::SeqCst);
        hub.kick();
        assert_eq!(t.join().unwrap().0, WaitEnd::Kicked);
        // Already set: no sleep at all.
        assert_eq!(
            hub.wait(1, Duration::from_secs(60), || true),
            WaitEnd::Kicked
        );
    }
}
