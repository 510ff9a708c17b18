//! The network device's queue and tap work, run only on its thread: one
//! bounded pass per event.
//!
//! Transmit ([`Net::process_tx`]): each chain's readable descriptors are
//! gathered into a bounce buffer (at most [`MAX_BUFFER_BYTES`], checked
//! before any copy) and written to the tap as one frame; a chain too short
//! for the header, too long, with a write-only descriptor or outside guest
//! RAM is refused and counted. Every chain taken goes back to the guest.
//!
//! Receive ([`Net::process_rx`]): a frame is read from the tap into a bounce
//! buffer only when none waits; it then waits there for receive chains
//! (checked: writable, inside RAM, room for the header). Without mergeable
//! buffers it goes into one chain, or is dropped (counted) if that chain is
//! too small; with them it spans as many chains as it needs, whose used
//! entries are published together. With no chain the frame waits and the
//! tap is not read: the tap's own queue bounds a flood (the kernel drops
//! and counts), and the next receive notification resumes. The tap is
//! polled edge triggered and read until `WouldBlock`, or the pass is left
//! pending (the device wakes its thread), so nothing spins and nothing is
//! lost between events.

use std::sync::atomic::Ordering;

use virtio_queue::{DescriptorChain, Queue, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend};

use std::collections::VecDeque;

use super::device::RxChain;
use super::features::{GUEST_CSUM, GUEST_TSO4, GUEST_TSO6, GUEST_UFO, MRG_RXBUF};
use super::metrics::NetMetrics;
use super::{Net, MAX_BUFFER_BYTES, MAX_FRAMES_PER_PASS, RX_INDEX, TX_INDEX, VNET_HDR_BYTES};
use crate::devices::virtio::{ActiveState, DeviceMemory, PendingQueues};

/// Offset of `num_buffers` in the virtio-net header.
const NUM_BUFFERS_AT: usize = 10;

/// Gathers a transmit chain into `buf`: its length, or None for a chain
/// the device refuses.
fn gather<G: GuestMemoryBackend>(
    mem: &G,
    chain: DescriptorChain<&G>,
    buf: &mut [u8],
) -> Option<usize> {
    let mut n = 0usize;
    for d in chain {
        if d.is_write_only() {
            return None;
        }
        let end = n
            .checked_add(d.len() as usize)
            .filter(|&e| e <= buf.len())?;
        mem.read_slice(&mut buf[n..end], d.addr()).ok()?;
        n = end;
    }
    (n >= VNET_HDR_BYTES).then_some(n)
}

/// Checks a receive chain: every descriptor writable and inside guest RAM,
/// room for at least the header. Err: the head, to return unused.
fn check_rx_chain<G: GuestMemoryBackend>(
    mem: &G,
    chain: DescriptorChain<&G>,
) -> Result<RxChain, u16> {
    let head = chain.head_index();
    let mut bufs = Vec::new();
    let mut capacity = 0usize;
    for d in chain {
        let len = d.len() as usize;
        if !d.is_write_only() || !mem.check_range(d.addr(), len) {
            return Err(head);
        }
        bufs.push((d.addr().0, len));
        capacity = capacity.saturating_add(len).min(MAX_BUFFER_BYTES);
    }
    if capacity < VNET_HDR_BYTES {
        return Err(head);
    }
    Ok(RxChain {
        head,
        bufs,
        capacity,
    })
}

/// Whether the guest acked what a received frame's header asks of it.
fn offloads_acked(hdr: &[u8], acked: u64) -> bool {
    use virtio_bindings::virtio_net as n;
    let needs_csum = u32::from(hdr[0]) & n::VIRTIO_NET_HDR_F_NEEDS_CSUM != 0;
    if needs_csum && acked & GUEST_CSUM == 0 {
        return false;
    }
    let need = match u32::from(hdr[1]) {
        n::VIRTIO_NET_HDR_GSO_NONE => return true,
        n::VIRTIO_NET_HDR_GSO_TCPV4 => GUEST_TSO4,
        n::VIRTIO_NET_HDR_GSO_TCPV6 => GUEST_TSO6,
        n::VIRTIO_NET_HDR_GSO_UDP => GUEST_UFO,
        _ => return false, // ECN, UDP_L4: never offered
    };
    acked & need != 0
}

