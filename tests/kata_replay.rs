//! Kata Containers' Firecracker drivers replayed against the real
//! Firecracker and teravm side by side (issue 37, part 4): each request the
//! driver sends, in its order and shape, to both; the same status (and a
//! `fault_message` or none) from both; what the guest sees of the drives
//! the driver replaces while it runs, and what the driver does with the
//! vsock, the logger and metrics FIFOs and the process at the end.
//!
//! Read from kata-containers 7c6ba40c (2026-08-22).
//!
//! ## The Go runtime: `src/runtime/virtcontainers/fc.go`
//!
//! 1. `getVersionNumber`/`checkVersion` (in `fcInit`): `<vmm> --version`,
//!    the first line's second field without its `v`, a semver at least
//!    0.21.1, else the sandbox is refused.
//! 2. `fcInitConfiguration`: under `<vmPath>/root` (the jail root; unjailed,
//!    its files are bind mounts of the host's): the kernel as `vmlinux`, the
//!    VM image as `rootfs` (`fcSetVMRootfs`: drive `rootfs`, read-only, not
//!    the root device), 8 empty placeholder files `drive_0`..`drive_7`
//!    (`createDiskPool`, `fcDiskPoolSize`: drives, read-write, not root; no
//!    `cache_type` unless configured), the logger and metrics FIFOs
//!    (`fcListenToFifo`: `mkfifo` `logs.fifo`/`metrics.fifo`, opened for
//!    reading non-blocking before the VMM starts, read line by line;
//!    metrics lines are unmarshalled as JSON by `updateMetrics`; logger
//!    `level` `Error` unless debugging), the hybrid vsock (`fcAddVsock`:
//!    `guest_cid` 3, `uds_path` `<root>/kata.hvsock`, `vsock_id` `root`),
//!    the pod's NIC (`fcAddNetDevice`: `iface_id` the endpoint's name,
//!    `host_dev_name` its tap, `guest_mac`, and always `rx_rate_limiter`
//!    and `tx_rate_limiter`, `{}` without limits), `machine-config`
//!    (`fcSetVMBaseConfig`: `smt: false`, `mem_size_mib`, `vcpu_count`),
//!    `boot-source` (`boot_args`: the configured params, then the root
//!    params and `fcKernelParams`).
//! 3. `StartVM`: all of it as one JSON file (`types.FcConfig`, its
//!    sections in that order), then `<vmm> --api-sock <root>/run/
//!    firecracker.socket --config-file <file>` (unjailed), which starts the
//!    guest at once.
//! 4. `waitVMMRunning`: `GET /` every 10 ms until `state` is `Running`;
//!    then `chmod 0640` of the vsock's `uds_path` (it must exist).
//! 5. The agent: `CONNECT 1024\n` on `kata.hvsock` (`vSockPort`).
//! 6. `hotplugBlockDevice` (`AddDevice`): the container's drive is bind
//!    mounted over the placeholder `<root>/drive_<index>` (a container's
//!    first block device has index 0: `sandbox.go`
//!    `getAndSetSandboxBlockIndex`), then
//!    `fcUpdateBlockDrive`: `PATCH /drives/drive_<index>` `{"drive_id",
//!    "path_on_host"}` with that same path (the VMM opens it again and
//!    gets the container's file). `RemoveDevice`: unmount (the empty
//!    placeholder is back) and the same `PATCH` again.
//! 7. `StopVM`/`fcEnd`: SIGTERM, then wait up to 15 s
//!    (`fcStopSandboxTimeout`) for the process to be gone.
//!
//! ## The Rust runtime: `src/runtime-rs/crates/hypervisor/src/firecracker/`
//!
//! 1. `inner.rs` `prepare_vmm`: `<vmm> --api-sock <vmPath>/run/fc.sock`
//!    (unjailed; `--no-seccomp` only when configured). No logger or
//!    metrics: it reads the VMM's stderr.
//! 2. `fc_api.rs` `prepare_vmm_resources`, each request retried until it
//!    succeeds: `PUT /boot-source` `{"kernel_image_path", "boot_args"}`,
//!    `PUT /machine-config` `{"mem_size_mib", "vcpu_count"}`, `PUT
//!    /drives/rootfs` (read-only, not root), then `drive1`..`drive5`
//!    (`DISK_POOL_SIZE` 6), empty files `<vmPath>/root/drive<i>`,
//!    read-write.
//! 3. `prepare_hvsock`: `PUT /vsock` `{"guest_cid": 3, "uds_path":
//!    "<vmPath>/kata.hvsock", "vsock_id": "root"}`; queued devices
//!    (`inner_device.rs` `add_device`: the NIC, `PUT /network-interfaces/
//!    <id>` `{"iface_id", "guest_mac", "host_dev_name"}`); `start_vm`:
//!    `PUT /actions` `InstanceStart`.
//! 4. `inner_device.rs` `hotplug_block_device` (for an index above 0: the
//!    pool starts at `drive1`) → `patch_container_rootfs`: `PATCH
//!    /drives/drive<index>` `{"drive_id", "path_on_host": <the container's
//!    file>, "rate_limiter": null}` (a `RateLimiterConfig` with `bandwidth`
//!    and `ops` where the configuration sets disk limits); a removal sends
//!    nothing.
//! 5. `stop_vm`: `kill()`, SIGKILL.
//!
//! The guest is the test guest (`blk-dev=<n> blk-watch`: it reads the
//! watched drive's sector 0, and again on each config-change interrupt, as
//! Linux re-reads a drive's capacity; `vsock=echo:1024` stands in for the
//! agent). A Linux guest with the real agent cannot run on this host (PVM).

