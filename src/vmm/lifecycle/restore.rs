//! `PUT /snapshot/load`'s build, on the `start` job's thread: what
//! [`super::builder::start_microvm`] does for a boot, from a snapshot's
//! state instead of a kernel. Guest memory comes from the memory file
//! (mapped privately, served by a uffd handler, or read in eagerly by the
//! per-node workers); the VM's irqchip, PIT and clock, each device and
//! each vCPU are put back as they were; the vCPUs start held by the pause
//! gate unless `resume_vm` asked otherwise. Whatever fails drops what was
//! built in the one teardown order, as a failed start does.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::builder::{
    linux_irqchip, pio_devices, register_slots, slice_infos, spawn_vcpus, MicroVm, StartContext,
    StartError, Started,
};
use super::teardown::Teardown;
use crate::devices::console::CONSOLE_BUFFER_BYTES;
use crate::devices::{ConsoleWriter, SerialIrq};
use crate::memory::snapshot::FileRegion;
use crate::memory::{GuestMemory, MemoryOptions, NodeSlice, SnapshotMemory};
use crate::vmm::devices::Devices;
use crate::vmm::snapshot_state::SnapshotState;
use crate::vstate::vcpu::{restore_vcpu, VcpuControl, Vcpus};
use crate::vstate::vm::Vm;

/// What a load restores.
pub struct RestoreSpec {
    /// The state file's contents, checked.
    pub state: Arc<SnapshotState>,
    /// Where guest memory comes from.
    pub memory: SnapshotMemory,
    /// Start the vCPUs running (else paused).
    pub resume: bool,
}

/// Builds the microVM `spec.state` describes and starts its vCPUs (held,
/// unless `spec.resume`).
pub fn restore_microvm(ctx: StartContext, spec: RestoreSpec) -> Result<Started, StartError> {
    let StartContext {
        config,
        kvm,
        topology,
        console_sinks,
        on_first_output,
        events,
        events_ready,
        cancel,
        devices: device_specs,
        ..
    } = ctx;
    let state = &spec.state;
    let console = ConsoleWriter::spawn(CONSOLE_BUFFER_BYTES, console_sinks, on_first_output)
        .map_err(StartError::Console)?;
    let machine = &config.machine_config;
    let vm = Vm::create(&kvm)?;
    let regions: Vec<FileRegion> = state
        .memory
        .iter()
        .map(|m| FileRegion {
            slice: NodeSlice {
                node: 0,
                guest_addr: m.guest_addr,
                len: m.len,
            },
            file_offset: m.file_offset,
        })
        .collect();
    let memory = GuestMemory::from_snapshot(
        &MemoryOptions::from(&config),
        &topology,
        &regions,
        spec.memory,
    )
    .map_err(|e| StartError::Restore(format!("guest memory: {e}")))?;
    let uffd_handler = match memory.uffd_handler_connection() {
        Some(fd) => Some(
            fd.try_clone_to_owned()
                .map_err(|e| StartError::Restore(format!("the uffd handler's connection: {e}")))?,
        ),
        None => None,
    };
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
    if cancel.load(Ordering::Acquire) {
        return Ok(Started::Cancelled(parts));
    }
    register_slots(vm, memory, machine.track_dirty_pages)?;
    let linux = state.vm.irqchip.is_some();
    let serial_irq = if linux {
        linux_irqchip(vm)?
    } else {
        SerialIrq::None
    };
    let (i8042, serial, pio) = pio_devices(console, serial_irq)?;
    let devices = parts
        .devices
        .insert(Devices::build(&device_specs, pio, vm, memory, &topology)?);
    let bus = devices.buses.clone();
    // Firecracker's order: the vCPUs, then the VM (its irqchip after the
    // LAPICs), then the devices (whose restore may signal an irqfd the
    // irqchip must not then forget); the threads start last.
    let mut fds = Vec::with_capacity(state.vcpus.len());
    for (index, vcpu_state) in (0..machine.vcpu_count).zip(&state.vcpus) {
        let fd = vm.create_vcpu(index)?;
        restore_vcpu(&fd, index, vcpu_state)?;
        fds.push((index, fd));
    }
    vm.restore_state(&state.vm)
        .map_err(|e| StartError::Restore(format!("VM: {e}")))?;
    devices.restore_state(&state.devices)?;
    let slices = slice_infos(memory, &config, None);
    let control = Arc::new(VcpuControl::new());
    if !spec.resume {
        // Held before the first entry: `GET /` says Paused from the start.
        control.pause_gate().set(true);
    }
    let vcpus = parts.vcpus.insert(Vcpus::new(control));
    spawn_vcpus(vcpus, fds, &bus, &events, &events_ready, memory)?;
    Ok(Started::Running(MicroVm {
        parts,
        i8042,
        console_input: linux.then_some(serial),
        slices,
        uffd_handler,
    }))
}
