//! Builds and starts a microVM from a validated [`VmConfig`]: the KVM VM,
//! guest memory (per-node slices, bound, optionally populated), memslots,
//! the boot state (the firmware's, or a Linux kernel's with the in-kernel
//! irqchip and PIT), the port I/O bus and its devices, and the vCPU threads. Anything built before a failure is torn down by `Drop` (guest
//! memory is unmapped, started vCPUs are stopped).

use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde::Serialize;
use vmm_sys_util::eventfd::EventFd;

use crate::config::{NumaPolicy, VmConfig};
use crate::devices::bus::BusError;
use crate::devices::{microvm_bus, SerialConsole, SerialOut, I8042};
use crate::memory::layout::ram_regions;
use crate::memory::{GuestMemory, HostTopology, PopulateStats};
use crate::vstate::boot::{write_boot_state, BootError};
use crate::vstate::linux::{self, params::kernel_cmdline, KernelSpec, LinuxError};
use crate::vstate::vcpu::{
    configure_vcpu, stop_vcpus, GuestEntry, VcpuControl, VcpuError, VcpuEvent, VcpuHandle,
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
    /// A device could not be put on the bus.
    #[error("devices: {0}")]
    Bus(#[from] BusError),
    /// A vCPU could not be set up or started.
    #[error(transparent)]
    Vcpu(#[from] VcpuError),
}

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
}

/// A running microVM.
pub struct MicroVm {
    /// The KVM VM.
    pub vm: Vm,
    /// Guest RAM.
    pub memory: GuestMemory,
    /// The vCPU threads.
    pub vcpus: Vec<VcpuHandle>,
    /// Stop and wake requests for the vCPUs.
    pub control: Arc<VcpuControl>,
    /// The keyboard controller, to send Ctrl-Alt-Del.
    pub i8042: Arc<Mutex<I8042>>,
    /// The slices, for `GET /memory`.
    pub slices: Vec<SliceInfo>,
    /// What populate did, if asked.
    pub populate: Option<PopulateStats>,
}

impl MicroVm {
    /// Stops and joins the vCPU threads; returns how many panicked.
    pub fn stop_vcpus(&mut self) -> usize {
        stop_vcpus(&self.control, std::mem::take(&mut self.vcpus))
    }
}

/// Builds the microVM described by `config` and starts its vCPUs.
pub fn start_microvm(
    config: &VmConfig,
    topology: &HostTopology,
    serial_out: SerialOut,
    events: Sender<VcpuEvent>,
    events_ready: &EventFd,
) -> Result<MicroVm, StartError> {
    let machine = &config.machine_config;
    let vm = Vm::new()?;
    let memory = GuestMemory::new(machine, &config.memory, topology)?;
    let populate = if config.memory.populate {
        let stats = memory.populate(config.reclaim.workers_per_node, topology)?;
        log::info!(
            "populated {} MiB in {} ms with {} workers",
            stats.bytes >> 20,
            stats.elapsed_ms,
            stats.workers
        );
        Some(stats)
    } else {
        None
    };
    let slots: Vec<MemorySlot> = memory
        .slices()
        .iter()
        .map(|s| MemorySlot {
            guest_addr: s.slice.guest_addr,
            size: s.slice.len,
            host_addr: s.host_addr as u64,
        })
        .collect();
    // SAFETY: the mappings live in `memory`, which the MicroVm keeps until
    // the vCPUs are stopped; reclaim unmaps them only after that, and KVM
    // follows an munmap through its MMU notifier.
    unsafe { vm.register_memory(&slots) }?;
    let entry = match &config.boot_source.kernel_image_path {
        None => {
            let regions: Vec<(u64, u64)> = ram_regions(machine.mem_bytes())
                .iter()
                .map(|r| (r.guest_addr, r.len))
                .collect();
            GuestEntry::Firmware(write_boot_state(
                memory.vm_memory(),
                &regions,
                usize::from(machine.vcpu_count),
                machine.mem_size_mib,
                &config.boot_source.boot_args,
            )?)
        }
        Some(kernel) => {
            vm.setup_irqchip()?;
            let spec = KernelSpec {
                kernel: kernel.clone(),
                initrd: config.boot_source.initrd_path.clone(),
                cmdline: kernel_cmdline(&config.boot_source.boot_args).to_string(),
            };
            let mut slices: Vec<(u64, u64)> = memory
                .slices()
                .iter()
                .map(|s| (s.slice.guest_addr, s.slice.len))
                .collect();
            slices.sort_unstable();
            let (entry, map) = linux::load(memory.vm_memory(), &spec, &slices, machine.vcpu_count)?;
            log::info!(
                "kernel {} ({:?}) entered at {:#x}; command line: {}",
                kernel.display(),
                entry.format,
                entry.entry,
                spec.cmdline
            );
            for e in &map {
                log::info!("e820: {}", e.linux_line());
            }
            GuestEntry::Linux(entry)
        }
    };

    let i8042 = Arc::new(Mutex::new(I8042::new()));
    let serial = Arc::new(Mutex::new(SerialConsole::new(serial_out)));
    let bus = Arc::new(microvm_bus(serial, i8042.clone(), Instant::now())?);

    let slices = memory
        .slices()
        .iter()
        .map(|s| SliceInfo {
            guest_addr: s.slice.guest_addr,
            size_bytes: s.slice.len,
            host_node: s.slice.node,
            policy: config.memory.numa_policy,
        })
        .collect();
    let cpuid = vm.supported_cpuid()?;
    let control = Arc::new(VcpuControl::new());
    let mut microvm = MicroVm {
        vm,
        memory,
        vcpus: Vec::new(),
        control,
        i8042,
        slices,
        populate,
    };
    for index in 0..machine.vcpu_count {
        let started = (|| {
            let fd = microvm.vm.create_vcpu(index)?;
            configure_vcpu(&fd, index, &cpuid, &entry)?;
            let ready = events_ready
                .try_clone()
                .map_err(|source| VcpuError::Spawn { index, source })?;
            Ok::<_, StartError>(VcpuHandle::spawn(
                index,
                fd,
                bus.clone(),
                microvm.control.clone(),
                events.clone(),
                ready,
            )?)
        })();
        match started {
            Ok(handle) => microvm.vcpus.push(handle),
            Err(e) => {
                // Stop the vCPUs already running; dropping `microvm` then
                // unmaps guest memory.
                microvm.stop_vcpus();
                return Err(e);
            }
        }
    }
    Ok(microvm)
}
