//! The device manager: the microVM's virtio-mmio devices, their slots on
//! the MMIO bus, their interrupt lines and queue notifications in KVM, and
//! their threads. Built by the `start` job once guest memory, the VM and
//! (for a Linux guest) the irqchip exist; torn down by the `reclaim` job
//! right after the vCPUs stop ([`Devices::stop`]), so that no device holds
//! guest memory when it is freed.
//!
//! Per device (one path for all, in `build.rs`): a
//! [`MmioTransport`](crate::devices::virtio::MmioTransport) in the next slot (Firecracker's window
//! and GSIs, [`MmioSlot`]); each queue's notify eventfd registered as an
//! ioeventfd on the window's `QueueNotify` with the queue index as
//! datamatch (a guest write reaches the device thread without an exit; an
//! MMIO exit to the same register writes the same eventfd); the interrupt
//! eventfd as an irqfd on the device's GSI when the VM has an irqchip (the
//! firmware, which has none, sleeps on the wait port instead: the
//! transport's interrupt wakes it through the bus's wake hub,
//! [`crate::devices::wake`]); and one device thread with its own
//! seccomp role that does the queue work, never a vCPU and never the event
//! loop.
//!
//! A build that fails at any step undoes itself: what it has set running
//! (device threads, devices to reset, the balloon's discard pool) is owned
//! by a `Started` guard from the moment it starts, and the guard's `Drop`
//! stops and joins the threads, resets the devices and shuts the pool down;
//! the transports, their eventfds and the KVM registrations go with the
//! bus and the VM. What the client gave stays configured: each device gets
//! its own handle (`dup`) on the drive's file, the tap and the listener.
//!
//! Here: what a start asks for (the specs), the devices as the VMM drives
//! them, and their stop. `build.rs`: [`Devices::build`]. `hold.rs`:
//! [`Devices::hold`], the devices held still for a snapshot.
//! `snapshot.rs`: [`Devices::save_state`] and [`Devices::restore_state`]
//! ([`DevicesState`]). [`hotplug`]: the
//! virtio-mem devices as the VMM drives them. `metrics.rs`: their groups of
//! a metrics line. The sinks they give memory back through are
//! [`crate::vmm::sinks`].

mod build;
mod hold;
pub mod hotplug;
mod metrics;
mod snapshot;
#[cfg(test)]
mod snapshot_tests;

use std::sync::mpsc::{Receiver, RecvTimeoutError, TryRecvError};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use vmm_sys_util::eventfd::EventFd;

use crate::devices::bus::mmio::MmioBusError;
use crate::devices::virtio::balloon::{Balloon, BalloonError, BalloonOptions};
use crate::devices::virtio::block::{Block, BlockError, BlockOptions};
use crate::devices::virtio::net::{Net, NetError, NetOptions, Tap};
use crate::devices::virtio::rng::{Rng, RngError};
use crate::devices::virtio::vsock::{Vsock, VsockError, VsockOptions};
use crate::devices::virtio::{MmioError, VirtioDevice, WorkerError};
use crate::devices::{Buses, MmioSlot};
use crate::memory::GuestView;
use crate::vstate::vm::VmError;

use crate::vmm::sinks::discard::PoolSink;
use crate::vmm::sinks::hotplug_slots::HotplugSlots;

