//! What the devices' unit tests share: guest memory built from ranges and an
//! interrupt that records what it was asked to signal, and queue eventfds.

use std::sync::{Arc, Mutex};

use vm_memory::{GuestAddress, GuestMemoryMmap};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::interrupt::{VirtioInterrupt, VirtioInterruptType};

/// Guest memory as the tests hand it to a device.
pub type Mem = Arc<GuestMemoryMmap<()>>;

/// Guest memory of the `(start, length)` ranges, in bytes.
pub fn guest_memory(ranges: &[(u64, u64)]) -> Mem {
    let ranges: Vec<_> = ranges
        .iter()
        .map(|&(start, len)| (GuestAddress(start), len as usize))
        .collect();
    Arc::new(GuestMemoryMmap::from_ranges(&ranges).unwrap())
}

/// An interrupt that records each signal, in order.
#[derive(Default)]
pub struct Irq(pub Mutex<Vec<VirtioInterruptType>>);

impl VirtioInterrupt for Irq {
    fn trigger(&self, t: VirtioInterruptType) -> std::io::Result<()> {
        self.0.lock().unwrap().push(t);
        Ok(())
    }
}

/// `n` queue eventfds (non-blocking) and clones of them, for a device's
/// worker.
pub fn queue_evts(n: usize) -> (Vec<EventFd>, Vec<EventFd>) {
    let evts: Vec<EventFd> = (0..n)
        .map(|_| EventFd::new(EFD_NONBLOCK).unwrap())
        .collect();
    let clones = evts.iter().map(|e| e.try_clone().unwrap()).collect();
    (evts, clones)
}
