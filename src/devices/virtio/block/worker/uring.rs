//! The io_uring engine (`io_engine: "Async"`), as Firecracker's
//! `AsyncFileEngine`: reads, writes and flushes are submitted as SQEs
//! (`IORING_OP_READ`, `IORING_OP_WRITE`, `IORING_OP_FSYNC` with
//! `IORING_FSYNC_DATASYNC`), many in flight, and answered on the used ring
//! in the order they complete. Completions are signalled on an eventfd
//! registered with the ring (`IORING_REGISTER_EVENTFD`), the device
//! thread's loop source 1 (the rate limiter's timer is source 0).
//!
//! Memory safety and reset: as with the Sync engine, no host I/O targets
//! guest memory. Each in-flight request owns one slot of [`Uring`]: its
//! own bounce buffer (grown to the request's size, at most
//! [`BOUNCE_BYTES`], and kept), its segments and the activation it began
//! under. An OUT's data is copied from guest memory into the slot before
//! the SQE is submitted; an IN's is copied from the slot into guest memory
//! when the completion comes, under the ring lock and only if that
//! activation still runs. A reset empties the ring slot at once: in-flight
//! operations go on into their bounce buffers, which the worker owns and
//! frees only once their completion came, and are then abandoned (counted,
//! nothing written to the guest, the chain not returned). The slot table
//! is never reallocated, and a slot's buffer is only resized while the slot
//! is free, so the kernel's target never moves.
//!
//! Dropping the engine (the thread's exit, the device dropped) waits for
//! the operations in flight, up to [`DRAIN_DEADLINE`]; if some are still in
//! flight then (a stalled file), their buffers are leaked rather than freed,
//! so the kernel can never write into memory reused for something else.
//!
//! Back-pressure: at most [`DEPTH`] requests in flight (the ring has as
//! many entries, so a push never finds the submission queue full). When
//! every slot is taken, the worker stops popping (counted as
//! `io_engine_throttled_events`) and the next completion runs a pass.
//!
//! Requests with more data than one bounce buffer (over 1 MiB), GET_ID
//! and FLUSH on an `Unsafe` drive (answered OK without a sync) are done at
//! once as in the Sync engine.
//!
//! A PATCH'd file is swapped in only when nothing is in flight on the old
//! one.
//!
//! Seccomp: the ring is made by [`Uring::new`] on the start thread
//! (`io_uring_setup`, `mmap` of its rings, `io_uring_register` for the
//! eventfd, `eventfd2`); the device thread calls `io_uring_enter` (submit,
//! and the wait of the drain) and `read` on the eventfd. The operations
//! themselves are carried out by the kernel (inline or on its io-wq
//! workers) and are not checked by the thread's seccomp filter: an
//! `IORING_OP_*` is not a system call (Firecracker documents the same).

use std::os::fd::{AsRawFd, RawFd};
use std::time::{Duration, Instant};

use io_uring::{opcode, squeue, types, IoUring};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::super::device::CacheType;
use super::super::request::{scatter, Request, RequestType, Segment};
use super::super::{status, BlockError, BOUNCE_BYTES};
use super::BlockWorker;
use crate::devices::virtio::{DeviceMemory, Epoch};

/// Most requests in flight at once (and the ring's entries).
pub const DEPTH: usize = 32;
/// How long dropping the engine waits for the operations in flight.
pub const DRAIN_DEADLINE: Duration = Duration::from_secs(2);

/// One in-flight request's state.
#[derive(Debug, Default)]
struct Slot {
    busy: bool,
    epoch: Epoch,
    head: u16,
    kind: Option<RequestType>,
    data_len: u64,
    status: u64,
    segments: Vec<Segment>,
    buf: Vec<u8>,
}

/// The ring, its completion eventfd and the in-flight table.
pub struct Uring {
    ring: IoUring,
    evt: EventFd,
    slots: Vec<Slot>,
    free: Vec<usize>,
}

impl std::fmt::Debug for Uring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Uring")
            .field("in_flight", &self.in_flight())
            .finish_non_exhaustive()
    }
}

impl Uring {
    /// A ring of [`DEPTH`] entries with its eventfd registered. Fails when
    /// the host refuses io_uring (`io_uring_disabled`, an old kernel, a
    /// seccomp policy of its own).
    pub fn new() -> Result<Uring, BlockError> {
        let ring = IoUring::new(DEPTH as u32).map_err(BlockError::IoUring)?;
        let evt = EventFd::new(EFD_NONBLOCK).map_err(BlockError::EventFd)?;
        ring.submitter()
            .register_eventfd(evt.as_raw_fd())
            .map_err(BlockError::IoUring)?;
        Ok(Uring {
            ring,
            evt,
            slots: (0..DEPTH).map(|_| Slot::default()).collect(),
            free: (0..DEPTH).rev().collect(),
        })
    }

