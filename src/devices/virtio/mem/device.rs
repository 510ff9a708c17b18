//! The device's state: the block bitmap, the requested and usable sizes,
//! the checks of each request against the region, and the slots a request
//! maps or unmaps; the configuration space (virtio 1.2, 5.15.4):
//!
//! | offset | field |
//! |---|---|
//! | 0 | `le64 block_size` |
//! | 8 | `le16 node_id` (then 6 bytes of padding) |
//! | 16 | `le64 addr` |
//! | 24 | `le64 region_size` |
//! | 32 | `le64 usable_region_size` |
//! | 40 | `le64 plugged_size` |
//! | 48 | `le64 requested_size` |
//!
//! The worker ([`super::worker`]) takes one request at a time from
//! [`VirtioMem::next_step`] under the device's lock; what needs the sink
//! comes back as a [`Step`] to finish after the sink, with the lock taken
//! again ([`VirtioMem::finish_plug`], [`VirtioMem::finish_unplug`]).

use std::sync::Arc;

use virtio_queue::QueueT;
use vm_memory::{Bytes, GuestAddress};

use super::blocks::Blocks;
use super::request::{self, encode_response, RequestKind};
use super::{
    HotplugSink, MemError, MemMetrics, MemOptions, PlugRefused, CONFIG_BYTES, MIN_BLOCK_BYTES,
    QUEUE_SIZE, RESPONSE_BYTES, VIRTIO_ID_MEM, VIRTIO_MEM_F_ACPI_PXM,
    VIRTIO_MEM_F_UNPLUGGED_INACCESSIBLE, VIRTIO_MEM_RESP_ACK, VIRTIO_MEM_RESP_BUSY,
    VIRTIO_MEM_RESP_ERROR, VIRTIO_MEM_STATE_MIXED, VIRTIO_MEM_STATE_PLUGGED,
    VIRTIO_MEM_STATE_UNPLUGGED,
};
use crate::devices::virtio::{
    ActivateError, ActiveState, ConfigSpace, DeviceMemory, DeviceOffer, Epoch, VirtioDevice,
    VirtioInterruptType, Wake, VIRTIO_F_VERSION_1,
};
use crate::memory::GuestRange;

/// What the host sees of a device (`GET /hotplug/memory`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemStatus {
    /// Guest physical start of the region.
    pub region_addr: u64,
    /// The region's size.
    pub region_bytes: u64,
    /// The block size.
    pub block_bytes: u64,
    /// The memslot size.
    pub slot_bytes: u64,
    /// The guest node.
    pub node_id: u16,
    /// Bytes the guest has plugged.
    pub plugged_bytes: u64,
    /// The host's target.
    pub requested_bytes: u64,
    /// The usable part of the region (`usable_region_size`).
    pub usable_bytes: u64,
}

/// A request taken from the queue that waits for the sink.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingPlug {
    head: u16,
    resp_addr: GuestAddress,
    epoch: Epoch,
    first: usize,
    blocks: usize,
    /// The range to plug.
    pub range: GuestRange,
    /// The slots to map.
    pub map_slots: Vec<GuestRange>,
}

/// An UNPLUG or UNPLUG_ALL already committed, whose ranges go to the sink.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingUnplug {
    head: u16,
    resp_addr: GuestAddress,
    epoch: Epoch,
    /// The ranges to free.
    pub ranges: Vec<GuestRange>,
    /// The slots to unmap.
    pub unmap_slots: Vec<GuestRange>,
}

/// What one call of [`VirtioMem::next_step`] left to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// No chain (or the device is not active).
    Idle,
    /// A chain was answered under the lock.
    Done,
    /// A PLUG waits for [`HotplugSink::plug`].
    Plug(PendingPlug),
    /// An unplug waits for [`HotplugSink::unplug`].
    Unplug(PendingUnplug),
}

