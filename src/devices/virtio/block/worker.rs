//! The block device's thread: the worker that owns the backing file and
//! runs the requests, one bounded pass per event ([`BlockWorker::process_queue`]),
//! each request parsed ([`super::request::parse`]) before any host I/O,
//! data moved in chunks of at most [`BOUNCE_BYTES`] through the thread's
//! bounce buffer. The loop around it is the shared one
//! ([`crate::devices::virtio::worker`]): the wake eventfd (activation, a new
//! file, left-over work) and the queue's eventfd both run a pass.
//!
//! The worker owns the backing file; the [`Block`] keeps only what the
//! transport and the VMM read (capacity, counters) and the ring slot. After
//! [`BlockWorker::new`] the worker never locks the device's mutex, so a
//! stalled `pread` here never blocks a vCPU's MMIO access or the VMM.
//!
//! Locking: the ring slot (`BlockShared::ring`) is taken for each
//! guest-memory step (pop and parse, one chunk's copy, the status byte and
//! used ring) and let go before each `pread`/`pwrite`/`fdatasync`. Each step
//! first checks that the activation it began under still runs; if a reset
//! came in between, the request is abandoned: nothing more is written to
//! the guest and the chain is not returned (the guest reset the queue).
//!
//! Syscalls it makes, for its seccomp role: the loop's (`epoll_wait`,
//! `read`/`write` on eventfds: its wake, the queue's, the exit eventfd, the
//! irqfd), `futex` (the ring slot and the pending-file slot), `pread64`,
//! `pwrite64`, `fdatasync` (Writeback only), `lseek` (size of a swapped-in
//! file), `close` (the old file after a swap), `timerfd_settime` and `read`
//! on the rate limiter's timer (a block begins, ends); and at
//! [`BlockWorker::new`], on the VMM thread: `epoll_create1`, `epoll_ctl`,
//! `timerfd_create`, and the bounce buffer's allocation (`mmap`). No
//! allocation per request after the first.
//!
//! With `io_engine: "Async"` ([`uring`]) IN, OUT and FLUSH
//! (Writeback) go to the io_uring engine instead: submitted at the end of
//! the pass (`io_uring_enter`), answered when their completions come (the
//! loop's source 1, the ring's eventfd); a full engine ends the pass.
//!
//! Rate limiting (Firecracker's): a request takes its tokens when it is
//! popped; one refused is put back on the avail ring under the same lock
//! and the pass ends. While the limiter is blocked, queue notifications are
//! only counted; its timer fd (the loop's source 0) ends the block and runs
//! a pass.

pub mod uring;

use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};

use event_manager::EventSet;
use virtio_queue::{QueueOwnedT, QueueT};
use vm_memory::{Bytes, GuestAddress};

use super::device::IoEngine;
use super::device::{BlockShared, CacheType, Ring};
use super::disk::{disk_size, Disk};
use super::request::{gather, parse, scatter, Refusal, Request, RequestType, Segment};
use super::{
    status, Block, BlockError, BOUNCE_BYTES, ID_BYTES, MAX_CHAINS_PER_PASS,
    MAX_DESCRIPTORS_PER_REQUEST, SECTOR_BYTES,
};
use crate::devices::virtio::{
    ActiveState, DeviceMemory, Epoch, PendingQueues, QueueHandler, VirtioInterruptType, Wake,
};
use crate::rate_limiter::{RateLimiter, TokenType};
use uring::{submittable, Uring};

/// Runs a block device's requests: the handler of its thread's loop.
pub struct BlockWorker<M: DeviceMemory> {
    /// The io_uring engine (`io_engine: "Async"`; None: Sync). First, so
    /// that it is dropped (its operations in flight waited for) before the
    /// file is closed.
    pub(super) uring: Option<Uring>,
    pub(super) shared: Arc<BlockShared<M>>,
    pub(super) disk: Box<dyn Disk>,
    /// The current file's size in sectors (the worker's own copy: requests
    /// are checked against the file they will use).
    pub(super) capacity_sectors: u64,
    pub(super) id: [u8; ID_BYTES],
    pub(super) read_only: bool,
    pub(super) cache_type: CacheType,
    pub(super) bounce: Vec<u8>,
    pub(super) segments: Vec<Segment>,
    /// The drive's rate limiter (one that limits nothing when none was
    /// given); its timer fd is the loop's source 0.
    pub(super) limiter: RateLimiter,
}

