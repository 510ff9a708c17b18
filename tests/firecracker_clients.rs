//! Firecracker's clients against the real teravm binary, real KVM and the
//! real socket: replays of the exact request sequences of
//! firecracker-go-sdk's `Machine.Start` and of firectl (read from their
//! source), flintlock's command line and config file (its `--metadata`
//! read by the firmware from the MMDS) stopped with SIGHUP,
//! and PyPI's firecracker-python (its `Api` class and process launcher).
//! Each reaches Running and ends with reclaim and exit 0; the log and
//! metrics they set up are checked line by line. The device replays attach
//! drives, a tap (in a network namespace the test makes, teravm run in it)
//! and a vsock as each client sends them, and check what the firmware's
//! drivers see.

mod common;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::api::*;
use common::client::request;
use common::netns::{self, Netns};
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
    go_sdk_replay("gosdk", &[], None);
}

#[test]
fn go_sdk_machine_start_replay_with_seccomp_disabled() {
    if !kvm_or_skip("go_sdk_machine_start_replay_with_seccomp_disabled") {
        return;
    }
    // go-sdk passes `--no-seccomp` when its `Seccomp.Enabled` is false.
    go_sdk_replay("gosdk-noseccomp", &["--no-seccomp"], None);
}

#[test]
fn go_sdk_machine_start_replay_with_drives_net_and_vsock() {
    if !kvm_or_skip("go_sdk_machine_start_replay_with_drives_net_and_vsock") {
        return;
    }
    let Some(ns) = Netns::new("gosdk") else {
        skip(
            "go_sdk_machine_start_replay_with_drives_net_and_vsock",
            "cannot make a network namespace with a tap (ip, root)",
        );
        return;
    };
    let _big = big_memory();
    // With the default flags: every thread filtered, the devices' too.
    go_sdk_replay("gosdk-devices", &[], Some(&ns));
}

/// The guest MAC of the go-sdk and firectl replays (firectl's README
/// writes `--tap-device=tap0/AA:FC:00:00:00:01`; upper case, as there).
const GUEST_MAC: &str = "AA:FC:00:00:00:01";

