//! The balloon's queue work, run only on the balloon's thread: one bounded
//! pass per queue event ([`Balloon::process_queue`]), sink completions and
//! left-over work ([`Balloon::process_wake`]), statistics updates
//! ([`Balloon::process_stats_timer`]).
//!
//! Descriptor chains come from virtio-queue (its TTL ends loops); the
//! balloon reads at most [`MAX_PFNS_PER_CHAIN`] PFNs of a chain's readable
//! part and takes at most [`MAX_CHAINS_PER_PASS`] chains per pass. Every
//! range is clipped to guest RAM before the sink sees it. Every chain taken
//! is returned to the guest (used ring), whatever was wrong with it.

use std::time::{Duration, Instant};

use virtio_queue::{DescriptorChain, Queue, QueueT};
use vm_memory::{Bytes, GuestMemory};

use super::device::Active;
use super::metrics::BalloonMetrics;
use super::ranges::{pfns_to_ranges, GuestRange};
use super::sink::{Completion, DiscardAck, DiscardKind};
use super::stats::{MAX_STAT_ENTRIES, STAT_ENTRY_BYTES};
use super::{Balloon, MAX_CHAINS_PER_PASS, MAX_INFLIGHT_BATCHES, MAX_PFNS_PER_CHAIN};
use crate::devices::virtio::{DeviceMemory, VirtioInterruptType};

/// Reads up to `out.len()` bytes of the chain's device-readable buffers;
/// returns how many were read and whether the chain had more, or a
/// descriptor outside guest memory.
fn read_chain<G: GuestMemory>(
    mem: &G,
    chain: DescriptorChain<&G>,
    out: &mut [u8],
) -> (usize, bool, bool) {
    let (mut n, mut more, mut bad) = (0usize, false, false);
    for desc in chain.readable() {
        let want = (desc.len() as usize).min(out.len() - n);
        if want < desc.len() as usize {
            more = true;
        }
        if want > 0 && mem.read_slice(&mut out[n..n + want], desc.addr()).is_err() {
            bad = true;
            continue;
        }
        n += want;
    }
    (n, more, bad)
}

impl<M: DeviceMemory> Balloon<M> {
    /// One bounded pass over queue `index` after its eventfd fired. Does
    /// nothing while the device is not running or for an unknown queue.
    pub fn process_queue(&mut self, index: usize) {
        let Some(a) = self.active.as_ref() else {
            return;
        };
        let l = a.layout;
        if index == l.inflate {
            self.process_inflate();
        } else if index == l.deflate {
            self.process_deflate();
        } else if Some(index) == l.stats {
            self.process_stats_queue();
        } else if Some(index) == l.reporting {
            self.process_reporting();
        }
    }

    /// The wake eventfd fired: returns completed batches to the guest, then
    /// runs the passes left over.
    pub fn process_wake(&mut self) {
        while let Ok(c) = self.completion_rx.try_recv() {
            self.complete(c);
        }
        let Some(a) = self.active.as_mut() else {
            return;
        };
        let pending: Vec<usize> = a
            .pending
            .iter_mut()
            .enumerate()
            .filter_map(|(i, p)| std::mem::take(p).then_some(i))
            .collect();
        for i in pending {
            self.process_queue(i);
        }
    }

    /// How long the balloon's thread may sleep before the next statistics
    /// update (None: no deadline).
    pub fn stats_timeout(&self, now: Instant) -> Option<Duration> {
        let at = self.active.as_ref()?.next_stats_at?;
        Some(at.saturating_duration_since(now))
    }

    /// At the statistics deadline: hands the held buffer back to the guest,
    /// asking for fresh statistics, and sets the next deadline.
    pub fn process_stats_timer(&mut self, now: Instant) {
        let interval = self.stats_interval;
        let Some(a) = self.active.as_mut() else {
            return;
        };
        let (Some(at), Some(q)) = (a.next_stats_at, a.layout.stats) else {
            return;
        };
        if now < at {
            return;
        }
        a.next_stats_at = Some(now + interval);
        if let Some(head) = a.stats_head.take() {
            let ok = Self::return_chains(a, q, &[head]);
            Self::count_fail(&self.metrics, ok);
        }
    }

    fn count_fail(metrics: &BalloonMetrics, ok: bool) {
        if !ok {
            BalloonMetrics::add(&metrics.event_fails, 1);
        }
    }

