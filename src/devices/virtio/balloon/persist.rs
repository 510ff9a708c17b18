//! The balloon's state in a snapshot ([`BalloonState`], Firecracker's
//! `BalloonState`): the target and what the guest says it holds (the
//! configuration space), the statistics interval, and the statistics
//! buffer the device holds until its next update (the guest posted it
//! once and waits for it back).
//!
//! Holding it still ([`Balloon::hold_discards`]): no new batch goes to the
//! sink; [`Balloon::settled`] says when the batches in flight have ended
//! and the chains they held back are returned, so no discard runs while
//! the memory is saved.

use serde::{Deserialize, Serialize};
use virtio_queue::QueueT;

use super::{Balloon, BalloonError};
use crate::devices::virtio::DeviceMemory;

/// What the balloon keeps in a snapshot beside its transport.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BalloonState {
    /// `num_pages`: the target, in 4 KiB pages.
    pub target_pages: u32,
    /// The target as the API gave it, MiB.
    pub target_mib: u64,
    /// `actual`: what the guest says it holds, in 4 KiB pages.
    pub actual_pages: u32,
    /// The statistics interval, seconds (0: none).
    pub stats_polling_interval_s: u16,
    /// The statistics buffer the device holds, if any (its head).
    pub stats_desc_index: Option<u16>,
    /// Offered `VIRTIO_BALLOON_F_DEFLATE_ON_OOM`.
    pub deflate_on_oom: bool,
    /// Offered `VIRTIO_BALLOON_F_REPORTING`.
    pub free_page_reporting: bool,
    /// The configuration generation.
    pub config_generation: u32,
}

fn bad(why: String) -> BalloonError {
    BalloonError::BadState(why)
}

impl<M: DeviceMemory> Balloon<M> {
    /// Holds the balloon from sending new batches to its sink (`true`), or
    /// lets it go on (`false`; the caller wakes its thread).
    pub fn hold_discards(&mut self, on: bool) {
        self.holding = on;
    }

    /// Whether no batch is in flight and no chain waits for one (the
    /// completions that came are taken first).
    pub fn settled(&mut self) -> bool {
        self.drain_completions();
        self.in_flight.is_empty() && self.parked.is_empty() && self.outbox.is_empty()
    }

    /// Its state now.
    pub fn save_state(&self) -> BalloonState {
        BalloonState {
            target_pages: self.num_pages,
            target_mib: self.opts.amount_mib,
            actual_pages: self.actual_pages,
            stats_polling_interval_s: self.opts.stats_polling_interval_s,
            stats_desc_index: self.active.as_ref().and_then(|a| a.stats_head),
            deflate_on_oom: self.opts.deflate_on_oom,
            free_page_reporting: self.opts.free_page_reporting,
            config_generation: self.config_generation,
        }
    }

    /// Puts the state back on a balloon made from the same configuration,
    /// after its transport restarted it (the statistics buffer goes back to
    /// its running queue).
    pub fn restore_state(&mut self, s: &BalloonState) -> Result<(), BalloonError> {
        if s.deflate_on_oom != self.opts.deflate_on_oom
            || s.free_page_reporting != self.opts.free_page_reporting
        {
            return Err(bad(format!(
                "saved deflate_on_oom {} and free_page_reporting {}, configured {} and {}",
                s.deflate_on_oom,
                s.free_page_reporting,
                self.opts.deflate_on_oom,
                self.opts.free_page_reporting
            )));
        }
        if (s.stats_polling_interval_s > 0) != (self.opts.stats_polling_interval_s > 0) {
            return Err(bad(format!(
                "saved statistics interval {} s, configured {} s (statistics cannot be \
                 switched on or off)",
                s.stats_polling_interval_s, self.opts.stats_polling_interval_s
            )));
        }
        let pages = Self::pages_for(s.target_mib, self.ram_mib)?;
        if pages != s.target_pages {
            return Err(bad(format!(
                "target {} pages is not {} MiB",
                s.target_pages, s.target_mib
            )));
        }
        if let Some(head) = s.stats_desc_index {
            let size = self
                .active
                .as_ref()
                .and_then(|a| a.layout.stats.and_then(|q| a.state.queues.get(q)))
                .map(|q| q.size());
            match size {
                Some(size) if head < size => {}
                _ => {
                    return Err(bad(format!(
                        "statistics buffer {head} without a running statistics queue that has it"
                    )))
                }
            }
        }
        self.num_pages = s.target_pages;
        self.opts.amount_mib = s.target_mib;
        self.actual_pages = s.actual_pages;
        self.config_generation = s.config_generation;
        self.set_stats_polling_interval(s.stats_polling_interval_s)?;
        if let Some(a) = self.active.as_mut() {
            a.stats_head = s.stats_desc_index;
        }
        Ok(())
    }
}
