//! The balloon checks of a Linux driver's ways (issue 34):
//!
//! - `bcheck-linux-reset`: follows `num_pages` until the balloon settles,
//!   then writes 0 to Status and does not poll it (Linux's `vm_reset`),
//!   writes a pattern into every page it had inflated at once (a kernel
//!   started by kexec reuses them after `virtio_dev_shutdown`'s reset),
//!   sets the device up again, waits 3 s and checks the pattern:
//!   `balloon linux-reset pattern ok` or `... corrupt` (with the count).
//! - `balloon-no-tell`: the driver does not accept MUST_TELL_HOST; it
//!   inflates to `num_pages`, deflates it all, writes the pattern into the
//!   pages without waiting for the deflate's answer (virtio 1.2, 5.5.6.1:
//!   without the feature it may), waits 3 s and checks it:
//!   `balloon no-tell pattern ok`, `... corrupt`, or `balloon no-tell
//!   refused` if the device refused the features.

use virtio_drivers::transport::{DeviceStatus, Transport};

use super::{Balloon, PAGE};
use crate::io::{self, Deadline};
use crate::say;

/// How long the pattern is left before it is checked.
const SETTLE_MS: u64 = 3_000;

/// The word written at each end of balloon page `pfn`.
fn pattern(pfn: u32) -> u64 {
    0x5eed_0000_0000_0000 | u64::from(pfn)
}

/// Writes the pattern into the pages of `pfns`.
fn write(pfns: &[u32]) {
    for &pfn in pfns {
        let page = u64::from(pfn) * PAGE;
        for at in [page, page + PAGE - 8] {
            // SAFETY: a touched page of guest RAM (the balloon's pages are
            // touched RAM), identity-mapped, given back to the guest (reset
            // or deflated) just now.
            unsafe { core::ptr::write_volatile(at as *mut u64, pattern(pfn)) };
        }
    }
}

/// Pages of `pfns` whose pattern did not survive.
fn corrupt(pfns: &[u32]) -> usize {
    pfns.iter()
        .filter(|&&pfn| {
            let page = u64::from(pfn) * PAGE;
            [page, page + PAGE - 8].iter().any(|&at| {
                // SAFETY: as in `write`.
                let v = unsafe { core::ptr::read_volatile(at as *const u64) };
                v != pattern(pfn)
            })
        })
        .count()
}

/// Waits `SETTLE_MS` (on the device's wait port where it has one).
fn settle(base: u64) {
    let deadline = Deadline::after_ms(SETTLE_MS);
    while !deadline.passed() {
        io::wait_for(base, io::WAIT_MS);
    }
}

/// Says the outcome for `what`.
fn verdict(what: &str, pfns: &[u32]) {
    match corrupt(pfns) {
        0 => say!("balloon {} pattern ok ({} pages)", what, pfns.len()),
        n => say!(
            "balloon {} pattern corrupt ({} of {} pages)",
            what,
            n,
            pfns.len()
        ),
    }
}

impl Balloon {
    /// The PFNs of the pages in the balloon now.
    fn inflated(&self) -> alloc::vec::Vec<u32> {
        (0..u64::from(self.actual))
            .map(|j| self.touched.balloon_pfn(j))
            .collect()
    }

    /// `bcheck-linux-reset` (see the top).
    pub(super) fn linux_reset(&mut self) {
        self.follow_once();
        if self.dead || self.actual == 0 {
            say!("balloon linux-reset error nothing inflated");
            return;
        }
        let pfns = self.inflated();
        // vm_reset: the write, and nothing read back.
        self.t.set_status(DeviceStatus::empty());
        write(&pfns);
        // Probed again, as the next kernel would.
        if Balloon::init(&mut self.t, super::ACCEPTED).is_err() {
            say!("balloon linux-reset error the device did not set up again");
        }
        settle(self.base);
        verdict("linux-reset", &pfns);
    }

    /// `balloon-no-tell` (see the top); the device was set up without
    /// MUST_TELL_HOST.
    pub(super) fn no_tell(&mut self) {
        self.follow_once();
        if self.dead || self.actual == 0 {
            say!("balloon no-tell error nothing inflated");
            return;
        }
        let pfns = self.inflated();
        // The deflate of every page, batch by batch, each page reused as
        // soon as its batch is posted (before the device answers).
        while self.actual > 0 && !self.dead {
            let first = self.actual.saturating_sub(super::BATCH as u32);
            let batch: alloc::vec::Vec<u32> = pfns[first as usize..self.actual as usize].to_vec();
            if !self.post(false, &batch) {
                return;
            }
            write(&batch);
            if !self.finish_batch() {
                return;
            }
        }
        settle(self.base);
        verdict("no-tell", &pfns);
    }
}