/// Puts `used` (head, bytes) in the used ring: every element first, then
/// the index once, so a driver never sees part of a merged frame.
fn publish_used<G: GuestMemoryBackend>(q: &mut Queue, mem: &G, used: &[(u16, u32)]) -> bool {
    if let [(head, len)] = used {
        return q.add_used(mem, *head, *len).is_ok();
    }
    let (size, base, start) = (q.size(), q.used_ring(), q.next_used());
    for (i, &(head, len)) in used.iter().enumerate() {
        if head >= size {
            return false;
        }
        let slot = u64::from(start.wrapping_add(i as u16) % size);
        let mut elem = [0u8; 8];
        elem[..4].copy_from_slice(&u32::from(head).to_le_bytes());
        elem[4..].copy_from_slice(&len.to_le_bytes());
        let Some(at) = base.checked_add(4 + slot * 8) else {
            return false;
        };
        if mem.write_slice(&elem, GuestAddress(at)).is_err() {
            return false;
        }
    }
    let next = start.wrapping_add(used.len() as u16);
    q.set_next_used(next);
    let Some(idx_at) = base.checked_add(2) else {
        return false;
    };
    mem.store(next.to_le(), GuestAddress(idx_at), Ordering::Release)
        .is_ok()
}

/// What the held receive chains can do for a frame of `n` bytes.
enum Room {
    /// The first `k` held chains take it.
    Ready(usize),
    /// No chain (yet): the frame waits.
    Wait,
    /// The guest's buffers can never take it: drop the frame, keep them.
    TooBig,
}

impl<M: DeviceMemory> Net<M> {
    /// Queue `index`'s eventfd fired. Does nothing while the device is not
    /// running or for an unknown queue.
    pub fn process_queue(&mut self, index: usize) {
        match index {
            RX_INDEX => {
                self.metrics.rx_queue_event_count.inc();
                self.process_rx();
            }
            TX_INDEX => {
                self.metrics.tx_queue_event_count.inc();
                self.process_tx();
            }
            _ => {}
        }
    }

    /// The tap became readable.
    pub fn process_tap(&mut self) {
        self.metrics.rx_tap_event_count.inc();
        self.process_rx();
    }

    /// The wake eventfd fired: a new activation (sets the tap's offloads),
    /// or passes left over.
    pub fn process_wake(&mut self, pending: PendingQueues) {
        self.apply_offload();
        if pending.has(TX_INDEX) {
            self.process_tx();
        }
        if pending.has(RX_INDEX) {
            self.process_rx();
        }
    }

    /// Sets the offloads of a new activation on the tap, once, before any
    /// frame is read for it. If the tap refuses, it keeps what it had
    /// (none, from `open_tap`, or a former activation's: frames that ask
    /// for offloads the guest did not ack are dropped in `process_rx`).
    fn apply_offload(&mut self) {
        let Some(flags) = self.offload.take() else {
            return;
        };
        if self.backend.set_offload(flags).is_err() {
            self.metrics.activate_fails.inc();
        }
    }

    /// One bounded transmit pass.
    pub fn process_tx(&mut self) {
        let Some(a) = self.active.as_mut() else {
            return;
        };
        let m = &*self.metrics;
        if self.limits.tx_blocked(m) {
            return; // the limiter's timer resumes
        }
        let (backend, buf, mmds, limits) = (
            &mut self.backend,
            &mut self.tx_buf,
            &mut self.mmds,
            &mut self.limits,
        );
        let (mut taken, mut used) = (0usize, false);
        let end = self.wake.pass(TX_INDEX, MAX_FRAMES_PER_PASS, || {
            let Some(chain) = crate::devices::virtio::chains::pop_direct(
                &mut a.queues[TX_INDEX],
                &*a.mem,
                &m.tx_fails,
            ) else {
                return false;
            };
            taken += 1;
            let head = chain.head_index();
            let sent = gather(&*a.mem, chain, buf);
            if sent.is_some_and(|n| !limits.admit_tx(n, m)) {
                // Back on the ring until the limiter's timer fires.
                let q = &mut a.queues[TX_INDEX];
                q.set_next_avail(q.next_avail().wrapping_sub(1));
                return false;
            }
            match sent {
                // Answered by the MMDS stack, never to the tap (after the
                // limiter, as in Firecracker).
                Some(n) if super::mmds::detour(mmds, &buf[..n]) => {}
                Some(n) => match backend.write_frame(&buf[..n]) {
                    Ok(_) => {
                        m.tx_packets_count.inc();
                        m.tx_bytes_count.add((n - VNET_HDR_BYTES) as u64);
                    }
                    Err(_) => {
                        m.tap_write_fails.inc();
                        m.tx_fails.inc();
                    }
                },
                None => {
                    m.tx_malformed_frames.inc();
                    m.tx_fails.inc();
                }
            }
            if a.queues[TX_INDEX].add_used(&*a.mem, head, 0).is_ok() {
                used = true;
            } else {
                m.event_fails.inc();
            }
            true
        });
        if end.wake_failed {
            m.event_fails.inc();
        }
        if taken == 0 {
            m.no_tx_avail_buffer.inc();
        }
        if used && !a.signal_used(TX_INDEX) {
            m.event_fails.inc();
        }
        if self.mmds.as_ref().is_some_and(|d| d.has_output()) {
            self.process_rx();
        }
    }