/// A virtio-mem device: one node's part of the hotplug region.
pub struct VirtioMem<M: DeviceMemory> {
    opts: MemOptions,
    blocks: Blocks,
    blocks_per_slot: usize,
    requested_bytes: u64,
    usable_bytes: u64,
    /// A response for a chain of an earlier activation (its epoch not this
    /// one's, [`ActiveState::epoch`]) is not written.
    active: Option<ActiveState<M>>,
    generation: u32,
    used_pending: bool,
    metrics: Arc<MemMetrics>,
    pub(crate) wake: Arc<Wake>,
    pub(crate) sink: Arc<dyn HotplugSink>,
}

impl<M: DeviceMemory> std::fmt::Debug for VirtioMem<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VirtioMem")
            .field("status", &self.status())
            .field("active", &self.active.is_some())
            .finish_non_exhaustive()
    }
}

/// Checks the options; the block count.
fn check(o: &MemOptions) -> Result<usize, MemError> {
    if !o.block_bytes.is_power_of_two() || o.block_bytes < MIN_BLOCK_BYTES {
        return Err(MemError::BlockSize(o.block_bytes));
    }
    if o.slot_bytes == 0 || o.slot_bytes % o.block_bytes != 0 {
        return Err(MemError::SlotSize {
            slot: o.slot_bytes,
            block: o.block_bytes,
        });
    }
    let blocks = usize::try_from(o.region_bytes / o.block_bytes).ok();
    if o.region_bytes == 0
        || o.region_bytes % o.slot_bytes != 0
        || o.region_addr.checked_add(o.region_bytes).is_none()
        || blocks.is_none()
    {
        return Err(MemError::RegionSize {
            region: o.region_bytes,
            slot: o.slot_bytes,
        });
    }
    if o.region_addr % o.slot_bytes != 0 {
        return Err(MemError::RegionAddr {
            addr: o.region_addr,
            slot: o.slot_bytes,
        });
    }
    Ok(blocks.unwrap_or(0))
}

impl<M: DeviceMemory> VirtioMem<M> {
    /// A device for `opts`, nothing plugged or requested, handing its
    /// blocks to `sink`.
    pub fn new(opts: MemOptions, sink: Arc<dyn HotplugSink>) -> Result<VirtioMem<M>, MemError> {
        let blocks = check(&opts)?;
        Ok(VirtioMem {
            blocks: Blocks::new(blocks),
            blocks_per_slot: (opts.slot_bytes / opts.block_bytes) as usize,
            opts,
            requested_bytes: 0,
            usable_bytes: 0,
            active: None,
            generation: 0,
            used_pending: false,
            metrics: Arc::new(MemMetrics::default()),
            wake: Arc::new(Wake::new().map_err(MemError::EventFd)?),
            sink,
        })
    }

    /// The host's target (`PATCH /hotplug/memory`): a multiple of the block
    /// size, at most the region. Raises `usable_region_size` to cover it,
    /// rounded up to whole slots (it is never lowered here: only the
    /// guest's UNPLUG_ALL does, as in Firecracker), and tells an active
    /// driver with a configuration-change interrupt.
    pub fn set_requested(&mut self, bytes: u64) -> Result<(), MemError> {
        let o = &self.opts;
        if bytes % o.block_bytes != 0 || bytes > o.region_bytes {
            return Err(MemError::RequestedSize {
                bytes,
                block: o.block_bytes,
                region: o.region_bytes,
            });
        }
        let usable = bytes.div_ceil(o.slot_bytes) * o.slot_bytes;
        self.requested_bytes = bytes;
        self.usable_bytes = self.usable_bytes.max(usable).min(o.region_bytes);
        self.config_changed();
        if let Some(a) = &self.active {
            if a.interrupt.trigger(VirtioInterruptType::Config).is_err() {
                self.metrics.queue_event_fails.inc();
            }
        }
        Ok(())
    }

    /// What the host sees now.
    pub fn status(&self) -> MemStatus {
        let o = &self.opts;
        MemStatus {
            region_addr: o.region_addr,
            region_bytes: o.region_bytes,
            block_bytes: o.block_bytes,
            slot_bytes: o.slot_bytes,
            node_id: o.node_id,
            plugged_bytes: self.plugged_bytes(),
            requested_bytes: self.requested_bytes,
            usable_bytes: self.usable_bytes,
        }
    }

