//! The block device: features, configuration space, activation, reset and
//! the backing-file swap. Nothing here does host I/O on the file or waits
//! for the device thread: the transport calls these from vCPU threads and
//! the VMM from its event loop.

use std::fs::File;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use vmm_sys_util::eventfd::EventFd;

use super::disk::{disk_size, Disk};
use super::metrics::BlockMetrics;
use super::{features, BlockError, ID_BYTES, QUEUE_SIZE, SECTOR_BYTES, VIRTIO_ID_BLOCK};
use crate::devices::virtio::{
    ActivateError, ActiveState, ConfigAccess, ConfigSpace, DeviceMemory, DeviceOffer, VirtioDevice,
    Wake, VIRTIO_F_VERSION_1,
};
use crate::rate_limiter::RateLimiterConfig;

/// Firecracker's `cache_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CacheType {
    /// FLUSH is not offered; a FLUSH the guest sends anyway is answered OK
    /// without syncing. (Firecracker still runs `fsync` for it.)
    #[default]
    Unsafe,
    /// `VIRTIO_BLK_F_FLUSH` is offered; FLUSH runs `fdatasync` on the file.
    Writeback,
}

/// Firecracker's `io_engine`: how the device thread does its host I/O.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IoEngine {
    /// Blocking `pread`/`pwrite`/`fdatasync` on the device thread, one
    /// request at a time.
    #[default]
    Sync,
    /// io_uring ([`crate::devices::virtio::block::worker::uring`]): reads, writes and flushes submitted as
    /// SQEs, many in flight, answered as they complete.
    Async,
}

/// What a drive is made with (the API's `PUT /drives/{id}`, checked).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BlockOptions {
    /// The drive's id (GET_ID answers it only where the backing store is
    /// not a file: [`image_id`]).
    pub drive_id: String,
    /// Offer `VIRTIO_BLK_F_RO` and answer OUT with IOERR (the file is
    /// opened read-only as well).
    pub read_only: bool,
    /// Whether FLUSH is offered.
    pub cache_type: CacheType,
    /// Firecracker's `rate_limiter`: each request takes an op token, IN and
    /// OUT their data bytes as well (none: no limit).
    pub rate_limiter: RateLimiterConfig,
    /// The I/O engine.
    pub io_engine: IoEngine,
}

/// What GET_ID answers for a host file, as Firecracker computes it (and
/// kvmtool): `format!("{st_dev}{st_rdev}{st_ino}")` of its `stat`, cut to
/// 20 bytes and zero-padded. None when the file cannot be `stat`ed
/// (Firecracker then answers 20 zero bytes; teravm its drive id).
pub fn image_id(file: &File) -> Option<[u8; ID_BYTES]> {
    use std::os::unix::fs::MetadataExt;
    let m = file.metadata().ok()?;
    let text = format!("{}{}{}", m.dev(), m.rdev(), m.ino());
    let mut id = [0u8; ID_BYTES];
    let n = text.len().min(ID_BYTES);
    id[..n].copy_from_slice(&text.as_bytes()[..n]);
    Some(id)
}

impl BlockOptions {
    /// The drive id's first 20 bytes, zero-padded: what GET_ID answers for
    /// a backing store that is not a file ([`image_id`] for a file).
    pub fn disk_id(&self) -> [u8; ID_BYTES] {
        let mut id = [0u8; ID_BYTES];
        let b = self.drive_id.as_bytes();
        let n = b.len().min(ID_BYTES);
        id[..n].copy_from_slice(&b[..n]);
        id
    }
}

/// A backing store handed over by `PATCH /drives`, and its GET_ID answer
/// ([`image_id`]; None: keep the old one).
pub(super) type PendingDisk = (Box<dyn Disk>, Option<[u8; ID_BYTES]>);

/// The running activation: a request begun under another epoch
/// ([`ActiveState::epoch`]) is stale.
pub(super) type Ring<M> = Option<ActiveState<M>>;

