//! TEMPORARY stand-in for the memory module's guest API (removed when it lands).
#![allow(missing_docs, dead_code)]
use crate::config::{MachineConfig, MemoryConfig};
use crate::memory::HostTopology;
pub struct GuestMemory {
    buf: Vec<u8>,
}
pub struct ReclaimOptions {
    pub workers_per_node: u32,
    pub chunk_bytes: u64,
    pub parallel_threshold_bytes: u64,
    pub steal: bool,
}
#[derive(Default)]
pub struct ReclaimProgress;
impl ReclaimProgress {
    pub fn new() -> Self {
        ReclaimProgress
    }
}
pub struct NodeReport {
    pub node: u32,
    pub address_bytes: u64,
    pub workers: u32,
    pub elapsed_ms: u64,
}
pub struct ReclaimReport {
    pub nodes: Vec<NodeReport>,
}
impl GuestMemory {
    pub fn new(m: &MachineConfig, _: &MemoryConfig, _: &HostTopology) -> Result<Self, String> {
        Ok(GuestMemory {
            buf: Vec::with_capacity((m.mem_size_mib << 20) as usize),
        })
    }
    pub fn populate(&self, _: u32, _: &HostTopology) -> Result<(), String> {
        Ok(())
    }
    pub fn reclaim(
        self,
        o: &ReclaimOptions,
        _: &HostTopology,
        _: &ReclaimProgress,
    ) -> Result<ReclaimReport, String> {
        let n = self.buf.capacity() as u64;
        drop(self);
        Ok(ReclaimReport {
            nodes: vec![NodeReport {
                node: 0,
                address_bytes: n,
                workers: o.workers_per_node,
                elapsed_ms: 1,
            }],
        })
    }
}
