//! Guest memory: the guest physical map ([`layout`]), the host NUMA topology
//! ([`numa`]), the partition of guest RAM into per-node slices and chunks
//! ([`plan`]), its own option types ([`options`]), admission against what
//! the process may get ([`admission`]), the owned mappings ([`mapping`]) and
//! their owner ([`guest`], its error in [`error`]) with its vm-memory view
//! ([`view`]) and memslots ([`slots`]), the parallel per-node [`populate`] and [`reclaim`]
//! executors, the [`snapshot`] memory file written and loaded per node (and a
//! restored guest's memory built from it: lazily, eagerly, or by a page fault
//! handler over a [`uffd`]), and the [`discard`] pool that frees what a running guest
//! gives back, in the one guest range type of the crate ([`range`]). It knows no file format: the config file's types are
//! converted into [`MemoryOptions`] and [`ReclaimOptions`] by `config`, and
//! its reports into the API's JSON by `api::shapes`.
//!
//! Threads: populate and reclaim run scoped worker threads
//! (`populate-n{node}-{i}`, `reclaim-n{node}-{i}`) pinned to their node's
//! CPUs; they share only atomic chunk queues and the atomic
//! [`PopulateProgress`] / [`ReclaimProgress`], which another thread may read
//! while they run (and a cancel flag for populate). Worker errors and panics
//! come back to the caller at join. Writing and loading a snapshot's
//! memory file runs such workers too (`memsave-n{node}-{i}`,
//! `memload-n{node}-{i}`), each on its own node's queue only. The discard pool's long-lived workers
//! (`discard-n{node}-{i}`, pinned the same way) take parts from bounded
//! per-node queues and end each batch from a drop guard.

pub mod admission;
pub mod discard;
pub mod error;
pub mod gmem;
pub mod guest;
pub mod hotplug;
pub mod layout;
pub mod mapping;
pub mod numa;
pub mod options;
pub mod pagemap;
pub mod plan;
pub mod populate;
pub mod progress;
pub mod range;
pub mod reclaim;
pub mod slots;
pub mod snapshot;
mod sys;
pub mod uffd;
pub mod view;
mod workers;

pub use admission::AdmissionError;
pub use discard::{
    DiscardDone, DiscardError, DiscardOptions, DiscardOutcome, DiscardPool, DiscardPrelude,
    DiscardSnapshot, NodeDiscard,
};
pub use gmem::{GuestMemfdSource, GuestMemfdSupport, NumaBinding, Placement};
pub use guest::{GuestMemory, GuestMemoryError};
pub use hotplug::{HotplugLayoutError, HotplugOptions};
pub use mapping::{Contents, SliceMapping, Stripe};
pub use numa::{host_has_node, HostNode, HostTopology, NumaError, TopologySource};
pub use options::{Backing, MemoryOptions, NumaPolicy, PageSize};
pub use plan::{NodeSlice, PlanError};
pub use populate::{PopulateError, PopulateProgress, PopulateStats};
pub use progress::{NodeReport, ReclaimProgress, ReclaimReport, ReclaimState};
pub use range::GuestRange;
pub use reclaim::{Failures, FreeMethod, HostRange, ReclaimError, ReclaimOptions};
pub use slots::{GmemBinding, GuestSlot, MAX_SLOT_BYTES};
pub use snapshot::{
    FileRegion, MemoryFileError, MemoryFileNode, MemoryFileOptions, MemoryFileReport, RestoreError,
    SnapshotMemory,
};
pub use uffd::{GuestRegionUffdMapping, UffdError};
pub use view::{GuestLease, GuestView, PluggedSlots, ViewMemory};
