//! teravm: a minimal KVM virtual machine monitor for microVMs with very large
//! memory, which gives a shut-down guest's memory back to the host fast by
//! freeing it with worker threads pinned to each host NUMA node.
//!
//! Data flows top to bottom: [`config`] and [`api`] describe what to run;
//! [`vmm`] runs it; [`vstate`] wraps KVM; [`memory`] owns guest RAM, its NUMA
//! placement and its parallel populate and reclaim; [`devices`] answer the
//! guest's port I/O and MMIO (serial, i8042, and the virtio-mmio balloon,
//! block, net and vsock devices, each with its own thread). Nothing below
//! [`vmm`] knows about HTTP.
#![deny(missing_docs)]
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod api;
pub mod config;
pub mod devices;
pub mod faults;
pub mod files;
pub mod logger;
pub mod memory;
pub mod metrics;
pub mod mmds;
pub mod output;
pub mod rate_limiter;
pub mod seccomp;
pub mod snapshot;
pub mod util;
pub mod vmm;
pub mod vstate;
