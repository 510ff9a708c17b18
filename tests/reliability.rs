//! Reliability: guest faults, process faults and long runs end with the
//! memory reclaimed, a clear exit code and log line, and nothing left behind.
//!
//! The long runs are in `tests/long_runs.rs`, alone in their binary.

mod common;

use std::time::{Duration, Instant};

use common::*;

const T: Duration = Duration::from_secs(180);

fn cfg_args(cfg: &std::path::Path) -> Vec<String> {
    vec![
        "--config-file".into(),
        cfg.to_str().unwrap().into(),
        "--no-api".into(),
        "--log-level".into(),
        "info".into(),
    ]
}

/// CPU time (user + system, in clock ticks) of `pid`'s thread named
/// `name`; 0 while there is none.
fn thread_cpu_ticks(pid: u32, name: &str) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    for task in tasks.flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if comm.trim_end() != name {
            continue;
        }
        let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
        // Fields after the command: state is the 3rd of the line, utime
        // and stime the 14th and 15th.
        let fields: Vec<&str> = stat
            .rsplit_once(") ")
            .map_or(Vec::new(), |(_, rest)| rest.split(' ').collect());
        let tick = |i: usize| {
            fields
                .get(i)
                .and_then(|f| f.parse::<u64>().ok())
                .unwrap_or(0)
        };
        return tick(11) + tick(12);
    }
    0
}

fn spawn_cfg(json: &str, env: &[(&str, &str)]) -> Vmm {
    let dir = temp_dir("rel");
    let cfg = config_file(&dir, json);
    let args = cfg_args(&cfg);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Vmm::spawn_env(&args, env)
}

#[test]
fn guest_writing_an_unknown_port_forever_is_logged_once_and_stops() {
    if !kvm_or_skip("unknown_port_loop") {
        return;
    }
    let mut vmm = spawn_cfg(&config_json(1, 256, "touch=32 fault=ports", ""), &[]);
    let touched = vmm.wait_line("teravm firmware: touched", T);
    // The first write is logged; the guest goes on writing the port (its
    // vCPU thread keeps running: 200 ms more of its CPU time) and nothing
    // more is logged.
    vmm.wait_err_line("port 0xf70", T);
    let vcpu = thread_cpu_ticks(vmm.child.id(), "vcpu0");
    let deadline = Instant::now() + T;
    while thread_cpu_ticks(vmm.child.id(), "vcpu0") < vcpu + 20 {
        assert!(
            Instant::now() < deadline,
            "the guest stopped writing the port"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    vmm.signal(libc::SIGTERM);
    let (code, stdout, stderr) = vmm.wait(T);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(stderr.matches("port 0xf70").count(), 1, "{stderr}");
    let (mib, _, _) = summary(&stderr);
    assert!(mib * 10 >= touched_mib(&touched) * 9, "{stdout:?}");
}

#[test]
fn guest_that_never_touches_memory_shuts_down_with_little_to_free() {
    if !kvm_or_skip("never_touches") {
        return;
    }
    let vmm = spawn_cfg(&config_json(2, 2048, "touch=0 then=reset", ""), &[]);
    let (code, stdout, stderr) = vmm.wait(T);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stdout
            .iter()
            .any(|l| l == "teravm firmware: touched 0 MiB in 0 ms"
                || l.starts_with("teravm firmware: touched 0 MiB")),
        "{stdout:?}"
    );
    let (mib, _, _) = summary(&stderr);
    // Only the firmware's own pages (code, stacks, page tables) were touched.
    assert!(mib <= 16, "reclaimed {mib} MiB of an untouched guest");
}

#[test]
fn guest_still_writing_while_shutdown_runs_is_stopped_and_freed() {
    if !kvm_or_skip("keeps_writing") {
        return;
    }
    let _big = big_memory();
    let mut vmm = spawn_cfg(
        &config_json(2, 1024, "touch=all keep=writing then=idle", ""),
        &[],
    );
    let touched = vmm.wait_line("teravm firmware: touched", T);
    vmm.wait_line("teravm firmware: idle", T);
    vmm.signal(libc::SIGTERM);
    let (code, stdout, stderr) = vmm.wait(T);
    assert_eq!(code, 0, "{stderr}");
    let (mib, _, _) = summary(&stderr);
    assert!(
        mib * 10 >= touched_mib(&touched) * 9,
        "reclaimed {mib}: {stdout:?}"
    );
}

#[test]
fn sigterm_during_populate_still_shuts_down_cleanly() {
    if !kvm_or_skip("sigterm_during_populate") {
        return;
    }
    let _big = big_memory();
    let json = r#"{"machine-config": {"vcpu_count": 1, "mem_size_mib": 3072, "huge_pages": "None"},
        "boot-source": {"boot_args": "touch=0 then=idle"},
        "memory": {"populate": true}}"#;
    let vmm = spawn_cfg(json, &[]);
    // Populate is under way once teravm holds a few hundred MiB.
    let deadline = std::time::Instant::now() + T;
    while vmm.rss_bytes() < 256 << 20 {
        assert!(std::time::Instant::now() < deadline, "populate never began");
        std::thread::sleep(Duration::from_millis(5));
    }
    let held = vmm.rss_bytes();
    vmm.signal(libc::SIGTERM);
    let (code, stdout, stderr) = vmm.wait(T);
    assert_eq!(code, 0, "stdout {stdout:?} stderr {stderr}");
    // SIGTERM cancels populate: the guest never ran, and what was
    // populated is freed.
    assert!(stdout.is_empty(), "the firmware ran: {stdout:?}");
    let (mib, _, _) = summary(&stderr);
    assert!(
        mib << 20 >= held - (64 << 20),
        "reclaimed {mib} MiB; teravm held {} MiB at the signal: {stderr}",
        held >> 20
    );
}