    /// The completion eventfd (the loop's source 1).
    pub fn evt_fd(&self) -> RawFd {
        self.evt.as_raw_fd()
    }

    /// Requests submitted and not yet completed.
    pub fn in_flight(&self) -> usize {
        DEPTH - self.free.len()
    }

    /// Whether every slot is taken.
    pub fn full(&self) -> bool {
        self.free.is_empty()
    }

    /// Hands the pushed SQEs to the kernel (`io_uring_enter`).
    fn submit(&mut self) -> std::io::Result<usize> {
        self.ring.submit()
    }

    /// The completions that came: (slot, result).
    fn reap(&mut self, out: &mut Vec<(usize, i32)>) {
        let _ = self.evt.read();
        for c in self.ring.completion() {
            out.push((c.user_data() as usize, c.result()));
        }
    }

    /// Frees slot `i` (its completion came).
    fn release(&mut self, i: usize) {
        if let Some(s) = self.slots.get_mut(i) {
            if s.busy {
                s.busy = false;
                self.free.push(i);
            }
        }
    }
}

impl Drop for Uring {
    fn drop(&mut self) {
        let deadline = Instant::now() + DRAIN_DEADLINE;
        let mut done = Vec::new();
        while self.in_flight() > 0 && Instant::now() < deadline {
            let ts = types::Timespec::new().nsec(50_000_000);
            let args = types::SubmitArgs::new().timespec(&ts);
            let _ = self.ring.submitter().submit_with_args(1, &args);
            done.clear();
            self.reap(&mut done);
            for &(i, _) in &done {
                self.release(i);
            }
        }
        if self.in_flight() > 0 {
            log::warn!(
                "block: {} io_uring operations still in flight at drop; their buffers are leaked",
                self.in_flight()
            );
            // The kernel may still write into them: never free them.
            std::mem::forget(std::mem::take(&mut self.slots));
        }
    }
}

/// Whether the engine takes `req` (the rest is done at once).
pub(in crate::devices::virtio::block) fn submittable(req: &Request, cache_type: CacheType) -> bool {
    match req.kind {
        RequestType::In | RequestType::Out => req.data_len <= BOUNCE_BYTES as u64,
        RequestType::Flush => cache_type == CacheType::Writeback,
        _ => false,
    }
}

impl<M: DeviceMemory> BlockWorker<M> {
    /// Submits `req` (parsed under activation `epoch`, its segments in
    /// `self.segments`): an OUT's data is copied into the slot first. A
    /// request that cannot be submitted is answered IOERR (or abandoned
    /// if its activation is gone).
    pub(in crate::devices::virtio::block) fn submit(&mut self, epoch: Epoch, req: &Request) {
        let Some(fd) = self.disk.raw_fd() else {
            return self.answer_now(epoch, req, status::IOERR);
        };
        let Some(u) = self.uring.as_mut() else { return };
        let Some(i) = u.free.pop() else {
            // Checked before the pop; kept total.
            return self.answer_now(epoch, req, status::IOERR);
        };
        let n = req.data_len as usize;
        let s = &mut u.slots[i];
        s.busy = true;
        s.epoch = epoch;
        s.head = req.head;
        s.kind = Some(req.kind);
        s.data_len = req.data_len;
        s.status = req.status.0;
        s.segments.clear();
        s.segments.extend_from_slice(&self.segments);
        if s.buf.len() < n {
            s.buf.resize(n, 0);
        }
        if req.kind == RequestType::Out {
            let copied = {
                let ring = self.shared.ring();
                ring.as_ref().filter(|a| a.epoch() == epoch).map(|a| {
                    super::super::request::gather(&*a.mem, &s.segments, 0, &mut s.buf[..n])
                })
            };
            let Some(copied) = copied else {
                self.shared.metrics.abandoned_reqs_count.inc();
                u.release(i);
                return;
            };
            if copied.is_err() {
                u.release(i);
                return self.answer_now(epoch, req, status::IOERR);
            }
        }
        let fd = types::Fd(fd);
        let sqe: squeue::Entry = match req.kind {
            RequestType::In => opcode::Read::new(fd, s.buf.as_mut_ptr(), n as u32)
                .offset(req.offset())
                .build(),
            RequestType::Out => opcode::Write::new(fd, s.buf.as_ptr(), n as u32)
                .offset(req.offset())
                .build(),
            _ => opcode::Fsync::new(fd)
                .flags(types::FsyncFlags::DATASYNC)
                .build(),
        };
        // SAFETY: the buffer the entry points at is slot `i`'s, owned by
        // the engine; it is neither resized nor freed until the completion
        // for user_data `i` has been reaped (and is leaked if the engine is
        // dropped first), so it outlives the operation. The fd is the
        // worker's file, which is not closed while operations are in
        // flight (a swap waits for `in_flight() == 0`).
        let pushed = unsafe { u.ring.submission().push(&sqe.user_data(i as u64)) };
        if pushed.is_err() {
            // Cannot happen (as many entries as slots); kept total.
            u.release(i);
            self.shared.metrics.io_engine_throttled_events.inc();
            self.answer_now(epoch, req, status::IOERR);
        }
    }

