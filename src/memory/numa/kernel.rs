//! The host topology asked of the kernel itself, for a root without
//! `devices/system/node` (a jail: no `/sys`, and no `/proc` either).
//!
//! - The nodes this process may place memory on: its `mems_allowed`
//!   (`get_mempolicy` with `MPOL_F_MEMS_ALLOWED`), exact. The kernel keeps
//!   only nodes with memory in it.
//! - The CPUs: its affinity mask (`sched_getaffinity`), exact, and only
//!   those: a CPU outside the mask (another cpuset's) is not listed, where
//!   sysfs lists every CPU of a node. The workers are pinned within the
//!   mask anyway.
//! - Each CPU's node: one short-lived thread (`topology`) pins itself to
//!   each CPU in turn and asks `getcpu` where it runs, exact. A CPU whose
//!   node is not in `mems_allowed` (a memoryless node, or one another
//!   cpuset holds) gives a node with CPUs and no memory, as sysfs shows a
//!   memoryless node.
//! - Each node's memory: the kernel tells a process without `/proc` and
//!   `/sys` only the host's total (`sysinfo`'s `totalram`, the same
//!   number as `/proc/meminfo`'s `MemTotal`), not a node's. One allowed
//!   node is given that total (exact where the host has one node, more
//!   than the node has where it has others that this process may not
//!   use); several are given an even split of it, an estimate. Either way
//!   the figure only tells nodes with memory from those without (the
//!   default node selection, [`HostTopology::nodes_with_memory`]); nothing
//!   sizes anything by it.

use std::io;
use std::path::PathBuf;

use super::super::sys;
use super::{HostNode, HostTopology, NumaError, TopologySource};

/// Words of the node mask given to `get_mempolicy` (1024 nodes: more than
/// the kernel's `MAX_NUMNODES` on x86_64, so it never refuses the size).
const MASK_WORDS: usize = 16;

/// `MPOL_F_MEMS_ALLOWED` of `get_mempolicy(2)`.
const MPOL_F_MEMS_ALLOWED: libc::c_ulong = 1 << 2;

/// The nodes in this process's `mems_allowed` (`get_mempolicy` with
/// `MPOL_F_MEMS_ALLOWED`), the set `mbind` checks against. A kernel without
/// NUMA support (`ENOSYS`) has node 0 only.
pub fn mems_allowed() -> io::Result<Vec<u32>> {
    let mut mask = [0u64; MASK_WORDS];
    // SAFETY: the kernel writes at most `maxnode` bits (1024, the size of
    // `mask`) into `mask`; the other pointers are null, which this mode
    // allows; no other memory is touched.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_get_mempolicy,
            std::ptr::null_mut::<libc::c_int>(),
            mask.as_mut_ptr(),
            (MASK_WORDS * 64) as libc::c_ulong,
            std::ptr::null_mut::<libc::c_void>(),
            MPOL_F_MEMS_ALLOWED,
        )
    };
    if ret != 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::ENOSYS) => Ok(vec![0]),
            _ => Err(e),
        };
    }
    Ok((0..MASK_WORDS * 64)
        .filter(|&n| mask[n / 64] & (1 << (n % 64)) != 0)
        .map(|n| n as u32)
        .collect())
}

/// `getcpu(2)` (the raw call, not the vDSO's cache): the CPU and node the
/// calling thread runs on.
fn getcpu() -> io::Result<(usize, u32)> {
    let (mut cpu, mut node): (libc::c_uint, libc::c_uint) = (0, 0);
    // SAFETY: the kernel writes one unsigned int into each of `cpu` and
    // `node`, live locals; the third argument is unused and may be null.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_getcpu,
            &mut cpu as *mut libc::c_uint,
            &mut node as *mut libc::c_uint,
            std::ptr::null_mut::<libc::c_void>(),
        )
    };
    if ret != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((cpu as usize, node))
}

