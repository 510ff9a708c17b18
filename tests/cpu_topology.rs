//! The CPUID topology the test guest reads (its `cpuid=` word, vCPU 0, at
//! CPL3), on teravm and on the real Firecracker with the same
//! machine-config: with `smt` off and on the topology fields agree (leaf 1
//! EBX[31:8] and EDX.HTT, leaf 4 EAX[31:14] of each cache, leaf 0xb and
//! 0x1f whole). Masked, because they are not topology and legitimately
//! differ: leaf 1 EBX[7:0] (brand index) is compared but ECX and the rest
//! of EDX (feature bits each VMM filters its own way) are not; leaf 4
//! EAX[13:0], EBX, ECX, EDX (the host's cache geometry, passed through by
//! both) are compared as well, as they should agree. Also the static CPU
//! templates: both refuse each one at start on this host where its model
//! is not the template's (Firecracker's `InvalidCpuModel`).

mod common;

use std::collections::BTreeMap;
use std::path::PathBuf;

use common::peers::*;
use common::*;
use serde_json::{json, Value};

/// The leaves asked for.
const LEAVES: &str = "0x1,0x4.0,0x4.1,0x4.2,0x4.3,0x4.4,0xb.0,0xb.1,0xb.2,0x1f.0,0x1f.1,0x1f.2";

fn bins(test: &str) -> Option<PathBuf> {
    if !kvm_or_skip(test) {
        return None;
    }
    assert!(guest().is_file(), "no test guest at {}", guest().display());
    firecracker(test)
}

/// `leaf.sub` → [eax, ebx, ecx, edx] from the guest's `cpuid` lines.
fn leaves(lines: &[String]) -> BTreeMap<String, [u32; 4]> {
    let mut m = BTreeMap::new();
    for l in lines {
        let Some(rest) = l.strip_prefix("teravm guest: cpuid ") else {
            continue;
        };
        let mut words = rest.split(' ');
        let key = words.next().unwrap().to_string();
        let regs: Vec<u32> = words
            .map(|w| u32::from_str_radix(&w[4..], 16).unwrap())
            .collect();
        m.insert(key, [regs[0], regs[1], regs[2], regs[3]]);
    }
    m
}

/// The topology fields of `m` (see the module doc).
fn topology(m: &BTreeMap<String, [u32; 4]>) -> BTreeMap<String, [u32; 4]> {
    m.iter()
        .map(|(k, r)| {
            let r = match k.as_str() {
                "0x1.0x0" => [0, r[1], 0, r[3] & (1 << 28)],
                _ => *r,
            };
            (k.clone(), r)
        })
        .collect()
}

/// The guest's leaves on teravm with `machine` (vcpu_count, smt).
fn on_teravm(test: &str, machine: &Value) -> BTreeMap<String, [u32; 4]> {
    let dir = temp_dir(test);
    let mut mc = json!({"mem_size_mib": 256});
    for (k, v) in machine.as_object().unwrap() {
        mc[k] = v.clone();
    }
    let cfg = json!({
        "machine-config": mc,
        "boot-source": {"kernel_image_path": guest(),
                        "boot_args": format!("cpuid={LEAVES} then=reset")},
    });
    let path = config_file(&dir, &cfg.to_string());
    let (code, out, err) = run(&["--config-file", path.to_str().unwrap(), "--no-api"], T);
    assert_eq!(code, 0, "teravm {machine}: {out:?} {err}");
    leaves(&out)
}

/// The guest's leaves on Firecracker with `machine`.
fn on_firecracker(
    bin: &std::path::Path,
    test: &str,
    machine: &Value,
) -> BTreeMap<String, [u32; 4]> {
    let dir = temp_dir(&format!("{test}-fc"));
    let peer = Launch::new(
        Kind::Firecracker,
        bin,
        &dir,
        &format!("cpuid={LEAVES} then=reset"),
    )
    .machine(machine.clone())
    .start();
    let (code, out, err) = peer.wait();
    assert_eq!(code, 0, "Firecracker {machine}: {out:?} {err}");
    leaves(&out)
}

