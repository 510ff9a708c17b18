//! The firmware on real KVM with a plain vm-memory guest: the boot state,
//! vCPU loop, bus and devices together, without the VMM.

use std::sync::mpsc::channel;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};
use vmm_sys_util::eventfd::EventFd;

use super::boot::{write_boot_state, STACKS_ADDR, STACK_BYTES};
use super::vcpu::{
    configure_vcpu, GuestEntry, VcpuControl, VcpuEvent, VcpuHandle, VcpuStopReport, Vcpus,
};
use super::vm::{MemorySlot, Vm};
use crate::devices::{microvm_bus, SerialConsole, I8042};

struct Run {
    serial: String,
    /// The vCPUs' states `End::SaveAfter` saved.
    saved: Vec<crate::vstate::snapshot::VcpuState>,
    event: Option<VcpuEvent>,
    /// Pages KVM logged as written (memslot 0), where the log was on.
    dirty_pages: Option<u32>,
}

/// How a test run ends its vCPUs.
#[derive(PartialEq)]
enum End {
    /// `Vcpus::stop`, checking that none panicked or got stuck.
    Stop,
    /// Dropping the group while the guest still runs, once its serial shows
    /// the line given: its `Drop` must stop and join every vCPU thread
    /// (each holds a clone of the bus).
    DropAfter(&'static str),
    /// Once the serial shows the line given: pause, save every vCPU's
    /// state on its thread, resume, then stop as `Stop` does.
    SaveAfter(&'static str),
}

fn boot(vcpus: u8, mib: u64, cmdline: &str, wait: Duration) -> Option<Run> {
    boot_and_end(vcpus, mib, cmdline, wait, End::Stop)
}

fn boot_and_end(vcpus: u8, mib: u64, cmdline: &str, wait: Duration, end: End) -> Option<Run> {
    boot_logged(vcpus, mib, cmdline, wait, end, false)
}

fn boot_logged(
    vcpus: u8,
    mib: u64,
    cmdline: &str,
    wait: Duration,
    end: End,
    dirty_log: bool,
) -> Option<Run> {
    if let Err(e) = Vm::available() {
        // In CI (`CI=true`) /dev/kvm is there: a test that cannot run fails
        // instead of passing as skipped.
        if std::env::var("CI").is_ok_and(|v| v.eq_ignore_ascii_case("true")) {
            panic!("a KVM test cannot run in CI (CI=true): {e}");
        }
        eprintln!("SKIPPED: {e}");
        return None;
    }
    let vm = Vm::new().unwrap();
    let mem =
        GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), (mib << 20) as usize)]).unwrap();
    let slots: Vec<MemorySlot> = mem
        .iter()
        .map(|r| MemorySlot {
            guest_addr: r.start_addr().0,
            size: r.len(),
            host_addr: r
                .get_host_address(vm_memory::MemoryRegionAddress(0))
                .unwrap() as u64,
            guest_memfd: None,
            dirty_log,
        })
        .collect();
    // SAFETY: `mem` outlives the VM (dropped after it, at the end of this function).
    unsafe { vm.register_memory(&slots) }.unwrap();
    let layout =
        write_boot_state(&mem, &[(0, mib << 20)], usize::from(vcpus), mib, cmdline).unwrap();
    let serial = Arc::new(Mutex::new(SerialConsole::new(Vec::new())));
    let i8042 = Arc::new(Mutex::new(I8042::new()));
    let bus = Arc::new(crate::devices::Buses {
        pio: microvm_bus(serial.clone(), i8042, Instant::now()).unwrap(),
        mmio: crate::devices::MmioBus::default(),
    });
    let control = Arc::new(VcpuControl::new());
    let (tx, rx) = channel();
    let evt = EventFd::new(libc::EFD_NONBLOCK).unwrap();
    let cpuid = crate::vstate::template::CpuSetup::new(
        vm.supported_cpuid().unwrap(),
        false,
        crate::config::CpuTemplate::None,
        None,
    )
    .unwrap();
    let mut handles = Vcpus::new(control.clone());
    for i in 0..vcpus {
        let fd = vm.create_vcpu(i).unwrap();
        configure_vcpu(&fd, i, &cpuid, &GuestEntry::Firmware(layout)).unwrap();
        handles.push(
            VcpuHandle::spawn(
                i,
                fd,
                bus.clone(),
                control.clone(),
                tx.clone(),
                evt.try_clone().unwrap(),
                crate::memory::GuestLease::unbound(),
            )
            .unwrap(),
        );
    }
    let mut saved = Vec::new();
    let event = match end {
        End::SaveAfter(line) => {
            wait_for_line(&serial, line);
            let msrs = vm.msr_index_list().unwrap();
            assert!(
                matches!(
                    handles.save_states(&msrs, Duration::from_secs(10)),
                    Err(crate::vstate::snapshot::StateError::NotPaused)
                ),
                "a save while running"
            );
            // vCPU 0 parks once idle (the only vCPU out of the guest
            // before the pause), so it must answer from the park.
            assert!(
                control
                    .pause_gate()
                    .wait_out(1, Instant::now() + Duration::from_secs(10)),
                "vCPU 0 never parked"
            );
            assert!(handles.pause(Duration::from_secs(10)));
            saved = handles.save_states(&msrs, Duration::from_secs(10)).unwrap();
            // A second request is answered too (a new generation).
            let again = handles.save_states(&msrs, Duration::from_secs(10)).unwrap();
            assert_eq!(again.len(), saved.len());
            handles.resume();
            let event = rx.recv_timeout(wait).ok();
            assert_eq!(
                handles.stop(Duration::from_secs(10)),
                VcpuStopReport::default()
            );
            event
        }
        End::Stop => {
            let event = rx.recv_timeout(wait).ok();
            assert_eq!(
                handles.stop(Duration::from_secs(10)),
                VcpuStopReport::default()
            );
            event
        }
        End::DropAfter(line) => {
            wait_for_line(&serial, line);
            let weak = Arc::downgrade(&bus);
            // Whatever the vCPUs reported before the drop.
            let event = rx.try_recv().ok();
            drop(bus);
            drop(handles);
            assert!(
                weak.upgrade().is_none(),
                "a vCPU thread outlived its dropped group"
            );
            event
        }
    };
    let serial = String::from_utf8(serial.lock().unwrap().writer().clone()).unwrap();
    let dirty_pages = match vm.dirty_log(0, mib << 20) {
        Ok(bits) => Some(bits.iter().map(|w| w.count_ones()).sum()),
        Err(e) => {
            assert!(!dirty_log, "the log was on: {e}");
            None
        }
    };
    drop(vm);
    Some(Run {
        serial,
        saved,
        event,
        dirty_pages,
    })
}

