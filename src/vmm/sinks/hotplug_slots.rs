//! The sink of every virtio-mem device ([`HotplugSlots`]): the hotplug
//! region's slots entering and leaving KVM, and its unplugged blocks freed
//! behind by the per-node discard pool that the balloon shares
//! ([`super::discard`]). The devices themselves, as the VMM drives them
//! (`PATCH` and `GET /hotplug/memory`), are
//! [`crate::vmm::devices::Hotplug`].
//!
//! The sink is the boundary between the device (which
//! knows blocks and slots) and the memory and KVM layers (which know host
//! addresses, files and memslot numbers). A PLUG waits first for any
//! discard of its range still running (the fence: no discard ever zeroes a
//! block the guest has plugged again), at most [`FENCE_DEADLINE`], and is
//! answered BUSY past it; then the slots it needs enter KVM. An UNPLUG
//! hands its ranges to the pool and returns at once (the guest has its
//! answer); the pool takes the slots it empties out of KVM first, on a
//! worker, and frees the ranges only after (so a guest that touches a
//! block it unplugged faults nothing back in behind the free: KVM's memslot
//! deletion zaps the slot's mappings and waits out every vCPU that may
//! hold it before it returns, and an access after is an MMIO exit that
//! reads zeros). The fence covers the emptied slots too, so a PLUG into
//! one waits until it has left KVM before it enters again.
//!
//! Devices follow the same slots ([`crate::memory::PluggedSlots`]): a slot
//! becomes reachable through the devices' view once it is in KVM, and
//! before it leaves KVM it is hidden from them and every device pass that
//! may have found it is waited for ([`crate::devices::virtio::quiesce`]),
//! so no device writes into a block behind its free. A Linux guest puts
//! page cache and socket buffers in the memory it plugs: its block, net
//! and vsock requests there are served, and one into unplugged memory is
//! an error to the guest.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crate::devices::virtio::mem::{HotplugSink, MemMetrics, PlugRefused};
use crate::devices::virtio::quiesce;
use crate::memory::{GmemBinding, GuestMemory, GuestRange, GuestView, PluggedSlots};
use crate::vstate::vm::{MemorySlot, Memslots, Vm, VmError};

use super::discard::PoolSink;

/// Longest a PLUG waits for a discard of its range before it is answered
/// BUSY (the guest retries).
pub const FENCE_DEADLINE: Duration = Duration::from_secs(5);

/// Errors of making the sink.
#[derive(Debug, thiserror::Error)]
pub enum HotplugSlotsError {
    /// There are more memslots than KVM takes.
    #[error("memory hotplug needs {needed} memslots and KVM takes {available}: use a larger slot_size_mib")]
    TooManyMemslots {
        /// RAM's and the region's.
        needed: usize,
        /// KVM's limit.
        available: usize,
    },
    /// The VM's memslot handle could not be made.
    #[error("memory hotplug: {0}")]
    Vm(#[from] VmError),
    /// A guest_memfd could not be duplicated for the sink.
    #[error("memory hotplug: cannot duplicate a guest_memfd: {0}")]
    Dup(std::io::Error),
}

/// One KVM memslot of the region, owned (its guest_memfd duplicated), so
/// the sink needs no borrow of the memory.
#[derive(Debug)]
struct OwnedSlot {
    id: u32,
    guest_addr: u64,
    size: u64,
    host_addr: u64,
    file: Option<(OwnedFd, u64)>,
    /// In KVM now: added and not (successfully) removed since. A removal
    /// that fails leaves it set, so the slot is neither added twice nor
    /// taken for gone while the guest can still reach it.
    in_kvm: bool,
}

/// One slot of `slot_size_mib`: the memslots that map it (one, or one per
/// guest_memfd stripe it crosses).
#[derive(Debug)]
struct RegionSlot {
    guest_addr: u64,
    memslots: Vec<OwnedSlot>,
}

/// The memslot handle and the slots; `None` once released.
type SlotState = Option<(Memslots, Vec<RegionSlot>)>;

/// The sink of every virtio-mem device: the region's slots, the VM's
/// memslot handle and the discard pool.
pub struct HotplugSlots {
    /// `None` once released (the devices are stopped): nothing is added
    /// or removed after, and the VM fd's duplicate is closed. Shared with
    /// the UNPLUG preludes that the pool's workers run.
    state: Arc<Mutex<SlotState>>,
    discard: Arc<PoolSink>,
    dirty_log: bool,
    /// Keeps the region's mappings alive while a memslot may point at them;
    /// its [`crate::memory::PluggedSlots`] say which slots devices reach.
    view: GuestView,
    /// Every device's metrics, for the discard failures.
    metrics: Mutex<Vec<Arc<MemMetrics>>>,
    /// Unplugged ranges whose discard failed, retry included: still
    /// holding what the guest wrote. A PLUG of any of them frees it first
    /// (a plugged block reads zeros, whatever happened).
    unfreed: Arc<Mutex<Vec<GuestRange>>>,
}

impl std::fmt::Debug for HotplugSlots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HotplugSlots").finish_non_exhaustive()
    }
}

fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Takes the slots at `unmap_slots` out of the devices' reach, waits for the
/// device passes that may have found them (at most [`FENCE_DEADLINE`]),
/// then takes them out of KVM (each memslot still in it); a removal that
/// fails is logged and left in. Returns how many failed.
fn remove_slots(
    state: &Mutex<SlotState>,
    plugged: &PluggedSlots,
    unmap_slots: &[GuestRange],
) -> usize {
    for &GuestRange { gpa: addr, .. } in unmap_slots {
        plugged.set(addr, false);
    }
    if !quiesce(Instant::now() + FENCE_DEADLINE) {
        log::warn!(
            "virtio-mem: a device pass ran on past {FENCE_DEADLINE:?} while its slot was unplugged; freeing the slot anyway"
        );
    }
    let mut state = lock(state);
    let Some((memslots, slots)) = state.as_mut() else {
        return 0;
    };
    let mut failed = 0;
    for &GuestRange { gpa: addr, .. } in unmap_slots {
        let Some(s) = slots.iter_mut().find(|s| s.guest_addr == addr) else {
            continue;
        };
        for m in s.memslots.iter_mut().filter(|m| m.in_kvm) {
            match memslots.remove(m.id, m.guest_addr) {
                Ok(()) => m.in_kvm = false,
                Err(e) => {
                    failed += 1;
                    log::error!("virtio-mem: {e}; the slot stays in KVM");
                }
            }
        }
    }
    failed
}

impl HotplugSlots {
    /// The slots of `memory`'s hotplug region in `slot_bytes`, numbered
    /// after RAM's memslots, checked against KVM's limit.
    pub fn new(
        vm: &Vm,
        memory: &GuestMemory,
        slot_bytes: u64,
        discard: Arc<PoolSink>,
        dirty_log: bool,
    ) -> Result<HotplugSlots, HotplugSlotsError> {
        let mut next = u32::try_from(memory.slots().len()).unwrap_or(u32::MAX);
        let mut slots = Vec::new();
        for part in memory.hotplug() {
            let s = part.slice();
            let mut addr = s.guest_addr;
            while addr < s.guest_addr + s.len {
                let mut memslots = Vec::new();
                for m in memory.hotplug_memslots(addr, slot_bytes) {
                    let file = match m.guest_memfd {
                        Some(GmemBinding { fd, offset }) => Some((
                            fd.as_fd()
                                .try_clone_to_owned()
                                .map_err(HotplugSlotsError::Dup)?,
                            offset,
                        )),
                        None => None,
                    };
                    memslots.push(OwnedSlot {
                        id: next,
                        guest_addr: m.guest_addr,
                        size: m.len,
                        host_addr: m.host_addr,
                        file,
                        in_kvm: false,
                    });
                    next = next.saturating_add(1);
                }
                slots.push(RegionSlot {
                    guest_addr: addr,
                    memslots,
                });
                addr += slot_bytes;
            }
        }
        let available = vm.max_memslots();
        if next as usize > available {
            return Err(HotplugSlotsError::TooManyMemslots {
                needed: next as usize,
                available,
            });
        }
        Ok(HotplugSlots {
            state: Arc::new(Mutex::new(Some((vm.memslots()?, slots)))),
            discard,
            dirty_log,
            view: memory.view(),
            metrics: Mutex::new(Vec::new()),
            unfreed: Arc::new(Mutex::new(Vec::new())),
        })
    }

    /// Lets go of the VM (its fd's duplicate) and of the slots: called
    /// when the devices stop, before the VM is closed and memory reclaimed.
    pub fn release(&self) {
        lock(&self.state).take();
    }

    /// Counts discard failures on `metrics` too (each device's).
    pub fn watch(&self, metrics: Arc<MemMetrics>) {
        lock(&self.metrics).push(metrics);
    }

