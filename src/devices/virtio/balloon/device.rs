//! The balloon device: features, configuration space, target, activation
//! and reset. The queue work is in [`super::queues`]; it runs on the
//! balloon's thread, never in these calls.

use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vmm_sys_util::eventfd::EventFd;

use super::features::{DEFLATE_ON_OOM, MUST_TELL_HOST, REPORTING, STATS_VQ};
use super::metrics::BalloonMetrics;
use super::ranges::RamMap;
use super::sink::{Completion, DiscardAck, DiscardKind, DiscardSink, SinkWork};
use super::stats::BalloonStats;
use super::{BalloonError, CONFIG_SPACE_BYTES, PAGES_PER_MIB, QUEUE_SIZE, VIRTIO_ID_BALLOON};
use crate::devices::virtio::{
    ActivateError, ActiveState, ConfigSpace, DeviceMemory, DeviceOffer, Epoch, ResetFence,
    VirtioDevice, VirtioInterruptType, Wake, VIRTIO_F_VERSION_1,
};
use crate::memory::GuestRange;

/// What the balloon is made with (the API's `PUT /balloon`, checked).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BalloonOptions {
    /// The first target, MiB.
    pub amount_mib: u64,
    /// Offer `DEFLATE_ON_OOM`.
    pub deflate_on_oom: bool,
    /// Seconds between statistics updates; 0: no statistics queue.
    pub stats_polling_interval_s: u16,
    /// Offer free page reporting.
    pub free_page_reporting: bool,
    /// Free page hinting: refused.
    pub free_page_hinting: bool,
}

/// Which queue index does what, from the features the driver accepted
/// (virtio 5.5.2: absent queues take no index).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueLayout {
    /// Inflate (always 0).
    pub inflate: usize,
    /// Deflate (always 1).
    pub deflate: usize,
    /// Statistics, with `STATS_VQ`.
    pub stats: Option<usize>,
    /// Free page reporting, with `REPORTING`.
    pub reporting: Option<usize>,
}

impl QueueLayout {
    /// The layout for `acked` features.
    pub fn of(acked: u64) -> QueueLayout {
        let mut next = 2;
        let mut take = |on: bool| {
            on.then(|| {
                next += 1;
                next - 1
            })
        };
        let stats = take(acked & STATS_VQ != 0);
        let reporting = take(acked & REPORTING != 0);
        QueueLayout {
            inflate: 0,
            deflate: 1,
            stats,
            reporting,
        }
    }
}

/// What exists while the device runs (between `DRIVER_OK` and a reset):
/// the shared [`ActiveState`] (guest memory, queues, interrupt, features,
/// epoch) and what the balloon keeps beside it for that activation. Queues
/// with work left over are marked on the balloon's [`Wake`].
pub(super) struct Active<M: DeviceMemory> {
    pub state: ActiveState<M>,
    pub ram: RamMap,
    pub layout: QueueLayout,
    /// The statistics buffer the device holds until the next update.
    pub stats_head: Option<u16>,
    pub next_stats_at: Option<Instant>,
    /// The driver accepted MUST_TELL_HOST (else an inflate is answered
    /// only once its pages are freed).
    pub must_tell: bool,
}

/// A batch handed to the sink and not yet completed: its ranges (sorted,
/// merged) may still be freed, so no page of them goes back to the guest.
#[derive(Debug)]
pub(super) struct InFlightBatch {
    pub id: u64,
    pub ranges: Vec<GuestRange>,
}

/// Chains whose pages the guest takes back (deflated, or reported and
/// freed), held until no batch in flight covers them.
#[derive(Debug)]
pub(super) struct Parked {
    pub epoch: Epoch,
    pub queue: usize,
    pub heads: Vec<u16>,
    /// Sorted, merged.
    pub ranges: Vec<GuestRange>,
}

