//! The benchmark loop: for each page size and backing, `--runs` rounds of
//! every method in turn (A B C A B C ...), each on freshly mapped and fully
//! touched memory, the touching untimed; then the table, the per-node
//! results, the CSV and the SVG.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use super::child::{child_args, ExitChild};
use super::cli::Args;
use super::stats::median;
use super::{backing_name, report, svg, BenchError, Case, Method, Pages, Sample};
use crate::config::Backing;
use crate::memory::{
    host_has_node, GuestMemory, HostTopology, MemoryOptions, NumaPolicy, PageSize,
    PopulateProgress, ReclaimOptions, ReclaimProgress,
};

/// Guest memory mapped and populated, with the topology it was placed on.
pub struct Held {
    guest: GuestMemory,
    topology: HostTopology,
}

/// How long one node's part of a teravm run took.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NodeTime {
    /// Host node.
    pub node: u32,
    /// Worker threads on the node.
    pub workers: u32,
    /// Guest address space of the node's slice, bytes.
    pub address_bytes: u64,
    /// Seconds the node's workers took.
    pub seconds: f64,
}

fn memory_err(what: &str, e: impl std::fmt::Display) -> BenchError {
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
        // Bound to their nodes, unless the topology (a fake sysfs root)
        // names nodes this host lacks: then placed by the kernel.
        policy: if topology.nodes.iter().all(|n| host_has_node(n.id)) {
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
            &std::sync::atomic::AtomicBool::new(false),
        )
        .map_err(|e| memory_err("populate", e))?;
    Ok(Held { guest, topology })
}

/// The binaries a run needs: the bench itself (the `exit` child) and, with
/// `--vm`, teravm and whether its microVMs bind memory to host nodes.
struct Binaries {
    exe: PathBuf,
    teravm: Option<(PathBuf, bool)>,
}

/// One timed run of `method`: seconds, and per node for teravm.
fn measure(
    method: Method,
    case: Case,
    args: &Args,
    bins: &Binaries,
) -> Result<(f64, Vec<NodeTime>), BenchError> {
    let exe = bins.exe.as_path();
    match method {
        Method::Exit => {
            let child = ExitChild::spawn(exe, &child_args(case, args))?;
            Ok((child.kill_and_wait()?.as_secs_f64(), Vec::new()))
        }
        Method::Munmap => {
            let held = map_populated(case, args)?;
            let start = Instant::now();
            drop(held.guest);
            Ok((start.elapsed().as_secs_f64(), Vec::new()))
        }
        Method::Teravm(workers) => {
            let held = map_populated(case, args)?;
            let opts = ReclaimOptions {
                workers_per_node: workers,
                chunk_bytes: args.chunk_mib << 20,
                parallel_threshold_bytes: 0,
                steal: true,
            };
            let progress = ReclaimProgress::new();
            let start = Instant::now();
            let report = held
                .guest
                .reclaim(&opts, &held.topology, &progress)
                .map_err(|e| memory_err("reclaim", e))?;
            let seconds = start.elapsed().as_secs_f64();
            let nodes = report
                .nodes
                .iter()
                .map(|n| NodeTime {
                    node: n.node,
                    workers: n.workers,
                    address_bytes: n.address_bytes,
                    seconds: n.elapsed_ms as f64 / 1000.0,
                })
                .collect();
            Ok((seconds, nodes))
        }
        Method::VmKill | Method::VmShutdown(_) => {
            let (teravm, bind) = bins
                .teravm
                .as_ref()
                .ok_or_else(|| BenchError::Vm(format!("{method} needs --vm")))?;
            let seconds = super::vm::measure_vm(method, case, args, teravm, *bind)?;
            Ok((seconds, Vec::new()))
        }
    }
}

/// The progress line on stderr: rewritten in place on a terminal, one line
/// per step otherwise.
struct Progress {
    tty: bool,
    total: usize,
    done: usize,
}

