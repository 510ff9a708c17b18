//! The host NUMA topology, read from `<root>/devices/system/node` so that
//! tests (and users) can present a fake host: which nodes are online, their
//! CPUs and their memory. Where that directory is missing (a jail without
//! `/sys`), the nodes and CPUs are asked of the kernel itself ([`kernel`]);
//! [`TopologySource`] records which.

use std::path::{Path, PathBuf};

pub mod kernel;

/// Largest CPU or node number accepted in a list (guards against a list like
/// `0-4000000000` allocating without bound).
const MAX_LIST_INDEX: usize = 1 << 16;

/// Errors reading the host topology.
#[derive(Debug, thiserror::Error)]
pub enum NumaError {
    /// A topology file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A call that asks the kernel for the topology (no sysfs) failed.
    #[error("no sysfs node directory, and the kernel did not tell the topology: {what}: {source}")]
    Kernel {
        /// The call, and what it was asked.
        what: String,
        /// Why.
        source: std::io::Error,
    },
    /// A thread pinned to one CPU found itself on another.
    #[error("no sysfs node directory, and the kernel did not tell the topology: a thread pinned to CPU {cpu} ran on CPU {ran_on} (getcpu)")]
    NotPinned {
        /// The CPU pinned to.
        cpu: usize,
        /// Where `getcpu` said the thread ran.
        ran_on: usize,
    },
    /// A topology file has unexpected content.
    #[error("malformed {path}: {reason}")]
    Malformed {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
}

/// One host NUMA node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostNode {
    /// Node number, as the kernel names it (`nodeN`).
    pub id: u32,
    /// Its CPUs, sorted.
    pub cpus: Vec<usize>,
    /// Its memory (`MemTotal`), in bytes: exact from sysfs; from the
    /// kernel ([`TopologySource::Kernel`]) the host's total, or an even
    /// share of it (see [`kernel`]). Only ever compared with 0.
    pub mem_total_bytes: u64,
}

/// Where a [`HostTopology`] came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TopologySource {
    /// Read from this `devices/system/node` directory (`/sys`'s, or
    /// `--sysfs-root`'s).
    Sysfs(PathBuf),
    /// Asked of the kernel (`get_mempolicy`, `sched_getaffinity`, `getcpu`
    /// and `sysinfo`; see [`kernel`]) since `missing` is not there.
    Kernel {
        /// The `devices/system/node` directory that was not there.
        missing: PathBuf,
        /// Whether the nodes' memory is an even split of the host's total
        /// over several nodes (an estimate) rather than that total.
        memory_estimated: bool,
    },
}

impl std::fmt::Display for TopologySource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TopologySource::Sysfs(dir) => write!(f, "from {}", dir.display()),
            TopologySource::Kernel {
                missing,
                memory_estimated,
            } => {
                write!(f, "from the kernel (get_mempolicy, getcpu")?;
                if *memory_estimated {
                    write!(f, "; each node's memory estimated from sysinfo's total")?;
                }
                write!(f, "): no {}", missing.display())
            }
        }
    }
}

/// The host's NUMA nodes, sorted by id, and where they were learnt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostTopology {
    /// The online nodes.
    pub nodes: Vec<HostNode>,
    /// Where they were learnt.
    pub source: TopologySource,
}

impl HostTopology {
    /// Reads `<root>/devices/system/node/{online,nodeN/cpulist,nodeN/meminfo}`
    /// (`root` is `/sys` on a real host).
    ///
    /// A root without `devices/system/node` (a jail without `/sys`, or an
    /// empty `--sysfs-root`) is asked of the kernel instead: the nodes this
    /// process may use and the CPUs of its affinity mask, each CPU's node
    /// from `getcpu` ([`kernel`]; it starts a short-lived thread, so call it
    /// before a seccomp filter is installed).
    pub fn from_sysfs(root: &Path) -> Result<HostTopology, NumaError> {
        let dir = root.join("devices/system/node");
        if !dir.is_dir() {
            return kernel::topology(dir);
        }
        let online_path = dir.join("online");
        let online = parse_list(&read(&online_path)?, &online_path)?;
        if online.is_empty() {
            return Err(NumaError::Malformed {
                path: online_path,
                reason: "no node is online".into(),
            });
        }
        let mut nodes = Vec::with_capacity(online.len());
        for id in online {
            let node_dir = dir.join(format!("node{id}"));
            let cpulist = node_dir.join("cpulist");
            let cpus = parse_list(&read(&cpulist)?, &cpulist)?;
            let meminfo = node_dir.join("meminfo");
            let mem_total_bytes = parse_mem_total(&read(&meminfo)?, &meminfo)?;
            nodes.push(HostNode {
                id: id as u32,
                cpus,
                mem_total_bytes,
            });
        }
        Ok(HostTopology {
            nodes,
            source: TopologySource::Sysfs(dir),
        })
    }

