//! Building the devices ([`Devices::build`]): the discard pool first (for
//! the balloon and virtio-mem), then each device in Firecracker's attach
//! order (the balloon, the drives with the root first, the network
//! interfaces, the vsock), then teravm's entropy device and virtio-mem
//! parts. Every device goes through one path, [`Build::attach_and_spawn`]:
//! its transport in the next slot of the MMIO bus, its queue notifications
//! and interrupt registered with KVM, its handler's loop started
//! ([`Worker::start`]) and run on a thread of its own under its seccomp
//! role, its line logged. What differs between devices is passed to it as
//! values: the thread ([`Thread`]: its name, its role, how its error line
//! names the device), the handler, and the log line.
//!
//! After each kind of device a test can make the build fail
//! ([`Build::fault_at`]); whatever a failed build had started is stopped
//! by [`Started`]'s `Drop`.

use std::sync::{Arc, Mutex};

use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::devices::virtio::balloon::{Balloon, BalloonOptions, BalloonWorker};
use crate::devices::virtio::block::{Block, BlockWorker};
use crate::devices::virtio::mem::{MemOptions, MemWorker, VirtioMem};
use crate::devices::virtio::net::Net;
use crate::devices::virtio::rng::Rng;
use crate::devices::virtio::transport::mmio::regs;
use crate::devices::virtio::vsock::Vsock;
use crate::devices::virtio::{MmioTransport, QueueHandler, VirtioDevice, Worker};
use crate::devices::{Buses, MmioBus, MmioSlot, PioBus};
use crate::faults;
use crate::memory::{GuestMemory, GuestView, HostTopology};
use crate::rate_limiter::RateLimiterConfig;
use crate::seccomp::Role;
use crate::vmm::sinks::discard::PoolSink;
use crate::vmm::sinks::hotplug_slots::HotplugSlots;
use crate::vstate::vm::Vm;

use super::hold::{Entry, HoldParts};
use super::{
    lock, BalloonDevice, BlockDevice, DeviceError, DeviceKey, DeviceSpecs, DeviceThread, Devices,
    DriveSpec, Hotplug, HotplugDevice, HotplugSpec, NetSpec, Started, VsockSpec,
};

/// A device's thread, as [`Build::attach_and_spawn`] starts it.
struct Thread {
    /// The thread's name (`virtio-blk0`).
    name: String,
    /// The seccomp filter it installs.
    role: Role,
    /// The device as the thread's error line names it (`drive rootfs`).
    device: String,
    /// The device as a snapshot names it.
    key: DeviceKey,
}

impl Thread {
    /// Thread `name` under `role`'s filter, its error line naming `device`,
    /// a snapshot's entry `key`.
    fn new(name: String, role: Role, key: DeviceKey) -> Thread {
        Thread {
            name,
            role,
            device: key.to_string(),
            key,
        }
    }
}

/// A build under way: the MMIO bus it fills, what it has started so far,
/// and what it builds on.
struct Build<'a> {
    /// Dropped first on an error (fields drop in order).
    mmio: MmioBus,
    /// Dropped last on an error: the threads stop while nothing else is
    /// left to stop.
    started: Started,
    vm: &'a Vm,
    memory: &'a GuestMemory,
    /// Each device as a hold and a snapshot see it.
    entries: Vec<Entry>,
}

/// The handler of a device that is its own (`Arc<Mutex<D>>` implements
/// [`QueueHandler`]: the device, locked for each event).
fn itself<D>(device: &Arc<Mutex<D>>) -> Result<Arc<Mutex<D>>, DeviceError> {
    Ok(device.clone())
}

