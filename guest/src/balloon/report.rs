//! `report=<MiB>`: free page reporting (virtio 1.2, 5.5.6.7), sent as
//! Linux's page reporting sends it: chains of device-writable buffers, each
//! at most 4 MiB and split at 4 MiB-aligned addresses and at the ends of
//! RAM ranges, up to [`super::QSIZE`] buffers a chain, one chain in flight
//! and waited for until used. The pages are the top of the touched RAM
//! (the same pages the balloon takes first), from the top down.
//!
//! Then every reported page is read back, all of it. The spec leaves a
//! reported page's contents undefined (without PAGE_POISON the device may
//! drop them); VMMs that discard them (madvise(MADV_DONTNEED) of anonymous
//! memory) hand back zeroes, which is what the line says.

use alloc::vec::Vec;
use core::ptr::read_volatile;

use super::{Balloon, PAGE, QSIZE, TIMEOUT_MS};
use crate::io::{now_ms, Deadline};
use crate::mem::Range;
use crate::say;
use virtio_drivers::transport::Transport;

/// Most bytes in one buffer (Linux reports blocks of pageblock order: 2 MiB
/// or 4 MiB; 4 MiB here).
const PIECE: u64 = 4 << 20;

impl Balloon {
    /// The buffers that report the top `pages` touched pages, top first.
    fn report_pieces(&self, pages: u64) -> Vec<Range> {
        let mut left = pages * PAGE;
        let mut pieces = Vec::new();
        for r in self.touched.ranges_down() {
            let mut end = r.end;
            while left != 0 && end > r.start {
                let start = ((end - 1) & !(PIECE - 1)).max(r.start).max(end - left);
                pieces.push(Range { start, end });
                left -= end - start;
                end = start;
            }
            if left == 0 {
                break;
            }
        }
        pieces
    }

    /// Reports `mib` MiB of the touched RAM (at most all of it), then reads
    /// it back. Says how long the reporting took and what was read.
    pub(super) fn report(&mut self, mib: u64) {
        let Some((qi, mut q)) = self.reportq.take() else {
            say!("balloon error device does not offer REPORTING");
            return;
        };
        let pages = ((mib << 20) / PAGE).min(self.touched.pages);
        let t0 = now_ms();
        let pieces = self.report_pieces(pages);
        for chain in pieces.chunks(QSIZE) {
            let mut bufs: Vec<&mut [u8]> = chain
                .iter()
                .map(|r| {
                    // SAFETY: touched RAM the guest uses for nothing else,
                    // identity-mapped; not touched until the device has
                    // used the chain.
                    unsafe {
                        core::slice::from_raw_parts_mut(
                            r.start as *mut u8,
                            (r.end - r.start) as usize,
                        )
                    }
                })
                .collect();
            // SAFETY: the buffers stay valid (RAM) and unused until the
            // chain is popped below.
            let token = match unsafe { q.add(&[], &mut bufs) } {
                Ok(tk) => tk,
                Err(e) => {
                    say!("balloon error reporting {}", crate::devices::status(e));
                    self.reportq = Some((qi, q));
                    return;
                }
            };
            if q.should_notify() {
                self.t.notify(qi);
            }
            let deadline = Deadline::after_ms(TIMEOUT_MS);
            while !q.can_pop() {
                if deadline.passed() {
                    self.give_up(qi);
                    // The device may still hold the chain: keep the queue.
                    self.reportq = Some((qi, q));
                    return;
                }
                // Asleep until the device has used the chain.
                crate::io::wait_for(self.base, crate::io::WAIT_MS);
            }
            // SAFETY: the same buffers that were added with this token.
            let _ = unsafe { q.pop_used(token, &[], &mut bufs) };
        }
        say!("balloon report took {} ms", now_ms() - t0);
        self.reportq = Some((qi, q));
        self.reported = pages;
        let zero = pieces.iter().fold(true, |zero, r| {
            let mut p = r.start;
            let mut acc = 0u64;
            while p < r.end {
                // SAFETY: touched RAM, identity-mapped, given back by the
                // device (the chain was used).
                acc |= unsafe { read_volatile(p as *const u64) };
                p += 8;
            }
            zero && acc == 0
        });
        say!(
            "balloon reported {} MiB, read back zero: {}",
            (pages * PAGE) >> 20,
            if zero { "yes" } else { "no" }
        );
    }
}
