//! The list of cases of the API walk ([`super`]): every endpoint and
//! method, each with a valid body and invalid ones, and the host-path
//! fields with hostile paths.

use serde_json::{json, Value};

use super::{elf_head, req, Expect, Phase, Walk};

/// The same body with the first field's value replaced by `[]` (a string
/// for a body without fields).
fn wrong_type(valid: &str) -> String {
    let mut v: Value = serde_json::from_str(valid).unwrap();
    let map = v.as_object_mut().unwrap();
    let Some(key) = map.keys().next().cloned() else {
        return r#""a string""#.into();
    };
    // An array where one is due (cpu-config's lists) takes a string.
    let wrong = if map[&key].is_array() {
        json!("a string")
    } else {
        json!([])
    };
    map.insert(key, wrong);
    v.to_string()
}

/// The same body with an unknown field added.
fn unknown_field(valid: &str) -> String {
    let mut v: Value = serde_json::from_str(valid).unwrap();
    v.as_object_mut()
        .unwrap()
        .insert("no_such_field".into(), json!(1));
    v.to_string()
}

pub const BAD_JSON: &str = "{ not json }";

/// The generic cases of a resource that takes a body: valid, bad JSON,
/// unknown field, wrong type, `out_of_range` (if any), empty body, not an
/// object.
pub fn body_cases(
    w: &mut Walk,
    method: &str,
    path: &str,
    valid: &str,
    out_of_range: &[(&str, &str)],
) {
    let ep = format!("{method} {path}");
    let e = ep.as_str();
    w.case(req(e, "valid", method, path, Some(valid)));
    let refused = |case: &str, body: &str| {
        let mut r = req(e, case, method, path, Some(body));
        r.expect = Expect::Refused;
        r
    };
    w.case(refused("bad JSON", BAD_JSON));
    w.case(refused("unknown field", &unknown_field(valid)));
    w.case(refused("wrong type", &wrong_type(valid)));
    // The extra cases: those named "out of range ...", "unknown ...",
    // "missing ..." or "bad ..." are malformed; the others are variants
    // whose answer the table pins.
    for (case, body) in out_of_range {
        let malformed = ["out of range", "unknown ", "missing ", "bad "];
        if malformed.iter().any(|m| case.starts_with(m)) {
            w.case(refused(case, body));
        } else {
            w.case(req(e, case, method, path, Some(body)));
        }
    }
    w.case(refused("empty body", ""));
    w.case(refused("not an object ([])", "[]"));
}

/// A GET resource: valid, with a body, and a wrong method.
pub fn get_cases(w: &mut Walk, path: &str, wrong: &str) {
    let ep = format!("GET {path}");
    w.case(req(&ep, "valid", "GET", path, None));
    w.case(req(&ep, "with a body", "GET", path, Some("{}")));
    let ep = format!("{wrong} {path}");
    let mut r = req(&ep, "wrong method", wrong, path, Some("{}"));
    r.expect = Expect::Refused;
    w.case(r);
}

/// A resource: method, path, a valid body, out-of-range bodies.
type Unsupported<'a> = (&'a str, &'a str, String, Vec<(&'a str, String)>);

