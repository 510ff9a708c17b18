//! vCPUs: one thread each (`vcpu0`, `vcpu1`, ...) running a `KVM_RUN` loop.
//!
//! Exits are handled by [`handle_exit`], a plain function over a `VcpuExit`
//! and the port I/O bus, so it is tested with made-up exits. A vCPU that must
//! end the VM (reset, crash, error) sends a [`VcpuEvent`] on an mpsc channel
//! and writes the VMM's `EventFd`. The VMM stops vCPUs with
//! [`VcpuControl::request_stop`] plus a kick: a real-time signal whose
//! handler sets `immediate_exit` in the thread's own `kvm_run`, so a signal
//! that lands just before `KVM_RUN` still makes it return at once.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Condvar, Mutex, Once};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use kvm_bindings::{kvm_fpu, kvm_run};
use kvm_ioctls::{VcpuExit, VcpuFd};
use vmm_sys_util::eventfd::EventFd;
use vmm_sys_util::signal::{register_signal_handler, Killable, SIGRTMIN};

use super::boot::{initial_regs, setup_sregs, BootLayout};
use super::linux::LinuxEntry;
use super::template::CpuSetup;
use crate::devices::{BusEvent, Buses, WaitEnd, WakeHub};
use crate::memory::GuestLease;

/// Offset from `SIGRTMIN` of the signal that kicks a vCPU out of `KVM_RUN`.
const KICK_SIGNAL_OFFSET: i32 = 0;

/// Errors of vCPU setup.
#[derive(Debug, thiserror::Error)]
pub enum VcpuError {
    /// A register ioctl failed.
    #[error("vCPU {index}: {what} failed: {source}")]
    Setup {
        /// vCPU index.
        index: u8,
        /// Which ioctl.
        what: &'static str,
        /// KVM's error.
        source: kvm_ioctls::Error,
    },
    /// The kick signal handler could not be installed.
    #[error("cannot install the vCPU kick signal handler: {0}")]
    Signal(vmm_sys_util::errno::Error),
    /// A Linux vCPU could not be set up.
    #[error(transparent)]
    Linux(#[from] super::linux::cpu::CpuError),
    /// The thread could not be spawned.
    #[error("cannot spawn the thread of vCPU {index}: {source}")]
    Spawn {
        /// vCPU index.
        index: u8,
        /// The OS error.
        source: std::io::Error,
    },
}

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

/// Stop and wake requests shared by the VMM and all vCPU threads.
#[derive(Debug, Default)]
pub struct VcpuControl {
    stop: AtomicBool,
    wake_generation: Mutex<u64>,
    wake: Condvar,
    /// `PATCH /vm` Paused / Resumed.
    pause: super::pause::PauseGate,
    /// The wake hub the vCPUs wait on (port 0xf0c), kicked with every
    /// stop, pause and wake; set by the first vCPU that runs.
    hub: Mutex<Option<Arc<WakeHub>>>,
}

impl VcpuControl {
    /// A control with nothing requested.
    pub fn new() -> Self {
        Self::default()
    }

    /// Asks every vCPU to stop; parked ones return at once. Kick the running
    /// ones with [`VcpuHandle::kick`].
    pub fn request_stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        {
            let _guard = self
                .wake_generation
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            self.wake.notify_all();
        }
        self.pause.wake();
        self.kick_waits();
    }