/// What [`BlockWorker::pop`] found.
enum Popped {
    /// No chain (or no activation).
    Nothing,
    /// A chain the rate limiter refused: it is back on the avail ring.
    Throttled,
    /// A chain, parsed, under activation `epoch`.
    Chain(Epoch, Result<Request, Refusal>),
}

impl<M: DeviceMemory> std::fmt::Debug for BlockWorker<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlockWorker")
            .field("capacity_sectors", &self.capacity_sectors)
            .field("read_only", &self.read_only)
            .finish_non_exhaustive()
    }
}

impl<M: DeviceMemory> BlockWorker<M> {
    /// A worker for `block`: takes the backing file from the device (one
    /// worker per device: a second is refused).
    pub fn new(block: &Arc<Mutex<Block<M>>>) -> Result<BlockWorker<M>, BlockError> {
        let (shared, disk, opts, image_id) = {
            let mut b = block.lock().unwrap_or_else(PoisonError::into_inner);
            let disk = b.disk.take().ok_or(BlockError::WorkerExists)?;
            (b.shared.clone(), disk, b.options().clone(), b.image_id)
        };
        let capacity_sectors = shared.capacity_sectors.load(Ordering::SeqCst);
        let uring = match opts.io_engine {
            IoEngine::Sync => None,
            IoEngine::Async if disk.raw_fd().is_none() => return Err(BlockError::NoFd),
            IoEngine::Async => Some(Uring::new()?),
        };
        Ok(BlockWorker {
            uring,
            shared,
            disk,
            capacity_sectors,
            id: image_id.unwrap_or_else(|| opts.disk_id()),
            read_only: opts.read_only,
            cache_type: opts.cache_type,
            bounce: vec![0u8; BOUNCE_BYTES],
            segments: Vec::with_capacity(MAX_DESCRIPTORS_PER_REQUEST),
            limiter: RateLimiter::new(&opts.rate_limiter)?,
        })
    }

    /// The current file's size in sectors, as the worker checks requests.
    pub fn capacity_sectors(&self) -> u64 {
        self.capacity_sectors
    }
}

impl<M: DeviceMemory> QueueHandler for BlockWorker<M> {
    fn wake(&self) -> Arc<Wake> {
        self.shared.wake.clone()
    }

    fn sources(&self) -> Vec<(RawFd, EventSet)> {
        let mut s = vec![(self.limiter.as_raw_fd(), EventSet::IN)];
        if let Some(u) = &self.uring {
            s.push((u.evt_fd(), EventSet::IN));
        }
        s
    }

    fn queue_event(&mut self, _index: usize) {
        self.shared.metrics.queue_event_count.inc();
        if self.limiter.is_blocked() {
            // The chains wait for the limiter's timer (as in Firecracker).
            self.shared.metrics.rate_limiter_throttled_events.inc();
            return;
        }
        self.process_queue(true);
    }

    fn wake_event(&mut self, _pending: PendingQueues) {
        self.process_queue(false);
    }

    fn source_event(&mut self, index: usize, _events: EventSet) {
        if index == 1 {
            // io_uring completions: answered; their slots free, a pass.
            self.complete();
            self.process_queue(false);
            return;
        }
        // The limiter's timer: the block is over, the queue goes on.
        self.shared.metrics.rate_limiter_event_count.inc();
        if self.limiter.event_handler() {
            self.process_queue(false);
        }
    }
}

/// Takes a request's tokens as Firecracker counts them: one op for every
/// request, and for IN and OUT its data bytes (the op given back when the
/// bytes are refused). False: refused, nothing taken.
fn take_tokens(limiter: &mut RateLimiter, req: &Request) -> bool {
    match req.kind {
        RequestType::In | RequestType::Out => limiter.consume_op(req.data_len),
        _ => limiter.consume(1, TokenType::Ops),
    }
}

/// A request's data in bounce-buffer chunks: (bytes before the chunk, its
/// length, its offset in the file).
fn chunks(req: &Request) -> impl Iterator<Item = (u64, usize, u64)> {
    let (len, base) = (req.data_len, req.offset());
    (0..len).step_by(BOUNCE_BYTES).map(move |done| {
        (
            done,
            (len - done).min(BOUNCE_BYTES as u64) as usize,
            base + done,
        )
    })
}

/// How a request ended: its status and the bytes written into the guest's
/// data buffers, or `None` when its activation is gone.
type Outcome = Option<(u8, u32)>;

