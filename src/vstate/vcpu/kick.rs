//! The kick: a real-time signal whose handler sets `immediate_exit` in the
//! thread's own `kvm_run`, so a vCPU leaves `KVM_RUN` at once, even when the
//! signal lands just before it enters.

use std::cell::Cell;
use std::sync::Once;

use kvm_bindings::kvm_run;
use kvm_ioctls::VcpuFd;
use vmm_sys_util::signal::{register_signal_handler, SIGRTMIN};

use super::VcpuError;

/// Offset from `SIGRTMIN` of the signal that kicks a vCPU out of `KVM_RUN`.
const KICK_SIGNAL_OFFSET: i32 = 0;

/// The signal that kicks a vCPU out of `KVM_RUN`.
pub(super) fn kick_signal() -> i32 {
    SIGRTMIN() + KICK_SIGNAL_OFFSET
}

thread_local! {
    /// This thread's `kvm_run`, for the kick signal handler.
    static KVM_RUN: Cell<*mut kvm_run> = const { Cell::new(std::ptr::null_mut()) };
}

extern "C" fn kick_handler(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
    KVM_RUN.with(|run| {
        let run = run.get();
        if !run.is_null() {
            // SAFETY: the pointer is this thread's own `kvm_run` mapping, set
            // while the thread owns its `VcpuFd` and cleared before it drops
            // it; a volatile byte store is async-signal-safe.
            unsafe { std::ptr::write_volatile(&mut (*run).immediate_exit, 1) };
        }
    });
}

pub(super) fn install_kick_handler() -> Result<(), VcpuError> {
    static ONCE: Once = Once::new();
    static mut RESULT: Option<vmm_sys_util::errno::Error> = None;
    ONCE.call_once(|| {
        if let Err(e) = register_signal_handler(kick_signal(), kick_handler) {
            // SAFETY: written once, inside `call_once`, before any reader
            // (readers run after `call_once` returns).
            unsafe { RESULT = Some(e) };
        }
    });
    // SAFETY: only read after `call_once` has finished writing it.
    match unsafe { *std::ptr::addr_of!(RESULT) } {
        Some(e) => Err(VcpuError::Signal(e)),
        None => Ok(()),
    }
}

/// Clears this thread's `kvm_run` pointer when dropped, on return or on
/// unwind, before the `VcpuFd` (and its `kvm_run` mapping) goes.
pub(super) struct KvmRunGuard;

impl Drop for KvmRunGuard {
    fn drop(&mut self) {
        KVM_RUN.with(|run| run.set(std::ptr::null_mut()));
    }
}

impl KvmRunGuard {
    /// Points the kick handler at `fd`'s `kvm_run` for this thread, until
    /// the guard is dropped.
    pub(super) fn arm(fd: &mut VcpuFd) -> KvmRunGuard {
        KVM_RUN.with(|run| run.set(fd.get_kvm_run()));
        KvmRunGuard
    }
}