    /// The counters.
    pub fn metrics(&self) -> &MemMetrics {
        &self.metrics
    }

    /// The counters, to read (or, for the sink's `unplug_discard_fails`,
    /// bump) without the device's lock.
    pub fn shared_metrics(&self) -> Arc<MemMetrics> {
        self.metrics.clone()
    }

    /// Whether the device is active (between `DRIVER_OK` and a reset).
    pub fn is_active(&self) -> bool {
        self.active.is_some()
    }

    /// The running activation's epoch (None: not active).
    fn epoch(&self) -> Option<Epoch> {
        self.active.as_ref().map(ActiveState::epoch)
    }

    fn plugged_bytes(&self) -> u64 {
        self.blocks.plugged() as u64 * self.opts.block_bytes
    }

    fn config_changed(&mut self) {
        self.generation = self.generation.wrapping_add(1);
    }

    /// The configuration space's bytes.
    pub fn config_bytes(&self) -> [u8; CONFIG_BYTES] {
        let o = &self.opts;
        let mut b = [0u8; CONFIG_BYTES];
        b[0..8].copy_from_slice(&o.block_bytes.to_le_bytes());
        b[8..10].copy_from_slice(&o.node_id.to_le_bytes());
        b[16..24].copy_from_slice(&o.region_addr.to_le_bytes());
        b[24..32].copy_from_slice(&o.region_bytes.to_le_bytes());
        b[32..40].copy_from_slice(&self.usable_bytes.to_le_bytes());
        b[40..48].copy_from_slice(&self.plugged_bytes().to_le_bytes());
        b[48..56].copy_from_slice(&self.requested_bytes.to_le_bytes());
        b
    }

    /// The blocks `[addr, addr + nb_blocks * block)` name, `(first,
    /// blocks)`, if they are a valid range: aligned, not empty, inside the
    /// usable region (checked arithmetic throughout).
    fn block_range(&self, addr: u64, nb_blocks: u16) -> Option<(usize, usize)> {
        let o = &self.opts;
        if nb_blocks == 0 || addr % o.block_bytes != 0 {
            return None;
        }
        let off = addr.checked_sub(o.region_addr)?;
        let len = u64::from(nb_blocks).checked_mul(o.block_bytes)?;
        if off.checked_add(len)? > self.usable_bytes {
            return None;
        }
        Some(((off / o.block_bytes) as usize, usize::from(nb_blocks)))
    }

    /// The guest range of blocks `[first, first + n)`.
    fn bytes_of(&self, first: usize, n: usize) -> GuestRange {
        let b = self.opts.block_bytes;
        GuestRange::new(self.opts.region_addr + first as u64 * b, n as u64 * b)
    }

    /// The slots blocks `[first, first + n)` touch whose plugged count
    /// `keep` accepts, as guest ranges.
    fn slots(&self, first: usize, n: usize, keep: impl Fn(usize) -> bool) -> Vec<GuestRange> {
        let bps = self.blocks_per_slot;
        (first / bps..=(first + n - 1) / bps)
            .filter(|&s| keep(self.blocks.count(s * bps, bps)))
            .map(|s| GuestRange::new(self.bytes_of(s * bps, bps).gpa, self.opts.slot_bytes))
            .collect()
    }

    /// Writes a response for chain `head` and puts it on the used ring.
    fn respond(&mut self, head: u16, resp_addr: GuestAddress, resp_type: u16, state: u16) {
        let Some(a) = self.active.as_mut() else {
            return;
        };
        let bytes = encode_response(resp_type, state);
        let len = if a.mem.write_slice(&bytes, resp_addr).is_ok() {
            RESPONSE_BYTES as u32
        } else {
            self.metrics.queue_event_fails.inc();
            0
        };
        if a.queues[0].add_used(&*a.mem, head, len).is_err() {
            self.metrics.queue_event_fails.inc();
        }
        self.used_pending = true;
    }

    /// Signals the used ring if responses were written since the last time.
    pub(crate) fn flush_used(&mut self) {
        if std::mem::take(&mut self.used_pending) {
            if let Some(a) = &self.active {
                if !a.signal_used(0) {
                    self.metrics.queue_event_fails.inc();
                }
            }
        }
    }

