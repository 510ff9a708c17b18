//! What a vCPU exit means: [`handle_exit`] turns one `VcpuExit` into what
//! the loop does next ([`ExitAction`]), a plain function over the exit and
//! the buses, so it is tested with made-up exits; a [`VcpuEvent`] is why a
//! vCPU ends the VM, with KVM's details added to an internal error.

use std::time::Duration;

use kvm_ioctls::{VcpuExit, VcpuFd};

use crate::devices::{BusEvent, Buses};

/// Why a vCPU ended the VM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VcpuEvent {
    /// The guest asked for a reset: shut the VM down normally.
    Reset {
        /// vCPU index.
        index: u8,
    },
    /// The guest crashed (triple fault, failed entry, KVM internal error).
    Crashed {
        /// vCPU index.
        index: u8,
        /// What happened.
        reason: String,
    },
    /// The firmware reported an error.
    FirmwareError {
        /// vCPU index.
        index: u8,
        /// Its code.
        code: u32,
    },
    /// `KVM_RUN` failed.
    RunFailed {
        /// vCPU index.
        index: u8,
        /// The error.
        error: String,
    },
}

/// What the vCPU loop does after an exit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExitAction {
    /// Enter the guest again.
    Continue,
    /// Block until woken or stopped, then enter again.
    Park,
    /// Sleep until the device in MMIO slot `slot` interrupts, `timeout`
    /// passes, or the vCPU is stopped, paused or woken; then enter again
    /// (the firmware's wait port, [`crate::devices::firmware_ports`]).
    WaitDevice {
        /// The device's slot on the MMIO bus.
        slot: u16,
        /// How long at most.
        timeout: Duration,
    },
    /// End this vCPU and tell the VMM.
    Stop(VcpuEvent),
}

/// Handles one exit of vCPU `index`.
pub fn handle_exit(index: u8, exit: VcpuExit<'_>, bus: &Buses) -> ExitAction {
    let crashed = |reason: String| ExitAction::Stop(VcpuEvent::Crashed { index, reason });
    match exit {
        VcpuExit::IoOut(port, data) => match bus.pio.write(port, data) {
            None => ExitAction::Continue,
            Some(BusEvent::Park) => ExitAction::Park,
            Some(BusEvent::WaitDevice { slot, timeout_ms }) => ExitAction::WaitDevice {
                slot,
                timeout: Duration::from_millis(u64::from(timeout_ms)),
            },
            Some(BusEvent::Reset) => ExitAction::Stop(VcpuEvent::Reset { index }),
            Some(BusEvent::FirmwareError(code)) => {
                ExitAction::Stop(VcpuEvent::FirmwareError { index, code })
            }
        },
        VcpuExit::IoIn(port, data) => {
            bus.pio.read(port, data);
            ExitAction::Continue
        }
        VcpuExit::MmioRead(addr, data) => {
            bus.mmio.read(addr, data);
            ExitAction::Continue
        }
        VcpuExit::MmioWrite(addr, data) => {
            bus.mmio.write(addr, data);
            ExitAction::Continue
        }
        VcpuExit::Hlt => ExitAction::Park,
        VcpuExit::Shutdown => crashed("the guest triple-faulted (KVM_EXIT_SHUTDOWN)".to_string()),
        VcpuExit::FailEntry(reason, cpu) => crashed(format!(
            "KVM_RUN failed to enter the guest (hardware reason {reason:#x}, host cpu {cpu})"
        )),
        VcpuExit::InternalError => {
            crashed("KVM internal error (KVM_EXIT_INTERNAL_ERROR)".to_string())
        }
        VcpuExit::SystemEvent(kind, _) => match kind {
            kvm_bindings::KVM_SYSTEM_EVENT_RESET | kvm_bindings::KVM_SYSTEM_EVENT_SHUTDOWN => {
                ExitAction::Stop(VcpuEvent::Reset { index })
            }
            other => crashed(format!("guest system event {other}")),
        },
        other => crashed(format!("unexpected vCPU exit {other:?}")),
    }
}