impl Progress {
    fn show(&self, text: &str) {
        let mut err = std::io::stderr().lock();
        let line = format!("[{}/{}] {text}", self.done + 1, self.total);
        if self.tty {
            let _ = write!(err, "\r\x1b[K{line}");
        } else {
            let _ = writeln!(err, "{line}");
        }
        let _ = err.flush();
    }

    fn finish(&self) {
        if self.tty {
            let _ = writeln!(std::io::stderr(), "\r\x1b[K[{0}/{0}] done", self.total);
        }
    }
}

/// The methods of one round, baselines first.
pub fn methods(workers: &[u32]) -> Vec<Method> {
    let mut out = vec![Method::Munmap, Method::Exit];
    out.extend(workers.iter().map(|&w| Method::Teravm(w)));
    out
}

/// The cases, page size outer, backing inner.
pub fn cases(args: &Args) -> Vec<Case> {
    args.pages
        .iter()
        .flat_map(|&pages| {
            args.backing
                .iter()
                .map(move |&backing| Case { pages, backing })
        })
        .collect()
}

/// Runs the whole benchmark and writes its outputs.
pub fn run(args: &Args) -> Result<(), BenchError> {
    let host = topology(&args.sysfs_root)?;
    let exe = std::env::current_exe()
        .map_err(|e| BenchError::Child(format!("cannot find the bench binary: {e}")))?;
    let mut methods = methods(&args.workers);
    let mut bins = Binaries { exe, teravm: None };
    if args.vm {
        let bind = host.nodes.iter().all(|n| host_has_node(n.id));
        bins.teravm = Some((super::vm::teravm_binary()?, bind));
        methods.extend(super::vm::vm_methods(&args.workers));
    }
    let cases = cases(args);
    let mut progress = Progress {
        tty: std::io::stderr().is_terminal(),
        total: cases.len() * args.runs as usize * methods.len(),
        done: 0,
    };
    let mut samples = Vec::with_capacity(progress.total);
    let mut node_times: Vec<(Case, Method, NodeTime)> = Vec::new();
    for &case in &cases {
        for run in 1..=args.runs {
            for &method in &methods {
                progress.show(&format!(
                    "{case}, {} GiB, run {run}/{}: {method}",
                    args.size_gib, args.runs
                ));
                let (seconds, nodes) = measure(method, case, args, &bins)?;
                progress.done += 1;
                samples.push(Sample {
                    case,
                    method,
                    size_gib: args.size_gib,
                    chunk_mib: (!method.is_baseline()).then_some(args.chunk_mib),
                    run,
                    seconds,
                });
                node_times.extend(nodes.into_iter().map(|n| (case, method, n)));
            }
        }
    }
    progress.finish();

    let rows = report::rows(&samples);
    let mut out = std::io::stdout().lock();
    let _ = write!(out, "{}", report::table(&rows));
    if cases
        .iter()
        .any(|c| c.pages == Pages::Thp && c.backing == Backing::Memfd)
    {
        let path = args
            .sysfs_root
            .join("kernel/mm/transparent_hugepage/shmem_enabled");
        if let Some(note) = std::fs::read_to_string(path)
            .ok()
            .and_then(|t| shmem_thp_note(&t))
        {
            let _ = writeln!(out, "{note}");
        }
    }
    if host.nodes_with_memory().len() > 1 {
        let _ = write!(out, "{}", per_node_text(&node_times));
    }
    let _ = out.flush();
    if let Some(path) = &args.csv {
        write_file(path, &report::csv(&samples))?;
    }
    if let Some(path) = &args.svg {
        let title = format!(
            "Freeing {} GiB of touched memory, {} run(s) each",
            args.size_gib, args.runs
        );
        write_file(path, &svg::plot(&rows, &title))?;
    }
    Ok(())
}

