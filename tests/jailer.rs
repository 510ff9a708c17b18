//! teravm under Firecracker's own jailer, beside Firecracker under the same
//! jailer command (issue 37): the static teravm (scripts/build-static.sh)
//! and the real Firecracker are each started exactly as an orchestrator
//! starts Firecracker, chroot, uid/gid, this host's cgroup version with a
//! memory limit and a CPU quota, a network namespace with a tap, a file
//! limit, a new PID namespace, daemonized; the test guest is hard-linked
//! into the chroot and its log, metrics and console are FIFOs there. Both
//! must answer on the socket inside the chroot, run where they were put,
//! boot the guest (its frame crosses the tap), feel the CPU quota, stop
//! cleanly (teravm by SIGTERM as its PID namespace's init, Firecracker,
//! which has no SIGTERM handler, by Ctrl-Alt-Del) and leave the jail as
//! each other. A guest larger than the cgroup's limit is refused by
//! teravm's admission with a 400 (the VM's cgroup bind-mounted read-only
//! into the chroot, docs/fleet.md); Firecracker, which has no admission,
//! takes it.
//!
//! Needs root (the jailer mknods, mounts and moves cgroups), /dev/kvm and
//! Firecracker with its jailer; skipped with the reason elsewhere (a
//! failure in CI).

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::jail::{self, cgroup_file, setup, Jail, JailSpec, Setup};
use common::netns::{next_frame, packet_socket_on, Netns};

const T: Duration = Duration::from_secs(60);
const MIB: u64 = 1 << 20;

/// A namespace with a tap `tapj` that the jailed uid may attach to.
fn netns_with_tap(tag: &str) -> Netns {
    let ns = Netns::new(tag).expect("a network namespace with a tap");
    let ip = |args: &[&str]| {
        let ok = Command::new("ip")
            .args(["-n", &ns.name])
            .args(args)
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "ip -n {} {args:?}", ns.name);
    };
    let (uid, gid) = (jail::UID.to_string(), jail::GID.to_string());
    ip(&[
        "tuntap", "add", "dev", "tapj", "mode", "tap", "user", &uid, "group", &gid,
    ]);
    ip(&["link", "set", "tapj", "up"]);
    ns
}

