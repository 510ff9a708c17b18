//! A vCPU and a VM with the in-kernel irqchip on real KVM: a few guest
//! instructions set registers and an MSR, the state is saved, restored into
//! a fresh VM and vCPU, and must read back the same and run on from there.

use std::time::Duration;

use kvm_ioctls::{VcpuExit, VcpuFd};
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};

use super::*;
use crate::vstate::vcpu::{restore_vcpu, VcpuControl, Vcpus};
use crate::vstate::vm::{MemorySlot, Vm};

/// Where the guest code is, in real mode with CS base 0.
const CODE: u64 = 0x1000;
/// The MSR the guest writes, and its value.
const SYSENTER_CS: u32 = 0x174;

/// mov ecx, 0x174; mov eax, 0x1234; xor edx, edx; wrmsr;
/// mov esi, 0x12345678; mov ebx, 0xdeadbeef; out 0x10, al;
/// mov edi, 0x0badf00d; out 0x11, al; hlt.
const GUEST: &[u8] = &[
    0x66, 0xb9, 0x74, 0x01, 0x00, 0x00, // mov ecx, 0x174
    0x66, 0xb8, 0x34, 0x12, 0x00, 0x00, // mov eax, 0x1234
    0x66, 0x31, 0xd2, // xor edx, edx
    0x0f, 0x30, // wrmsr
    0x66, 0xbe, 0x78, 0x56, 0x34, 0x12, // mov esi, 0x12345678
    0x66, 0xbb, 0xef, 0xbe, 0xad, 0xde, // mov ebx, 0xdeadbeef
    0xe6, 0x10, // out 0x10, al
    0x66, 0xbf, 0x0d, 0xf0, 0xad, 0x0b, // mov edi, 0x0badf00d
    0xe6, 0x11, // out 0x11, al
    0xf4, // hlt
];

fn kvm_or_skip() -> bool {
    if let Err(e) = Vm::available() {
        if std::env::var("CI").is_ok_and(|v| v.eq_ignore_ascii_case("true")) {
            panic!("a KVM test cannot run in CI (CI=true): {e}");
        }
        eprintln!("SKIPPED: {e}");
        return false;
    }
    true
}

/// A VM with the irqchip and 1 MiB of memory holding [`GUEST`], and its
/// vCPU 0 (CPUID set, nothing else).
fn vm_with_code() -> (Vm, GuestMemoryMmap<()>, VcpuFd) {
    let mut vm = Vm::new().unwrap();
    vm.setup_irqchip().unwrap();
    let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
    mem.write_slice(GUEST, GuestAddress(CODE)).unwrap();
    let slots: Vec<MemorySlot> = mem
        .iter()
        .map(|r| MemorySlot {
            guest_addr: r.start_addr().0,
            size: r.len(),
            host_addr: r
                .get_host_address(vm_memory::MemoryRegionAddress(0))
                .unwrap() as u64,
            guest_memfd: None,
            dirty_log: false,
        })
        .collect();
    // SAFETY: `mem` is handed back with the VM and its mappings are never
    // reused for anything else; unmapped before the VM is dropped (the
    // callers' bindings may drop it first) is sound, as `register_memory`
    // says.
    unsafe { vm.register_memory(&slots) }.unwrap();
    let fd = vm.create_vcpu(0).unwrap();
    fd.set_cpuid2(&vm.supported_cpuid().unwrap()).unwrap();
    (vm, mem, fd)
}

fn expect_out(fd: &mut VcpuFd, port: u16) -> u8 {
    match fd.run().unwrap() {
        VcpuExit::IoOut(p, data) if p == port => data[0],
        other => panic!("expected an OUT to {port:#x}, got {other:?}"),
    }
}

fn msr(state: &VcpuState, index: u32) -> Option<u64> {
    state.msrs.iter().find(|m| m.index == index).map(|m| m.data)
}

