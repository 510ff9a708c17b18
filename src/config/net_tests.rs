//! Unit tests of the network interface bodies and MAC addresses on raw JSON.
use super::*;

fn parse(text: &str) -> Result<NetConfig, String> {
    serde_json::from_str(text).map_err(|e| e.to_string())
}

fn net(id: &str, tap: &str, mac: Option<&str>) -> NetConfig {
    NetConfig {
        iface_id: id.into(),
        host_dev_name: tap.into(),
        guest_mac: mac.map(|m| m.parse().unwrap()),
        mtu: None,
        rx_rate_limiter: None,
        tx_rate_limiter: None,
    }
}

#[test]
fn mac_addresses() {
    let m: MacAddr = "AA:fc:00:00:00:01".parse().unwrap();
    assert_eq!(m.bytes(), [0xaa, 0xfc, 0, 0, 0, 1]);
    assert_eq!(m.to_string(), "aa:fc:00:00:00:01");
    assert_eq!(serde_json::to_string(&m).unwrap(), r#""aa:fc:00:00:00:01""#);
    assert_eq!(
        serde_json::from_str::<MacAddr>(r#""06:00:AC:10:00:02""#).unwrap(),
        MacAddr::from_bytes([6, 0, 0xac, 0x10, 0, 2]).unwrap()
    );
    for bad in [
        "",
        "aa:bb:cc:dd:ee",
        "aa:bb:cc:dd:ee:ff:00",
        "aa:bb:cc:dd:ee:f",
        "aa:bb:cc:dd:ee:fff",
        "aa-bb-cc-dd-ee-ff",
        "aa:bb:cc:dd:ee:gg",
        "aa:bb:cc:dd:ee:+f",
        "aa:bb:cc:dd:ee:ff:",
    ] {
        assert_eq!(
            bad.parse::<MacAddr>(),
            Err(MacAddrError::Syntax(bad.into())),
            "{bad}"
        );
    }
    let e = "01:00:5e:00:00:01".parse::<MacAddr>().unwrap_err();
    assert_eq!(
        e.to_string(),
        "01:00:5e:00:00:01 is a multicast address; a guest MAC must be unicast"
    );
    assert_eq!(
        "ff:ff:ff:ff:ff:ff".parse::<MacAddr>(),
        Err(MacAddrError::Multicast("ff:ff:ff:ff:ff:ff".into()))
    );
    assert_eq!(
        "00:00:00:00:00:00".parse::<MacAddr>(),
        Err(MacAddrError::Zero)
    );
    assert_eq!(MacAddr::from_bytes([0; 6]), Err(MacAddrError::Zero));
}

#[test]
fn firecracker_shape() {
    let c = parse(r#"{"iface_id": "eth0", "host_dev_name": "tap0"}"#).unwrap();
    assert_eq!(c, net("eth0", "tap0", None));
    c.validate().unwrap();
    let all = r#"{"iface_id": "eth0", "host_dev_name": "tap0", "guest_mac": "06:00:ac:10:00:02",
                  "mtu": 1500}"#;
    let c = parse(all).unwrap();
    c.validate().unwrap();
    assert_eq!(
        serde_json::to_value(&c).unwrap(),
        serde_json::from_str::<serde_json::Value>(all).unwrap()
    );
    let c = parse(
        r#"{"iface_id": "eth0", "host_dev_name": "tap0", "guest_mac": null,
            "rx_rate_limiter": null, "tx_rate_limiter": null}"#,
    )
    .unwrap();
    assert_eq!(c, net("eth0", "tap0", None));
    for (body, needle) in [
        (r#"{"host_dev_name": "tap0"}"#, "missing field `iface_id`"),
        (r#"{"iface_id": "eth0"}"#, "missing field `host_dev_name`"),
        (
            r#"{"iface_id": "eth0", "host_dev_name": "tap0", "allow_mmds_requests": true}"#,
            "unknown field `allow_mmds_requests`",
        ),
        (
            r#"{"iface_id": "eth0", "host_dev_name": 0}"#,
            "invalid type",
        ),
        (
            r#"{"iface_id": "eth0", "host_dev_name": "tap0", "guest_mac": "01:00:5e:00:00:01"}"#,
            "multicast",
        ),
        (
            r#"{"iface_id": "eth0", "host_dev_name": "tap0", "guest_mac": "aa:bb"}"#,
            "is not a MAC address",
        ),
        (
            r#"{"iface_id": "eth0", "host_dev_name": "tap0", "mtu": 65536}"#,
            "invalid value",
        ),
    ] {
        let e = parse(body).unwrap_err();
        assert!(e.contains(needle), "{body}: {e}");
    }
}

#[test]
fn validation_names_the_field_and_the_reason() {
    for (body, field) in [
        (
            r#"{"iface_id": "eth0", "host_dev_name": "tap0", "rx_rate_limiter": {"bandwidth": {"size": 1, "refill_time": 18446744073709551615}}}"#,
            "network-interfaces.rx_rate_limiter",
        ),
        (
            r#"{"iface_id": "eth0", "host_dev_name": "tap0",
                "tx_rate_limiter": {"ops": {"size": 1, "refill_time": 18446744073709551615}}}"#,
            "network-interfaces.tx_rate_limiter",
        ),
        (
            r#"{"iface_id": "eth 0", "host_dev_name": "tap0"}"#,
            "network-interfaces.iface_id",
        ),
        (
            r#"{"iface_id": "eth0", "host_dev_name": ""}"#,
            "network-interfaces.host_dev_name",
        ),
        (
            r#"{"iface_id": "eth0", "host_dev_name": "a-sixteen-bytes!"}"#,
            "network-interfaces.host_dev_name",
        ),
        (
            r#"{"iface_id": "eth0", "host_dev_name": "../tap"}"#,
            "network-interfaces.host_dev_name",
        ),
        (
            r#"{"iface_id": "eth0", "host_dev_name": "/dev/tap 5"}"#,
            "network-interfaces.host_dev_name",
        ),
        (
            r#"{"iface_id": "eth0", "host_dev_name": ".."}"#,
            "network-interfaces.host_dev_name",
        ),
        (
            r#"{"iface_id": "eth0", "host_dev_name": "tap 0"}"#,
            "network-interfaces.host_dev_name",
        ),
        (
            r#"{"iface_id": "eth0", "host_dev_name": "tap0", "mtu": 67}"#,
            "network-interfaces.mtu",
        ),
    ] {
        match parse(body).unwrap().validate() {
            Err(e @ ConfigError::InvalidField { .. }) => {
                let ConfigError::InvalidField { field: f, .. } = &e else {
                    unreachable!()
                };
                assert_eq!(*f, field, "{body}");
                assert!(!e.to_string().contains('\n'), "{e}");
            }
            other => panic!("{body}: {other:?}"),
        }
    }
    // Kata sends empty limiters on every interface: no limit, accepted.
    parse(r#"{"iface_id": "eth0", "host_dev_name": "tap0", "rx_rate_limiter": {}, "tx_rate_limiter": {"bandwidth": null}}"#)
        .unwrap()
        .validate()
        .unwrap();
    // Firecracker's limiters are taken, both directions, and kept as given.
    let n = parse(
        r#"{"iface_id": "eth0", "host_dev_name": "tap0",
            "rx_rate_limiter": {"bandwidth": {"size": 1000, "one_time_burst": 5, "refill_time": 100}},
            "tx_rate_limiter": {"ops": {"size": 10, "refill_time": 1000}}}"#,
    )
    .unwrap();
    n.validate().unwrap();
    let v = serde_json::to_value(&n).unwrap();
    assert_eq!(
        v["rx_rate_limiter"],
        serde_json::json!({"bandwidth": {"size": 1000, "one_time_burst": 5, "refill_time": 100}, "ops": null})
    );
    assert_eq!(v["tx_rate_limiter"]["ops"]["size"], 10);
    // A limiter with an unknown field is refused (Firecracker's shape).
    let e =
        parse(r#"{"iface_id": "eth0", "host_dev_name": "tap0", "rx_rate_limiter": {"bytes": {}}}"#)
            .unwrap_err();
    assert!(e.contains("unknown field `bytes`"), "{e}");
    parse(r#"{"iface_id": "eth0", "host_dev_name": "fifteen-bytes!!", "mtu": 68}"#)
        .unwrap()
        .validate()
        .unwrap();
}

#[test]
fn a_list_has_unique_ids_taps_and_macs() {
    check_nets(&[]).unwrap();
    let mac = Some("06:00:00:00:00:01");
    check_nets(&[
        net("eth0", "tap0", mac),
        net("eth1", "tap1", None),
        net("eth2", "tap2", None),
    ])
    .unwrap();
    for (list, want) in [
        (
            vec![net("eth0", "tap0", None), net("eth0", "tap1", None)],
            "invalid value for network-interfaces.iface_id: interface \"eth0\" is listed twice",
        ),
        (
            vec![net("eth0", "tap0", None), net("eth1", "tap0", None)],
            "invalid value for network-interfaces.host_dev_name: interfaces \"eth0\" and \
             \"eth1\" both use the TAP device \"tap0\"",
        ),
        (
            vec![net("eth0", "tap0", mac), net("eth1", "tap1", mac)],
            "invalid value for network-interfaces.guest_mac: interfaces \"eth0\" and \"eth1\" \
             both have the MAC address 06:00:00:00:00:01",
        ),
    ] {
        assert_eq!(check_nets(&list).unwrap_err().to_string(), want);
    }
}

#[test]
fn update_bodies() {
    // An all-null PATCH is a no-op, as Firecracker takes it.
    for body in [
        r#"{"iface_id": "eth0"}"#,
        r#"{"iface_id": "eth0", "rx_rate_limiter": null, "tx_rate_limiter": null}"#,
    ] {
        let u: NetUpdate = serde_json::from_str(body).unwrap();
        assert_eq!(
            u,
            NetUpdate {
                iface_id: "eth0".into(),
                rx_rate_limiter: None,
                tx_rate_limiter: None
            }
        );
        u.validate().unwrap();
    }
    for (body, needle) in [
        (r#"{}"#, "missing field `iface_id`"),
        (
            r#"{"iface_id": "eth0", "host_dev_name": "tap0"}"#,
            "unknown field `host_dev_name`",
        ),
        (r#"{"iface_id": 0}"#, "invalid type"),
    ] {
        let e = serde_json::from_str::<NetUpdate>(body)
            .unwrap_err()
            .to_string();
        assert!(e.contains(needle), "{body}: {e}");
    }
    for (body, field) in [
        (
            r#"{"iface_id": "eth0", "rx_rate_limiter": {"ops": {"size": 1, "refill_time": 18446744073709551615}}}"#,
            "network-interfaces.rx_rate_limiter",
        ),
        (
            r#"{"iface_id": "eth0", "tx_rate_limiter": {"ops": {"size": 1, "refill_time": 18446744073709551615}}}"#,
            "network-interfaces.tx_rate_limiter",
        ),
        (r#"{"iface_id": ""}"#, "network-interfaces.iface_id"),
    ] {
        let u: NetUpdate = serde_json::from_str(body).unwrap();
        match u.validate() {
            Err(ConfigError::InvalidField { field: f, .. }) => assert_eq!(f, field, "{body}"),
            other => panic!("{body}: {other:?}"),
        }
    }
}

#[test]
fn an_update_patches_the_limiters_bucket_by_bucket() {
    let n = parse(
        r#"{"iface_id": "eth0", "host_dev_name": "tap0",
            "rx_rate_limiter": {"bandwidth": {"size": 1000, "refill_time": 100}, "ops": {"size": 5, "refill_time": 100}}}"#,
    )
    .unwrap();
    let patch = |body: &str| {
        let u: NetUpdate = serde_json::from_str(body).unwrap();
        u.validate().unwrap();
        serde_json::to_value(u.applied_to(&n)).unwrap()
    };
    // Nothing named: nothing changes.
    let v = patch(r#"{"iface_id": "eth0"}"#);
    assert_eq!(v["rx_rate_limiter"]["ops"]["size"], 5);
    assert!(v.get("tx_rate_limiter").is_none(), "{v}");
    // One bucket replaced, the other kept; a new tx limiter.
    let v = patch(
        r#"{"iface_id": "eth0", "rx_rate_limiter": {"ops": {"size": 7, "refill_time": 50}},
            "tx_rate_limiter": {"bandwidth": {"size": 99, "refill_time": 10}}}"#,
    );
    assert_eq!(v["rx_rate_limiter"]["ops"]["size"], 7);
    assert_eq!(v["rx_rate_limiter"]["bandwidth"]["size"], 1000);
    assert_eq!(v["tx_rate_limiter"]["bandwidth"]["size"], 99);
    // A 0 size removes a bucket; with both gone there is no limiter.
    let v =
        patch(r#"{"iface_id": "eth0", "rx_rate_limiter": {"ops": {"size": 0, "refill_time": 0}}}"#);
    assert!(v["rx_rate_limiter"]["ops"].is_null(), "{v}");
    let v = patch(
        r#"{"iface_id": "eth0", "rx_rate_limiter": {"ops": {"size": 0, "refill_time": 0},
            "bandwidth": {"size": 0, "refill_time": 0}}}"#,
    );
    assert!(v.get("rx_rate_limiter").is_none(), "{v}");
}
