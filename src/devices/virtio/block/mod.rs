//! virtio-blk (virtio 1.x, 5.2) over a host file, in Firecracker's
//! semantics: requests IN, OUT, FLUSH and GET_ID; `VIRTIO_BLK_F_RO` for a
//! read-only drive; `VIRTIO_BLK_F_FLUSH` only with [`CacheType::Writeback`];
//! a configuration space holding only `capacity`; Firecracker's rate
//! limiter (each request an op token, IN and OUT their bytes too): a
//! refused request goes back to the avail ring and the thread waits for the
//! limiter's timer fd beside the queue, then goes on.
//!
//! What it owns, and how its threads talk:
//! - [`Block`] ([`device`]): features, the configuration space, activation
//!   and reset; the transport calls it from vCPU threads, the VMM from its
//!   event loop ([`Block::update_file`]). None of these calls does host I/O
//!   or waits for the device thread.
//! - All host I/O runs on the device's own thread
//!   ([`worker::BlockWorker`], in the shared loop
//!   [`crate::devices::virtio::Worker`]), which owns the backing file. It takes
//!   the running queue and guest memory (the *ring slot*, a mutex it shares
//!   with [`Block`]) only for guest-memory work: popping a chain, copying
//!   between guest memory and its bounce buffer, the status byte and the
//!   used ring. It never holds that lock, or anything else a vCPU or the VMM
//!   waits for, across `pread`/`pwrite`/`fdatasync`: a file that stalls (a
//!   hung NFS mount, a FIFO) stops this thread only. A reset empties the
//!   ring slot at once (waiting at most for one bounded copy); a request
//!   still in host I/O then finishes into nothing: its data and status are
//!   never written to the guest, and its chain is not returned.
//! - The VMM stops the thread by writing its exit eventfd and joining with a
//!   deadline; a thread stuck in host I/O is left behind and holds no guest
//!   memory view once the device is reset or dropped (both empty the ring
//!   slot), so reclaim is not held up by it.
//! - Request parsing ([`request`]) is a pure function over a descriptor
//!   chain; execution ([`worker`]) goes through the [`Disk`] trait
//!   ([`disk`]), which tests and the fuzz target implement with a recording
//!   backend.
//! - `io_engine: "Async"`: [`worker::uring`] (io_uring, many requests in flight,
//!   each through its own bounce buffer; the same reset rule).
//! - Counters: [`metrics::BlockMetrics`].

pub mod device;
pub mod disk;
pub mod metrics;
pub mod persist;
pub mod request;
#[cfg(test)]
mod test_disk;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_hostile;
#[cfg(test)]
mod tests_limits;
#[cfg(test)]
mod tests_snapshot;
#[cfg(test)]
mod tests_uring;
pub mod worker;

pub use device::{image_id, Block, BlockOptions, CacheType, IoEngine};
pub use disk::Disk;
pub use metrics::BlockMetrics;
pub use persist::BlockState;
pub use request::{RequestError, RequestType};
pub use worker::BlockWorker;

/// The virtio device ID of a block device.
pub const VIRTIO_ID_BLOCK: u32 = virtio_bindings::virtio_ids::VIRTIO_ID_BLOCK;

/// Feature bits (virtio 5.2.3).
pub mod features {
    use virtio_bindings::virtio_blk as b;
    /// The device is read-only.
    pub const RO: u64 = 1 << b::VIRTIO_BLK_F_RO;
    /// The device has a write cache and honours FLUSH.
    pub const FLUSH: u64 = 1 << b::VIRTIO_BLK_F_FLUSH;
}

/// Bytes per sector: capacities, offsets and data lengths are in these.
pub const SECTOR_BYTES: u64 = 512;
/// Bytes of a GET_ID answer (`VIRTIO_BLK_ID_BYTES`).
pub const ID_BYTES: usize = virtio_bindings::virtio_blk::VIRTIO_BLK_ID_BYTES as usize;
/// The one queue's size (Firecracker's).
pub const QUEUE_SIZE: u16 = 256;

/// Most descriptors of one request, indirect tables included (header and
/// status plus 254 data segments: what Linux sends at most on a 256-entry
/// queue without `VIRTIO_BLK_F_SEG_MAX`). virtio-queue ends a loop in a
/// chain after the queue size, but an indirect table may hold 65535
/// entries: a longer chain is dropped.
pub const MAX_DESCRIPTORS_PER_REQUEST: usize = QUEUE_SIZE as usize;
/// Most data bytes of one request: the virtio limit (a chain is at most
/// 2^32 bytes, virtio 1.2 2.7.5.2) rounded down to a sector, as
/// Firecracker's `u32` data length. Not tighter: without
/// `VIRTIO_BLK_F_SIZE_MAX` Linux sends up to `max_sectors_kb` (1280 KiB by
/// default, and the guest may raise it), and refusing those would be I/O
/// errors in a well-behaved guest. Host memory is bounded instead by
/// [`BOUNCE_BYTES`]: big requests are moved in chunks.
pub const MAX_REQUEST_DATA_BYTES: u64 = (u32::MAX as u64) / SECTOR_BYTES * SECTOR_BYTES;
/// The device thread's bounce buffer: data moves between the file and guest
/// memory through it, at most this much per `pread`/`pwrite`, so that no
/// host I/O ever targets guest memory directly (a reset during a stalled
/// read cannot have the read land in memory the guest got back).
pub const BOUNCE_BYTES: usize = 1 << 20;
/// Most chains taken in one pass; what is left waits for the next pass (the
/// thread wakes itself), so the exit eventfd is looked at in between.
pub const MAX_CHAINS_PER_PASS: usize = 64;

/// Status byte values (virtio 5.2.6).
pub mod status {
    use virtio_bindings::virtio_blk as b;
    /// Success.
    pub const OK: u8 = b::VIRTIO_BLK_S_OK as u8;
    /// Device or driver error.
    pub const IOERR: u8 = b::VIRTIO_BLK_S_IOERR as u8;
    /// Request type not supported.
    pub const UNSUPP: u8 = b::VIRTIO_BLK_S_UNSUPP as u8;
}

/// Errors of the block device (construction and its thread; a guest's
/// malformed requests are [`RequestError`]s, counted, never returned).
#[derive(Debug, thiserror::Error)]
pub enum BlockError {
    /// The backing file's size could not be read.
    #[error("cannot read the size of the drive's backing file: {0}")]
    FileSize(std::io::Error),
    /// An eventfd could not be made or signalled.
    #[error("block device eventfd: {0}")]
    EventFd(std::io::Error),
    /// A rate limiter that cannot be made (its timer) or taken.
    #[error("block rate limiter: {0}")]
    RateLimiter(#[from] crate::rate_limiter::RateLimiterError),
    /// `io_engine: "Async"` and the host refuses io_uring (its setup, or
    /// registering the completion eventfd, failed).
    #[error(
        "io_engine Async: the host refuses io_uring ({0}; see /proc/sys/kernel/io_uring_disabled)"
    )]
    IoUring(std::io::Error),
    /// `io_engine: "Async"` over a backing store that is not a file.
    #[error("io_engine Async needs a host file behind the drive")]
    NoFd,
    /// A second worker for the same device.
    #[error("the block device already has its worker (the backing file was handed over)")]
    WorkerExists,
    /// A snapshot's state that does not fit the drive as configured.
    #[error("the saved drive state does not fit: {0}")]
    BadState(String),
}
