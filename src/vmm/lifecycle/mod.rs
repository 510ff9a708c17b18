//! The microVM's life, in the order it is lived: its [`phase`]s and the
//! state `GET /` shows; the `start` (the `start` job runs the
//! [`builder`]); the `shutdown` every way of ending takes (the `reclaim`
//! job runs the one [`teardown`] order, then frees guest memory), with its
//! [`report`]; and the [`progress_line`] a terminal sees while memory is
//! populated or freed. A snapshot's two long steps run on the `start`
//! runner too: the create job ([`snapshot`]) and the restore
//! ([`restore`]), the build of a microVM from a snapshot's state.
//!
//! The event loop (in [`crate::vmm`]) only moves between phases: the long
//! steps are jobs ([`crate::vmm::jobs`]) whose completion events come back
//! to it. Inside, `start` and `shutdown` use `phase`, `builder`, `report`
//! and `teardown`; `builder` → `teardown` → the device manager
//! ([`crate::vmm::devices`]); nothing here imports the API actions
//! ([`crate::vmm::actions`]), which drive it.

pub mod builder;
pub mod phase;
pub mod progress_line;
pub mod report;
pub mod restore;
mod shutdown;
pub mod snapshot;
mod start;
pub mod teardown;

pub use phase::{Phase, ShutdownReason, VmState};