/// Adds KVM's sub-error, the failing instruction's bytes (emulation
/// failures) and the guest RIP to the reason of an internal-error crash.
pub(super) fn with_internal_details(fd: &mut VcpuFd, event: VcpuEvent) -> VcpuEvent {
    let VcpuEvent::Crashed { index, reason } = event else {
        return event;
    };
    let run = fd.get_kvm_run();
    if run.exit_reason != kvm_bindings::KVM_EXIT_INTERNAL_ERROR {
        return VcpuEvent::Crashed { index, reason };
    }
    // SAFETY: `exit_reason` is KVM_EXIT_INTERNAL_ERROR, so KVM filled the
    // union's `internal` member (`emulation_failure` shares its layout
    // prefix and is what KVM fills for suberror 1); both are plain integers.
    let (internal, emulation) = unsafe {
        (
            run.__bindgen_anon_1.internal,
            run.__bindgen_anon_1.emulation_failure,
        )
    };
    let what = match internal.suberror {
        kvm_bindings::KVM_INTERNAL_ERROR_EMULATION => "emulation failure",
        kvm_bindings::KVM_INTERNAL_ERROR_SIMUL_EX => "exception while delivering one",
        kvm_bindings::KVM_INTERNAL_ERROR_DELIVERY_EV => "exit while delivering an event",
        _ => "other",
    };
    let mut details = format!("suberror {} ({what})", internal.suberror);
    if internal.suberror == kvm_bindings::KVM_INTERNAL_ERROR_EMULATION
        && emulation.flags
            & u64::from(kvm_bindings::KVM_INTERNAL_ERROR_EMULATION_FLAG_INSTRUCTION_BYTES)
            != 0
    {
        // SAFETY: the flag says KVM filled the instruction bytes.
        let insn = unsafe { emulation.__bindgen_anon_1.__bindgen_anon_1 };
        let n = usize::from(insn.insn_size).min(insn.insn_bytes.len());
        let bytes: Vec<String> = insn.insn_bytes[..n]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        details += &format!(", instruction bytes [{}]", bytes.join(" "));
    } else {
        let n = (internal.ndata as usize).min(internal.data.len());
        let data: Vec<String> = internal.data[..n]
            .iter()
            .map(|d| format!("{d:#x}"))
            .collect();
        details += &format!(", data [{}]", data.join(" "));
    }
    if let Ok(regs) = fd.get_regs() {
        details += &format!(", guest rip {:#x}", regs.rip);
    }
    VcpuEvent::Crashed {
        index,
        reason: format!("{reason}: {details}"),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};
    use std::time::Instant;

    use super::*;
    use crate::devices::{microvm_bus, SerialConsole, I8042};

    fn bus() -> Buses {
        let serial = SerialConsole::new(Vec::new());
        let i8042 = Arc::new(Mutex::new(I8042::new()));
        Buses {
            pio: microvm_bus(Arc::new(Mutex::new(serial)), i8042, Instant::now()).unwrap(),
            mmio: crate::devices::MmioBus::default(),
        }
    }

    #[test]
    fn port_exits() {
        let bus = bus();
        assert_eq!(
            handle_exit(0, VcpuExit::IoOut(0x80, &[1]), &bus),
            ExitAction::Continue
        );
        assert_eq!(
            handle_exit(1, VcpuExit::IoOut(0x64, &[0xfe]), &bus),
            ExitAction::Stop(VcpuEvent::Reset { index: 1 })
        );
        assert_eq!(
            handle_exit(0, VcpuExit::IoOut(0xf04, &[0]), &bus),
            ExitAction::Park
        );
        assert_eq!(
            handle_exit(0, VcpuExit::IoOut(0xf08, &[1, 0, 0, 0]), &bus),
            ExitAction::Stop(VcpuEvent::FirmwareError { index: 0, code: 1 })
        );
        // An unclaimed port reads all ones; COM1's empty receiver reads 0.
        let mut data = [0u8; 1];
        assert_eq!(
            handle_exit(0, VcpuExit::IoIn(0x2f8, &mut data), &bus),
            ExitAction::Continue
        );
        assert_eq!(data, [0xff]);
        assert_eq!(
            handle_exit(0, VcpuExit::IoIn(0x3f8, &mut data), &bus),
            ExitAction::Continue
        );
        assert_eq!(data, [0]);
    }

    #[test]
    fn crash_exits() {
        let bus = bus();
        for exit in [
            VcpuExit::Shutdown,
            VcpuExit::InternalError,
            VcpuExit::FailEntry(0x21, 1),
            VcpuExit::Unknown,
        ] {
            match handle_exit(2, exit, &bus) {
                ExitAction::Stop(VcpuEvent::Crashed { index: 2, reason }) => {
                    assert!(!reason.is_empty())
                }
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(handle_exit(0, VcpuExit::Hlt, &bus), ExitAction::Park);
        let mut data = [0u8; 4];
        assert_eq!(
            handle_exit(0, VcpuExit::MmioRead(0xfee0_0000, &mut data), &bus),
            ExitAction::Continue
        );
        assert_eq!(data, [0xff; 4]);
    }
}
