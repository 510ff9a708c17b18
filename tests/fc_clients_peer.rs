//! Firecracker's clients against both VMMs (issue 26): the requests firectl
//! sends with its defaults (`smt: true`), with go-sdk's `WithRateLimiter`
//! (drive and interface limiters) and `SetMetadata` / `MmdsAddress` (the
//! MMDS), and flintlock's config file as its source writes it (`smt`,
//! `mmds-config`, `--metadata`), each sent with the same bytes to the real
//! Firecracker and to teravm (default flags, seccomp on), in a network
//! namespace with a real tap. Every request must answer the same on both,
//! and the same test guest must print the same MMDS line on both: the
//! clients start unmodified on either.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{json, Value};

use common::api::*;
use common::netns::Netns;
use common::*;

const MAC: &str = "06:00:ac:10:00:02";

/// firectl's default kernel arguments, then the test guest's words.
const FIRECTL_ARGS: &str = "ro console=ttyS0 noapic reboot=k panic=1 pci=off nomodules";

/// Starts `bin` as the clients start Firecracker (`--api-sock S --id ID`,
/// plus `extra`) inside `ns`.
fn spawn(ns: &Netns, bin: &Path, dir: &Path, extra: &[&str]) -> (Vmm, PathBuf) {
    let sock = dir.join("api.sock");
    let _ = std::fs::remove_file(&sock);
    let mut cmd: Command = ns.command(bin.to_str().unwrap());
    cmd.arg("--api-sock").arg(&sock).args(["--id", "client"]);
    cmd.args(extra);
    cmd.current_dir(dir);
    let vmm = Vmm::spawn_command(cmd);
    wait_for_api(&sock, T);
    (vmm, sock)
}

/// The request sequence: firectl's defaults with go-sdk's limiters and
/// metadata, in the order go-sdk's handlers send them.
fn requests(dir: &Path) -> Vec<(&'static str, String, String)> {
    let root = dir.join("root.img");
    let data = dir.join("data.img");
    std::fs::write(&root, vec![0u8; 1 << 20]).unwrap();
    std::fs::write(&data, vec![0u8; 1 << 20]).unwrap();
    let limiter = json!({
        "bandwidth": {"size": 1_048_576, "one_time_burst": 0, "refill_time": 1000},
        "ops": {"size": 100, "refill_time": 1000}
    });
    vec![
        (
            "PUT",
            "/machine-config".into(),
            r#"{"mem_size_mib":256,"smt":true,"vcpu_count":2}"#.into(),
        ),
        (
            "PUT",
            "/boot-source".into(),
            json!({
                "kernel_image_path": guest(),
                "boot_args": format!("{FIRECTL_ARGS} mmds=/latest/meta-data/ami-id"),
            })
            .to_string(),
        ),
        (
            "PUT",
            "/drives/1".into(),
            json!({"drive_id": "1", "path_on_host": root, "is_root_device": true,
                   "is_read_only": false})
            .to_string(),
        ),
        (
            "PUT",
            "/drives/2".into(),
            json!({"drive_id": "2", "path_on_host": data, "is_root_device": false,
                   "is_read_only": true, "rate_limiter": limiter})
            .to_string(),
        ),
        (
            "PUT",
            "/network-interfaces/1".into(),
            json!({"iface_id": "1", "host_dev_name": "tap0", "guest_mac": MAC,
                   "rx_rate_limiter": limiter, "tx_rate_limiter": limiter})
            .to_string(),
        ),
        (
            "PUT",
            "/mmds/config".into(),
            r#"{"network_interfaces":["1"],"version":"V2"}"#.into(),
        ),
        (
            "PUT",
            "/mmds".into(),
            r#"{"latest":{"meta-data":{"ami-id":"ami-from-go-sdk"}}}"#.into(),
        ),
        (
            "PUT",
            "/actions".into(),
            r#"{"action_type":"InstanceStart"}"#.into(),
        ),
    ]
}

/// Runs the sequence against `bin`; the answers, the guest's MMDS line and
/// `GET /vm/config`.
fn replay(ns: &Netns, bin: &Path, name: &str) -> (Vec<u16>, String, Value) {
    let dir = temp_dir(name);
    let (mut vmm, sock) = spawn(ns, bin, &dir, &[]);
    let mut statuses = Vec::new();
    for (method, path, body) in requests(&dir) {
        let (s, b) = common::client::request(&sock, method, &path, Some(&body)).unwrap();
        eprintln!("{name}: {method} {path} -> {s} {b}");
        statuses.push(s);
    }
    let line = vmm.wait_line("teravm guest: mmds", T);
    let config = get(&sock, "/vm/config");
    let _ = vmm.child.kill();
    let _ = vmm.child.wait();
    let words = line.split_once("teravm guest: ").map_or("", |(_, w)| w);
    (statuses, words.trim_end().to_string(), config)
}