    /// Takes one chain off the queue and answers it, or, if it needs the
    /// sink, says what for (an UNPLUG's bits are already cleared).
    pub fn next_step(&mut self) -> Step {
        let Some(a) = self.active.as_mut() else {
            return Step::Idle;
        };
        let epoch = a.epoch();
        let Some(chain) = crate::devices::virtio::chains::pop_direct(
            &mut a.queues[0],
            &*a.mem,
            &self.metrics.queue_event_fails,
        ) else {
            return Step::Idle;
        };
        let req = match request::parse(&*a.mem, chain) {
            Ok(r) => r,
            Err((head, _why)) => {
                self.metrics.queue_event_fails.inc();
                if a.queues[0].add_used(&*a.mem, head, 0).is_err() {
                    self.metrics.queue_event_fails.inc();
                }
                self.used_pending = true;
                return Step::Done;
            }
        };
        let (head, resp) = (req.head, req.resp_addr);
        let m = self.metrics.clone();
        let error = |d: &mut Self, fails: &crate::devices::virtio::Counter| {
            fails.inc();
            d.respond(head, resp, VIRTIO_MEM_RESP_ERROR, 0);
            Step::Done
        };
        match req.kind {
            RequestKind::State { addr, nb_blocks } => {
                m.state_count.inc();
                let Some((first, n)) = self.block_range(addr, nb_blocks) else {
                    return error(self, &m.state_fails);
                };
                let state = match self.blocks.count(first, n) {
                    0 => VIRTIO_MEM_STATE_UNPLUGGED,
                    c if c == n => VIRTIO_MEM_STATE_PLUGGED,
                    _ => VIRTIO_MEM_STATE_MIXED,
                };
                self.respond(head, resp, VIRTIO_MEM_RESP_ACK, state);
                Step::Done
            }
            RequestKind::Plug { addr, nb_blocks } => {
                m.plug_count.inc();
                let Some((first, n)) = self.block_range(addr, nb_blocks) else {
                    return error(self, &m.plug_fails);
                };
                let range = self.bytes_of(first, n);
                let fits = self
                    .plugged_bytes()
                    .checked_add(range.len)
                    .is_some_and(|t| t <= self.requested_bytes);
                if !fits || self.blocks.count(first, n) != 0 {
                    return error(self, &m.plug_fails);
                }
                Step::Plug(PendingPlug {
                    head,
                    resp_addr: resp,
                    epoch,
                    first,
                    blocks: n,
                    range,
                    map_slots: self.slots(first, n, |c| c == 0),
                })
            }
            RequestKind::Unplug { addr, nb_blocks } => {
                m.unplug_count.inc();
                let Some((first, n)) = self.block_range(addr, nb_blocks) else {
                    return error(self, &m.unplug_fails);
                };
                if self.blocks.count(first, n) != n {
                    return error(self, &m.unplug_fails);
                }
                self.blocks.set(first, n, false);
                self.config_changed();
                let range = self.bytes_of(first, n);
                m.unplug_bytes.add(range.len);
                Step::Unplug(PendingUnplug {
                    head,
                    resp_addr: resp,
                    epoch,
                    ranges: vec![range],
                    unmap_slots: self.slots(first, n, |c| c == 0),
                })
            }
            RequestKind::UnplugAll => {
                m.unplug_all_count.inc();
                let runs = self.blocks.runs();
                let mut unmap_slots: Vec<GuestRange> = Vec::new();
                for &(first, n) in &runs {
                    for s in self.slots(first, n, |c| c > 0) {
                        if unmap_slots.last() != Some(&s) {
                            unmap_slots.push(s);
                        }
                    }
                }
                let ranges: Vec<GuestRange> =
                    runs.iter().map(|&(f, n)| self.bytes_of(f, n)).collect();
                m.unplug_bytes.add(self.plugged_bytes());
                let len = self.blocks.len();
                self.blocks.set(0, len, false);
                self.usable_bytes = 0;
                self.config_changed();
                if ranges.is_empty() {
                    self.respond(head, resp, VIRTIO_MEM_RESP_ACK, 0);
                    return Step::Done;
                }
                Step::Unplug(PendingUnplug {
                    head,
                    resp_addr: resp,
                    epoch,
                    ranges,
                    unmap_slots,
                })
            }
            RequestKind::Unknown(_) => error(self, &m.queue_event_fails),
        }
    }