/// What the device and its thread share.
pub(super) struct BlockShared<M: DeviceMemory> {
    /// The running queue, memory and interrupt. The device thread locks it
    /// only for guest-memory work (bounded copies, the used ring), never
    /// across host I/O; activation and reset lock it from a vCPU.
    pub ring: Mutex<Ring<M>>,
    /// The drive's size in sectors, as the thread's current file has it.
    pub capacity_sectors: AtomicU64,
    /// Bumped whenever the capacity changes.
    pub config_generation: AtomicU32,
    /// A file handed over by [`Block::update_file`], swapped in by the
    /// thread between requests.
    pub pending_disk: Mutex<Option<PendingDisk>>,
    /// A rate limiter update handed over by [`Block::update_rate_limiter`],
    /// applied by the thread between requests.
    pub pending_limiter: Mutex<Option<RateLimiterConfig>>,
    /// Wakes the thread: activation, a pending file, left-over work.
    pub wake: Arc<Wake>,
    pub metrics: Arc<BlockMetrics>,
    /// Set while the devices are held for a snapshot: the thread takes no
    /// new chain, and finishes those in host I/O.
    pub holding: AtomicBool,
    /// Requests in host I/O (io_uring), as the thread left it after its
    /// last pass.
    pub in_flight: AtomicUsize,
}

impl<M: DeviceMemory> BlockShared<M> {
    pub fn ring(&self) -> MutexGuard<'_, Ring<M>> {
        self.ring.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A virtio-blk device over a host file.
pub struct Block<M: DeviceMemory> {
    pub(super) opts: BlockOptions,
    offer: DeviceOffer,
    pub(super) shared: Arc<BlockShared<M>>,
    /// The file until the worker takes it.
    pub(super) disk: Option<Box<dyn Disk>>,
    /// What GET_ID answers for it ([`image_id`]); None: the drive id.
    pub(super) image_id: Option<[u8; ID_BYTES]>,
}

impl<M: DeviceMemory> std::fmt::Debug for Block<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Block")
            .field("opts", &self.opts)
            .field("capacity_sectors", &self.capacity_sectors())
            .field("active", &self.is_active())
            .finish_non_exhaustive()
    }
}

impl<M: DeviceMemory> Block<M> {
    /// A drive over `file`, already opened (by teravm's files thread;
    /// read-only when `opts.read_only`). Its size is read here (`lseek`):
    /// the capacity is the size in whole 512-byte sectors, and trailing
    /// bytes of a size that is not a multiple of 512 are not addressable by
    /// the guest (as in Firecracker, which warns about it).
    /// GET_ID answers [`image_id`] of the file, as Firecracker does.
    pub fn new(opts: BlockOptions, file: File) -> Result<Block<M>, BlockError> {
        let id = image_id(&file);
        let mut b = Self::with_disk(opts, Box::new(file))?;
        b.image_id = id;
        Ok(b)
    }

    /// A drive over any [`Disk`] (tests and the fuzz harness).
    pub fn with_disk(opts: BlockOptions, disk: Box<dyn Disk>) -> Result<Block<M>, BlockError> {
        let size = disk_size(&*disk).map_err(BlockError::FileSize)?;
        if size % SECTOR_BYTES != 0 {
            log::warn!(
                "drive {}: size {size} is not a multiple of {SECTOR_BYTES}; the last {} bytes \
                 are not visible to the guest",
                opts.drive_id,
                size % SECTOR_BYTES
            );
        }
        let mut avail_features = VIRTIO_F_VERSION_1;
        if opts.read_only {
            avail_features |= features::RO;
        }
        if opts.cache_type == CacheType::Writeback {
            avail_features |= features::FLUSH;
        }
        let shared = Arc::new(BlockShared {
            ring: Mutex::new(None),
            capacity_sectors: AtomicU64::new(size / SECTOR_BYTES),
            config_generation: AtomicU32::new(0),
            pending_disk: Mutex::new(None),
            pending_limiter: Mutex::new(None),
            wake: Arc::new(Wake::new().map_err(BlockError::EventFd)?),
            metrics: Arc::new(BlockMetrics::default()),
            holding: AtomicBool::new(false),
            in_flight: AtomicUsize::new(0),
        });
        Ok(Block {
            opts,
            offer: DeviceOffer {
                device_type: VIRTIO_ID_BLOCK,
                avail_features,
                queue_sizes: &[QUEUE_SIZE],
            },
            shared,
            disk: Some(disk),
            image_id: None,
        })
    }

    /// `PATCH /drives/{id}` with a new `path_on_host`: hands `file` (opened
    /// like the first) to the device thread and returns at once. The thread
    /// swaps it in between two requests (never in the middle of one), reads
    /// its size, closes the old file, bumps the configuration generation
    /// and raises a configuration interrupt so that the guest reads the new
    /// capacity. Done when [`super::BlockMetrics::update_count`]
    /// grows (or `update_fails`, if its size cannot be read: the old file
    /// stays). A file handed over before the last one was swapped replaces
    /// it.
    /// GET_ID then answers the new file's [`image_id`] (Firecracker's).
    pub fn update_file(&self, file: File) -> Result<(), BlockError> {
        let id = image_id(&file);
        self.hand_over(Box::new(file), id)
    }

