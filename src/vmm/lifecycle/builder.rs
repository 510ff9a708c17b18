//! Builds and starts a microVM from a validated [`VmConfig`], on the `start`
//! job's thread: the KVM VM, guest memory (per-node slices, bound,
//! optionally populated), memslots, the boot state (the firmware's, or a
//! Linux kernel's with the in-kernel irqchip and PIT), the port I/O bus and
//! its devices, and the vCPU threads. A shutdown during start cuts it short
//! at the next step and hands what was built to reclaim. Anything built
//! before a failure is torn down by `Drop` (started vCPUs are stopped first,
//! then guest memory is unmapped).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde::Serialize;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::progress_line::{self, ProgressLine};
use crate::config::{NumaPolicy, VmConfig};
use crate::devices::bus::BusError;
use crate::devices::console::CONSOLE_BUFFER_BYTES;
use crate::devices::{
    microvm_bus, ConsoleOut, ConsoleSink, ConsoleWriter, SerialConsole, SerialIrq, I8042,
};
use crate::memory::layout::ram_regions;
use crate::memory::{GuestMemory, HostTopology, MemoryOptions, PopulateProgress};
use crate::vstate::boot::{write_boot_state, BootError};
use crate::vstate::linux::acpi::{guest_nodes, vcpu_node};
use crate::vstate::linux::params::{kernel_cmdline, with_params};
use crate::vstate::linux::{self, ImageFile, KernelSpec, LinuxError};
use crate::vstate::template::CpuSetup;

use super::teardown::Teardown;
use crate::devices::virtio::net::Net;
use crate::memory::GuestView;
use crate::vmm::devices::{BalloonDevice, BlockDevice, DeviceError, DeviceSpecs, Devices};
use crate::vstate::vcpu::{
    configure_vcpu, GuestEntry, VcpuControl, VcpuError, VcpuEvent, VcpuHandle, Vcpus,
};
use crate::vstate::vm::{MemorySlot, Vm, VmError};

