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
//!
//! No page goes back to the guest while a discard can reach it: each batch
//! handed to the sink is listed in flight (its ranges) until its ack comes
//! back, and a deflate chain, or a report chain once freed, whose pages a
//! listed batch covers is parked (bounded: [`super::MAX_PARKED_DEFLATES`]) and
//! returned when the last covering batch completes (the ack wakes this
//! thread). Nothing here waits: the balloon's lock is never held across a
//! discard.

use std::time::{Duration, Instant};

use virtio_queue::{DescriptorChain, Queue, QueueT};
use vm_memory::{Bytes, GuestMemory};

use super::device::{Active, InFlightBatch, Parked};
use super::metrics::BalloonMetrics;
use super::ranges::pfns_to_ranges;
use super::sink::{Completion, DiscardAck, DiscardKind};
use super::stats::{MAX_STAT_ENTRIES, STAT_ENTRY_BYTES};
use super::{
    Balloon, MAX_CHAINS_PER_PASS, MAX_INFLIGHT_BATCHES, MAX_PARKED_DEFLATES, MAX_PFNS_PER_CHAIN,
};
use crate::devices::virtio::{DeviceMemory, PendingQueues};
use crate::memory::range::{overlaps_any, sorted_merged};
use crate::memory::GuestRange;

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
    /// runs the passes left over (the queues `pending` marks).
    pub fn process_wake(&mut self, pending: PendingQueues) {
        self.drain_completions();
        let Some(n) = self.active.as_ref().map(|a| a.state.queues.len()) else {
            return;
        };
        for i in (0..n).filter(|&i| pending.has(i)) {
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

    /// Takes the sink's completions: their batches are no longer in flight,
    /// and chains that waited only for them go back to the guest.
    pub(super) fn drain_completions(&mut self) {
        let mut any = false;
        while let Ok(c) = self.completion_rx.try_recv() {
            self.complete(c);
            any = true;
        }
        if any {
            self.release_parked();
        }
    }

    /// Whether a batch in flight covers any of `ranges`.
    fn covered(&self, ranges: &[GuestRange]) -> bool {
        ranges
            .iter()
            .any(|r| self.in_flight.iter().any(|b| overlaps_any(&b.ranges, r)))
    }

    /// Returns the parked chains no batch in flight covers any more (and
    /// drops those of an earlier activation: their queues are gone).
    fn release_parked(&mut self) {
        let epoch = self.epoch();
        let mut parked = std::mem::take(&mut self.parked);
        parked.retain(|p| Some(p.epoch) == epoch);
        let mut kept = Vec::with_capacity(parked.len());
        let mut deflate_freed = false;
        for p in parked {
            if self.covered(&p.ranges) {
                kept.push(p);
                continue;
            }
            if let Some(a) = self.active.as_mut() {
                deflate_freed |= p.queue == a.layout.deflate;
                let ok = Self::return_chains(a, p.queue, &p.heads);
                Self::count_fail(&self.metrics, ok);
            }
        }
        self.parked = kept;
        // Deflate chains that waited for room get a pass.
        if let Some(a) = self.active.as_ref() {
            if deflate_freed
                && self.wake.is_marked(a.layout.deflate)
                && self.wake.again(&[]).is_err()
            {
                self.metrics.event_fails.inc();
            }
        }
    }

    fn count_fail(metrics: &BalloonMetrics, ok: bool) {
        if !ok {
            metrics.event_fails.inc();
        }
    }

    /// Puts `heads` in queue `q`'s used ring and interrupts; false if the
    /// ring or the interrupt failed.
    fn return_chains(a: &mut Active<M>, q: usize, heads: &[u16]) -> bool {
        if heads.is_empty() {
            return true;
        }
        let a = &mut a.state;
        let mut ok = true;
        for &h in heads {
            ok &= a.queues[q].add_used(&*a.mem, h, 0).is_ok();
        }
        ok & a.signal_used(q)
    }

    /// Takes up to [`MAX_CHAINS_PER_PASS`] chains from queue `q`; marks the
    /// queue pending (and wakes the thread) if it had more.
    fn pop_chains(&mut self, q: usize, mut each: impl FnMut(&M::Mem, DescriptorChain<&M::Mem>)) {
        let Some(a) = self.active.as_mut().map(|a| &mut a.state) else {
            return;
        };
        let queue: &mut Queue = &mut a.queues[q];
        let mut taken = 0;
        while taken < MAX_CHAINS_PER_PASS {
            let Some(chain) = crate::devices::virtio::chains::pop_direct(
                queue,
                &*a.mem,
                &self.metrics.event_fails,
            ) else {
                return;
            };
            each(&*a.mem, chain);
            taken += 1;
        }
        if self.wake.again(&[q]).is_err() {
            self.metrics.event_fails.inc();
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
        self.metrics.event_fails.add(fails);
        (heads, pfns_to_ranges(&mut pfns), pages)
    }

    /// Clips `ranges` to guest RAM, counting what is refused.
    fn clip(&self, ranges: &[GuestRange]) -> Vec<GuestRange> {
        let Some(a) = self.active.as_ref() else {
            return Vec::new();
        };
        let c = a.ram.clip(ranges);
        self.metrics.refused_ranges.add(c.refused_ranges);
        self.metrics.refused_bytes.add(c.refused_bytes);
        c.ranges
    }

    /// Whether the sink has room for another batch; if not, queue `q` waits
    /// (pending) for a completion.
    fn sink_has_room(&mut self, q: usize) -> bool {
        if self.active.is_none() {
            return false;
        }
        if self.holding || self.in_flight.len() >= MAX_INFLIGHT_BATCHES {
            self.wake.defer(q);
            return false;
        }
        true
    }

    /// Lists a batch in flight and queues it for the sink (sent once the
    /// lock is let go); `heads` of queue `q` go back to the guest when the
    /// sink completes it and no other batch covers its ranges.
    fn send_to_sink(&mut self, kind: DiscardKind, q: usize, heads: Vec<u16>, r: Vec<GuestRange>) {
        let Some(epoch) = self.epoch() else {
            return;
        };
        let batch = self.next_batch;
        self.next_batch += 1;
        self.in_flight.push(InFlightBatch {
            id: batch,
            ranges: sorted_merged(r.clone()),
        });
        let c = Completion {
            batch,
            epoch,
            kind,
            queue: q,
            heads,
            bytes: r.iter().map(|r| r.len).sum(),
            ranges: r.len() as u64,
            freed: false,
        };
        let ack = DiscardAck::new(
            c,
            self.completion_tx.clone(),
            self.wake.clone(),
            self.fence.clone(),
        );
        self.outbox.push((kind, r, ack));
    }

    /// One batch ended: off the in-flight list; its chains (a report's)
    /// are parked until no other batch covers them
    /// ([`Self::release_parked`], which the caller runs next).
    fn complete(&mut self, c: Completion) {
        let ranges = match self.in_flight.iter().position(|b| b.id == c.batch) {
            Some(i) => self.in_flight.swap_remove(i).ranges,
            None => Vec::new(),
        };
        if Some(c.epoch) != self.epoch() {
            return;
        }
        let Some(a) = self.active.as_mut() else {
            return;
        };
        if c.freed {
            self.metrics.discarded_bytes.add(c.bytes);
            self.metrics.discarded_ranges.add(c.ranges);
        } else {
            self.metrics.discard_fails.inc();
            if c.kind == DiscardKind::Report {
                self.metrics.free_page_report_fails.inc();
            }
        }
        if !c.heads.is_empty() {
            self.parked.push(Parked {
                epoch: c.epoch,
                queue: c.queue,
                heads: c.heads,
                ranges,
            });
        }
        // A batch completed: queues waiting for room get a pass.
        for q in [Some(a.layout.inflate), a.layout.reporting]
            .into_iter()
            .flatten()
        {
            if self.wake.is_marked(q) && self.wake.again(&[]).is_err() {
                self.metrics.event_fails.inc();
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
        self.metrics.inflate_count.add(heads.len() as u64);
        self.metrics.inflated_pages.add(pages);
        let kept = self.clip(&ranges);
        let must_tell = self.active.as_ref().is_some_and(|a| a.must_tell);
        if must_tell || kept.is_empty() {
            // Inflated pages are the device's once the guest listed them,
            // and a driver that accepted MUST_TELL_HOST takes none back
            // before its deflate is answered (which waits for their
            // discard): the chains go back at once, the pages are freed
            // behind.
            if let Some(a) = self.active.as_mut() {
                let ok = Self::return_chains(a, q, &heads);
                Self::count_fail(&self.metrics, ok);
            }
            if !kept.is_empty() {
                self.send_to_sink(DiscardKind::Inflate, q, Vec::new(), kept);
            }
        } else {
            // Without MUST_TELL_HOST the driver may reuse a page it
            // deflates before the deflate is answered (virtio 1.2,
            // 5.5.6.1): the inflate is answered only once its pages are
            // freed, as a report is, so no discard of them is left to run.
            self.send_to_sink(DiscardKind::Inflate, q, heads, kept);
        }
    }

    fn process_deflate(&mut self) {
        let Some((q, epoch)) = self
            .active
            .as_ref()
            .map(|a| (a.layout.deflate, a.state.epoch()))
        else {
            return;
        };
        let parked = self.parked.iter().filter(|p| p.queue == q).count();
        if parked >= MAX_PARKED_DEFLATES {
            // The chains wait in the ring until a parked pass goes back.
            self.wake.defer(q);
            return;
        }
        let (heads, ranges, pages) = self.take_pfn_chains(q);
        self.metrics.deflate_count.add(heads.len() as u64);
        self.metrics.deflated_pages.add(pages);
        // The guest gets the pages back only once no discard that covers
        // them is in flight, however long that takes. The PFNs as given (not
        // clipped to whole discard pages): a 4 KiB page inside a huge page
        // being freed is covered too.
        if self.covered(&ranges) {
            log::debug!(
                "balloon deflate: {} chain(s) wait for discards of their pages",
                heads.len()
            );
            self.parked.push(Parked {
                epoch,
                queue: q,
                heads,
                ranges,
            });
            return;
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
        self.metrics.free_page_report_count.add(heads.len() as u64);
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
                self.metrics.stats_updates_count.inc();
            } else {
                self.metrics.stats_update_fails.inc();
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
