//! The host's side of the devices that give guest memory back: the sinks
//! the device layer calls (it knows guest ranges and blocks, nothing of
//! nodes, host addresses or memslots) and that hand the work to the memory
//! and KVM layers. [`discard`] frees ranges through the per-node discard
//! pool (the balloon's sink, and the pool virtio-mem frees through);
//! [`hotplug_slots`] is virtio-mem's sink: the hotplug region's slots
//! entering and leaving KVM.

pub mod discard;
pub mod hotplug_slots;