#[test]
fn second_sigterm_does_not_abort_reclaim() {
    if !kvm_or_skip("second_sigterm") {
        return;
    }
    let _big = big_memory();
    let json = r#"{"machine-config": {"vcpu_count": 1, "mem_size_mib": 3072, "huge_pages": "None"},
        "boot-source": {"boot_args": "touch=0 then=idle"},
        "memory": {"populate": true},
        "reclaim": {"workers_per_node": 1, "chunk_mib": 16}}"#;
    let mut vmm = spawn_cfg(json, &[]);
    vmm.wait_line("teravm firmware: idle", T);
    vmm.signal(libc::SIGTERM);
    // Reclaim has begun once this is logged (the event loop logs it as it
    // hands the microVM to the reclaim job, before it handles another
    // signal). Freeing 3 GiB of 4 KiB pages in 16 MiB chunks with one
    // worker lasts far longer than the next two signals take to arrive.
    vmm.wait_err_line("shutting down: Signal", T);
    vmm.signal(libc::SIGTERM);
    vmm.signal(libc::SIGINT);
    let (code, _, stderr) = vmm.wait(T);
    assert_eq!(code, 0, "{stderr}");
    let (mib, _, _) = summary(&stderr);
    assert!(mib >= 3000, "reclaimed only {mib} MiB: {stderr}");
    for name in ["SIGTERM", "SIGINT"] {
        assert!(
            stderr.contains(&format!("{name} received during reclaim")),
            "the second {name} was not seen during reclaim: {stderr}"
        );
    }
    assert!(!stderr.contains("received after reclaim"), "{stderr}");
}

#[test]
fn panicking_reclaim_worker_still_frees_everything() {
    if !kvm_or_skip("reclaim_worker_panic") {
        return;
    }
    let _big = big_memory();
    let json = r#"{"machine-config": {"vcpu_count": 2, "mem_size_mib": 2048},
        "boot-source": {"boot_args": "touch=all then=reset"},
        "reclaim": {"workers_per_node": 2, "chunk_mib": 64, "parallel_threshold_mib": 0}}"#;
    let vmm = spawn_cfg(json, &[("TERAVM_FAULT_INJECT", "reclaim-worker-panic")]);
    let (code, stdout, stderr) = vmm.wait(T);
    assert_eq!(code, 4, "stdout {stdout:?} stderr {stderr}");
    assert!(stderr.contains("panicked"), "{stderr}");
    assert!(
        stderr.contains("freeing 1 chunk(s) left by failed workers"),
        "{stderr}"
    );
    let touched = stdout.iter().find(|l| l.contains("touched")).unwrap();
    let (mib, _, _) = summary(&stderr);
    assert!(
        mib * 10 >= touched_mib(touched) * 9,
        "reclaimed {mib}: {stdout:?}"
    );
}

#[test]
fn panicking_vcpu_is_a_crash_and_memory_is_freed() {
    if !kvm_or_skip("vcpu_panic") {
        return;
    }
    let vmm = spawn_cfg(
        &config_json(2, 256, "touch=64 then=idle", ""),
        &[("TERAVM_FAULT_INJECT", "vcpu-panic")],
    );
    let (code, _, stderr) = vmm.wait(T);
    assert_eq!(code, 3, "{stderr}");
    assert!(
        stderr.contains("vcpu0: the vCPU thread panicked"),
        "{stderr}"
    );
    summary(&stderr);
}