    /// One line of what was found and where: `topology: 2 nodes (node 0:
    /// CPUs 0-3, node 1: CPUs 4-7) from /sys/devices/system/node`.
    pub fn describe(&self) -> String {
        let n = self.nodes.len();
        let nodes: Vec<String> = self
            .nodes
            .iter()
            .map(|node| match node.cpus.as_slice() {
                [] => format!("node {}: no CPUs", node.id),
                cpus => format!("node {}: CPUs {}", node.id, format_list(cpus)),
            })
            .collect();
        format!(
            "topology: {n} node{} ({}) {}",
            if n == 1 { "" } else { "s" },
            nodes.join(", "),
            self.source
        )
    }

    /// The node numbered `id`, if the host has it.
    pub fn node(&self, id: u32) -> Option<&HostNode> {
        self.nodes.iter().find(|n| n.id == id)
    }

    /// Whether guest memory can be bound to `node`: the topology has it and
    /// the running kernel lets this process place memory there (see
    /// [`host_has_node`]).
    pub fn can_bind(&self, node: u32) -> bool {
        self.node(node).is_some() && host_has_node(node)
    }

    /// Nodes with memory (the default selection), in id order.
    pub fn nodes_with_memory(&self) -> Vec<u32> {
        self.nodes
            .iter()
            .filter(|n| n.mem_total_bytes > 0)
            .map(|n| n.id)
            .collect()
    }
}

/// Whether the running kernel lets this process place memory on `node`: the
/// node is in the process's `mems_allowed` ([`kernel::mems_allowed`]), the
/// set `mbind` checks against. This is asked of the kernel, never of a
/// sysfs tree: a topology read from a fake root (tests, `--sysfs-root`) may
/// name nodes that this host lacks, and binding to them must fail early
/// with a clear error, not at `mbind`. Where the kernel cannot answer, node
/// 0 only.
pub fn host_has_node(node: u32) -> bool {
    match kernel::mems_allowed() {
        Ok(nodes) => nodes.contains(&node),
        Err(_) => node == 0,
    }
}

