//! KVM state: the VM (memslots), the vCPUs (threads, kick, exits) and the
//! boot state of the built-in firmware. vCPU threads report to the VMM's
//! event loop through an mpsc channel plus an `EventFd`.

pub mod boot;
pub mod linux;
pub mod msrs;
pub mod pause;
pub mod snapshot;
pub mod template;
pub mod vcpu;
pub mod vm;

#[cfg(test)]
mod kvm_tests;