/// The node of each CPU of `cpus`, asked by one short-lived thread that
/// pins itself to each in turn (`sched_setaffinity` moves the calling
/// thread before it returns) and asks `getcpu`. The calling thread's own
/// affinity is never changed.
pub fn cpu_nodes(cpus: &[usize]) -> Result<Vec<(usize, u32)>, NumaError> {
    let cpus = cpus.to_vec();
    let ask = move || -> Result<Vec<(usize, u32)>, NumaError> {
        cpus.iter()
            .map(|&cpu| {
                sys::set_affinity(&[cpu]).map_err(|source| NumaError::Kernel {
                    what: format!("sched_setaffinity to CPU {cpu}"),
                    source,
                })?;
                let (ran_on, node) = getcpu().map_err(|source| NumaError::Kernel {
                    what: format!("getcpu on CPU {cpu}"),
                    source,
                })?;
                if ran_on != cpu {
                    return Err(NumaError::NotPinned { cpu, ran_on });
                }
                Ok((cpu, node))
            })
            .collect()
    };
    std::thread::Builder::new()
        .name("topology".into())
        .spawn(ask)
        .map_err(|source| NumaError::Kernel {
            what: "starting the thread that asks getcpu".into(),
            source,
        })?
        .join()
        .unwrap_or_else(|_| {
            Err(NumaError::Kernel {
                what: "the thread that asks getcpu".into(),
                source: io::Error::other("it panicked"),
            })
        })
}

/// The topology of this process, asked of the kernel (see the module's
/// documentation); `missing` is the sysfs directory that was not there.
pub fn topology(missing: PathBuf) -> Result<HostTopology, NumaError> {
    let allowed = mems_allowed().map_err(|source| NumaError::Kernel {
        what: "get_mempolicy(MPOL_F_MEMS_ALLOWED)".into(),
        source,
    })?;
    let cpus = sys::get_affinity().map_err(|source| NumaError::Kernel {
        what: "sched_getaffinity".into(),
        source,
    })?;
    if cpus.is_empty() {
        return Err(NumaError::Kernel {
            what: "sched_getaffinity".into(),
            source: io::Error::other("the affinity mask is empty"),
        });
    }
    let cpu_nodes = cpu_nodes(&cpus)?;
    let total = sys::sysinfo()
        .map_err(|source| NumaError::Kernel {
            what: "sysinfo".into(),
            source,
        })?
        .total;
    Ok(assemble(&allowed, &cpu_nodes, total, missing))
}

