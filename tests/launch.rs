//! Launch and destroy microVMs with the real binary on the real /dev/kvm:
//! firmware output, reset, signals, crashes, 1 TiB sparse guests, NUMA
//! nodes from a fake sysfs tree, populate, and bad config files.

mod common;

use std::time::Duration;

use common::*;

const T: Duration = Duration::from_secs(120);

fn firmware_lines(stdout: &[String]) -> Vec<&str> {
    stdout
        .iter()
        .filter(|l| l.starts_with("teravm firmware: "))
        .map(String::as_str)
        .collect()
}

fn boot_and_reset(vcpus: u32) {
    let dir = temp_dir("reset");
    let cfg = config_file(&dir, &config_json(vcpus, 256, "touch=64 then=reset", ""));
    let (code, stdout, stderr) = run(&["--config-file", cfg.to_str().unwrap(), "--no-api"], T);
    assert_eq!(code, 0, "stderr: {stderr}");
    let fw = firmware_lines(&stdout);
    assert_eq!(fw.len(), 3, "{stdout:?}");
    assert_eq!(fw[0], format!("teravm firmware: vcpus={vcpus} mem_mib=256"));
    assert!(
        fw[1].starts_with("teravm firmware: touched 64 MiB in "),
        "{}",
        fw[1]
    );
    assert!(fw[1].ends_with(" ms"), "{}", fw[1]);
    assert_eq!(fw[2], "teravm firmware: reset");
    let (mib, _, nodes) = summary(&stderr);
    assert!(
        mib >= 58,
        "reclaimed only {mib} MiB of 64 touched: {stdout:?}"
    );
    assert!(nodes >= 1);
}

#[test]
fn one_vcpu_touches_and_resets() {
    if kvm_or_skip("one_vcpu_touches_and_resets") {
        boot_and_reset(1);
    }
}

#[test]
fn two_vcpus_touch_and_reset() {
    if kvm_or_skip("two_vcpus_touch_and_reset") {
        boot_and_reset(2);
    }
}

fn idle_then_signal(signo: i32) {
    let dir = temp_dir("signal");
    let cfg = config_file(&dir, &config_json(2, 256, "touch=32 then=idle", ""));
    let mut vmm = Vmm::spawn(&["--config-file", cfg.to_str().unwrap(), "--no-api"]);
    vmm.wait_line("teravm firmware: idle", T);
    vmm.signal(signo);
    let (code, stdout, stderr) = vmm.wait(T);
    assert_eq!(code, 0, "stderr: {stderr}");
    let (mib, _, _) = summary(&stderr);
    assert!(mib >= 28, "reclaimed {mib} MiB: {stdout:?}");
}

#[test]
fn idle_guest_stops_on_sigterm() {
    if kvm_or_skip("idle_guest_stops_on_sigterm") {
        idle_then_signal(libc::SIGTERM);
    }
}

#[test]
fn idle_guest_stops_on_sigint() {
    if kvm_or_skip("idle_guest_stops_on_sigint") {
        idle_then_signal(libc::SIGINT);
    }
}

#[test]
fn triple_fault_is_reported_as_a_crash_and_memory_is_freed() {
    if !kvm_or_skip("triple_fault") {
        return;
    }
    let dir = temp_dir("crash");
    let cfg = config_file(&dir, &config_json(1, 128, "fault=triple", ""));
    let (code, stdout, stderr) = run(&["--config-file", cfg.to_str().unwrap(), "--no-api"], T);
    assert_eq!(code, 3, "stdout {stdout:?} stderr {stderr}");
    assert!(stderr.contains("triple-faulted"), "{stderr}");
    summary(&stderr);
}

