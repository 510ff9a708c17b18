//! `verify-every=<ms>`: after `touch=`, every `<ms>` ms by the guest's
//! clock, forever, re-read every page `touch=` wrote (each holds its own
//! guest physical address, [`mem::touch`]) and print `verify <N> MiB ok`
//! or `verify <N> MiB bad at 0x<address>`: N the MiB read (all of them,
//! whatever was bad), the address the guest physical address of the first
//! page that lost its word. What checks that a VMM keeps a running guest's
//! memory whole across something done to it from outside (a snapshot
//! taken or restored, a migration).
//!
//! The guest's waits call [`Verify::poll`]: `tick=`'s loop between ticks
//! and the serve loop between its devices' polls (which waits no longer
//! than the next verify is due, and spins instead of parking while a
//! verify is to come). One-shot device runs (`blk`, `rng=`, `mmds=` ...)
//! do not: a verify due while one runs comes after it.

use crate::mem::{self, BootInfo};
use crate::{io, say};

/// The periodic re-read.
pub struct Verify<'a> {
    info: &'a BootInfo,
    mapped: u64,
    bytes: u64,
    every_ms: u64,
    next: u64,
}

impl<'a> Verify<'a> {
    /// Re-reads the `bytes` that `touch=` wrote every `every_ms`, the
    /// first `every_ms` from now.
    pub fn new(info: &'a BootInfo, mapped: u64, bytes: u64, every_ms: u64) -> Verify<'a> {
        let every_ms = every_ms.max(1);
        Verify {
            info,
            mapped,
            bytes,
            every_ms,
            next: io::now_ms() + every_ms,
        }
    }

    /// Milliseconds until the next verify is due (0: due now).
    pub fn due_in_ms(&self) -> u64 {
        self.next.saturating_sub(io::now_ms())
    }

    /// Verifies and prints if one is due. A verify that took longer than
    /// the period puts the next a whole period after its end (no burst).
    pub fn poll(&mut self) {
        if io::now_ms() < self.next {
            return;
        }
        let check = mem::check_touched(self.info, self.mapped, self.bytes);
        let mib = (check.pages * 4096) >> 20;
        match check.first_bad {
            None => say!("verify {} MiB ok", mib),
            Some(addr) => say!("verify {} MiB bad at {:#x}", mib, addr),
        }
        let now = io::now_ms();
        self.next += self.every_ms;
        if self.next <= now {
            self.next = now + self.every_ms;
        }
    }
}

/// [`Verify::poll`] on an optional one.
pub fn poll(v: &mut Option<Verify<'_>>) {
    if let Some(v) = v {
        v.poll();
    }
}
