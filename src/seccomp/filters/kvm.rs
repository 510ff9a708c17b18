//! The numbers of the KVM ioctls teravm makes (as in `linux/kvm.h`), for
//! the filters' argument conditions (`named!(kvm::RUN)` shows as
//! `KVM_RUN` in docs/seccomp.md).

use kvm_bindings::{
    kvm_clock_data, kvm_cpuid2, kvm_create_guest_memfd, kvm_debugregs, kvm_fpu, kvm_ioeventfd,
    kvm_irqchip, kvm_irqfd, kvm_lapic_state, kvm_mp_state, kvm_msr_list, kvm_msrs, kvm_pit_config,
    kvm_pit_state2, kvm_regs, kvm_sregs, kvm_userspace_memory_region, kvm_userspace_memory_region2,
    kvm_vcpu_events, kvm_xcrs, kvm_xsave,
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

// Snapshots: the vCPUs' state, read on their threads and written before
// they start, and the VM's irqchip, PIT and clock.

/// `KVM_GET_MSR_INDEX_LIST` (on `/dev/kvm`: the MSRs a snapshot saves).
pub const GET_MSR_INDEX_LIST: u64 = kvm_ioc(IOC_READ | IOC_WRITE, 0x02, size_of::<kvm_msr_list>());
/// `KVM_GET_MSRS`.
pub const GET_MSRS: u64 = kvm_ioc(IOC_READ | IOC_WRITE, 0x88, size_of::<kvm_msrs>());
/// `KVM_GET_FPU` (hosts without XSAVE).
pub const GET_FPU: u64 = kvm_ioc(IOC_READ, 0x8c, size_of::<kvm_fpu>());
/// `KVM_GET_CPUID2`.
pub const GET_CPUID2: u64 = kvm_ioc(IOC_READ | IOC_WRITE, 0x91, size_of::<kvm_cpuid2>());
/// `KVM_GET_MP_STATE`.
pub const GET_MP_STATE: u64 = kvm_ioc(IOC_READ, 0x98, size_of::<kvm_mp_state>());
/// `KVM_SET_MP_STATE`.
pub const SET_MP_STATE: u64 = kvm_ioc(IOC_WRITE, 0x99, size_of::<kvm_mp_state>());
/// `KVM_GET_VCPU_EVENTS`.
pub const GET_VCPU_EVENTS: u64 = kvm_ioc(IOC_READ, 0x9f, size_of::<kvm_vcpu_events>());
/// `KVM_SET_VCPU_EVENTS`.
pub const SET_VCPU_EVENTS: u64 = kvm_ioc(IOC_WRITE, 0xa0, size_of::<kvm_vcpu_events>());
/// `KVM_GET_DEBUGREGS`.
pub const GET_DEBUGREGS: u64 = kvm_ioc(IOC_READ, 0xa1, size_of::<kvm_debugregs>());
/// `KVM_SET_DEBUGREGS`.
pub const SET_DEBUGREGS: u64 = kvm_ioc(IOC_WRITE, 0xa2, size_of::<kvm_debugregs>());
/// `KVM_GET_XSAVE`.
pub const GET_XSAVE: u64 = kvm_ioc(IOC_READ, 0xa4, size_of::<kvm_xsave>());
/// `KVM_SET_XSAVE`.
pub const SET_XSAVE: u64 = kvm_ioc(IOC_WRITE, 0xa5, size_of::<kvm_xsave>());
/// `KVM_GET_XCRS`.
pub const GET_XCRS: u64 = kvm_ioc(IOC_READ, 0xa6, size_of::<kvm_xcrs>());
/// `KVM_SET_XCRS`.
pub const SET_XCRS: u64 = kvm_ioc(IOC_WRITE, 0xa7, size_of::<kvm_xcrs>());
/// `KVM_SET_TSC_KHZ`.
pub const SET_TSC_KHZ: u64 = kvm_ioc(IOC_NONE, 0xa2, 0);
/// `KVM_GET_TSC_KHZ`.
pub const GET_TSC_KHZ: u64 = kvm_ioc(IOC_NONE, 0xa3, 0);
/// `KVM_KVMCLOCK_CTRL` (after a restore: the guest was paused).
pub const KVMCLOCK_CTRL: u64 = kvm_ioc(IOC_NONE, 0xad, 0);
/// `KVM_GET_IRQCHIP`.
pub const GET_IRQCHIP: u64 = kvm_ioc(IOC_READ | IOC_WRITE, 0x62, size_of::<kvm_irqchip>());
/// `KVM_SET_IRQCHIP` (`_IOR` in `linux/kvm.h`, as it is).
pub const SET_IRQCHIP: u64 = kvm_ioc(IOC_READ, 0x63, size_of::<kvm_irqchip>());
/// `KVM_SET_CLOCK`.
pub const SET_CLOCK: u64 = kvm_ioc(IOC_WRITE, 0x7b, size_of::<kvm_clock_data>());
/// `KVM_GET_CLOCK`.
pub const GET_CLOCK: u64 = kvm_ioc(IOC_READ, 0x7c, size_of::<kvm_clock_data>());
/// `KVM_GET_PIT2`.
pub const GET_PIT2: u64 = kvm_ioc(IOC_READ, 0x9f, size_of::<kvm_pit_state2>());
/// `KVM_SET_PIT2`.
pub const SET_PIT2: u64 = kvm_ioc(IOC_WRITE, 0xa0, size_of::<kvm_pit_state2>());

/// `_IOC(dir, 0xAE, nr, size)`: a KVM ioctl request number.
const fn kvm_ioc(dir: u64, nr: u64, size: usize) -> u64 {
    (dir << 30) | ((size as u64) << 16) | (0xAE << 8) | nr
}
const IOC_NONE: u64 = 0;
const IOC_WRITE: u64 = 1;
const IOC_READ: u64 = 2;
