//! Unit tests of the drive bodies on raw JSON.
use super::*;

fn parse(text: &str) -> Result<DriveConfig, String> {
    serde_json::from_str(text).map_err(|e| e.to_string())
}

fn drive(id: &str, root: bool) -> DriveConfig {
    parse(&format!(
        r#"{{"drive_id": "{id}", "path_on_host": "/img/{id}", "is_root_device": {root}}}"#
    ))
    .unwrap()
}

#[test]
fn firecracker_shape() {
    let c =
        parse(r#"{"drive_id": "rootfs", "path_on_host": "/img", "is_root_device": true}"#).unwrap();
    assert_eq!(
        c,
        DriveConfig {
            drive_id: "rootfs".into(),
            path_on_host: "/img".into(),
            is_root_device: true,
            partuuid: None,
            is_read_only: false,
            cache_type: CacheType::Unsafe,
            io_engine: IoEngine::Sync,
            rate_limiter: None,
            socket: None,
        }
    );
    c.validate().unwrap();
    // Every field, as firecracker-go-sdk sends them; shown as written.
    let all = r#"{"drive_id": "data_1", "path_on_host": "d.img", "is_root_device": false,
                  "partuuid": "0eaa91a0-01", "is_read_only": true, "cache_type": "Writeback",
                  "io_engine": "Sync"}"#;
    let c = parse(all).unwrap();
    c.validate().unwrap();
    assert_eq!(
        serde_json::to_value(&c).unwrap(),
        serde_json::from_str::<serde_json::Value>(all).unwrap()
    );
    // Firecracker's Option fields take null.
    let c = parse(
        r#"{"drive_id": "a", "path_on_host": "a", "is_root_device": false, "is_read_only": null,
            "io_engine": null, "rate_limiter": null, "socket": null, "partuuid": null}"#,
    )
    .unwrap();
    assert!(!c.is_read_only && c.io_engine == IoEngine::Sync && c.rate_limiter.is_none());
    c.validate().unwrap();
    // io_engine Async: taken, echoed, handed to the device.
    let a = r#"{"drive_id": "a", "path_on_host": "a", "is_root_device": false,
                "io_engine": "Async"}"#;
    let c = parse(a).unwrap();
    c.validate().unwrap();
    assert_eq!(serde_json::to_value(&c).unwrap()["io_engine"], "Async");
    assert_eq!(
        BlockOptions::from(&c).io_engine,
        crate::devices::virtio::block::IoEngine::Async
    );
    for (body, needle) in [
        (
            r#"{"path_on_host": "a", "is_root_device": true}"#,
            "missing field `drive_id`",
        ),
        (
            r#"{"drive_id": "a", "path_on_host": "a"}"#,
            "missing field `is_root_device`",
        ),
        (
            r#"{"drive_id": "a", "path_on_host": "a", "is_root_device": true, "direct": 1}"#,
            "unknown field `direct`",
        ),
        (
            r#"{"drive_id": 1, "path_on_host": "a", "is_root_device": true}"#,
            "invalid type",
        ),
        (
            r#"{"drive_id": "a", "path_on_host": "a", "is_root_device": true, "cache_type": "None"}"#,
            "unknown variant `None`",
        ),
        (
            r#"{"drive_id": "a", "path_on_host": "a", "is_root_device": true, "io_engine": "sync"}"#,
            "unknown variant `sync`",
        ),
        (
            r#"{"drive_id": "a", "path_on_host": "a", "is_root_device": true, "cache_type": null}"#,
            "expected value",
        ),
    ] {
        let e = parse(body).unwrap_err();
        assert!(e.contains(needle), "{body}: {e}");
    }
}

