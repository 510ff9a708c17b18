//! The entropy device over plain guest memory, with virtio-queue's mock
//! driver: filled chains, hostile chains answered, the limiter holding.

use std::sync::Arc;

use virtio_bindings::virtio_ring::{VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
use virtio_queue::desc::{split::Descriptor, RawDescriptor};
use virtio_queue::mock::MockSplitQueue;
use virtio_queue::Queue;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::*;
use crate::devices::virtio::test_utils::{guest_memory, Irq, Mem};
use crate::devices::virtio::VirtioInterrupt;
use crate::rate_limiter::TokenBucketConfig;

const MIB: u64 = 1 << 20;
const BUF: u64 = 4 * MIB;
const W: u32 = VRING_DESC_F_WRITE;
const N: u32 = VRING_DESC_F_NEXT;

fn desc(addr: u64, len: u32, flags: u32, next: u16) -> RawDescriptor {
    RawDescriptor::from(Descriptor::new(addr, len, flags as u16, next))
}

fn started<'a>(
    rng: &mut Rng<Mem>,
    mem: &'a GuestMemoryMmap<()>,
    arc: &Mem,
) -> MockSplitQueue<'a, GuestMemoryMmap<()>> {
    let q = MockSplitQueue::create(mem, GuestAddress(MIB), 16);
    let queues: Vec<Queue> = vec![q.create_queue().unwrap()];
    let irq: Arc<dyn VirtioInterrupt> = Arc::new(Irq::default());
    rng.activate(ActiveState::new(
        arc.clone(),
        VIRTIO_F_VERSION_1,
        queues,
        irq,
    ))
    .unwrap();
    q
}

fn used(
    mem: &GuestMemoryMmap<()>,
    q: &MockSplitQueue<'_, GuestMemoryMmap<()>>,
    i: u64,
) -> (u32, u32) {
    let at = q.used_addr().0 + 4 + i * 8;
    (
        mem.read_obj(GuestAddress(at)).unwrap(),
        mem.read_obj(GuestAddress(at + 4)).unwrap(),
    )
}

#[test]
fn chains_are_filled_and_hostile_ones_answered() {
    let arc = guest_memory(&[(0, 16 * MIB)]);
    let mem = arc.clone();
    let mut rng: Rng<Mem> = Rng::new(&RateLimiterConfig::default()).unwrap();
    assert_eq!(rng.device_type(), 4);
    assert_eq!(rng.queue_max_sizes(), &[256]);
    let q = started(&mut rng, &mem, &arc);
    q.add_desc_chains(&[desc(BUF, 64, W, 0)], 0).unwrap();
    q.add_desc_chains(&[desc(BUF + 0x1000, 64, W, 0)], 1)
        .unwrap();
    // Read-only, zero-length, outside RAM, larger than the cap.
    q.add_desc_chains(&[desc(BUF + 0x2000, 64, 0, 0)], 2)
        .unwrap();
    q.add_desc_chains(&[desc(BUF + 0x3000, 0, W, 0)], 3)
        .unwrap();
    q.add_desc_chains(&[desc(32 * MIB, 64, W, 0)], 4).unwrap();
    q.add_desc_chains(
        &[
            desc(BUF + 0x10000, 0x10000, W | N, 6),
            desc(BUF + 0x20000, 0x10000, W, 0),
        ],
        5,
    )
    .unwrap();
    rng.process_queue();
    assert_eq!(q.used().idx().load(), 6);
    assert_eq!(used(&mem, &q, 0), (0, 64));
    assert_eq!(used(&mem, &q, 1), (1, 64));
    assert_eq!(used(&mem, &q, 2), (2, 0));
    assert_eq!(used(&mem, &q, 3), (3, 0));
    assert_eq!(used(&mem, &q, 4), (4, 0));
    assert_eq!(used(&mem, &q, 5), (5, MAX_REQUEST_BYTES as u32));
    let mut a = [0u8; 64];
    let mut b = [0u8; 64];
    mem.read_slice(&mut a, GuestAddress(BUF)).unwrap();
    mem.read_slice(&mut b, GuestAddress(BUF + 0x1000)).unwrap();
    assert_ne!(a, [0; 64]);
    assert_ne!(a, b);
    let m = rng.metrics();
    assert_eq!(m.entropy_event_count.get(), 6);
    assert_eq!(m.entropy_event_fails.get(), 2);
    assert_eq!(m.entropy_bytes.get(), 128 + MAX_REQUEST_BYTES as u64);
}

#[test]
fn the_limiter_holds_requests_on_the_ring() {
    let arc = guest_memory(&[(0, 16 * MIB)]);
    let mem = arc.clone();
    let lim = RateLimiterConfig {
        bandwidth: Some(TokenBucketConfig {
            size: 100,
            one_time_burst: None,
            refill_time: 1000,
        }),
        ops: None,
    };
    let mut rng: Rng<Mem> = Rng::new(&lim).unwrap();
    assert_eq!(rng.limiter_config(), lim);
    let q = started(&mut rng, &mem, &arc);
    for i in 0..3u16 {
        q.add_desc_chains(&[desc(BUF + u64::from(i) * 0x1000, 64, W, 0)], i)
            .unwrap();
    }
    rng.process_queue();
    assert_eq!(q.used().idx().load(), 1);
    rng.process_queue();
    assert_eq!(q.used().idx().load(), 1);
    assert_eq!(rng.metrics().entropy_rate_limiter_throttled.get(), 2);
    // A spurious timer wake changes nothing.
    rng.process_limiter();
    assert_eq!(q.used().idx().load(), 1);
}
