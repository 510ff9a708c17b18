//! `PUT /snapshot/create`: the `start` job runner takes the paused
//! microVM, holds its devices, saves the vCPUs', the VM's and the devices'
//! state, writes the memory file with the per-node workers and the state
//! file, and hands the microVM back, still paused, whatever happened.
//!
//! The files appear whole or not at all: each is written under a
//! temporary name in its directory (`.<name>.partial`, created
//! `O_EXCL`, so no FIFO or existing file is ever opened), synced, then
//! renamed to its name, the memory file first; any failure removes what
//! was written (a memory file already renamed too, when the state file
//! then fails). A temporary name also keeps a guest loaded lazily from the
//! very memory file being overwritten whole: its mapping keeps the old
//! file.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::builder::MicroVm;
use crate::config::VmConfig;
use crate::memory::snapshot::{MemoryFileError, MemoryFileOptions, MemoryFileReport};
use crate::memory::HostTopology;
use crate::snapshot::state_file::{encode, StateFileError};
use crate::snapshot::CreateSnapshotParams;
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
    /// A file could not be made, written, synced or renamed.
    #[error("{what} {path}: {source}")]
    File {
        /// `snapshot_path` or `mem_file_path`.
        what: &'static str,
        /// The path.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The memory file could not be written.
    #[error("mem_file_path {path}: {source}")]
    Memory {
        /// The path.
        path: PathBuf,
        /// Why.
        source: MemoryFileError,
    },
    /// The state could not be encoded.
    #[error("the state: {0}")]
    State(#[from] StateFileError),
}

/// What the create job needs besides the microVM.
pub struct CreateContext {
    /// The request.
    pub params: CreateSnapshotParams,
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

/// The create job: returns the microVM with the result.
pub fn create_job(
    microvm: Box<MicroVm>,
    ctx: CreateContext,
) -> (Box<MicroVm>, Result<Created, CreateError>) {
    let result = create(&microvm, &ctx);
    (microvm, result)
}

fn create(m: &MicroVm, ctx: &CreateContext) -> Result<Created, CreateError> {
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
    let p = &ctx.params;
    let mem = Partial::create("mem_file_path", &p.mem_file_path)?;
    let opts = MemoryFileOptions {
        workers_per_node: ctx.workers_per_node,
        chunk_bytes: None,
    };
    let report = memory
        .write_memory_file(mem.file(), &opts, &ctx.topology)
        .map_err(|source| CreateError::Memory {
            path: p.mem_file_path.clone(),
            source,
        })?;
    mem.sync()?;
    let mut st = Partial::create("snapshot_path", &p.snapshot_path)?;
    st.write_all(&bytes)?;
    st.sync()?;
    drop(hold);
    let mem_final = mem.commit()?;
    if let Err(e) = st.commit() {
        // A memory file without its state is no snapshot: take it back.
        let _ = std::fs::remove_file(&mem_final);
        return Err(e);
    }
    Ok(Created {
        memory: report,
        state_bytes: bytes.len() as u64,
        elapsed: started.elapsed(),
    })
}

/// A file written under a temporary name beside its final one, removed
/// on drop unless committed.
struct Partial {
    what: &'static str,
    file: File,
    temp: PathBuf,
    path: PathBuf,
    committed: bool,
}

impl Partial {
    fn create(what: &'static str, path: &Path) -> Result<Partial, CreateError> {
        let err = |source| CreateError::File {
            what,
            path: path.to_path_buf(),
            source,
        };
        let name = path.file_name().ok_or_else(|| {
            err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "names no file",
            ))
        })?;
        let mut temp_name = std::ffi::OsString::from(".");
        temp_name.push(name);
        temp_name.push(".partial");
        let temp = path.with_file_name(temp_name);
        // A leftover of a create killed mid-way goes.
        let _ = std::fs::remove_file(&temp);
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
            .open(&temp)
            .map_err(err)?;
        Ok(Partial {
            what,
            file,
            temp,
            path: path.to_path_buf(),
            committed: false,
        })
    }

    fn file(&self) -> &File {
        &self.file
    }

    fn io_err(&self, source: std::io::Error) -> CreateError {
        CreateError::File {
            what: self.what,
            path: self.path.clone(),
            source,
        }
    }

    fn write_all(&mut self, bytes: &[u8]) -> Result<(), CreateError> {
        self.file.write_all(bytes).map_err(|e| self.io_err(e))
    }

    fn sync(&self) -> Result<(), CreateError> {
        self.file.sync_all().map_err(|e| self.io_err(e))
    }

    /// Renames it to its name; gives the name.
    fn commit(mut self) -> Result<PathBuf, CreateError> {
        std::fs::rename(&self.temp, &self.path).map_err(|e| self.io_err(e))?;
        self.committed = true;
        Ok(self.path.clone())
    }
}

impl Drop for Partial {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_file(&self.temp);
        }
    }
}

/// What the create job hands back: the microVM, and how the create went.
pub type CreateOutcome = (Box<MicroVm>, Result<Created, CreateError>);
