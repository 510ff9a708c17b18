//! The numbers of the KVM ioctls teravm makes (as in `linux/kvm.h`), for
//! the filters' argument conditions (`named!(kvm::RUN)` shows as
//! `KVM_RUN` in docs/seccomp.md).

use kvm_bindings::{
    kvm_cpuid2, kvm_create_guest_memfd, kvm_fpu, kvm_ioeventfd, kvm_irqfd, kvm_lapic_state,
    kvm_msrs, kvm_pit_config, kvm_regs, kvm_sregs, kvm_userspace_memory_region,
    kvm_userspace_memory_region2,
};
use std::mem::size_of;

/// `KVM_CREATE_VM` (on `/dev/kvm`).
pub const CREATE_VM: u64 = kvm_ioc(IOC_NONE, 0x01, 0);
/// `KVM_CHECK_EXTENSION` (memslot count).
pub const CHECK_EXTENSION: u64 = kvm_ioc(IOC_NONE, 0x03, 0);
/// `KVM_GET_VCPU_MMAP_SIZE` (the `kvm_run` mapping).
pub const GET_VCPU_MMAP_SIZE: u64 = kvm_ioc(IOC_NONE, 0x04, 0);
/// `KVM_GET_SUPPORTED_CPUID`.
pub const GET_SUPPORTED_CPUID: u64 = kvm_ioc(IOC_READ | IOC_WRITE, 0x05, size_of::<kvm_cpuid2>());
/// `KVM_CREATE_VCPU`.
pub const CREATE_VCPU: u64 = kvm_ioc(IOC_NONE, 0x41, 0);
/// `KVM_SET_USER_MEMORY_REGION`.
pub const SET_USER_MEMORY_REGION: u64 =
    kvm_ioc(IOC_WRITE, 0x46, size_of::<kvm_userspace_memory_region>());
/// `KVM_SET_USER_MEMORY_REGION2` (guest_memfd memslots).
pub const SET_USER_MEMORY_REGION2: u64 =
    kvm_ioc(IOC_WRITE, 0x49, size_of::<kvm_userspace_memory_region2>());
/// `KVM_CREATE_GUEST_MEMFD`.
pub const CREATE_GUEST_MEMFD: u64 = kvm_ioc(
    IOC_READ | IOC_WRITE,
    0xd4,
    size_of::<kvm_create_guest_memfd>(),
);
/// `KVM_RUN`.
pub const RUN: u64 = kvm_ioc(IOC_NONE, 0x80, 0);
/// `KVM_SET_REGS`.
pub const SET_REGS: u64 = kvm_ioc(IOC_WRITE, 0x82, size_of::<kvm_regs>());
/// `KVM_GET_SREGS`.
pub const GET_SREGS: u64 = kvm_ioc(IOC_READ, 0x83, size_of::<kvm_sregs>());
/// `KVM_GET_REGS` (the guest RIP in a crash line).
pub const GET_REGS: u64 = kvm_ioc(IOC_READ, 0x81, size_of::<kvm_regs>());
/// `KVM_SET_SREGS`.
pub const SET_SREGS: u64 = kvm_ioc(IOC_WRITE, 0x84, size_of::<kvm_sregs>());
/// `KVM_SET_FPU`.
pub const SET_FPU: u64 = kvm_ioc(IOC_WRITE, 0x8d, size_of::<kvm_fpu>());
/// `KVM_SET_CPUID2`.
pub const SET_CPUID2: u64 = kvm_ioc(IOC_WRITE, 0x90, size_of::<kvm_cpuid2>());
/// `KVM_SET_TSS_ADDR` (Linux guests).
pub const SET_TSS_ADDR: u64 = kvm_ioc(IOC_NONE, 0x47, 0);
/// `KVM_CREATE_IRQCHIP` (Linux guests).
pub const CREATE_IRQCHIP: u64 = kvm_ioc(IOC_NONE, 0x60, 0);
/// `KVM_IRQFD` (`Vm::register_irqfd`, for Linux guests' interrupts).
pub const IRQFD: u64 = kvm_ioc(IOC_WRITE, 0x76, size_of::<kvm_irqfd>());
/// `KVM_IOEVENTFD` (virtio queue notifications without an exit).
pub const IOEVENTFD: u64 = kvm_ioc(IOC_WRITE, 0x79, size_of::<kvm_ioeventfd>());
/// `KVM_CREATE_PIT2` (Linux guests).
pub const CREATE_PIT2: u64 = kvm_ioc(IOC_WRITE, 0x77, size_of::<kvm_pit_config>());
/// `KVM_REINJECT_CONTROL` (the `pit` thread: PIT reinjection off).
pub const REINJECT_CONTROL: u64 = kvm_ioc(IOC_NONE, 0x71, 0);
/// `KVM_SET_MSRS` (Linux guests' boot MSRs).
pub const SET_MSRS: u64 = kvm_ioc(IOC_WRITE, 0x89, size_of::<kvm_msrs>());
/// `KVM_GET_LAPIC` (Linux guests).
pub const GET_LAPIC: u64 = kvm_ioc(IOC_READ, 0x8e, size_of::<kvm_lapic_state>());
/// `KVM_SET_LAPIC` (Linux guests).
pub const SET_LAPIC: u64 = kvm_ioc(IOC_WRITE, 0x8f, size_of::<kvm_lapic_state>());

/// `_IOC(dir, 0xAE, nr, size)`: a KVM ioctl request number.
const fn kvm_ioc(dir: u64, nr: u64, size: usize) -> u64 {
    (dir << 30) | ((size as u64) << 16) | (0xAE << 8) | nr
}
const IOC_NONE: u64 = 0;
const IOC_WRITE: u64 = 1;
const IOC_READ: u64 = 2;