    /// Frees what is left unfreed in `range` (an earlier UNPLUG's failed
    /// discard) before it is plugged again; false if it could not be.
    fn free_unfreed(&self, range: GuestRange) -> bool {
        let overlap: Vec<GuestRange> = {
            let mut unfreed = lock(&self.unfreed);
            let (hit, keep) = unfreed.drain(..).partition(|r| r.overlaps(&range));
            *unfreed = keep;
            hit
        };
        if overlap.is_empty() {
            return true;
        }
        let (tx, rx) = std::sync::mpsc::channel();
        self.discard.discard_ranges(
            &overlap,
            None,
            Box::new(move |outcome| {
                let _ = tx.send(outcome.failed == 0);
            }),
        );
        let freed = rx.recv_timeout(FENCE_DEADLINE).unwrap_or(false);
        if freed {
            log::info!(
                "virtio-mem: {} unplugged range(s) left unfreed are freed before the PLUG",
                overlap.len()
            );
        } else {
            lock(&self.unfreed).extend(overlap);
        }
        freed
    }

    fn add(&self, memslots: &Memslots, s: &OwnedSlot) -> Result<(), VmError> {
        let slot = MemorySlot {
            guest_addr: s.guest_addr,
            size: s.size,
            host_addr: s.host_addr,
            guest_memfd: s.file.as_ref().map(|(fd, offset)| GmemBinding {
                fd: fd.as_fd(),
                offset: *offset,
            }),
            dirty_log: self.dirty_log,
        };
        // SAFETY: the range is part of the hotplug region's mapping, which
        // `view` keeps alive for as long as this sink exists; the sink is
        // released (every slot's handle dropped) before the memory is
        // reclaimed, and KVM follows an munmap through its MMU notifier.
        unsafe { memslots.add(s.id, &slot) }
    }
}

impl HotplugSink for HotplugSlots {
    fn plug(&self, range: GuestRange, map_slots: &[GuestRange]) -> Result<(), PlugRefused> {
        if !self
            .discard
            .wait_overlapping(&[range], Instant::now() + FENCE_DEADLINE)
        {
            return Err(PlugRefused::Busy);
        }
        if !self.free_unfreed(range) {
            return Err(PlugRefused::Failed(
                "memory unplugged earlier could not be freed; the blocks stay unplugged".into(),
            ));
        }
        let mut state = lock(&self.state);
        let Some((memslots, slots)) = state.as_mut() else {
            return Err(PlugRefused::Failed("the VM is stopping".into()));
        };
        // (slot, memslot) this request put in, taken out again if a later
        // one fails: the blocks stay unplugged.
        let mut added: Vec<(usize, usize)> = Vec::new();
        for &GuestRange { gpa: addr, .. } in map_slots {
            let Some(i) = slots.iter().position(|s| s.guest_addr == addr) else {
                continue;
            };
            for k in 0..slots[i].memslots.len() {
                if slots[i].memslots[k].in_kvm {
                    continue;
                }
                if let Err(e) = self.add(memslots, &slots[i].memslots[k]) {
                    for &(i, k) in &added {
                        let m: &mut OwnedSlot = &mut slots[i].memslots[k];
                        if memslots.remove(m.id, m.guest_addr).is_ok() {
                            m.in_kvm = false;
                        }
                    }
                    return Err(PlugRefused::Failed(e.to_string()));
                }
                slots[i].memslots[k].in_kvm = true;
                added.push((i, k));
            }
        }
        // In KVM: devices reach the slots too.
        for &GuestRange { gpa: addr, .. } in map_slots {
            self.view.plugged().set(addr, true);
        }
        Ok(())
    }

    fn unplug(&self, ranges: &[GuestRange], unmap_slots: &[GuestRange]) {
        let metrics = lock(&self.metrics).clone();
        let (unfreed, batch) = (self.unfreed.clone(), ranges.to_vec());
        // Called with the retry's outcome, while it is still in flight: a
        // PLUG of these ranges waits until they are listed.
        let done: crate::memory::DiscardDone = Box::new(move |outcome| {
            if outcome.failed > 0 {
                log::error!(
                    "virtio-mem: an UNPLUG's discard failed twice ({} part(s) of {} ranges); \
                     the memory stays taken until the guest plugs it again, which frees it first",
                    outcome.failed,
                    batch.len()
                );
                lock(&unfreed).extend(batch);
                for m in &metrics {
                    m.unplug_discard_fails.inc();
                }
            }
        });
        let after = (!unmap_slots.is_empty()).then(|| {
            let (state, emptied) = (self.state.clone(), unmap_slots.to_vec());
            let plugged = self.view.plugged().clone();
            let before: crate::memory::DiscardPrelude = Box::new(move || {
                remove_slots(&state, &plugged, &emptied);
            });
            (unmap_slots, before)
        });
        self.discard.discard_ranges(ranges, after, done);
    }
}