mod common;

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::api::T;
use common::fc_api::{has_fault, Side};
use common::netns::Netns;
use common::replay::*;
use common::*;

/// Kata's params after the configured ones: the root params
/// (`GetKernelRootParams` for the default ext4 image) and `fcKernelParams`,
/// without debugging.
const KATA_PARAMS: &str = "root=/dev/vda1 rootflags=data=ordered,errors=remount-ro ro \
    rootfstype=ext4 pci=off reboot=k panic=1 iommu=off net.ifnames=0 random.trust_cpu=on \
    acpi=off 8250.nr_uarts=0 agent.log_vport=1025";
const MAC: &str = "02:00:ca:fe:00:01";
/// The guest's line for a sector past a drive's end, on Firecracker and
/// on teravm.
const PAST_END_FC: &str = "blk sector0 not ready";
const PAST_END_TV: &str = "blk sector0 ioerr";
const CONTAINER_HEAD: &[u8; 16] = b"kata-container-1";
const ROOTFS_HEAD: &[u8; 16] = b"kata-rootfs-0000";

/// What Kata's `parseVersion`/`checkVersion` make of `<program>
/// --version`: Ok(version) or the refusal.
fn kata_version_check(program: &Path) -> Result<String, String> {
    let out = Command::new(program).arg("--version").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let first = text.lines().next().unwrap_or_default();
    let fields: Vec<&str> = first.split(' ').collect();
    if fields.len() < 2 {
        return Err(format!("malformed: {first:?}"));
    }
    let v = fields[1].trim().trim_start_matches('v');
    let num: Vec<u64> = v
        .split(['.', '-'])
        .take(3)
        .map(|p| p.parse().unwrap_or(0))
        .collect();
    if num.len() < 3 {
        return Err(format!("not a semver: {v:?}"));
    }
    if (num[0], num[1], num[2]) < (0, 21, 1) {
        return Err(format!(
            "version {v} is not supported. Minimum supported version of firecracker is 0.21.1"
        ));
    }
    Ok(v.to_string())
}

/// The VMM `program`, behind `ip netns exec` where there is a namespace.
fn command(program: &Path, ns: Option<&Netns>) -> Command {
    match ns {
        Some(ns) => ns.command(program.to_str().unwrap()),
        None => Command::new(program),
    }
}