/// The configuration an orchestrator sends, every answer kept.
fn configure(j: &Jail, mib: u64, boot_args: &str) -> Vec<(String, u16)> {
    let bodies = [
        (
            "/logger",
            r#"{"log_path": "/log.fifo", "level": "Info"}"#.to_string(),
        ),
        (
            "/metrics",
            r#"{"metrics_path": "/metrics.fifo"}"#.to_string(),
        ),
        (
            "/serial",
            r#"{"serial_out_path": "/serial.fifo"}"#.to_string(),
        ),
        (
            "/machine-config",
            format!(r#"{{"vcpu_count": 2, "mem_size_mib": {mib}}}"#),
        ),
        (
            "/boot-source",
            format!(r#"{{"kernel_image_path": "/guest", "boot_args": "{boot_args}"}}"#),
        ),
        (
            "/network-interfaces/eth0",
            r#"{"iface_id": "eth0", "host_dev_name": "tapj", "guest_mac": "06:00:ac:10:00:02"}"#
                .to_string(),
        ),
    ];
    bodies
        .iter()
        .map(|(path, body)| {
            let (s, b) = j.ask("PUT", path, Some(body));
            assert_eq!(s, 204, "{}: PUT {path} {body}: {b}", j.exec_name);
            (format!("PUT {path}"), s)
        })
        .collect()
}

/// What one VMM did in its jail.
struct Seen {
    answers: Vec<(String, u16)>,
    listing: BTreeSet<String>,
}

fn nr_throttled(j: &Jail, s: &Setup) -> u64 {
    cgroup_file(j, &s.cgroup.cpu_root, "cpu.stat")
        .lines()
        .find_map(|l| l.strip_prefix("nr_throttled "))
        .and_then(|v| v.trim().parse().ok())
        .expect("nr_throttled in cpu.stat")
}

/// One VMM through the whole jailed life.
fn jailed_run(s: &Setup, exec: &Path, teravm: bool) -> Seen {
    let ns = netns_with_tap(if teravm { "jail-tv" } else { "jail-fc" });
    let ns_path = PathBuf::from(format!("/var/run/netns/{}", ns.name));
    let guest = common::guest();
    let memory_limit = 512 * MIB;
    let j = Jail::start(&JailSpec {
        jailer: &s.jailer,
        exec,
        link: &[(&guest, "guest")],
        fifos: &["log.fifo", "metrics.fifo", "serial.fifo"],
        netns: Some(&ns_path),
        cgroup: &s.cgroup,
        // Half a CPU: the guest's touch of its memory must be throttled.
        limits: s.cgroup.limits(memory_limit, 50_000),
        cgroup_view: false,
        nofile: 512,
        args: &[],
        kata_go: false,
    });
    let who = j.exec_name.clone();

    // Where the jailer put it: its uid and gid, PID 1 of a new namespace,
    // the netns, the cgroup, the file limit, stdio on /dev/null.
    let uid = jail::UID.to_string();
    assert!(
        j.status_field("Uid:").split_whitespace().all(|u| u == uid),
        "{who}: Uid {}",
        j.status_field("Uid:")
    );
    let gid = jail::GID.to_string();
    assert!(
        j.status_field("Gid:").split_whitespace().all(|g| g == gid),
        "{who}: Gid {}",
        j.status_field("Gid:")
    );
    let nspid = j.status_field("NSpid:");
    assert_eq!(
        nspid.split_whitespace().last(),
        Some("1"),
        "{who}: NSpid {nspid}"
    );
    let netns_of = |p: &str| std::fs::read_link(p).unwrap();
    assert_eq!(
        netns_of(&format!("/proc/{}/ns/net", j.pid)),
        {
            use std::os::unix::fs::MetadataExt;
            PathBuf::from(format!(
                "net:[{}]",
                std::fs::metadata(&ns_path).unwrap().ino()
            ))
        },
        "{who}: not in the netns"
    );
    let cgroups = std::fs::read_to_string(format!("/proc/{}/cgroup", j.pid)).unwrap();
    assert!(
        cgroups.lines().any(|l| l.ends_with(&format!("/{}", j.id))
            && (s.cgroup.version == 2 || l.contains("memory"))),
        "{who}: not in its memory cgroup: {cgroups}"
    );
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", j.pid)).unwrap();
    let nofile = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap();
    assert_eq!(
        nofile.split_whitespace().nth(3),
        Some("512"),
        "{who}: {nofile}"
    );
    assert_eq!(
        std::fs::read_link(format!("/proc/{}/fd/1", j.pid)).unwrap(),
        Path::new("/dev/null"),
        "{who}: not daemonized"
    );
    let limit_text = cgroup_file(&j, &s.cgroup.memory_root, s.cgroup.memory_limit_file());
    assert_eq!(
        limit_text.trim(),
        memory_limit.to_string(),
        "{who}: the memory limit"
    );

    // Configure and boot; the guest dirties its memory, then says hello on
    // the tap and echoes.
    let tap = packet_socket_on(&ns, "tapj");
    let throttled_before = nr_throttled(&j, s);
    let mut answers = configure(&j, 256, "touch=all net=echo then=idle");
    let (st, body) = j.ask(
        "PUT",
        "/actions",
        Some(r#"{"action_type": "InstanceStart"}"#),
    );
    assert_eq!(st, 204, "{who}: InstanceStart: {body}");
    answers.push(("PUT /actions InstanceStart".into(), st));
    j.wait_line("serial.fifo", "teravm guest: touched", T);
    let frame = next_frame(&tap, T).unwrap_or_else(|| panic!("{who}: no frame on the tap"));
    assert!(
        String::from_utf8_lossy(&frame).contains("teravm guest net"),
        "{who}: the frame: {frame:?}"
    );
    // The memory is charged to its cgroup, the quota throttled it.
    let usage_file = if s.cgroup.version == 2 {
        "memory.current"
    } else {
        "memory.usage_in_bytes"
    };
    let usage: u64 = cgroup_file(&j, &s.cgroup.memory_root, usage_file)
        .trim()
        .parse()
        .unwrap();
    assert!(
        usage > 200 * MIB,
        "{who}: {usage_file} {usage}: the guest's memory is not charged there"
    );
    assert!(
        nr_throttled(&j, s) > throttled_before,
        "{who}: the CPU quota never throttled it"
    );
    let (st, metrics_body) = j.ask(
        "PUT",
        "/actions",
        Some(r#"{"action_type": "FlushMetrics"}"#),
    );
    assert_eq!(st, 204, "{who}: FlushMetrics: {metrics_body}");
    answers.push(("PUT /actions FlushMetrics".into(), st));
    j.wait_line("metrics.fifo", "utc_timestamp_ms", T);

    // The stop each one's users use.
    if teravm {
        j.signal(libc::SIGTERM);
    } else {
        let (st, body) = j.ask(
            "PUT",
            "/actions",
            Some(r#"{"action_type": "SendCtrlAltDel"}"#),
        );
        assert_eq!(st, 204, "{who}: SendCtrlAltDel: {body}");
    }
    assert!(j.exited_within(T), "{who}: still running after its stop");
    if teravm {
        // Its summary, in its log: the per-node reclaim and the topology
        // it found without /sys.
        let summary = j.wait_line("log.fifo", "teravm: reclaimed", T);
        assert!(summary.contains(" node"), "{summary}");
        // What it found without /sys and /proc: the nodes and CPUs from the
        // kernel, the same as the host's sysfs says, and no cgroup.
        let host = teravm::memory::numa::HostTopology::from_sysfs(Path::new("/sys")).unwrap();
        let nodes: Vec<String> = host
            .nodes
            .iter()
            .map(|n| format!("node {}: CPUs ", n.id))
            .collect();
        assert!(
            summary.contains(&format!("; topology: {} node", host.nodes.len()))
                && nodes.iter().all(|n| summary.contains(n))
                && summary.contains(") from the kernel (get_mempolicy, getcpu"),
            "{summary}"
        );
        assert!(
            summary.contains("; memory limit: no memory cgroup visible"),
            "{summary}"
        );
    }
    // The libraries put in for a dynamically linked Firecracker are the
    // test's, not the VMM's.
    let libs: Vec<String> = jail::shared_libraries(exec)
        .iter()
        .map(|l| l.to_string_lossy().trim_start_matches('/').to_string())
        .collect();
    let listing = j
        .listing()
        .into_iter()
        .filter(|e| {
            let path = e.split(' ').next().unwrap();
            !libs.iter().any(|l| l.starts_with(path))
        })
        .collect();
    Seen { answers, listing }
}

#[test]
fn jailed_teravm_runs_as_jailed_firecracker() {
    let test = "jailed_teravm_runs_as_jailed_firecracker";
    let Some(s) = setup(test) else { return };
    let _big = common::big_memory();
    let fc = jailed_run(&s, &s.firecracker, false);
    let tv = jailed_run(&s, &s.teravm, true);
    assert_eq!(fc.answers, tv.answers, "the answers differ");
    // The jail is left as Firecracker leaves it, but for the API socket,
    // which teravm removes when it exits and Firecracker leaves behind.
    let only_fc: Vec<&String> = fc.listing.difference(&tv.listing).collect();
    let only_tv: Vec<&String> = tv.listing.difference(&fc.listing).collect();
    assert!(
        only_tv.is_empty(),
        "teravm leaves what Firecracker does not: {only_tv:?}"
    );
    assert!(
        only_fc.len() == 1 && only_fc[0].starts_with("run/api.socket "),
        "Firecracker leaves {only_fc:?} that teravm does not"
    );
}

/// A guest larger than the cgroup's memory limit. teravm refuses a
/// populated one at InstanceStart with a 400 that names the cgroup (seen
/// through the bind mount: no /proc in the jail), stays up, and starts the
/// same guest sparse (`MAP_NORESERVE`, docs/memory.md "Admission") with a
/// warning naming the limit in its log. Firecracker, which has no
/// admission, starts it, and the guest's first touch of its memory ends it
/// by the cgroup's OOM killer.
#[test]
fn jailed_admission_refuses_a_guest_over_the_cgroup_limit() {
    let test = "jailed_admission_refuses_a_guest_over_the_cgroup_limit";
    let Some(s) = setup(test) else { return };
    let _big = common::big_memory();
    let guest = common::guest();
    for (exec, teravm) in [(&s.firecracker, false), (&s.teravm, true)] {
        let j = Jail::start(&JailSpec {
            jailer: &s.jailer,
            exec,
            link: &[(&guest, "guest")],
            fifos: &["log.fifo", "serial.fifo"],
            netns: None,
            cgroup: &s.cgroup,
            limits: s.cgroup.limits(256 * MIB, 100_000),
            cgroup_view: true,
            nofile: 512,
            args: &[],
            kata_go: false,
        });
        let who = j.exec_name.clone();
        let put = |path: &str, body: &str| {
            let (st, b) = j.ask("PUT", path, Some(body));
            assert_eq!(st, 204, "{who}: PUT {path}: {b}");
        };
        put("/logger", r#"{"log_path": "/log.fifo", "level": "Info"}"#);
        put("/serial", r#"{"serial_out_path": "/serial.fifo"}"#);
        put(
            "/machine-config",
            r#"{"vcpu_count": 1, "mem_size_mib": 1024}"#,
        );
        let start = || {
            j.ask(
                "PUT",
                "/actions",
                Some(r#"{"action_type": "InstanceStart"}"#),
            )
        };
        if teravm {
            put("/memory", r#"{"populate": true}"#);
            put(
                "/boot-source",
                r#"{"kernel_image_path": "/guest", "boot_args": "then=idle"}"#,
            );
            let (st, body) = start();
            common::api::assert_fault(st, &body, 400, "populating 1024 MiB");
            assert!(
                body.contains("/sys/fs/cgroup/memory (limit 256 MiB"),
                "{body}"
            );
            assert!(body.contains("no /proc/self/cgroup"), "{body}");
            assert!(j.alive(), "{who} died on the refusal");
            put("/memory", r#"{"populate": false}"#);
            let (st, body) = start();
            assert_eq!(st, 204, "{who}: the sparse guest: {body}");
            let warning = j.wait_line("log.fifo", "exceed the memory cgroup", T);
            assert!(warning.contains("(256 MiB)"), "{warning}");
            j.wait_line("serial.fifo", "teravm guest: idle", T);
            j.signal(libc::SIGTERM);
            assert!(j.exited_within(T), "{who}: still running after SIGTERM");
            j.wait_line("log.fifo", "teravm: reclaimed", T);
        } else {
            put(
                "/boot-source",
                r#"{"kernel_image_path": "/guest", "boot_args": "touch=all then=idle"}"#,
            );
            let (st, body) = start();
            assert_eq!(st, 204, "{who}: {body}");
            assert!(
                j.exited_within(T),
                "{who}: a guest touching 1 GiB under 256 MiB still runs"
            );
            let (file, key) = if s.cgroup.version == 2 {
                ("memory.events", "oom_kill ")
            } else {
                ("memory.oom_control", "oom_kill ")
            };
            let events = cgroup_file(&j, &s.cgroup.memory_root, file);
            let kills: u64 = events
                .lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            assert!(
                kills >= 1,
                "{who}: ended, but not by the OOM killer: {events}"
            );
        }
    }
}

/// Kata's Go runtime with `jailer_path` set (`fc.go` `fcInit`): the jailer
/// with `--uid 0 --gid 0 --chroot-base-dir --daemonize -- --config-file
/// /fcConfig.json` and no `--api-sock`; Kata then waits for
/// `<root>/run/firecracker.socket` (the VMM's default), polls `GET /` until
/// Running, reads `<root>/firecracker.pid` (the jailer names it after the
/// exec file: teravm is installed as `firecracker` for Kata,
/// docs/fleet.md) and ends the VM with SIGTERM (`fcEnd`). The same for
/// Firecracker and teravm.
#[test]
fn kata_jailed_mode_runs_teravm_installed_as_firecracker() {
    let test = "kata_jailed_mode_runs_teravm_installed_as_firecracker";
    let Some(s) = setup(test) else { return };
    let _big = common::big_memory();
    let dir = common::temp_dir("kata-jailed");
    // teravm as Kata's `path`, named as Kata's jailed mode needs it.
    let as_firecracker = dir.join("bin/firecracker");
    std::fs::create_dir_all(as_firecracker.parent().unwrap()).unwrap();
    std::fs::copy(&s.teravm, &as_firecracker).unwrap();
    let config = dir.join("fcConfig.json");
    std::fs::write(
        &config,
        r#"{"boot-source": {"kernel_image_path": "/guest", "boot_args": "touch=16 then=idle"},
            "machine-config": {"vcpu_count": 1, "mem_size_mib": 128, "smt": false},
            "logger": {"log_path": "/log.fifo", "level": "Error"},
            "metrics": {"metrics_path": "/metrics.fifo"},
            "drives": [], "network-interfaces": []}"#,
    )
    .unwrap();
    let guest = common::guest();
    for (exec, teravm) in [(&s.firecracker, false), (&as_firecracker, true)] {
        let j = Jail::start(&JailSpec {
            jailer: &s.jailer,
            exec,
            link: &[(&guest, "guest"), (&config, "fcConfig.json")],
            fifos: &["log.fifo", "metrics.fifo"],
            netns: None,
            cgroup: &s.cgroup,
            limits: Vec::new(),
            cgroup_view: false,
            nofile: 0,
            args: &["--config-file", "/fcConfig.json"],
            kata_go: true,
        });
        let who = if teravm { "teravm" } else { "firecracker" };
        assert_eq!(j.exec_name, "firecracker");
        // Kata's waitVMMRunning: GET / until Running.
        let deadline = std::time::Instant::now() + T;
        loop {
            let (st, body) = j.ask("GET", "/", None);
            assert_eq!(st, 200, "{who}: {body}");
            let v: serde_json::Value = serde_json::from_str(&body).unwrap();
            if v["state"] == "Running" {
                assert_eq!(v["id"], j.id.as_str(), "{who}: {body}");
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{who}: never Running: {body}"
            );
            std::thread::yield_now();
        }
        j.wait_line("metrics.fifo", "utc_timestamp_ms", T);
        // Kata's fcEnd: SIGTERM to the pid in <root>/firecracker.pid.
        let pid: i32 = std::fs::read_to_string(j.root.join("firecracker.pid"))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert_eq!(pid as u32, j.pid);
        assert_eq!(j.status_field("Uid:").split_whitespace().next(), Some("0"));
        j.signal(libc::SIGTERM);
        assert!(
            j.exited_within(T),
            "{who}: still running after Kata's SIGTERM"
        );
    }
}