    /// The sink answered a PLUG: commits its blocks if it was done and
    /// answers the chain. A PLUG whose activation a reset ended meanwhile is
    /// dropped: nothing is committed, and where the sink had mapped slots
    /// for it, the unplug that takes them out again is returned (for the
    /// caller to hand to the sink with no lock held).
    pub fn finish_plug(
        &mut self,
        p: PendingPlug,
        result: Result<(), PlugRefused>,
    ) -> Option<PendingUnplug> {
        let m = self.metrics.clone();
        if Some(p.epoch) != self.epoch() {
            // A reset came while the sink worked (the fence can take
            // seconds): the driver that asked is gone and no answer will
            // reach it, so nothing is committed. The slots the sink put in
            // for it go out again (the caller hands them back).
            m.plug_fails.inc();
            return result.is_ok().then(|| PendingUnplug {
                head: p.head,
                resp_addr: p.resp_addr,
                epoch: p.epoch,
                ranges: vec![p.range],
                unmap_slots: p.map_slots,
            });
        }
        let resp_type = match result {
            Ok(()) => {
                self.blocks.set(p.first, p.blocks, true);
                self.config_changed();
                m.plug_bytes.add(p.range.len);
                VIRTIO_MEM_RESP_ACK
            }
            Err(PlugRefused::Busy) => {
                m.busy_count.inc();
                VIRTIO_MEM_RESP_BUSY
            }
            Err(PlugRefused::Failed(_)) => {
                m.plug_fails.inc();
                VIRTIO_MEM_RESP_ERROR
            }
        };
        self.respond(p.head, p.resp_addr, resp_type, 0);
        None
    }

    /// The sink took an unplug's ranges: answers the chain ACK if its
    /// activation still runs.
    pub fn finish_unplug(&mut self, u: PendingUnplug) {
        if Some(u.epoch) == self.epoch() {
            self.respond(u.head, u.resp_addr, VIRTIO_MEM_RESP_ACK, 0);
        }
    }
}

impl<M: DeviceMemory> VirtioDevice<M> for VirtioMem<M> {
    fn offer(&self) -> DeviceOffer {
        DeviceOffer {
            device_type: VIRTIO_ID_MEM,
            avail_features: VIRTIO_F_VERSION_1
                | 1 << VIRTIO_MEM_F_ACPI_PXM
                | 1 << VIRTIO_MEM_F_UNPLUGGED_INACCESSIBLE,
            queue_sizes: &[QUEUE_SIZE],
        }
    }

    fn config_space(&self) -> ConfigSpace {
        ConfigSpace::new(&self.config_bytes())
    }

    fn config_generation(&self) -> u32 {
        self.generation
    }

    fn activate(&mut self, active: ActiveState<M>) -> Result<(), ActivateError> {
        let feature = if active.acked_features & (1 << VIRTIO_MEM_F_UNPLUGGED_INACCESSIBLE) == 0 {
            Err(ActivateError::FeatureNotAcked(
                VIRTIO_MEM_F_UNPLUGGED_INACCESSIBLE,
            ))
        } else {
            Ok(())
        };
        let checked = active.check(self.active.is_some(), [0]).and(feature);
        checked.inspect_err(|_| self.metrics.activate_fails.inc())?;
        self.active = Some(active);
        // Requests posted before DRIVER_OK.
        self.wake.again(&[0]).map_err(ActivateError::Signal)
    }

    fn reset(&mut self) {
        // The blocks, the requested and usable sizes stay (virtio 1.2,
        // 5.15.5: the device does not change the blocks' state on reset).
        self.active = None;
        self.used_pending = false;
        self.wake.clear();
    }
}