pub use hold::DeviceKey;
pub use hold::{DeviceHold, HOLD_TIMEOUT};
pub use hotplug::{Hotplug, HotplugDevice};
pub use snapshot::{DeviceKindState, DeviceState, DevicesState};

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
    /// A virtio-mem device or its sink could not be made.
    #[error("memory hotplug: {0}")]
    Hotplug(String),
    /// The vsock could not be made.
    #[error("vsock: {0}")]
    Vsock(#[from] VsockError),
    /// A network interface could not be made.
    #[error("network interface: {0}")]
    Net(#[from] NetError),
    /// The entropy device could not be made.
    #[error("entropy device: {0}")]
    Rng(#[from] RngError),
    /// A drive could not be made.
    #[error("drive: {0}")]
    Block(#[from] BlockError),
    /// A fault injected for the tests (`TERAVM_FAULT_INJECT`).
    #[error("injected fault {0}")]
    Injected(&'static str),
    /// A tap or socket could not be duplicated for its device.
    #[error("cannot duplicate the {what} of {id}: {source}")]
    Dup {
        /// A tap or the vsock's socket.
        what: &'static str,
        /// Its interface (or `vsock`).
        id: String,
        /// Why.
        source: std::io::Error,
    },
    /// A device thread's loop could not be set up.
    #[error("cannot start the {name} thread's loop: {source}")]
    Worker {
        /// The thread.
        name: String,
        /// Why.
        source: WorkerError,
    },
    /// A device thread could not be started.
    #[error("cannot spawn the {name} thread: {source}")]
    Spawn {
        /// The thread.
        name: String,
        /// Why.
        source: std::io::Error,
    },
    /// A snapshot of a microVM with this device is not supported yet.
    #[error("a snapshot of a microVM with {0} is not supported yet")]
    SnapshotUnsupported(&'static str),
    /// The devices are held already ([`Devices::hold`]).
    #[error("the devices are already held for a snapshot")]
    AlreadyHeld,
    /// A hold of other devices was given ([`Devices::save_state`]).
    #[error("the devices' state was asked for without their hold")]
    NotHeld,
    /// A device did not hold still in time ([`Devices::hold`]).
    #[error("the {device} did not hold still in time: {what}")]
    NotStill {
        /// The device.
        device: String,
        /// What it did not do.
        what: &'static str,
    },
    /// A device's state could not be saved.
    #[error("cannot save the state of the {device}: {why}")]
    Save {
        /// The device.
        device: String,
        /// Why.
        why: &'static str,
    },
    /// A device's saved state does not fit it.
    #[error("cannot restore the {device}: {why}")]
    Restore {
        /// The device.
        device: String,
        /// Why.
        why: String,
    },
}

/// A drive to attach: its options and its file, opened (read-only or
/// read-write) by the `files` thread when it was put.
#[derive(Debug, Clone)]
pub struct DriveSpec {
    /// The device's options.
    pub opts: BlockOptions,
    /// The backing file.
    pub file: Arc<std::fs::File>,
    /// The guest's root device (`root=` on a kernel's command line).
    pub is_root_device: bool,
    /// The root partition's UUID (`root=PARTUUID=`), if given.
    pub partuuid: Option<String>,
}

/// A network interface to attach: its options and its tap, opened by the
/// `files` thread when it was put.
#[derive(Debug, Clone)]
pub struct NetSpec {
    /// The device's options.
    pub opts: NetOptions,
    /// The tap (the device gets its own handle: the configuration keeps
    /// this one).
    pub tap: Arc<Tap>,
    /// The MMDS, when its configuration names this interface.
    pub mmds: Option<crate::devices::virtio::net::mmds::MmdsLink>,
}

/// The vsock to attach: its options and its listening socket, bound by the
/// `files` thread when it was put.
#[derive(Debug, Clone)]
pub struct VsockSpec {
    /// The device's options.
    pub opts: VsockOptions,
    /// The host side's socket (`uds_path`; the device gets its own handle:
    /// the configuration keeps this one).
    pub listener: Arc<std::os::unix::net::UnixListener>,
}

/// The devices a configuration asks for, as the builder needs them, in
/// Firecracker's attach order: the balloon, the drives (the root drive
/// first), the network interfaces, the vsock.
#[derive(Debug, Clone, Default)]
pub struct DeviceSpecs {
    /// The balloon, if any.
    pub balloon: Option<BalloonOptions>,
    /// Discard workers per host node for the balloon's pool.
    pub discard_workers_per_node: u32,
    /// The drives, root first.
    pub drives: Vec<DriveSpec>,
    /// The network interfaces.
    pub nets: Vec<NetSpec>,
    /// The vsock, if any.
    pub vsock: Option<VsockSpec>,
    /// The entropy device's rate limiter, if there is one.
    pub entropy: Option<crate::rate_limiter::RateLimiterConfig>,
    /// Memory hotplug (virtio-mem), if configured.
    pub hotplug: Option<HotplugSpec>,
}

/// Memory hotplug as the start builds it: the region's sizes and how many
/// devices (one per node part) it makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HotplugSpec {
    /// The region's size.
    pub total_bytes: u64,
    /// The block size.
    pub block_bytes: u64,
    /// The memslot size.
    pub slot_bytes: u64,
    /// The devices (node parts) it makes, known from the plan before the
    /// memory exists (the Linux command line lists them).
    pub parts: usize,
    /// Log dirty pages in its memslots too (`track_dirty_pages`).
    pub dirty_log: bool,
}

impl HotplugSpec {
    /// The memory layer's view of it.
    pub fn memory_options(&self) -> crate::memory::HotplugOptions {
        crate::memory::HotplugOptions {
            total_bytes: self.total_bytes,
            slot_bytes: self.slot_bytes,
        }
    }
}

impl DeviceSpecs {
    /// How many devices there are (the slots they take, from 0).
    pub fn count(&self) -> usize {
        usize::from(self.balloon.is_some())
            + self.drives.len()
            + self.nets.len()
            + usize::from(self.vsock.is_some())
            + usize::from(self.entropy.is_some())
            + self.hotplug.map_or(0, |h| h.parts)
    }

    /// The Linux command-line parameters that announce the devices (known
    /// before the devices exist: a kernel's command line is written first),
    /// and the root drive's `root=` and `ro`/`rw`, as Firecracker writes
    /// them.
    pub fn cmdline_params(&self) -> Vec<String> {
        let mut p: Vec<String> = (0..self.count())
            .map(|i| MmioSlot::nth(i).cmdline_param())
            .collect();
        if let Some(root) = self.drives.iter().find(|d| d.is_root_device) {
            p.push(match &root.partuuid {
                Some(uuid) => format!("root=PARTUUID={uuid}"),
                None => "root=/dev/vda".into(),
            });
            p.push(if root.opts.read_only { "ro" } else { "rw" }.into());
        }
        p
    }
}

/// A drive as the VMM drives it (`PATCH /drives`).
pub struct BlockDevice {
    /// Its id.
    pub drive_id: String,
    /// The device (shared with its transport and its thread).
    pub device: Arc<Mutex<Block<GuestView>>>,
    /// Its slot.
    pub slot: MmioSlot,
}

/// The balloon as the VMM drives it (`PATCH /balloon`, statistics).
pub struct BalloonDevice {
    /// The device (shared with its transport and its thread).
    pub device: Arc<Mutex<Balloon<GuestView>>>,
    /// Its slot.
    pub slot: MmioSlot,
    /// Its discard pool, as the balloon's sink.
    pub discard: Arc<PoolSink>,
}

/// One device thread: stopped by its exit eventfd, waited for with a
/// deadline through a channel that disconnects when it ends.
struct DeviceThread {
    name: String,
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

/// What a start has set running for the devices, owned from the moment
/// each is started: the device threads, the devices (to reset), the
/// balloon's discard pool. Dropping it (a build that fails at a later step,
/// a panic) stops and joins all of it, so no thread, device or guest
/// mapping outlives a failed start.
#[derive(Default)]
struct Started {
    threads: Vec<DeviceThread>,
    devices: Vec<Arc<Mutex<dyn VirtioDevice<GuestView>>>>,
    discard: Option<Arc<PoolSink>>,
    /// virtio-mem's memslots, released with the devices.
    hotplug_slots: Option<Arc<HotplugSlots>>,
    /// The gate every device loop waits at while the devices are held.
    gate: Arc<crate::devices::virtio::Gate>,
}

impl Started {
    /// The names of the device threads that have not ended.
    fn alive(&self) -> Vec<&str> {
        self.threads
            .iter()
            .filter(|t| matches!(t.ended.try_recv(), Err(TryRecvError::Empty)))
            .map(|t| t.name.as_str())
            .collect()
    }

    /// Stops the threads, waiting until `deadline` at most.
    fn stop_threads(&mut self, deadline: Instant) -> DeviceStopReport {
        let mut report = DeviceStopReport::default();
        // No thread waits for a hold's end any more (it would not see its
        // exit eventfd).
        self.gate.open_for_good();
        // First end the discards in flight (freeing nothing more): memory is
        // reclaimed whole next, and no device thread may wait behind one.
        if let Some(pool) = &self.discard {
            pool.cancel();
        }
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
        report
    }

    /// Resets the devices and stops the discard pool: afterwards no device
    /// holds guest memory.
    fn release(&mut self, deadline: Instant) {
        for d in self.devices.drain(..) {
            // A device thread the stop gave up on may hold the lock (stuck
            // in the kernel): that device is left as it is, not waited for.
            match lock_by(&d, deadline) {
                Some(mut g) => g.reset(),
                None => log::error!(
                    "a device's lock is still held at the stop's deadline; its reset is left \
                     to its thread"
                ),
            }
        }
        if let Some(slots) = self.hotplug_slots.take() {
            slots.release();
        }
        if let Some(pool) = self.discard.take() {
            pool.shutdown(deadline);
        }
    }
}

impl Drop for Started {
    fn drop(&mut self) {
        let deadline = Instant::now() + crate::vstate::vcpu::VCPU_STOP_TIMEOUT;
        self.stop_threads(deadline);
        self.release(deadline);
    }
}

/// The microVM's devices.
pub struct Devices {
    /// The buses the vCPUs' exits reach.
    pub buses: Arc<Buses>,
    /// The balloon, if configured.
    pub balloon: Option<BalloonDevice>,
    /// The drives.
    pub blocks: Vec<BlockDevice>,
    /// The network interfaces.
    pub nets: Vec<Arc<Mutex<Net<GuestView>>>>,
    /// The vsock.
    pub vsock: Option<Arc<Mutex<Vsock<GuestView>>>>,
    /// The entropy device.
    pub rng: Option<Arc<Mutex<Rng<GuestView>>>>,
    /// The virtio-mem devices, if memory hotplug is configured.
    pub hotplug: Option<Hotplug>,
    /// What a hold and a snapshot go through, device by device.
    hold_parts: Arc<hold::HoldParts>,
    started: Started,
}

fn lock<T: ?Sized>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// How often [`lock_by`] tries again.
const LOCK_RETRY: Duration = Duration::from_millis(1);

/// `m`'s lock, or `None` if it is still held at `deadline` (std's mutex has
/// no timed lock: tried again every [`LOCK_RETRY`]; only a teardown that
/// must not hang behind a stuck thread uses it).
fn lock_by<T: ?Sized>(m: &Mutex<T>, deadline: Instant) -> Option<std::sync::MutexGuard<'_, T>> {
    loop {
        match m.try_lock() {
            Ok(g) => return Some(g),
            Err(std::sync::TryLockError::Poisoned(p)) => return Some(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => {
                if Instant::now() >= deadline {
                    return None;
                }
                std::thread::sleep(LOCK_RETRY);
            }
        }
    }
}

impl Devices {
    /// Ends every wait of a vCPU in a device's reset fence
    /// ([`crate::devices::virtio::ResetFence`]), now and later: the first
    /// step of a shutdown, before the vCPUs are stopped, so none of them
    /// waits behind a discard the shutdown is about to cancel anyway.
    pub fn cancel_waits(&self) {
        for d in &self.started.devices {
            if let Some(fence) = d
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .reset_fence()
            {
                fence.cancel();
            }
        }
    }

    /// Stops the device threads (waiting until `deadline` at most), takes
    /// every device off the bus and resets it, and stops the discard pool:
    /// afterwards no device holds guest memory. Idempotent.
    pub fn stop(&mut self, deadline: Instant) -> DeviceStopReport {
        let report = self.started.stop_threads(deadline);
        self.buses.mmio.detach_all();
        self.started.release(deadline);
        report
    }
}

impl Drop for Devices {
    fn drop(&mut self) {
        self.stop(Instant::now() + crate::vstate::vcpu::VCPU_STOP_TIMEOUT);
    }
}