/// Namespaces with a tap each (one per VMM), or none where they cannot be
/// made: the NIC is then left out.
fn namespaces(test: &str) -> Option<(Netns, Netns)> {
    match (
        Netns::new(&format!("{test}-fc")),
        Netns::new(&format!("{test}-tv")),
    ) {
        (Some(a), Some(b)) => Some((a, b)),
        _ => {
            eprintln!("{test}: no network namespace with a tap here; the NIC is left out");
            None
        }
    }
}

/// One side of the Go runtime's replay: its sandbox dir and FIFOs.
struct GoSide {
    side: Side,
    root: PathBuf,
    logs: Fifo,
    metrics: Fifo,
}

/// Steps 2 and 3 of the Go runtime for `program`.
fn go_start(name: &'static str, program: &Path, test: &str, ns: Option<&Netns>) -> GoSide {
    let vm_path = temp_dir(&format!("{test}-{name}"));
    let root = vm_path.join("root");
    std::fs::create_dir_all(root.join("run")).unwrap();
    std::fs::copy(guest(), root.join("vmlinux")).unwrap();
    drive_file(&root.join("rootfs"), ROOTFS_HEAD, 1 << 20);
    let mut logs = Fifo::make(&root.join("logs.fifo"));
    let mut metrics = Fifo::make(&root.join("metrics.fifo"));
    logs.read();
    metrics.read();
    let r = root.display();
    let mut drives = format!(
        r#"{{"drive_id": "rootfs", "is_read_only": true, "is_root_device": false, "path_on_host": "{r}/rootfs"}}"#
    );
    for i in 0..8 {
        std::fs::write(root.join(format!("drive_{i}")), "").unwrap();
        drives.push_str(&format!(
            r#", {{"drive_id": "drive_{i}", "is_read_only": false, "is_root_device": false, "path_on_host": "{r}/drive_{i}"}}"#
        ));
    }
    let nics = match ns {
        Some(_) => format!(
            r#", "network-interfaces": [{{"guest_mac": "{MAC}", "host_dev_name": "tap0", "iface_id": "eth0", "rx_rate_limiter": {{}}, "tx_rate_limiter": {{}}}}]"#
        ),
        None => String::new(),
    };
    // The guest watches drive_0 (the second drive, after rootfs): a
    // container's first block device gets index 0
    // (`getAndSetSandboxBlockIndex`), hence `drive_0`.
    let config = format!(
        r#"{{
	"boot-source": {{"boot_args": "blk-dev=1 blk-watch vsock=echo:1024 then=idle {KATA_PARAMS}", "kernel_image_path": "{r}/vmlinux"}},
	"machine-config": {{"mem_size_mib": 128, "smt": false, "vcpu_count": 1}},
	"vsock": {{"guest_cid": 3, "uds_path": "{r}/kata.hvsock", "vsock_id": "root"}},
	"logger": {{"level": "Error", "log_path": "{r}/logs.fifo"}},
	"metrics": {{"metrics_path": "{r}/metrics.fifo"}},
	"drives": [{drives}]{nics}
}}"#
    );
    let file = root.join("fcConfig.json");
    std::fs::write(&file, config).unwrap();
    let sock = root.join("run/firecracker.socket");
    let args = [
        "--api-sock",
        sock.to_str().unwrap(),
        "--config-file",
        file.to_str().unwrap(),
    ];
    let side = start_side(name, command(program, ns), &vm_path, &args);
    GoSide {
        side,
        root,
        logs,
        metrics,
    }
}

