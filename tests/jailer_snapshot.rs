//! A snapshot moved between two jails of Firecracker's jailer, on
//! Firecracker and on teravm (issue 37, beside tests/jailer.rs): made by the
//! jailed uid inside one chroot, loaded in another through Firecracker's own
//! uffd handler, the guest verifying every page it wrote.

mod common;

use std::path::Path;
use std::time::Duration;

use common::jail::{self, setup, Jail, JailSpec};

const T: Duration = Duration::from_secs(60);
const MIB: u64 = 1 << 20;

/// A snapshot made in one jail and loaded in another, as a fleet moves a
/// VM: the files are written inside the chroot by the jailed uid, the
/// state file is hard-linked into the second jail, and Firecracker's own
/// uffd handler (on the host, its socket inside the chroot) serves the
/// memory. The userfaultfd comes from the jail's `/dev/userfaultfd`: an
/// unprivileged process gets none from `userfaultfd(2)` for KVM's faults.
/// The guest verifies every page it wrote after the load, on both.
#[test]
fn jailed_snapshot_moves_between_jails() {
    let test = "jailed_snapshot_moves_between_jails";
    let Some(s) = setup(test) else { return };
    let handler_bin = s.firecracker.with_file_name("uffd_on_demand_handler");
    if !handler_bin.exists() {
        common::skip(test, format!("no {}", handler_bin.display()));
        return;
    }
    let _big = common::big_memory();
    let guest = common::guest();
    let verify_ok = "teravm guest: verify 32 MiB ok";
    let mut answers: Vec<Vec<(String, u16)>> = Vec::new();
    for (exec, teravm) in [(&s.firecracker, false), (&s.teravm, true)] {
        let spec = |link: &'static [(&'static Path, &'static str)]| JailSpec {
            jailer: &s.jailer,
            exec,
            link,
            fifos: &["log.fifo", "serial.fifo"],
            netns: None,
            cgroup: &s.cgroup,
            limits: s.cgroup.limits(1024 * MIB, 100_000),
            cgroup_view: false,
            nofile: 512,
            args: &[],
            kata_go: false,
        };
        let guest: &'static Path = Box::leak(guest.clone().into_boxed_path());
        let guest_link: &'static [(&'static Path, &'static str)] =
            Box::leak(vec![(guest, "guest")].into_boxed_slice());
        let first = Jail::start(&spec(guest_link));
        let who = first.exec_name.clone();
        let mut seen = Vec::new();
        let mut ask = |j: &Jail, method: &str, path: &str, body: &str| {
            let (st, b) = j.ask(method, path, Some(body));
            assert!(st < 300, "{who}: {method} {path} {body}: {st} {b}");
            seen.push((format!("{method} {path}"), st));
        };
        ask(
            &first,
            "PUT",
            "/logger",
            r#"{"log_path": "/log.fifo", "level": "Info"}"#,
        );
        ask(
            &first,
            "PUT",
            "/serial",
            r#"{"serial_out_path": "/serial.fifo"}"#,
        );
        ask(
            &first,
            "PUT",
            "/machine-config",
            r#"{"vcpu_count": 1, "mem_size_mib": 256}"#,
        );
        ask(
            &first,
            "PUT",
            "/boot-source",
            r#"{"kernel_image_path": "/guest", "boot_args": "touch=32 verify-every=100"}"#,
        );
        ask(
            &first,
            "PUT",
            "/actions",
            r#"{"action_type": "InstanceStart"}"#,
        );
        first.wait_line("serial.fifo", verify_ok, T);
        ask(&first, "PATCH", "/vm", r#"{"state": "Paused"}"#);
        ask(
            &first,
            "PUT",
            "/snapshot/create",
            r#"{"snapshot_type": "Full", "snapshot_path": "/vm.state", "mem_file_path": "/vm.mem"}"#,
        );
        for f in ["vm.state", "vm.mem"] {
            use std::os::unix::fs::MetadataExt;
            let m = std::fs::metadata(first.root.join(f)).unwrap();
            assert_eq!(
                (m.uid(), m.gid()),
                (jail::UID, jail::GID),
                "{who}: {f}'s owner"
            );
        }
        // Paused, Firecracker takes no Ctrl-Alt-Del: an orchestrator kills it.
        first.signal(if teravm { libc::SIGTERM } else { libc::SIGKILL });
        assert!(
            first.exited_within(T),
            "{who}: the first jail's VMM still runs"
        );

        let state: &'static Path = Box::leak(first.root.join("vm.state").into_boxed_path());
        let links: &'static [(&'static Path, &'static str)] =
            Box::leak(vec![(state, "vm.state")].into_boxed_slice());
        let second = Jail::start(&spec(links));
        // Firecracker's handler, as root on the host, its socket inside the
        // chroot given to the jailed uid.
        let socket = second.root.join("uffd.sock");
        let mut handler =
            common::peers::uffd_handler(&handler_bin, &socket, &first.root.join("vm.mem"));
        jail::chown(&socket);
        ask(
            &second,
            "PUT",
            "/logger",
            r#"{"log_path": "/log.fifo", "level": "Info"}"#,
        );
        ask(
            &second,
            "PUT",
            "/serial",
            r#"{"serial_out_path": "/serial.fifo"}"#,
        );
        ask(
            &second,
            "PUT",
            "/snapshot/load",
            r#"{"snapshot_path": "/vm.state", "mem_backend": {"backend_type": "Uffd", "backend_path": "/uffd.sock"}, "resume_vm": true}"#,
        );
        second.wait_line("serial.fifo", verify_ok, T);
        second.signal(if teravm { libc::SIGTERM } else { libc::SIGKILL });
        assert!(
            second.exited_within(T),
            "{who}: the second jail's VMM still runs"
        );
        let _ = handler.kill();
        let _ = handler.wait();
        answers.push(seen);
    }
    assert_eq!(
        answers[0], answers[1],
        "Firecracker's answers, then teravm's"
    );
}
