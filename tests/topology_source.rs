//! The host topology from sysfs and from the kernel itself (a jail has no
//! `/sys`), with the real binary: once with the default `/sys` and once
//! with an empty `--sysfs-root`, both with default flags (seccomp on). Both
//! summaries name the same nodes and CPUs, each its own source, and the
//! reclaim is still per node.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use common::*;

const T: Duration = Duration::from_secs(120);

/// Runs a 256 MiB guest that touches all its memory, with `extra` flags;
/// returns the summary line.
fn summary_of(dir: &Path, extra: &[&str]) -> String {
    let cfg = config_file(dir, &config_json(2, 256, "touch=all then=reset", ""));
    let mut args = vec!["--config-file", cfg.to_str().unwrap(), "--no-api"];
    args.extend_from_slice(extra);
    let (code, stdout, stderr) = run(&args, T);
    assert_eq!(code, 0, "{extra:?}: stderr: {stderr}\nstdout: {stdout:?}");
    let line = stderr
        .lines()
        .find(|l| l.starts_with("teravm: reclaimed "))
        .unwrap_or_else(|| panic!("{extra:?}: no summary: {stderr}"));
    line.to_string()
}

/// The topology part of a summary: (`node: CPUs` as listed, the source).
fn topology(line: &str) -> (BTreeMap<u32, Vec<usize>>, String) {
    let rest = line
        .split_once("; topology: ")
        .unwrap_or_else(|| panic!("no topology in {line:?}"))
        .1;
    let (nodes, rest) = rest
        .split_once(") from ")
        .unwrap_or_else(|| panic!("no source in {line:?}"));
    let source = rest.split("; memory limit: ").next().unwrap().to_string();
    let list = nodes
        .split_once(" (")
        .unwrap_or_else(|| panic!("no node list in {line:?}"))
        .1;
    let mut map = BTreeMap::new();
    for node in list.split(", node ") {
        let node = node.trim_start_matches("node ");
        let (id, cpus) = node
            .split_once(": ")
            .unwrap_or_else(|| panic!("{node:?} in {line:?}"));
        let cpus = match cpus {
            "no CPUs" => Vec::new(),
            list => cpus_of(list.strip_prefix("CPUs ").unwrap()),
        };
        map.insert(id.parse().unwrap(), cpus);
    }
    (map, source)
}

/// The kernel's list syntax (`0-3,8`).
fn cpus_of(list: &str) -> Vec<usize> {
    let mut out = Vec::new();
    for part in list.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => out.extend(a.parse::<usize>().unwrap()..=b.parse().unwrap()),
            None => out.push(part.parse().unwrap()),
        }
    }
    out
}

/// This process's CPUs (the child inherits them).
fn affinity() -> Vec<usize> {
    // SAFETY: cpu_set_t is plain data; all zeroes is an empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: the kernel writes at most size_of::<cpu_set_t>() bytes.
    let r = unsafe { libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set) };
    assert_eq!(r, 0);
    // SAFETY: CPU_ISSET reads the set below its capacity.
    (0..1024)
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect()
}

#[test]
fn sysfs_and_the_kernel_give_the_same_topology() {
    if !kvm_or_skip("sysfs_and_the_kernel_give_the_same_topology") {
        return;
    }
    let dir = temp_dir("topology-source");
    let empty = dir.join("empty-sys");
    std::fs::create_dir_all(&empty).unwrap();

    let from_sysfs = summary_of(&dir, &[]);
    let from_kernel = summary_of(&dir, &["--sysfs-root", empty.to_str().unwrap()]);

    let (sys_nodes, sys_source) = topology(&from_sysfs);
    let (kernel_nodes, kernel_source) = topology(&from_kernel);
    assert_eq!(sys_source, "/sys/devices/system/node", "{from_sysfs}");
    assert!(
        kernel_source.starts_with("the kernel (get_mempolicy, getcpu")
            && kernel_source.ends_with(&format!(
                "): no {}",
                empty.join("devices/system/node").display()
            )),
        "{from_kernel}"
    );
    // Sysfs lists a node's every CPU, the kernel this process's: the same
    // within the mask this test runs under.
    let mask = affinity();
    let in_mask: BTreeMap<u32, Vec<usize>> = sys_nodes
        .iter()
        .map(|(&id, cpus)| {
            (
                id,
                cpus.iter().copied().filter(|c| mask.contains(c)).collect(),
            )
        })
        .collect();
    assert!(!kernel_nodes.is_empty());
    assert_eq!(kernel_nodes, in_mask, "{from_sysfs}\n{from_kernel}");
    // The host's own list, read here, is what both said.
    let online = std::fs::read_to_string("/sys/devices/system/node/online").unwrap();
    assert_eq!(
        sys_nodes.keys().map(|&n| n as usize).collect::<Vec<_>>(),
        cpus_of(&online),
        "{from_sysfs}"
    );

    // The reclaim, per node, over the nodes each found.
    for line in [&from_sysfs, &from_kernel] {
        let s = teravm_client::host::parse_summary(line)
            .unwrap_or_else(|| panic!("unparsed summary {line:?}"));
        assert!(
            s.mib >= 200,
            "reclaimed {} MiB of 252 touched: {line}",
            s.mib
        );
        let (nodes, _) = topology(line);
        assert!(
            s.nodes >= 1 && s.nodes as usize <= nodes.len(),
            "reclaimed over {} nodes of {}: {line}",
            s.nodes,
            nodes.len()
        );
        // Both name where the memory limit came from.
        assert!(line.contains("; memory limit: "), "{line}");
        assert!(
            line.contains("; host memory: MemAvailable (/proc/meminfo)"),
            "{line}"
        );
    }
    assert_eq!(
        teravm_client::host::parse_summary(&from_sysfs).map(|s| (s.nodes, s.workers)),
        teravm_client::host::parse_summary(&from_kernel).map(|s| (s.nodes, s.workers)),
        "{from_sysfs}\n{from_kernel}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