impl<M: DeviceMemory> BlockWorker<M> {
    /// One bounded pass: swaps in a pending file, then serves up to
    /// [`MAX_CHAINS_PER_PASS`] chains one by one (wakes itself if more may
    /// be left). `queue_event`: a queue notification woke it (an empty
    /// queue is then counted as `no_avail_buffer`).
    pub fn process_queue(&mut self, queue_event: bool) {
        let metrics = self.shared.metrics.clone();
        let wake = self.shared.wake.clone();
        let mut first = true;
        let end = wake.pass(0, MAX_CHAINS_PER_PASS, || {
            self.swap_pending_disk();
            self.apply_pending_limiter();
            if self.shared.holding.load(Ordering::SeqCst) {
                // Held for a snapshot: the chains wait in the ring (the
                // release wakes the thread).
                return false;
            }
            if self.limiter.is_blocked() {
                // Its timer's event runs the next pass.
                return false;
            }
            if self.uring.as_ref().is_some_and(Uring::full) {
                // The next completion runs the next pass.
                metrics.io_engine_throttled_events.inc();
                return false;
            }
            let (epoch, parsed) = match self.pop() {
                Popped::Chain(epoch, parsed) => (epoch, parsed),
                Popped::Throttled => {
                    metrics.rate_limiter_throttled_events.inc();
                    return false;
                }
                Popped::Nothing => {
                    if first && queue_event {
                        metrics.no_avail_buffer.inc();
                    }
                    return false;
                }
            };
            first = false;
            match parsed {
                Ok(req) if self.uring.is_some() && submittable(&req, self.cache_type) => {
                    self.submit(epoch, &req);
                }
                Ok(req) => {
                    if let Some((code, written)) = self.execute(epoch, &req) {
                        self.finish(epoch, req.head, Some((req.status, code)), written);
                    }
                }
                Err(Refusal::Drop { head, .. }) => {
                    metrics.invalid_reqs_count.inc();
                    metrics.dropped_reqs_count.inc();
                    self.finish(epoch, head, None, 0);
                }
                Err(Refusal::Answer {
                    head, status, code, ..
                }) => {
                    metrics.invalid_reqs_count.inc();
                    self.finish(epoch, head, Some((status, code)), 0);
                }
            }
            true
        });
        self.submit_pushed();
        // SeqCst: read by a hold waiting for the I/O in flight to end
        // (`crate::devices::virtio::wait_for`).
        self.shared
            .in_flight
            .store(self.in_flight(), Ordering::SeqCst);
        if end.wake_failed {
            metrics.event_fails.inc();
        }
    }

    /// Takes the next chain and parses it, under the ring lock; a request
    /// the rate limiter refuses is put back on the avail ring (the same
    /// lock held: the guest sees nothing).
    fn pop(&mut self) -> Popped {
        let mut ring = self.shared.ring();
        let Some(a) = ring.as_mut() else {
            return Popped::Nothing;
        };
        let Some(chain) = crate::devices::virtio::chains::pop_direct(
            &mut a.queues[0],
            &*a.mem,
            &self.shared.metrics.invalid_reqs_count,
        ) else {
            return Popped::Nothing;
        };
        let parsed = parse(
            &*a.mem,
            chain,
            self.capacity_sectors,
            self.read_only,
            &mut self.segments,
        );
        if let Ok(req) = &parsed {
            if !take_tokens(&mut self.limiter, req) {
                a.queues[0].go_to_previous_position();
                return Popped::Throttled;
            }
        }
        Popped::Chain(a.epoch(), parsed)
    }

    /// Applies a rate limiter update handed over by
    /// [`Block::update_rate_limiter`], if any.
    fn apply_pending_limiter(&mut self) {
        let update = self
            .shared
            .pending_limiter
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(u) = update {
            if let Err(e) = self.limiter.update(&u) {
                // Checked when it was handed over; kept total.
                log::warn!("block: rate limiter update refused: {e}");
            }
        }
    }

    /// The rate limiter (tests).
    pub fn limiter(&self) -> &RateLimiter {
        &self.limiter
    }