/// A virtio-balloon.
pub struct Balloon<M: DeviceMemory> {
    pub(super) opts: BalloonOptions,
    offer: DeviceOffer,
    pub(super) ram_mib: u64,
    pub(super) num_pages: u32,
    pub(super) actual_pages: u32,
    pub(super) config_generation: u32,
    pub(super) discard_page_bytes: u64,
    pub(super) sink: Arc<dyn DiscardSink>,
    pub(super) metrics: Arc<BalloonMetrics>,
    pub(super) stats: BalloonStats,
    pub(super) stats_interval: Duration,
    /// A completion of an earlier activation (its epoch not this one's) is
    /// stale.
    pub(super) active: Option<Active<M>>,
    pub(super) completion_tx: Sender<Completion>,
    pub(super) completion_rx: Receiver<Completion>,
    pub(super) wake: Arc<Wake>,
    /// Every ack from its making to its completion: what a reset waits for
    /// (a driver that never polls Status, as Linux's).
    pub(super) fence: Arc<ResetFence>,
    /// Batches at the sink, across resets (at most
    /// [`super::MAX_INFLIGHT_BATCHES`]: a reset is not complete until they
    /// end, so a new activation starts with none).
    pub(super) in_flight: Vec<InFlightBatch>,
    pub(super) next_batch: u64,
    /// Chains waiting for batches in flight (at most
    /// [`super::MAX_PARKED_DEFLATES`] deflate passes plus one per batch).
    pub(super) parked: Vec<Parked>,
    /// Batches of this pass, for the sink once the lock is let go.
    pub(super) outbox: Vec<(DiscardKind, Vec<GuestRange>, DiscardAck)>,
    /// Held for a snapshot: no new batch goes to the sink.
    pub(super) holding: bool,
}

impl<M: DeviceMemory> std::fmt::Debug for Balloon<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Balloon")
            .field("opts", &self.opts)
            .field("num_pages", &self.num_pages)
            .field("actual_pages", &self.actual_pages)
            .field("active", &self.active.is_some())
            .finish_non_exhaustive()
    }
}

impl<M: DeviceMemory> Balloon<M> {
    /// A balloon for a guest of `ram_mib` MiB, discarding whole pages of
    /// `discard_page_bytes` (4 KiB, or the huge page size) through `sink`.
    pub fn new(
        opts: BalloonOptions,
        ram_mib: u64,
        discard_page_bytes: u64,
        sink: Arc<dyn DiscardSink>,
    ) -> Result<Balloon<M>, BalloonError> {
        if opts.free_page_hinting {
            return Err(BalloonError::HintingNotSupported);
        }
        let num_pages = Self::pages_for(opts.amount_mib, ram_mib)?;
        // Inflate and deflate, then the statistics and reporting queues
        // when offered (all of one size).
        const QUEUE_SIZES: [u16; 4] = [QUEUE_SIZE; 4];
        let mut avail_features = VIRTIO_F_VERSION_1 | MUST_TELL_HOST;
        let mut queues = 2;
        if opts.stats_polling_interval_s > 0 {
            avail_features |= STATS_VQ;
            queues += 1;
        }
        if opts.deflate_on_oom {
            avail_features |= DEFLATE_ON_OOM;
        }
        if opts.free_page_reporting {
            avail_features |= REPORTING;
            queues += 1;
        }
        let offer = DeviceOffer {
            device_type: VIRTIO_ID_BALLOON,
            avail_features,
            queue_sizes: &QUEUE_SIZES[..queues],
        };
        let (completion_tx, completion_rx) = channel();
        Ok(Balloon {
            opts,
            offer,
            ram_mib,
            num_pages,
            actual_pages: 0,
            config_generation: 0,
            discard_page_bytes,
            sink,
            metrics: Arc::new(BalloonMetrics::default()),
            stats: BalloonStats::default(),
            stats_interval: Duration::from_secs(u64::from(opts.stats_polling_interval_s)),
            active: None,
            completion_tx,
            completion_rx,
            wake: Arc::new(Wake::new().map_err(BalloonError::EventFd)?),
            fence: Arc::new(ResetFence::default()),
            in_flight: Vec::new(),
            holding: false,
            next_batch: 0,
            parked: Vec::new(),
            outbox: Vec::new(),
        })
    }

