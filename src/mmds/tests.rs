//! Unit tests of the store, the tokens and the HTTP layer.

use std::time::Duration;

use serde_json::json;

use super::http::{parse, respond, Parsed, Request, MAX_REQUEST_BYTES};
use super::store::merge_patch;
use super::*;

#[test]
fn merge_patch_follows_rfc7396() {
    // RFC 7396's own example.
    let mut doc = json!({"title": "Goodbye!", "author": {"givenName": "John", "familyName": "Doe"},
        "tags": ["example", "sample"], "content": "This will be unchanged"});
    let patch = json!({"title": "Hello!", "phoneNumber": "+01-123-456-7890",
        "author": {"familyName": null}, "tags": ["example"]});
    merge_patch(&mut doc, &patch);
    assert_eq!(
        doc,
        json!({"title": "Hello!", "author": {"givenName": "John"}, "tags": ["example"],
            "content": "This will be unchanged", "phoneNumber": "+01-123-456-7890"})
    );
    // A non-object patch replaces; an object patch on a non-object starts
    // from an empty object.
    let mut v = json!({"a": 1});
    merge_patch(&mut v, &json!("x"));
    assert_eq!(v, json!("x"));
    merge_patch(&mut v, &json!({"b": {"c": null, "d": 2}}));
    assert_eq!(v, json!({"b": {"d": 2}}));
}

#[test]
fn store_limits_and_initialization() {
    let mut s = Store::new(20);
    assert_eq!(s.patch(&json!({"a": 1})), Err(StoreError::NotInitialized));
    assert_eq!(s.value(), &serde_json::Value::Null);
    s.put(json!({"a": 1})).unwrap();
    assert_eq!(
        s.put(json!({"a": "0123456789012345678"})),
        Err(StoreError::LimitExceeded)
    );
    assert_eq!(
        s.patch(&json!({"b": "0123456789012345678"})),
        Err(StoreError::LimitExceeded)
    );
    // A failed write changes nothing.
    assert_eq!(s.value(), &json!({"a": 1}));
    s.patch(&json!({"b": "x"})).unwrap();
    assert_eq!(s.value(), &json!({"a": 1, "b": "x"}));
}

#[test]
fn store_get_json_and_imds() {
    let mut s = Store::new(1000);
    s.put(json!({"latest": {"meta-data": {"ami-id": "ami-1", "tags": {"x": "y"}}}, "n": 3}))
        .unwrap();
    let g = |p: &str, f| s.get(p, f);
    assert_eq!(
        g("/latest/meta-data/ami-id", OutputFormat::Json).unwrap(),
        "\"ami-1\""
    );
    assert_eq!(
        g("/latest/meta-data/ami-id", OutputFormat::Imds).unwrap(),
        "ami-1"
    );
    assert_eq!(
        g("/latest/meta-data/", OutputFormat::Imds).unwrap(),
        "ami-id\ntags/"
    );
    assert_eq!(g("/n", OutputFormat::Json).unwrap(), "3");
    assert_eq!(
        g("/n", OutputFormat::Imds),
        Err(StoreError::UnsupportedValueType)
    );
    assert_eq!(g("/nope", OutputFormat::Json), Err(StoreError::NotFound));
}

#[test]
fn tokens_expire_by_the_given_clock() {
    let mut t = TokenAuthority::new();
    assert_eq!(
        t.generate(0, Duration::ZERO),
        Err(TokenError::InvalidTtl(0))
    );
    assert!(t.generate(21601, Duration::ZERO).is_err());
    let tok = t.generate(2, Duration::from_secs(10)).unwrap();
    assert!(t.is_valid(&tok, Duration::from_secs(10)));
    assert!(t.is_valid(&tok, Duration::from_millis(11_999)));
    assert!(!t.is_valid(&tok, Duration::from_secs(12)));
    // Another authority's token, a changed one, garbage: never valid.
    let other = TokenAuthority::new().generate(60, Duration::ZERO).unwrap();
    assert!(!t.is_valid(&other, Duration::ZERO));
    let mut forged = tok.clone().into_bytes();
    forged[0] = if forged[0] == b'f' { b'e' } else { b'f' };
    assert!(!t.is_valid(std::str::from_utf8(&forged).unwrap(), Duration::ZERO));
    assert!(!t.is_valid("", Duration::ZERO));
    assert!(!t.is_valid("zz", Duration::ZERO));
}

