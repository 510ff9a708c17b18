//! virtio-balloon (virtio 1.x, 5.5), as Firecracker 1.14 offers it:
//! inflate, deflate, statistics and free page reporting. Free page hinting
//! is refused (see [`BalloonError::HintingNotSupported`]).
//!
//! What it owns, and how its threads talk:
//! - [`Balloon`] ([`device`]): features, the configuration space
//!   (`num_pages`, `actual`), the target, the latest statistics; the
//!   transport calls it from vCPU threads (config reads and writes,
//!   activation, reset), the VMM from its event loop ([`Balloon::set_target`]).
//! - The queue work ([`queues`]) runs only on the balloon's own thread
//!   ([`worker::BalloonWorker`], in the shared loop [`crate::devices::virtio::Worker`]): it polls the queue eventfds, the
//!   balloon's wake eventfd (sink completions, more work) and the statistics
//!   deadline, and locks the balloon for one bounded pass per event.
//! - Inflated and reported ranges are clipped to guest RAM and aligned
//!   inward ([`ranges`]), then handed to a [`DiscardSink`] ([`sink`]) with a
//!   [`DiscardAck`], with no lock of the balloon held ([`SinkWork`]);
//!   inflated chains are acknowledged at once, reported chains when the ack
//!   says the ranges are freed. A page goes back to the guest (a deflate, a
//!   report, a reset) only once every batch that covers it has ended: the
//!   chain is parked until then, and a reset completes (Status reads 0) only
//!   when no batch is in flight ([`crate::devices::virtio::VirtioDevice::reset_in_progress`]).
//! - Counters: [`metrics::BalloonMetrics`].

pub mod device;
pub mod metrics;
pub mod persist;
pub mod queues;
pub mod ranges;
pub mod sink;
pub mod stats;
#[cfg(test)]
mod tests;
pub mod worker;

pub use device::{Balloon, BalloonOptions, QueueLayout};
pub use metrics::BalloonMetrics;
pub use persist::BalloonState;
pub use ranges::{RamMap, BALLOON_PAGE_BYTES};
pub use sink::{DiscardAck, DiscardKind, DiscardSink, SinkWork};
pub use stats::BalloonStats;
pub use worker::BalloonWorker;

/// The virtio device ID of a balloon.
pub const VIRTIO_ID_BALLOON: u32 = 5;

/// Feature bits (virtio 5.5.3).
pub mod features {
    /// The host must be told before the guest reuses balloon pages.
    pub const MUST_TELL_HOST: u64 = 1 << 0;
    /// A statistics queue is present.
    pub const STATS_VQ: u64 = 1 << 1;
    /// The guest deflates when it runs out of memory.
    pub const DEFLATE_ON_OOM: u64 = 1 << 2;
    /// Free page hinting (not offered by teravm).
    pub const FREE_PAGE_HINT: u64 = 1 << 3;
    /// Page poisoning (not offered).
    pub const PAGE_POISON: u64 = 1 << 4;
    /// Free page reporting.
    pub const REPORTING: u64 = 1 << 5;
}

/// Each queue's size (Firecracker's).
pub const QUEUE_SIZE: u16 = 256;
/// Bytes of the configuration space (`num_pages`, `actual`,
/// `free_page_hint_cmd_id`, `poison_val`).
pub const CONFIG_SPACE_BYTES: usize = 16;
/// 4 KiB balloon pages per MiB.
pub const PAGES_PER_MIB: u64 = (1 << 20) / BALLOON_PAGE_BYTES;

/// Most PFNs read from one inflate or deflate chain (Linux sends 256); the
/// rest of a longer chain is refused and counted.
pub const MAX_PFNS_PER_CHAIN: usize = 4096;
/// Most chains taken from one queue in one pass; what is left waits for the
/// next pass (the balloon wakes its own thread), so one notification is
/// bounded work.
pub const MAX_CHAINS_PER_PASS: usize = 64;
/// Most batches at the sink at once; past it, inflate and reporting chains
/// wait in their rings until a batch completes.
pub const MAX_INFLIGHT_BATCHES: usize = 16;
/// Most deflate passes held back at once because discards still cover
/// their pages; past it, deflate chains wait in their ring.
pub const MAX_PARKED_DEFLATES: usize = 4;

/// Errors of the balloon.
#[derive(Debug, thiserror::Error)]
pub enum BalloonError {
    /// Free page hinting asked for.
    #[error(
        "free_page_hinting is not supported: the guest takes hinted pages back when the \
         hinting run ends without telling the device, so a discard still in flight could \
         zero a page the guest already reuses; use free_page_reporting, which the guest \
         waits on until the pages are freed"
    )]
    HintingNotSupported,
    /// A target above the guest's RAM.
    #[error("the balloon target {amount_mib} MiB is above the guest's RAM ({ram_mib} MiB)")]
    TargetAboveRam {
        /// The target asked for.
        amount_mib: u64,
        /// The guest's RAM.
        ram_mib: u64,
    },
    /// Statistics turned on or off after the device was made.
    #[error(
        "statistics polling cannot be turned {0} once the balloon exists \
         (stats_polling_interval_s must stay {1})"
    )]
    StatsSwitch(&'static str, &'static str),
    /// The statistics queue has not been set up by the guest.
    #[error("statistics are not enabled")]
    StatsDisabled,
    /// An eventfd could not be made.
    #[error("cannot create the balloon's eventfd: {0}")]
    EventFd(std::io::Error),
    /// A snapshot's state that does not fit the balloon as configured.
    #[error("the saved balloon state does not fit: {0}")]
    BadState(String),
}
