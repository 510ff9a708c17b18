//! The vCPU side of the firmware's wait port: a device wait ends on the
//! device's interrupt, on a stop, a pause and a wake, and counts as out of
//! the guest for a pause.

use std::sync::Mutex;

use kvm_ioctls::VcpuExit;

use super::*;
use crate::devices::virtio::{IrqTrigger, VirtioInterrupt, VirtioInterruptType};
use crate::devices::{WaitEnd, WakeHub};
use vmm_sys_util::eventfd::EFD_NONBLOCK;

fn control_and_device() -> (Arc<VcpuControl>, Arc<WakeHub>, Arc<IrqTrigger>) {
    let hub = Arc::new(WakeHub::new());
    let irq = Arc::new(IrqTrigger::new(EventFd::new(EFD_NONBLOCK).unwrap()));
    irq.wake_on(&hub, 0);
    let control = Arc::new(VcpuControl::new());
    control.watch_hub(&hub);
    (control, hub, irq)
}

/// Starts a vCPU-like thread waiting on slot 0 for 60 s, and returns once
/// it is out of the guest (asleep in the wait).
fn waiting(
    control: &Arc<VcpuControl>,
    hub: &Arc<WakeHub>,
) -> std::thread::JoinHandle<(WaitEnd, Duration)> {
    let (c, h) = (control.clone(), hub.clone());
    let t = std::thread::spawn(move || {
        let t0 = Instant::now();
        let end = c.wait_device(&h, 0, Duration::from_secs(60));
        (end, t0.elapsed())
    });
    assert!(
        control
            .pause_gate()
            .wait_out(1, Instant::now() + Duration::from_secs(10)),
        "the thread never waited"
    );
    t
}

#[test]
fn the_port_becomes_a_wait_action() {
    let serial = crate::devices::SerialConsole::new(Vec::new());
    let i8042 = Arc::new(Mutex::new(crate::devices::I8042::new()));
    let bus = Buses {
        pio: crate::devices::microvm_bus(Arc::new(Mutex::new(serial)), i8042, Instant::now())
            .unwrap(),
        mmio: crate::devices::MmioBus::default(),
    };
    let word = (500u32 << 16) | 2;
    assert_eq!(
        handle_exit(0, VcpuExit::IoOut(0xf0c, &word.to_le_bytes()), &bus),
        ExitAction::WaitDevice {
            slot: 2,
            timeout: Duration::from_millis(500)
        }
    );
}

#[test]
fn an_interrupt_ends_the_wait() {
    let (control, hub, irq) = control_and_device();
    let t = waiting(&control, &hub);
    irq.trigger(VirtioInterruptType::Queue(0)).unwrap();
    let (end, took) = t.join().unwrap();
    assert_eq!(end, WaitEnd::Interrupt);
    assert!(took < Duration::from_secs(30), "{took:?}");
    // Back in the guest: no longer counted out.
    assert!(!control
        .pause_gate()
        .wait_out(1, Instant::now() + Duration::from_millis(20)));
}

#[test]
fn stop_pause_and_wake_end_the_wait() {
    let (control, hub, _irq) = control_and_device();
    let mut vcpus = Vcpus::new(control.clone());
    // A pause: the waiting vCPU is out of the guest, and the pause ends the
    // wait so the vCPU is held at the gate instead.
    let t = waiting(&control, &hub);
    assert!(vcpus.pause(Duration::from_secs(10)));
    assert_eq!(t.join().unwrap().0, WaitEnd::Kicked);
    vcpus.resume();
    // A wake (Ctrl-Alt-Del queued).
    let t = waiting(&control, &hub);
    control.wake_all();
    assert_eq!(t.join().unwrap().0, WaitEnd::Kicked);
    // A stop.
    let t = waiting(&control, &hub);
    vcpus.stop(Duration::from_secs(10));
    let (end, took) = t.join().unwrap();
    assert_eq!(end, WaitEnd::Kicked);
    assert!(took < Duration::from_secs(30), "{took:?}");
    // After the stop a wait returns at once.
    assert_eq!(
        control.wait_device(&hub, 0, Duration::from_secs(60)),
        WaitEnd::Kicked
    );
}
