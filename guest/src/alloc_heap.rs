//! The heap: power-of-two size classes with a free list each, carved from
//! a region in .bss. Blocks are aligned to their size up to a page, so the
//! DMA pages `virtio-drivers` asks for ([`crate::hal`]) come from here too.
//! The guest runs on one vCPU with interrupts off, so nothing runs
//! concurrently with an allocation.

use core::alloc::{GlobalAlloc, Layout};
use core::cell::UnsafeCell;
use core::ptr::null_mut;

/// Bytes of heap.
const HEAP_BYTES: usize = 16 << 20;
/// Size classes 16 B .. 8 MiB.
const CLASSES: usize = 20;
const MIN_SHIFT: usize = 4;

#[repr(C, align(4096))]
struct Region([u8; HEAP_BYTES]);

struct State {
    next: usize,
    free: [usize; CLASSES],
}

/// The allocator.
pub struct Heap {
    region: UnsafeCell<Region>,
    state: UnsafeCell<State>,
}

// SAFETY: the guest runs on one vCPU, with no interrupts: no two calls into
// the heap ever overlap.
unsafe impl Sync for Heap {}

#[global_allocator]
static HEAP: Heap = Heap {
    region: UnsafeCell::new(Region([0; HEAP_BYTES])),
    state: UnsafeCell::new(State {
        next: 0,
        free: [0; CLASSES],
    }),
};

fn class(layout: Layout) -> Option<usize> {
    let size = layout.size().max(layout.align()).max(1 << MIN_SHIFT);
    let shift = size.next_power_of_two().trailing_zeros() as usize;
    let c = shift - MIN_SHIFT;
    (c < CLASSES).then_some(c)
}

// SAFETY: blocks handed out are within the region, aligned to their class
// size (at least the layout's size and alignment, capped at a page: an
// alignment above 4096 is refused), and never handed out twice before
// being freed.
unsafe impl GlobalAlloc for Heap {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.align() > 4096 {
            return null_mut();
        }
        let Some(c) = class(layout) else {
            return null_mut();
        };
        // SAFETY: no other call runs (see `Sync`).
        let state = unsafe { &mut *self.state.get() };
        let base = self.region.get() as usize;
        let head = state.free[c];
        if head != 0 {
            // SAFETY: a free block's first word holds the next free block.
            state.free[c] = unsafe { *(head as *const usize) };
            return head as *mut u8;
        }
        let size = 1usize << (c + MIN_SHIFT);
        let align = size.min(4096);
        let start = (base + state.next).next_multiple_of(align);
        if start + size > base + HEAP_BYTES {
            return null_mut();
        }
        state.next = start + size - base;
        start as *mut u8
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        let Some(c) = class(layout) else { return };
        // SAFETY: no other call runs (see `Sync`).
        let state = unsafe { &mut *self.state.get() };
        // SAFETY: the block is ours again and at least 16 bytes.
        unsafe { *(ptr as *mut usize) = state.free[c] };
        state.free[c] = ptr as usize;
    }
}
