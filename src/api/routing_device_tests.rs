//! Unit tests of the routing of Firecracker's drives, network interfaces
//! and vsock on raw JSON: the bodies, the id in the path, what teravm
//! refuses (rate limiters, `io_engine` Async, vhost-user), wrong methods.

use super::*;
use crate::config::{CacheType, IoEngine, MacAddr};

fn ok(method: &str, path: &str, body: &str) -> VmmAction {
    route(method, path, body.as_bytes()).unwrap_or_else(|e| panic!("{method} {path} {body}: {e}"))
}

/// The 400 message of a request, checked to be one line.
fn bad(method: &str, path: &str, body: &str) -> String {
    match route(method, path, body.as_bytes()) {
        Err(e) if e.status() == 400 => {
            let m = e.to_string();
            assert!(!m.contains(['\n', '\r']), "{m}");
            m
        }
        other => panic!("{method} {path} {body}: expected 400, got {other:?}"),
    }
}

fn check_bad(method: &str, path: &str, cases: &[(&str, &str)]) {
    for (body, needle) in cases {
        let m = bad(method, path, body);
        assert!(m.contains(needle), "{method} {path} {body}: {m}");
    }
}

#[test]
fn put_drive() {
    assert_eq!(
        ok(
            "PUT",
            "/drives/rootfs",
            r#"{"drive_id": "rootfs", "path_on_host": "/img/root.ext4", "is_root_device": true,
                "is_read_only": false}"#
        ),
        VmmAction::PutDrive(DriveConfig {
            drive_id: "rootfs".into(),
            path_on_host: "/img/root.ext4".into(),
            is_root_device: true,
            partuuid: None,
            is_read_only: false,
            cache_type: CacheType::Unsafe,
            io_engine: IoEngine::Sync,
            rate_limiter: None,
            socket: None,
        })
    );
    let VmmAction::PutDrive(c) = ok(
        "PUT",
        "/drives/data_1",
        r#"{"drive_id": "data_1", "path_on_host": "d.img", "is_root_device": false,
            "partuuid": "0eaa91a0-01", "is_read_only": true, "cache_type": "Writeback",
            "io_engine": "Sync", "rate_limiter": null}"#,
    ) else {
        panic!()
    };
    assert!(c.is_read_only && c.cache_type == CacheType::Writeback);
    let good = r#""drive_id": "rootfs", "path_on_host": "/img", "is_root_device": true"#;
    check_bad(
        "PUT",
        "/drives/rootfs",
        &[
            (
                &format!(r#"{{{good}, "is_readonly": true}}"#),
                "invalid drives body: unknown field `is_readonly`",
            ),
            (
                r#"{"drive_id": "rootfs", "path_on_host": "/img", "is_root_device": "yes"}"#,
                "invalid drives body: drives.is_root_device: invalid type",
            ),
            (
                r#"{"drive_id": "rootfs", "path_on_host": 7, "is_root_device": true}"#,
                "drives.path_on_host: invalid type",
            ),
            (
                r#"{"drive_id": "rootfs", "path_on_host": "/img"}"#,
                "missing field `is_root_device`",
            ),
            (
                r#"{"path_on_host": "/img", "is_root_device": true}"#,
                "missing field `drive_id`",
            ),
            (
                r#"{"drive_id": "rootfs", "is_root_device": true}"#,
                "invalid value for drives.path_on_host: is required",
            ),
            (
                &format!(r#"{{{good}, "io_engine": "Uring"}}"#),
                "drives.io_engine: unknown variant `Uring`",
            ),
            (
                &format!(r#"{{{good}, "rate_limiter": {{"bandwidth": {{"size": 1}}}}}}"#),
                "invalid drives body: missing field `refill_time`",
            ),
            (
                r#"{"drive_id": "rootfs", "is_root_device": true, "socket": "/run/vu.sock"}"#,
                "invalid value for drives.socket: vhost-user block devices are not supported",
            ),
            (
                &format!(r#"{{{good}, "cache_type": "Directsync"}}"#),
                "drives.cache_type: unknown variant",
            ),
            ("", "the drives request needs a JSON body"),
            ("[]", "invalid drives body: expected a JSON object"),
        ],
    );
}

#[test]
fn the_id_in_the_path_is_checked_and_must_be_the_bodys() {
    let body = r#"{"drive_id": "rootfs", "path_on_host": "/img", "is_root_device": true}"#;
    assert_eq!(
        route("PUT", "/drives/other", body.as_bytes()),
        Err(RouteError::BadId(
            "PUT /drives/other: the id in the path (\"other\") differs from drives.drive_id in \
             the body (\"rootfs\")"
                .into()
        ))
    );
    assert_eq!(
        route("PUT", "/drives/other", body.as_bytes())
            .unwrap_err()
            .status(),
        400
    );
    let m = bad("PATCH", "/drives/other", r#"{"drive_id": "rootfs"}"#);
    assert!(m.contains("differs from drives.drive_id"), "{m}");
    let m = bad(
        "PUT",
        "/network-interfaces/eth1",
        r#"{"iface_id": "eth0", "host_dev_name": "tap0"}"#,
    );
    assert!(
        m.contains("differs from network-interfaces.iface_id"),
        "{m}"
    );
    let m = bad(
        "PATCH",
        "/network-interfaces/eth1",
        r#"{"iface_id": "eth0"}"#,
    );
    assert!(
        m.contains("differs from network-interfaces.iface_id"),
        "{m}"
    );
    for (method, path) in [
        ("PUT", "/drives"),
        ("PUT", "/drives/"),
        ("PATCH", "/drives"),
        ("PUT", "/network-interfaces/"),
        ("PATCH", "/network-interfaces"),
    ] {
        let m = bad(method, path, body);
        assert!(
            m.contains("the path needs the device's id"),
            "{method} {path}: {m}"
        );
    }
    for path in ["/drives/root.fs", "/drives/r%20", "/drives/é"] {
        let m = bad("PUT", path, body);
        assert!(
            m.contains("the id in the path is not valid") && m.contains("underscores"),
            "{path}: {m}"
        );
    }
    let long = format!("/drives/{}", "x".repeat(65));
    assert!(bad("PUT", &long, body).contains("is not valid"));
    // Deeper paths are no resource.
    for path in [
        "/drives/a/b",
        "/network-interfaces/eth0/x",
        "/vsock/x",
        "/drivesx",
    ] {
        assert_eq!(
            route("PUT", path, body.as_bytes()),
            Err(RouteError::NotFound(path.into())),
            "{path}"
        );
    }
}

#[test]
fn patch_drive() {
    assert_eq!(
        ok(
            "PATCH",
            "/drives/rootfs",
            r#"{"drive_id": "rootfs", "path_on_host": "/new.img"}"#
        ),
        VmmAction::PatchDrive(DriveUpdate {
            drive_id: "rootfs".into(),
            path_on_host: Some("/new.img".into()),
            rate_limiter: None,
        })
    );
    // Only the id: a no-op, as in Firecracker.
    assert_eq!(
        ok("PATCH", "/drives/rootfs", r#"{"drive_id": "rootfs"}"#),
        VmmAction::PatchDrive(DriveUpdate {
            drive_id: "rootfs".into(),
            path_on_host: None,
            rate_limiter: None,
        })
    );
    check_bad(
        "PATCH",
        "/drives/rootfs",
        &[
            (
                r#"{"drive_id": "rootfs", "is_read_only": false}"#,
                "unknown field `is_read_only`",
            ),
            (
                r#"{"drive_id": "rootfs", "path_on_host": true}"#,
                "drives.path_on_host: invalid type",
            ),
            (r#"{"path_on_host": "/x"}"#, "missing field `drive_id`"),
            (
                r#"{"drive_id": "rootfs", "rate_limiter": {"ops": {"size": 5, "refill_time": 18446744073709551615}}}"#,
                "invalid value for drives.rate_limiter: refill_time 18446744073709551615 ms is too large",
            ),
            (
                r#"{"drive_id": "rootfs", "path_on_host": ""}"#,
                "invalid value for drives.path_on_host",
            ),
            ("", "needs a JSON body"),
        ],
    );
}

#[test]
fn patch_drive_is_only_for_a_started_microvm() {
    // Firecracker refuses every PATCH /drives before InstanceStart
    // (OperationNotSupportedPreBoot), a body of only a rate limiter for a
    // drive that is there too: the action says so, for the VMM to answer.
    for body in [
        r#"{"drive_id": "data", "rate_limiter": {"bandwidth": {"size": 1048576, "refill_time": 100}}}"#,
        r#"{"drive_id": "data", "path_on_host": "/new.img"}"#,
        r#"{"drive_id": "data"}"#,
    ] {
        let a = ok("PATCH", "/drives/data", body);
        assert!(matches!(a, VmmAction::PatchDrive(_)), "{body}: {a:?}");
        assert_eq!(a.only_once_started(), Some("PATCH /drives"), "{body}");
    }
    // PUT /drives is a before-the-start resource.
    let put = ok(
        "PUT",
        "/drives/data",
        r#"{"drive_id": "data", "path_on_host": "/d.img", "is_root_device": false, "is_read_only": false}"#,
    );
    assert_eq!(put.only_once_started(), None);
}

#[test]
fn put_network_interface() {
    assert_eq!(
        ok(
            "PUT",
            "/network-interfaces/eth0",
            r#"{"iface_id": "eth0", "host_dev_name": "tap0", "guest_mac": "AA:FC:00:00:00:01"}"#
        ),
        VmmAction::PutNetworkInterface(NetConfig {
            iface_id: "eth0".into(),
            host_dev_name: "tap0".into(),
            guest_mac: Some("aa:fc:00:00:00:01".parse::<MacAddr>().unwrap()),
            mtu: None,
            rx_rate_limiter: None,
            tx_rate_limiter: None,
        })
    );
    let good = r#""iface_id": "eth0", "host_dev_name": "tap0""#;
    check_bad(
        "PUT",
        "/network-interfaces/eth0",
        &[
            (
                &format!(r#"{{{good}, "allow_mmds_requests": true}}"#),
                "invalid network-interfaces body: unknown field `allow_mmds_requests`",
            ),
            (
                r#"{"iface_id": "eth0", "host_dev_name": ["tap0"]}"#,
                "network-interfaces.host_dev_name: invalid type",
            ),
            (r#"{"iface_id": "eth0"}"#, "missing field `host_dev_name`"),
            (
                &format!(r#"{{{good}, "guest_mac": "01:00:5e:00:00:01"}}"#),
                "network-interfaces.guest_mac: 01:00:5e:00:00:01 is a multicast address",
            ),
            (
                &format!(r#"{{{good}, "guest_mac": "aa:fc:00:00:00"}}"#),
                "network-interfaces.guest_mac: \"aa:fc:00:00:00\" is not a MAC address",
            ),
            (
                &format!(
                    r#"{{{good}, "rx_rate_limiter": {{"bandwidth": {{"size": 1, "refill_time": 18446744073709551615}}}}}}"#
                ),
                "invalid value for network-interfaces.rx_rate_limiter: refill_time \
                 18446744073709551615 ms is too large",
            ),
            (
                &format!(
                    r#"{{{good}, "tx_rate_limiter": {{"ops": {{"size": 1, "refill_time": 18446744073709551615}}}}}}"#
                ),
                "invalid value for network-interfaces.tx_rate_limiter",
            ),
            (
                r#"{"iface_id": "eth0", "host_dev_name": "a-very-long-tap-name"}"#,
                "invalid value for network-interfaces.host_dev_name",
            ),
            (
                &format!(r#"{{{good}, "mtu": 10}}"#),
                "invalid value for network-interfaces.mtu",
            ),
            ("", "the network-interfaces request needs a JSON body"),
        ],
    );
}

#[test]
fn patch_network_interface() {
    let noop = VmmAction::PatchNetworkInterface(NetUpdate {
        iface_id: "eth0".into(),
        rx_rate_limiter: None,
        tx_rate_limiter: None,
    });
    assert_eq!(
        ok(
            "PATCH",
            "/network-interfaces/eth0",
            r#"{"iface_id": "eth0"}"#
        ),
        noop
    );
    assert_eq!(
        ok(
            "PATCH",
            "/network-interfaces/eth0",
            r#"{"iface_id": "eth0", "rx_rate_limiter": null, "tx_rate_limiter": null}"#
        ),
        noop
    );
    check_bad(
        "PATCH",
        "/network-interfaces/eth0",
        &[
            (
                r#"{"iface_id": "eth0", "host_dev_name": "tap1"}"#,
                "unknown field `host_dev_name`",
            ),
            (
                r#"{"iface_id": 0}"#,
                "network-interfaces.iface_id: invalid type",
            ),
            ("{}", "missing field `iface_id`"),
            (
                r#"{"iface_id": "eth0", "rx_rate_limiter": {"ops": {"size": 1, "refill_time": 18446744073709551615}}}"#,
                "invalid value for network-interfaces.rx_rate_limiter: refill_time \
                 18446744073709551615 ms is too large",
            ),
            (
                r#"{"iface_id": "eth0", "tx_rate_limiter": {"ops": {"size": 1, "refill_time": 18446744073709551615}}}"#,
                "invalid value for network-interfaces.tx_rate_limiter",
            ),
        ],
    );
}

#[test]
fn patch_network_interface_is_only_for_a_started_microvm() {
    // Firecracker's `UpdateNetworkInterface` is among the actions it
    // refuses before InstanceStart (OperationNotSupportedPreBoot), whatever
    // the body: a no-op, and limiters for an interface that is there.
    for body in [
        r#"{"iface_id": "eth0"}"#,
        r#"{"iface_id": "eth0", "rx_rate_limiter": {"bandwidth": {"size": 1048576, "refill_time": 100}}}"#,
        r#"{"iface_id": "eth0", "tx_rate_limiter": {"ops": {"size": 10, "refill_time": 1000}}}"#,
    ] {
        let a = ok("PATCH", "/network-interfaces/eth0", body);
        assert!(
            matches!(a, VmmAction::PatchNetworkInterface(_)),
            "{body}: {a:?}"
        );
        assert_eq!(
            a.only_once_started(),
            Some("PATCH /network-interfaces"),
            "{body}"
        );
    }
    // PUT /network-interfaces is a before-the-start resource.
    let put = ok(
        "PUT",
        "/network-interfaces/eth0",
        r#"{"iface_id": "eth0", "host_dev_name": "tap0"}"#,
    );
    assert_eq!(put.only_once_started(), None);
}

#[test]
fn put_vsock() {
    assert_eq!(
        ok(
            "PUT",
            "/vsock",
            r#"{"guest_cid": 3, "uds_path": "/tmp/v.sock"}"#
        ),
        VmmAction::PutVsock(VsockConfig {
            guest_cid: 3,
            uds_path: "/tmp/v.sock".into(),
            vsock_id: None,
        })
    );
    // firecracker-containerd's: go-sdk sends 0 for a vsock without a CID.
    assert_eq!(
        ok(
            "PUT",
            "/vsock",
            r#"{"guest_cid":0,"uds_path":"firecracker.vsock","vsock_id":"agent_api"}"#
        ),
        VmmAction::PutVsock(VsockConfig {
            guest_cid: 0,
            uds_path: "firecracker.vsock".into(),
            vsock_id: Some("agent_api".into()),
        })
    );
    // Firecracker's deprecated vsock_id is taken.
    assert_eq!(
        ok(
            "PUT",
            "/vsock",
            r#"{"vsock_id": "vsock0", "guest_cid": 52, "uds_path": "v.sock"}"#
        ),
        VmmAction::PutVsock(VsockConfig {
            guest_cid: 52,
            uds_path: "v.sock".into(),
            vsock_id: Some("vsock0".into()),
        })
    );
    check_bad(
        "PUT",
        "/vsock",
        &[
            (
                r#"{"guest_cid": 2, "uds_path": "v.sock"}"#,
                "invalid value for vsock.guest_cid: 2 is not a guest CID",
            ),
            (
                r#"{"guest_cid": 1, "uds_path": "v.sock"}"#,
                "invalid value for vsock.guest_cid",
            ),
            (
                r#"{"guest_cid": -3, "uds_path": "v.sock"}"#,
                "vsock.guest_cid: invalid value",
            ),
            (
                r#"{"guest_cid": "3", "uds_path": "v.sock"}"#,
                "vsock.guest_cid: invalid type",
            ),
            (r#"{"guest_cid": 3}"#, "missing field `uds_path`"),
            (
                r#"{"guest_cid": 3, "uds_path": "v", "port": 1}"#,
                "unknown field `port`",
            ),
            (
                r#"{"guest_cid": 3, "uds_path": ""}"#,
                "invalid value for vsock.uds_path",
            ),
            ("", "the vsock request needs a JSON body"),
            ("[3, \"v\"]", "expected a JSON object"),
        ],
    );
}

#[test]
fn wrong_methods() {
    for (method, path, allowed) in [
        ("GET", "/drives/rootfs", "PUT, PATCH"),
        ("DELETE", "/drives/rootfs", "PUT, PATCH"),
        ("GET", "/drives", "PUT, PATCH"),
        ("GET", "/network-interfaces/eth0", "PUT, PATCH"),
        ("DELETE", "/network-interfaces/eth0", "PUT, PATCH"),
        ("GET", "/vsock", "PUT"),
        ("PATCH", "/vsock", "PUT"),
        ("DELETE", "/vsock", "PUT"),
    ] {
        match route(method, path, b"{}") {
            Err(e @ RouteError::MethodNotAllowed { allow, .. }) => {
                assert_eq!(allow, allowed, "{method} {path}");
                assert_eq!(e.status(), 405);
            }
            other => panic!("{method} {path}: {other:?}"),
        }
    }
}

#[test]
fn actions_name_their_request() {
    let drive = DriveConfig {
        drive_id: "a".into(),
        path_on_host: "a".into(),
        is_root_device: false,
        partuuid: None,
        is_read_only: false,
        cache_type: CacheType::Unsafe,
        io_engine: IoEngine::Sync,
        rate_limiter: None,
        socket: None,
    };
    let net = NetConfig {
        iface_id: "eth0".into(),
        host_dev_name: "tap0".into(),
        guest_mac: None,
        mtu: None,
        rx_rate_limiter: None,
        tx_rate_limiter: None,
    };
    for (action, want) in [
        (VmmAction::PutDrive(drive), ("PUT", "/drives")),
        (
            VmmAction::PatchDrive(DriveUpdate {
                drive_id: "a".into(),
                path_on_host: None,
                rate_limiter: None,
            }),
            ("PATCH", "/drives"),
        ),
        (
            VmmAction::PutNetworkInterface(net),
            ("PUT", "/network-interfaces"),
        ),
        (
            VmmAction::PatchNetworkInterface(NetUpdate {
                iface_id: "eth0".into(),
                rx_rate_limiter: None,
                tx_rate_limiter: None,
            }),
            ("PATCH", "/network-interfaces"),
        ),
        (
            VmmAction::PutVsock(VsockConfig {
                guest_cid: 3,
                uds_path: "v".into(),
                vsock_id: None,
            }),
            ("PUT", "/vsock"),
        ),
    ] {
        assert_eq!(action.method_and_path(), want, "{action:?}");
    }
}

#[test]
fn requests_and_failures_are_counted_per_resource() {
    let body = br#"{"guest_cid": 2, "uds_path": "v"}"#;
    let (r0, f0) = crate::metrics::counts("PUT", "/vsock");
    let _ = route("PUT", "/vsock", body);
    let (r1, f1) = crate::metrics::counts("PUT", "/vsock");
    assert!(r1 > r0 && f1 > f0);
    let (r0, _) = crate::metrics::counts("PATCH", "/network-interfaces");
    let _ = route(
        "PATCH",
        "/network-interfaces/eth0",
        br#"{"iface_id": "eth0"}"#,
    );
    let (r1, _) = crate::metrics::counts("PATCH", "/network-interfaces");
    assert!(r1 > r0);
}

#[test]
fn a_bad_mac_is_named_once_wherever_it_is() {
    for body in [
        r#"{"guest_mac": "01:00:5e:00:00:01", "iface_id": "eth0", "host_dev_name": "tap0"}"#,
        r#"{"iface_id": "eth0", "guest_mac": "01:00:5e:00:00:01",
            "host_dev_name": "tap0"}"#,
    ] {
        let m = bad("PUT", "/network-interfaces/eth0", body);
        assert_eq!(m.matches("network-interfaces.guest_mac").count(), 1, "{m}");
        assert!(m.contains("multicast"), "{m}");
    }
}
