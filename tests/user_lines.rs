//! teravm's own lines as a user reads them, on the real binary and
//! /dev/kvm with the default flags: the summary once at `--level info`
//! (and once in a log path), counts with their plural right, and a panic's
//! line saying "panicked at" once.

mod common;

use common::api::T;
use common::*;

/// The 1 vCPU, 64 MiB firmware run to its reset, with `flags`; returns
/// (exit code, stderr).
fn small_run(name: &str, flags: &[&str], env: &[(&str, &str)]) -> (i32, String) {
    let dir = temp_dir(name);
    let cfg = config_file(&dir, &config_json(1, 64, "touch=16 then=reset", ""));
    let mut args = vec!["--config-file", cfg.to_str().unwrap(), "--no-api"];
    args.extend_from_slice(flags);
    let (code, _, stderr) = Vmm::spawn_env(&args, env).wait(T);
    (code, stderr)
}

fn summaries(text: &str) -> Vec<&str> {
    text.lines()
        .filter(|l| l.contains("teravm: reclaimed "))
        .collect()
}

#[test]
fn the_summary_is_printed_once_at_level_info() {
    if !kvm_or_skip("the_summary_is_printed_once_at_level_info") {
        return;
    }
    let (code, stderr) = small_run("summary-once", &["--level", "info"], &[]);
    assert_eq!(code, 0, "{stderr}");
    // Info lines are there (the level took), and the summary is once.
    assert!(stderr.contains(" INFO "), "{stderr}");
    assert_eq!(summaries(&stderr).len(), 1, "{stderr}");

    // With a log path, the summary is on stderr once and in the log once.
    let dir = temp_dir("summary-log");
    let log = dir.join("teravm.log");
    let log_arg = log.to_str().unwrap().to_string();
    let (code, stderr) = small_run(
        "summary-log-run",
        &["--level", "info", "--log-path", &log_arg],
        &[],
    );
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(summaries(&stderr).len(), 1, "{stderr}");
    let logged = std::fs::read_to_string(&log).unwrap();
    assert_eq!(summaries(&logged).len(), 1, "{logged}");
}

#[test]
fn one_worker_and_one_node_are_singular() {
    if !kvm_or_skip("one_worker_and_one_node_are_singular") {
        return;
    }
    // One node, whatever the host has.
    let dir = temp_dir("singular-sysfs");
    let sysfs = fake_sysfs(&dir, 1);
    let sysfs_arg = sysfs.to_str().unwrap().to_string();
    let (code, stderr) = small_run("singular", &["--sysfs-root", &sysfs_arg], &[]);
    assert_eq!(code, 0, "{stderr}");
    let lines = summaries(&stderr);
    assert_eq!(lines.len(), 1, "{stderr}");
    // A 64 MiB guest on one node: one worker.
    assert!(lines[0].contains(" GiB/s, 1 worker, 1 node)"), "{stderr}");
    // The parsers of the tests and the bench still read it.
    assert_eq!(summary(&stderr).1, 1);
    assert_eq!(summary(&stderr).2, 1);
}

#[test]
fn a_panic_says_panicked_at_once() {
    if !kvm_or_skip("a_panic_says_panicked_at_once") {
        return;
    }
    let (code, stderr) = small_run("panic-line", &[], &[("TERAVM_FAULT_INJECT", "vcpu-panic")]);
    assert_eq!(code, 3, "{stderr}");
    assert!(!stderr.contains("panicked at panicked at"), "{stderr}");
    let line = stderr
        .lines()
        .find(|l| l.starts_with("thread 'vcpu0' panicked at "))
        .unwrap_or_else(|| panic!("no panic line in {stderr}"));
    // The location, as the default hook prints it, then the message.
    assert!(line.contains("src/") && line.ends_with(':'), "{line}");
    assert!(
        stderr.contains("injected vCPU panic (TERAVM_FAULT_INJECT)"),
        "{stderr}"
    );
}
