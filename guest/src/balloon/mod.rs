//! `balloon`, `report=`: a virtio-balloon driver of the guest's own (the
//! `virtio-drivers` crate has none), written from the virtio 1.2 spec,
//! section 5.5 ("Traditional Memory Balloon Device") and 2.7 (split
//! virtqueues). The MMIO transport and the split rings are the crate's
//! (`Transport`, `VirtQueue`); the balloon logic is here.
//!
//! - Features (5.5.3): VIRTIO_F_VERSION_1 is required; MUST_TELL_HOST (0),
//!   STATS_VQ (1) and FREE_PAGE_REPORTING (5) are accepted where offered;
//!   DEFLATE_ON_OOM (2), FREE_PAGE_HINT (3) and PAGE_POISON (4) never.
//! - Queues (5.5.2): inflateq 0, deflateq 1, then statsq if STATS_VQ was
//!   negotiated, then free_page_vq if FREE_PAGE_HINT was (never, here), then
//!   reporting_vq if REPORTING was: a queue that does not exist takes no
//!   index, so reporting_vq is 2 without statistics and 3 with them.
//! - Pages: balloon page `j` is touched page `T-1-j` (`T` = the pages
//!   `touch=` dirtied, counted across [`mem::touchable`] as `mem::touch`
//!   counts them): the balloon takes the touched RAM from the top down. The
//!   driver follows `num_pages` (config 0x0) in batches of at most 256 PFNs
//!   (u32, address >> 12) in one device-readable buffer, one batch in
//!   flight, and writes `actual` (config 0x4) after each batch is used
//!   (5.5.6.1). A target above `T` is held at `T`.
//! - Statistics (5.5.6.3): one buffer of three {u16 tag, u64 val} entries
//!   (MEMTOT, MEMFREE, AVAIL) stays on the statsq; each time the device uses
//!   it, it is refilled and added again.
//! - `report=<MiB>`: see [`report`].
//! - `bcheck-linux-reset`, `balloon-no-tell`: see [`check`].
//!
//! The guest has no interrupts at CPL3: the used rings are read in memory,
//! and between looks the vCPU waits on teravm's wait port for the device's
//! interrupt ([`io::wait_for`]; a spin on other VMMs), acknowledging it
//! after, so the queues leave interrupts on; a wait is bounded (20 s),
//! after which the device is given up (Status FAILED).

mod check;
mod pages;
mod report;

use alloc::boxed::Box;
use alloc::vec::Vec;

use virtio_drivers::queue::VirtQueue;
use virtio_drivers::transport::{DeviceStatus, DeviceType, Transport};

use crate::cmdline::Options;
use crate::devices::{find, GuestTransport, Serve};
use crate::hal::GuestHal;
use crate::io::{self, Deadline};
use crate::mem::{self, BootInfo};
use crate::say;
use pages::Touched;

/// VIRTIO_BALLOON_F_MUST_TELL_HOST.
const F_MUST_TELL_HOST: u64 = 1 << 0;
/// VIRTIO_BALLOON_F_STATS_VQ.
const F_STATS_VQ: u64 = 1 << 1;
/// VIRTIO_BALLOON_F_FREE_PAGE_HINT (never accepted; it would take an index).
const F_FREE_PAGE_HINT: u64 = 1 << 3;
/// VIRTIO_BALLOON_F_PAGE_REPORTING.
const F_REPORTING: u64 = 1 << 5;
/// VIRTIO_F_VERSION_1.
const F_VERSION_1: u64 = 1 << 32;
/// What the driver accepts where offered.
const ACCEPTED: u64 = F_VERSION_1 | F_MUST_TELL_HOST | F_STATS_VQ | F_REPORTING;

/// Entries of each queue: a reporting chain takes up to this many
/// descriptors (Linux's PAGE_REPORTING_CAPACITY is 32 too); every other
/// queue holds one one-descriptor buffer.
const QSIZE: usize = 32;
type Queue = VirtQueue<GuestHal, QSIZE>;