#[test]
fn firectl_and_go_sdk_requests_answer_alike_on_firecracker_and_teravm() {
    if !kvm_or_skip("fc_clients_peer") {
        return;
    }
    let Some(fc) = firecracker("fc_clients_peer") else {
        return;
    };
    let Some(ns) = Netns::new("fcclients") else {
        skip(
            "fc_clients_peer",
            "cannot make a network namespace with a tap (ip, root)",
        );
        return;
    };
    let _big = big_memory();
    let (fc_status, fc_line, fc_config) = replay(&ns, &fc, "fcclients-fc");
    let (tv_status, tv_line, tv_config) = replay(&ns, Path::new(teravm()), "fcclients-tv");
    assert_eq!(fc_status, vec![204; fc_status.len()], "Firecracker");
    assert_eq!(tv_status, fc_status, "teravm answered otherwise");
    assert_eq!(fc_line, "mmds 200 ami-from-go-sdk");
    assert_eq!(tv_line, fc_line);
    // What each took: smt, and the limiters echoed in the same shape.
    for c in [&fc_config, &tv_config] {
        assert_eq!(c["machine-config"]["smt"], true, "{c}");
    }
    let limits = |c: &Value| {
        let d = c["drives"].as_array().unwrap();
        let n = &c["network-interfaces"][0];
        (
            d.iter()
                .find(|d| d["drive_id"] == "2")
                .map(|d| d["rate_limiter"].clone()),
            n["rx_rate_limiter"].clone(),
            n["tx_rate_limiter"].clone(),
        )
    };
    assert_eq!(limits(&tv_config), limits(&fc_config));
}

/// flintlock's config file as its source writes it (`smt: true` on amd64,
/// a V1 `mmds-config` naming its interface, `drives` with the root volume,
/// `--metadata` with the instance's metadata), started with `--no-api`.
#[test]
fn flintlocks_config_file_starts_alike_on_firecracker_and_teravm() {
    if !kvm_or_skip("fc_clients_peer_flintlock") {
        return;
    }
    let Some(fc) = firecracker("fc_clients_peer_flintlock") else {
        return;
    };
    let Some(ns) = Netns::new("fcflint") else {
        skip(
            "fc_clients_peer_flintlock",
            "cannot make a network namespace with a tap (ip, root)",
        );
        return;
    };
    let _big = big_memory();
    let mut lines = Vec::new();
    for (name, bin) in [
        ("flint-fc", fc.as_path()),
        ("flint-tv", Path::new(teravm())),
    ] {
        let dir = temp_dir(name);
        let root = dir.join("root.img");
        std::fs::write(&root, vec![0u8; 1 << 20]).unwrap();
        let meta = dir.join("metadata.json");
        std::fs::write(
            &meta,
            r#"{"meta-data":{"instance-id":"ns1/vm1","local-hostname":"vm1"}}"#,
        )
        .unwrap();
        let cfg = config_file(
            &dir,
            &json!({
                "boot-source": {"kernel_image_path": guest(),
                    "boot_args": format!("{FIRECTL_ARGS} mmds=/meta-data/local-hostname")},
                "drives": [{"drive_id": "root", "path_on_host": root, "is_root_device": true,
                    "is_read_only": false, "cache_type": "Unsafe"}],
                "machine-config": {"vcpu_count": 2, "mem_size_mib": 256, "smt": true},
                "network-interfaces": [{"iface_id": "eth0", "host_dev_name": "tap0",
                    "guest_mac": MAC}],
                "mmds-config": {"version": "V1", "network_interfaces": ["eth0"]},
            })
            .to_string(),
        );
        let mut cmd = ns.command(bin.to_str().unwrap());
        cmd.args(["--id", "vm1", "--no-api", "--config-file"])
            .arg(&cfg)
            .arg("--metadata")
            .arg(&meta)
            .current_dir(&dir);
        let mut vmm = Vmm::spawn_command(cmd);
        let line = vmm.wait_line("teravm guest: mmds", T);
        let _ = vmm.child.kill();
        let _ = vmm.child.wait();
        eprintln!("{name}: {line}");
        lines.push(
            line.split_once("teravm guest: ")
                .unwrap()
                .1
                .trim_end()
                .to_string(),
        );
    }
    assert_eq!(lines[0], "mmds 200 vm1");
    assert_eq!(lines[1], lines[0]);
}
