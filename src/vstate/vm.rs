//! The KVM VM: `/dev/kvm`, the VM fd, memslots and vCPU creation.

use kvm_bindings::{kvm_userspace_memory_region, CpuId, KVM_MAX_CPUID_ENTRIES};
use kvm_ioctls::{Kvm, VcpuFd, VmFd};

/// Errors of the VM.
#[derive(Debug, thiserror::Error)]
pub enum VmError {
    /// `/dev/kvm` could not be opened.
    #[error("cannot open /dev/kvm: {0} (is KVM enabled, and may this user use it?)")]
    OpenKvm(kvm_ioctls::Error),
    /// `KVM_CREATE_VM` failed.
    #[error("KVM_CREATE_VM failed: {0}")]
    CreateVm(kvm_ioctls::Error),
    /// The host lacks memslots for this guest.
    #[error("the guest needs {needed} memslots; this host's KVM has {available}")]
    TooManyMemslots {
        /// Slots the guest needs.
        needed: usize,
        /// Slots KVM offers.
        available: usize,
    },
    /// `KVM_SET_USER_MEMORY_REGION` failed.
    #[error("KVM_SET_USER_MEMORY_REGION for slot {slot} ({size} bytes at guest {guest_addr:#x}) failed: {source}")]
    SetUserMemoryRegion {
        /// The slot.
        slot: u32,
        /// Guest address.
        guest_addr: u64,
        /// Size in bytes.
        size: u64,
        /// KVM's error.
        source: kvm_ioctls::Error,
    },
    /// `KVM_GET_SUPPORTED_CPUID` failed.
    #[error("KVM_GET_SUPPORTED_CPUID failed: {0}")]
    SupportedCpuid(kvm_ioctls::Error),
    /// `KVM_CREATE_VCPU` failed.
    #[error("KVM_CREATE_VCPU {index} failed: {source}")]
    CreateVcpu {
        /// vCPU index.
        index: u8,
        /// KVM's error.
        source: kvm_ioctls::Error,
    },
}

/// One memslot: guest physical range backed by host virtual memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemorySlot {
    /// Guest physical address.
    pub guest_addr: u64,
    /// Size in bytes.
    pub size: u64,
    /// Host virtual address of the mapping.
    pub host_addr: u64,
}

/// The KVM VM.
pub struct Vm {
    kvm: Kvm,
    fd: VmFd,
}

impl Vm {
    /// Opens `/dev/kvm` and creates a VM.
    pub fn new() -> Result<Vm, VmError> {
        let kvm = Kvm::new().map_err(VmError::OpenKvm)?;
        let fd = kvm.create_vm().map_err(VmError::CreateVm)?;
        Ok(Vm { kvm, fd })
    }

    /// Whether `/dev/kvm` can be opened (tests and benchmarks skip without it).
    pub fn available() -> Result<(), VmError> {
        Kvm::new().map(|_| ()).map_err(VmError::OpenKvm)
    }

    /// Registers guest RAM, one memslot per mapping.
    ///
    /// # Safety
    ///
    /// Each slot's host range must be a mapping that stays valid until the VM
    /// is dropped or the mapping is unmapped (KVM follows an `munmap` through
    /// its MMU notifier, so unmapping first is sound; handing KVM memory that
    /// is later reused for something else is not).
    pub unsafe fn register_memory(&self, slots: &[MemorySlot]) -> Result<(), VmError> {
        let available = self.kvm.get_nr_memslots();
        if slots.len() > available {
            return Err(VmError::TooManyMemslots {
                needed: slots.len(),
                available,
            });
        }
        for (slot, s) in (0u32..).zip(slots) {
            let region = kvm_userspace_memory_region {
                slot,
                flags: 0,
                guest_phys_addr: s.guest_addr,
                memory_size: s.size,
                userspace_addr: s.host_addr,
            };
            // SAFETY: the caller guarantees the host range is a live mapping
            // of `size` bytes for as long as KVM may use it.
            unsafe { self.fd.set_user_memory_region(region) }.map_err(|source| {
                VmError::SetUserMemoryRegion {
                    slot,
                    guest_addr: s.guest_addr,
                    size: s.size,
                    source,
                }
            })?;
        }
        Ok(())
    }

    /// The CPUID KVM supports on this host, handed to every vCPU.
    pub fn supported_cpuid(&self) -> Result<CpuId, VmError> {
        self.kvm
            .get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
            .map_err(VmError::SupportedCpuid)
    }

    /// Creates vCPU `index`.
    pub fn create_vcpu(&self, index: u8) -> Result<VcpuFd, VmError> {
        self.fd
            .create_vcpu(u64::from(index))
            .map_err(|source| VmError::CreateVcpu { index, source })
    }
}
