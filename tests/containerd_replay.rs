//! firecracker-containerd's requests replayed against the real Firecracker
//! and teravm side by side (issue 37, part 4): the runtime shim's
//! `CreateVM`, a container's drive, its removal and `StopVM`, each request
//! in its order and shape to both; the same status (and a `fault_message`
//! or none) from both; what the guest sees of the stub drive the shim
//! patches while it runs; the vsock, the logger and metrics FIFOs.
//!
//! Read from firecracker-containerd be68640a (2026-07-16) and the
//! firecracker-go-sdk it pins (its `Machine` as of 6fb280e9).
//!
//! 1. `runtime/service.go` `buildVMConfiguration`: `mkfifo` (0700)
//!    `fc-logs.fifo` and `fc-metrics.fifo` in the shim dir (absolute
//!    paths; nothing in the shim reads them: `CreateVM`'s and `GetVMInfo`'s
//!    callers get their paths); `config.go`'s defaults (kernel args
//!    `console=ttyS0 noapic reboot=k panic=1 pci=off nomodules rw`,
//!    `cpu_template` `T2` on an Intel host (see the test for this host),
//!    `helpers.go`
//!    `machineConfigurationFromProto`: 1 vCPU, 128 MiB, `smt` false); the
//!    root drive (`buildRootDrive`, go-sdk `DrivesBuilder`: `root_drive`,
//!    root, read-only); `drive_handler.go` `CreateContainerStubs`: one stub
//!    file `ctrstub0` per container (`newStubDrive`: the magic bytes, the
//!    id's length, the id, truncated up to a whole sector), drive id the
//!    base32 of the file's name, read-write, no rate limiter; the vsock
//!    `agent_api` on `firecracker.vsock` (relative) with no CID (go-sdk
//!    `addVsock` sends `guest_cid` 0; its client does not validate).
//! 2. `runtime/noop_jailer.go` `BuildJailedMachine`: `<vmm> --api-sock
//!    firecracker.sock --id <VMID>`, run in the shim dir (both paths
//!    relative to it).
//! 3. go-sdk `Machine.Start` (`handlers.go` `defaultFcInitHandlerList`,
//!    `machine.go`): `waitForSocket` (the socket file, then `GET
//!    /machine-config` until it answers); `CreateLogFilesHandler` (the
//!    FIFOs opened read-write, closed); `PUT /logger` `{"log_path",
//!    "show_level": true, "show_log_origin": false}` (no `level`: the
//!    default debug helper has none); `PUT /metrics` `{"metrics_path"}`;
//!    `PUT /machine-config`, then `GET /machine-config`
//!    (`refreshMachineConfiguration`); `PUT /boot-source`; `PUT /drives/<id>`
//!    for each drive; `PUT /network-interfaces/1` for the NIC; `PUT /vsock`;
//!    the MMDS config is skipped (no interface allows it); `PUT /actions`
//!    `InstanceStart`.
//! 4. `service.go` `createVM`: `vsock.DialContext` to the agent:
//!    `CONNECT 10789\n` (`defaultVsockPort`) on the vsock's socket.
//! 5. A container: `StubDriveHandler.Reserve` → `PatchAndMount`: go-sdk
//!    `UpdateGuestDrive`, `PATCH /drives/<id>` `{"drive_id", "path_on_host":
//!    <the container's snapshot>}`; the agent then mounts it (the guest
//!    reads it). Its deletion: `Release`, `PATCH` back to
//!    `filepath.Base(stubPath)`, the stub's name relative to the shim dir.
//! 6. `StopVM` → `terminate`: `GET /` (`isPaused`), the agent's `Shutdown`
//!    RPC (the agent exits, the guest reboots: with `reboot=k` an i8042
//!    reset, and the VMM exits), `machine.Wait`. The test guest has no
//!    agent: `SendCtrlAltDel` (go-sdk's `Machine.Shutdown`) makes it reset
//!    itself the same way.
//!
//! The guest is the test guest (`blk-dev=1 blk-watch`, the stub drive;
//! `vsock=echo:10789` for the agent). A Linux guest with the real agent
//! cannot run on this host (PVM).

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::api::T;
use common::fc_api::{field_differences, has_fault, Side};
use common::netns::Netns;
use common::replay::*;
use common::*;