#[test]
fn terabyte_sparse_guest_launches_and_shuts_down() {
    if !kvm_or_skip("terabyte_sparse_guest") {
        return;
    }
    let _big = big_memory();
    let dir = temp_dir("1t");
    let cfg = config_file(&dir, &config_json(2, 1 << 20, "touch=64 then=reset", ""));
    let (code, stdout, stderr) = run(&["--config-file", cfg.to_str().unwrap(), "--no-api"], T);
    assert_eq!(code, 0, "stderr: {stderr}");
    let fw = firmware_lines(&stdout);
    assert_eq!(fw[0], "teravm firmware: vcpus=2 mem_mib=1048576");
    assert!(
        fw[1].starts_with("teravm firmware: touched 64 MiB"),
        "{fw:?}"
    );
    let (mib, _, _) = summary(&stderr);
    assert!(
        (58..1024).contains(&mib),
        "reclaimed {mib} MiB of a 64 MiB touch"
    );
    // Larger than this host (unless it has over 1 TiB): said once, at start.
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
    let total = teravm::memory::admission::meminfo_bytes(&meminfo, "MemTotal").unwrap();
    if total < 1 << 40 {
        let said = stderr
            .lines()
            .filter(|l| l.contains("the guest's 1048576 MiB exceed"))
            .count();
        assert_eq!(said, 1, "{stderr}");
        assert!(stderr.contains("OOM-killed"), "{stderr}");
    }
}

#[test]
fn four_gib_guest_dirties_everything_and_gets_it_back() {
    if !kvm_or_skip("four_gib_guest") {
        return;
    }
    let _big = big_memory();
    let cfg = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("resources/vm-4g.json");
    let mut vmm = Vmm::spawn(&["--config-file", cfg.to_str().unwrap(), "--no-api"]);
    let touched = vmm.wait_line("teravm firmware: touched", T);
    // 4 GiB of RAM less the firmware's own 6 MiB.
    assert!(
        touched.starts_with("teravm firmware: touched 409"),
        "{touched}"
    );
    let (code, stdout, stderr) = vmm.wait(T);
    assert_eq!(code, 0, "stderr: {stderr}");
    let (mib, workers, nodes) = summary(&stderr);
    assert!(
        mib >= 4096 * 9 / 10,
        "reclaimed {mib} MiB of 4 GiB: {stdout:?}"
    );
    assert_eq!(workers, 2 * nodes, "{stdout:?}");
}

fn four_fake_nodes(by_signal: bool) {
    let _big = big_memory();
    let dir = temp_dir("numa4");
    let sys = fake_sysfs(&dir, 4);
    let then = if by_signal { "idle" } else { "reset" };
    let json = config_json(
        2,
        4096,
        &format!("touch=all then={then}"),
        r#", "memory": {"numa_policy": "none"}, "reclaim": {"workers_per_node": 2}"#,
    );
    let cfg = config_file(&dir, &json);
    let mut vmm = Vmm::spawn(&[
        "--config-file",
        cfg.to_str().unwrap(),
        "--no-api",
        "--sysfs-root",
        sys.to_str().unwrap(),
    ]);
    let touched = vmm.wait_line("teravm firmware: touched", T);
    let touched_mib: u64 = touched.split_whitespace().nth(3).unwrap().parse().unwrap();
    if by_signal {
        vmm.wait_line("teravm firmware: idle", T);
        vmm.signal(libc::SIGTERM);
    }
    let (code, stdout, stderr) = vmm.wait(T);
    assert_eq!(code, 0, "stderr: {stderr}");
    let (mib, workers, nodes) = summary(&stderr);
    assert_eq!(nodes, 4, "{stdout:?}");
    assert_eq!(workers, 8, "{stdout:?}");
    assert!(
        mib * 10 >= touched_mib * 9,
        "reclaimed {mib} of {touched_mib} MiB"
    );
}

#[test]
fn four_fake_nodes_reset() {
    if kvm_or_skip("four_fake_nodes_reset") {
        four_fake_nodes(false);
    }
}

#[test]
fn four_fake_nodes_sigterm() {
    if kvm_or_skip("four_fake_nodes_sigterm") {
        four_fake_nodes(true);
    }
}