fn req(text: &str) -> Request {
    match parse(text.as_bytes()) {
        Parsed::Request(r, n) => {
            assert_eq!(n, text.len());
            r
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn parser_takes_requests_and_bounds_them() {
    assert_eq!(parse(b"GET / HTTP/1.1\r\nHost: x\r\n"), Parsed::Incomplete);
    let r = req("GET http://169.254.169.254/a//b HTTP/1.1\r\nAccept: application/json\r\n\r\n");
    assert_eq!((r.method.as_str(), r.path.as_str()), ("GET", "/a//b"));
    assert_eq!(r.header(&["accept"]), Some(("accept", "application/json")));
    // A body by Content-Length is part of the request.
    let text = "PUT /x HTTP/1.1\r\nContent-Length: 3\r\n\r\nabcGET";
    assert!(matches!(parse(text.as_bytes()), Parsed::Request(_, n) if n == text.len() - 3));
    assert!(matches!(
        parse(b"PUT /x HTTP/1.1\r\nContent-Length: 3\r\n\r\nab"),
        Parsed::Incomplete
    ));
    for bad in [
        &b"GET /\r\n\r\n"[..],
        b"GET / HTTP/2\r\n\r\n",
        b"get / HTTP/1.1\r\n\r\n",
        b"GET / HTTP/1.1\r\nnocolon\r\n\r\n",
        b"GET / HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
        b"\xff\xfe / HTTP/1.1\r\n\r\n",
    ] {
        assert!(matches!(parse(bad), Parsed::Bad(_)), "{bad:?}");
    }
    let huge = vec![b'a'; MAX_REQUEST_BYTES];
    assert!(matches!(parse(&huge), Parsed::Bad(_)));
    let long_body = format!("PUT / HTTP/1.1\r\nContent-Length: {MAX_REQUEST_BYTES}\r\n\r\n");
    assert!(matches!(parse(long_body.as_bytes()), Parsed::Bad(_)));
}

fn mmds(version: MmdsVersion) -> Mmds {
    let mut m = Mmds::new(1000);
    m.store_mut()
        .put(json!({"latest": {"meta-data": {"id": "i-1"}}}))
        .unwrap();
    m.configure(&MmdsConfig {
        version,
        network_interfaces: vec!["eth0".into()],
        ipv4_address: None,
        imds_compat: false,
    });
    m
}

#[test]
fn v1_and_v2_answers() {
    let mut m = mmds(MmdsVersion::V1);
    let r = respond(&mut m, &req("GET /latest/meta-data/id HTTP/1.1\r\n\r\n"));
    assert_eq!((r.status, r.body.as_str()), (200, "i-1"));
    let r = respond(
        &mut m,
        &req("GET /latest/meta-data HTTP/1.1\r\nAccept: application/json\r\n\r\n"),
    );
    assert_eq!((r.status, r.body.as_str()), (200, r#"{"id":"i-1"}"#));
    let r = respond(&mut m, &req("GET /missing HTTP/1.1\r\n\r\n"));
    assert_eq!(
        (r.status, r.body.as_str()),
        (404, "Resource not found: /missing.")
    );
    let r = respond(&mut m, &req("POST / HTTP/1.1\r\n\r\n"));
    assert_eq!(r.status, 405);
    assert_eq!(m.counters.no_token, 3);

    let mut m = mmds(MmdsVersion::V2);
    let r = respond(&mut m, &req("GET /latest/meta-data/id HTTP/1.1\r\n\r\n"));
    assert_eq!(r.status, 401);
    let r = respond(
        &mut m,
        &req("GET /latest/meta-data/id HTTP/1.1\r\nX-metadata-token: abc\r\n\r\n"),
    );
    assert_eq!((r.status, r.body.as_str()), (401, "MMDS token not valid."));
    let r = respond(&mut m, &req("PUT /latest/api/token HTTP/1.1\r\n\r\n"));
    assert_eq!(r.status, 400);
    let r = respond(
        &mut m,
        &req("PUT /latest/api/token HTTP/1.1\r\nX-metadata-token-ttl-seconds: 0\r\n\r\n"),
    );
    assert_eq!(r.status, 400);
    let r = respond(
        &mut m,
        &req("PUT /latest/api/token HTTP/1.1\r\nX-metadata-token-ttl-seconds: 60\r\nX-Forwarded-For: 1.2.3.4\r\n\r\n"),
    );
    assert_eq!(r.status, 400);
    let r = respond(
        &mut m,
        &req("PUT /latest/api/token HTTP/1.1\r\nX-metadata-token-ttl-seconds: 60\r\n\r\n"),
    );
    assert_eq!(r.status, 200);
    let token = r.body;
    let r = respond(
        &mut m,
        &req(&format!(
            "GET /latest/meta-data/id HTTP/1.1\r\nX-metadata-token: {token}\r\n\r\n"
        )),
    );
    assert_eq!((r.status, r.body.as_str()), (200, "i-1"));
    let bytes = String::from_utf8(r.to_bytes("HTTP/1.1")).unwrap();
    assert!(bytes.starts_with("HTTP/1.1 200 \r\n"), "{bytes}");
    assert!(bytes.ends_with("Content-Length: 3\r\n\r\ni-1"), "{bytes}");
}

#[test]
fn config_checks() {
    let c = |ip: Option<[u8; 4]>, ifaces: &[&str]| MmdsConfig {
        version: MmdsVersion::V1,
        network_interfaces: ifaces.iter().map(|s| s.to_string()).collect(),
        ipv4_address: ip.map(Ipv4Addr::from),
        imds_compat: false,
    };
    assert_eq!(c(None, &["eth0"]).check_ifaces(&["eth0"]), Ok(()));
    assert_eq!(
        c(None, &[]).validate(),
        Err(MmdsConfigError::EmptyNetworkIfaceList)
    );
    assert_eq!(
        c(None, &["eth1"]).check_ifaces(&["eth0"]),
        Err(MmdsConfigError::InvalidNetworkInterfaceId)
    );
    for ip in [[169, 254, 0, 1], [169, 254, 255, 1], [10, 0, 0, 1]] {
        assert_eq!(
            c(Some(ip), &["eth0"]).validate(),
            Err(MmdsConfigError::InvalidIpv4Addr)
        );
    }
    assert_eq!(
        c(Some([169, 254, 170, 2]), &["eth0"]).ipv4(),
        Ipv4Addr::new(169, 254, 170, 2)
    );
}