    pub(super) fn pages_for(amount_mib: u64, ram_mib: u64) -> Result<u32, BalloonError> {
        if amount_mib > ram_mib {
            return Err(BalloonError::TargetAboveRam {
                amount_mib,
                ram_mib,
            });
        }
        u32::try_from(amount_mib * PAGES_PER_MIB).map_err(|_| BalloonError::TargetAboveRam {
            amount_mib,
            ram_mib: u64::from(u32::MAX) / PAGES_PER_MIB,
        })
    }

    /// `PATCH /balloon`: a new target; the guest is told by a configuration
    /// interrupt (if the device runs).
    pub fn set_target(&mut self, amount_mib: u64) -> Result<(), BalloonError> {
        self.num_pages = Self::pages_for(amount_mib, self.ram_mib)?;
        self.opts.amount_mib = amount_mib;
        self.config_generation = self.config_generation.wrapping_add(1);
        if let Some(a) = &self.active {
            if a.state
                .interrupt
                .trigger(VirtioInterruptType::Config)
                .is_err()
            {
                self.metrics.event_fails.inc();
            }
        }
        Ok(())
    }

    /// `PATCH /balloon/statistics`: a new interval. Statistics cannot be
    /// switched on or off once the device exists (Firecracker's rule).
    pub fn set_stats_polling_interval(&mut self, secs: u16) -> Result<(), BalloonError> {
        match (self.opts.stats_polling_interval_s > 0, secs > 0) {
            (false, true) => return Err(BalloonError::StatsSwitch("on", "0")),
            (true, false) => return Err(BalloonError::StatsSwitch("off", "above 0")),
            _ => {}
        }
        self.opts.stats_polling_interval_s = secs;
        self.stats_interval = Duration::from_secs(u64::from(secs));
        if let Some(a) = &mut self.active {
            a.next_stats_at = Some(Instant::now() + self.stats_interval);
        }
        Ok(())
    }

    /// The options as they are now (the target follows `set_target`).
    pub fn options(&self) -> BalloonOptions {
        self.opts
    }

    /// The target, in 4 KiB pages (`num_pages`).
    pub fn target_pages(&self) -> u32 {
        self.num_pages
    }

    /// What the guest says it holds, in 4 KiB pages (`actual`).
    pub fn actual_pages(&self) -> u32 {
        self.actual_pages
    }

    /// The target, MiB.
    pub fn target_mib(&self) -> u64 {
        u64::from(self.num_pages) / PAGES_PER_MIB
    }

    /// What the guest holds, MiB (rounded down).
    pub fn actual_mib(&self) -> u64 {
        u64::from(self.actual_pages) / PAGES_PER_MIB
    }

    /// The guest's latest statistics (an error when the statistics queue is
    /// off).
    pub fn latest_stats(&self) -> Result<&BalloonStats, BalloonError> {
        if self.opts.stats_polling_interval_s == 0 {
            return Err(BalloonError::StatsDisabled);
        }
        Ok(&self.stats)
    }

    /// The counters.
    pub fn metrics(&self) -> &Arc<BalloonMetrics> {
        &self.metrics
    }

    /// The eventfd the balloon's thread polls besides the queue eventfds:
    /// sink completions and left-over work.
    pub fn wake_evt(&self) -> &EventFd {
        self.wake.evt()
    }

    /// The wake eventfd with the queues marked for another pass (what
    /// [`Self::process_wake`] is given).
    pub fn wake(&self) -> &Arc<Wake> {
        &self.wake
    }