const VMID: &str = "ctrd-replay-1";
/// base32 (no padding) of `ctrstub0`, `stubPathToDriveID`.
const STUB_ID: &str = "MN2HE43UOVRDA";
/// `internal.MagicStubBytes`.
const MAGIC: [u8; 8] = [214, 244, 216, 245, 215, 177, 177, 177];
const MAC: &str = "02:00:ca:fe:00:02";
const SNAPSHOT_HEAD: &[u8; 16] = b"ctrd-snapshot-01";
/// `config.go`'s default kernel args.
const KERNEL_ARGS: &str = "console=ttyS0 noapic reboot=k panic=1 pci=off nomodules rw";

/// `newStubDrive`'s contents: magic, length, id, up to a whole sector.
fn stub_content() -> Vec<u8> {
    let mut b = MAGIC.to_vec();
    b.push(STUB_ID.len() as u8);
    b.extend_from_slice(STUB_ID.as_bytes());
    b.resize(512, 0);
    b
}

/// One side: the shim dir, its FIFOs.
struct Shim {
    side: Side,
    logs: Fifo,
    metrics: Fifo,
}

/// Steps 1 and 2, and `waitForSocket`'s probe: the shim dir and the VMM.
fn shim_start(name: &'static str, program: &Path, test: &str, ns: Option<&Netns>) -> Shim {
    let dir = temp_dir(&format!("{test}-{name}"));
    std::fs::copy(guest(), dir.join("default-vmlinux.bin")).unwrap();
    drive_file(
        &dir.join("default-rootfs.img"),
        b"ctrd-rootfs-0000",
        1 << 20,
    );
    std::fs::write(dir.join("ctrstub0"), stub_content()).unwrap();
    let mut logs = Fifo::make(&dir.join("fc-logs.fifo"));
    let mut metrics = Fifo::make(&dir.join("fc-metrics.fifo"));
    // A `CreateVM` caller reads them (the paths come back in its answer).
    logs.read();
    metrics.read();
    let cmd = match ns {
        Some(ns) => ns.command(program.to_str().unwrap()),
        None => Command::new(program),
    };
    let side = start_side(
        name,
        cmd,
        &dir,
        &["--api-sock", "firecracker.sock", "--id", VMID],
    );
    Shim {
        side,
        logs,
        metrics,
    }
}

/// The same request to both, answered alike; teravm's answer.
fn same(shims: &[Shim; 2], method: &str, path: &str, body: &str) -> (u16, String) {
    let f = shims[0].side.ask(method, path, Some(body));
    let t = shims[1].side.ask(method, path, Some(body));
    assert!(
        f.0 == t.0 && has_fault(&f.1) == has_fault(&t.1),
        "{method} {path} {body}: Firecracker {f:?}, teravm {t:?}"
    );
    t
}

/// `GET path` on both, alike but for `differs` (each with its reason at
/// the call).
fn same_get(shims: &[Shim; 2], path: &str, differs: &[&str]) -> serde_json::Value {
    let (f, t) = (shims[0].side.get(path), shims[1].side.get(path));
    let d = field_differences(&f, &t, differs);
    assert!(
        d.is_empty(),
        "GET {path}:\n{}\nFirecracker {f}\nteravm {t}",
        d.join("\n")
    );
    t
}

