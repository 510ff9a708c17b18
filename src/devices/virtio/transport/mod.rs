//! How a virtio device is reached by its driver: the virtio-mmio transport
//! ([`mmio`]), the one teravm offers (Firecracker's
//! `devices/virtio/transport/mmio.rs`).

mod activation;
pub mod mmio;
#[cfg(test)]
mod mmio_tests;
pub mod persist;