    /// The batches the last pass made, to hand to the sink with the lock let
    /// go ([`SinkWork::send`]). The balloon's thread calls this after every
    /// call into the balloon.
    pub fn take_sink_work(&mut self) -> SinkWork {
        SinkWork {
            sink: self.sink.clone(),
            batches: std::mem::take(&mut self.outbox),
        }
    }

    /// Batches handed to the sink and not completed yet.
    pub fn batches_in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// Chains held back until the discards covering their pages end.
    pub fn chains_parked(&self) -> usize {
        self.parked.iter().map(|p| p.heads.len()).sum()
    }

    /// Whether the device runs (between `DRIVER_OK` and a reset).
    pub fn is_active(&self) -> bool {
        self.active.is_some()
    }

    /// The queue layout while the device runs.
    pub fn layout(&self) -> Option<QueueLayout> {
        self.active.as_ref().map(|a| a.layout)
    }

    /// The running activation's epoch (None: not running).
    pub(super) fn epoch(&self) -> Option<Epoch> {
        self.active.as_ref().map(|a| a.state.epoch())
    }
}

impl<M: DeviceMemory> VirtioDevice<M> for Balloon<M> {
    fn offer(&self) -> DeviceOffer {
        self.offer
    }

    fn config_space(&self) -> ConfigSpace {
        // `num_pages`, then `actual` (u32 LE each).
        let mut b = [0u8; CONFIG_SPACE_BYTES];
        b[0..4].copy_from_slice(&self.num_pages.to_le_bytes());
        b[4..8].copy_from_slice(&self.actual_pages.to_le_bytes());
        ConfigSpace::new(&b)
    }

    fn config_writable(&self) -> std::ops::Range<usize> {
        // Only `actual` is the driver's to write.
        4..8
    }

    fn config_written(&mut self, b: &[u8]) {
        self.actual_pages = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
    }

    fn config_generation(&self) -> u32 {
        self.config_generation
    }

    fn activate(&mut self, active: ActiveState<M>) -> Result<(), ActivateError> {
        let layout = QueueLayout::of(active.acked_features);
        let must_tell = active.acked_features & MUST_TELL_HOST != 0;
        let needed = [
            Some(layout.inflate),
            Some(layout.deflate),
            layout.stats,
            layout.reporting,
        ];
        active
            .check(self.active.is_some(), needed.into_iter().flatten())
            .inspect_err(|_| self.metrics.activate_fails.inc())?;
        self.drain_completions();
        if !self.in_flight.is_empty() {
            // The transport refuses DRIVER_OK until the reset completed.
            self.metrics.activate_fails.inc();
            return Err(ActivateError::ResetInProgress);
        }
        let ram = RamMap::of(&*active.mem, self.discard_page_bytes);
        let queues: Vec<usize> = (0..active.queues.len()).collect();
        self.active = Some(Active {
            state: active,
            ram,
            layout,
            stats_head: None,
            next_stats_at: layout.stats.map(|_| Instant::now() + self.stats_interval),
            must_tell,
        });
        // Buffers added before DRIVER_OK (Linux adds the statistics buffer
        // then): look at every queue once.
        self.wake.again(&queues).map_err(ActivateError::Signal)
    }

    fn queue_positions(&self) -> Option<Vec<crate::devices::virtio::QueuePosition>> {
        self.active.as_ref().map(|a| a.state.positions())
    }

    fn reset(&mut self) {
        // Drops the queues, the chains held back and the guest memory.
        // Batches still at the sink complete into a stale epoch: their
        // chains are not returned, but the reset is complete only once they
        // ended (`reset_in_progress`), for the guest owns all its memory
        // again then.
        self.active = None;
        self.wake.clear();
        self.actual_pages = 0;
        self.parked.clear();
        self.outbox.clear();
        self.drain_completions();
    }

    fn reset_in_progress(&mut self) -> bool {
        self.drain_completions();
        self.active.is_none() && !self.in_flight.is_empty()
    }

    fn reset_fence(&self) -> Option<Arc<ResetFence>> {
        Some(self.fence.clone())
    }
}