#[test]
fn kata_go_runtime_replay() {
    let test = "kata_go_runtime_replay";
    if !kvm_or_skip(test) {
        return;
    }
    let Some(fc_bin) = firecracker(test) else {
        return;
    };
    let tv_bin = PathBuf::from(teravm());
    // 1. The version check.
    let fc_version = kata_version_check(&fc_bin);
    assert!(fc_version.is_ok(), "Firecracker: {fc_version:?}");
    let tv_version = kata_version_check(&tv_bin);
    // teravm's `--version` puts the Firecracker API version it implements
    // where Kata reads one (src/main.rs): Kata takes it.
    assert_eq!(
        tv_version,
        Ok(teravm::api::FIRECRACKER_API_VERSION.to_string()),
        "Kata's version check of teravm"
    );

    let _one = big_memory();
    let ns = namespaces("kgo");
    let mut sides = [
        go_start("firecracker", &fc_bin, test, ns.as_ref().map(|n| &n.0)),
        go_start("teravm", &tv_bin, test, ns.as_ref().map(|n| &n.1)),
    ];

    // 4. Running within Kata's 10 s (`fcTimeout`), polled as Kata polls
    // (Firecracker answers only once the guest runs; teravm's API answers
    // `Starting` before), the vsock socket there and made 0640.
    for s in &sides {
        wait_running(&s.side, Duration::from_secs(10));
        let uds = s.root.join("kata.hvsock");
        std::fs::set_permissions(&uds, std::fs::Permissions::from_mode(0o640))
            .unwrap_or_else(|e| panic!("{}: chmod {}: {e}", s.side.name, uds.display()));
    }
    // The FIFOs: each VMM holds the logger's open; each writes a metrics
    // line Kata's `updateMetrics` can read, without being asked.
    for s in &mut sides {
        let pid = s.side.vmm.child.id();
        assert!(
            holds_open(pid, &s.logs.path),
            "{} does not hold {} open",
            s.side.name,
            s.logs.path.display()
        );
        let line = s.metrics.wait(metrics_object, Duration::from_secs(10));
        assert!(
            line.is_some(),
            "{}: no metrics line after the start (seen {:?})",
            s.side.name,
            s.metrics.seen
        );
    }
    // The guest found the empty placeholder.
    for s in &mut sides {
        let dev = blk_line(&mut s.side, "device");
        assert!(
            dev.ends_with("capacity 0 sectors"),
            "{}: {dev}",
            s.side.name
        );
    }
    let first: Vec<String> = sides
        .iter_mut()
        .map(|s| blk_line(&mut s.side, "sector0"))
        .collect();
    // An empty placeholder's sector 0 is past its end: teravm answers
    // VIRTIO_BLK_S_IOERR; Firecracker returns the request without writing
    // its status byte, so the driver reads the value it left there, which
    // virtio-drivers reports as `not ready` (docs/devices.md).
    assert_eq!(
        first,
        [PAST_END_FC, PAST_END_TV],
        "an empty placeholder's sector 0"
    );

    // 5. The agent's connection, once the guest listens (Kata's dialer
    // retries until the agent answers).
    for s in &mut sides {
        s.side
            .vmm
            .wait_line(&format!("{G}vsock listening on 1024"), T);
        vsock_echo(&s.root.join("kata.hvsock"), 1024, b"kata agent ttrpc")
            .unwrap_or_else(|e| panic!("{}: {e}", s.side.name));
    }

    // 6. Hot-plug: the container's drive in place of the placeholder (Kata
    // bind mounts it over the file; here it is renamed over it: the same
    // path, another file), the PATCH.
    let patch = |s: &GoSide| {
        let path = s.root.join("drive_0");
        let body = format!(
            r#"{{"drive_id":"drive_0","path_on_host":"{}"}}"#,
            path.display()
        );
        s.side.ask("PATCH", "/drives/drive_0", Some(&body))
    };
    for s in &sides {
        let ctr = s.side.dir.join("container.img");
        drive_file(&ctr, CONTAINER_HEAD, 1 << 20);
        std::fs::rename(&ctr, s.root.join("drive_0")).unwrap();
    }
    same_answers(&sides.iter().map(patch).collect::<Vec<_>>(), "PATCH (add)");
    for s in &mut sides {
        let (cap, sector0) = replaced(&mut s.side);
        assert_eq!(cap, "blk config capacity 2048 sectors", "{}", s.side.name);
        assert_eq!(
            sector0,
            format!("blk sector0 {}", hex(CONTAINER_HEAD)),
            "{}: the guest did not read the container's drive",
            s.side.name
        );
    }
    // Removal: the placeholder back, the same PATCH.
    for s in &sides {
        std::fs::write(s.root.join("drive_0.empty"), "").unwrap();
        std::fs::rename(s.root.join("drive_0.empty"), s.root.join("drive_0")).unwrap();
    }
    same_answers(
        &sides.iter().map(patch).collect::<Vec<_>>(),
        "PATCH (remove)",
    );
    let back: Vec<(String, String)> = sides.iter_mut().map(|s| replaced(&mut s.side)).collect();
    for (b, first) in back.iter().zip(&first) {
        assert_eq!(b.0, "blk config capacity 0 sectors");
        assert_eq!(&b.1, first, "as before the hot-plug");
    }

    // 7. SIGTERM, then gone within Kata's 15 s.
    let [fc, tv] = sides;
    // Firecracker has no SIGTERM handler: the signal ends it. teravm's
    // stops the guest, gives its memory back and exits 0. Kata looks only
    // for the process to be gone.
    let fc_status = signal_and_wait(fc.side, libc::SIGTERM, Duration::from_secs(15));
    assert_eq!(fc_status.signal(), Some(libc::SIGTERM), "Firecracker");
    let tv_status = signal_and_wait(tv.side, libc::SIGTERM, Duration::from_secs(15));
    assert_eq!(tv_status.code(), Some(0), "teravm after SIGTERM");
}