    /// Puts `heads` in queue `q`'s used ring and interrupts; false if the
    /// ring or the interrupt failed.
    fn return_chains(a: &mut Active<M>, q: usize, heads: &[u16]) -> bool {
        if heads.is_empty() {
            return true;
        }
        let mut ok = true;
        for &h in heads {
            ok &= a.queues[q].add_used(&*a.mem, h, 0).is_ok();
        }
        ok & a
            .interrupt
            .trigger(VirtioInterruptType::Queue(q as u16))
            .is_ok()
    }

    /// Takes up to [`MAX_CHAINS_PER_PASS`] chains from queue `q`; marks the
    /// queue pending (and wakes the thread) if it had more.
    fn pop_chains(&mut self, q: usize, mut each: impl FnMut(&M::Mem, DescriptorChain<&M::Mem>)) {
        let Some(a) = self.active.as_mut() else {
            return;
        };
        let queue: &mut Queue = &mut a.queues[q];
        let mut taken = 0;
        while taken < MAX_CHAINS_PER_PASS {
            let Some(chain) = queue.pop_descriptor_chain(&*a.mem) else {
                return;
            };
            each(&*a.mem, chain);
            taken += 1;
        }
        a.pending[q] = true;
        if self.wake.write(1).is_err() {
            BalloonMetrics::add(&self.metrics.event_fails, 1);
        }
    }

    /// Reads the PFNs of the chains of one pass: (heads, ranges, pages).
    fn take_pfn_chains(&mut self, q: usize) -> (Vec<u16>, Vec<GuestRange>, u64) {
        let mut heads = Vec::new();
        let mut pfns: Vec<u32> = Vec::new();
        let mut buf = vec![0u8; MAX_PFNS_PER_CHAIN * 4];
        let (mut fails, mut pages) = (0u64, 0u64);
        self.pop_chains(q, |mem, chain| {
            heads.push(chain.head_index());
            let (n, more, bad) = read_chain(mem, chain, &mut buf);
            fails += u64::from(more || bad || n % 4 != 0);
            let got = buf[..n / 4 * 4]
                .chunks_exact(4)
                .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
            let before = pfns.len();
            pfns.extend(got);
            pages += (pfns.len() - before) as u64;
        });
        BalloonMetrics::add(&self.metrics.event_fails, fails);
        (heads, pfns_to_ranges(&mut pfns), pages)
    }

    /// Clips `ranges` to guest RAM, counting what is refused.
    fn clip(&self, ranges: &[GuestRange]) -> Vec<GuestRange> {
        let Some(a) = self.active.as_ref() else {
            return Vec::new();
        };
        let c = a.ram.clip(ranges);
        BalloonMetrics::add(&self.metrics.refused_ranges, c.refused_ranges);
        BalloonMetrics::add(&self.metrics.refused_bytes, c.refused_bytes);
        c.ranges
    }

    /// Whether the sink has room for another batch; if not, queue `q` waits
    /// (pending) for a completion.
    fn sink_has_room(&mut self, q: usize) -> bool {
        let Some(a) = self.active.as_mut() else {
            return false;
        };
        if a.inflight >= MAX_INFLIGHT_BATCHES {
            a.pending[q] = true;
            return false;
        }
        true
    }

    /// Hands a batch to the sink; `heads` of queue `q` go back to the guest
    /// when the sink completes it.
    fn send_to_sink(&mut self, kind: DiscardKind, q: usize, heads: Vec<u16>, r: Vec<GuestRange>) {
        let Some(a) = self.active.as_mut() else {
            return;
        };
        a.inflight += 1;
        let c = Completion {
            epoch: self.epoch,
            kind,
            queue: q,
            heads,
            bytes: r.iter().map(|r| r.len).sum(),
            ranges: r.len() as u64,
            freed: false,
        };
        let ack = DiscardAck::new(c, self.completion_tx.clone(), self.wake.clone());
        self.sink.discard(kind, r, ack);
    }

    fn complete(&mut self, c: Completion) {
        if c.epoch != self.epoch {
            return;
        }
        let Some(a) = self.active.as_mut() else {
            return;
        };
        a.inflight = a.inflight.saturating_sub(1);
        if c.freed {
            BalloonMetrics::add(&self.metrics.discarded_bytes, c.bytes);
            BalloonMetrics::add(&self.metrics.discarded_ranges, c.ranges);
        } else {
            BalloonMetrics::add(&self.metrics.discard_fails, 1);
            if c.kind == DiscardKind::Report {
                BalloonMetrics::add(&self.metrics.free_page_report_fails, 1);
            }
        }
        let ok = Self::return_chains(a, c.queue, &c.heads);
        Self::count_fail(&self.metrics, ok);
        // A batch completed: queues waiting for room get a pass.
        for q in [Some(a.layout.inflate), a.layout.reporting]
            .into_iter()
            .flatten()
        {
            if a.pending[q] && self.wake.write(1).is_err() {
                BalloonMetrics::add(&self.metrics.event_fails, 1);
            }
        }
    }