/// Most PFNs in one inflate or deflate buffer (Linux's
/// VIRTIO_BALLOON_ARRAY_PFNS_MAX).
const BATCH: usize = 256;
/// How long the device may take to use a buffer before it is given up.
const TIMEOUT_MS: u64 = 20_000;
/// How often the serve loop reads `num_pages` (an exit on every VMM).
const CHECK_MS: u64 = 10;
/// Config space: the device's target, and the pages in the balloon.
const CFG_NUM_PAGES: usize = 0;
const CFG_ACTUAL: usize = 4;
/// Statistics tags (5.5.6.3).
const S_MEMFREE: u16 = 4;
const S_MEMTOT: u16 = 5;
const S_AVAIL: u16 = 6;
/// Bytes of one statistics entry: u16 tag, u64 value, packed.
const STAT_BYTES: usize = 10;
const PAGE: u64 = 4096;

/// The first `count` PFNs of `pfns` as the device reads them.
fn pfn_bytes(pfns: &[u32; BATCH], count: u32) -> &[u8] {
    let n = (count as usize).min(BATCH);
    // SAFETY: `n` u32s of the array, viewed as bytes (u8 has no alignment);
    // the borrow keeps the array alive.
    unsafe { core::slice::from_raw_parts(pfns.as_ptr() as *const u8, n * 4) }
}

/// An inflate or deflate batch the device has not used yet.
struct Batch {
    inflate: bool,
    count: u32,
    token: u16,
    deadline: Deadline,
}

/// The driver's state.
pub struct Balloon {
    t: GuestTransport,
    /// The device's window (what the waits name).
    base: u64,
    inflateq: Queue,
    deflateq: Queue,
    /// The statsq and the token of the buffer the device holds.
    statsq: Option<(Queue, Option<u16>)>,
    stats_buf: Box<[u8; 3 * STAT_BYTES]>,
    /// The reporting queue's index and the queue.
    reportq: Option<(u16, Queue)>,
    pfns: Box<[u32; BATCH]>,
    touched: Touched,
    ram_total: u64,
    untouched: u64,
    /// Pages `report=` reported (the top ones: balloon pages 0..reported).
    reported: u64,
    /// Pages in the balloon (what `actual` says).
    actual: u32,
    /// The last `actual` said.
    said_actual: u32,
    /// The target last read, as the device gave it.
    target: u32,
    /// The over-large target last said (said once per target).
    said_over: Option<u32>,
    batch: Option<Batch>,
    next_check_ms: u64,
    dead: bool,
}

/// The balloon part of `guest_main`: finds and sets up the balloon, reports
/// (`report=`), then follows `num_pages` once (then=reset) or leaves the
/// device to the serve loop (then=idle).
pub fn hook(
    options: &Options,
    info: &BootInfo,
    mapped: u64,
    touched: u64,
    serving: &mut Vec<Box<dyn Serve>>,
) {
    let check = options.bcheck_linux_reset || options.balloon_no_tell;
    if !options.balloon && options.report_mib == 0 && !check {
        return;
    }
    let accept = if options.balloon_no_tell {
        ACCEPTED & !F_MUST_TELL_HOST
    } else {
        ACCEPTED
    };
    let Some(mut b) = Balloon::start(options, info, mapped, touched, accept) else {
        return;
    };
    if check {
        if options.bcheck_linux_reset {
            b.linux_reset();
        } else {
            b.no_tell();
        }
        // The device keeps the rings: they must stay.
        core::mem::forget(b);
        return;
    }
    if options.report_mib != 0 {
        b.report(options.report_mib);
    }
    if options.balloon && !options.reset {
        serving.push(Box::new(b));
        return;
    }
    if options.balloon {
        b.follow_once();
    }
    // The device keeps the rings and the statistics buffer: they must stay.
    core::mem::forget(b);
}

/// Why setting the device up stopped (the words after `balloon error `).
enum InitError {
    Reset,
    NoVersion1,
    FeaturesRefused,
    Queue(u16),
    NeedsReset,
}

