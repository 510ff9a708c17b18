//! The device manager: the microVM's virtio-mmio devices, their slots on
//! the MMIO bus, their interrupt lines and queue notifications in KVM, and
//! their threads. Built by the `start` job once guest memory, the VM and
//! (for a Linux guest) the irqchip exist; torn down by the `reclaim` job
//! right after the vCPUs stop ([`Devices::stop`]), so that no device holds
//! guest memory when it is freed.
//!
//! Per device: a [`MmioTransport`] in the next slot (Firecracker's window
//! and GSIs, [`MmioSlot`]); each queue's notify eventfd registered as an
//! ioeventfd on the window's `QueueNotify` with the queue index as
//! datamatch (a guest write reaches the device thread without an exit; an
//! MMIO exit to the same register writes the same eventfd); the interrupt
//! eventfd as an irqfd on the device's GSI when the VM has an irqchip (the
//! firmware, which has none, polls); and one device thread with its own
//! seccomp role that does the queue work, never a vCPU and never the event
//! loop.

use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Instant;

use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::devices::mmio::MmioBusError;
use crate::devices::virtio::balloon::{Balloon, BalloonError, BalloonOptions, BalloonWorker};
use crate::devices::virtio::{mmio::regs, MmioError, MmioTransport, VirtioDevice};
use crate::devices::{Buses, MmioSlot, PioBus};
use crate::memory::{GuestMemory, GuestView};
use crate::vstate::vm::{Vm, VmError};

use super::discard::BalloonDiscard;

/// The device order on the bus: the balloon first (Firecracker attaches it
/// before the drives, network interfaces and vsock).
const BALLOON_SLOT: usize = 0;