impl Devices {
    /// Builds the devices of `specs` over `memory` and `vm`, with the port
    /// devices of `pio`, and starts their threads. On an error, whatever it
    /// had started is stopped, joined and released before it returns.
    pub fn build(
        specs: &DeviceSpecs,
        pio: PioBus,
        vm: &Vm,
        memory: &GuestMemory,
        topology: &HostTopology,
    ) -> Result<Devices, DeviceError> {
        // Dropped last on an error (declared first).
        let mut b = Build {
            mmio: MmioBus::default(),
            started: Started::default(),
            vm,
            memory,
            entries: Vec::new(),
        };
        let page = memory.hugetlb_page_bytes().unwrap_or(4096);
        if specs.balloon.is_some() || specs.hotplug.is_some() {
            b.started.discard = Some(Arc::new(
                PoolSink::start(memory, topology, specs.discard_workers_per_node, page)
                    .map_err(DeviceError::Discard)?,
            ));
        }
        let balloon = match (specs.balloon, b.started.discard.clone()) {
            (Some(opts), Some(discard)) => Some(b.balloon(opts, page, discard)?),
            _ => None,
        };
        let mut blocks = Vec::new();
        for (i, d) in specs.drives.iter().enumerate() {
            blocks.push(b.drive(i, d)?);
        }
        if !specs.drives.is_empty() {
            b.fault_at(faults::START_FAILS_AT_DRIVES)?;
        }
        let mut nets = Vec::new();
        for (i, n) in specs.nets.iter().enumerate() {
            nets.push(b.net(i, n)?);
        }
        if !specs.nets.is_empty() {
            b.fault_at(faults::START_FAILS_AT_NET)?;
        }
        let vsock = match &specs.vsock {
            Some(v) => Some(b.vsock(v)?),
            None => None,
        };
        let rng = match &specs.entropy {
            Some(limiter) => Some(b.rng(limiter)?),
            None => None,
        };
        let hotplug = match (&specs.hotplug, b.started.discard.clone()) {
            (Some(spec), Some(discard)) => Some(b.hotplug(spec, discard)?),
            _ => None,
        };
        b.fault_at(faults::FIRST_START_FAILS_AFTER_DEVICES)?;
        let Build {
            mmio,
            started,
            entries,
            ..
        } = b;
        let hold_parts = Arc::new(HoldParts {
            gate: started.gate.clone(),
            entries,
            blocks: blocks.iter().map(|b| b.device.clone()).collect(),
            balloon: balloon.as_ref().map(|b| b.device.clone()),
            ..HoldParts::default()
        });
        Ok(Devices {
            hold_parts,
            hotplug,
            rng,
            vsock,
            nets,
            buses: Arc::new(Buses { pio, mmio }),
            balloon,
            blocks,
            started,
        })
    }
}