/// Firecracker's drives, network interfaces and vsock: checked by the API
/// thread, then put by the VMM (which opens the file, the TAP device or
/// the socket, and answers 400 when it cannot).
fn device_cases(w: &mut Walk) {
    let d = w.dir.display().to_string();
    let drive = r#"{"drive_id": "rootfs", "path_on_host": "/dev/null", "is_root_device": true, "is_read_only": false}"#;
    let bodies: Vec<Unsupported> = vec![
        (
            "PUT",
            "/drives/rootfs",
            drive.to_string(),
            vec![
                (
                    "id differs from the path's",
                    drive.replace("\"rootfs\"", "\"other\""),
                ),
                (
                    "io_engine Async",
                    drive.replace('}', r#", "io_engine": "Async"}"#),
                ),
                (
                    "rate_limiter",
                    drive.replace(
                        '}',
                        r#", "rate_limiter": {"bandwidth": {"size": 1, "refill_time": 100}}}"#,
                    ),
                ),
            ],
        ),
        (
            "PATCH",
            "/drives/rootfs",
            r#"{"drive_id": "rootfs", "path_on_host": "/dev/null"}"#.into(),
            vec![],
        ),
        (
            "PUT",
            "/network-interfaces/eth0",
            r#"{"iface_id": "eth0", "host_dev_name": "tap0"}"#.into(),
            vec![(
                "multicast guest_mac",
                r#"{"iface_id": "eth0", "host_dev_name": "tap0", "guest_mac": "01:00:5e:00:00:01"}"#
                    .into(),
            )],
        ),
        (
            "PATCH",
            "/network-interfaces/eth0",
            r#"{"iface_id": "eth0"}"#.into(),
            vec![],
        ),
        (
            "PUT",
            "/vsock",
            format!(r#"{{"guest_cid": 3, "uds_path": "{d}/v.sock"}}"#),
            vec![
                (
                    "out of range (guest_cid 1)",
                    format!(r#"{{"guest_cid": 1, "uds_path": "{d}/v.sock"}}"#),
                ),
                (
                    "guest_cid 0 (firecracker-containerd's: go-sdk without a CID)",
                    format!(r#"{{"guest_cid": 0, "uds_path": "{d}/v0.sock"}}"#),
                ),
                (
                    "guest_cid 2",
                    format!(r#"{{"guest_cid": 2, "uds_path": "{d}/v2.sock"}}"#),
                ),
                (
                    "valid again (after guest_cid 2)",
                    format!(r#"{{"guest_cid": 3, "uds_path": "{d}/v3.sock"}}"#),
                ),
            ],
        ),
    ];
    for (method, path, valid, oor) in &bodies {
        let oor: Vec<(&str, &str)> = oor.iter().map(|(c, b)| (*c, b.as_str())).collect();
        body_cases(w, method, path, valid, &oor);
    }
    // A drive both take (a regular file, not /dev/null), then a PATCH of
    // that drive with only a rate limiter: before the start Firecracker
    // refuses every PATCH /drives (OperationNotSupportedPreBoot); after it
    // the limiter of the attached drive changes.
    let data = w.dir.join("data.img");
    if !data.exists() {
        std::fs::write(&data, vec![0u8; 1 << 20]).unwrap();
    }
    w.case(req(
        "PUT /drives/data",
        "valid (a regular file)",
        "PUT",
        "/drives/data",
        Some(&format!(
            r#"{{"drive_id": "data", "path_on_host": "{}", "is_root_device": false, "is_read_only": false}}"#,
            data.display()
        )),
    ));
    w.case(req(
        "PATCH /drives/data",
        "only rate_limiter (a drive that is there)",
        "PATCH",
        "/drives/data",
        Some(r#"{"drive_id": "data", "rate_limiter": {"bandwidth": {"size": 1048576, "refill_time": 100}}}"#),
    ));
    // The MMDS's contents are any JSON (an unknown field, another type, an
    // array are metadata too, as in Firecracker): only non-JSON is refused.
    for (method, valid) in [
        ("PUT", r#"{"latest": {"x": 1}}"#),
        ("PATCH", r#"{"latest": {"x": 2}}"#),
    ] {
        let ep = format!("{method} /mmds");
        w.case(req(&ep, "valid", method, "/mmds", Some(valid)));
        w.case(req(&ep, "an array", method, "/mmds", Some("[]")));
        for (case, body) in [("bad JSON", BAD_JSON), ("empty body", "")] {
            let mut r = req(&ep, case, method, "/mmds", Some(body));
            r.expect = Expect::Refused;
            w.case(r);
        }
    }
    for path in ["/drives/rootfs", "/network-interfaces/eth0", "/vsock"] {
        let ep = format!("DELETE {path}");
        w.case(req(&ep, "wrong method", "DELETE", path, None));
    }
    // Host paths: the VMM opens them (or makes the socket).
    w.path_cases(
        "PUT /drives/rootfs",
        "PUT",
        "/drives/rootfs",
        "path_on_host",
        |p| {
            format!(
                r#"{{"drive_id": "rootfs", "path_on_host": {p}, "is_root_device": true, "is_read_only": false}}"#
            )
        },
    );
    w.path_cases("PUT /vsock", "PUT", "/vsock", "uds_path", |p| {
        format!(r#"{{"guest_cid": 3, "uds_path": {p}}}"#)
    });
}

/// `PUT /snapshot/create` and `PUT /snapshot/load` in the states the walk
/// has (configured, not started; started and running): every body is
/// refused, by its parse or by the state (a create before the start or
/// while running; a load once configured or started), so no snapshot is
/// written nor loaded. Firecracker's load of a body that parses, on a
/// process where nothing configured the boot, would try the files and
/// end the process: the walk's processes are all configured.
fn snapshot_cases(w: &mut Walk) {
    let d = w.dir.display().to_string();
    let create = format!(r#"{{"snapshot_path": "{d}/snap", "mem_file_path": "{d}/mem"}}"#);
    body_cases(
        w,
        "PUT",
        "/snapshot/create",
        &create,
        &[
            (
                "snapshot_type Diff",
                &create.replace('{', r#"{"snapshot_type": "Diff", "#),
            ),
            (
                "unknown snapshot_type",
                &create.replace('{', r#"{"snapshot_type": "Half", "#),
            ),
            (
                "missing mem_file_path",
                &format!(r#"{{"snapshot_path": "{d}/snap"}}"#),
            ),
        ],
    );
    let snap = format!(r#""snapshot_path": "{d}/snap""#);
    let file = format!(r#""mem_backend": {{"backend_path": "{d}/mem", "backend_type": "File"}}"#);
    let uffd =
        format!(r#""mem_backend": {{"backend_path": "{d}/uffd.sock", "backend_type": "Uffd"}}"#);
    let old = format!(r#""mem_file_path": "{d}/mem""#);
    let with = |extra: &str| format!("{{{snap}, {file}, {extra}}}");
    body_cases(
        w,
        "PUT",
        "/snapshot/load",
        &format!("{{{snap}, {file}}}"),
        &[
            (
                "bad: both mem_file_path and mem_backend",
                &format!("{{{snap}, {old}, {file}}}"),
            ),
            (
                "missing mem_backend and mem_file_path",
                &format!("{{{snap}}}"),
            ),
            ("missing snapshot_path", &format!("{{{file}}}")),
            (
                "unknown field in mem_backend",
                &format!(
                    r#"{{{snap}, "mem_backend": {{"backend_path": "{d}/mem", "backend_type": "File", "x": 1}}}}"#
                ),
            ),
            (
                "unknown backend_type",
                &format!(
                    r#"{{{snap}, "mem_backend": {{"backend_path": "{d}/mem", "backend_type": "Disk"}}}}"#
                ),
            ),
            ("unknown huge_pages 1M", &with(r#""huge_pages": "1M""#)),
            ("mem_file_path (deprecated)", &format!("{{{snap}, {old}}}")),
            (
                "enable_diff_snapshots (deprecated)",
                &with(r#""enable_diff_snapshots": true"#),
            ),
            ("Uffd backend", &format!("{{{snap}, {uffd}}}")),
            (
                "network_overrides with an unknown field",
                &with(
                    r#""network_overrides": [{"iface_id": "eth0", "host_dev_name": "tap1", "x": 1}]"#,
                ),
            ),
            (
                "vsock_override",
                &with(&format!(
                    r#""vsock_override": {{"uds_path": "{d}/v9.sock"}}"#
                )),
            ),
            ("huge_pages 2M", &with(r#""huge_pages": "2M""#)),
            ("clock_realtime true", &with(r#""clock_realtime": true"#)),
            ("memory_load Eager", &with(r#""memory_load": "Eager""#)),
            (
                "memory_load Eager with Uffd",
                &format!(r#"{{{snap}, {uffd}, "memory_load": "Eager"}}"#),
            ),
        ],
    );
    for path in ["/snapshot/create", "/snapshot/load"] {
        for (method, body) in [("GET", None), ("PATCH", Some("{}")), ("DELETE", None)] {
            let ep = format!("{method} {path}");
            let mut r = req(&ep, "wrong method", method, path, body);
            r.expect = Expect::Refused;
            w.case(r);
        }
    }
    let mut r = req(
        "PUT /snapshot",
        "missing operation",
        "PUT",
        "/snapshot",
        Some(&create),
    );
    r.expect = Expect::Refused;
    w.case(r);
    let mut r = req(
        "PUT /snapshot/restore",
        "not a resource",
        "PUT",
        "/snapshot/restore",
        Some(&create),
    );
    r.expect = Expect::Refused;
    w.case(r);
}

/// Firecracker's resources for features teravm lacks.
fn unsupported_cases(w: &mut Walk) {
    let d = w.dir.display().to_string();
    let bodies: Vec<Unsupported> = vec![
        (
            "PUT",
            "/mmds/config",
            r#"{"network_interfaces": ["eth0"], "version": "V2"}"#.into(),
            vec![],
        ),
        (
            "PUT",
            "/cpu-config",
            r#"{"cpuid_modifiers": [], "msr_modifiers": []}"#.into(),
            vec![],
        ),
        (
            "PUT",
            "/entropy",
            r#"{"rate_limiter": {"bandwidth": {"size": 1, "refill_time": 100}}}"#.into(),
            vec![],
        ),
        ("PATCH", "/vm", r#"{"state": "Paused"}"#.into(), vec![]),
        (
            "PUT",
            "/serial",
            format!(r#"{{"serial_out_path": "{d}/serial.out"}}"#),
            vec![],
        ),
    ];
    for (method, path, valid, oor) in &bodies {
        let oor: Vec<(&str, &str)> = oor.iter().map(|(c, b)| (*c, b.as_str())).collect();
        body_cases(w, method, path, valid, &oor);
    }
    // Running again (after start the valid `Paused` above paused it), so
    // the cases after it meet a running VM.
    w.case(req(
        "PATCH /vm",
        "Resumed",
        "PATCH",
        "/vm",
        Some(r#"{"state": "Resumed"}"#),
    ));
    w.case(req("GET /mmds", "valid", "GET", "/mmds", None));
    for path in ["/mmds", "/cpu-config", "/entropy", "/vm", "/serial"] {
        let ep = format!("DELETE {path}");
        w.case(req(&ep, "wrong method", "DELETE", path, None));
    }
}

/// The cases of one phase, except the actions that end the VM.
pub fn walk_phase(w: &mut Walk) {
    let d = w.dir.display().to_string();
    let elf = format!("{d}/vmlinux-head");

    // GET-only resources.
    get_cases(w, "/", "PUT");
    get_cases(w, "/version", "PUT");
    get_cases(w, "/vm/config", "PUT");
    w.case(req("GET /vm", "not a resource", "GET", "/vm", None));
    w.case(req(
        "GET /nowhere",
        "not a resource",
        "GET",
        "/nowhere",
        None,
    ));

    // machine-config.
    get_cases(w, "/machine-config", "DELETE");
    body_cases(
        w,
        "PUT",
        "/machine-config",
        r#"{"vcpu_count": 1, "mem_size_mib": 128, "huge_pages": "None"}"#,
        &[
            (
                "out of range (vcpu_count 0)",
                r#"{"vcpu_count": 0, "mem_size_mib": 128}"#,
            ),
            (
                "out of range (vcpu_count 300, over u8)",
                r#"{"vcpu_count": 300, "mem_size_mib": 128}"#,
            ),
            (
                "out of range (mem_size_mib 1)",
                r#"{"vcpu_count": 1, "mem_size_mib": 1}"#,
            ),
            (
                "out of range (mem_size_mib u64::MAX)",
                r#"{"vcpu_count": 1, "mem_size_mib": 18446744073709551615}"#,
            ),
            (
                "1G huge pages on 129 MiB",
                r#"{"vcpu_count": 1, "mem_size_mib": 129, "huge_pages": "1G"}"#,
            ),
            (
                "smt true",
                r#"{"vcpu_count": 1, "mem_size_mib": 128, "smt": true}"#,
            ),
            (
                "smt with an odd vcpu_count",
                r#"{"vcpu_count": 3, "mem_size_mib": 128, "smt": true}"#,
            ),
            // Issue 26's table: what Firecracker's clients send.
            (
                "smt true, vcpu_count 2",
                r#"{"vcpu_count": 2, "mem_size_mib": 128, "smt": true}"#,
            ),
            (
                "vcpu_count 33",
                r#"{"vcpu_count": 33, "mem_size_mib": 128}"#,
            ),
            (
                "cpu_template T2",
                r#"{"vcpu_count": 1, "mem_size_mib": 128, "cpu_template": "T2"}"#,
            ),
            (
                "track_dirty_pages true",
                r#"{"vcpu_count": 1, "mem_size_mib": 128, "track_dirty_pages": true}"#,
            ),
            (
                "valid again (after the variants)",
                r#"{"vcpu_count": 1, "mem_size_mib": 128, "huge_pages": "None"}"#,
            ),
            ("missing mem_size_mib", r#"{"vcpu_count": 1}"#),
        ],
    );
    body_cases(
        w,
        "PATCH",
        "/machine-config",
        r#"{"vcpu_count": 1}"#,
        &[
            ("out of range (mem_size_mib 0)", r#"{"mem_size_mib": 0}"#),
            ("empty patch {}", "{}"),
            ("huge_pages 1G on 128 MiB", r#"{"huge_pages": "1G"}"#),
        ],
    );

    // boot-source, then its host paths (a valid kernel for the initrd's).
    std::fs::write(&elf, elf_head()).unwrap();
    body_cases(
        w,
        "PUT",
        "/boot-source",
        r#"{"boot_args": "then=idle"}"#,
        &[
            (
                "boot_args over 2048 bytes",
                &format!(r#"{{"boot_args": "{}"}}"#, "a".repeat(2100)),
            ),
            ("boot_args with \\u0007", r#"{"boot_args": "a\u0007b"}"#),
            (
                "initrd without a kernel",
                &format!(r#"{{"initrd_path": "{d}/real.txt"}}"#),
            ),
            (
                "kernel_image_path: an x86-64 ELF head",
                &format!(r#"{{"kernel_image_path": "{elf}"}}"#),
            ),
            (
                "kernel_image_path: a text file",
                &format!(r#"{{"kernel_image_path": "{d}/real.txt"}}"#),
            ),
        ],
    );
    w.case(req(
        "GET /boot-source",
        "wrong method",
        "GET",
        "/boot-source",
        None,
    ));
    let p = "/boot-source";
    w.path_cases("PUT /boot-source", "PUT", p, "kernel_image_path", |p| {
        format!(r#"{{"kernel_image_path": {p}}}"#)
    });
    w.path_cases("PUT /boot-source", "PUT", p, "initrd_path", |p| {
        format!(r#"{{"kernel_image_path": "{elf}", "initrd_path": {p}}}"#)
    });
    // Back to the target's boot source for the start.
    let (label, body) = (w.target.boot_label.clone(), w.target.boot_source.clone());
    w.case(req("PUT /boot-source", &label, "PUT", p, Some(&body)));

    // logger.
    let log = format!("{d}/teravm.log");
    body_cases(
        w,
        "PUT",
        "/logger",
        &format!(r#"{{"log_path": "{log}", "level": "Info", "show_level": true}}"#),
        &[
            ("level only", r#"{"level": "Debug"}"#),
            ("unknown level", r#"{"level": "Loud"}"#),
            ("bad module", r#"{"module": "a b"}"#),
        ],
    );
    w.case(req("GET /logger", "wrong method", "GET", "/logger", None));
    w.path_cases("PUT /logger", "PUT", "/logger", "log_path", |p| {
        format!(r#"{{"log_path": {p}}}"#)
    });
    w.case(req(
        "PUT /logger",
        "valid (back to the log file)",
        "PUT",
        "/logger",
        Some(&format!(r#"{{"log_path": "{log}"}}"#)),
    ));

    // metrics: once per process, so each path case runs in a fresh one.
    let metrics = format!(r#"{{"metrics_path": "{d}/metrics-{:?}.json"}}"#, w.phase);
    let metrics_valid = metrics.clone();
    w.case(req(
        "PUT /actions",
        "FlushMetrics (no metrics path)",
        "PUT",
        "/actions",
        Some(r#"{"action_type": "FlushMetrics"}"#),
    ));
    for (case, body) in [
        ("bad JSON", BAD_JSON.to_string()),
        ("unknown field", unknown_field(&metrics)),
        ("wrong type", wrong_type(&metrics)),
        ("missing metrics_path", "{}".to_string()),
        ("empty body", String::new()),
        ("not an object ([])", "[]".to_string()),
    ] {
        w.case(req("PUT /metrics", case, "PUT", "/metrics", Some(&body)));
    }
    w.case(req("GET /metrics", "wrong method", "GET", "/metrics", None));
    for (label, lit) in w.hostile_paths() {
        w.fresh(|w| {
            let mut r = req(
                "PUT /metrics",
                &format!("metrics_path: {label}"),
                "PUT",
                "/metrics",
                Some(&format!(r#"{{"metrics_path": {lit}}}"#)),
            );
            r.probe = true;
            w.case_noting_created(r);
            // A flush to whatever it opened must not hang or fail either.
            let mut r = req(
                "PUT /actions",
                &format!("FlushMetrics to metrics_path: {label}"),
                "PUT",
                "/actions",
                Some(r#"{"action_type": "FlushMetrics"}"#),
            );
            r.probe = true;
            w.case(r);
        });
    }
    w.case(req(
        "PUT /metrics",
        "valid",
        "PUT",
        "/metrics",
        Some(&metrics_valid),
    ));
    w.case(req(
        "PUT /metrics",
        "a second time",
        "PUT",
        "/metrics",
        Some(&metrics_valid),
    ));

    // actions that leave the VM as it is.
    let a = "/actions";
    let ep = "PUT /actions";
    w.case(req(
        ep,
        "FlushMetrics",
        "PUT",
        a,
        Some(r#"{"action_type": "FlushMetrics"}"#),
    ));
    for (case, body) in [
        ("bad JSON", BAD_JSON),
        (
            "unknown field",
            r#"{"action_type": "FlushMetrics", "no_such_field": 1}"#,
        ),
        ("wrong type", r#"{"action_type": 5}"#),
        ("unknown action_type", r#"{"action_type": "Reboot"}"#),
        (
            "reclaim with FlushMetrics",
            r#"{"action_type": "FlushMetrics", "reclaim": "sync"}"#,
        ),
        (
            "Shutdown with reclaim \"later\"",
            r#"{"action_type": "Shutdown", "reclaim": "later"}"#,
        ),
        ("missing action_type", "{}"),
        ("empty body", ""),
        ("not an object ([])", "[]"),
    ] {
        w.case(req(ep, case, "PUT", a, Some(body)));
    }
    w.case(req("GET /actions", "wrong method", "GET", a, None));
    if w.phase == Phase::Before {
        for (case, body) in [
            ("SendCtrlAltDel", r#"{"action_type": "SendCtrlAltDel"}"#),
            (
                "Shutdown sync",
                r#"{"action_type": "Shutdown", "reclaim": "sync"}"#,
            ),
            (
                "Shutdown async",
                r#"{"action_type": "Shutdown", "reclaim": "async"}"#,
            ),
        ] {
            w.case(req(ep, case, "PUT", a, Some(body)));
        }
    } else {
        w.case(req(
            ep,
            "InstanceStart",
            "PUT",
            a,
            Some(r#"{"action_type": "InstanceStart"}"#),
        ));
    }

    // teravm's own resources.
    get_cases(w, "/memory", "PATCH");
    body_cases(
        w,
        "PUT",
        "/memory",
        r#"{"backing": "anonymous", "numa_policy": "none", "populate": false}"#,
        &[
            ("unknown backing", r#"{"backing": "floppy"}"#),
            (
                "out of range (host_nodes [5000])",
                r#"{"host_nodes": [5000]}"#,
            ),
            ("host_nodes []", r#"{"host_nodes": []}"#),
            ("host_nodes [0, 0]", r#"{"host_nodes": [0, 0]}"#),
            (
                "host_nodes [7] (not on this host)",
                r#"{"host_nodes": [7]}"#,
            ),
        ],
    );
    get_cases(w, "/reclaim", "DELETE");
    body_cases(
        w,
        "PUT",
        "/reclaim",
        r#"{"workers_per_node": 1, "chunk_mib": 64, "parallel_threshold_mib": 1024, "steal": true}"#,
        &[
            (
                "out of range (workers_per_node 0)",
                r#"{"workers_per_node": 0}"#,
            ),
            ("out of range (chunk_mib 3)", r#"{"chunk_mib": 3}"#),
            (
                "out of range (chunk_mib u64::MAX)",
                r#"{"chunk_mib": 18446744073709551615}"#,
            ),
        ],
    );

    balloon_cases(w);
    device_cases(w);
    snapshot_cases(w);
    unsupported_cases(w);
    super::hotplug_cases::hotplug_cases(w);
}

/// Firecracker's balloon; free page hinting is refused (its endpoints too).
fn balloon_cases(w: &mut Walk) {
    get_cases(w, "/balloon", "DELETE");
    body_cases(
        w,
        "PUT",
        "/balloon",
        r#"{"amount_mib": 0, "deflate_on_oom": true, "stats_polling_interval_s": 1}"#,
        &[
            (
                "out of range (amount_mib -1)",
                r#"{"amount_mib": -1, "deflate_on_oom": true}"#,
            ),
            (
                "amount_mib above the guest's RAM",
                r#"{"amount_mib": 129, "deflate_on_oom": true}"#,
            ),
            (
                "free_page_hinting true",
                r#"{"amount_mib": 0, "deflate_on_oom": true, "free_page_hinting": true}"#,
            ),
        ],
    );
    body_cases(
        w,
        "PATCH",
        "/balloon",
        r#"{"amount_mib": 1}"#,
        &[("amount_mib above the guest's RAM", r#"{"amount_mib": 129}"#)],
    );
    get_cases(w, "/balloon/statistics", "PUT");
    body_cases(
        w,
        "PATCH",
        "/balloon/statistics",
        r#"{"stats_polling_interval_s": 1}"#,
        &[],
    );
    body_cases(
        w,
        "PATCH",
        "/balloon/hinting/start",
        r#"{"acknowledge_on_stop": true}"#,
        &[],
    );
    body_cases(w, "PATCH", "/balloon/hinting/stop", "{}", &[]);
    get_cases(w, "/balloon/hinting/status", "PATCH");
}