    fn process_inflate(&mut self) {
        let Some(q) = self.active.as_ref().map(|a| a.layout.inflate) else {
            return;
        };
        if !self.sink_has_room(q) {
            return;
        }
        let (heads, ranges, pages) = self.take_pfn_chains(q);
        BalloonMetrics::add(&self.metrics.inflate_count, heads.len() as u64);
        BalloonMetrics::add(&self.metrics.inflated_pages, pages);
        // Inflated pages are the device's once the guest listed them: the
        // chains go back at once, the pages are freed behind.
        if let Some(a) = self.active.as_mut() {
            let ok = Self::return_chains(a, q, &heads);
            Self::count_fail(&self.metrics, ok);
        }
        let kept = self.clip(&ranges);
        if !kept.is_empty() {
            self.send_to_sink(DiscardKind::Inflate, q, Vec::new(), kept);
        }
    }

    fn process_deflate(&mut self) {
        let Some(q) = self.active.as_ref().map(|a| a.layout.deflate) else {
            return;
        };
        let (heads, ranges, pages) = self.take_pfn_chains(q);
        BalloonMetrics::add(&self.metrics.deflate_count, heads.len() as u64);
        BalloonMetrics::add(&self.metrics.deflated_pages, pages);
        // The guest gets the pages back only once no discard of them is in
        // flight.
        let a = self.active.as_ref().map(|a| a.ram.clip(&ranges).ranges);
        if let Some(kept) = a.filter(|k| !k.is_empty()) {
            self.sink.reclaimed(&kept);
        }
        if let Some(a) = self.active.as_mut() {
            let ok = Self::return_chains(a, q, &heads);
            Self::count_fail(&self.metrics, ok);
        }
    }

    fn process_reporting(&mut self) {
        let Some(q) = self.active.as_ref().and_then(|a| a.layout.reporting) else {
            return;
        };
        if !self.sink_has_room(q) {
            return;
        }
        let mut heads = Vec::new();
        let mut ranges = Vec::new();
        self.pop_chains(q, |_, chain| {
            heads.push(chain.head_index());
            // Each descriptor is a free range (Linux adds them as
            // device-writable buffers; the device never reads or writes them).
            ranges.extend(chain.map(|d| GuestRange {
                gpa: d.addr().0,
                len: u64::from(d.len()),
            }));
        });
        ranges.retain(|r| r.len > 0);
        BalloonMetrics::add(&self.metrics.free_page_report_count, heads.len() as u64);
        let kept = self.clip(&ranges);
        if kept.is_empty() {
            if let Some(a) = self.active.as_mut() {
                let ok = Self::return_chains(a, q, &heads);
                Self::count_fail(&self.metrics, ok);
            }
            return;
        }
        // Reported pages go back to the guest only once freed.
        self.send_to_sink(DiscardKind::Report, q, heads, kept);
    }

    fn process_stats_queue(&mut self) {
        let Some(q) = self.active.as_ref().and_then(|a| a.layout.stats) else {
            return;
        };
        let mut buf = [0u8; MAX_STAT_ENTRIES * STAT_ENTRY_BYTES];
        let mut got: Vec<(u16, Option<usize>)> = Vec::new();
        let mut stats = std::mem::take(&mut self.stats);
        self.pop_chains(q, |mem, chain| {
            let head = chain.head_index();
            let (n, _, bad) = read_chain(mem, chain, &mut buf);
            if !bad {
                stats.parse(&buf[..n]);
            }
            got.push((head, (!bad).then_some(n)));
        });
        self.stats = stats;
        let Some(a) = self.active.as_mut() else {
            return;
        };
        for (head, ok) in got {
            if ok.is_some() {
                BalloonMetrics::add(&self.metrics.stats_updates_count, 1);
            } else {
                BalloonMetrics::add(&self.metrics.stats_update_fails, 1);
            }
            // The device keeps one buffer until the next update; one it
            // already held goes back now.
            if let Some(old) = a.stats_head.replace(head) {
                let ok = Self::return_chains(a, q, &[old]);
                Self::count_fail(&self.metrics, ok);
            }
        }
    }
}