impl Balloon {
    /// Finds the first balloon and initialises it (3.1.1). Says the device
    /// line, or the error.
    fn start(
        options: &Options,
        info: &BootInfo,
        mapped: u64,
        touched: u64,
        accept: u64,
    ) -> Option<Balloon> {
        let Some(found) = find(options, DeviceType::MemoryBalloon, 0) else {
            say!("balloon error no device");
            return None;
        };
        let mut t = found.transport;
        match Balloon::init(&mut t, accept) {
            Ok((features, inflateq, deflateq, statsq, reportq)) => {
                say!(
                    "balloon device at {:#x} features {:#x}",
                    found.base,
                    features
                );
                let touched = Touched::new(info, mapped, touched);
                let touchable: u64 = mem::touchable(info, mapped).map(|r| r.end - r.start).sum();
                let ram_total = info.ram[..info.nram].iter().map(|r| r.end - r.start).sum();
                let mut b = Balloon {
                    t,
                    base: found.base,
                    inflateq,
                    deflateq,
                    statsq: statsq.map(|q| (q, None)),
                    stats_buf: Box::new([0; 3 * STAT_BYTES]),
                    reportq,
                    pfns: Box::new([0; BATCH]),
                    untouched: touchable.saturating_sub(touched.pages * PAGE),
                    touched,
                    ram_total,
                    reported: 0,
                    actual: 0,
                    said_actual: 0,
                    target: 0,
                    said_over: None,
                    batch: None,
                    next_check_ms: 0,
                    dead: false,
                };
                b.post_stats();
                Some(b)
            }
            Err(e) => {
                t.set_status(DeviceStatus::FAILED);
                match e {
                    InitError::Reset => say!("balloon error device reset did not complete"),
                    InitError::NoVersion1 => say!("balloon error device does not offer VERSION_1"),
                    InitError::FeaturesRefused => {
                        say!("balloon error device refused the features (FEATURES_OK)");
                        if accept & F_MUST_TELL_HOST == 0 {
                            say!("balloon no-tell refused");
                        }
                    }
                    InitError::Queue(i) => {
                        say!(
                            "balloon error queue {} unusable (in use or QueueNumMax 0)",
                            i
                        )
                    }
                    InitError::NeedsReset => {
                        say!("balloon error device did not take DRIVER_OK (DEVICE_NEEDS_RESET)")
                    }
                }
                None
            }
        }
    }

    /// The initialisation steps: reset, ACKNOWLEDGE, DRIVER, features,
    /// FEATURES_OK (read back), the queues, DRIVER_OK.
    #[allow(clippy::type_complexity)]
    fn init(
        t: &mut GuestTransport,
        accept: u64,
    ) -> Result<(u64, Queue, Queue, Option<Queue>, Option<(u16, Queue)>), InitError> {
        t.set_status(DeviceStatus::empty());
        // 2.4.1: a reset is complete once Status reads 0.
        let deadline = Deadline::after_ms(10_000);
        while t.get_status() != DeviceStatus::empty() {
            if deadline.passed() {
                return Err(InitError::Reset);
            }
            core::hint::spin_loop();
        }
        t.set_status(DeviceStatus::ACKNOWLEDGE);
        t.set_status(DeviceStatus::ACKNOWLEDGE | DeviceStatus::DRIVER);
        let offered = t.read_device_features();
        if offered & F_VERSION_1 == 0 {
            return Err(InitError::NoVersion1);
        }
        let features = offered & accept;
        t.write_driver_features(features);
        let ok = DeviceStatus::ACKNOWLEDGE | DeviceStatus::DRIVER | DeviceStatus::FEATURES_OK;
        t.set_status(ok);
        if !t.get_status().contains(DeviceStatus::FEATURES_OK) {
            return Err(InitError::FeaturesRefused);
        }
        let queue = |t: &mut GuestTransport, i: u16| {
            let mut q = Queue::new(t, i, false, false).map_err(|_| InitError::Queue(i))?;
            // Interrupts on (the default): the waits sleep until one.
            q.set_dev_notify(true);
            Ok::<Queue, InitError>(q)
        };
        let inflateq = queue(t, 0)?;
        let deflateq = queue(t, 1)?;
        let mut next = 2;
        let statsq = if features & F_STATS_VQ != 0 {
            next += 1;
            Some(queue(t, 2)?)
        } else {
            None
        };
        // Never true (hinting is not accepted), kept to show the numbering.
        // QEMU and Firecracker number by the *offered* features instead: with
        // hinting offered, QEMU's reporting_vq is one further on (this
        // index is its free_page_vq), and Firecracker will not activate
        // without a queue for hinting (notes/i25/gballoon.md).
        if features & F_FREE_PAGE_HINT != 0 {
            next += 1;
        }
        let reportq = if features & F_REPORTING != 0 {
            Some((next, queue(t, next)?))
        } else {
            None
        };
        t.set_status(ok | DeviceStatus::DRIVER_OK);
        if t.get_status().contains(DeviceStatus::DEVICE_NEEDS_RESET) {
            return Err(InitError::NeedsReset);
        }
        Ok((features, inflateq, deflateq, statsq, reportq))
    }

