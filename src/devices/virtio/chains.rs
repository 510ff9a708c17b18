//! Taking chains off a queue for a device that never offers
//! `VIRTIO_RING_F_INDIRECT_DESC` (none of teravm's does, as Firecracker's
//! do not): a chain that points at an indirect table is refused, answered
//! with nothing (used length 0) and counted, before the device looks at
//! it. The virtio-queue crate follows indirect tables on its own (up to
//! 65,535 entries a table), so without this a guest could hand one device
//! pass millions of buffers while the queue holds 256.
//!
//! The check walks the chain's descriptors in the table as the driver
//! left them, at most one queue size of them. A guest that rewrites a
//! descriptor between this walk and the device's own can still slip one
//! table past it; each device's pass caps what it takes from one chain, so
//! that costs bounded work, never memory.

use virtio_queue::{DescriptorChain, Queue, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend};

use super::metrics::Counter;

/// `VIRTQ_DESC_F_NEXT`.
const F_NEXT: u16 = 1;
/// `VIRTQ_DESC_F_INDIRECT`.
const F_INDIRECT: u16 = 4;
/// Bytes of one descriptor: le64 addr, le32 len, le16 flags, le16 next.
const DESC_BYTES: u64 = 16;

/// Whether the chain at `head` of the table at `table` (of `size` entries)
/// has a descriptor that points at an indirect table (a descriptor that
/// cannot be read counts as one: the chain is refused).
fn refers_to_indirect<G: GuestMemoryBackend>(mem: &G, table: u64, size: u16, head: u16) -> bool {
    let mut i = head;
    for _ in 0..size {
        let mut d = [0u8; DESC_BYTES as usize];
        let at = table.wrapping_add(u64::from(i) * DESC_BYTES);
        if mem.read_slice(&mut d, GuestAddress(at)).is_err() {
            return true;
        }
        let flags = u16::from_le_bytes([d[12], d[13]]);
        if flags & F_INDIRECT != 0 {
            return true;
        }
        if flags & F_NEXT == 0 {
            return false;
        }
        i = u16::from_le_bytes([d[14], d[15]]);
        if i >= size {
            // The crate's iterator ends the chain there.
            return false;
        }
    }
    false
}

/// The next chain of `queue` that refers to no indirect table; those that
/// do are answered with a used length of 0 and counted on `refused`, at
/// most one queue size of them a call (then `None`, as for an empty ring;
/// the next notification goes on).
pub fn pop_direct<'a, G: GuestMemoryBackend>(
    queue: &mut Queue,
    mem: &'a G,
    refused: &Counter,
) -> Option<DescriptorChain<&'a G>> {
    for _ in 0..queue.size().max(1) {
        let chain = queue.pop_descriptor_chain(mem)?;
        let head = chain.head_index();
        if !refers_to_indirect(mem, queue.desc_table(), queue.size(), head) {
            return Some(chain);
        }
        refused.inc();
        if queue.add_used(mem, head, 0).is_err() {
            refused.inc();
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use virtio_queue::desc::{split::Descriptor as SplitDescriptor, RawDescriptor};
    use virtio_queue::mock::MockSplitQueue;
    use vm_memory::GuestMemoryMmap;

    #[test]
    fn a_chain_through_an_indirect_table_is_refused_and_a_direct_one_taken() {
        let mem: GuestMemoryMmap<()> =
            GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x10_0000)]).unwrap();
        let vq = MockSplitQueue::new(&mem, 16);
        // Chain 0: one buffer pointing at an indirect table (refused).
        // Chain 1: two plain buffers, linked (taken).
        let descs = [
            RawDescriptor::from(SplitDescriptor::new(0x8000, 64, F_INDIRECT, 0)),
            RawDescriptor::from(SplitDescriptor::new(0x9000, 16, F_NEXT, 2)),
            RawDescriptor::from(SplitDescriptor::new(0xa000, 16, 0, 0)),
        ];
        vq.build_multiple_desc_chains(&descs).unwrap();
        let mut q: Queue = vq.create_queue().unwrap();
        let refused = Counter::default();
        let chain = pop_direct(&mut q, &mem, &refused).expect("the direct chain");
        assert_eq!(chain.head_index(), 1);
        assert_eq!(chain.count(), 2);
        assert_eq!(refused.get(), 1);
        assert_eq!(vq.used().idx().load(), 1, "the refused one was answered");
        assert!(pop_direct(&mut q, &mem, &refused).is_none());
    }
}
