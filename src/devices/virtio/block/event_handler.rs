//! The block device's thread: which fd wakes what.
//!
//! | fd | token | does |
//! |---|---|---|
//! | exit eventfd | 0 | returns |
//! | the device's wake eventfd | 1 | [`BlockWorker::process_queue`]: a new file, activation, left-over work |
//! | the queue's eventfd (the transport's, also the ioeventfd) | 2 | [`BlockWorker::process_queue`] |
//!
//! The worker owns the backing file; the [`Block`] keeps only what the
//! transport and the VMM read (capacity, counters) and the ring slot. After
//! [`BlockWorker::new`] the worker never locks the device's mutex, so a
//! stalled `pread` here never blocks a vCPU's MMIO access or the VMM.
//!
//! Syscalls it makes, for its seccomp role: `epoll_wait`, `read` and
//! `write` on eventfds (its own wake, the queue's, the exit eventfd, the
//! irqfd), `futex` (the ring slot and the pending-file slot), `pread64`,
//! `pwrite64`, `fdatasync` (Writeback only), `lseek` (size of a swapped-in
//! file), `close` (the old file after a swap); and at [`BlockWorker::new`],
//! if it runs on this thread: `epoll_create1`, `epoll_ctl`, and the bounce
//! buffer's allocation (`mmap`). No allocation per request after the first.

use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex, PoisonError};

use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::EventFd;

use super::device::{CacheType, Shared};
use super::io::Disk;
use super::metrics::BlockMetrics;
use super::request::Segment;
use super::{Block, BlockError, BOUNCE_BYTES, ID_BYTES, MAX_DESCRIPTORS_PER_REQUEST};
use crate::devices::virtio::DeviceMemory;

const EXIT: u64 = 0;
const WAKE: u64 = 1;
const QUEUE0: u64 = 2;

/// Runs a block device's requests on the thread that calls [`Self::run`].
pub struct BlockWorker<M: DeviceMemory> {
    pub(super) shared: Arc<Shared<M>>,
    pub(super) disk: Box<dyn Disk>,
    /// The current file's size in sectors (the worker's own copy: requests
    /// are checked against the file they will use).
    pub(super) capacity_sectors: u64,
    pub(super) id: [u8; ID_BYTES],
    pub(super) read_only: bool,
    pub(super) cache_type: CacheType,
    pub(super) bounce: Vec<u8>,
    pub(super) segments: Vec<Segment>,
    queue_evts: Vec<EventFd>,
    exit_evt: EventFd,
    epoll: Epoll,
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
    /// A worker for `block`, woken by `queue_evts` (clones of the
    /// transport's [`crate::devices::virtio::MmioTransport::queue_evts`]),
    /// stopped by a write to `exit_evt`. Takes the backing file from the
    /// device (one worker per device: a second is refused).
    pub fn new(
        block: Arc<Mutex<Block<M>>>,
        queue_evts: Vec<EventFd>,
        exit_evt: EventFd,
    ) -> Result<BlockWorker<M>, BlockError> {
        let (shared, disk, opts) = {
            let mut b = block.lock().unwrap_or_else(PoisonError::into_inner);
            let disk = b.disk.take().ok_or(BlockError::WorkerExists)?;
            (b.shared.clone(), disk, b.options().clone())
        };
        let epoll = Epoll::new().map_err(BlockError::Poll)?;
        let add = |fd: i32, token: u64| {
            epoll
                .ctl(
                    ControlOperation::Add,
                    fd,
                    EpollEvent::new(EventSet::IN, token),
                )
                .map_err(BlockError::Poll)
        };
        add(exit_evt.as_raw_fd(), EXIT)?;
        add(shared.wake.as_raw_fd(), WAKE)?;
        for (i, e) in queue_evts.iter().enumerate() {
            add(e.as_raw_fd(), QUEUE0 + i as u64)?;
        }
        let capacity_sectors = shared
            .capacity_sectors
            .load(std::sync::atomic::Ordering::SeqCst);
        Ok(BlockWorker {
            shared,
            disk,
            capacity_sectors,
            id: opts.disk_id(),
            read_only: opts.read_only,
            cache_type: opts.cache_type,
            bounce: vec![0u8; BOUNCE_BYTES],
            segments: Vec::with_capacity(MAX_DESCRIPTORS_PER_REQUEST),
            queue_evts,
            exit_evt,
            epoll,
        })
    }

    /// Serves the device until the exit eventfd is written.
    pub fn run(&mut self) -> Result<(), BlockError> {
        let mut events = vec![EpollEvent::default(); self.queue_evts.len() + 2];
        while self.run_once(&mut events)? {}
        Ok(())
    }

    /// One wait and what it woke; false once the exit eventfd fired.
    pub fn run_once(&mut self, events: &mut [EpollEvent]) -> Result<bool, BlockError> {
        let n = match self.epoll.wait(-1, events) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => 0,
            Err(e) => return Err(BlockError::Poll(e)),
        };
        let mut work = None;
        for ev in &events[..n] {
            match ev.data() {
                EXIT => return Ok(false),
                WAKE => {
                    let _ = self.shared.wake.read();
                    work.get_or_insert(false);
                }
                t => {
                    if let Some(e) = self.queue_evts.get((t - QUEUE0) as usize) {
                        let _ = e.read();
                        BlockMetrics::add(&self.shared.metrics.queue_event_count, 1);
                        work = Some(true);
                    }
                }
            }
        }
        if let Some(queue_event) = work {
            self.process_queue(queue_event);
        }
        Ok(true)
    }

    /// The exit eventfd (write 1 to stop the thread).
    pub fn exit_evt(&self) -> &EventFd {
        &self.exit_evt
    }

    /// The current file's size in sectors, as the worker checks requests.
    pub fn capacity_sectors(&self) -> u64 {
        self.capacity_sectors
    }
}
