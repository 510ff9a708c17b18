//! virtio-rng (virtio 1.x, 5.4), Firecracker's entropy device: one queue of
//! 256 whose writable descriptor chains the device fills from the host's
//! `getrandom(2)`, behind an optional rate limiter (one op and the
//! request's bytes per chain; a refused chain is put back on the ring
//! until the limiter's timer fires), on its own thread.
//!
//! Hostile chains are answered and the device lives on: a chain with a
//! read-only descriptor or one outside guest RAM is returned with 0 bytes
//! written (counted in `entropy_event_fails`, as Firecracker), a zero-length
//! one with 0 bytes, and a chain longer than [`MAX_REQUEST_BYTES`] gets that
//! many (the spec lets the device write fewer bytes than asked).
//!
//! Syscalls of its thread, for its seccomp role: the loop's
//! ([`crate::devices::virtio::worker`]), `getrandom`, `write` on the irqfd,
//! `timerfd_settime` and `read` on the limiter's timer.

#[cfg(test)]
mod tests;

use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;

use event_manager::EventSet;
use serde::Serialize;
use virtio_queue::QueueT;
use vm_memory::{Bytes, GuestMemoryBackend};

use crate::devices::virtio::{
    ActivateError, ActiveState, Counter, DeviceMemory, DeviceOffer, PendingQueues, QueueHandler,
    VirtioDevice, Wake, VIRTIO_F_VERSION_1,
};
use crate::rate_limiter::{RateLimiter, RateLimiterConfig, RateLimiterError};

/// The virtio device ID of an entropy source.
pub const VIRTIO_ID_RNG: u32 = 4;
/// The queue's size (Firecracker's).
pub const QUEUE_SIZE: u16 = 256;
/// Most bytes given for one request.
pub const MAX_REQUEST_BYTES: usize = 64 << 10;
/// Most chains answered in one pass.
const MAX_CHAINS_PER_PASS: usize = 64;

/// Errors of the entropy device.
#[derive(Debug, thiserror::Error)]
pub enum RngError {
    /// The limiter could not be made.
    #[error("entropy device rate limiter: {0}")]
    RateLimiter(#[from] RateLimiterError),
    /// An eventfd could not be made.
    #[error("cannot create the entropy device's eventfd: {0}")]
    EventFd(std::io::Error),
}

/// The `entropy` metrics group (Firecracker's names).
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize)]
pub struct RngMetrics {
    /// Activations refused.
    pub activate_fails: Counter,
    /// Chains refused (read-only, outside RAM) and used-ring failures.
    pub entropy_event_fails: Counter,
    /// Chains taken.
    pub entropy_event_count: Counter,
    /// Bytes given to the guest.
    pub entropy_bytes: Counter,
    /// `getrandom` failures.
    pub host_rng_fails: Counter,
    /// Requests held by the limiter, and queue events while it blocked.
    pub entropy_rate_limiter_throttled: Counter,
    /// Limiter timer fires.
    pub rate_limiter_event_count: Counter,
}

/// A virtio-rng device.
pub struct Rng<M: DeviceMemory> {
    active: Option<ActiveState<M>>,
    limiter: RateLimiter,
    metrics: Arc<RngMetrics>,
    wake: Arc<Wake>,
    buf: Vec<u8>,
}

impl<M: DeviceMemory> std::fmt::Debug for Rng<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rng")
            .field("active", &self.active.is_some())
            .finish_non_exhaustive()
    }
}

/// Fills `buf` from the host's random source.
fn host_random(buf: &mut [u8]) -> bool {
    let mut done = 0;
    while done < buf.len() {
        let rest = &mut buf[done..];
        // SAFETY: writes at most `rest.len()` bytes into `rest`.
        let n = unsafe { libc::getrandom(rest.as_mut_ptr().cast(), rest.len(), 0) };
        if n < 0 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return false;
        }
        done += n as usize;
    }
    true
}

impl<M: DeviceMemory> Rng<M> {
    /// A device with the given limiter (empty: no limit).
    pub fn new(limiter: &RateLimiterConfig) -> Result<Rng<M>, RngError> {
        Ok(Rng {
            active: None,
            limiter: RateLimiter::new(limiter)?,
            metrics: Arc::new(RngMetrics::default()),
            wake: Arc::new(Wake::new().map_err(RngError::EventFd)?),
            buf: vec![0; MAX_REQUEST_BYTES],
        })
    }