    /// Hands the pushed SQEs to the kernel (end of a pass). A failed
    /// `io_uring_enter` leaves them in the submission queue for the next.
    pub(in crate::devices::virtio::block) fn submit_pushed(&mut self) {
        if let Some(u) = self.uring.as_mut() {
            if u.submit().is_err() {
                self.shared.metrics.event_fails.inc();
            }
        }
    }

    /// The completion eventfd fired: answers every request that completed
    /// (status, data for IN, used ring), frees their slots.
    pub(in crate::devices::virtio::block) fn complete(&mut self) {
        let mut done = Vec::with_capacity(DEPTH);
        let Some(u) = self.uring.as_mut() else { return };
        u.reap(&mut done);
        for (i, res) in done {
            self.complete_one(i, res);
        }
    }

    fn complete_one(&mut self, i: usize, res: i32) {
        let m = self.shared.metrics.clone();
        let Some(u) = self.uring.as_mut() else { return };
        let Some(s) = u.slots.get(i).filter(|s| s.busy) else {
            return;
        };
        let (epoch, head, kind, len) = (s.epoch, s.head, s.kind, s.data_len);
        let status_at = vm_memory::GuestAddress(s.status);
        let whole = match kind {
            Some(RequestType::Flush) => res == 0,
            _ => res >= 0 && res as u64 == len,
        };
        let (code, written) = if !whole {
            m.execute_fails.inc();
            (status::IOERR, 0)
        } else {
            match kind {
                Some(RequestType::In) => {
                    let ring = self.shared.ring();
                    let Some(a) = ring.as_ref().filter(|a| a.epoch() == epoch) else {
                        drop(ring);
                        m.abandoned_reqs_count.inc();
                        u.release(i);
                        return;
                    };
                    let n = len as usize;
                    if scatter(&*a.mem, &s.segments, 0, &s.buf[..n]).is_err() {
                        m.execute_fails.inc();
                        (status::IOERR, 0)
                    } else {
                        m.read_bytes.add(len);
                        m.read_count.inc();
                        (status::OK, len as u32)
                    }
                }
                Some(RequestType::Out) => {
                    m.write_bytes.add(len);
                    m.write_count.inc();
                    (status::OK, 0)
                }
                _ => {
                    m.flush_count.inc();
                    (status::OK, 0)
                }
            }
        };
        u.release(i);
        self.finish(epoch, head, Some((status_at, code)), written);
    }

    /// Answers a request the engine could not take, at once.
    fn answer_now(&mut self, epoch: Epoch, req: &Request, code: u8) {
        self.shared.metrics.execute_fails.inc();
        self.finish(epoch, req.head, Some((req.status, code)), 0);
    }

    /// Requests in flight on the ring (0 with the Sync engine).
    pub fn in_flight(&self) -> usize {
        self.uring.as_ref().map_or(0, Uring::in_flight)
    }

    /// Waits (up to `deadline`) for every request in flight and answers
    /// them: tests, which drive the worker without its loop.
    pub fn settle(&mut self, deadline: Duration) -> bool {
        let end = Instant::now() + deadline;
        while self.in_flight() > 0 && Instant::now() < end {
            if let Some(u) = self.uring.as_mut() {
                let ts = types::Timespec::new().nsec(20_000_000);
                let args = types::SubmitArgs::new().timespec(&ts);
                let _ = u.ring.submitter().submit_with_args(1, &args);
            }
            self.complete();
        }
        self.in_flight() == 0
    }
}