    /// Gives the device up after queue `i` timed out.
    fn give_up(&mut self, i: u16) {
        say!("balloon error queue {} timed out; device given up", i);
        self.t.set_status(DeviceStatus::FAILED);
        self.dead = true;
    }

    /// Writes the statistics into the buffer: MEMTOT = all RAM; MEMFREE and
    /// AVAIL = the RAM not touched plus reported pages not in the balloon.
    fn fill_stats(&mut self) {
        let reported_free = self.reported.saturating_sub(u64::from(self.actual)) * PAGE;
        let free = self.untouched + reported_free;
        let entries = [
            (S_MEMTOT, self.ram_total),
            (S_MEMFREE, free),
            (S_AVAIL, free),
        ];
        for (i, (tag, val)) in entries.into_iter().enumerate() {
            let e = &mut self.stats_buf[i * STAT_BYTES..(i + 1) * STAT_BYTES];
            e[..2].copy_from_slice(&tag.to_le_bytes());
            e[2..].copy_from_slice(&val.to_le_bytes());
        }
    }

    /// Fills the statistics buffer and adds it to the statsq (at start, and
    /// each time the device has used it).
    fn post_stats(&mut self) {
        if self.statsq.is_none() {
            return;
        }
        self.fill_stats();
        let Some((q, token)) = self.statsq.as_mut() else {
            return;
        };
        // SAFETY: the buffer is boxed and owned by self, which is never
        // dropped while the device may hold it (see `hook`); it is only
        // written again after the device has used it.
        match unsafe { q.add(&[&self.stats_buf[..]], &mut []) } {
            Ok(tk) => {
                *token = Some(tk);
                if q.should_notify() {
                    self.t.notify(2);
                }
            }
            Err(e) => say!("balloon error statistics {}", crate::devices::status(e)),
        }
    }

    /// Answers the device if it used the statistics buffer: refill, re-add.
    fn serve_stats(&mut self) {
        let Some((q, token)) = self.statsq.as_mut() else {
            return;
        };
        let Some(tk) = *token else { return };
        if !q.can_pop() {
            return;
        }
        // SAFETY: the same buffer that was added with this token.
        let _ = unsafe { q.pop_used(tk, &[&self.stats_buf[..]], &mut []) };
        *token = None;
        self.post_stats();
    }

    /// Reads `num_pages` and works out the target the driver follows: the
    /// device's, held at the touched pages (said once per such target).
    fn read_target(&mut self) -> u32 {
        let raw: u32 = self
            .t
            .read_config_space(CFG_NUM_PAGES)
            .unwrap_or(self.target);
        self.target = raw;
        if u64::from(raw) > self.touched.pages {
            if self.said_over != Some(raw) {
                say!(
                    "balloon error target {} pages is more than the {} pages touched",
                    raw,
                    self.touched.pages
                );
                self.said_over = Some(raw);
            }
            self.touched.pages as u32
        } else {
            self.said_over = None;
            raw
        }
    }