/// Firecracker's host side of vsock, as firecracker-containerd's
/// `vsockConnect` does it: connect to the UDS, `CONNECT <port>\n`, read
/// the `OK <n>` line (retrying until the guest listens).
fn vsock_connect(uds: &Path, port: u32) -> std::os::unix::net::UnixStream {
    use std::io::{BufRead, BufReader, Write};
    let deadline = std::time::Instant::now() + T;
    loop {
        let line = std::os::unix::net::UnixStream::connect(uds).and_then(|mut s| {
            s.set_read_timeout(Some(T))?;
            s.write_all(format!("CONNECT {port}\n").as_bytes())?;
            let mut line = String::new();
            BufReader::new(s.try_clone()?).read_line(&mut line)?;
            Ok((s, line))
        });
        match line {
            Ok((s, line)) if line.starts_with("OK ") => return s,
            other => {
                assert!(std::time::Instant::now() < deadline, "{other:?}");
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        }
    }
}

/// Echoes one message through a host-initiated vsock connection to the
/// firmware's `vsock=echo:<port>` and waits for its `vsock echo` line.
fn vsock_echo_once(vmm: &mut Vmm, uds: &Path, port: u32, msg: &str) {
    use std::io::{Read, Write};
    let mut s = vsock_connect(uds, port);
    s.write_all(msg.as_bytes()).unwrap();
    let mut back = vec![0u8; msg.len()];
    s.read_exact(&mut back).unwrap();
    assert_eq!(back, msg.as_bytes());
    drop(s);
    let line = vmm.wait_line("teravm firmware: vsock echo", T);
    assert!(
        line.ends_with(&format!("echo {} bytes", msg.len())),
        "{line}"
    );
}

/// A disk image of `len` bytes starting with `head` (16 bytes).
fn disk(path: &Path, head: &[u8; 16], len: usize) -> Vec<u8> {
    let mut bytes = vec![0u8; len];
    bytes[..16].copy_from_slice(head);
    std::fs::write(path, &bytes).unwrap();
    bytes
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The firmware's `blk` lines for the first drive, whose image `path`
/// starts with `head`, `sectors` long, read-write. GET_ID answers what
/// Firecracker answers: the file's dev/rdev/inode, not the drive id.
fn check_blk_lines(vmm: &mut Vmm, head: &[u8; 16], path: &Path, sectors: u64) {
    let id = common::peers::firecracker_blk_id(path);
    let found = vmm.wait_line("teravm firmware: blk device at", T);
    assert!(
        found.ends_with(&format!("capacity {sectors} sectors")),
        "{found}"
    );
    let line = vmm.wait_line("teravm firmware: blk sector0", T);
    assert!(line.ends_with(&hex(head)), "{line}");
    let line = vmm.wait_line("teravm firmware: blk write", T);
    assert!(line.ends_with("write ok"), "{line}");
    let line = vmm.wait_line("teravm firmware: blk readback", T);
    assert!(line.ends_with("readback match"), "{line}");
    let line = vmm.wait_line("teravm firmware: blk id", T);
    assert!(line.ends_with(&format!("blk id {id}")), "{line}");
}

/// Sector 1 of a drive the firmware drove holds its 0xA5 bytes; the rest
/// is `before`.
fn check_blk_written(path: &Path, before: &[u8]) {
    let after = std::fs::read(path).unwrap();
    assert_eq!(&after[512..1024], &[0xA5u8; 512][..], "sector 1 written");
    assert_eq!(&after[..512], &before[..512], "sector 0 untouched");
    assert_eq!(&after[1024..], &before[1024..], "nothing past sector 1");
}

/// go-sdk's `Machine.Start` then `Machine.Shutdown`, with teravm started as
/// go-sdk's `startVMM` does plus `extra` flags; with `devices`, the machine
/// has a root drive and an extra drive (`DrivesBuilder`), a NIC with a
/// `StaticConfiguration` on the namespace's tap and a vsock, and teravm
/// runs in that namespace (`Cfg.NetNS`: startVMM starts it there).
fn go_sdk_replay(name: &str, extra: &[&str], devices: Option<&Netns>) {
    let dir = temp_dir(name);
    let sock = dir.join("firecracker.sock");
    let id = "4a7f0c2e-9b1d-4e6f-8a3c-5d2b1e0f9c7a";
    // NewMachine + startVMM: `--api-sock S --id VMID`.
    let mut args = vec!["--api-sock", sock.to_str().unwrap(), "--id", id];
    args.extend_from_slice(extra);
    let mut vmm = match devices {
        None => Vmm::spawn(&args),
        Some(ns) => {
            let mut cmd = ns.command(teravm());
            cmd.args(&args);
            Vmm::spawn_command(cmd)
        }
    };
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
    // SetupKernelArgsHandler has parsed the arguments into a Go map and
    // joined them again: the words come in the map's (random) order.
    let Some(ns) = devices else {
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
        return go_sdk_stop(vmm, &sock, log_reader, id, &[]);
    };
    put_ok(
        &sock,
        "/boot-source",
        r#"{"boot_args":"then=idle net=echo vsock=echo:52 touch=64 blk"}"#,
    );
    // AttachDrivesHandler: Cfg.Drives from NewDrivesBuilder(root)
    // .AddDrive(extra, true).Build(), i.e. the added drives first and the
    // root drive last; each models.Drive as Go marshals it (fields in
    // declaration order, cache_type / io_engine / partuuid / rate_limiter
    // omitted when empty).
    let (root, extra_disk) = (dir.join("rootfs.ext4"), dir.join("data.img"));
    let root_bytes = disk(&root, b"go-sdk root disk", 1 << 20);
    let extra_bytes = disk(&extra_disk, b"go-sdk data disk", 64 << 10);
    put_ok(
        &sock,
        "/drives/0",
        &format!(
            r#"{{"drive_id":"0","is_read_only":true,"is_root_device":false,"path_on_host":"{}"}}"#,
            extra_disk.display()
        ),
    );
    put_ok(
        &sock,
        "/drives/root_drive",
        &format!(
            r#"{{"drive_id":"root_drive","is_read_only":false,"is_root_device":true,"path_on_host":"{}"}}"#,
            root.display()
        ),
    );
    // CreateNetworkInterfacesHandler: iface ids "1", "2", ... by position;
    // guest_mac from StaticConfiguration.MacAddress, no rate limiters.
    put_ok(
        &sock,
        "/network-interfaces/1",
        &format!(r#"{{"guest_mac":"{GUEST_MAC}","host_dev_name":"tap0","iface_id":"1"}}"#),
    );
    // AddVsocksHandler: models.Vsock with the device's ID.
    let uds = dir.join("firecracker.vsock");
    put_ok(
        &sock,
        "/vsock",
        &format!(
            r#"{{"guest_cid":3,"uds_path":"{}","vsock_id":"vsock0"}}"#,
            uds.display()
        ),
    );
    // ConfigMmdsHandler: no MmdsAddress, no MMDS interface: nothing sent.
    let cfg = get(&sock, "/vm/config");
    let drives: Vec<&str> = cfg["drives"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["drive_id"].as_str().unwrap())
        .collect();
    assert!(
        drives.contains(&"root_drive") && drives.contains(&"0"),
        "{cfg}"
    );
    assert_eq!(
        cfg["network-interfaces"][0]["host_dev_name"], "tap0",
        "{cfg}"
    );
    assert_eq!(cfg["vsock"]["guest_cid"], 3, "{cfg}");
    let frames = netns::packet_socket(ns);
    // startInstance: CreateSyncAction InstanceStart.
    let (s, b) = action(&sock, r#"{"action_type":"InstanceStart"}"#);
    assert_eq!(s, 204, "{b}");
    // The firmware drives the first virtio-blk: the root drive, attached
    // first whatever the order of the PUTs (Firecracker's order).
    check_blk_lines(&mut vmm, b"go-sdk root disk", &root, 2048);
    let line = vmm.wait_line("teravm firmware: vsock device at", T);
    assert!(line.ends_with("cid 3"), "{line}");
    vmm.wait_line("teravm firmware: vsock listening on 52", T);
    vmm.wait_line("teravm firmware: net device at", T);
    let line = vmm.wait_line("teravm firmware: net sent hello", T);
    assert!(
        line.ends_with(&format!("from {}", GUEST_MAC.to_lowercase())),
        "{line}"
    );
    let hello = netns::next_frame(&frames, T).expect("the guest's hello on the tap");
    assert_eq!(&hello[6..12], &[0xAA, 0xFC, 0, 0, 0, 1]);
    // The host side of the vsock, as firecracker-containerd reaches its
    // agent: CONNECT through the UDS.
    vsock_echo_once(&mut vmm, &uds, 52, "go-sdk over vsock\n");
    go_sdk_stop(
        vmm,
        &sock,
        log_reader,
        id,
        &[
            "drive root_drive at",
            "drive 0 at",
            "network interface 1 at",
            "vsock (guest CID 3)",
        ],
    );
    check_blk_written(&root, &root_bytes);
    assert_eq!(std::fs::read(&extra_disk).unwrap(), extra_bytes);
}

/// go-sdk's `Machine.Shutdown` on a Running machine, then the exit and
/// the log: `logged` in this order.
fn go_sdk_stop(
    vmm: Vmm,
    sock: &Path,
    log_reader: std::thread::JoinHandle<String>,
    id: &str,
    logged: &[&str],
) {
    assert_eq!(state(sock), "Running");
    assert_eq!(
        get(sock, "/version")["firecracker_version"],
        env!("CARGO_PKG_VERSION")
    );
    // Machine.Shutdown: SendCtrlAltDel; the firmware resets.
    let (s, b) = action(sock, r#"{"action_type":"SendCtrlAltDel"}"#);
    assert_eq!(s, 204, "{b}");
    let (_, stderr) = exits_ok(vmm);
    assert!(summary(&stderr).0 >= 64, "{stderr}");
    let lines = check_log_lines(&log_reader.join().unwrap(), id, true);
    assert!(lines.iter().any(|l| l.contains(":INFO] ")), "{lines:?}");
    let mut at = 0;
    for needle in logged {
        let i = lines[at..]
            .iter()
            .position(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("no {needle:?} after line {at}: {lines:?}"));
        at += i + 1;
    }
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
    // firectl's default is smt = !--disable-smt, i.e. true: taken, as
    // Firecracker takes it; with --disable-smt it goes through too.
    put_ok(
        &sock,
        "/machine-config",
        r#"{"mem_size_mib":512,"smt":true,"vcpu_count":1}"#,
    );
    assert_eq!(get(&sock, "/machine-config")["smt"], true);
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
    // and the VMM refuses it (there is no /img), naming the field and path.
    let (s, b) = put(
        &sock,
        "/drives/1",
        r#"{"drive_id":"1","is_read_only":false,"is_root_device":true,"path_on_host":"/img"}"#,
    );
    assert_fault(s, &b, 400, "drives.path_on_host: cannot use /img");
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
    // The refused drive is counted; machine-config (smt: true) is taken now.
    assert!(u(errors, "PUT /drives") >= 1, "{last}");
    assert!(errors.get("PUT /machine-config").is_none(), "{last}");
}

#[test]
fn firectl_replay_with_drives_tap_and_vsock() {
    if !kvm_or_skip("firectl_replay_with_drives_tap_and_vsock") {
        return;
    }
    let Some(ns) = Netns::new("firectl") else {
        skip(
            "firectl_replay_with_drives_tap_and_vsock",
            "cannot make a network namespace with a tap (ip, root)",
        );
        return;
    };
    let _big = big_memory();
    let dir = temp_dir("firectl-devices");
    let sock = dir.join("firecracker.sock");
    let (root, data, uds) = (
        dir.join("root.img"),
        dir.join("data.img"),
        dir.join("v.sock"),
    );
    let root_bytes = disk(&root, b"firectl rootdisk", 512 << 10);
    let data_bytes = disk(&data, b"firectl add-driv", 64 << 10);
    // `ip netns exec NS firectl --disable-smt --root-drive=root.img
    //  --add-drive=data.img:rw --tap-device=tap0/AA:FC:00:00:00:01
    //  --vsock-device=v.sock:3 --kernel-opts=...`: firectl has no netns
    // flag, so it and its VMM run in the namespace it is started in. Its
    // VMCommandBuilder passes only the socket path.
    let mut cmd = ns.command(teravm());
    cmd.args(["--api-sock", sock.to_str().unwrap()]);
    let mut vmm = Vmm::spawn_command(cmd);
    wait_for_socket(&sock);
    // No --firecracker-log, --vmm-log-fifo or --metrics-fifo: setupLogging
    // and setupMetrics send nothing.
    put_ok(
        &sock,
        "/machine-config",
        r#"{"mem_size_mib":512,"smt":false,"vcpu_count":1}"#,
    );
    get(&sock, "/machine-config");
    // --kernel-opts: firectl's default words and the firmware's (go-sdk's
    // SetupKernelArgsHandler reorders them; the firmware skips the others).
    put_ok(
        &sock,
        "/boot-source",
        r#"{"boot_args":"ro console=ttyS0 noapic reboot=k panic=1 pci=off nomodules blk vsock=echo:1024 net=echo then=idle"}"#,
    );
    // getBlockDevices: the --add-drive ones first with ids "2", "3", ...,
    // then --root-drive with id "1" (read-write without `:ro`).
    put_ok(
        &sock,
        "/drives/2",
        &format!(
            r#"{{"drive_id":"2","is_read_only":false,"is_root_device":false,"path_on_host":"{}"}}"#,
            data.display()
        ),
    );
    put_ok(
        &sock,
        "/drives/1",
        &format!(
            r#"{{"drive_id":"1","is_read_only":false,"is_root_device":true,"path_on_host":"{}"}}"#,
            root.display()
        ),
    );
    // --tap-device DEVICE/MAC: a StaticConfiguration, iface id "1".
    put_ok(
        &sock,
        "/network-interfaces/1",
        &format!(r#"{{"guest_mac":"{GUEST_MAC}","host_dev_name":"tap0","iface_id":"1"}}"#),
    );
    // --vsock-device PATH:CID: a VsockDevice without an ID.
    put_ok(
        &sock,
        "/vsock",
        &format!(r#"{{"guest_cid":3,"uds_path":"{}"}}"#, uds.display()),
    );
    let frames = netns::packet_socket(&ns);
    let (s, b) = action(&sock, r#"{"action_type":"InstanceStart"}"#);
    assert_eq!(s, 204, "{b}");
    check_blk_lines(&mut vmm, b"firectl rootdisk", &root, 1024);
    vmm.wait_line("teravm firmware: vsock listening on 1024", T);
    let line = vmm.wait_line("teravm firmware: net sent hello", T);
    assert!(line.ends_with("from aa:fc:00:00:00:01"), "{line}");
    let hello = netns::next_frame(&frames, T).expect("the guest's hello on the tap");
    assert_eq!(&hello[6..12], &[0xAA, 0xFC, 0, 0, 0, 1]);
    vsock_echo_once(&mut vmm, &uds, 1024, "firectl over vsock\n");
    assert_eq!(state(&sock), "Running");
    // SIGTERM to firectl: installSignalHandlers calls Machine.Shutdown,
    // i.e. SendCtrlAltDel; the firmware resets.
    let (s, b) = action(&sock, r#"{"action_type":"SendCtrlAltDel"}"#);
    assert_eq!(s, 204, "{b}");
    exits_ok(vmm);
    assert!(!sock.exists());
    check_blk_written(&root, &root_bytes);
    assert_eq!(
        std::fs::read(&data).unwrap(),
        data_bytes,
        "drive 2 untouched"
    );
}

/// flintlock's config file (`VmmConfig`), with the root drive it always
/// adds left out (teravm has no block device): its tap and a V1
/// `mmds-config` naming it; the firmware touches 64 MiB and fetches
/// `/latest/meta-data` from the MMDS.
fn flintlock_config(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let (log, metrics) = (dir.join("firecracker.log"), dir.join("firecracker.metrics"));
    // ensureState: both files made with O_CREATE|O_APPEND beforehand.
    std::fs::write(&log, "").unwrap();
    std::fs::write(&metrics, "").unwrap();
    let cfg = config_file(
        dir,
        &format!(
            r#"{{"drives":[],"boot-source":{{"boot_args":"touch=64 mmds=/latest/meta-data then=idle"}},
                "logger":{{"log_path":"{}","level":"Debug","show_level":true,"show_log_origin":true}},
                "machine-config":{{"vcpu_count":2,"mem_size_mib":256,"smt":false,"track_dirty_pages":false}},
                "metrics":{{"metrics_path":"{}"}},
                "network-interfaces":[{{"iface_id":"eth0","host_dev_name":"tap0","guest_mac":"{GUEST_MAC}"}}],
                "mmds-config":{{"version":"V1","network_interfaces":["eth0"]}}}}"#,
            log.display(),
            metrics.display()
        ),
    );
    (cfg, log, metrics)
}

#[test]
fn flintlock_command_line_stopped_with_sighup() {
    let test = "flintlock_command_line_stopped_with_sighup";
    if !kvm_or_skip(test) {
        return;
    }
    let Some(ns) = Netns::new("flintlock") else {
        skip(
            test,
            "cannot make a network namespace with a tap (ip, root)",
        );
        return;
    };
    let dir = temp_dir("flintlock");
    let (cfg, log, metrics) = flintlock_config(&dir);
    let id = "01HQ5ZK3V8N2X4";
    // flintlock also passes `--metadata FILE` (the MMDS's contents, taken
    // since issue 26): cloud-init's files under `latest`. It starts at once
    // from the file, the firmware reads the metadata from the MMDS;
    // SIGHUP stops it.
    let meta = dir.join("metadata.json");
    std::fs::write(
        &meta,
        serde_json::json!({"latest": {
            "meta-data": format!("instance-id: {id}\nlocal-hostname: vm1\n"),
            "user-data": "#cloud-config\n",
        }})
        .to_string(),
    )
    .unwrap();
    let mut cmd = ns.command(teravm());
    cmd.args(["--id", id, "--boot-timer", "--no-api", "--config-file"])
        .arg(&cfg)
        .arg("--metadata")
        .arg(&meta);
    let mut vmm = Vmm::spawn_command(cmd);
    let line = vmm.wait_line("teravm firmware: mmds", T);
    assert_eq!(
        line.trim_end(),
        format!("teravm firmware: mmds 200 instance-id: {id} local-hostname: vm1"),
        "the metadata of --metadata, read by the guest"
    );
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
    // each, naming the field and what it could not use.
    for (key, needle) in [
        (
            "drive_refused",
            "drives.path_on_host: cannot use /rootfs.img",
        ),
        ("network_refused", "network-interfaces.host_dev_name"),
    ] {
        let msg = seen[key].as_str().unwrap();
        assert!(
            msg.contains("API fault") && msg.contains(needle),
            "{key}: {msg}"
        );
    }
    // The package's vm.patch pauses and resumes.
    assert_eq!(seen["state_paused"], "Paused", "{seen}");
    assert_eq!(seen["state_resumed"], "Running", "{seen}");
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

#[test]
fn firecracker_python_drive_tap_and_vsock() {
    if !kvm_or_skip("firecracker_python_drive_tap_and_vsock") {
        return;
    }
    let python = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/fc-python-venv/bin/python");
    if !python.exists() {
        skip(
            "firecracker_python_drive_tap_and_vsock",
            format!("no {} (run tests/clients/setup.sh)", python.display()),
        );
        return;
    }
    // MicroVM names its tap tap_<id>: one more tap in the namespace.
    let tap = "tap_fcpy0123";
    let ns = Netns::new("fcpy").filter(|ns| {
        [
            vec!["-n", &ns.name, "tuntap", "add", "dev", tap, "mode", "tap"],
            vec!["-n", &ns.name, "link", "set", tap, "up"],
        ]
        .iter()
        .all(|a| {
            Command::new("ip")
                .args(a)
                .status()
                .is_ok_and(|s| s.success())
        })
    });
    let Some(ns) = ns else {
        skip(
            "firecracker_python_drive_tap_and_vsock",
            "cannot make a network namespace with a tap (ip, root)",
        );
        return;
    };
    let _big = big_memory();
    let dir = temp_dir("fcpython-devices");
    // The frames the guest sends on the tap, captured from its host side
    // while the client runs (queued on this socket until read).
    let capture = common::netns::packet_socket_on(&ns, tap);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients/fc_python.py");
    // The package's user runs it where the tap is: in the namespace.
    let out = ns
        .command(python.to_str().unwrap())
        .arg(&script)
        .arg(teravm())
        .arg(&dir)
        .arg("devices")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stdout {stdout}\nstderr {stderr}");
    let seen: Value = serde_json::from_str(stdout.lines().last().unwrap_or("")).unwrap();
    assert_eq!(seen["exit_code"], 0, "{seen}");
    assert_eq!(seen["state_running"], "Running");
    let cfg = &seen["vm_config"];
    assert_eq!(cfg["drives"][0]["drive_id"], "rootfs", "{cfg}");
    assert_eq!(cfg["drives"][0]["is_root_device"], true, "{cfg}");
    assert_eq!(cfg["network-interfaces"][0]["host_dev_name"], tap, "{cfg}");
    assert_eq!(cfg["vsock"]["guest_cid"], 3, "{cfg}");
    let fw: Vec<&str> = seen["firmware"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.as_str().unwrap())
        .collect();
    let has = |needle: &str| fw.iter().any(|l| l.contains(needle));
    // GET_ID: the file's dev/rdev/inode, as Firecracker answers.
    let id = common::peers::firecracker_blk_id(&dir.join("rootfs.img"));
    assert!(
        has(&format!("blk id {id}")) && has("blk readback match"),
        "{fw:?}"
    );
    assert!(
        has(&format!("blk sector0 {}", hex(b"fc-python rootfs"))),
        "{fw:?}"
    );
    assert!(
        has("vsock listening on 52") && has("vsock echo 21 bytes"),
        "{fw:?}"
    );
    assert!(has("net sent hello from "), "{fw:?}");
    // The frame itself, on the tap: a broadcast from the guest's MAC with
    // the firmware's EtherType and payload.
    let hello = common::netns::next_frame(&capture, T).expect("the guest's hello frame on the tap");
    assert_eq!(&hello[..6], &[0xff; 6], "{hello:02x?}");
    let mac = fw
        .iter()
        .find_map(|l| l.split("net sent hello from ").nth(1))
        .unwrap();
    let mac: Vec<u8> = mac
        .split(':')
        .map(|b| u8::from_str_radix(b, 16).unwrap())
        .collect();
    assert_eq!(&hello[6..12], &mac[..], "{hello:02x?}");
    assert_eq!(&hello[12..14], &[0x88, 0xb5], "{hello:02x?}");
    assert!(
        hello.windows(19).any(|w| w == b"teravm firmware net"),
        "{hello:02x?}"
    );
    assert!(seen["vsock"]["ok"].as_str().unwrap().starts_with("OK "));
    assert_eq!(seen["vsock"]["echoed"], "fc-python over vsock\n");
    assert_eq!(seen["rootfs_sector1"], "a5a5a5a5", "{seen}");
    let log: Vec<String> = seen["log_lines"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.as_str().unwrap().to_string())
        .collect();
    let lines = check_log_lines(&log.join("\n"), "fcpy0123", true);
    assert!(
        lines
            .iter()
            .any(|l| l.contains("network interface eth0 at")),
        "{lines:?}"
    );
}