/// A note for the table when the host gives shared memory no huge pages
/// (`shmem_enabled` set to `never` or `deny`), so that `thp memfd` is in
/// fact backed by 4 KiB pages.
pub fn shmem_thp_note(shmem_enabled: &str) -> Option<String> {
    let selected = shmem_enabled
        .split_whitespace()
        .find(|w| w.starts_with('['))?
        .trim_matches(|c| c == '[' || c == ']');
    matches!(selected, "never" | "deny").then(|| {
        format!(
            "note: thp memfd is backed by 4 KiB pages here: \
             transparent_hugepage/shmem_enabled is [{selected}]"
        )
    })
}

/// Per-node medians of the teravm runs: one line per method and case.
pub fn per_node_text(node_times: &[(Case, Method, NodeTime)]) -> String {
    let mut keys: Vec<(Case, Method)> = Vec::new();
    for (case, method, _) in node_times {
        if !keys.contains(&(*case, *method)) {
            keys.push((*case, *method));
        }
    }
    let mut text = String::from("per node (median elapsed of the node's workers):\n");
    for (case, method) in keys {
        let mut nodes: Vec<u32> = node_times
            .iter()
            .filter(|(c, m, _)| *c == case && *m == method)
            .map(|(_, _, n)| n.node)
            .collect();
        nodes.sort_unstable();
        nodes.dedup();
        let parts: Vec<String> = nodes
            .iter()
            .map(|&node| {
                let of_node: Vec<&NodeTime> = node_times
                    .iter()
                    .filter(|(c, m, n)| *c == case && *m == method && n.node == node)
                    .map(|(_, _, n)| n)
                    .collect();
                let secs: Vec<f64> = of_node.iter().map(|n| n.seconds).collect();
                let first = of_node[0];
                format!(
                    "node {node}: {:.3} s ({} MiB, {} workers)",
                    median(&secs).unwrap_or(0.0),
                    first.address_bytes >> 20,
                    first.workers
                )
            })
            .collect();
        text.push_str(&format!(
            "  {method} {} {}: {}\n",
            case.pages,
            backing_name(case.backing),
            parts.join(", ")
        ));
    }
    text
}

fn write_file(path: &Path, text: &str) -> Result<(), BenchError> {
    std::fs::write(path, text).map_err(|source| BenchError::Write {
        path: path.display().to_string(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[test]
    fn shmem_without_huge_pages_is_noted() {
        let note = shmem_thp_note("always within_size advise [never] deny force\n").unwrap();
        assert!(note.contains("[never]"), "{note}");
        assert!(shmem_thp_note("always within_size [advise] never deny force").is_none());
        assert!(shmem_thp_note("").is_none());
    }

    #[test]
    fn rounds_alternate_baselines_and_worker_counts() {
        assert_eq!(
            methods(&[1, 4]),
            [
                Method::Munmap,
                Method::Exit,
                Method::Teravm(1),
                Method::Teravm(4)
            ]
        );
    }

    #[test]
    fn cases_cover_every_page_size_and_backing() {
        let args = Args::try_parse_from(["b"]).unwrap();
        let names: Vec<String> = cases(&args).iter().map(|c| c.to_string()).collect();
        assert_eq!(
            names,
            ["4k anonymous", "4k memfd", "thp anonymous", "thp memfd"]
        );
    }

    #[test]
    fn per_node_text_gives_a_median_per_node() {
        let case = Case {
            pages: Pages::FourK,
            backing: Backing::Anonymous,
        };
        let t = |node, seconds| NodeTime {
            node,
            workers: 2,
            address_bytes: 4 << 30,
            seconds,
        };
        let times = [
            (case, Method::Teravm(2), t(0, 1.0)),
            (case, Method::Teravm(2), t(1, 2.0)),
            (case, Method::Teravm(2), t(0, 3.0)),
            (case, Method::Teravm(2), t(1, 2.0)),
        ];
        let text = per_node_text(&times);
        assert!(
            text.contains(
                "teravm-2 4k anonymous: node 0: 2.000 s (4096 MiB, 2 workers), node 1: 2.000 s"
            ),
            "{text}"
        );
    }
}