/// Kata's `waitVMMRunning`: `GET /` every 10 ms until `state` is
/// `Running`, for at most `within`.
fn wait_running(side: &Side, within: Duration) {
    let deadline = std::time::Instant::now() + within;
    loop {
        let info = side.get("/");
        if info["state"] == "Running" {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{}: not Running within {within:?}: {info}",
            side.name
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The two answers (Firecracker's, teravm's) alike: status and fault.
fn same_answers(a: &[(u16, String)], what: &str) {
    let (f, t) = (&a[0], &a[1]);
    assert!(
        f.0 == t.0 && has_fault(&f.1) == has_fault(&t.1),
        "{what}: Firecracker {f:?}, teravm {t:?}"
    );
    assert_eq!(f.0, 204, "{what}: {f:?}");
}

/// Steps 1 to 3 of the Rust runtime for `program`: (the side, its vmPath).
fn rs_start(name: &'static str, program: &Path, test: &str, ns: Option<&Netns>) -> (Side, PathBuf) {
    let vm_path = temp_dir(&format!("{test}-{name}"));
    let root = vm_path.join("root");
    std::fs::create_dir_all(vm_path.join("run")).unwrap();
    std::fs::create_dir_all(&root).unwrap();
    let kernel = vm_path.join("vmlinux");
    std::fs::copy(guest(), &kernel).unwrap();
    let rootfs = vm_path.join("kata-containers.img");
    drive_file(&rootfs, ROOTFS_HEAD, 1 << 20);
    let sock = vm_path.join("run/fc.sock");
    let s = start_side(
        name,
        command(program, ns),
        &vm_path,
        &["--api-sock", sock.to_str().unwrap()],
    );
    // serde_json's `json!` writes keys in sorted order.
    let put = |path: &str, body: String| s.put_ok(path, &body);
    put(
        "/boot-source",
        format!(
            r#"{{"boot_args":"blk-dev=1 blk-watch vsock=echo:1024 then=idle {KATA_PARAMS}","kernel_image_path":"{}"}}"#,
            kernel.display()
        ),
    );
    put(
        "/machine-config",
        r#"{"mem_size_mib":128,"vcpu_count":1}"#.into(),
    );
    put(
        "/drives/rootfs",
        format!(
            r#"{{"drive_id":"rootfs","is_read_only":true,"is_root_device":false,"path_on_host":"{}"}}"#,
            rootfs.display()
        ),
    );
    for i in 1..6 {
        let file = root.join(format!("drive{i}"));
        std::fs::write(&file, "").unwrap();
        put(
            &format!("/drives/drive{i}"),
            format!(
                r#"{{"drive_id":"drive{i}","is_read_only":false,"is_root_device":false,"path_on_host":"{}"}}"#,
                file.display()
            ),
        );
    }
    put(
        "/vsock",
        format!(
            r#"{{"guest_cid":3,"uds_path":"{}","vsock_id":"root"}}"#,
            vm_path.join("kata.hvsock").display()
        ),
    );
    if ns.is_some() {
        put(
            "/network-interfaces/eth0",
            format!(r#"{{"guest_mac":"{MAC}","host_dev_name":"tap0","iface_id":"eth0"}}"#),
        );
    }
    (s, vm_path)
}

#[test]
fn kata_rust_runtime_replay() {
    let test = "kata_rust_runtime_replay";
    if !kvm_or_skip(test) {
        return;
    }
    let Some(fc_bin) = firecracker(test) else {
        return;
    };
    let _one = big_memory();
    let ns = namespaces("krs");
    let mut sides = [
        rs_start("firecracker", &fc_bin, test, ns.as_ref().map(|n| &n.0)),
        rs_start(
            "teravm",
            Path::new(teravm()),
            test,
            ns.as_ref().map(|n| &n.1),
        ),
    ];
    for (s, _) in &sides {
        let (st, b) = s.ask(
            "PUT",
            "/actions",
            Some(r#"{"action_type":"InstanceStart"}"#),
        );
        assert_eq!(st, 204, "{}: InstanceStart: {b}", s.name);
    }
    for (s, _) in &mut sides {
        let dev = blk_line(s, "device");
        assert!(dev.ends_with("capacity 0 sectors"), "{}: {dev}", s.name);
    }
    let first: Vec<String> = sides
        .iter_mut()
        .map(|(s, _)| blk_line(s, "sector0"))
        .collect();
    assert_eq!(first, [PAST_END_FC, PAST_END_TV], "an empty placeholder");
    for (s, vm_path) in &mut sides {
        s.vmm.wait_line(&format!("{G}vsock listening on 1024"), T);
        vsock_echo(&vm_path.join("kata.hvsock"), 1024, b"kata-rs agent")
            .unwrap_or_else(|e| panic!("{}: {e}", s.name));
    }
    // The container's drive (block index 1) onto drive1, its file as it
    // is; no rate limit configured: `"rate_limiter": null`.
    let answers: Vec<(u16, String)> = sides
        .iter()
        .map(|(s, vm_path)| {
            let ctr = vm_path.join("container.img");
            drive_file(&ctr, CONTAINER_HEAD, 1 << 20);
            let body = format!(
                r#"{{"drive_id":"drive1","path_on_host":"{}","rate_limiter":null}}"#,
                ctr.display()
            );
            s.ask("PATCH", "/drives/drive1", Some(&body))
        })
        .collect();
    same_answers(&answers, "PATCH drive1");
    for (s, _) in &mut sides {
        let (cap, sector0) = replaced(s);
        assert_eq!(cap, "blk config capacity 2048 sectors", "{}", s.name);
        assert_eq!(
            sector0,
            format!("blk sector0 {}", hex(CONTAINER_HEAD)),
            "{}: the guest did not read the container's drive",
            s.name
        );
    }
    // With disk limits configured (`RateLimiterConfig::new`): a bandwidth
    // bucket, no ops bucket, `one_time_burst` none.
    let answers: Vec<(u16, String)> = sides
        .iter()
        .map(|(s, vm_path)| {
            let ctr = vm_path.join("second.img");
            drive_file(&ctr, b"kata-container-2", 4096);
            let body = format!(
                r#"{{"drive_id":"drive2","path_on_host":"{}","rate_limiter":{{"bandwidth":{{"one_time_burst":null,"refill_time":1000,"size":10485760}},"ops":null}}}}"#,
                ctr.display()
            );
            s.ask("PATCH", "/drives/drive2", Some(&body))
        })
        .collect();
    same_answers(&answers, "PATCH drive2 with a rate limiter");
    // `stop_vm`: SIGKILL.
    let [(fc, _), (tv, _)] = sides;
    for s in [fc, tv] {
        let name = s.name;
        let status = signal_and_wait(s, libc::SIGKILL, Duration::from_secs(15));
        assert_eq!(status.signal(), Some(libc::SIGKILL), "{name}");
    }
}
