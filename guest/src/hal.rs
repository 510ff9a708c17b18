//! `virtio-drivers`' view of the machine: memory is identity-mapped, so a
//! buffer's physical address is its address, and DMA pages come from the
//! heap.

use core::alloc::Layout;
use core::ptr::NonNull;

use virtio_drivers::{BufferDirection, Hal, PhysAddr, PAGE_SIZE};

/// The guest's HAL.
pub struct GuestHal;

fn layout(pages: usize) -> Layout {
    Layout::from_size_align(pages * PAGE_SIZE, PAGE_SIZE).expect("DMA layout")
}

// SAFETY: pages come zeroed and page-aligned from the global allocator and
// are not aliased until freed; every address is identity-mapped, so the
// physical address the device uses is the pointer's value.
unsafe impl Hal for GuestHal {
    fn dma_alloc(pages: usize, _direction: BufferDirection) -> (PhysAddr, NonNull<u8>) {
        // SAFETY: the layout is not zero-sized (pages >= 1 in every caller).
        let p = unsafe { alloc::alloc::alloc_zeroed(layout(pages)) };
        let p = NonNull::new(p).expect("out of DMA memory");
        (p.as_ptr() as PhysAddr, p)
    }

    unsafe fn dma_dealloc(_paddr: PhysAddr, vaddr: NonNull<u8>, pages: usize) -> i32 {
        // SAFETY: allocated by `dma_alloc` with this layout.
        unsafe { alloc::alloc::dealloc(vaddr.as_ptr(), layout(pages)) };
        0
    }

    unsafe fn mmio_phys_to_virt(paddr: PhysAddr, _size: usize) -> NonNull<u8> {
        NonNull::new(paddr as *mut u8).expect("MMIO at address 0")
    }

    unsafe fn share(buffer: NonNull<[u8]>, _direction: BufferDirection) -> PhysAddr {
        buffer.as_ptr() as *mut u8 as PhysAddr
    }

    unsafe fn unshare(_paddr: PhysAddr, _buffer: NonNull<[u8]>, _direction: BufferDirection) {}
}