impl Build<'_> {
    /// Puts `device` on the bus in the next slot behind its own transport,
    /// registers its queue notifications and interrupt with KVM, makes its
    /// queue handler (`handler`) and starts its loop ([`Worker::start`]),
    /// runs that loop on `thread` (which logs the loop's error, if it ends
    /// on one), and logs `line` (given the device's place: `at <base>
    /// (GSI <gsi>)`). The device is owned by `started` (reset at a stop)
    /// from the first step, its thread once it runs. Returns its slot.
    fn attach_and_spawn<D, H>(
        &mut self,
        device: &Arc<Mutex<D>>,
        thread: Thread,
        handler: impl FnOnce(&Arc<Mutex<D>>) -> Result<H, DeviceError>,
        line: impl FnOnce(&str) -> String,
    ) -> Result<MmioSlot, DeviceError>
    where
        D: VirtioDevice<GuestView> + 'static,
        H: QueueHandler + 'static,
    {
        self.started.devices.push(device.clone());
        let (slot, queue_evts, exit) =
            attach(&mut self.mmio, self.vm, self.memory, device.clone())?;
        let worker_exit = exit.try_clone().map_err(DeviceError::EventFd)?;
        let handler = handler(device)?;
        let wake = handler.wake();
        let queues = queue_evts.len();
        let mut worker = Worker::start(handler, queue_evts, worker_exit).map_err(|source| {
            DeviceError::Worker {
                name: thread.name.clone(),
                source,
            }
        })?;
        worker.hold_at(self.started.gate.clone());
        self.entries.push(Entry {
            key: thread.key.clone(),
            slot,
            passes: worker.pass_watch(),
            wake,
            queues,
        });
        let Thread {
            name, role, device, ..
        } = thread;
        self.started.threads.push(spawn(name, role, exit, move || {
            if let Err(e) = worker.run() {
                log::error!("{device}: {e}; the device stops");
            }
        })?);
        log::info!(
            "{}",
            line(&format!("at {:#x} (GSI {})", slot.base, slot.gsi))
        );
        Ok(slot)
    }

    /// With the fault `start-fails-at-<step>` (or, after the last step,
    /// `first-start-fails-after-devices`): the build fails here, once, as a
    /// later step failing would. Its line says what the failure tears down,
    /// so that a test sees the steps before it ran: the device threads
    /// still alive (`started`'s, each one's `ended` channel still open) and
    /// the process's thread count as the kernel has it
    /// (`/proc/self/status`).
    fn fault_at(&self, fault: &'static str) -> Result<(), DeviceError> {
        if faults::fire_once(fault) {
            let threads = std::fs::read_to_string("/proc/self/status")
                .ok()
                .and_then(|s| {
                    s.lines()
                        .find_map(|l| l.strip_prefix("Threads:"))
                        .map(|n| n.trim().to_string())
                })
                .unwrap_or_else(|| "unknown (no /proc/self/status)".into());
            log::warn!(
                "{fault}: failing the start here; device threads alive: [{}]; process threads: {threads}",
                self.started.alive().join(", ")
            );
            return Err(DeviceError::Injected(fault));
        }
        Ok(())
    }

    /// The balloon, over the discard pool.
    fn balloon(
        &mut self,
        opts: BalloonOptions,
        page: u64,
        discard: Arc<PoolSink>,
    ) -> Result<BalloonDevice, DeviceError> {
        let mib = self.memory.mem_bytes() >> 20;
        let device = Arc::new(Mutex::new(Balloon::new(opts, mib, page, discard.clone())?));
        let slot = self.attach_and_spawn(
            &device,
            Thread::new("balloon".into(), Role::Balloon, DeviceKey::Balloon),
            |d| Ok(BalloonWorker::new(d)),
            |at| {
                format!(
                    "balloon {at}: {} MiB target, reporting {}, statistics every {} s",
                    opts.amount_mib, opts.free_page_reporting, opts.stats_polling_interval_s
                )
            },
        )?;
        self.fault_at(faults::START_FAILS_AT_BALLOON)?;
        Ok(BalloonDevice {
            device,
            slot,
            discard,
        })
    }

    /// Drive `i`, over its own handle on the file.
    fn drive(&mut self, i: usize, d: &DriveSpec) -> Result<BlockDevice, DeviceError> {
        let file = d.file.try_clone().map_err(DeviceError::EventFd)?;
        let device = Arc::new(Mutex::new(Block::new(d.opts.clone(), file)?));
        let id = &d.opts.drive_id;
        let slot = self.attach_and_spawn(
            &device,
            Thread::new(
                format!("virtio-blk{i}"),
                Role::Block,
                DeviceKey::Block(id.clone()),
            ),
            |b| Ok(BlockWorker::new(b)?),
            |at| {
                format!(
                    "drive {id} {at}: {} sectors, {}",
                    lock(&device).capacity_sectors(),
                    if d.opts.read_only {
                        "read-only"
                    } else {
                        "read-write"
                    }
                )
            },
        )?;
        Ok(BlockDevice {
            drive_id: id.clone(),
            device,
            slot,
        })
    }

    /// Network interface `i`, over its own handle on the tap (the
    /// configured tap stays for a retry if this start fails).
    fn net(&mut self, i: usize, n: &NetSpec) -> Result<Arc<Mutex<Net<GuestView>>>, DeviceError> {
        let id = &n.opts.iface_id;
        let tap = n.tap.try_clone().map_err(|source| DeviceError::Dup {
            what: "tap",
            id: id.clone(),
            source,
        })?;
        let mut net = Net::new(n.opts.clone(), tap)?;
        if let Some(link) = &n.mmds {
            net.set_mmds(link.clone());
        }
        let device = Arc::new(Mutex::new(net));
        self.attach_and_spawn(
            &device,
            Thread::new(
                format!("virtio-net{i}"),
                Role::Net,
                DeviceKey::Net(id.clone()),
            ),
            itself,
            |at| format!("network interface {id} {at}"),
        )?;
        Ok(device)
    }

    /// The vsock, over its own handle on the listening socket.
    fn vsock(&mut self, v: &VsockSpec) -> Result<Arc<Mutex<Vsock<GuestView>>>, DeviceError> {
        let listener = v.listener.try_clone().map_err(|source| DeviceError::Dup {
            what: "socket",
            id: "vsock".into(),
            source,
        })?;
        let device = Arc::new(Mutex::new(Vsock::new(v.opts.clone(), listener)?));
        self.attach_and_spawn(
            &device,
            Thread::new("virtio-vsock".into(), Role::Vsock, DeviceKey::Vsock),
            itself,
            |at| {
                format!(
                    "vsock (guest CID {}) {at}, host side {}",
                    v.opts.guest_cid,
                    v.opts.uds_path.display()
                )
            },
        )?;
        self.fault_at(faults::START_FAILS_AT_VSOCK)?;
        Ok(device)
    }

    /// The entropy device.
    fn rng(
        &mut self,
        limiter: &RateLimiterConfig,
    ) -> Result<Arc<Mutex<Rng<GuestView>>>, DeviceError> {
        let device = Arc::new(Mutex::new(Rng::new(limiter)?));
        self.attach_and_spawn(
            &device,
            Thread::new("virtio-rng".into(), Role::Entropy, DeviceKey::Rng),
            itself,
            |at| format!("entropy device {at}"),
        )?;
        Ok(device)
    }

    /// The virtio-mem devices, one per part of the hotplug region, over one
    /// sink that frees through the discard pool.
    fn hotplug(
        &mut self,
        spec: &HotplugSpec,
        discard: Arc<PoolSink>,
    ) -> Result<Hotplug, DeviceError> {
        let memory = self.memory;
        let slots = Arc::new(
            HotplugSlots::new(
                self.vm,
                memory,
                spec.slot_bytes,
                discard.clone(),
                spec.dirty_log,
            )
            .map_err(|e| DeviceError::Hotplug(e.to_string()))?,
        );
        self.started.hotplug_slots = Some(slots.clone());
        // Guest node g is the g-th distinct host node of RAM in address order
        // (as the SRAT numbers them).
        let mut guest_nodes: Vec<u32> = Vec::new();
        for s in memory.slices() {
            if !guest_nodes.contains(&s.slice().node) {
                guest_nodes.push(s.slice().node);
            }
        }
        let mut devices = Vec::new();
        let mut unplugged_accesses = None;
        for (i, part) in memory.hotplug().iter().enumerate() {
            let p = part.slice();
            let node_id = guest_nodes.iter().position(|&n| n == p.node).unwrap_or(0) as u16;
            let opts = MemOptions {
                region_addr: p.guest_addr,
                region_bytes: p.len,
                block_bytes: spec.block_bytes,
                slot_bytes: spec.slot_bytes,
                node_id,
            };
            let device = VirtioMem::new(opts, slots.clone())
                .map_err(|e| DeviceError::Hotplug(e.to_string()))?;
            slots.watch(device.shared_metrics());
            let device = Arc::new(Mutex::new(device));
            let name = format!("virtio-mem{i}");
            let slot = self.attach_and_spawn(
                &device,
                Thread::new(name, Role::Mem, DeviceKey::Mem(i)),
                |d| Ok(MemWorker::new(d)),
                |at| {
                    format!(
                        "virtio-mem{i} {at}: {} MiB at {:#x} on host node {} (guest node {node_id}), blocks of {} MiB, slots of {} MiB",
                        p.len >> 20,
                        p.guest_addr,
                        p.node,
                        spec.block_bytes >> 20,
                        spec.slot_bytes >> 20
                    )
                },
            )?;
            // What the guest touches outside the part's memslots reads zeros.
            unplugged_accesses = Some(self.mmio.add_unplugged(p.guest_addr, p.len));
            devices.push(HotplugDevice {
                device,
                slot,
                host_node: p.node,
            });
        }
        self.fault_at(faults::START_FAILS_AT_HOTPLUG)?;
        Ok(Hotplug {
            devices,
            slots,
            discard,
            total_size_mib: (spec.total_bytes >> 20) as u32,
            block_size_mib: (spec.block_bytes >> 20) as u32,
            slot_size_mib: (spec.slot_bytes >> 20) as u32,
            unplugged_accesses: unplugged_accesses.unwrap_or_default(),
        })
    }
}

