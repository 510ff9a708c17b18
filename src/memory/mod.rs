//! Guest memory: the guest physical map ([`layout`]), the host NUMA topology
//! ([`numa`]), the partition of guest RAM into per-node slices and chunks
//! ([`plan`]), their mappings ([`guest`]), and the parallel per-node
//! [`populate`] and [`reclaim`] executors.
//!
//! Threads: populate and reclaim run scoped worker threads
//! (`populate-n{node}-{i}`, `reclaim-n{node}-{i}`) pinned to their node's
//! CPUs; they share only atomic chunk queues and the atomic
//! [`ReclaimProgress`], which another thread may read while a reclaim runs.
//! Worker errors and panics come back to the caller at join.

pub mod guest;
pub mod layout;
pub mod numa;
pub mod plan;
pub mod populate;
pub mod progress;
pub mod reclaim;
mod sys;
mod workers;

pub use guest::{GuestMemory, GuestMemoryError, SliceMapping};
pub use numa::{HostNode, HostTopology, NumaError};
pub use plan::{NodeSlice, PlanError};
pub use populate::{PopulateError, PopulateStats};
pub use progress::{NodeReport, ReclaimProgress, ReclaimReport, ReclaimState};
pub use reclaim::{FreeMethod, HostRange, ReclaimError, ReclaimOptions};
