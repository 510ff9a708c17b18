//! Guest memory: the guest physical map, the host NUMA topology, the
//! partition of guest RAM into per-node slices, their mappings, and the
//! parallel per-node populate and reclaim executors.

pub mod layout;
pub mod numa;
pub mod plan;
mod sys;

pub use numa::{HostNode, HostTopology, NumaError};
pub use plan::{NodeSlice, PlanError};
pub mod progress;
pub mod reclaim;
mod workers;

pub use progress::{NodeReport, ReclaimProgress, ReclaimReport, ReclaimState};
pub use reclaim::{ReclaimError, ReclaimOptions};
