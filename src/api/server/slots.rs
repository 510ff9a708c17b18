//! The API server's connection slots: which connections hold one, what each
//! is doing, and which gives its slot up when a new client needs one.
//!
//! The accept thread admits a connection into a slot ([`Slots::admit`]);
//! the connection's own thread reports what it is doing ([`Slots::set`])
//! and frees the slot when it ends ([`Slots::release`]). When every slot is
//! taken, a new client takes the slot of the connection that has been idle
//! longest (a kept-alive connection with no request bytes), or else of the
//! one that has been receiving a request for longer than the pressure
//! timeout (a client trickling its request); [`victim`] is that choice, a
//! pure function. A connection counts as idle (or receiving, if more bytes
//! follow) from the moment its reply is ready, before it is written: so a
//! client that does not read its replies, whose thread blocks in the write,
//! does not hold its slot either. The loser's reading side is shut down,
//! which wakes its thread (its `poll` sees end of input) and fails its
//! client's further writes; a reply being written is still written whole
//! (or times out). The thread then sees it no longer holds a slot and ends
//! (see `conn`), answering 503 to a request it had begun to receive. A
//! connection whose request is with the VMM is never chosen. With no victim
//! the new client is refused with 503.

use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// What a connection is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Activity {
    /// Waiting for a request, no byte of one received.
    Idle,
    /// Part of a request received.
    Receiving,
    /// A request is with the VMM.
    Handling,
}

/// One slot: a connection and what it does since when.
#[derive(Debug)]
struct Slot {
    id: u64,
    activity: Activity,
    since: Instant,
    /// A clone of the connection, to shut its reading side down.
    stream: UnixStream,
}

#[derive(Debug, Default)]
struct Inner {
    next_id: u64,
    slots: Vec<Slot>,
}

/// The slot table, shared by the accept thread and the connection threads.
#[derive(Debug)]
pub(super) struct Slots {
    max: usize,
    pressure_timeout: Duration,
    inner: Mutex<Inner>,
}

/// Which slot a new client takes when all `slots` (activity and since when)
/// are taken at `now`: the longest idle, else the longest receiving one if
/// its request has been arriving for at least `pressure_timeout`, else none.
pub(super) fn victim(
    slots: &[(Activity, Instant)],
    now: Instant,
    pressure_timeout: Duration,
) -> Option<usize> {
    let oldest = |wanted: Activity| {
        slots
            .iter()
            .enumerate()
            .filter(|(_, (a, _))| *a == wanted)
            .min_by_key(|(_, (_, since))| *since)
            .map(|(i, (_, since))| (i, *since))
    };
    if let Some((i, _)) = oldest(Activity::Idle) {
        return Some(i);
    }
    match oldest(Activity::Receiving) {
        Some((i, since)) if now.saturating_duration_since(since) >= pressure_timeout => Some(i),
        _ => None,
    }
}

impl Slots {
    /// `max` slots; a partial request loses its slot to a new client after
    /// `pressure_timeout`.
    pub(super) fn new(max: usize, pressure_timeout: Duration) -> Slots {
        Slots {
            max,
            pressure_timeout,
            inner: Mutex::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Nothing in the table is left half-updated by a panic.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Gives the connection (`stream` is a clone of it) a slot, idle from
    /// now, taking one from another connection if all are taken. Returns
    /// its id, or `None` when every slot is busy with a request.
    pub(super) fn admit(&self, stream: UnixStream) -> Option<u64> {
        let now = Instant::now();
        let mut inner = self.lock();
        if inner.slots.len() >= self.max {
            let table: Vec<_> = inner.slots.iter().map(|s| (s.activity, s.since)).collect();
            let i = victim(&table, now, self.pressure_timeout)?;
            let lost = inner.slots.swap_remove(i);
            log::debug!(
                "API server: a {:?} connection gives its slot to a new client",
                lost.activity
            );
            // Wakes the connection's thread; its client cannot send more,
            // and it may still write (a reply under way, or a 503).
            let _ = lost.stream.shutdown(Shutdown::Read);
        }
        let id = inner.next_id;
        inner.next_id += 1;
        inner.slots.push(Slot {
            id,
            activity: Activity::Idle,
            since: now,
            stream,
        });
        Some(id)
    }

    /// Records what connection `id` does from now on. False if it lost its
    /// slot to another client.
    pub(super) fn set(&self, id: u64, activity: Activity) -> bool {
        let mut inner = self.lock();
        match inner.slots.iter_mut().find(|s| s.id == id) {
            Some(slot) => {
                if slot.activity != activity {
                    slot.activity = activity;
                    slot.since = Instant::now();
                }
                true
            }
            None => false,
        }
    }

    /// Whether connection `id` still holds its slot.
    pub(super) fn holds(&self, id: u64) -> bool {
        self.lock().slots.iter().any(|s| s.id == id)
    }

    /// Frees the slot of connection `id`, if it still holds one.
    pub(super) fn release(&self, id: u64) {
        self.lock().slots.retain(|s| s.id != id);
    }

    /// How many slots are taken.
    #[cfg(test)]
    pub(super) fn taken(&self) -> usize {
        self.lock().slots.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_idle_goes_first_then_a_slow_request() {
        use Activity::*;
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let grace = Duration::from_millis(1000);
        let now = at(5000);
        // The oldest idle, whatever else is older.
        let table = [
            (Handling, at(0)),
            (Idle, at(300)),
            (Receiving, at(10)),
            (Idle, at(200)),
        ];
        assert_eq!(victim(&table, now, grace), Some(3));
        // No idle one: the oldest partial request, once past the grace.
        let table = [
            (Handling, at(0)),
            (Receiving, at(4500)),
            (Receiving, at(3000)),
        ];
        assert_eq!(victim(&table, now, grace), Some(2));
        let table = [(Receiving, at(4500)), (Receiving, at(4200))];
        assert_eq!(victim(&table, now, grace), None);
        // A request with the VMM keeps its slot however long it takes.
        assert_eq!(victim(&[(Handling, at(0))], now, grace), None);
        assert_eq!(victim(&[], now, grace), None);
    }

    #[test]
    fn admit_takes_the_slot_of_the_longest_idle() {
        let slots = Slots::new(2, Duration::from_secs(3600));
        let pair = || UnixStream::pair().unwrap();
        let (a, a_peer) = pair();
        let (b, _b_peer) = pair();
        let (c, _c_peer) = pair();
        let (d, _d_peer) = pair();
        let ida = slots.admit(a.try_clone().unwrap()).unwrap();
        let idb = slots.admit(b).unwrap();
        assert!(slots.set(idb, Activity::Receiving));
        // c takes a's slot: a's reading side is shut down, its client's
        // writes fail.
        let idc = slots.admit(c).unwrap();
        assert_eq!(slots.taken(), 2);
        assert!(!slots.holds(ida) && !slots.set(ida, Activity::Receiving));
        let mut byte = [0u8; 1];
        assert_eq!(std::io::Read::read(&mut &a, &mut byte).unwrap(), 0);
        assert!(std::io::Write::write(&mut &a_peer, b"x").is_err());
        // Both remaining are busy: d is refused.
        assert!(slots.set(idc, Activity::Handling));
        assert_eq!(slots.admit(d), None);
        slots.release(idc);
        assert_eq!(slots.taken(), 1);
        assert!(slots.holds(idb));
    }
}