#[test]
fn smt_topology_agrees_with_firecracker() {
    let test = "cpu_topology_smt";
    let Some(fc) = bins(test) else { return };
    for machine in [
        json!({"vcpu_count": 1, "smt": false}),
        json!({"vcpu_count": 2, "smt": false}),
        json!({"vcpu_count": 2, "smt": true}),
        json!({"vcpu_count": 4, "smt": true}),
    ] {
        let ours = on_teravm(test, &machine);
        let theirs = on_firecracker(&fc, test, &machine);
        assert!(ours.contains_key("0xb.0x1"), "{machine}: {ours:?}");
        assert_eq!(
            ours.keys().collect::<Vec<_>>(),
            theirs.keys().collect::<Vec<_>>()
        );
        let (t_ours, t_theirs) = (topology(&ours), topology(&theirs));
        for (k, v) in &t_ours {
            assert_eq!(
                v, &t_theirs[k],
                "{machine}: leaf {k} differs: teravm {v:08x?} Firecracker {:08x?}",
                t_theirs[k]
            );
        }
        // What smt means, read as a guest reads it.
        let smt = machine["smt"] == true;
        let n = machine["vcpu_count"].as_u64().unwrap() as u32;
        let threads = if smt && n > 1 { 2 } else { 1 };
        assert_eq!(ours["0xb.0x0"][1] & 0xffff, threads, "{machine}");
        assert_eq!(ours["0xb.0x1"][1] & 0xffff, n, "{machine}");
        assert_eq!(
            (ours["0x4.0x0"][0] >> 26) + 1,
            n / threads,
            "{machine}: cores"
        );
        eprintln!("{machine}: {} leaves agree", t_ours.len());
    }
}

#[test]
fn static_templates_refused_where_firecracker_refuses_them() {
    let test = "cpu_topology_templates";
    let Some(fc) = bins(test) else { return };
    for template in ["C3", "T2", "T2S", "T2CL", "T2A"] {
        // teravm: taken in machine-config, refused at start with the reason.
        let dir = temp_dir(test);
        let cfg = json!({
            "machine-config": {"vcpu_count": 1, "mem_size_mib": 256, "cpu_template": template},
            "boot-source": {"kernel_image_path": guest(), "boot_args": "then=reset"},
        });
        let path = config_file(&dir, &cfg.to_string());
        let (code, out, err) = run(&["--config-file", path.to_str().unwrap(), "--no-api"], T);
        // Firecracker, the same config (its own shape), without the API.
        let fdir = temp_dir(&format!("{test}-fc"));
        let mut fcfg = Launch::new(Kind::Firecracker, &fc, &fdir, "then=reset")
            .machine(json!({"cpu_template": template}))
            .firecracker_config();
        fcfg["boot-source"]["boot_args"] = "then=reset".into();
        let fpath = fdir.join("fc.json");
        std::fs::write(&fpath, fcfg.to_string()).unwrap();
        let fc_run = std::process::Command::new(&fc)
            .args(["--no-api", "--config-file", fpath.to_str().unwrap()])
            .output()
            .unwrap();
        let fc_code = fc_run.status.code().unwrap_or(-1);
        let fc_err = String::from_utf8_lossy(&fc_run.stderr).into_owned()
            + &String::from_utf8_lossy(&fc_run.stdout);
        let fc_booted = fc_err.contains("teravm guest: reset");
        let booted = out.iter().any(|l| l.contains("teravm guest: reset"));
        eprintln!("{template}: teravm {code} {err:?}; Firecracker {fc_code} {fc_err:?}");
        assert_eq!(
            booted, fc_booted,
            "{template}: {err}\nFirecracker: {fc_err}"
        );
        if !booted {
            assert_ne!(code, 0);
            assert!(
                err.contains(&format!("cpu_template {template}")),
                "{template}: {err}"
            );
            assert_ne!(fc_code, 0, "{template}: Firecracker {fc_err}");
            assert!(
                fc_err.contains("GetCpuTemplate"),
                "{template}: Firecracker {fc_err}"
            );
        }
    }
}

#[test]
fn track_dirty_pages_boots_and_reclaims() {
    // The dirty log on every memslot (its bits are read in the KVM test
    // src/vstate/kvm_tests.rs); here: a microVM with it boots, touches its
    // memory, resets, and gives the memory back. Both guests.
    if !kvm_or_skip("track_dirty_pages_boots_and_reclaims") {
        return;
    }
    let dir = temp_dir("dirty");
    for kernel in [None, Some(guest())] {
        let mut cfg = json!({
            "machine-config": {"vcpu_count": 2, "mem_size_mib": 256, "track_dirty_pages": true},
            "boot-source": {"boot_args": "touch=64 then=reset"},
        });
        if let Some(k) = &kernel {
            cfg["boot-source"]["kernel_image_path"] = json!(k);
        }
        let path = config_file(&dir, &cfg.to_string());
        let (code, out, err) = run(&["--config-file", path.to_str().unwrap(), "--no-api"], T);
        assert_eq!(code, 0, "{kernel:?}: {err}");
        assert!(
            out.iter().any(|l| l.contains(": touched 64 MiB in ")),
            "{kernel:?}: {out:?}"
        );
        let (mib, _, _) = summary(&err);
        assert!(mib >= 58, "{kernel:?}: reclaimed only {mib} MiB: {err}");
    }
}
