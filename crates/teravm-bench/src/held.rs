//! Guest memory for the in-process methods and the baselines' child: mapped
//! and fully touched with teravm's own memory code, placed on the host
//! topology read from `--sysfs-root`.

use std::path::Path;

use std::sync::atomic::AtomicBool;

use teravm::memory::{
    GuestMemory, HostTopology, MemoryOptions, NumaPolicy, PageSize, PopulateProgress,
};

use crate::args::Args;
use crate::model::{BenchError, Case, Pages};

/// Guest memory mapped and populated, with the topology it was placed on.
pub struct Held {
    /// The memory.
    pub guest: GuestMemory,
    /// The topology it was placed on.
    pub topology: HostTopology,
}

/// A memory error of `what` (map, populate, reclaim).
pub fn memory_err(what: &str, e: impl std::fmt::Display) -> BenchError {
    BenchError::Memory(format!("{what}: {e}"))
}

/// Reads the host topology under the sysfs root.
pub fn topology(sysfs_root: &Path) -> Result<HostTopology, BenchError> {
    HostTopology::from_sysfs(sysfs_root).map_err(|e| BenchError::Topology(e.to_string()))
}

/// Populate workers per node: `--populate-workers`, or the CPUs of a node.
fn populate_workers(args: &Args, topology: &HostTopology) -> u32 {
    args.populate_workers.unwrap_or_else(|| {
        let cpus = topology
            .nodes
            .iter()
            .map(|n| n.cpus.len())
            .max()
            .unwrap_or(1);
        u32::try_from(cpus.clamp(1, 64)).unwrap_or(1)
    })
}

/// Whether guest memory can be bound to the nodes of `topology` on this
/// host: not when the topology (a fake `--sysfs-root`) names nodes the host
/// lacks (teravm's memory code decides: `HostTopology::can_bind`). Then
/// placed by the kernel (`numa_policy: none`), the executor still runs per
/// node.
pub fn host_binds(topology: &HostTopology) -> bool {
    topology
        .nodes_with_memory()
        .iter()
        .all(|&n| topology.can_bind(n))
}

/// Maps guest memory of `--size-gib` for the case and touches every page.
pub fn map_populated(case: Case, args: &Args) -> Result<Held, BenchError> {
    let topology = topology(&args.sysfs_root)?;
    let memory = MemoryOptions {
        mem_bytes: args.size_gib << 30,
        page_size: match case.pages {
            Pages::FourK => PageSize::Small,
            Pages::Thp => PageSize::Transparent,
        },
        backing: case.backing.into(),
        host_nodes: None,
        policy: if host_binds(&topology) {
            NumaPolicy::Bind
        } else {
            NumaPolicy::None
        },
        populate: false,
    };
    let guest = GuestMemory::new(&memory, &topology).map_err(|e| memory_err("map", e))?;
    guest
        .populate(
            populate_workers(args, &topology),
            &topology,
            &PopulateProgress::new(),
            &AtomicBool::new(false),
        )
        .map_err(|e| memory_err("populate", e))?;
    Ok(Held { guest, topology })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_topology_naming_nodes_the_host_lacks_is_not_bound() {
        let dir = std::env::temp_dir().join(format!("teravm-bench-held-{}", std::process::id()));
        let base = dir.join("devices/system/node");
        for node in [0, 63] {
            let d = base.join(format!("node{node}"));
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("cpulist"), "0\n").unwrap();
            std::fs::write(
                d.join("meminfo"),
                format!("Node {node} MemTotal: 4000000 kB\n"),
            )
            .unwrap();
        }
        std::fs::write(base.join("online"), "0,63\n").unwrap();
        let fake = topology(&dir).unwrap();
        assert!(!host_binds(&fake));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_real_topology_is_bound() {
        assert!(host_binds(&topology(Path::new("/sys")).unwrap()));
    }
}
