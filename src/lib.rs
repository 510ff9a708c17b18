//! teravm: a minimal KVM virtual machine monitor for microVMs with very large
//! memory, which gives a shut-down guest's memory back to the host fast by
//! freeing it with worker threads pinned to each host NUMA node.
#![deny(missing_docs)]
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod config;
pub mod devices;
pub mod vstate;
