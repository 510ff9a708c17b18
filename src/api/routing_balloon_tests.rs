//! Unit tests of the routing of Firecracker's balloon resources on raw
//! JSON: `PUT`, `PATCH` and `GET /balloon`, `/balloon/statistics`, and the
//! free page hinting endpoints, which are refused with the reason.

use super::*;

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

/// The reason hinting is refused, as the device says it.
fn hinting_reason() -> String {
    BalloonError::HintingNotSupported.to_string()
}

#[test]
fn put_balloon() {
    assert_eq!(
        ok(
            "PUT",
            "/balloon",
            r#"{"amount_mib": 0, "deflate_on_oom": true, "stats_polling_interval_s": 1}"#
        ),
        VmmAction::PutBalloon(BalloonConfig {
            amount_mib: 0,
            deflate_on_oom: true,
            stats_polling_interval_s: 1,
            free_page_reporting: false,
            free_page_hinting: false,
        })
    );
    assert_eq!(
        ok(
            "PUT",
            "/balloon",
            r#"{"amount_mib": 512, "deflate_on_oom": false, "stats_polling_interval_s": 0,
                "free_page_reporting": true, "free_page_hinting": false}"#
        ),
        VmmAction::PutBalloon(BalloonConfig {
            amount_mib: 512,
            deflate_on_oom: false,
            stats_polling_interval_s: 0,
            free_page_reporting: true,
            free_page_hinting: false,
        })
    );
    for (body, needle) in [
        (
            r#"{"amount_mib": 1, "deflate_on_oom": true, "must_tell_host": true}"#,
            "invalid balloon body: unknown field `must_tell_host`",
        ),
        (
            r#"{"amount_mib": "1", "deflate_on_oom": true}"#,
            "invalid balloon body: balloon.amount_mib: invalid type",
        ),
        (
            r#"{"amount_mib": -1, "deflate_on_oom": true}"#,
            "balloon.amount_mib",
        ),
        (
            r#"{"amount_mib": 1, "deflate_on_oom": "yes"}"#,
            "balloon.deflate_on_oom: invalid type",
        ),
        (
            r#"{"amount_mib": 1, "deflate_on_oom": true, "stats_polling_interval_s": 65536}"#,
            "balloon.stats_polling_interval_s",
        ),
        (r#"{"deflate_on_oom": true}"#, "missing field `amount_mib`"),
        (r#"{"amount_mib": 1}"#, "missing field `deflate_on_oom`"),
        (
            r#"{"amount_mib": 16777216, "deflate_on_oom": true}"#,
            "invalid value for balloon.amount_mib: 16777216 MiB is more than a balloon can hold",
        ),
        ("", "the balloon request needs a JSON body"),
        ("[1, true]", "invalid balloon body: expected a JSON object"),
    ] {
        let m = bad("PUT", "/balloon", body);
        assert!(m.contains(needle), "{body}: {m}");
    }
}

#[test]
fn put_balloon_refuses_hinting_with_the_reason() {
    let m = bad(
        "PUT",
        "/balloon",
        r#"{"amount_mib": 1, "deflate_on_oom": true, "free_page_hinting": true}"#,
    );
    assert_eq!(
        m,
        format!(
            "invalid value for balloon.free_page_hinting: {}",
            hinting_reason()
        )
    );
    assert!(
        m.contains("zero a page the guest already reuses") && m.contains("use free_page_reporting"),
        "{m}"
    );
}

#[test]
fn patch_balloon_and_statistics() {
    assert_eq!(
        ok("PATCH", "/balloon", r#"{"amount_mib": 64}"#),
        VmmAction::PatchBalloon(BalloonUpdate { amount_mib: 64 })
    );
    assert_eq!(
        ok(
            "PATCH",
            "/balloon/statistics",
            r#"{"stats_polling_interval_s": 5}"#
        ),
        VmmAction::PatchBalloonStatistics(BalloonStatsUpdate {
            stats_polling_interval_s: 5
        })
    );
    for (path, body, needle) in [
        ("/balloon", "{}", "missing field `amount_mib`"),
        (
            "/balloon",
            r#"{"amount_mib": 1, "deflate_on_oom": true}"#,
            "unknown field `deflate_on_oom`",
        ),
        (
            "/balloon",
            r#"{"amount_mib": 1.5}"#,
            "balloon.amount_mib: invalid type",
        ),
        (
            "/balloon",
            r#"{"amount_mib": 4294967295}"#,
            "invalid value for balloon.amount_mib",
        ),
        ("/balloon", "", "needs a JSON body"),
        (
            "/balloon/statistics",
            "{}",
            "missing field `stats_polling_interval_s`",
        ),
        (
            "/balloon/statistics",
            r#"{"stats_polling_interval_s": 1, "amount_mib": 1}"#,
            "unknown field `amount_mib`",
        ),
        (
            "/balloon/statistics",
            r#"{"stats_polling_interval_s": true}"#,
            "balloon.stats_polling_interval_s: invalid type",
        ),
        (
            "/balloon/statistics",
            r#"{"stats_polling_interval_s": -1}"#,
            "balloon.stats_polling_interval_s",
        ),
        ("/balloon/statistics", "[]", "expected a JSON object"),
    ] {
        let m = bad("PATCH", path, body);
        assert!(m.contains(needle), "PATCH {path} {body}: {m}");
    }
}

#[test]
fn get_balloon_and_statistics() {
    assert_eq!(ok("GET", "/balloon", ""), VmmAction::GetBalloon);
    assert_eq!(
        ok("GET", "/balloon/statistics", ""),
        VmmAction::GetBalloonStatistics
    );
    for path in ["/balloon", "/balloon/statistics"] {
        assert!(bad("GET", path, "{}").contains("takes no body"));
    }
}

#[test]
fn hinting_endpoints_are_refused_with_the_reason() {
    for (method, path, body) in [
        (
            "PATCH",
            "/balloon/hinting/start",
            r#"{"acknowledge_on_stop": true}"#,
        ),
        ("PATCH", "/balloon/hinting/start", ""),
        ("PATCH", "/balloon/hinting/start", "not json"),
        ("PATCH", "/balloon/hinting/stop", "{}"),
        ("PATCH", "/balloon/hinting/stop", ""),
        ("GET", "/balloon/hinting/status", ""),
        ("GET", "/balloon/hinting/status", "{}"),
    ] {
        let e = route(method, path, body.as_bytes()).unwrap_err();
        assert_eq!(e.status(), 400);
        assert_eq!(
            e,
            RouteError::Refused {
                method: method.into(),
                path: path.into(),
                reason: hinting_reason(),
            }
        );
        assert_eq!(
            e.to_string(),
            format!("{method} {path}: {}", hinting_reason())
        );
    }
}

#[test]
fn wrong_methods_and_paths() {
    for (method, path, allowed) in [
        ("DELETE", "/balloon", "GET, PUT, PATCH"),
        ("POST", "/balloon", "GET, PUT, PATCH"),
        ("PUT", "/balloon/statistics", "GET, PATCH"),
        ("DELETE", "/balloon/statistics", "GET, PATCH"),
        ("GET", "/balloon/hinting/start", "PATCH"),
        ("PUT", "/balloon/hinting/stop", "PATCH"),
        ("PATCH", "/balloon/hinting/status", "GET"),
    ] {
        match route(method, path, b"{}") {
            Err(e @ RouteError::MethodNotAllowed { allow, .. }) => {
                assert_eq!(allow, allowed, "{method} {path}");
                assert_eq!(e.status(), 405);
            }
            other => panic!("{method} {path}: {other:?}"),
        }
    }
    for path in [
        "/balloon/",
        "/balloon/stats",
        "/balloon/hinting",
        "/balloon/hinting/",
        "/balloon/hinting/start/x",
        "/balloonx",
    ] {
        assert_eq!(
            route("GET", path, b"").unwrap_err(),
            RouteError::NotFound(path.into()),
            "{path}"
        );
    }
}

#[test]
fn actions_name_their_request() {
    let c = BalloonConfig {
        amount_mib: 1,
        deflate_on_oom: true,
        stats_polling_interval_s: 0,
        free_page_reporting: false,
        free_page_hinting: false,
    };
    for (action, want) in [
        (VmmAction::PutBalloon(c), ("PUT", "/balloon")),
        (
            VmmAction::PatchBalloon(BalloonUpdate { amount_mib: 1 }),
            ("PATCH", "/balloon"),
        ),
        (VmmAction::GetBalloon, ("GET", "/balloon")),
        (
            VmmAction::GetBalloonStatistics,
            ("GET", "/balloon/statistics"),
        ),
        (
            VmmAction::PatchBalloonStatistics(BalloonStatsUpdate {
                stats_polling_interval_s: 1,
            }),
            ("PATCH", "/balloon/statistics"),
        ),
    ] {
        assert_eq!(action.method_and_path(), want, "{action:?}");
    }
}