#[test]
fn validation_names_the_field_and_the_reason() {
    let base = r#""drive_id": "rootfs", "path_on_host": "/img", "is_root_device": true"#;
    for (extra, want) in [
        (
            r#", "rate_limiter": {"bandwidth": {"size": 1, "refill_time": 18446744073709551615}}"#,
            "invalid value for drives.rate_limiter: refill_time 18446744073709551615 ms is too \
             large",
        ),
        (
            r#", "socket": "/run/vhost.sock""#,
            "invalid value for drives.socket: vhost-user block devices are not supported by \
             teravm",
        ),
        (
            r#", "partuuid": "x; init=/bin/sh""#,
            "invalid value for drives.partuuid",
        ),
        (r#", "partuuid": """#, "invalid value for drives.partuuid"),
    ] {
        let c = parse(&format!("{{{base}{extra}}}")).unwrap();
        let e = c.validate().unwrap_err().to_string();
        assert!(e.starts_with(want) && !e.contains('\n'), "{extra}: {e}");
    }
    for (body, field) in [
        (
            r#"{"drive_id": "a", "is_root_device": true}"#,
            "drives.path_on_host",
        ),
        (
            r#"{"drive_id": "a", "path_on_host": "", "is_root_device": true}"#,
            "drives.path_on_host",
        ),
        (
            r#"{"drive_id": "a", "path_on_host": "a\u0000b", "is_root_device": true}"#,
            "drives.path_on_host",
        ),
        (
            r#"{"drive_id": "", "path_on_host": "a", "is_root_device": true}"#,
            "drives.drive_id",
        ),
        (
            r#"{"drive_id": "a-b", "path_on_host": "a", "is_root_device": true}"#,
            "drives.drive_id",
        ),
        (
            r#"{"drive_id": "é", "path_on_host": "a", "is_root_device": true}"#,
            "drives.drive_id",
        ),
    ] {
        match parse(body).unwrap().validate() {
            Err(ConfigError::InvalidField { field: f, .. }) => assert_eq!(f, field, "{body}"),
            other => panic!("{body}: {other:?}"),
        }
    }
    let mut c = drive("a", false);
    c.drive_id = "x".repeat(64);
    c.validate().unwrap();
    c.drive_id.push('x');
    assert!(c.validate().is_err());
    // A vhost-user body says vhost-user, not a missing path.
    let c = parse(r#"{"drive_id": "a", "is_root_device": true, "socket": "/s"}"#).unwrap();
    let e = c.validate().unwrap_err().to_string();
    assert!(e.contains("vhost-user"), "{e}");
}

#[test]
fn a_list_has_unique_ids_and_one_root() {
    check_drives(&[]).unwrap();
    check_drives(&[
        drive("rootfs", true),
        drive("data", false),
        drive("logs", false),
    ])
    .unwrap();
    let e = check_drives(&[
        drive("rootfs", true),
        drive("data", false),
        drive("other", true),
    ])
    .unwrap_err()
    .to_string();
    assert_eq!(
        e,
        "invalid value for drives.is_root_device: drives \"rootfs\" and \"other\" are both \
         root devices; at most one drive is"
    );
    let e = check_drives(&[drive("a", false), drive("a", false)])
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "invalid value for drives.drive_id: drive \"a\" is listed twice"
    );
}

#[test]
fn update_bodies() {
    let u: DriveUpdate = serde_json::from_str(r#"{"drive_id": "rootfs"}"#).unwrap();
    assert_eq!(
        u,
        DriveUpdate {
            drive_id: "rootfs".into(),
            path_on_host: None,
            rate_limiter: None
        }
    );
    u.validate().unwrap();
    let u: DriveUpdate = serde_json::from_str(
        r#"{"drive_id": "rootfs", "path_on_host": "/new", "rate_limiter": null}"#,
    )
    .unwrap();
    u.validate().unwrap();
    assert_eq!(
        serde_json::to_value(&u).unwrap(),
        serde_json::json!({"drive_id": "rootfs", "path_on_host": "/new"})
    );
    for (body, needle) in [
        (r#"{"path_on_host": "/new"}"#, "missing field `drive_id`"),
        (
            r#"{"drive_id": "a", "is_read_only": true}"#,
            "unknown field `is_read_only`",
        ),
        (r#"{"drive_id": "a", "path_on_host": true}"#, "invalid type"),
    ] {
        let e = serde_json::from_str::<DriveUpdate>(body)
            .unwrap_err()
            .to_string();
        assert!(e.contains(needle), "{body}: {e}");
    }
    for (body, field) in [
        (
            r#"{"drive_id": "a", "rate_limiter": {"ops": {"size": 1, "refill_time": 18446744073709551615}}}"#,
            "drives.rate_limiter",
        ),
        (
            r#"{"drive_id": "a", "path_on_host": ""}"#,
            "drives.path_on_host",
        ),
        (r#"{"drive_id": "a/b"}"#, "drives.drive_id"),
    ] {
        let u: DriveUpdate = serde_json::from_str(body).unwrap();
        match u.validate() {
            Err(ConfigError::InvalidField { field: f, .. }) => assert_eq!(f, field, "{body}"),
            other => panic!("{body}: {other:?}"),
        }
    }
}

#[test]
fn options_from_config() {
    let mut c = drive("rootfs", true);
    c.is_read_only = true;
    c.cache_type = CacheType::Writeback;
    assert_eq!(
        BlockOptions::from(&c),
        BlockOptions {
            drive_id: "rootfs".into(),
            read_only: true,
            cache_type: block::CacheType::Writeback,
            rate_limiter: Default::default(),
            io_engine: block::IoEngine::Sync,
        }
    );
    c.rate_limiter = serde_json::from_str(r#"{"ops": {"size": 5, "refill_time": 100}}"#).unwrap();
    assert_eq!(BlockOptions::from(&c).rate_limiter, c.rate_limiter.unwrap());
    assert_eq!(
        block::CacheType::from(CacheType::default()),
        block::CacheType::default()
    );
}

#[test]
fn rate_limiters_are_taken_and_shown_as_they_limit() {
    let base = r#""drive_id": "rootfs", "path_on_host": "/img", "is_root_device": true"#;
    let c: DriveConfig = serde_json::from_str(&format!(
        r#"{{{base}, "rate_limiter": {{"bandwidth": {{"size": 1048576, "one_time_burst": 4096,
            "refill_time": 1000}}, "ops": {{"size": 0, "refill_time": 100}}}}}}"#
    ))
    .unwrap();
    c.validate().unwrap();
    // The ops bucket limits nothing: not shown.
    assert_eq!(
        serde_json::to_value(&c).unwrap()["rate_limiter"],
        serde_json::json!({"bandwidth": {"size": 1048576, "one_time_burst": 4096,
            "refill_time": 1000}, "ops": null})
    );
    // `{}` and null buckets are no limit, and not shown.
    for body in [r#"{}"#, r#"{"bandwidth": null, "ops": null}"#, "null"] {
        let c: DriveConfig =
            serde_json::from_str(&format!(r#"{{{base}, "rate_limiter": {body}}}"#)).unwrap();
        c.validate().unwrap();
        assert!(
            serde_json::to_value(&c)
                .unwrap()
                .get("rate_limiter")
                .is_none(),
            "{body}"
        );
    }
    for (body, needle) in [
        (
            r#"{"bandwidth": {"size": 1}}"#,
            "missing field `refill_time`",
        ),
        (
            r#"{"iops": {"size": 1, "refill_time": 1}}"#,
            "unknown field `iops`",
        ),
        (
            r#"{"ops": {"size": -1, "refill_time": 1}}"#,
            "invalid value",
        ),
    ] {
        let e =
            serde_json::from_str::<DriveConfig>(&format!(r#"{{{base}, "rate_limiter": {body}}}"#))
                .unwrap_err()
                .to_string();
        assert!(e.contains(needle), "{body}: {e}");
    }
}
