//! The guest memory handle a device is given at activation
//! ([`DeviceMemory`]): `GuestView` in production, an `Arc<GuestMemoryMmap>`
//! in tests. Devices reach guest memory only through it, and drop it on
//! reset.

use std::ops::Deref;

use vm_memory::GuestMemoryBackend;

/// The memory handle a device is given: something cheap to clone that
/// derefs to vm-memory guest memory with regions ([`GuestMemoryBackend`]:
/// `GuestView` in production, an `Arc<GuestMemoryMmap>` in tests).
pub trait DeviceMemory: Deref<Target = Self::Mem> + Clone + Send + Sync + 'static {
    /// The guest memory behind the handle.
    type Mem: GuestMemoryBackend + Send + Sync;
}

impl<T> DeviceMemory for T
where
    T: Deref + Clone + Send + Sync + 'static,
    T::Target: GuestMemoryBackend + Send + Sync + Sized,
{
    type Mem = T::Target;
}
