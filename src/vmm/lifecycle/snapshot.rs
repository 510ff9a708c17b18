//! `PUT /snapshot/create`: the `start` job runner takes the paused
//! microVM, holds its devices, saves the vCPUs', the VM's and the devices'
//! state, writes the memory file with the per-node workers and the state
//! file, and hands the microVM back, still paused, whatever happened.
//!
//! The files were made by the `files` thread under temporary names
//! ([`crate::vmm::snapshot_files`]); the job writes and syncs them and
//! hands them back with the microVM, and the `files` thread renames them
//! (or removes them after a failure): no path is opened, renamed or
//! removed on this thread.

use std::io::Write;
use std::time::{Duration, Instant};

use super::builder::MicroVm;
use crate::config::VmConfig;
use crate::memory::snapshot::{MemoryFileError, MemoryFileOptions, MemoryFileReport};
use crate::memory::HostTopology;
use crate::snapshot::state_file::{encode, StateFileError};
use crate::vmm::snapshot_files::{Partial, SnapshotFiles};
use crate::vmm::snapshot_state::{memory_regions, SnapshotState};
use crate::vstate::vcpu::VCPU_STOP_TIMEOUT;

/// Why a create failed (the guest stays paused, whole; no file was left).
#[derive(Debug, thiserror::Error)]
pub enum CreateError {
    /// A part of the running microVM is not there (a bug).
    #[error("the microVM has no {0}")]
    PartMissing(&'static str),
    /// The devices could not be held or their state saved.
    #[error("devices: {0}")]
    Devices(#[from] crate::vmm::devices::DeviceError),
    /// The vCPUs' state could not be saved.
    #[error("vCPUs: {0}")]
    Vcpus(String),
    /// The VM's state could not be saved.
    #[error("VM: {0}")]
    Vm(String),
    /// A file could not be written or synced.
    #[error("{what} {path}: {source}")]
    File {
        /// `snapshot_path` or `mem_file_path`.
        what: &'static str,
        /// The path.
        path: std::path::PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The memory file could not be written.
    #[error("mem_file_path {path}: {source}")]
    Memory {
        /// The path.
        path: std::path::PathBuf,
        /// Why.
        source: MemoryFileError,
    },
    /// The state could not be encoded.
    #[error("the state: {0}")]
    State(#[from] StateFileError),
}

/// What the create job needs besides the microVM.
pub struct CreateContext {
    /// Full or Diff (only Full is taken today).
    pub full: bool,
    /// The configuration the microVM runs with.
    pub config: VmConfig,
    /// The host topology (the memory file's workers).
    pub topology: HostTopology,
    /// The memory file's workers per node.
    pub workers_per_node: u32,
    /// `/dev/kvm` (the host's MSR list).
    pub kvm: std::sync::Arc<crate::vstate::vm::KvmDevice>,
}

/// What a create did.
#[derive(Debug)]
pub struct Created {
    /// The memory file's write.
    pub memory: MemoryFileReport,
    /// Bytes of the state file.
    pub state_bytes: u64,
    /// From the job's start to the rename of the state file.
    pub elapsed: Duration,
}

/// The create job: returns the microVM and the files with the result.
pub fn create_job(
    microvm: Box<MicroVm>,
    ctx: CreateContext,
    mut files: SnapshotFiles,
) -> CreateOutcome {
    let result = create(&microvm, &ctx, &mut files);
    (microvm, files, result)
}

fn io_err(p: &Partial) -> impl Fn(std::io::Error) -> CreateError + '_ {
    move |source| CreateError::File {
        what: p.what,
        path: p.path().to_path_buf(),
        source,
    }
}

fn create(
    m: &MicroVm,
    ctx: &CreateContext,
    files: &mut SnapshotFiles,
) -> Result<Created, CreateError> {
    let started = Instant::now();
    let devices = m.devices().ok_or(CreateError::PartMissing("devices"))?;
    let vcpus = m.vcpus().ok_or(CreateError::PartMissing("vCPUs"))?;
    let vm = m.vm().ok_or(CreateError::PartMissing("VM"))?;
    let memory = m.memory().ok_or(CreateError::PartMissing("memory"))?;
    // Nothing of a device touches guest memory from here until `hold`
    // drops, so the state and the memory file agree.
    let hold = devices.hold()?;
    let msrs = ctx
        .kvm
        .msr_index_list()
        .map_err(|e| CreateError::Vcpus(e.to_string()))?;
    let vcpu_states = vcpus
        .save_states(&msrs, VCPU_STOP_TIMEOUT)
        .map_err(|e| CreateError::Vcpus(e.to_string()))?;
    let vm_state = vm
        .save_state()
        .map_err(|e| CreateError::Vm(e.to_string()))?;
    let device_states = devices.save_state(&hold)?;
    let mut config = ctx.config.clone();
    config.logger = None;
    config.metrics = None;
    let state = SnapshotState {
        teravm_version: env!("CARGO_PKG_VERSION").to_string(),
        memory: memory_regions(config.machine_config.mem_bytes()),
        config,
        vcpus: vcpu_states,
        vm: vm_state,
        devices: device_states,
    };
    let bytes = encode(&state)?;
    log::debug!("snapshot: state saved in {:?}", started.elapsed());
    let opts = MemoryFileOptions {
        workers_per_node: ctx.workers_per_node,
        chunk_bytes: None,
    };
    let report = memory
        .write_memory_file(&files.mem.file, &opts, &ctx.topology)
        .map_err(|source| CreateError::Memory {
            path: files.mem.path().to_path_buf(),
            source,
        })?;
    log::debug!(
        "snapshot: memory file written in {:?} ({} MiB in {} extents)",
        report.elapsed,
        report.copied_bytes >> 20,
        report.nodes.iter().map(|n| n.extents).sum::<u64>()
    );
    files.mem.file.sync_all().map_err(io_err(&files.mem))?;
    log::debug!("snapshot: memory file synced at {:?}", started.elapsed());
    let st = &mut files.state;
    st.file.write_all(&bytes).map_err(io_err(st))?;
    st.file.sync_all().map_err(io_err(st))?;
    drop(hold);
    Ok(Created {
        memory: report,
        state_bytes: bytes.len() as u64,
        elapsed: started.elapsed(),
    })
}

/// What the create job hands back: the microVM, its files, and how the
/// create went.
pub type CreateOutcome = (Box<MicroVm>, SnapshotFiles, Result<Created, CreateError>);