    /// The counters.
    pub fn metrics(&self) -> &Arc<RngMetrics> {
        &self.metrics
    }

    /// The limiter's buckets.
    pub fn limiter_config(&self) -> RateLimiterConfig {
        self.limiter.config()
    }

    /// One bounded pass over the queue.
    pub fn process_queue(&mut self) {
        let Some(a) = self.active.as_mut() else {
            return;
        };
        let m = &*self.metrics;
        if self.limiter.is_blocked() {
            m.entropy_rate_limiter_throttled.inc();
            return;
        }
        let (limiter, buf) = (&mut self.limiter, &mut self.buf);
        let mut used = false;
        let end = self.wake.pass(0, MAX_CHAINS_PER_PASS, || {
            let Some(chain) = crate::devices::virtio::chains::pop_direct(
                &mut a.queues[0],
                &*a.mem,
                &m.entropy_event_fails,
            ) else {
                return false;
            };
            m.entropy_event_count.inc();
            let head = chain.head_index();
            // The chain's writable buffers, checked, up to the cap.
            let mut bufs = Vec::new();
            let mut total = 0usize;
            let mut ok = true;
            for d in chain {
                let len = d.len() as usize;
                if !d.is_write_only() || !a.mem.check_range(d.addr(), len) {
                    ok = false;
                    break;
                }
                let take = len.min(MAX_REQUEST_BYTES - total);
                if take > 0 {
                    bufs.push((d.addr(), take));
                    total += take;
                }
            }
            let mut wrote = 0u32;
            if !ok {
                m.entropy_event_fails.inc();
            } else if total > 0 {
                if !limiter.consume_op(total as u64) {
                    m.entropy_rate_limiter_throttled.inc();
                    let q = &mut a.queues[0];
                    q.set_next_avail(q.next_avail().wrapping_sub(1));
                    return false;
                }
                if host_random(&mut buf[..total]) {
                    let mut off = 0;
                    for (addr, len) in bufs {
                        if a.mem.write_slice(&buf[off..off + len], addr).is_err() {
                            break;
                        }
                        off += len;
                    }
                    wrote = off as u32;
                } else {
                    m.host_rng_fails.inc();
                }
            }
            if a.queues[0].add_used(&*a.mem, head, wrote).is_ok() {
                used = true;
                m.entropy_bytes.add(u64::from(wrote));
            } else {
                m.entropy_event_fails.inc();
                return false;
            }
            true
        });
        if end.wake_failed {
            m.entropy_event_fails.inc();
        }
        if used && !a.signal_used(0) {
            m.entropy_event_fails.inc();
        }
    }

    /// The limiter's timer fired: ends its block and resumes.
    pub fn process_limiter(&mut self) {
        self.metrics.rate_limiter_event_count.inc();
        if self.limiter.event_handler() {
            self.process_queue();
        }
    }
}

impl<M: DeviceMemory> QueueHandler for Rng<M> {
    fn wake(&self) -> Arc<Wake> {
        self.wake.clone()
    }

    fn sources(&self) -> Vec<(RawFd, EventSet)> {
        vec![(self.limiter.as_raw_fd(), EventSet::IN)]
    }

    fn queue_event(&mut self, _index: usize) {
        self.process_queue();
    }

    fn wake_event(&mut self, _pending: PendingQueues) {
        self.process_queue();
    }

    fn source_event(&mut self, _index: usize, _events: EventSet) {
        self.process_limiter();
    }
}

impl<M: DeviceMemory> VirtioDevice<M> for Rng<M> {
    fn offer(&self) -> DeviceOffer {
        DeviceOffer {
            device_type: VIRTIO_ID_RNG,
            avail_features: VIRTIO_F_VERSION_1,
            queue_sizes: &[QUEUE_SIZE],
        }
    }

    fn activate(&mut self, active: ActiveState<M>) -> Result<(), ActivateError> {
        active
            .check(self.active.is_some(), [0])
            .inspect_err(|_| self.metrics.activate_fails.inc())?;
        self.active = Some(active);
        // Buffers posted before DRIVER_OK.
        self.wake.again(&[0]).map_err(ActivateError::Signal)
    }

    fn queue_positions(&self) -> Option<Vec<crate::devices::virtio::QueuePosition>> {
        self.active.as_ref().map(ActiveState::positions)
    }

    fn reset(&mut self) {
        self.active = None;
        self.wake.clear();
    }
}
