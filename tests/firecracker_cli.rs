//! Firecracker's command line and its logger and metrics on the real
//! binary: flags refused with one line and exit 1, `--id` and
//! `--config-file` checks, the log and metrics flags (file and FIFO, line by
//! line), `PATCH /machine-config`, `GET /version`, `FlushMetrics`, and a log
//! FIFO that nobody reads.

mod common;

use std::path::Path;

use common::api::*;
use common::client::request;
use common::*;
use serde_json::Value;

/// A run that must fail at once with one line naming `needle`, exit 1.
fn refused(args: &[&str], needle: &str) {
    let (code, stdout, stderr) = run(args, T);
    assert_eq!(code, 1, "{args:?}: {stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{args:?}: {stderr}");
    assert!(stderr.contains(needle), "{args:?}: {stderr}");
    assert!(stdout.is_empty(), "{stdout:?}");
}

#[test]
fn flags_teravm_lacks_and_bad_values_are_refused_in_one_line() {
    let dir = temp_dir("cli-refused");
    let sock = dir.join("api.sock");
    let s = sock.to_str().unwrap();
    refused(
        &["--api-sock", s, "--metadata", "/m.json"],
        "--metadata /m.json: No such file",
    );
    refused(
        &["--api-sock", s, "--seccomp-filter", "/f.bpf"],
        "--seccomp-filter is not supported",
    );
    refused(
        &["--api-sock", s, "--enable-pci"],
        "--enable-pci is not supported",
    );
    refused(&["--api-sock", s, "--id", "bad id"], "invalid --id");
    refused(&["--api-sock", s, "--id", "evil\nline"], "invalid --id");
    refused(
        &["--api-sock", s, "--id", &"a".repeat(65)],
        "invalid --id: 65 bytes",
    );
    refused(&["--api-sock", s, "--level", "Loud"], "not a log level");
    refused(
        &["--api-sock", s, "--http-api-max-payload-size", "0"],
        "at least 1",
    );
    refused(&["--api-sock", s, "--module", "a b"], "logger.module");
    refused(
        &["--no-api", "--config-file", "/dev/zero"],
        "larger than 1048576 bytes",
    );
    let cfg = config_file(&dir, r#"{"drives": [{"drive_id": "rootfs"}]}"#);
    refused(
        &["--no-api", "--config-file", cfg.to_str().unwrap()],
        "missing field `is_root_device`",
    );
    // A drive whose file is missing: one line naming it, before anything
    // starts (opened at start-up, as over the API at PUT time).
    let cfg = config_file(
        &dir,
        r#"{"drives": [{"drive_id": "rootfs", "path_on_host": "/nonexistent.img", "is_root_device": true}]}"#,
    );
    refused(
        &["--no-api", "--config-file", cfg.to_str().unwrap()],
        "drives.path_on_host: cannot use /nonexistent.img",
    );
    let cfg = config_file(
        &dir,
        r#"{"network-interfaces": [{"iface_id": "eth0", "host_dev_name": "no-such-tap9"}]}"#,
    );
    refused(
        &["--no-api", "--config-file", cfg.to_str().unwrap()],
        "no-such-tap9",
    );
    refused(
        &["--api-sock", s, "--log-path", "/nonexistent-dir/teravm.log"],
        "--log-path: logger.log_path: cannot use /nonexistent-dir/teravm.log",
    );
    assert!(!sock.exists(), "a refused launch left a socket");
}

#[test]
fn firecracker_flags_are_accepted() {
    let dir = temp_dir("cli-accepted");
    let sock = dir.join("api.sock");
    let (log, metrics) = (dir.join("fc.log"), dir.join("fc.metrics"));
    // Everything the jailer and the clients pass, in Firecracker's spelling
    // (but `--no-seccomp`: the flags' paths run under the default filters).
    let vmm = Vmm::spawn(&[
        "--api-sock",
        sock.to_str().unwrap(),
        "--id",
        "fc-cli-1",
        "--level",
        "Debug",
        "--log-path",
        log.to_str().unwrap(),
        "--show-level",
        "--show-log-origin",
        "--metrics-path",
        metrics.to_str().unwrap(),
        "--boot-timer",
        // `--no-seccomp` is Firecracker's too; its own test is in
        // tests/seccomp.rs. Here every other flag runs under the filters.
        "--http-api-max-payload-size",
        "51200",
        "--start-time-us",
        "1",
        "--start-time-cpu-us",
        "0",
        "--parent-cpu-time-us",
        "1000",
    ]);
    wait_for_api(&sock, T);
    assert_eq!(
        get(&sock, "/version")["firecracker_version"],
        env!("CARGO_PKG_VERSION")
    );
    // PATCH before start: partial, validated as a whole, GET shows all.
    let (s, b) = request(
        &sock,
        "PATCH",
        "/machine-config",
        Some(r#"{"mem_size_mib": 256}"#),
    )
    .unwrap();
    assert_eq!(s, 204, "{b}");
    let (s, b) = request(
        &sock,
        "PATCH",
        "/machine-config",
        Some(r#"{"huge_pages": "1G"}"#),
    )
    .unwrap();
    assert_fault(s, &b, 400, "machine-config.mem_size_mib");
    let (s, b) = request(
        &sock,
        "PATCH",
        "/machine-config",
        Some(r#"{"smt": true, "vcpu_count": 3}"#),
    )
    .unwrap();
    assert_fault(s, &b, 400, "machine-config.vcpu_count");
    let (s, b) = request(
        &sock,
        "PATCH",
        "/machine-config",
        Some(r#"{"track_dirty_pages": true}"#),
    )
    .unwrap();
    assert_eq!(s, 204, "{b}");
    let mc = get(&sock, "/machine-config");
    assert_eq!(
        mc,
        serde_json::json!({"vcpu_count": 1, "mem_size_mib": 256, "smt": false,
            "track_dirty_pages": true, "huge_pages": "Transparent", "cpu_template": "None"})
    );
    // Metrics are set up once, as in Firecracker.
    let (s, b) = put(
        &sock,
        "/metrics",
        &format!(r#"{{"metrics_path": "{}"}}"#, dir.join("m2").display()),
    );
    assert_fault(s, &b, 400, "already");
    // As in Firecracker, a flush waits for the start.
    let (s, b) = action(&sock, r#"{"action_type": "FlushMetrics"}"#);
    assert_fault(s, &b, 400, "not supported before starting");
    put_ok(&sock, "/boot-source", r#"{"boot_args": "then=idle"}"#);
    let (s, b) = action(&sock, r#"{"action_type": "InstanceStart"}"#);
    assert_eq!(s, 204, "{b}");
    let (s, b) = action(&sock, r#"{"action_type": "FlushMetrics"}"#);
    assert_eq!(s, 204, "{b}");
    vmm.signal(libc::SIGTERM);
    exits_ok(vmm);
    // Log: "<time> [fc-cli-1:<thread>:<LEVEL>:<file>:<line>] message".
    let text = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].contains("Running teravm v"), "{text}");
    for l in &lines {
        let tag = &l[l.find('[').unwrap() + 1..l.find(']').unwrap()];
        let parts: Vec<&str> = tag.split(':').collect();
        assert_eq!(parts[0], "fc-cli-1", "{l}");
        assert!(
            ["ERROR", "WARN", "INFO", "DEBUG", "TRACE"].contains(&parts[2]),
            "{l}"
        );
        assert!(
            parts[3].ends_with(".rs") && parts[4].parse::<u32>().is_ok(),
            "{l}"
        );
    }
    assert!(text.contains("process start-up took"), "{text}");
    let metric_lines: Vec<Value> = std::fs::read_to_string(&metrics)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert!(!metric_lines.is_empty());
    let first = &metric_lines[0];
    assert!(
        u(&first["api_server"], "process_startup_time_us") > 0,
        "{first}"
    );
    assert!(
        u(&first["api_server"], "process_startup_time_cpu_us") >= 1000,
        "{first}"
    );
    assert!(
        u(&first["get_api_requests"], "vmm_version_count") >= 1,
        "{first}"
    );
    assert_eq!(
        u(&first["patch_api_requests"], "machine_cfg_count"),
        4,
        "{first}"
    );
    assert_eq!(
        u(&first["patch_api_requests"], "machine_cfg_fails"),
        2,
        "{first}"
    );
    assert_eq!(u(&first["put_api_requests"], "metrics_fails"), 1, "{first}");
    // The first line is the flush's, which Firecracker allows once started.
    assert_eq!(first["teravm"]["state"], "Running");
}

#[test]
fn a_log_fifo_nobody_reads_never_blocks_teravm() {
    if !kvm_or_skip("a_log_fifo_nobody_reads_never_blocks_teravm") {
        return;
    }
    let dir = temp_dir("cli-fifo");
    let fifo = dir.join("log.fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path; the result is checked.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let cfg = config_file(&dir, &config_json(2, 256, "touch=all then=reset", ""));
    // Trace logs every step of a launch and a reclaim: far more than a
    // pipe holds, with no reader at all.
    let (code, _, stderr) = run(
        &[
            "--no-api",
            "--config-file",
            cfg.to_str().unwrap(),
            "--level",
            "Trace",
            "--log-path",
            fifo.to_str().unwrap(),
            "--metrics-path",
            fifo.to_str().unwrap(),
        ],
        T,
    );
    assert_eq!(code, 0, "{stderr}");
    assert!(summary(&stderr).0 > 0, "{stderr}");
    assert!(Path::new(&fifo).exists());
}

#[test]
fn http_api_max_payload_size_bounds_request_bodies() {
    let (vmm, sock, _dir) = start_api("payload", &["--http-api-max-payload-size", "64"]);
    let small = r#"{"vcpu_count": 1, "mem_size_mib": 128}"#;
    assert!(small.len() <= 64);
    put_ok(&sock, "/machine-config", small);
    let big = format!(r#"{{"boot_args": "{}"}}"#, "x".repeat(100));
    let (status, body) = put(&sock, "/boot-source", &big);
    assert_fault(status, &body, 413, "64 bytes");
    // Nothing changed, and the server still answers.
    assert_eq!(get(&sock, "/vm/config")["boot-source"]["boot_args"], "");
    drop(vmm);
}

/// The groups of a metrics line, asked of the real Firecracker: the same
/// devices (a drive, a vsock, a balloon, an entropy device, a hotplug
/// region) configured on both with the same requests, the test guest
/// booted, a `FlushMetrics` on both, and each one's last metrics line read.
/// Every group teravm writes but its own `teravm` must be one Firecracker
/// writes (so a group named wrongly fails, whatever teravm's own tests
/// expect), and the configured devices' groups must be in both lines. The
/// counters inside are compared and the differences printed, not refused:
/// teravm lacks some of Firecracker's (e.g. the `*_agg` latencies) and adds
/// its own.
#[test]
fn the_metrics_groups_are_firecrackers() {
    let test = "metrics_groups_as_firecracker";
    if !kvm_or_skip(test) {
        return;
    }
    let Some(fc) = firecracker(test) else {
        return;
    };
    let mut both = common::fc_api::Both::start(test, &fc, &[]);
    let mut files = Vec::new();
    for side in [&both.fc, &both.tv] {
        let metrics = side.dir.join("metrics");
        // Firecracker opens it without creating it.
        std::fs::write(&metrics, "").unwrap();
        side.put_ok(
            "/metrics",
            &format!(r#"{{"metrics_path": "{}"}}"#, metrics.display()),
        );
        let disk = side.dir.join("disk.img");
        std::fs::write(&disk, vec![0u8; 1 << 20]).unwrap();
        side.put_ok(
            "/drives/rootfs",
            &format!(
                r#"{{"drive_id": "rootfs", "path_on_host": "{}", "is_root_device": false, "is_read_only": false}}"#,
                disk.display()
            ),
        );
        side.put_ok(
            "/vsock",
            &format!(
                r#"{{"guest_cid": 3, "uds_path": "{}"}}"#,
                side.dir.join("v.sock").display()
            ),
        );
        files.push(metrics);
    }
    both.put_ok(
        "/balloon",
        r#"{"amount_mib": 0, "deflate_on_oom": false, "stats_polling_interval_s": 1}"#,
    );
    both.put_ok("/entropy", "{}");
    both.put_ok("/hotplug/memory", r#"{"total_size_mib": 1024}"#);
    both.boot_test_guest(
        r#"{"vcpu_count": 1, "mem_size_mib": 128, "huge_pages": "None"}"#,
        "then=idle",
    );
    for side in [&mut both.fc, &mut both.tv] {
        side.vmm.wait_line("teravm guest: idle", T);
    }
    let (s, b) = both.same(
        "PUT",
        "/actions",
        Some(r#"{"action_type": "FlushMetrics"}"#),
    );
    assert_eq!(s, 204, "{b}");
    let last = |path: &Path| -> Value {
        let text = std::fs::read_to_string(path).unwrap();
        let line = text
            .lines()
            .last()
            .unwrap_or_else(|| panic!("no line in {}", path.display()));
        serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"))
    };
    let (fc_line, tv_line) = (last(&files[0]), last(&files[1]));
    let (Value::Object(fc_groups), Value::Object(tv_groups)) = (&fc_line, &tv_line) else {
        panic!("not objects: {fc_line} {tv_line}");
    };
    let mut wrong = Vec::new();
    for (group, tv_value) in tv_groups {
        if group == "teravm" {
            continue;
        }
        let Some(fc_value) = fc_groups.get(group) else {
            wrong.push(format!("group {group:?}: Firecracker writes no such group"));
            continue;
        };
        let (Value::Object(tv_counters), Value::Object(fc_counters)) = (tv_value, fc_value) else {
            if tv_value.is_object() != fc_value.is_object() {
                wrong.push(format!(
                    "{group}: teravm {tv_value}, Firecracker {fc_value}"
                ));
            }
            continue;
        };
        let missing: Vec<&String> = fc_counters
            .keys()
            .filter(|c| !tv_counters.contains_key(*c))
            .collect();
        if !missing.is_empty() {
            eprintln!("{group}: Firecracker's counters teravm does not write: {missing:?}");
        }
        let extra: Vec<&String> = tv_counters
            .keys()
            .filter(|c| !fc_counters.contains_key(*c))
            .collect();
        if !extra.is_empty() {
            eprintln!("{group}: teravm's own counters beside Firecracker's: {extra:?}");
        }
    }
    // The groups of the devices configured are there, on both.
    for group in [
        "block_rootfs",
        "vsock",
        "balloon",
        "entropy",
        "memory_hotplug",
    ] {
        if !tv_groups.contains_key(group) {
            wrong.push(format!("teravm writes no {group} group"));
        }
        if !fc_groups.contains_key(group) {
            wrong.push(format!("Firecracker writes no {group} group"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
