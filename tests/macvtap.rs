//! A macvtap interface as flintlock names one (`host_dev_name`
//! `/dev/tap<ifindex>`), on the real binary and /dev/kvm with the default
//! flags: in a network namespace, a macvtap in bridge mode on a dummy
//! device, its node made with `mknod` (no udev here); the test guest sends
//! frames and they leave through the dummy.
//!
//! Where the host kernel has no macvtap (`ip link add ... type macvtap`
//! fails: this project's CI hosts have no modules), the test says so and
//! returns, in CI too: it is a property of the host's kernel, not of
//! teravm. What runs everywhere: the refusals in tests/devices.rs
//! (`a_missing_tap_or_a_path_that_is_no_macvtap_is_a_400_naming_it`) and
//! the sysfs checks in `devices::virtio::net::macvtap`.

mod common;

use std::process::Command;

use common::api::*;
use common::netns::{next_frame, packet_socket_on, start_on, Netns};
use common::*;

/// `ip -n NS args...` succeeded.
fn ip(ns: &Netns, args: &[&str]) -> bool {
    Command::new("ip")
        .args(["-n", &ns.name])
        .args(args)
        .status()
        .is_ok_and(|s| s.success())
}

/// A file of the namespace's own sysfs (`ip netns exec` mounts one).
fn ns_sysfs(ns: &Netns, path: &str) -> Option<String> {
    let out = ns.command("cat").arg(path).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

#[test]
fn a_macvtap_node_by_path_carries_the_guests_frames() {
    const TEST: &str = "macvtap_by_path";
    if !kvm_or_skip(TEST) {
        return;
    }
    let Some(ns) = Netns::new("mvtap") else {
        skip(TEST, "cannot make a network namespace (ip, root)");
        return;
    };
    let made = ip(&ns, &["link", "add", "d0", "type", "dummy"])
        && ip(&ns, &["link", "set", "d0", "up"])
        && ip(
            &ns,
            &[
                "link", "add", "link", "d0", "name", "mvt0", "type", "macvtap", "mode", "bridge",
            ],
        )
        && ip(&ns, &["link", "set", "mvt0", "up"]);
    if !made {
        not_possible(
            TEST,
            "this host's kernel has no macvtap (ip link add type macvtap failed)",
        );
        return;
    }
    let index = ns_sysfs(&ns, "/sys/class/net/mvt0/ifindex").expect("mvt0's ifindex");
    let numbers = ns_sysfs(&ns, &format!("/sys/class/net/mvt0/macvtap/tap{index}/dev"))
        .expect("the macvtap node's numbers");
    let (major, minor) = numbers.split_once(':').expect("M:m");
    let dir = temp_dir("macvtap");
    let node = dir.join(format!("tap{index}"));
    let ok = Command::new("mknod")
        .arg(&node)
        .args(["c", major, minor])
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "mknod {} c {major} {minor}", node.display());

    let fd = packet_socket_on(&ns, "d0");
    let (mut vmm, sock) = start_on(
        &ns,
        &dir,
        node.to_str().unwrap(),
        r#", "guest_mac": "06:00:ac:10:00:02""#,
        "net-send=3x1000 then=idle",
    );
    let frame = next_frame(&fd, T).expect("a guest frame out of the dummy");
    assert_eq!(frame[6..12], [6, 0, 0xac, 0x10, 0, 2], "{frame:02x?}");
    vmm.wait_line("teravm guest: net sent 3 frames of 1000 bytes", T);
    shutdown_ok(vmm, &sock);
}