    /// [`Self::update_file`] for any [`Disk`] (GET_ID's answer unchanged).
    pub fn update_disk(&self, disk: Box<dyn Disk>) -> Result<(), BlockError> {
        self.hand_over(disk, None)
    }

    fn hand_over(&self, disk: Box<dyn Disk>, id: Option<[u8; ID_BYTES]>) -> Result<(), BlockError> {
        let old = self
            .shared
            .pending_disk
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .replace((disk, id));
        // A file never swapped in is closed here: it was never used, so its
        // close cannot wait on outstanding writes.
        drop(old);
        self.shared.wake.again(&[]).map_err(BlockError::EventFd)
    }

    /// `PATCH /drives/{id}` with a `rate_limiter`: hands the update to the
    /// device thread and returns at once; the thread applies it between two
    /// requests ([`crate::rate_limiter::RateLimiter::update`]: a bucket
    /// left out stays, one that limits nothing is removed, any other
    /// replaced by a full one) and runs a pass (a removed limit lets the
    /// queue go at once). Updates not yet applied are combined.
    pub fn update_rate_limiter(&self, update: &RateLimiterConfig) -> Result<(), BlockError> {
        update.check()?;
        {
            let mut p = self
                .shared
                .pending_limiter
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let old = p.take().unwrap_or_default();
            *p = Some(RateLimiterConfig {
                bandwidth: update.bandwidth.or(old.bandwidth),
                ops: update.ops.or(old.ops),
            });
        }
        self.shared.wake.again(&[]).map_err(BlockError::EventFd)
    }

    /// The options it was made with.
    pub fn options(&self) -> &BlockOptions {
        &self.opts
    }

    /// The drive's size in sectors (the current file's, once swapped in).
    pub fn capacity_sectors(&self) -> u64 {
        self.shared.capacity_sectors.load(Ordering::SeqCst)
    }

    /// The counters.
    pub fn metrics(&self) -> &Arc<BlockMetrics> {
        &self.shared.metrics
    }

    /// The eventfd the device thread polls besides the queue's: activation,
    /// a new file, left-over work.
    pub fn wake_evt(&self) -> &EventFd {
        self.shared.wake.evt()
    }

    /// Whether the device runs (between `DRIVER_OK` and a reset).
    pub fn is_active(&self) -> bool {
        self.shared.ring().is_some()
    }
}

impl<M: DeviceMemory> VirtioDevice<M> for Block<M> {
    fn offer(&self) -> DeviceOffer {
        self.offer
    }

    fn config_space(&self) -> ConfigSpace {
        // `capacity` (u64 LE, sectors), read-only.
        ConfigSpace::new(&self.capacity_sectors().to_le_bytes())
    }

    fn config_refused(&self, _access: ConfigAccess) {
        // Writes (Firecracker refuses and counts them) and reads past the end.
        self.shared.metrics.cfg_fails.inc();
    }

    fn config_generation(&self) -> u32 {
        self.shared.config_generation.load(Ordering::SeqCst)
    }

    fn activate(&mut self, active: ActiveState<M>) -> Result<(), ActivateError> {
        let mut ring = self.shared.ring();
        active
            .check(ring.is_some(), [0])
            .inspect_err(|_| self.shared.metrics.activate_fails.inc())?;
        *ring = Some(active);
        drop(ring);
        // Chains added before DRIVER_OK get a pass.
        self.shared.wake.again(&[]).map_err(ActivateError::Signal)
    }

    fn queue_positions(&self) -> Option<Vec<crate::devices::virtio::QueuePosition>> {
        self.shared.ring().as_ref().map(ActiveState::positions)
    }

    fn reset(&mut self) {
        // Drops the queue and the guest memory now; a request in host I/O
        // finds its epoch gone and writes nothing back.
        *self.shared.ring() = None;
    }
}

impl<M: DeviceMemory> Drop for Block<M> {
    fn drop(&mut self) {
        // A device thread stuck in host I/O keeps `shared`: it must not keep
        // the guest memory view (reclaim would wait for it).
        *self.shared.ring() = None;
    }
}