/// Errors of building and starting a microVM.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// KVM failed.
    #[error(transparent)]
    Vm(#[from] VmError),
    /// Guest memory could not be mapped or bound.
    #[error("guest memory: {0}")]
    Memory(#[from] crate::memory::GuestMemoryError),
    /// Populating guest memory failed.
    #[error("populate: {0}")]
    Populate(#[from] crate::memory::PopulateError),
    /// The firmware's boot state could not be written.
    #[error("boot: {0}")]
    Boot(#[from] BootError),
    /// The Linux kernel could not be loaded.
    #[error("kernel: {0}")]
    Linux(#[from] LinuxError),
    /// The serial port's interrupt `EventFd` could not be made.
    #[error("cannot create the serial port's interrupt eventfd: {0}")]
    SerialIrq(std::io::Error),
    /// A device could not be put on the bus.
    #[error("devices: {0}")]
    Bus(#[from] BusError),
    /// A vCPU could not be set up or started.
    #[error(transparent)]
    Vcpu(#[from] VcpuError),
    /// The `start` job panicked (what it built was dropped as it unwound).
    #[error("{0}")]
    Panicked(String),
    /// The console writer could not be started.
    #[error(transparent)]
    Console(#[from] crate::devices::console::ConsoleError),
    /// The devices could not be built.
    #[error("devices: {0}")]
    Devices(#[from] DeviceError),
    /// The CPU template does not fit the host.
    #[error(transparent)]
    Template(#[from] crate::vstate::template::TemplateError),
    /// A part of the microVM was not there right after it was made (a bug).
    #[error("a part of the microVM is missing right after it was made")]
    PartMissing,
    /// A snapshot's state could not be put back.
    #[error("restore: {0}")]
    Restore(String),
    /// A kernel is configured but its files were not opened (a bug).
    #[error("the boot source's kernel was not opened")]
    BootFilesMissing,
}

/// The kernel and initrd of the boot source in force, open.
#[derive(Debug, Clone)]
pub struct BootFiles {
    /// The kernel.
    pub kernel: ImageFile,
    /// The initrd, if any.
    pub initrd: Option<ImageFile>,
}

/// COM1's interrupt line (ISA IRQ 4, IOAPIC pin 4 and PIC input 4 in KVM's
/// default routing).
const COM1_GSI: u32 = 4;

/// One slice of guest RAM as `GET /memory` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SliceInfo {
    /// Guest physical address.
    pub guest_addr: u64,
    /// Bytes.
    pub size_bytes: u64,
    /// The host node it is placed on.
    pub host_node: u32,
    /// The binding policy.
    pub policy: NumaPolicy,
    /// What backs it.
    pub backing: crate::config::Backing,
    /// Its memfds or guest_memfds (absent for anonymous memory).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub files: Option<usize>,
    /// How the binding took effect: `mbind` on the mapping, the file's own
    /// policy (guest_memfd), ignored by the kernel (guest_memfd on a
    /// kernel without file policies), or not asked.
    pub numa_binding: crate::memory::NumaBinding,
    /// Where sampled pages landed, checked after a populate.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub placement: Option<crate::memory::Placement>,
    /// The guest NUMA node it belongs to (Linux guests, which see one node
    /// per host node in their ACPI SRAT); absent for the firmware.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub guest_node: Option<u32>,
}

/// A running microVM: every part, held in the one [`Teardown`] order, so
/// whatever path drops it (a failed vCPU, a panic) or hands it to reclaim
/// takes that order.
pub struct MicroVm {
    /// The vCPUs, devices, console, VM and guest memory (all present).
    pub(super) parts: Teardown,
    /// The keyboard controller, to send Ctrl-Alt-Del.
    pub i8042: Arc<Mutex<I8042>>,
    /// COM1, for console input (Linux guests; the firmware reads nothing).
    pub console_input: Option<Arc<Mutex<SerialConsole>>>,
    /// The slices, for `GET /memory`.
    pub slices: Vec<SliceInfo>,
    /// A guest restored through a uffd handler: a clone of its
    /// connection, which the event loop watches for the handler's end.
    pub uffd_handler: Option<std::os::fd::OwnedFd>,
}

impl MicroVm {
    /// The vCPU threads.
    pub fn vcpus(&self) -> Option<&Vcpus> {
        self.parts.vcpus.as_ref()
    }

    /// The devices and their threads.
    pub fn devices(&self) -> Option<&Devices> {
        self.parts.devices.as_ref()
    }

    /// The balloon, if configured.
    pub fn balloon(&self) -> Option<&BalloonDevice> {
        self.devices().and_then(|d| d.balloon.as_ref())
    }

    /// The virtio-mem devices, if memory hotplug is configured.
    pub fn hotplug(&self) -> Option<&crate::vmm::devices::Hotplug> {
        self.devices().and_then(|d| d.hotplug.as_ref())
    }

    /// The drives.
    pub fn blocks(&self) -> &[BlockDevice] {
        self.devices().map_or(&[], |d| &d.blocks)
    }

    /// The network interfaces.
    pub fn nets(&self) -> &[Arc<Mutex<Net<GuestView>>>] {
        self.devices().map_or(&[], |d| &d.nets)
    }

    /// The guest console's writer thread.
    pub fn console(&self) -> Option<&ConsoleWriter> {
        self.parts.console.as_ref()
    }

    /// The KVM VM.
    pub fn vm(&self) -> Option<&Vm> {
        self.parts.vm.as_ref()
    }

    /// Guest memory.
    pub fn memory(&self) -> Option<&GuestMemory> {
        self.parts.memory.as_ref()
    }
}

impl From<MicroVm> for Teardown {
    fn from(m: MicroVm) -> Self {
        m.parts
    }
}

/// Everything the `start` job needs, moved into it.
pub struct StartContext {
    /// The configuration to start.
    pub config: VmConfig,
    /// The kernel and initrd of `config.boot_source`, already open.
    pub boot_files: Option<BootFiles>,
    /// `/dev/kvm`, opened at start-up.
    pub kvm: Arc<crate::vstate::vm::KvmDevice>,
    /// The host topology.
    pub topology: HostTopology,
    /// Where the console writer (started by the job) writes.
    pub console_sinks: Vec<ConsoleSink>,
    /// Run on the console thread at the guest's first output (`--boot-timer`).
    pub on_first_output: Option<Box<dyn FnOnce(Instant) + Send>>,
    /// Where vCPUs report that they ended the VM.
    pub events: Sender<VcpuEvent>,
    /// Written after each vCPU event.
    pub events_ready: EventFd,
    /// Set by a shutdown during start: the job stops at its next check.
    pub cancel: Arc<AtomicBool>,
    /// Populate's progress, for the API.
    pub populate: Arc<PopulateProgress>,
    /// The virtio devices to build.
    pub devices: DeviceSpecs,
}

/// How a start ended.
pub enum Started {
    /// The microVM runs.
    Running(MicroVm),
    /// A shutdown came during start; what was built, to be reclaimed.
    Cancelled(Teardown),
}

/// Builds the microVM described by `ctx.config` and starts its vCPUs,
/// checking `ctx.cancel` between the long steps.
pub fn start_microvm(ctx: StartContext) -> Result<Started, StartError> {
    let StartContext {
        config,
        boot_files,
        kvm,
        topology,
        console_sinks,
        on_first_output,
        events,
        events_ready,
        cancel,
        populate,
        devices: device_specs,
    } = ctx;
    let console = ConsoleWriter::spawn(CONSOLE_BUFFER_BYTES, console_sinks, on_first_output)
        .map_err(StartError::Console)?;
    let cancelled = || cancel.load(Ordering::Acquire);
    let machine = &config.machine_config;
    let vm = Vm::create(&kvm)?;
    let cpu = CpuSetup::new(
        vm.supported_cpuid()?,
        machine.smt,
        machine.cpu_template,
        config.cpu_config.as_ref(),
    )?;
    let memory = GuestMemory::new_with_hotplug(
        &MemoryOptions::from(&config),
        &topology,
        Some(&vm),
        device_specs.hotplug.map(|h| h.memory_options()),
    )?;
    // From here on, whatever is built goes into `parts`: an error return
    // drops it (the one teardown order), a shutdown hands it to reclaim.
    let mut parts = Teardown {
        vcpus: None,
        devices: None,
        console: Some(console),
        vm: Some(vm),
        memory: Some(memory),
    };
    let (Some(vm), Some(memory), Some(console)) = (
        parts.vm.as_mut(),
        parts.memory.as_ref(),
        parts.console.as_ref(),
    ) else {
        return Err(StartError::PartMissing);
    };
    if cancelled() {
        return Ok(Started::Cancelled(parts));
    }
    if config.memory.populate {
        let shown = populate.clone();
        let _line = ProgressLine::spawn(move |t| progress_line::populate_text(&shown, t));
        let stats = memory.populate(
            config.reclaim.workers_per_node,
            &topology,
            &populate,
            &cancel,
        )?;
        log::info!(
            "populated {} MiB in {} ms with {} workers",
            stats.bytes >> 20,
            stats.elapsed_ms,
            stats.workers
        );
        if cancelled() {
            return Ok(Started::Cancelled(parts));
        }
    }
    register_slots(vm, memory, machine.track_dirty_pages)?;
    // The firmware: no interrupt line, no guest NUMA. A kernel: COM1's IRQ 4
    // through an irqfd, and a guest node per host node (ACPI SRAT).
    let (entry, serial_irq, nodes) = match &config.boot_source.kernel_image_path {
        None => {
            let regions: Vec<(u64, u64)> = ram_regions(machine.mem_bytes())
                .iter()
                .map(|r| (r.guest_addr, r.len))
                .collect();
            let entry = GuestEntry::Firmware(write_boot_state(
                memory.view().mem(),
                &regions,
                usize::from(machine.vcpu_count),
                machine.mem_size_mib,
                &config.boot_source.boot_args,
            )?);
            (entry, SerialIrq::None, None)
        }
        Some(kernel) => {
            let serial_irq = linux_irqchip(vm)?;
            let files = boot_files.ok_or(StartError::BootFilesMissing)?;
            let cmdline = with_params(
                kernel_cmdline(&config.boot_source.boot_args),
                &device_specs.cmdline_params(),
            )
            .map_err(LinuxError::from)?;
            let spec = KernelSpec {
                kernel: files.kernel,
                initrd: files.initrd,
                cmdline,
            };
            let mut slices: Vec<(u64, u64, u32)> = memory
                .slices()
                .iter()
                .map(|s| (s.slice().guest_addr, s.slice().len, s.slice().node))
                .collect();
            slices.sort_unstable();
            let hotplug: Vec<(u64, u64, u32)> = memory
                .hotplug()
                .iter()
                .map(|s| (s.slice().guest_addr, s.slice().len, s.slice().node))
                .collect();
            let (entry, map) = linux::load(
                memory.view().mem(),
                &spec,
                &slices,
                &hotplug,
                machine.vcpu_count,
            )?;
            log::info!(
                "kernel {} ({:?}) entered at {:#x} through {}; command line: {}",
                kernel.display(),
                entry.format,
                entry.entry,
                entry.protocol,
                spec.cmdline
            );
            for e in &map {
                log::info!("e820: {}", e.linux_line());
            }
            let nodes = guest_nodes(&slices);
            for (g, n) in nodes.iter().enumerate() {
                log::info!(
                    "guest NUMA node {g} = host node {}: {} MiB, vCPUs {:?}",
                    n.host_node,
                    n.ranges.iter().map(|r| r.1).sum::<u64>() >> 20,
                    (0..usize::from(machine.vcpu_count))
                        .filter(|&i| vcpu_node(i, nodes.len()) == g)
                        .collect::<Vec<_>>()
                );
            }
            (GuestEntry::Linux(entry), serial_irq, Some(nodes))
        }
    };

    let linux = nodes.is_some();
    let (i8042, serial, pio) = pio_devices(console, serial_irq)?;
    let devices = parts
        .devices
        .insert(Devices::build(&device_specs, pio, vm, memory, &topology)?);
    let bus = devices.buses.clone();

    let slices = slice_infos(memory, &config, nodes.as_deref());
    let mut fds = Vec::with_capacity(usize::from(machine.vcpu_count));
    for index in 0..machine.vcpu_count {
        // On an error, dropping `parts` stops the vCPUs already running,
        // then the devices, closes the VM and unmaps guest memory.
        let fd = vm.create_vcpu(index)?;
        configure_vcpu(&fd, index, &cpu, &entry)?;
        fds.push((index, fd));
    }
    let vcpus = parts.vcpus.insert(Vcpus::new(Arc::new(VcpuControl::new())));
    spawn_vcpus(vcpus, fds, &bus, &events, &events_ready, memory)?;
    Ok(Started::Running(MicroVm {
        parts,
        i8042,
        console_input: linux.then_some(serial),
        slices,
        uffd_handler: None,
    }))
}

/// Registers guest memory's slots with KVM.
pub(super) fn register_slots(
    vm: &Vm,
    memory: &GuestMemory,
    dirty_log: bool,
) -> Result<(), StartError> {
    let slots: Vec<MemorySlot> = memory
        .slots()
        .iter()
        .map(|s| MemorySlot {
            guest_addr: s.guest_addr,
            size: s.len,
            host_addr: s.host_addr,
            guest_memfd: s.guest_memfd,
            dirty_log,
        })
        .collect();
    // SAFETY: the mappings live in `memory`, which the MicroVm keeps until
    // the vCPUs are stopped; reclaim unmaps them only after that, and KVM
    // follows an munmap through its MMU notifier.
    unsafe { vm.register_memory(&slots) }?;
    Ok(())
}

/// The slices as `GET /memory` shows them.
pub(super) fn slice_infos(
    memory: &GuestMemory,
    config: &VmConfig,
    nodes: Option<&[crate::vstate::linux::acpi::GuestNode]>,
) -> Vec<SliceInfo> {
    memory
        .slices()
        .iter()
        .map(|s| SliceInfo {
            guest_addr: s.slice().guest_addr,
            size_bytes: s.slice().len,
            host_node: s.slice().node,
            policy: config.memory.numa_policy,
            backing: config.memory.backing,
            files: (!s.stripes().is_empty()).then_some(s.stripes().len()),
            numa_binding: s.numa_binding(),
            placement: s.placement(),
            guest_node: nodes.and_then(|nodes| {
                nodes
                    .iter()
                    .position(|n| n.host_node == s.slice().node)
                    .map(|g| g as u32)
            }),
        })
        .collect()
}

/// Starts a thread for each set-up vCPU fd, in `vcpus`.
pub(super) fn spawn_vcpus(
    vcpus: &mut Vcpus,
    fds: Vec<(u8, kvm_ioctls::VcpuFd)>,
    bus: &Arc<crate::devices::Buses>,
    events: &Sender<VcpuEvent>,
    events_ready: &EventFd,
    memory: &GuestMemory,
) -> Result<(), StartError> {
    for (index, fd) in fds {
        let ready = events_ready
            .try_clone()
            .map_err(|source| VcpuError::Spawn { index, source })?;
        vcpus.push(VcpuHandle::spawn(
            index,
            fd,
            bus.clone(),
            vcpus.control().clone(),
            events.clone(),
            ready,
            memory.lease(),
        )?);
    }
    Ok(())
}

/// A Linux guest's in-kernel irqchip and PIT, and COM1's interrupt line
/// (IRQ 4 through an irqfd).
pub(super) fn linux_irqchip(vm: &mut Vm) -> Result<SerialIrq, StartError> {
    vm.setup_irqchip()?;
    let irq = EventFd::new(EFD_NONBLOCK).map_err(StartError::SerialIrq)?;
    vm.register_irqfd(&irq, COM1_GSI)?;
    Ok(SerialIrq::EventFd(irq))
}

/// The keyboard controller, COM1 (writing to the console) and the port
/// I/O bus that holds them.
#[allow(clippy::type_complexity)]
pub(super) fn pio_devices(
    console: &ConsoleWriter,
    serial_irq: SerialIrq,
) -> Result<
    (
        Arc<Mutex<I8042>>,
        Arc<Mutex<SerialConsole>>,
        crate::devices::bus::PioBus,
    ),
    StartError,
> {
    let i8042 = Arc::new(Mutex::new(I8042::new()));
    let serial = Arc::new(Mutex::new(SerialConsole::with_irq(
        ConsoleOut::new(console.buffer().clone()),
        serial_irq,
    )));
    let pio = microvm_bus(serial.clone(), i8042.clone(), Instant::now())?;
    Ok((i8042, serial, pio))
}