#[test]
fn populate_makes_memory_resident_before_the_firmware_runs() {
    if !kvm_or_skip("populate") {
        return;
    }
    let _big = big_memory();
    let dir = temp_dir("populate");
    let json = config_json(
        1,
        1024,
        "touch=0 then=idle",
        r#", "memory": {"populate": true}"#,
    );
    let cfg = config_file(&dir, &json);
    let mut vmm = Vmm::spawn(&["--config-file", cfg.to_str().unwrap(), "--no-api"]);
    vmm.wait_line("teravm firmware: vcpus=1", T);
    let rss = vmm.rss_bytes();
    vmm.wait_line("teravm firmware: idle", T);
    vmm.signal(libc::SIGTERM);
    let (code, _, stderr) = vmm.wait(T);
    assert_eq!(code, 0, "stderr: {stderr}");
    assert!(
        rss >= 1000 << 20,
        "resident {} MiB at the firmware's first line",
        rss >> 20
    );
    let (mib, _, _) = summary(&stderr);
    assert!(
        mib >= 1000,
        "reclaimed {mib} MiB of a populated 1 GiB guest"
    );
}

fn bad_config(json: Option<&str>, expect: &str) {
    let dir = temp_dir("bad");
    let path = match json {
        Some(j) => config_file(&dir, j),
        None => dir.join("missing.json"),
    };
    let (code, stdout, stderr) = run(&["--config-file", path.to_str().unwrap(), "--no-api"], T);
    assert_eq!(code, 1, "stdout {stdout:?} stderr {stderr}");
    assert_eq!(
        stderr.trim_end().lines().count(),
        1,
        "not one line: {stderr}"
    );
    assert!(stderr.contains(expect), "{stderr:?} lacks {expect:?}");
    assert!(firmware_lines(&stdout).is_empty());
}

#[test]
fn bad_config_files_exit_1_with_one_line() {
    bad_config(
        Some(r#"{"machine-config": {"vcpu_count": 1, "mem_size_mib": 128, "cpus": 2}}"#),
        "unknown field `cpus`",
    );
    bad_config(
        Some(r#"{"machine-config": {"vcpu_count": 0, "mem_size_mib": 128}}"#),
        "machine-config.vcpu_count",
    );
    bad_config(
        Some(r#"{"machine-config": {"vcpu_count": "one", "mem_size_mib": 128}}"#),
        "invalid type",
    );
    bad_config(None, "cannot read config file");
    bad_config(Some("this is not json"), "invalid config file");
}

#[test]
fn a_node_the_host_lacks_is_refused_at_launch() {
    if kvm_or_skip("a_node_the_host_lacks") {
        bad_config(
            Some(r#"{"memory": {"host_nodes": [7], "numa_policy": "bind"}}"#),
            "node 7",
        );
    }
}

#[test]
fn no_api_needs_a_config_file() {
    let (code, _, stderr) = run(&["--no-api"], T);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("--config-file"), "{stderr}");
    // Without either, the API is on Firecracker's default socket,
    // /run/firecracker.socket: a host-wide path, so that is run in a
    // chroot of its own (tests/jailer.rs, Kata's jailed mode).
}

#[test]
fn serial_output_also_goes_to_a_file_when_asked() {
    if !kvm_or_skip("serial_file") {
        return;
    }
    let dir = temp_dir("serialfile");
    let cfg = config_file(&dir, &config_json(1, 128, "touch=8 then=reset", ""));
    let file = dir.join("serial.log");
    let (code, stdout, stderr) = run(
        &[
            "--config-file",
            cfg.to_str().unwrap(),
            "--no-api",
            "--serial-file",
            file.to_str().unwrap(),
        ],
        T,
    );
    assert_eq!(code, 0, "{stderr}");
    let logged = std::fs::read_to_string(&file).unwrap();
    let on_stdout: Vec<&str> = firmware_lines(&stdout);
    let in_file: Vec<&str> = logged.lines().collect();
    assert_eq!(in_file, on_stdout, "{logged:?}");
    assert_eq!(in_file.len(), 3);
    // A file that cannot be opened is a one-line error before anything starts.
    let bad = dir.join("no/such/dir/serial.log");
    let (code, stdout, stderr) = run(
        &[
            "--config-file",
            cfg.to_str().unwrap(),
            "--no-api",
            "--serial-file",
            bad.to_str().unwrap(),
        ],
        T,
    );
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("--serial-file: cannot use") && stderr.contains("No such file"),
        "{stderr}"
    );
    assert!(firmware_lines(&stdout).is_empty());
}
