//! The benchmark loop: for each page size and backing, `--runs` rounds of
//! every method in turn (A B C A B C ...), each on freshly mapped and fully
//! touched memory, the touching untimed; then the table, the async reply
//! latencies, the shutdown phases, the per-node results, the CSV and the
//! SVG. With `--peers`, first the line that says which peers were found, and
//! below the table what each VMM held resident.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use teravm::config::Backing;
use teravm::memory::{ReclaimOptions, ReclaimProgress};

use crate::args::Args;
use crate::child::{child_args, ExitChild};
use crate::held::{host_binds, map_populated, memory_err, topology};
use crate::model::{
    backing_name, BenchError, Case, Live, Method, Pages, Peer, Phases, Resident, Sample,
    Unavailable,
};
use crate::mrelease::Reap;
use crate::peers::{discover, discovery_line, driver_missing, peer_methods, supports};
use crate::stats::median;
use crate::{firecracker, guest, live, live_unplug, mrelease, peers, peers_text, report, svg, vm};

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

/// The binaries a run needs: the bench itself (the `exit` child), with
/// `--vm`, `--live` or `--peers` teravm and whether its microVMs bind memory
/// to host nodes, and the peers found.
struct Binaries {
    exe: PathBuf,
    teravm: Option<(PathBuf, bool)>,
    peers: Vec<(Peer, PathBuf)>,
    /// The test guest of the `--peers` guest rows, when found.
    guest: Option<PathBuf>,
}

/// What one timed run measured.
struct Measured {
    seconds: f64,
    nodes: Vec<NodeTime>,
    reply_ms: Option<f64>,
    phases: Phases,
    live: Option<Live>,
    resident: Option<Resident>,
    populate_ms: Option<f64>,
    touched_mib: Option<u64>,
}

impl Measured {
    fn seconds(seconds: f64) -> Measured {
        Measured {
            seconds,
            nodes: Vec::new(),
            reply_ms: None,
            phases: [None; 4],
            live: None,
            resident: None,
            populate_ms: None,
            touched_mib: None,
        }
    }

    fn of_vm(run: vm::VmRun) -> Measured {
        Measured {
            reply_ms: run.reply_ms,
            phases: run.phases,
            resident: run.resident,
            populate_ms: run.populate_ms,
            touched_mib: run.touched_mib,
            ..Measured::seconds(run.seconds)
        }
    }
}