    /// Ends the device waits in progress (they look at the flags again).
    fn kick_waits(&self) {
        if let Some(hub) = self.hub.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
            hub.kick();
        }
    }

    /// The wake hub the vCPUs wait on: kicked by stop, pause and wake.
    fn watch_hub(&self, hub: &Arc<WakeHub>) {
        let mut h = self.hub.lock().unwrap_or_else(|p| p.into_inner());
        if h.is_none() {
            *h = Some(hub.clone());
        }
    }

    /// Sleeps until the device in `slot` interrupts, `timeout`, or a stop,
    /// pause or wake (the firmware's wait port). Out of the guest meanwhile,
    /// as a parked vCPU is. The hub must be the one [`Self::watch_hub`] set.
    fn wait_device(&self, hub: &WakeHub, slot: u16, timeout: Duration) -> WaitEnd {
        let generation = *self
            .wake_generation
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let woken = || {
            self.stop_requested()
                || self.pause.is_paused()
                || *self
                    .wake_generation
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    != generation
        };
        self.pause.out_of_guest(true);
        let end = hub.wait(usize::from(slot), timeout, woken);
        self.pause.out_of_guest(false);
        end
    }

    /// The pause gate the vCPUs wait at.
    pub fn pause_gate(&self) -> &super::pause::PauseGate {
        &self.pause
    }

    /// Whether a stop was requested.
    pub fn stop_requested(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    /// Wakes parked vCPUs so they look at their devices again (e.g. after a
    /// Ctrl-Alt-Del was queued).
    pub fn wake_all(&self) {
        let mut generation = self
            .wake_generation
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        *generation += 1;
        self.wake.notify_all();
        drop(generation);
        self.kick_waits();
    }

    /// Parks until a wake this vCPU has not seen yet (`seen` is the wake
    /// generation it saw last, updated here) or a stop. A wake that came
    /// while the vCPU was running (e.g. a Ctrl-Alt-Del sent while the
    /// firmware was busy) makes the next park return at once, so the guest
    /// looks at its devices again instead of sleeping on a lost wakeup.
    fn park(&self, seen: &mut u64) {
        self.pause.out_of_guest(true);
        let mut generation = self
            .wake_generation
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        while !self.stop_requested() && *generation == *seen {
            generation = self
                .wake
                .wait(generation)
                .unwrap_or_else(|p| p.into_inner());
        }
        *seen = *generation;
        drop(generation);
        self.pause.out_of_guest(false);
    }
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

fn install_kick_handler() -> Result<(), VcpuError> {
    static ONCE: Once = Once::new();
    static mut RESULT: Option<vmm_sys_util::errno::Error> = None;
    ONCE.call_once(|| {
        if let Err(e) = register_signal_handler(SIGRTMIN() + KICK_SIGNAL_OFFSET, kick_handler) {
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

/// What a vCPU starts: the built-in firmware at CPL3, or a Linux kernel at
/// its 64-bit or PVH entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GuestEntry {
    /// The firmware, with its boot layout.
    Firmware(BootLayout),
    /// A Linux kernel.
    Linux(LinuxEntry),
}

/// Sets CPUID, FPU, special and general registers of vCPU `index`.
pub fn configure_vcpu(
    fd: &VcpuFd,
    index: u8,
    cpu: &CpuSetup,
    entry: &GuestEntry,
) -> Result<(), VcpuError> {
    let layout = match entry {
        GuestEntry::Firmware(layout) => layout,
        GuestEntry::Linux(linux) => {
            return Ok(super::linux::cpu::configure(fd, index, cpu, linux)?)
        }
    };
    let cpuid = &cpu.cpuid;
    let setup = |what: &'static str, r: Result<(), kvm_ioctls::Error>| {
        r.map_err(|source| VcpuError::Setup {
            index,
            what,
            source,
        })
    };
    setup("KVM_SET_CPUID2", fd.set_cpuid2(cpuid))?;
    let fpu = kvm_fpu {
        fcw: 0x37f,
        mxcsr: 0x1f80,
        ..Default::default()
    };
    setup("KVM_SET_FPU", fd.set_fpu(&fpu))?;
    let mut sregs = fd.get_sregs().map_err(|source| VcpuError::Setup {
        index,
        what: "KVM_GET_SREGS",
        source,
    })?;
    setup_sregs(&mut sregs, layout);
    setup("KVM_SET_SREGS", fd.set_sregs(&sregs))?;
    setup(
        "KVM_SET_REGS",
        fd.set_regs(&initial_regs(usize::from(index), layout)),
    )
}

/// A running vCPU thread.
pub struct VcpuHandle {
    index: u8,
    thread: Option<JoinHandle<()>>,
    /// Disconnected when the thread ends (its sender drops with it), so the
    /// VMM can wait for it with a deadline.
    ended: Receiver<()>,
}

impl VcpuHandle {
    /// Starts the thread `vcpu{index}` running `fd`.
    pub fn spawn(
        index: u8,
        fd: VcpuFd,
        bus: Arc<Buses>,
        control: Arc<VcpuControl>,
        events: Sender<VcpuEvent>,
        events_ready: EventFd,
        lease: GuestLease,
    ) -> Result<VcpuHandle, VcpuError> {
        install_kick_handler()?;
        let (ended_tx, ended) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name(format!("vcpu{index}"))
            .spawn(move || {
                crate::seccomp::install_thread(crate::seccomp::Role::Vcpu);
                let _ended = ended_tx;
                // Declared after `_ended`, so released before the VMM hears
                // that the thread ended: guest memory may then be unmapped.
                let _lease = lease;
                let run = std::panic::AssertUnwindSafe(|| run_loop(index, fd, &bus, &control));
                let event = std::panic::catch_unwind(run).unwrap_or_else(|_| {
                    Some(VcpuEvent::Crashed {
                        index,
                        reason: "the vCPU thread panicked".into(),
                    })
                });
                if let Some(event) = event {
                    log::debug!("vcpu{index}: {event:?}");
                    // The VMM may already be gone at process exit: nothing to tell.
                    let _ = events.send(event);
                    let _ = events_ready.write(1);
                }
            })
            .map_err(|source| VcpuError::Spawn { index, source })?;
        Ok(VcpuHandle {
            index,
            thread: Some(thread),
            ended,
        })
    }

    /// Interrupts `KVM_RUN` on this vCPU (after [`VcpuControl::request_stop`]).
    pub fn kick(&self) {
        if let Some(thread) = &self.thread {
            if !thread.is_finished() {
                if let Err(e) = thread.kill(SIGRTMIN() + KICK_SIGNAL_OFFSET) {
                    log::warn!("cannot kick vcpu{}: {e}", self.index);
                }
            }
        }
    }

    /// Waits for the thread until `deadline`.
    fn join_until(mut self, deadline: Instant) -> JoinOutcome {
        let left = deadline.saturating_duration_since(Instant::now());
        match self.ended.recv_timeout(left) {
            Err(RecvTimeoutError::Disconnected) => {}
            Ok(()) | Err(RecvTimeoutError::Timeout) => {
                log::error!(
                    "vcpu{} did not stop in time; leaving its thread behind",
                    self.index
                );
                return JoinOutcome::Stuck;
            }
        }
        match self.thread.take().map(JoinHandle::join) {
            Some(Err(_)) => {
                log::error!("vcpu{} panicked", self.index);
                JoinOutcome::Panicked
            }
            _ => JoinOutcome::Ended,
        }
    }
}

enum JoinOutcome {
    Ended,
    Panicked,
    Stuck,
}

/// How long stopping the vCPUs may take before the VMM goes on without the
/// ones that did not stop (a kicked vCPU leaves `KVM_RUN` in microseconds;
/// one that does not is stuck in the host kernel).
pub const VCPU_STOP_TIMEOUT: Duration = Duration::from_secs(2);

/// What stopping the vCPUs found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VcpuStopReport {
    /// vCPU threads that panicked.
    pub panicked: usize,
    /// vCPU threads that did not end before the deadline (left behind).
    pub stuck: usize,
}

/// A microVM's vCPU threads, stopped and joined (with a deadline) when
/// dropped: whatever path drops them, no vCPU outlives its group, and a
/// VMM that owns the group before the VM and its memory stops the
/// vCPUs before those go.
pub struct Vcpus {
    control: Arc<VcpuControl>,
    handles: Vec<VcpuHandle>,
}

impl Vcpus {
    /// An empty group sharing `control`.
    pub fn new(control: Arc<VcpuControl>) -> Self {
        Vcpus {
            control,
            handles: Vec::new(),
        }
    }

    /// Adds a started vCPU.
    pub fn push(&mut self, handle: VcpuHandle) {
        self.handles.push(handle);
    }

    /// How many vCPUs run.
    pub fn len(&self) -> usize {
        self.handles.len()
    }

    /// Whether the group has no vCPU.
    pub fn is_empty(&self) -> bool {
        self.handles.is_empty()
    }

    /// The stop and wake requests of the group.
    pub fn control(&self) -> &Arc<VcpuControl> {
        &self.control
    }

    /// Pauses every vCPU: each leaves `KVM_RUN` (kicked) and waits before
    /// entering it again. True once all are out of the guest within
    /// `timeout`. Idempotent.
    pub fn pause(&self, timeout: Duration) -> bool {
        self.control.pause.set(true);
        self.control.kick_waits();
        for h in &self.handles {
            h.kick();
        }
        let live = self
            .handles
            .iter()
            .filter(|h| h.thread.as_ref().is_some_and(|t| !t.is_finished()))
            .count();
        self.control.pause.wait_out(live, Instant::now() + timeout)
    }

    /// Lets the vCPUs enter the guest again. Idempotent.
    pub fn resume(&self) {
        self.control.pause.set(false);
    }

    /// Whether a pause is in force.
    pub fn paused(&self) -> bool {
        self.control.pause.is_paused()
    }

    /// Stops every vCPU: request, kick, join, waiting at most `timeout` in
    /// all. Idempotent.
    pub fn stop(&mut self, timeout: Duration) -> VcpuStopReport {
        self.control.request_stop();
        for h in &self.handles {
            h.kick();
        }
        let deadline = Instant::now() + timeout;
        let mut report = VcpuStopReport::default();
        for h in self.handles.drain(..) {
            match h.join_until(deadline) {
                JoinOutcome::Ended => {}
                JoinOutcome::Panicked => report.panicked += 1,
                JoinOutcome::Stuck => report.stuck += 1,
            }
        }
        report
    }
}

impl Drop for Vcpus {
    fn drop(&mut self) {
        if !self.handles.is_empty() {
            self.stop(VCPU_STOP_TIMEOUT);
        }
    }
}

/// Clears this thread's `kvm_run` pointer when dropped, on return or on
/// unwind, before the `VcpuFd` (and its `kvm_run` mapping) goes.
struct KvmRunGuard;

impl Drop for KvmRunGuard {
    fn drop(&mut self) {
        KVM_RUN.with(|run| run.set(std::ptr::null_mut()));
    }
}

fn run_loop(index: u8, mut fd: VcpuFd, bus: &Buses, control: &VcpuControl) -> Option<VcpuEvent> {
    KVM_RUN.with(|run| run.set(fd.get_kvm_run()));
    // Declared after `fd` is bound (a parameter), so it is dropped first.
    let _guard = KvmRunGuard;
    let inject_panic = index == 0 && crate::faults::injected("vcpu-panic");
    let ignore_stop = index == 1 && crate::faults::injected(crate::faults::VCPU_IGNORES_STOP);
    let mut seen_wake = 0;
    control.watch_hub(bus.mmio.wake_hub());
    let event = loop {
        if control.stop_requested() && !ignore_stop {
            break None;
        }
        control.pause.hold(|| control.stop_requested());
        if control.stop_requested() && !ignore_stop {
            break None;
        }
        match fd.run() {
            Ok(exit) => match handle_exit(index, exit, bus) {
                ExitAction::Continue if inject_panic => {
                    panic!("injected vCPU panic ({})", crate::faults::FAULT_INJECT_ENV)
                }
                ExitAction::Continue => {}
                ExitAction::Park => control.park(&mut seen_wake),
                ExitAction::WaitDevice { slot, timeout } => {
                    control.wait_device(bus.mmio.wake_hub(), slot, timeout);
                }
                ExitAction::Stop(event) => break Some(with_internal_details(&mut fd, event)),
            },
            Err(e) if e.errno() == libc::EINTR => fd.set_kvm_immediate_exit(0),
            Err(e) if e.errno() == libc::EAGAIN => {}
            Err(e) => {
                break Some(VcpuEvent::RunFailed {
                    index,
                    error: format!("KVM_RUN failed: {e}"),
                })
            }
        }
    };
    if ignore_stop {
        // The injected fault: a thread that never ends, holding its vCPU fd
        // (and so the VM and its memslots) and its lease on guest memory,
        // as one stuck in the host kernel would; the process exit ends it.
        log::warn!(
            "vcpu{index}: {}: never ending",
            crate::faults::VCPU_IGNORES_STOP
        );
        loop {
            std::thread::park();
        }
    }
    event
}

/// Adds KVM's sub-error, the failing instruction's bytes (emulation
/// failures) and the guest RIP to the reason of an internal-error crash.
fn with_internal_details(fd: &mut VcpuFd, event: VcpuEvent) -> VcpuEvent {
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
#[path = "wait_tests.rs"]
mod wait_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::{microvm_bus, SerialConsole, I8042};
    use std::time::Instant;

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

    /// Spawns `f` on a thread that first sends its tid, and returns once
    /// that thread is asleep in the kernel (state `S` in
    /// `/proc/self/task/<tid>/stat`): blocked in `park`, the only thing it
    /// can sleep in. Panics if the thread ends first (a park that returned
    /// without a wake or stop) or is not asleep within 10 s.
    fn spawn_parked<T: Send + 'static>(
        f: impl FnOnce() -> T + Send + 'static,
    ) -> std::thread::JoinHandle<T> {
        let (tx, rx) = std::sync::mpsc::channel();
        let t = std::thread::spawn(move || {
            // SAFETY: gettid has no preconditions.
            tx.send(unsafe { libc::gettid() }).unwrap();
            f()
        });
        let tid = rx.recv().unwrap();
        let stat = format!("/proc/self/task/{tid}/stat");
        let deadline = Instant::now() + std::time::Duration::from_secs(10);
        loop {
            assert!(!t.is_finished(), "park returned without a wake or a stop");
            let state = std::fs::read_to_string(&stat)
                .ok()
                .and_then(|s| s.rsplit_once(") ")?.1.chars().next());
            if state == Some('S') {
                // Asleep, and still not returned.
                assert!(!t.is_finished(), "park returned without a wake or a stop");
                return t;
            }
            assert!(
                Instant::now() < deadline,
                "the thread never parked ({state:?})"
            );
            std::thread::yield_now();
        }
    }

    #[test]
    fn park_returns_on_wake_and_stop() {
        let control = Arc::new(VcpuControl::new());
        let c = control.clone();
        // Parked with no wake: it stays parked until the wake.
        let t = spawn_parked(move || {
            let mut seen = 0;
            c.park(&mut seen);
            seen
        });
        control.wake_all();
        assert_eq!(t.join().unwrap(), 1);
        // Parked again after that wake, it stays parked until the stop,
        // after which a park returns at once.
        let c = control.clone();
        let t = spawn_parked(move || {
            let mut seen = 1;
            c.park(&mut seen);
            c.park(&mut seen);
        });
        control.request_stop();
        t.join().unwrap();
        assert!(control.stop_requested());
    }

    #[test]
    fn a_wake_before_the_park_is_not_lost() {
        let control = VcpuControl::new();
        let mut seen = 0;
        // Woken while running (e.g. Ctrl-Alt-Del while the firmware was busy).
        control.wake_all();
        control.park(&mut seen); // returns at once
        assert_eq!(seen, 1);
        control.wake_all();
        control.wake_all();
        control.park(&mut seen);
        assert_eq!(seen, 3);
    }
}