    /// Pops the batch in flight if the device has used it (and writes
    /// `actual`): `Some(true)`; `Some(false)` if it timed out (the device
    /// is given up) or none is in flight; `None` while it is in flight.
    fn poll_batch(&mut self) -> Option<bool> {
        let Some(b) = &self.batch else {
            return Some(false);
        };
        let (inflate, count, token) = (b.inflate, b.count, b.token);
        let q = if inflate {
            &self.inflateq
        } else {
            &self.deflateq
        };
        if !q.can_pop() {
            if b.deadline.passed() {
                self.give_up(if inflate { 0 } else { 1 });
                return Some(false);
            }
            return None;
        }
        let bytes = pfn_bytes(&self.pfns, count);
        let q = if inflate {
            &mut self.inflateq
        } else {
            &mut self.deflateq
        };
        // SAFETY: the same buffer that was added with this token.
        let _ = unsafe { q.pop_used(token, &[bytes], &mut []) };
        self.batch = None;
        self.actual = if inflate {
            self.actual + count
        } else {
            self.actual - count
        };
        let _ = self.t.write_config_space(CFG_ACTUAL, self.actual);
        Some(true)
    }

    /// Waits for the batch in flight (see [`Self::poll_batch`]): whether
    /// the device used it.
    fn finish_batch(&mut self) -> bool {
        loop {
            match self.poll_batch() {
                Some(used) => return used,
                None => io::wait_for(self.base, io::WAIT_MS),
            }
        }
    }

    /// Posts one inflate (or deflate) buffer of `pfns` (at most [`BATCH`]);
    /// false (said, the device given up) if it cannot be added.
    fn post(&mut self, inflate: bool, pfns: &[u32]) -> bool {
        let count = pfns.len().min(BATCH);
        self.pfns[..count].copy_from_slice(&pfns[..count]);
        let bytes = pfn_bytes(&self.pfns, count as u32);
        let q = if inflate {
            &mut self.inflateq
        } else {
            &mut self.deflateq
        };
        // SAFETY: `pfns` is boxed, owned by self and not written again
        // until the device has used this buffer (one batch in flight).
        let token = match unsafe { q.add(&[bytes], &mut []) } {
            Ok(tk) => tk,
            Err(e) => {
                say!("balloon error {}", crate::devices::status(e));
                self.dead = true;
                return false;
            }
        };
        if q.should_notify() {
            self.t.notify(if inflate { 0 } else { 1 });
        }
        self.batch = Some(Batch {
            inflate,
            count: count as u32,
            token,
            deadline: Deadline::after_ms(TIMEOUT_MS),
        });
        true
    }

    /// One non-blocking step of following `num_pages`: finishes the batch
    /// in flight if the device used it, else (if none is in flight) posts
    /// the next one. `fresh`: read `num_pages` again (it is always read
    /// after a batch completes). Returns whether the balloon has settled.
    fn follow_step(&mut self, mut fresh: bool) -> bool {
        if self.batch.is_some() {
            match self.poll_batch() {
                Some(true) => fresh = true,
                _ => return false,
            }
        }
        let target = if fresh {
            self.read_target()
        } else {
            self.target.min(self.touched.pages as u32)
        };
        if target == self.actual {
            if self.actual != self.said_actual {
                say!("balloon actual {} pages", self.actual);
                self.said_actual = self.actual;
            }
            return true;
        }
        let inflate = target > self.actual;
        let count = if inflate {
            target - self.actual
        } else {
            self.actual - target
        }
        .min(BATCH as u32);
        // Inflate balloon pages actual.., deflate the last ones inflated.
        let first = if inflate {
            self.actual
        } else {
            self.actual - count
        };
        let mut pfns = [0u32; BATCH];
        for k in 0..count {
            pfns[k as usize] = self.touched.balloon_pfn(u64::from(first + k));
        }
        self.post(inflate, &pfns[..count as usize]);
        false
    }

    /// then=reset: follow `num_pages` until the balloon settles (or the
    /// device is given up), answering statistics meanwhile.
    fn follow_once(&mut self) {
        while !self.dead && !self.follow_step(true) {
            self.serve_stats();
            io::wait_for(self.base, io::WAIT_MS);
        }
    }
}

impl Serve for Balloon {
    fn poll(&mut self) -> bool {
        if self.dead {
            return false;
        }
        self.serve_stats();
        let now = io::now_ms();
        let fresh = self.batch.is_none() && now >= self.next_check_ms;
        if fresh {
            self.next_check_ms = now + CHECK_MS;
        }
        self.follow_step(fresh);
        !self.dead
    }

    fn base(&self) -> u64 {
        self.base
    }
}