/// Puts `device` on the bus in the next slot behind its own transport,
/// registers its queue notifications and interrupt with KVM, and returns
/// the slot, clones of its queue eventfds (for its thread) and a new exit
/// eventfd for that thread.
fn attach(
    mmio: &mut MmioBus,
    vm: &Vm,
    memory: &GuestMemory,
    device: Arc<Mutex<dyn VirtioDevice<GuestView>>>,
) -> Result<(MmioSlot, Vec<EventFd>, EventFd), DeviceError> {
    let irq = EventFd::new(EFD_NONBLOCK).map_err(DeviceError::EventFd)?;
    let transport = MmioTransport::new(device, memory.view(), irq)?;
    let (queue_evts, irq) = clones(&transport)?;
    let interrupt = transport.interrupt().clone();
    let slot = mmio.add(Box::new(transport))?;
    interrupt.wake_on(mmio.wake_hub(), slot.index());
    register(vm, slot, &queue_evts, &irq)?;
    let exit = EventFd::new(EFD_NONBLOCK).map_err(DeviceError::EventFd)?;
    Ok((slot, queue_evts, exit))
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

/// Starts device thread `name` running `work` under `role`'s filter.
fn spawn(
    name: String,
    role: Role,
    exit: EventFd,
    work: impl FnOnce() + Send + 'static,
) -> Result<DeviceThread, DeviceError> {
    let (ended_tx, ended) = std::sync::mpsc::channel::<()>();
    let thread = std::thread::Builder::new()
        .name(name.clone())
        .spawn(move || {
            crate::seccomp::install_thread(role);
            let _ended = ended_tx;
            work();
        })
        .map_err(|source| DeviceError::Spawn {
            name: name.clone(),
            source,
        })?;
    Ok(DeviceThread {
        name,
        exit,
        ended,
        thread: Some(thread),
    })
}