fn read(path: &Path) -> Result<String, NumaError> {
    std::fs::read_to_string(path).map_err(|source| NumaError::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// Parses the kernel's list syntax (`0-3,8,10-11`; empty means none) read
/// from `path`, which a malformed list's error names. The result is sorted
/// and without duplicates.
pub fn parse_list(text: &str, path: &Path) -> Result<Vec<usize>, NumaError> {
    let malformed = |reason: String| NumaError::Malformed {
        path: path.to_path_buf(),
        reason,
    };
    let number = |s: &str| -> Result<usize, NumaError> {
        let n: usize = s
            .trim()
            .parse()
            .map_err(|_| malformed(format!("{s:?} is not a number in list {text:?}")))?;
        if n > MAX_LIST_INDEX {
            return Err(malformed(format!("{n} is larger than {MAX_LIST_INDEX}")));
        }
        Ok(n)
    };
    let mut out = Vec::new();
    let text = text.trim();
    if text.is_empty() {
        return Ok(out);
    }
    for part in text.split(',') {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (number(a)?, number(b)?);
                if a > b {
                    return Err(malformed(format!("range {part:?} is reversed")));
                }
                out.extend(a..=b);
            }
            None => out.push(number(part)?),
        }
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

/// Writes `items` (sorted) in the kernel's list syntax: `0-3,8,10-11`.
pub fn format_list(items: &[usize]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < items.len() {
        let mut j = i;
        while j + 1 < items.len() && items[j + 1] == items[j] + 1 {
            j += 1;
        }
        parts.push(if j == i {
            items[i].to_string()
        } else {
            format!("{}-{}", items[i], items[j])
        });
        i = j + 1;
    }
    parts.join(",")
}

/// Finds `MemTotal: <n> kB` in a node's or the system's meminfo.
fn parse_mem_total(text: &str, path: &Path) -> Result<u64, NumaError> {
    let malformed = |reason: &str| NumaError::Malformed {
        path: path.to_path_buf(),
        reason: reason.into(),
    };
    let line = text
        .lines()
        .find(|l| l.contains("MemTotal:"))
        .ok_or_else(|| malformed("no MemTotal line"))?;
    let value = line
        .split_once("MemTotal:")
        .map(|(_, v)| v.trim())
        .unwrap_or_default();
    let mut words = value.split_whitespace();
    let kib: u64 = words
        .next()
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| malformed("MemTotal is not a number"))?;
    if words.next() != Some("kB") {
        return Err(malformed("MemTotal is not in kB"));
    }
    kib.checked_mul(1024)
        .ok_or_else(|| malformed("MemTotal is too large"))
}

/// Fake sysfs trees for tests (here and in the other memory tests).
#[cfg(test)]
pub(crate) mod fake {
    use std::path::PathBuf;
    use std::sync::atomic::{AtomicU32, Ordering};

    /// A temporary directory removed on drop.
    pub(crate) struct TempDir(pub PathBuf);

    impl TempDir {
        pub(crate) fn new(tag: &str) -> TempDir {
            static NEXT: AtomicU32 = AtomicU32::new(0);
            let dir = std::env::temp_dir().join(format!(
                "teravm-{tag}-{}-{}",
                std::process::id(),
                NEXT.fetch_add(1, Ordering::Relaxed)
            ));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            TempDir(dir)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// Writes a tree with `online` and, per node, `(id, cpulist, MemTotal kB)`.
    pub(crate) fn tree(online: &str, nodes: &[(u32, &str, u64)]) -> TempDir {
        let t = TempDir::new("sysfs");
        let dir = t.0.join("devices/system/node");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("online"), format!("{online}\n")).unwrap();
        for (id, cpus, kib) in nodes {
            let n = dir.join(format!("node{id}"));
            std::fs::create_dir_all(&n).unwrap();
            std::fs::write(n.join("cpulist"), format!("{cpus}\n")).unwrap();
            std::fs::write(
                n.join("meminfo"),
                format!("Node {id} MemTotal:       {kib} kB\nNode {id} MemFree:        {kib} kB\n"),
            )
            .unwrap();
        }
        t
    }
}

#[cfg(test)]
mod tests {
    use super::fake::{tree, TempDir};
    use super::*;

    const GIB_KB: u64 = 1 << 20;

    #[test]
    fn parses_lists() {
        let p = Path::new("x");
        assert_eq!(
            parse_list("0-3,8,10-11\n", p).unwrap(),
            vec![0, 1, 2, 3, 8, 10, 11]
        );
        assert_eq!(parse_list("\n", p).unwrap(), Vec::<usize>::new());
        assert_eq!(parse_list("5", p).unwrap(), vec![5]);
        assert_eq!(parse_list("3,1-2,2", p).unwrap(), vec![1, 2, 3]);
        for bad in ["a", "1-", "-1", "3-1", "1,,2", "0-99999999999", "1 2"] {
            let e = parse_list(bad, Path::new("/x/cpulist")).unwrap_err();
            assert!(e.to_string().contains("/x/cpulist"), "{bad}: {e}");
        }
    }

    #[test]
    fn reads_one_to_eight_nodes() {
        for count in [1u32, 2, 4, 8] {
            let nodes: Vec<(u32, String, u64)> = (0..count)
                .map(|i| {
                    (
                        i,
                        format!("{}-{}", 4 * i, 4 * i + 3),
                        GIB_KB * (i as u64 + 1),
                    )
                })
                .collect();
            let spec: Vec<(u32, &str, u64)> =
                nodes.iter().map(|(i, c, m)| (*i, c.as_str(), *m)).collect();
            let t = tree(&format!("0-{}", count - 1), &spec);
            let topo = HostTopology::from_sysfs(&t.0).unwrap();
            assert_eq!(topo.nodes.len(), count as usize);
            for i in 0..count {
                let n = topo.node(i).unwrap();
                assert_eq!(
                    n.cpus,
                    (4 * i as usize..4 * i as usize + 4).collect::<Vec<_>>()
                );
                assert_eq!(n.mem_total_bytes, (i as u64 + 1) << 30);
            }
            assert_eq!(topo.nodes_with_memory(), (0..count).collect::<Vec<_>>());
            assert!(topo.node(count).is_none());
        }
    }

    #[test]
    fn node_without_cpus_or_memory() {
        let t = tree("0-2", &[(0, "0-1", GIB_KB), (1, "", GIB_KB), (2, "2-3", 0)]);
        let topo = HostTopology::from_sysfs(&t.0).unwrap();
        assert!(topo.node(1).unwrap().cpus.is_empty());
        assert_eq!(topo.node(2).unwrap().mem_total_bytes, 0);
        assert_eq!(topo.nodes_with_memory(), vec![0, 1]);
    }

    #[test]
    fn gaps_in_numbering() {
        let t = tree(
            "0,2-3",
            &[(0, "0", GIB_KB), (2, "1", GIB_KB), (3, "2", GIB_KB)],
        );
        let topo = HostTopology::from_sysfs(&t.0).unwrap();
        let ids: Vec<u32> = topo.nodes.iter().map(|n| n.id).collect();
        assert_eq!(ids, vec![0, 2, 3]);
        assert!(topo.node(1).is_none());
    }

    #[test]
    fn malformed_files_are_named() {
        let t = tree("0", &[(0, "0-x", GIB_KB)]);
        let e = HostTopology::from_sysfs(&t.0).unwrap_err();
        assert!(e.to_string().contains("node0/cpulist"), "{e}");

        let t = tree("0-", &[(0, "0", GIB_KB)]);
        let e = HostTopology::from_sysfs(&t.0).unwrap_err();
        assert!(e.to_string().contains("node/online"), "{e}");

        let t = tree("", &[]);
        let e = HostTopology::from_sysfs(&t.0).unwrap_err();
        assert!(e.to_string().contains("online"), "{e}");

        let t = tree("0", &[(0, "0", GIB_KB)]);
        let meminfo = t.0.join("devices/system/node/node0/meminfo");
        for bad in [
            "Node 0 MemFree: 1 kB\n",
            "Node 0 MemTotal: lots kB\n",
            "Node 0 MemTotal: 5 MB\n",
        ] {
            std::fs::write(&meminfo, bad).unwrap();
            let e = HostTopology::from_sysfs(&t.0).unwrap_err();
            assert!(e.to_string().contains("node0/meminfo"), "{bad}: {e}");
        }

        // An online node whose directory is missing.
        let t = tree("0-1", &[(0, "0", GIB_KB)]);
        let e = HostTopology::from_sysfs(&t.0).unwrap_err();
        assert!(e.to_string().contains("node1/cpulist"), "{e}");
    }

    #[test]
    fn missing_node_dir_asks_the_kernel() {
        let t = TempDir::new("nonuma");
        let topo = HostTopology::from_sysfs(&t.0).unwrap();
        let missing = t.0.join("devices/system/node");
        assert_eq!(
            topo.source,
            TopologySource::Kernel {
                missing: missing.clone(),
                memory_estimated: topo.nodes_with_memory().len() > 1
            }
        );
        assert!(!topo.nodes.is_empty());
        assert!(topo.nodes.iter().any(|n| !n.cpus.is_empty()));
        assert!(!topo.nodes_with_memory().is_empty());
        let line = topo.describe();
        assert!(
            line.contains("from the kernel (get_mempolicy, getcpu")
                && line.ends_with(&format!("): no {}", missing.display())),
            "{line}"
        );
    }

    #[test]
    fn the_line_names_nodes_cpus_and_source() {
        let t = tree("0-1", &[(0, "0-3,8", GIB_KB), (1, "", GIB_KB)]);
        let topo = HostTopology::from_sysfs(&t.0).unwrap();
        assert_eq!(
            topo.describe(),
            format!(
                "topology: 2 nodes (node 0: CPUs 0-3,8, node 1: no CPUs) from {}",
                t.0.join("devices/system/node").display()
            )
        );
        let t = tree("0", &[(0, "5", GIB_KB)]);
        let line = HostTopology::from_sysfs(&t.0).unwrap().describe();
        assert!(
            line.starts_with("topology: 1 node (node 0: CPUs 5) from "),
            "{line}"
        );
        for list in [vec![], vec![1], vec![0, 1, 2, 5, 7, 8], vec![3, 9, 10]] {
            let text = format_list(&list);
            assert_eq!(parse_list(&text, Path::new("x")).unwrap(), list, "{text}");
        }
        assert_eq!(format_list(&[0, 1, 2, 5, 7, 8]), "0-2,5,7-8");
    }

    #[test]
    fn the_kernel_says_which_nodes_exist() {
        // Node 0 exists on every Linux host; node 1023 on none of ours.
        assert!(host_has_node(0));
        assert!(!host_has_node(1023));
        assert!(!host_has_node(5000));
        let real = HostTopology::from_sysfs(Path::new("/sys")).unwrap();
        for n in &real.nodes {
            assert_eq!(
                host_has_node(n.id),
                Path::new(&format!("/sys/devices/system/node/node{}", n.id)).is_dir() || n.id == 0,
                "node {}",
                n.id
            );
        }
        // A fake tree naming nodes the host lacks: they are in the topology
        // but cannot be bound.
        let t = tree(
            "0-3",
            &[
                (0, "0", GIB_KB),
                (1, "0", GIB_KB),
                (2, "0", GIB_KB),
                (3, "0", GIB_KB),
            ],
        );
        let fake = HostTopology::from_sysfs(&t.0).unwrap();
        assert!(fake.can_bind(0));
        for id in 1..4 {
            assert_eq!(fake.can_bind(id), host_has_node(id));
        }
        assert!(!fake.can_bind(4), "not in the topology");
    }

    #[test]
    fn real_host_reads() {
        let topo = HostTopology::from_sysfs(Path::new("/sys")).unwrap();
        assert!(!topo.nodes.is_empty());
        assert!(!topo.nodes_with_memory().is_empty());
    }
}