/// The topology of `allowed` nodes and `(cpu, node)` pairs: every node of
/// either, in id order, with its CPUs; `total` bytes split evenly over the
/// allowed nodes (the first takes the remainder), none for a node seen only
/// through its CPUs.
pub fn assemble(
    allowed: &[u32],
    cpu_nodes: &[(usize, u32)],
    total: u64,
    missing: PathBuf,
) -> HostTopology {
    let mut ids: Vec<u32> = allowed
        .iter()
        .copied()
        .chain(cpu_nodes.iter().map(|c| c.1))
        .collect();
    ids.sort_unstable();
    ids.dedup();
    let with_memory = allowed.len() as u64;
    let share = total.checked_div(with_memory).unwrap_or(0);
    let first_allowed = allowed.iter().min().copied();
    let nodes = ids
        .into_iter()
        .map(|id| {
            let mut cpus: Vec<usize> = cpu_nodes
                .iter()
                .filter(|c| c.1 == id)
                .map(|c| c.0)
                .collect();
            cpus.sort_unstable();
            let mem_total_bytes = if !allowed.contains(&id) {
                0
            } else if Some(id) == first_allowed {
                total - share * (with_memory - 1)
            } else {
                share
            };
            HostNode {
                id,
                cpus,
                mem_total_bytes,
            }
        })
        .collect();
    HostTopology {
        nodes,
        source: TopologySource::Kernel {
            missing,
            memory_estimated: allowed.len() > 1,
        },
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn same_nodes_and_cpus_as_sysfs_on_this_host() {
        let sysfs = HostTopology::from_sysfs(Path::new("/sys")).unwrap();
        assert!(matches!(sysfs.source, TopologySource::Sysfs(_)));
        let kernel = topology("/nowhere/devices/system/node".into()).unwrap();
        assert!(
            matches!(&kernel.source, TopologySource::Kernel { missing, .. }
                if missing == Path::new("/nowhere/devices/system/node"))
        );
        // Sysfs lists every CPU of a node; the kernel's view only those of
        // this process's mask: compare within the mask.
        let mask = sys::get_affinity().unwrap();
        let ids = |t: &HostTopology| t.nodes.iter().map(|n| n.id).collect::<Vec<_>>();
        let seen: Vec<u32> = sysfs
            .nodes
            .iter()
            .filter(|n| {
                super::super::host_has_node(n.id) || n.cpus.iter().any(|c| mask.contains(c))
            })
            .map(|n| n.id)
            .collect();
        assert!(!seen.is_empty());
        assert_eq!(ids(&kernel), seen);
        for n in &kernel.nodes {
            let s = sysfs.node(n.id).unwrap();
            let in_mask: Vec<usize> = s
                .cpus
                .iter()
                .copied()
                .filter(|c| mask.contains(c))
                .collect();
            assert_eq!(n.cpus, in_mask, "node {}", n.id);
            assert_eq!(
                n.mem_total_bytes > 0,
                super::super::host_has_node(n.id),
                "node {}",
                n.id
            );
            assert_eq!(
                n.mem_total_bytes > 0,
                s.mem_total_bytes > 0,
                "node {}",
                n.id
            );
        }
        assert_eq!(kernel.nodes_with_memory(), sysfs.nodes_with_memory());
        // Memory: sysinfo's total, which is /proc/meminfo's MemTotal.
        let total: u64 = kernel.nodes.iter().map(|n| n.mem_total_bytes).sum();
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
        assert_eq!(
            Some(total),
            crate::memory::admission::meminfo_bytes(&meminfo, "MemTotal")
        );
    }

    #[test]
    fn the_asking_thread_leaves_the_callers_affinity() {
        let before = sys::get_affinity().unwrap();
        let pairs = cpu_nodes(&before).unwrap();
        assert_eq!(sys::get_affinity().unwrap(), before);
        assert_eq!(pairs.iter().map(|p| p.0).collect::<Vec<_>>(), before);
        // A CPU outside the mask cannot be pinned to: the error names it.
        let e = cpu_nodes(&[1023]).unwrap_err().to_string();
        assert!(e.contains("sched_setaffinity to CPU 1023"), "{e}");
    }

    #[test]
    fn the_kernel_gives_node_0_or_more() {
        let nodes = mems_allowed().unwrap();
        assert!(nodes.contains(&0) || !nodes.is_empty());
        assert!(sys::sysinfo().unwrap().total > 0);
    }

    #[test]
    fn memory_is_split_over_allowed_nodes_only() {
        // Nodes 0 and 2 allowed; node 1 has CPUs only (memoryless, or
        // another cpuset's memory).
        let total = 3 * GIB + 1;
        let t = assemble(
            &[0, 2],
            &[(3, 2), (0, 0), (1, 1), (2, 0)],
            total,
            "/x".into(),
        );
        let got: Vec<(u32, Vec<usize>, u64)> = t
            .nodes
            .iter()
            .map(|n| (n.id, n.cpus.clone(), n.mem_total_bytes))
            .collect();
        // The first allowed node takes the odd byte.
        let share = total / 2;
        assert_eq!(
            got,
            vec![
                (0, vec![0, 2], share + 1),
                (1, vec![1], 0),
                (2, vec![3], share)
            ]
        );
        assert_eq!(t.nodes_with_memory(), vec![0, 2]);
        assert!(matches!(
            t.source,
            TopologySource::Kernel {
                memory_estimated: true,
                ..
            }
        ));
        // One node: the whole total, not an estimate of a share.
        let one = assemble(&[0], &[(0, 0), (1, 0)], GIB, "/x".into());
        assert_eq!(one.nodes[0].mem_total_bytes, GIB);
        assert!(matches!(
            one.source,
            TopologySource::Kernel {
                memory_estimated: false,
                ..
            }
        ));
    }
}