    fn execute(&mut self, epoch: Epoch, req: &Request) -> Outcome {
        let m = self.shared.metrics.clone();
        let ioerr = |done: u64| {
            m.execute_fails.inc();
            Some((status::IOERR, done as u32))
        };
        match req.kind {
            RequestType::In => {
                for (done, n, off) in chunks(req) {
                    debug_assert!(off + n as u64 <= self.capacity_sectors * SECTOR_BYTES);
                    // Host I/O, no lock held.
                    if self.disk.read_exact_at(&mut self.bounce[..n], off).is_err() {
                        return ioerr(done);
                    }
                    let ring = self.shared.ring();
                    let a = self.current(&ring, epoch)?;
                    if scatter(&*a.mem, &self.segments, done, &self.bounce[..n]).is_err() {
                        return ioerr(done);
                    }
                }
                m.read_bytes.add(req.data_len);
                m.read_count.inc();
                Some((status::OK, req.data_len as u32))
            }
            RequestType::Out => {
                for (done, n, off) in chunks(req) {
                    debug_assert!(off + n as u64 <= self.capacity_sectors * SECTOR_BYTES);
                    let copied = {
                        let ring = self.shared.ring();
                        let a = self.current(&ring, epoch)?;
                        gather(&*a.mem, &self.segments, done, &mut self.bounce[..n])
                    };
                    // Host I/O, no lock held.
                    if copied.is_err() || self.disk.write_all_at(&self.bounce[..n], off).is_err() {
                        return ioerr(0);
                    }
                }
                m.write_bytes.add(req.data_len);
                m.write_count.inc();
                Some((status::OK, 0))
            }
            RequestType::Flush => {
                if self.cache_type == CacheType::Writeback && self.disk.sync_data().is_err() {
                    return ioerr(0);
                }
                m.flush_count.inc();
                Some((status::OK, 0))
            }
            RequestType::GetId => {
                let ring = self.shared.ring();
                let a = self.current(&ring, epoch)?;
                if scatter(&*a.mem, &self.segments, 0, &self.id).is_err() {
                    return ioerr(0);
                }
                m.get_id_count.inc();
                Some((status::OK, ID_BYTES as u32))
            }
            // Refused at parse; kept total.
            RequestType::Unsupported(_) => Some((status::UNSUPP, 0)),
        }
    }

    /// The activation `epoch` if it still runs; counts an abandoned request
    /// if not.
    fn current<'a>(&self, ring: &'a Ring<M>, epoch: Epoch) -> Option<&'a ActiveState<M>> {
        let a = ring.as_ref().filter(|a| a.epoch() == epoch);
        if a.is_none() {
            self.shared.metrics.abandoned_reqs_count.inc();
        }
        a
    }

    /// Writes the status byte (if any) and returns the chain: used length
    /// `written + 1`, or 0 without a status or if it cannot be written.
    pub(super) fn finish(
        &mut self,
        epoch: Epoch,
        head: u16,
        status: Option<(GuestAddress, u8)>,
        written: u32,
    ) {
        let mut ring = self.shared.ring();
        if self.current(&ring, epoch).is_none() {
            return;
        }
        let Some(a) = ring.as_mut() else { return };
        let len = match status {
            Some((addr, code)) if a.mem.write_obj(code, addr).is_ok() => written + 1,
            _ => 0,
        };
        let q = &mut a.queues[0];
        let mut ok = q.add_used(&*a.mem, head, len).is_ok();
        if q.needs_notification(&*a.mem).unwrap_or(true) {
            ok &= a.signal_used(0);
        }
        if !ok {
            self.shared.metrics.event_fails.inc();
        }
    }

    /// Swaps in the file [`super::Block::update_file`] handed over, if any:
    /// reads its size, closes the old file, tells the guest.
    pub(super) fn swap_pending_disk(&mut self) {
        if self.in_flight() > 0 {
            // The old file has operations in flight: the swap waits for
            // their completions (each runs a pass).
            return;
        }
        let new = self
            .shared
            .pending_disk
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        let Some((new, new_id)) = new else { return };
        let m = &self.shared.metrics;
        let size = match disk_size(&*new) {
            Ok(s) => s,
            Err(e) => {
                m.update_fails.inc();
                log::warn!(
                    "block: the new backing file's size cannot be read ({e}); kept the old file"
                );
                return;
            }
        };
        let old = std::mem::replace(&mut self.disk, new);
        if let Some(id) = new_id {
            self.id = id;
        }
        self.capacity_sectors = size / SECTOR_BYTES;
        self.shared
            .capacity_sectors
            .store(self.capacity_sectors, Ordering::SeqCst);
        self.shared.config_generation.fetch_add(1, Ordering::SeqCst);
        m.update_count.inc();
        if let Some(a) = self.shared.ring().as_ref() {
            if a.interrupt.trigger(VirtioInterruptType::Config).is_err() {
                m.event_fails.inc();
            }
        }
        // The old file is closed here, on the device thread (a close may
        // wait on the file system too).
        drop(old);
    }
}