/// Errors of building the devices.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// The balloon could not be made.
    #[error("balloon: {0}")]
    Balloon(#[from] BalloonError),
    /// A transport could not be made.
    #[error("virtio-mmio: {0}")]
    Mmio(#[from] MmioError),
    /// The bus is full.
    #[error(transparent)]
    Bus(#[from] MmioBusError),
    /// KVM refused an irqfd or ioeventfd.
    #[error(transparent)]
    Vm(#[from] VmError),
    /// An eventfd could not be made or cloned.
    #[error("cannot make a device eventfd: {0}")]
    EventFd(std::io::Error),
    /// The balloon's discard pool could not be started.
    #[error("balloon discard pool: {0}")]
    Discard(String),
    /// A device thread could not be started.
    #[error("cannot spawn the {name} thread: {source}")]
    Spawn {
        /// The thread.
        name: &'static str,
        /// Why.
        source: std::io::Error,
    },
}

/// The devices a configuration asks for, as the builder needs them.
#[derive(Debug, Clone, Default)]
pub struct DeviceSpecs {
    /// The balloon, if any.
    pub balloon: Option<BalloonOptions>,
    /// Discard workers per host node for the balloon's pool.
    pub discard_workers_per_node: u32,
}

impl DeviceSpecs {
    /// The slots the devices will take, in order (known before the devices
    /// exist: a kernel's command line is written first).
    pub fn slots(&self) -> Vec<MmioSlot> {
        let mut s = Vec::new();
        if self.balloon.is_some() {
            s.push(MmioSlot::nth(BALLOON_SLOT));
        }
        s
    }

    /// The Linux command-line parameters that announce the devices.
    pub fn cmdline_params(&self) -> Vec<String> {
        self.slots().iter().map(MmioSlot::cmdline_param).collect()
    }
}

/// The balloon as the VMM drives it (`PATCH /balloon`, statistics).
pub struct BalloonDevice {
    /// The device (shared with its transport and its thread).
    pub device: Arc<Mutex<Balloon<GuestView>>>,
    /// Its slot.
    pub slot: MmioSlot,
    /// Its discard pool, as the balloon's sink.
    pub discard: Arc<BalloonDiscard>,
}

/// One device thread: stopped by its exit eventfd, waited for with a
/// deadline through a channel that disconnects when it ends.
struct DeviceThread {
    name: &'static str,
    exit: EventFd,
    ended: Receiver<()>,
    thread: Option<JoinHandle<()>>,
}

/// What stopping the devices found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeviceStopReport {
    /// Device threads that did not end before the deadline (left behind,
    /// holding no guest memory: their devices were reset and detached).
    pub stuck: usize,
}

/// The microVM's devices.
pub struct Devices {
    /// The buses the vCPUs' exits reach.
    pub buses: Arc<Buses>,
    /// The balloon, if configured.
    pub balloon: Option<BalloonDevice>,
    threads: Vec<DeviceThread>,
}

fn lock<T: ?Sized>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Devices {
    /// Builds the devices of `specs` over `memory` and `vm`, with the port
    /// devices of `pio`, and starts their threads.
    pub fn build(
        specs: &DeviceSpecs,
        pio: PioBus,
        vm: &Vm,
        memory: &GuestMemory,
        topology: &crate::memory::HostTopology,
    ) -> Result<Devices, DeviceError> {
        let mut mmio = crate::devices::MmioBus::default();
        let mut threads = Vec::new();
        let mut balloon = None;
        if let Some(opts) = specs.balloon {
            let page = memory.hugetlb_page_bytes().unwrap_or(4096);
            let discard = Arc::new(
                BalloonDiscard::start(memory, topology, specs.discard_workers_per_node, page)
                    .map_err(DeviceError::Discard)?,
            );
            let device = Arc::new(Mutex::new(Balloon::new(
                opts,
                memory.mem_bytes() >> 20,
                page,
                discard.clone(),
            )?));
            let as_virtio: Arc<Mutex<dyn VirtioDevice<GuestView>>> = device.clone();
            let irq = EventFd::new(EFD_NONBLOCK).map_err(DeviceError::EventFd)?;
            let transport = MmioTransport::new(as_virtio, memory.view(), irq)?;
            let (queue_evts, irq) = clones(&transport)?;
            let slot = mmio.add(Box::new(transport))?;
            debug_assert_eq!(slot, MmioSlot::nth(BALLOON_SLOT));
            register(vm, slot, &queue_evts, &irq)?;
            let exit = EventFd::new(EFD_NONBLOCK).map_err(DeviceError::EventFd)?;
            let worker = BalloonWorker::new(
                device.clone(),
                queue_evts,
                exit.try_clone().map_err(DeviceError::EventFd)?,
            )?;
            threads.push(spawn("balloon", exit, move || {
                if let Err(e) = worker.run() {
                    log::error!("balloon: {e}; the device stops");
                }
            })?);
            log::info!(
                "balloon at {:#x} (GSI {}): {} MiB target, reporting {}, statistics every {} s",
                slot.base,
                slot.gsi,
                opts.amount_mib,
                opts.free_page_reporting,
                opts.stats_polling_interval_s
            );
            balloon = Some(BalloonDevice {
                device,
                slot,
                discard,
            });
        }
        Ok(Devices {
            buses: Arc::new(Buses { pio, mmio }),
            balloon,
            threads,
        })
    }

    /// Stops the device threads (waiting until `deadline` at most), takes
    /// every device off the bus and resets it, and stops the discard pool:
    /// afterwards no device holds guest memory. Idempotent.
    pub fn stop(&mut self, deadline: Instant) -> DeviceStopReport {
        let mut report = DeviceStopReport::default();
        for t in &self.threads {
            let _ = t.exit.write(1);
        }
        for mut t in self.threads.drain(..) {
            let left = deadline.saturating_duration_since(Instant::now());
            match t.ended.recv_timeout(left) {
                Err(RecvTimeoutError::Disconnected) => {
                    if let Some(h) = t.thread.take() {
                        let _ = h.join();
                    }
                }
                Ok(()) | Err(RecvTimeoutError::Timeout) => {
                    log::error!(
                        "the {} thread did not stop in time; leaving it behind",
                        t.name
                    );
                    report.stuck += 1;
                }
            }
        }
        self.buses.mmio.detach_all();
        if let Some(b) = &self.balloon {
            lock(&b.device).reset();
            b.discard.shutdown(deadline);
        }
        report
    }
}

impl Drop for Devices {
    fn drop(&mut self) {
        self.stop(Instant::now() + crate::vstate::vcpu::VCPU_STOP_TIMEOUT);
    }
}

/// Clones of a transport's queue eventfds and interrupt eventfd.
fn clones(t: &MmioTransport<GuestView>) -> Result<(Vec<EventFd>, EventFd), DeviceError> {
    let queues = t
        .queue_evts()
        .iter()
        .map(EventFd::try_clone)
        .collect::<Result<Vec<_>, _>>()
        .map_err(DeviceError::EventFd)?;
    let irq = t
        .interrupt()
        .irq_evt()
        .try_clone()
        .map_err(DeviceError::EventFd)?;
    Ok((queues, irq))
}

/// Registers a device's queue notifications and interrupt with KVM.
fn register(vm: &Vm, slot: MmioSlot, queues: &[EventFd], irq: &EventFd) -> Result<(), DeviceError> {
    for (i, e) in queues.iter().enumerate() {
        vm.register_mmio_ioevent(e, slot.base + regs::QUEUE_NOTIFY, i as u32)?;
    }
    if vm.has_irqchip() {
        vm.register_irqfd(irq, slot.gsi)?;
    }
    Ok(())
}

/// Starts device thread `name` running `work` under the role of the same
/// name.
fn spawn(
    name: &'static str,
    exit: EventFd,
    work: impl FnOnce() + Send + 'static,
) -> Result<DeviceThread, DeviceError> {
    let (ended_tx, ended) = std::sync::mpsc::channel::<()>();
    let thread = std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            crate::seccomp::install_thread(crate::seccomp::Role::Balloon);
            let _ended = ended_tx;
            work();
        })
        .map_err(|source| DeviceError::Spawn { name, source })?;
    Ok(DeviceThread {
        name,
        exit,
        ended,
        thread: Some(thread),
    })
}
