//! The network device's receive and transmit rate limiters, in
//! Firecracker's semantics ([`crate::rate_limiter`]):
//!
//! - Transmit: each frame takes one op and its bytes (the virtio-net header
//!   included, as Firecracker counts them) before it goes to the tap. A
//!   refused frame's chain is put back on the ring (the avail index is
//!   stepped back) and the pass ends; nothing more is sent until the
//!   limiter's timer fires.
//! - Receive: a frame read from the tap takes one op and its bytes before
//!   it is written to the guest. A refused frame stays in the bounce buffer
//!   and the tap is not read further until the timer fires.
//! - Both timers' fds are polled by the device's thread (sources 1 and 2
//!   after the tap); a fire ends the block and resumes that direction.
//! - Malformed transmit chains and dropped receive frames take nothing.
//! - Counters (Firecracker's names): `{rx,tx}_rate_limiter_throttled` (a
//!   refused frame, or a queue or tap event while blocked),
//!   `rx_event_rate_limiter_count` and `tx_rate_limiter_event_count` (timer
//!   fires).
//!
//! Syscalls, for the net role: `timerfd_settime` when a limiter blocks,
//! `read` of a timer when it fires (both on the device's thread);
//! `timerfd_create` where the device is made.

use std::os::fd::{AsRawFd, RawFd};

use super::super::metrics::NetMetrics;
use super::super::NetError;
use super::Net;
use crate::devices::virtio::DeviceMemory;
use crate::rate_limiter::{RateLimiter, RateLimiterConfig};

/// The index of the receive limiter's timer among the device's sources.
pub(in crate::devices::virtio::net) const RX_TIMER_SOURCE: usize = 1;
/// The index of the transmit limiter's timer among the device's sources.
pub(in crate::devices::virtio::net) const TX_TIMER_SOURCE: usize = 2;

/// A device's two limiters (each limits nothing when its config is empty).
#[derive(Debug)]
pub(in crate::devices::virtio::net) struct NetLimits {
    pub rx: RateLimiter,
    pub tx: RateLimiter,
}

impl NetLimits {
    /// The limiters of a new device, full.
    pub fn new(rx: &RateLimiterConfig, tx: &RateLimiterConfig) -> Result<NetLimits, NetError> {
        Ok(NetLimits {
            rx: RateLimiter::new(rx)?,
            tx: RateLimiter::new(tx)?,
        })
    }

    /// The timers' fds, for the device's thread to poll (in
    /// [`RX_TIMER_SOURCE`], [`TX_TIMER_SOURCE`] order).
    pub fn fds(&self) -> [RawFd; 2] {
        [self.rx.as_raw_fd(), self.tx.as_raw_fd()]
    }

    /// Whether transmit is held; counted as throttled when it is.
    pub fn tx_blocked(&self, m: &NetMetrics) -> bool {
        let b = self.tx.is_blocked();
        if b {
            m.tx_rate_limiter_throttled.inc();
        }
        b
    }

    /// Whether receive is held; counted as throttled when it is.
    pub fn rx_blocked(&self, m: &NetMetrics) -> bool {
        let b = self.rx.is_blocked();
        if b {
            m.rx_rate_limiter_throttled.inc();
        }
        b
    }

    /// Takes one op and `bytes` for a transmitted frame; false (counted):
    /// the frame must wait for the timer.
    pub fn admit_tx(&mut self, bytes: usize, m: &NetMetrics) -> bool {
        let ok = self.tx.consume_op(bytes as u64);
        if !ok {
            m.tx_rate_limiter_throttled.inc();
        }
        ok
    }

    /// Takes one op and `bytes` for a received frame; false (counted): the
    /// frame must wait for the timer.
    pub fn admit_rx(&mut self, bytes: usize, m: &NetMetrics) -> bool {
        let ok = self.rx.consume_op(bytes as u64);
        if !ok {
            m.rx_rate_limiter_throttled.inc();
        }
        ok
    }
}

impl<M: DeviceMemory> Net<M> {
    /// A limiter's timer fired (source `index`): ends its block and resumes
    /// that direction. A spurious wake changes nothing.
    pub(in crate::devices::virtio::net) fn process_limiter(&mut self, index: usize) {
        match index {
            RX_TIMER_SOURCE => {
                self.metrics.rx_event_rate_limiter_count.inc();
                if self.limits.rx.event_handler() {
                    self.process_rx();
                }
            }
            TX_TIMER_SOURCE => {
                self.metrics.tx_rate_limiter_event_count.inc();
                if self.limits.tx.event_handler() {
                    self.process_tx();
                }
            }
            _ => {}
        }
    }

    /// Changes the limiters of a device (`PATCH /network-interfaces`): in
    /// each, a bucket given replaces the old one (a 0 size or refill time
    /// removes it), one left out stays. Checked whole before either changes.
    pub fn update_limiters(
        &mut self,
        rx: Option<&RateLimiterConfig>,
        tx: Option<&RateLimiterConfig>,
    ) -> Result<(), NetError> {
        for c in [rx, tx].into_iter().flatten() {
            c.check()?;
        }
        if let Some(c) = rx {
            self.limits.rx.update(c)?;
        }
        if let Some(c) = tx {
            self.limits.tx.update(c)?;
        }
        // A limiter whose buckets went away must not stay blocked with
        // nothing to retry: its timer still fires and resumes it.
        Ok(())
    }

    /// The limiters' buckets now (receive, transmit).
    pub fn limiter_configs(&self) -> (RateLimiterConfig, RateLimiterConfig) {
        (self.limits.rx.config(), self.limits.tx.config())
    }
}