    /// Takes receive chains until the held ones can take `n` bytes;
    /// refused chains go back unused (`returned` is set).
    fn room_for(
        a: &mut ActiveState<M>,
        held: &mut VecDeque<RxChain>,
        n: usize,
        m: &NetMetrics,
        returned: &mut bool,
    ) -> Room {
        let mrg = a.acked_features & MRG_RXBUF != 0;
        loop {
            let mut have = 0usize;
            for (k, c) in held.iter().enumerate() {
                have += c.capacity;
                if have >= n {
                    return Room::Ready(k + 1);
                }
            }
            let full = usize::from(a.queues[RX_INDEX].size());
            if (!mrg && !held.is_empty()) || held.len() >= full {
                return Room::TooBig;
            }
            let Some(chain) = crate::devices::virtio::chains::pop_direct(
                &mut a.queues[RX_INDEX],
                &*a.mem,
                &m.rx_fails,
            ) else {
                return Room::Wait;
            };
            match check_rx_chain(&*a.mem, chain) {
                Ok(c) => held.push_back(c),
                Err(head) => {
                    m.rx_fails.inc();
                    if a.queues[RX_INDEX].add_used(&*a.mem, head, 0).is_ok() {
                        *returned = true;
                    } else {
                        m.event_fails.inc();
                    }
                }
            }
        }
    }

    /// Writes the frame of `n` bytes in `buf` into the first `k` held
    /// chains and publishes them.
    fn deliver(
        a: &mut ActiveState<M>,
        held: &mut VecDeque<RxChain>,
        buf: &mut [u8],
        n: usize,
        k: usize,
        m: &NetMetrics,
    ) {
        buf[NUM_BUFFERS_AT..VNET_HDR_BYTES].copy_from_slice(&(k as u16).to_le_bytes());
        let mut off = 0usize;
        let mut used = Vec::with_capacity(k);
        for c in held.drain(..k) {
            let mut wrote = 0usize;
            for &(gpa, len) in &c.bufs {
                if off == n {
                    break;
                }
                let w = len.min(n - off);
                if a.mem
                    .write_slice(&buf[off..off + w], GuestAddress(gpa))
                    .is_err()
                {
                    m.rx_fails.inc();
                }
                off += w;
                wrote += w;
            }
            used.push((c.head, wrote as u32));
        }
        if !publish_used(&mut a.queues[RX_INDEX], &*a.mem, &used) {
            m.event_fails.inc();
        }
        m.rx_packets_count.inc();
        m.rx_bytes_count.add((n - VNET_HDR_BYTES) as u64);
    }

    /// One bounded receive pass: frames from the tap into the guest's
    /// chains while both last.
    pub fn process_rx(&mut self) {
        self.apply_offload();
        let Some(a) = self.active.as_mut() else {
            return;
        };
        let m = &*self.metrics;
        if self.limits.rx_blocked(m) {
            return; // the tap is not read until the limiter's timer fires
        }
        let (backend, buf, mmds, limits) = (
            &mut self.backend,
            &mut self.rx_buf,
            &mut self.mmds,
            &mut self.limits,
        );
        let (frame, held) = (&mut self.rx_frame, &mut self.rx_held);
        let mut used = false;
        let end = self.wake.pass(RX_INDEX, MAX_FRAMES_PER_PASS, || {
            let n = match *frame {
                Some(n) => n,
                None => match super::mmds::read_frame(mmds, backend, buf) {
                    Ok(n) => n,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return false,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => return true,
                    Err(_) => {
                        // Not retried until the next event: no spinning on
                        // an error that repeats.
                        m.tap_read_fails.inc();
                        m.rx_fails.inc();
                        return false;
                    }
                },
            };
            let n = n.min(buf.len());
            if n < VNET_HDR_BYTES || !offloads_acked(&buf[..VNET_HDR_BYTES], a.acked_features) {
                *frame = None;
                m.rx_dropped_frames.inc();
                return true;
            }
            *frame = Some(n);
            match Self::room_for(a, held, n, m, &mut used) {
                Room::Ready(_) if !limits.admit_rx(n, m) => return false, // held
                Room::Ready(k) => {
                    Self::deliver(a, held, buf, n, k, m);
                    used = true;
                }
                Room::TooBig => m.rx_dropped_frames.inc(),
                Room::Wait => {
                    // The next receive notification resumes.
                    m.no_rx_avail_buffer.inc();
                    return false;
                }
            }
            *frame = None;
            true
        });
        if end.wake_failed {
            m.event_fails.inc();
        }
        if used && !a.signal_used(RX_INDEX) {
            m.event_fails.inc();
        }
    }
}