/// Waits for the guest to get where the test means it to be: `line` on
/// its serial (polled: the serial has no notification to wait on).
fn wait_for_line(serial: &Mutex<SerialConsole<Vec<u8>>>, line: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !String::from_utf8_lossy(serial.lock().unwrap().writer()).contains(line) {
        assert!(
            Instant::now() < deadline,
            "no {line:?} on the serial within 30 s"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn firmware_touches_and_resets() {
    let Some(run) = boot(2, 64, "touch=16 then=reset", Duration::from_secs(30)) else {
        return;
    };
    let lines: Vec<&str> = run.serial.lines().collect();
    assert_eq!(
        lines[0], "teravm firmware: vcpus=2 mem_mib=64",
        "{}",
        run.serial
    );
    assert!(
        lines[1].starts_with("teravm firmware: touched 16 MiB in "),
        "{}",
        run.serial
    );
    assert_eq!(lines[2], "teravm firmware: reset");
    assert!(
        matches!(run.event, Some(VcpuEvent::Reset { index: 0 })),
        "{:?}",
        run.event
    );
}

#[test]
fn track_dirty_pages_reaches_kvm() {
    // With KVM_MEM_LOG_DIRTY_PAGES the firmware's 16 MiB of writes are in
    // the slot's log; without it KVM has no log to give (ENOENT).
    let Some(run) = boot_logged(
        1,
        64,
        "touch=16 then=reset",
        Duration::from_secs(30),
        End::Stop,
        true,
    ) else {
        return;
    };
    assert!(run.serial.contains("touched 16 MiB"), "{}", run.serial);
    let pages = run.dirty_pages.expect("a dirty log");
    assert!(
        (4096..=64 * 256).contains(&pages),
        "{pages} pages logged for 16 MiB of writes"
    );
    let Some(run) = boot(1, 64, "touch=16 then=reset", Duration::from_secs(30)) else {
        return;
    };
    assert_eq!(run.dirty_pages, None, "no log without the flag");
}

#[test]
fn firmware_idles_until_stopped() {
    // No event comes: the wait is how long the firmware has to touch its
    // 28 MiB and say idle, with room for a loaded CI host (500 ms was not).
    let Some(run) = boot(1, 32, "touch=all then=idle", Duration::from_secs(3)) else {
        return;
    };
    assert_eq!(run.event, None);
    // 32 MiB minus the firmware's own 4 MiB.
    assert!(run.serial.contains("touched 28 MiB"), "{}", run.serial);
    assert!(
        run.serial.ends_with("teravm firmware: idle\n"),
        "{}",
        run.serial
    );
}

#[test]
fn dropping_the_vcpu_group_stops_vcpus_that_still_run() {
    // vCPU 1 keeps rewriting guest memory; vCPU 0 parks once it has
    // printed `idle`. The group is dropped only then, with one vCPU parked
    // and one running.
    let Some(run) = boot_and_end(
        2,
        64,
        "touch=16 then=idle keep=writing",
        Duration::ZERO,
        End::DropAfter("teravm firmware: idle\n"),
    ) else {
        return;
    };
    assert_eq!(run.event, None);
    assert!(run.serial.contains("touched 16 MiB"), "{}", run.serial);
}

#[test]
fn triple_fault_is_a_crash() {
    let Some(run) = boot(1, 32, "fault=triple", Duration::from_secs(30)) else {
        return;
    };
    assert!(
        matches!(run.event, Some(VcpuEvent::Crashed { .. })),
        "{:?}",
        run.event
    );
}

#[test]
fn bad_command_line_is_reported() {
    let Some(run) = boot(1, 32, "touch=12x", Duration::from_secs(30)) else {
        return;
    };
    assert!(run.serial.contains("bad command line"), "{}", run.serial);
    assert_eq!(
        run.event,
        Some(VcpuEvent::FirmwareError { index: 0, code: 1 })
    );
}

#[test]
fn paused_vcpus_save_their_state_on_their_threads() {
    // vCPU 0 parks once it has printed `idle` and answers from the park;
    // vCPU 1 keeps writing until the pause holds it, and answers from
    // the hold.
    let Some(run) = boot_and_end(
        2,
        64,
        "touch=16 then=idle keep=writing",
        Duration::from_millis(100),
        End::SaveAfter("teravm firmware: idle\n"),
    ) else {
        return;
    };
    assert_eq!(run.event, None);
    assert_eq!(run.saved.len(), 2);
    for (i, state) in run.saved.iter().enumerate() {
        assert!(!state.cpuid.is_empty(), "vCPU {i}");
        assert!(!state.msrs.is_empty(), "vCPU {i}");
        assert_eq!(state.lapic, None, "the firmware runs without an irqchip");
        // The firmware runs in long mode (EFER.LMA).
        assert_ne!(state.sregs.efer & (1 << 10), 0, "vCPU {i}");
    }
    // Each vCPU saved its own state: its stack pointer is in its own stack.
    for (i, state) in (0u64..).zip(&run.saved) {
        let stack = STACKS_ADDR + i * STACK_BYTES..=STACKS_ADDR + (i + 1) * STACK_BYTES;
        assert!(
            stack.contains(&state.regs.rsp),
            "vCPU {i}: rsp {:#x}",
            state.regs.rsp
        );
    }
}