#[test]
fn vcpu_and_vm_state_survive_a_restore() {
    if !kvm_or_skip() {
        return;
    }
    let (vm, _mem, mut fd) = vm_with_code();
    let mut sregs = fd.get_sregs().unwrap();
    sregs.cs.base = 0;
    sregs.cs.selector = 0;
    fd.set_sregs(&sregs).unwrap();
    let mut regs = fd.get_regs().unwrap();
    regs.rip = CODE;
    regs.rflags = 2;
    fd.set_regs(&regs).unwrap();
    assert_eq!(expect_out(&mut fd, 0x10), 0x34);
    complete_pending_io(&mut fd, 0).unwrap();

    let msrs = vm.msr_index_list().unwrap();
    assert!(msrs.contains(&SYSENTER_CS), "{msrs:#x?}");
    let saved = VcpuState::save(&fd, 0, &msrs).unwrap();
    let unread: Vec<u32> = msrs
        .iter()
        .copied()
        .filter(|&i| msr(&saved, i).is_none())
        .collect();
    eprintln!(
        "{} of the {} MSRs to save could be read here; not: {unread:#x?}",
        saved.msrs.len(),
        msrs.len()
    );
    let vm_saved = vm.save_state().unwrap();
    assert_eq!(saved.regs.rsi, 0x1234_5678);
    assert_eq!(saved.regs.rbx, 0xdead_beef);
    assert_eq!(saved.regs.rip, CODE + 31, "just past the first OUT");
    assert_eq!(msr(&saved, SYSENTER_CS), Some(0x1234));
    assert!(saved.lapic.is_some(), "the irqchip's LAPIC");
    assert!(vm_saved.irqchip.is_some() && vm_saved.pit.is_some());
    assert!(!saved.cpuid.is_empty());

    // JSON round trips.
    let json = serde_json::to_string(&saved).unwrap();
    let back: VcpuState = serde_json::from_str(&json).unwrap();
    assert_eq!(back, saved);
    let vm_json = serde_json::to_string(&vm_saved).unwrap();
    let vm_back: VmState = serde_json::from_str(&vm_json).unwrap();
    assert_eq!(serde_json::to_string(&vm_back).unwrap(), vm_json);

    // Into a fresh VM and vCPU, from the JSON, in Firecracker's order:
    // the vCPUs, then the VM.
    let (mut vm2, _mem2, mut fd2) = vm_with_code();
    restore_vcpu(&fd2, 0, &back).unwrap();
    vm2.restore_state(&vm_back).unwrap();
    let again = VcpuState::save(&fd2, 0, &msrs).unwrap();
    assert_eq!(again.regs, saved.regs);
    assert_eq!(again.sregs, saved.sregs);
    assert_eq!(again.lapic, saved.lapic);
    assert_eq!(again.fpu, saved.fpu);
    assert_eq!(again.debug_regs, saved.debug_regs);
    assert_eq!(again.mp_state, saved.mp_state);
    assert_eq!(msr(&again, SYSENTER_CS), Some(0x1234));
    let vm_again = vm2.save_state().unwrap();
    let chips = |s: &VmState| serde_json::to_string(&s.irqchip).unwrap();
    assert_eq!(chips(&vm_again), chips(&vm_saved));

    // And it runs on from there: the next instruction, with the registers
    // it had.
    assert_eq!(expect_out(&mut fd2, 0x11), 0x34);
    complete_pending_io(&mut fd2, 0).unwrap();
    let regs = fd2.get_regs().unwrap();
    assert_eq!(regs.rdi, 0x0bad_f00d);
    assert_eq!(regs.rsi, 0x1234_5678);
    assert_eq!(regs.rbx, 0xdead_beef);
    drop(vm);
}

#[test]
fn a_vm_state_with_an_irqchip_needs_one() {
    if !kvm_or_skip() {
        return;
    }
    let (vm, _mem, _fd) = vm_with_code();
    let state = vm.save_state().unwrap();
    let mut bare = Vm::new().unwrap();
    assert!(matches!(
        bare.restore_state(&state),
        Err(StateError::IrqchipMismatch { state: true })
    ));
}

#[test]
fn saving_needs_a_pause() {
    let vcpus = Vcpus::new(std::sync::Arc::new(VcpuControl::new()));
    assert!(matches!(
        vcpus.save_states(&[], Duration::from_secs(1)),
        Err(StateError::NotPaused)
    ));
    assert!(vcpus.pause(Duration::from_secs(1)));
    assert!(vcpus
        .save_states(&[], Duration::from_secs(1))
        .unwrap()
        .is_empty());
}

#[test]
fn msr_filter_is_firecrackers() {
    for kept in [
        0x10,
        0x174,
        0x1a0,
        0x2ff,
        0x6e0,
        0x830,
        0xc000_0080,
        0x4b56_4d01,
    ] {
        assert!(msr_should_serialize(kept), "{kept:#x}");
    }
    for left in [0x17b, 0xc1, 0x186, 0x38f, 0x480, 0x4000_0000] {
        assert!(!msr_should_serialize(left), "{left:#x}");
    }
}
