//! Firecracker's clients against the real teravm binary, real KVM and the
//! real socket: replays of the exact request sequences of
//! firecracker-go-sdk's `Machine.Start` and of firectl (read from their
//! source), flintlock's command line and config file stopped with SIGHUP,
//! and PyPI's firecracker-python (its `Api` class and process launcher).
//! Each reaches Running and ends with reclaim and exit 0; the log and
//! metrics they set up are checked line by line.

mod common;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::api::*;
use common::client::request;
use common::*;
use serde_json::Value;

/// Makes a FIFO, as go-sdk's `createFifo` does (mode 0700).
fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path; the result is checked.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o700) }, 0, "{path:?}");
}

/// Reads a FIFO to its end on a thread (go-sdk's `captureFifoToFile`):
/// the open waits for teravm to open its end.
fn fifo_reader(path: &Path) -> std::thread::JoinHandle<String> {
    let path = path.to_path_buf();
    std::thread::spawn(move || {
        let mut s = String::new();
        if let Ok(mut f) = std::fs::File::open(&path) {
            let _ = f.read_to_string(&mut s);
        }
        s
    })
}

/// go-sdk's `waitForSocket`: polls `GET /machine-config` until it answers.
fn wait_for_socket(sock: &Path) {
    let deadline = std::time::Instant::now() + T;
    while request(sock, "GET", "/machine-config", None)
        .map(|r| r.0)
        .ok()
        != Some(200)
    {
        assert!(std::time::Instant::now() < deadline, "no API on {sock:?}");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// Log lines in Firecracker's shape: `<time> [<id>:<thread>(:LEVEL)...] msg`.
fn check_log_lines(text: &str, id: &str, level: bool) -> Vec<String> {
    let lines: Vec<String> = text.lines().map(String::from).collect();
    assert!(!lines.is_empty(), "no log lines");
    for l in &lines {
        let (time, rest) = l.split_once(' ').unwrap_or_else(|| panic!("{l:?}"));
        assert_eq!(time.len(), 29, "time {time:?} in {l:?}");
        assert!(rest.starts_with(&format!("[{id}:")), "{l:?}");
        let tag = &rest[1..rest.find(']').unwrap()];
        if level {
            let lvl = tag.split(':').nth(2).unwrap_or("");
            assert!(
                ["ERROR", "WARN", "INFO", "DEBUG", "TRACE"].contains(&lvl),
                "{l:?}"
            );
        }
    }
    assert!(
        lines.iter().any(|l| l.contains("Running teravm v")),
        "{lines:?}"
    );
    lines
}

/// Metrics lines: each one JSON object in both layouts; returns the last.
fn check_metrics_lines(text: &str) -> Value {
    let mut last = Value::Null;
    for l in text.lines() {
        let v: Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}"));
        for group in [
            "utc_timestamp_ms",
            "api_server",
            "get_api_requests",
            "put_api_requests",
            "logger",
            "teravm",
        ] {
            assert!(!v[group].is_null(), "no {group} in {l}");
        }
        last = v;
    }
    assert!(!last.is_null(), "no metrics lines");
    last
}

/// The last metrics line shows the reclaim done, with freed bytes per node.
fn check_final_metrics(last: &Value, mib: u64) {
    let t = &last["teravm"];
    assert_eq!(t["state"], "Stopped", "{last}");
    assert_eq!(t["reclaim"]["state"], "done", "{last}");
    assert!(u(&t["reclaim"], "workers") >= 1, "{last}");
    assert_eq!(u(&t["reclaim"], "address_bytes"), mib * MIB, "{last}");
    let nodes = t["reclaim"]["nodes"].as_array().unwrap();
    let freed: u64 = nodes.iter().map(|n| u(n, "address_bytes_done")).sum();
    assert_eq!(freed, mib * MIB, "{last}");
}

#[test]
fn go_sdk_machine_start_replay() {
    if !kvm_or_skip("go_sdk_machine_start_replay") {
        return;
    }
    // With the default flags: every thread filtered.
    go_sdk_replay("gosdk", &[]);
}

#[test]
fn go_sdk_machine_start_replay_with_seccomp_disabled() {
    if !kvm_or_skip("go_sdk_machine_start_replay_with_seccomp_disabled") {
        return;
    }
    // go-sdk passes `--no-seccomp` when its `Seccomp.Enabled` is false.
    go_sdk_replay("gosdk-noseccomp", &["--no-seccomp"]);
}

/// go-sdk's `Machine.Start` then `Machine.Shutdown`, with teravm started as
/// go-sdk's `startVMM` does plus `extra` flags.
fn go_sdk_replay(name: &str, extra: &[&str]) {
    let dir = temp_dir(name);
    let sock = dir.join("firecracker.sock");
    let id = "4a7f0c2e-9b1d-4e6f-8a3c-5d2b1e0f9c7a";
    // NewMachine + startVMM: `--api-sock S --id VMID`.
    let mut args = vec!["--api-sock", sock.to_str().unwrap(), "--id", id];
    args.extend_from_slice(extra);
    let mut vmm = Vmm::spawn(&args);
    wait_for_socket(&sock);
    // CreateLogFilesHandler: FIFOs for the log (read by FifoLogWriter) and
    // the metrics (which nobody reads here: teravm must not block on it).
    let (log, metrics) = (dir.join("log.fifo"), dir.join("metrics.fifo"));
    mkfifo(&log);
    mkfifo(&metrics);
    let log_reader = fifo_reader(&log);
    // BootstrapLoggingHandler: setupLogging, setupMetrics.
    put_ok(
        &sock,
        "/logger",
        &format!(
            r#"{{"level":"Debug","log_path":"{}","show_level":true,"show_log_origin":false}}"#,
            log.display()
        ),
    );
    put_ok(
        &sock,
        "/metrics",
        &format!(r#"{{"metrics_path":"{}"}}"#, metrics.display()),
    );
    // CreateMachineHandler: PutMachineConfiguration, then refresh.
    put_ok(
        &sock,
        "/machine-config",
        r#"{"mem_size_mib":256,"smt":false,"vcpu_count":1}"#,
    );
    let mc = get(&sock, "/machine-config");
    assert_eq!((u(&mc, "vcpu_count"), u(&mc, "mem_size_mib")), (1, 256));
    assert_eq!(mc["smt"], false);
    assert_eq!(mc["huge_pages"], "Transparent");
    // CreateBootSourceHandler (go-sdk also sends kernel_image_path: that
    // needs the Linux-guest work; the firmware runs without it).
    put_ok(
        &sock,
        "/boot-source",
        r#"{"boot_args":"touch=64 then=idle"}"#,
    );
    // No drives, interfaces, vsocks or MMDS configured: nothing sent.
    // startInstance: CreateSyncAction InstanceStart.
    let (s, b) = action(&sock, r#"{"action_type":"InstanceStart"}"#);
    assert_eq!(s, 204, "{b}");
    vmm.wait_line("teravm firmware: idle", T);
    assert_eq!(state(&sock), "Running");
    assert_eq!(
        get(&sock, "/version")["firecracker_version"],
        env!("CARGO_PKG_VERSION")
    );
    // Machine.Shutdown: SendCtrlAltDel; the firmware resets.
    let (s, b) = action(&sock, r#"{"action_type":"SendCtrlAltDel"}"#);
    assert_eq!(s, 204, "{b}");
    let (_, stderr) = exits_ok(vmm);
    assert!(summary(&stderr).0 >= 64, "{stderr}");
    let lines = check_log_lines(&log_reader.join().unwrap(), id, true);
    assert!(lines.iter().any(|l| l.contains(":INFO] ")), "{lines:?}");
}

#[test]
fn firectl_replay() {
    if !kvm_or_skip("firectl_replay") {
        return;
    }
    let dir = temp_dir("firectl");
    let sock = dir.join("firecracker.sock");
    // firectl's VMCommandBuilder: only the socket path.
    let mut vmm = Vmm::spawn(&["--api-sock", sock.to_str().unwrap()]);
    wait_for_socket(&sock);
    // --firecracker-log: handleFifos makes both FIFOs in a temp dir.
    let (log, metrics) = (dir.join("fc_fifo"), dir.join("fc_metrics_fifo"));
    mkfifo(&log);
    mkfifo(&metrics);
    let log_reader = fifo_reader(&log);
    let metrics_reader = fifo_reader(&metrics);
    put_ok(
        &sock,
        "/logger",
        &format!(
            r#"{{"level":"Debug","log_path":"{}","show_level":true,"show_log_origin":false}}"#,
            log.display()
        ),
    );
    put_ok(
        &sock,
        "/metrics",
        &format!(r#"{{"metrics_path":"{}"}}"#, metrics.display()),
    );
    // firectl's default is smt = !--disable-smt, i.e. true: refused with
    // the reason; with --disable-smt it goes through.
    let (s, b) = put(
        &sock,
        "/machine-config",
        r#"{"mem_size_mib":512,"smt":true,"vcpu_count":1}"#,
    );
    assert_fault(s, &b, 400, "machine-config.smt");
    put_ok(
        &sock,
        "/machine-config",
        r#"{"mem_size_mib":512,"smt":false,"vcpu_count":1}"#,
    );
    get(&sock, "/machine-config");
    put_ok(
        &sock,
        "/boot-source",
        r#"{"boot_args":"touch=64 then=idle"}"#,
    );
    // firectl always attaches its root drive: the body is Firecracker's,
    // and the VMM refuses it (there is no /img).
    let (s, b) = put(
        &sock,
        "/drives/1",
        r#"{"drive_id":"1","is_read_only":false,"is_root_device":true,"path_on_host":"/img"}"#,
    );
    assert_fault(s, &b, 400, "");
    let (s, b) = action(&sock, r#"{"action_type":"InstanceStart"}"#);
    assert_eq!(s, 204, "{b}");
    vmm.wait_line("teravm firmware: idle", T);
    assert_eq!(state(&sock), "Running");
    let (s, b) = action(&sock, r#"{"action_type":"FlushMetrics"}"#);
    assert_eq!(s, 204, "{b}");
    // Ctrl-C in firectl's terminal: go-sdk forwards SIGINT.
    vmm.signal(libc::SIGINT);
    let (_, stderr) = exits_ok(vmm);
    assert!(summary(&stderr).0 >= 64, "{stderr}");
    assert!(!sock.exists());
    check_log_lines(&log_reader.join().unwrap(), "teravm", true);
    let text = metrics_reader.join().unwrap();
    assert!(text.lines().count() >= 2, "{text}");
    let last = check_metrics_lines(&text);
    check_final_metrics(&last, 512);
    assert!(u(&last["teravm"]["signals"], "sigint") >= 1, "{last}");
    let errors = &last["teravm"]["api"]["errors"];
    assert!(
        u(errors, "PUT /drives") >= 1 && u(errors, "PUT /machine-config") >= 1,
        "{last}"
    );
}

/// flintlock's config file (`VmmConfig`), with the root drive it always
/// adds left out (teravm has no block device).
fn flintlock_config(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let (log, metrics) = (dir.join("firecracker.log"), dir.join("firecracker.metrics"));
    // ensureState: both files made with O_CREATE|O_APPEND beforehand.
    std::fs::write(&log, "").unwrap();
    std::fs::write(&metrics, "").unwrap();
    let cfg = config_file(
        dir,
        &format!(
            r#"{{"drives":[],"boot-source":{{"boot_args":"touch=64 then=idle"}},
                "logger":{{"log_path":"{}","level":"Debug","show_level":true,"show_log_origin":true}},
                "machine-config":{{"vcpu_count":2,"mem_size_mib":256,"smt":false,"track_dirty_pages":false}},
                "metrics":{{"metrics_path":"{}"}},"network-interfaces":[]}}"#,
            log.display(),
            metrics.display()
        ),
    );
    (cfg, log, metrics)
}

#[test]
fn flintlock_command_line_stopped_with_sighup() {
    if !kvm_or_skip("flintlock_command_line_stopped_with_sighup") {
        return;
    }
    let dir = temp_dir("flintlock");
    let (cfg, log, metrics) = flintlock_config(&dir);
    let id = "01HQ5ZK3V8N2X4";
    // flintlock also passes `--metadata FILE`: refused, as teravm has no MMDS.
    let meta = dir.join("metadata.json");
    std::fs::write(&meta, r#"{"latest":{}}"#).unwrap();
    let (code, _, stderr) = run(
        &[
            "--id",
            id,
            "--boot-timer",
            "--no-api",
            "--config-file",
            cfg.to_str().unwrap(),
            "--metadata",
            meta.to_str().unwrap(),
        ],
        T,
    );
    assert_eq!(code, 1, "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("--metadata is not supported"), "{stderr}");
    // Without it: starts at once from the file; SIGHUP stops it.
    let mut vmm = Vmm::spawn(&[
        "--id",
        id,
        "--boot-timer",
        "--no-api",
        "--config-file",
        cfg.to_str().unwrap(),
    ]);
    vmm.wait_line("teravm firmware: idle", T);
    vmm.signal(libc::SIGHUP);
    let (code, _, stderr) = vmm.wait(T);
    assert_eq!(code, 0, "{stderr}");
    assert!(summary(&stderr).0 >= 64, "{stderr}");
    let lines = check_log_lines(&std::fs::read_to_string(&log).unwrap(), id, true);
    // show_log_origin: the tag ends with file:line.
    assert!(
        lines
            .iter()
            .any(|l| l.contains(".rs:") && l.contains("SIGHUP")),
        "{lines:?}"
    );
    let last = check_metrics_lines(&std::fs::read_to_string(&metrics).unwrap());
    check_final_metrics(&last, 256);
    assert_eq!(u(&last["teravm"]["signals"], "sighup"), 1, "{last}");
}

#[test]
fn firecracker_python_api_and_launcher() {
    if !kvm_or_skip("firecracker_python_api_and_launcher") {
        return;
    }
    let python = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/fc-python-venv/bin/python");
    if !python.exists() {
        skip(
            "firecracker_python_api_and_launcher",
            format!("no {} (run tests/clients/setup.sh)", python.display()),
        );
        return;
    }
    let dir = temp_dir("fcpython");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients/fc_python.py");
    let out = Command::new(&python)
        .arg(&script)
        .arg(teravm())
        .arg(&dir)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stdout {stdout}\nstderr {stderr}");
    let seen: Value = serde_json::from_str(stdout.lines().last().unwrap_or("")).unwrap();
    assert_eq!(seen["exit_code"], 0, "{seen}");
    assert_eq!(seen["state_before"], "Not started");
    assert_eq!(
        seen["version"]["firecracker_version"],
        env!("CARGO_PKG_VERSION")
    );
    assert_eq!(seen["machine_config"]["mem_size_mib"], 256);
    assert_eq!(seen["machine_config"]["cpu_template"], "None");
    // The drive's file and the TAP device do not exist: the VMM refuses
    // them, whatever its words.
    for (key, needle) in [
        ("drive_refused", ""),
        ("network_refused", ""),
        ("pause_refused", "PATCH /vm"),
    ] {
        let msg = seen[key].as_str().unwrap();
        assert!(
            msg.contains("API fault") && msg.contains(needle),
            "{key}: {msg}"
        );
    }
    assert_eq!(seen["vm_config"]["machine-config"]["vcpu_count"], 1);
    // get_pid checks the process is named "firecracker": teravm is not.
    assert!(seen["get_pid"].as_str().unwrap().contains("not"), "{seen}");
    let log: Vec<String> = seen["log_lines"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.as_str().unwrap().to_string())
        .collect();
    check_log_lines(&log.join("\n"), "fcpy-0123abcd", true);
    assert!(
        log.iter()
            .any(|l| l.contains(":DEBUG] ") || l.contains(":INFO] ")),
        "{log:?}"
    );
}