/// One timed run of `method`.
fn measure(
    method: Method,
    case: Case,
    args: &Args,
    bins: &Binaries,
) -> Result<Measured, BenchError> {
    let exe = bins.exe.as_path();
    match method {
        Method::Exit | Method::Mrelease => {
            let child = ExitChild::spawn(exe, &child_args(case, args))?;
            let reap = if method == Method::Exit {
                Reap::Wait
            } else {
                Reap::Mrelease
            };
            Ok(Measured::seconds(child.kill_and_reap(reap)?.as_secs_f64()))
        }
        Method::Munmap => {
            let held = map_populated(case, args)?;
            let start = Instant::now();
            drop(held.guest);
            Ok(Measured::seconds(start.elapsed().as_secs_f64()))
        }
        Method::Teravm(workers) => {
            let held = map_populated(case, args)?;
            let opts = ReclaimOptions {
                workers_per_node: workers,
                chunk_bytes: args.chunk_mib.map(|c| c << 20),
                parallel_threshold_bytes: 0,
                steal: true,
            };
            let progress = ReclaimProgress::new();
            let start = Instant::now();
            let report = held
                .guest
                .reclaim(&opts, &held.topology, &progress)
                .map_err(|e| memory_err("reclaim", e))?;
            let mut measured = Measured::seconds(start.elapsed().as_secs_f64());
            measured.nodes = report
                .nodes
                .iter()
                .map(|n| NodeTime {
                    node: n.node,
                    workers: n.workers,
                    address_bytes: n.address_bytes,
                    seconds: n.elapsed_ms as f64 / 1000.0,
                })
                .collect();
            Ok(measured)
        }
        Method::VmKill | Method::VmMrelease | Method::VmShutdown(_) | Method::VmAsync(_) => {
            let (teravm, bind) = bins
                .teravm
                .as_ref()
                .ok_or_else(|| BenchError::Vm(format!("{method} needs --vm")))?;
            let run = vm::measure_vm(method, case, args, teravm, *bind)?;
            Ok(Measured::of_vm(run))
        }
        Method::VmPrealloc(workers) => {
            let (teravm, bind) = bins
                .teravm
                .as_ref()
                .ok_or_else(|| BenchError::Vm(format!("{method} needs --peers")))?;
            let run = vm::measure_prealloc(workers, case, args, teravm, *bind)?;
            Ok(Measured::of_vm(run))
        }
        Method::VmGuestShutdown(workers) | Method::VmGuestSigterm(workers) => {
            let (teravm, bind) = bins
                .teravm
                .as_ref()
                .ok_or_else(|| BenchError::Vm(format!("{method} needs --peers")))?;
            let guest = bins
                .guest
                .as_ref()
                .ok_or_else(|| BenchError::Vm(format!("{method} needs the test guest")))?;
            let shutdown = matches!(method, Method::VmGuestShutdown(_));
            let run = guest::measure_teravm(shutdown, workers, case, args, teravm, *bind, guest)?;
            Ok(Measured::of_vm(run))
        }
        Method::Peer(peer, stop) | Method::PeerGuest(peer, stop) => {
            let binary = bins
                .peers
                .iter()
                .find(|(p, _)| *p == peer)
                .map(|(_, b)| b)
                .ok_or_else(|| BenchError::PeersUnavailable(format!("{peer} was not found")))?;
            let guest =
                if method.is_guest() {
                    Some(bins.guest.as_deref().ok_or_else(|| {
                        BenchError::Peer(format!("{method} needs the test guest"))
                    })?)
                } else {
                    None
                };
            let run = peers::measure_peer(peer, stop, case, args.size_gib << 10, binary, guest)
                .map_err(|e| BenchError::Peer(format!("{method}: {e}")))?;
            Ok(Measured {
                resident: Some(run.resident),
                touched_mib: run.touched_mib,
                ..Measured::seconds(run.seconds)
            })
        }
        Method::ReportSerial | Method::ReportTeravm(_) => {
            let (teravm, bind) = bins
                .teravm
                .as_ref()
                .ok_or_else(|| BenchError::Vm(format!("{method} needs --live")))?;
            let (seconds, l) = live::measure_live(method, case, args, teravm, *bind)?;
            Ok(Measured {
                live: Some(l),
                ..Measured::seconds(seconds)
            })
        }
        Method::UnplugSerial | Method::UnplugTeravm(_) | Method::UnplugAllTeravm(_) => {
            let (teravm, bind) = bins
                .teravm
                .as_ref()
                .ok_or_else(|| BenchError::Vm(format!("{method} needs --live")))?;
            let (seconds, l) = live_unplug::measure_unplug(method, case, args, teravm, *bind)?;
            Ok(Measured {
                live: Some(l),
                ..Measured::seconds(seconds)
            })
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

/// The methods of one round, baselines first (`mrelease` where the kernel
/// has it).
pub fn methods(workers: &[u32], mrelease: bool) -> Vec<Method> {
    let mut out = vec![Method::Munmap, Method::Exit];
    if mrelease {
        out.push(Method::Mrelease);
    }
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

/// The binary `args` names for `peer`, if any.
fn flag_path(args: &Args, peer: Peer) -> Option<&Path> {
    match peer {
        Peer::Qemu => args.qemu.as_deref(),
        Peer::Firecracker => args.firecracker.as_deref(),
        Peer::CloudHypervisor => args.cloud_hypervisor.as_deref(),
    }
}

/// The `--peers` rows: each peer found and driven gives its rows (QEMU:
/// preallocated and with the test guest; Firecracker: with the guest),
/// then teravm's beside them (`vm-prealloc-teravm-<w>`, with the guest
/// `vm-guest-teravm-<w>` and `vm-guest-sigterm-<w>`, and `vm-teravm-<w>`,
/// at every worker count); a peer not found or not driven is unavailable,
/// and so are the guest rows when the test guest is missing.
/// `Err` when none of the peers asked for can run (the discovery line says
/// why). Prints the discovery line on stderr and returns it.
fn add_peers(
    args: &Args,
    bins: &mut Binaries,
    methods: &mut Vec<Method>,
    unavailable: &mut Vec<Unavailable>,
) -> Result<String, BenchError> {
    let path_var = std::env::var_os("PATH");
    let home = std::env::var_os("HOME").map(PathBuf::from);
    let found: Vec<_> = args
        .peers
        .iter()
        .map(|&p| {
            let fallback = (p == Peer::Firecracker)
                .then(|| firecracker::cached_build(home.as_deref()))
                .flatten();
            discover(p, flag_path(args, p), path_var.as_deref(), fallback)
        })
        .collect();
    let guest = guest::guest_binary();
    bins.guest = guest.as_ref().ok().cloned();
    let line = discovery_line(&found);
    eprintln!("{line}");
    for d in &found {
        let why = match (&d.binary, driver_missing(d.peer)) {
            (Ok(binary), None) => {
                bins.peers.push((d.peer, binary.path.clone()));
                for method in peer_methods(d.peer) {
                    match (&guest, method.is_guest()) {
                        (Err(why), true) => unavailable.push(Unavailable {
                            method,
                            case: None,
                            reason: why.clone(),
                        }),
                        _ => methods.push(method),
                    }
                }
                continue;
            }
            (Ok(_), Some(why)) => why.to_string(),
            (Err(why), _) => format!("not found: {why}"),
        };
        for method in peer_methods(d.peer) {
            unavailable.push(Unavailable {
                method,
                case: None,
                reason: why.clone(),
            });
        }
    }
    if bins.peers.is_empty() {
        return Err(BenchError::PeersUnavailable(format!(
            "--peers: none of the peers asked for can run here: {}",
            line.trim_start_matches("peers: ")
        )));
    }
    methods.extend(args.workers.iter().map(|&w| Method::VmPrealloc(w)));
    let teravm_guest = args
        .workers
        .iter()
        .flat_map(|&w| [Method::VmGuestShutdown(w), Method::VmGuestSigterm(w)]);
    match &guest {
        Ok(_) => methods.extend(teravm_guest),
        Err(why) => unavailable.extend(teravm_guest.map(|method| Unavailable {
            method,
            case: None,
            reason: why.clone(),
        })),
    }
    methods.extend(args.workers.iter().map(|&w| Method::VmShutdown(w)));
    Ok(line)
}

/// Runs the whole benchmark and writes its outputs.
pub fn run(args: &Args) -> Result<(), BenchError> {
    let host = topology(&args.sysfs_root)?;
    let exe = std::env::current_exe()
        .map_err(|e| BenchError::Child(format!("cannot find the bench binary: {e}")))?;
    let mrelease = mrelease::available();
    let mut methods = Vec::new();
    let mut unavailable = Vec::new();
    if !args.peers_only {
        methods = self::methods(&args.workers, mrelease.is_ok());
        if let Err(reason) = &mrelease {
            unavailable.push(Unavailable {
                method: Method::Mrelease,
                case: None,
                reason: reason.clone(),
            });
        }
    }
    let mut bins = Binaries {
        exe,
        teravm: None,
        peers: Vec::new(),
        guest: None,
    };
    if args.vm {
        bins.teravm = Some((vm::teravm_binary()?, host_binds(&host)));
        methods.extend(vm::vm_methods(&args.workers, mrelease.is_ok()));
        if let Err(reason) = &mrelease {
            unavailable.push(Unavailable {
                method: Method::VmMrelease,
                case: None,
                reason: reason.clone(),
            });
        }
    }
    if args.live {
        if bins.teravm.is_none() {
            bins.teravm = Some((vm::teravm_binary()?, host_binds(&host)));
        }
        methods.extend(live::live_methods(&args.workers));
        methods.extend(live_unplug::unplug_methods(&args.workers));
    }
    let mut peers_line = None;
    if !args.peers.is_empty() {
        peers_line = Some(add_peers(args, &mut bins, &mut methods, &mut unavailable)?);
        if bins.teravm.is_none() {
            bins.teravm = Some((vm::teravm_binary()?, host_binds(&host)));
        }
    }
    // --vm and --peers both have vm-teravm-<w>: once a round.
    let mut seen = Vec::new();
    methods.retain(|m| {
        let first = !seen.contains(m);
        seen.push(*m);
        first
    });
    let cases = cases(args);
    // A peer that lacks a case's backing skips it, said in the table.
    let mut case_methods: Vec<(Case, Vec<Method>)> = Vec::new();
    for &case in &cases {
        let mut of_case = methods.clone();
        // A method that cannot run for the case's backing (a peer that
        // lacks it included) skips it, said in the table.
        of_case.retain(|&method| {
            let reason = match method {
                Method::Peer(peer, _) | Method::PeerGuest(peer, _) => supports(peer, case).err(),
                other => other.unsupported(case).map(str::to_string),
            };
            let Some(reason) = reason else {
                return true;
            };
            unavailable.push(Unavailable {
                method,
                case: Some(case),
                reason,
            });
            false
        });
        case_methods.push((case, of_case));
    }
    let mut progress = Progress {
        tty: std::io::stderr().is_terminal(),
        total: case_methods.iter().map(|(_, m)| m.len()).sum::<usize>() * args.runs as usize,
        done: 0,
    };
    let mut samples = Vec::with_capacity(progress.total);
    let mut node_times: Vec<(Case, Method, NodeTime)> = Vec::new();
    for (case, methods) in &case_methods {
        let case = *case;
        for run in 1..=args.runs {
            for &method in methods {
                progress.show(&format!(
                    "{case}, {} GiB, run {run}/{}: {method}",
                    args.size_gib, args.runs
                ));
                let m = measure(method, case, args, &bins)?;
                progress.done += 1;
                samples.push(Sample {
                    case,
                    method,
                    size_gib: args.size_gib,
                    chunk_mib: method.chunk_mib(args.chunk_mib, args.size_gib, case.backing),
                    run,
                    seconds: m.seconds,
                    reply_ms: m.reply_ms,
                    phases: m.phases,
                    live: m.live,
                    resident: m.resident,
                    populate_ms: m.populate_ms,
                    touched_mib: m.touched_mib,
                });
                node_times.extend(m.nodes.into_iter().map(|n| (case, method, n)));
            }
        }
    }
    progress.finish();

    let rows = report::rows(&samples);
    let mut out = std::io::stdout().lock();
    let _ = write!(out, "{}", report::table(&rows, &unavailable));
    let _ = write!(out, "{}", report::reply_text(&samples));
    let _ = write!(out, "{}", report::phases_text(&samples));
    let _ = write!(out, "{}", report::populate_text(&samples));
    let _ = write!(out, "{}", report::live_text(&samples));
    if let Some(line) = &peers_line {
        let _ = writeln!(out, "{line}");
    }
    let _ = write!(out, "{}", peers_text::resident_text(&samples));
    let thp = |name: &str| {
        std::fs::read_to_string(
            args.sysfs_root
                .join("kernel/mm/transparent_hugepage")
                .join(name),
        )
        .ok()
    };
    let mut notes = peers_text::huge_page_notes(
        &samples,
        thp("enabled").as_deref(),
        thp("shmem_enabled").as_deref(),
    );
    for note in &notes {
        let _ = writeln!(out, "{note}");
    }
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
            notes.push(note);
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
            "Freeing {} GiB of touched memory, median of {} run(s) each",
            args.size_gib, args.runs
        );
        write_file(path, &svg::plot(&rows, &title, &notes))?;
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
            methods(&[1, 4], true),
            [
                Method::Munmap,
                Method::Exit,
                Method::Mrelease,
                Method::Teravm(1),
                Method::Teravm(4)
            ]
        );
        assert_eq!(
            methods(&[2], false),
            [Method::Munmap, Method::Exit, Method::Teravm(2)]
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