#[test]
fn firecracker_containerd_replay() {
    let test = "firecracker_containerd_replay";
    if !kvm_or_skip(test) {
        return;
    }
    let Some(fc_bin) = firecracker(test) else {
        return;
    };
    let _one = big_memory();
    let ns = match (Netns::new("ctrd-fc"), Netns::new("ctrd-tv")) {
        (Some(a), Some(b)) => Some((a, b)),
        _ => {
            eprintln!("{test}: no network namespace with a tap here; the NIC is left out");
            None
        }
    };
    let mut shims = [
        shim_start("firecracker", &fc_bin, test, ns.as_ref().map(|n| &n.0)),
        shim_start(
            "teravm",
            Path::new(teravm()),
            test,
            ns.as_ref().map(|n| &n.1),
        ),
    ];
    // waitForSocket's probe, before anything is configured.
    same_get(
        &shims,
        "/machine-config",
        // teravm's defaults: 256 MiB, THP, `cpu_template` shown as "None"
        // (docs/firecracker.md, machine configuration).
        &["mem_size_mib", "huge_pages", "cpu_template"],
    );
    // CreateLogFilesHandler.
    for s in &shims {
        for f in [&s.logs.path, &s.metrics.path] {
            drop(
                std::fs::OpenOptions::new()
                    .read(true)
                    .append(true)
                    .open(f)
                    .unwrap(),
            );
        }
    }
    let abs = |s: &Shim, f: &str| s.side.dir.join(f).display().to_string();
    for s in &shims {
        let logger = format!(
            r#"{{"log_path":"{}","show_level":true,"show_log_origin":false}}"#,
            abs(s, "fc-logs.fifo")
        );
        let metrics = format!(r#"{{"metrics_path":"{}"}}"#, abs(s, "fc-metrics.fifo"));
        s.side.put_ok("/logger", &logger);
        s.side.put_ok("/metrics", &metrics);
    }
    // With `config.go`'s default `cpu_template` `T2` (an Intel host) both
    // take this PUT and refuse `InstanceStart` on a host T2 is not for
    // (this one: Emerald Rapids), Firecracker and teravm alike; an operator
    // there sets `"cpu_template": ""` in firecracker-runtime.json, and
    // go-sdk then leaves the field out. That is the replay.
    same(
        &shims,
        "PUT",
        "/machine-config",
        r#"{"mem_size_mib":128,"smt":false,"vcpu_count":1}"#,
    );
    // teravm shows `huge_pages` "Transparent" by default and
    // `cpu_template` "None".
    same_get(&shims, "/machine-config", &["huge_pages", "cpu_template"]);
    let words = format!("{KERNEL_ARGS} blk-dev=1 blk-watch vsock=echo:10789 then=idle");
    for s in &shims {
        let boot = format!(
            r#"{{"boot_args":"{words}","kernel_image_path":"{}"}}"#,
            abs(s, "default-vmlinux.bin")
        );
        s.side.put_ok("/boot-source", &boot);
        let root = format!(
            r#"{{"drive_id":"root_drive","is_read_only":true,"is_root_device":true,"path_on_host":"{}"}}"#,
            abs(s, "default-rootfs.img")
        );
        s.side.put_ok("/drives/root_drive", &root);
        let stub = format!(
            r#"{{"drive_id":"{STUB_ID}","is_read_only":false,"is_root_device":false,"path_on_host":"{}"}}"#,
            abs(s, "ctrstub0")
        );
        s.side.put_ok(&format!("/drives/{STUB_ID}"), &stub);
    }
    if ns.is_some() {
        same(
            &shims,
            "PUT",
            "/network-interfaces/1",
            &format!(r#"{{"guest_mac":"{MAC}","host_dev_name":"tap0","iface_id":"1"}}"#),
        );
    }
    same(
        &shims,
        "PUT",
        "/vsock",
        r#"{"guest_cid":0,"uds_path":"firecracker.vsock","vsock_id":"agent_api"}"#,
    );
    let (st, b) = same(
        &shims,
        "PUT",
        "/actions",
        r#"{"action_type":"InstanceStart"}"#,
    );
    assert_eq!(st, 204, "InstanceStart: {b}");

    // The FIFOs: each VMM holds both open and writes a metrics line at
    // once.
    for s in &mut shims {
        let pid = s.side.vmm.child.id();
        for f in [&s.logs.path, &s.metrics.path] {
            assert!(
                holds_open(pid, f),
                "{} does not hold {}",
                s.side.name,
                f.display()
            );
        }
        let line = s.metrics.wait(metrics_object, Duration::from_secs(10));
        assert!(
            line.is_some(),
            "{}: no metrics line after the start",
            s.side.name
        );
        let log = s.logs.first(Duration::from_secs(10));
        assert!(
            log.as_deref().is_some_and(|l| log_line_shape(l, VMID)),
            "{}: the log FIFO's first line {log:?}",
            s.side.name
        );
    }
    // The guest reads the stub, as the agent does to find its drive.
    for s in &mut shims {
        let dev = blk_line(&mut s.side, "device");
        assert!(
            dev.ends_with("capacity 1 sectors"),
            "{}: {dev}",
            s.side.name
        );
        let sector0 = blk_line(&mut s.side, "sector0");
        assert_eq!(
            sector0,
            format!("blk sector0 {}", hex(&stub_content()[..16]))
        );
    }
    // The agent's connection.
    for s in &mut shims {
        s.side
            .vmm
            .wait_line(&format!("{G}vsock listening on 10789"), T);
        vsock_echo(&s.side.dir.join("firecracker.vsock"), 10789, b"ttrpc hello")
            .unwrap_or_else(|e| panic!("{}: {e}", s.side.name));
    }

    // A container: its snapshot onto the stub.
    let mut answers = Vec::new();
    for s in &shims {
        drive_file(&s.side.dir.join("snapshot.img"), SNAPSHOT_HEAD, 1 << 20);
        let body = format!(
            r#"{{"drive_id":"{STUB_ID}","path_on_host":"{}"}}"#,
            abs(s, "snapshot.img")
        );
        answers.push(
            s.side
                .ask("PATCH", &format!("/drives/{STUB_ID}"), Some(&body)),
        );
    }
    assert!(
        answers[0].0 == 204 && answers[0].0 == answers[1].0,
        "PATCH (Reserve): {answers:?}"
    );
    for s in &mut shims {
        let (cap, sector0) = replaced(&mut s.side);
        assert_eq!(cap, "blk config capacity 2048 sectors", "{}", s.side.name);
        assert_eq!(
            sector0,
            format!("blk sector0 {}", hex(SNAPSHOT_HEAD)),
            "{}: the guest did not read the container's snapshot",
            s.side.name
        );
    }
    // Its deletion: back to the stub, named relative to the shim dir.
    same(
        &shims,
        "PATCH",
        &format!("/drives/{STUB_ID}"),
        &format!(r#"{{"drive_id":"{STUB_ID}","path_on_host":"ctrstub0"}}"#),
    );
    for s in &mut shims {
        let (cap, sector0) = replaced(&mut s.side);
        assert_eq!(cap, "blk config capacity 1 sectors", "{}", s.side.name);
        assert_eq!(
            sector0,
            format!("blk sector0 {}", hex(&stub_content()[..16]))
        );
    }

    // StopVM: isPaused, the guest's own reset, machine.Wait.
    let info = same_get(&shims, "/", &["app_name", "vmm_version"]);
    assert_eq!(info["state"], "Running");
    assert_eq!(info["id"], VMID);
    same(
        &shims,
        "PUT",
        "/actions",
        r#"{"action_type":"SendCtrlAltDel"}"#,
    );
    let [fc, tv] = shims;
    for mut s in [fc, tv] {
        s.side.vmm.wait_line(&format!("{G}reset"), T);
        let name = s.side.name;
        let status = wait_gone(s.side, T);
        assert_eq!(status.code(), Some(0), "{name} after the guest's reset");
        // The last metrics line, written as the VMM stops.
        let last = s.metrics.wait(metrics_object, Duration::from_secs(5));
        assert!(last.is_some(), "{name}: no metrics line at the exit");
    }
}
