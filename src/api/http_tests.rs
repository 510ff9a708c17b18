//! Unit tests of the request parser and the response writer.

use super::*;

/// `parse_request(buf)`, checked against a [`RequestParser`] fed the same
/// bytes one at a time: its first answer that is not `NeedMore` is the same,
/// and (for short inputs) so is every answer on the way.
fn parse(buf: &[u8]) -> Result<Parsed, RequestError> {
    let whole = parse_request(buf);
    let mut parser = RequestParser::new();
    for k in 0..=buf.len() {
        let got = parser.parse(&buf[..k]);
        if buf.len() <= 4096 {
            assert_eq!(got, parse_request(&buf[..k]), "prefix of {k} bytes");
        }
        if !matches!(got, Ok(Parsed::NeedMore { .. })) || k == buf.len() {
            assert_eq!(got, whole, "{:?} fed one byte at a time", buf);
            break;
        }
    }
    whole
}

fn complete(buf: &[u8]) -> (Request, usize) {
    match parse(buf) {
        Ok(Parsed::Complete { request, consumed }) => (request, consumed),
        other => panic!("{:?}: expected a complete request, got {other:?}", buf),
    }
}

fn need_more(buf: &[u8]) -> bool {
    matches!(parse(buf), Ok(Parsed::NeedMore { .. }))
}

fn err(buf: &[u8]) -> RequestError {
    match parse(buf) {
        Err(e) => e,
        other => panic!("expected an error, got {other:?}"),
    }
}

#[test]
fn get_without_body() {
    let text = b"GET /machine-config HTTP/1.1\r\nHost: localhost\r\nAccept: */*\r\n\r\n";
    let (r, n) = complete(text);
    assert_eq!(n, text.len());
    assert_eq!(r.method, "GET");
    assert_eq!(r.path, "/machine-config");
    assert_eq!(r.version, Version::Http11);
    assert!(r.keep_alive);
    assert_eq!(r.header("host"), Some("localhost"));
    assert_eq!(r.header("accept"), Some("*/*"));
    assert!(r.body.is_empty());
}

#[test]
fn put_with_body() {
    let text =
        b"PUT /actions HTTP/1.1\r\nContent-Length: 31\r\n\r\n{\"action_type\":\"InstanceStart\"}";
    let (r, n) = complete(text);
    assert_eq!(n, text.len());
    assert_eq!(r.method, "PUT");
    assert_eq!(r.body, b"{\"action_type\":\"InstanceStart\"}");
}

#[test]
fn header_names_are_case_insensitive_and_values_trimmed() {
    let (r, _) = complete(b"PUT / HTTP/1.1\r\nCONTENT-length:  \t2 \r\n\r\n{}");
    assert_eq!(r.body, b"{}");
    assert_eq!(r.header("content-length"), Some("2"));
}

#[test]
fn keep_alive_rules() {
    let (r, _) = complete(b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n");
    assert!(!r.keep_alive);
    let (r, _) = complete(b"GET / HTTP/1.1\r\nConnection: keep-alive, Close\r\n\r\n");
    assert!(!r.keep_alive);
    let (r, _) = complete(b"GET / HTTP/1.0\r\n\r\n");
    assert_eq!(r.version, Version::Http10);
    assert!(!r.keep_alive);
    let (r, _) = complete(b"GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n");
    assert!(r.keep_alive);
}

#[test]
fn pipelined_requests_parse_one_at_a_time() {
    let first = b"PUT /reclaim HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}".to_vec();
    let second = b"GET /reclaim HTTP/1.1\r\n\r\n".to_vec();
    let buf = [first.clone(), second.clone()].concat();
    let (r, n) = complete(&buf);
    assert_eq!((r.method.as_str(), n), ("PUT", first.len()));
    let (r, n) = complete(&buf[n..]);
    assert_eq!((r.method.as_str(), n), ("GET", second.len()));
}

#[test]
fn query_string_is_dropped_and_leading_empty_lines_skipped() {
    let text = b"\r\n\r\nGET /reclaim?x=1 HTTP/1.1\r\n\r\n";
    let (r, n) = complete(text);
    assert_eq!(r.path, "/reclaim");
    assert_eq!(n, text.len());
}

#[test]
fn every_prefix_of_a_request_needs_more() {
    let text = b"PUT /machine-config HTTP/1.1\r\nContent-Length: 10\r\n\r\n0123456789";
    for cut in 0..text.len() {
        assert!(need_more(&text[..cut]), "prefix of {cut} bytes");
    }
    complete(text);
}

#[test]
fn expect_continue_is_reported_once_the_head_is_in() {
    let head = b"PUT /memory HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n";
    assert_eq!(
        parse_request(&head[..head.len() - 1]),
        Ok(Parsed::NeedMore {
            expect_continue: false
        })
    );
    assert_eq!(
        parse_request(head),
        Ok(Parsed::NeedMore {
            expect_continue: true
        })
    );
    let full = [&head[..], b"{}"].concat();
    complete(&full);
    assert_eq!(
        err(b"PUT / HTTP/1.1\r\nExpect: something\r\n\r\n"),
        RequestError::BadExpect
    );
}

#[test]
fn malformed_request_lines() {
    for text in [
        &b"GET  / HTTP/1.1\r\n\r\n"[..],
        b"GET / HTTP/1.1 extra\r\n\r\n",
        b"GET /\r\n\r\n",
        b"GET\r\n\r\n",
        b"G(T / HTTP/1.1\r\n\r\n",
        b"GET machine-config HTTP/1.1\r\n\r\n",
        b"GET http://x/ HTTP/1.1\r\n\r\n",
        b"GET / HTTP/11\r\n\r\n",
        b"GET / http/1.1\r\n\r\n",
        b"GET /\x7f HTTP/1.1\r\n\r\n",
        b" GET / HTTP/1.1\r\n\r\n",
    ] {
        let e = err(text);
        assert!(
            matches!(e, RequestError::BadRequestLine(_)),
            "{:?}: {e:?}",
            String::from_utf8_lossy(text)
        );
        assert_eq!(e.status(), 400);
    }
}

#[test]
fn invalid_utf8_and_nul_bytes_are_refused() {
    assert!(matches!(
        err(b"GET /\xff\xfe HTTP/1.1\r\n\r\n"),
        RequestError::BadRequestLine(_)
    ));
    assert!(matches!(
        err("GET /é HTTP/1.1\r\n\r\n".as_bytes()),
        RequestError::BadRequestLine(_)
    ));
    assert!(matches!(
        err(b"GET /\0 HTTP/1.1\r\n\r\n"),
        RequestError::BadRequestLine(_)
    ));
    assert!(matches!(
        err(b"GET / HTTP/1.1\r\nX-A: a\0b\r\n\r\n"),
        RequestError::BadHeader(_)
    ));
    assert!(matches!(
        err(b"GET / HTTP/1.1\r\nX-\0: a\r\n\r\n"),
        RequestError::BadHeader(_)
    ));
}

#[test]
fn line_ending_rules() {
    assert!(matches!(
        err(b"GET / HTTP/1.1\n\n"),
        RequestError::BadHeader(_)
    ));
    assert!(matches!(
        err(b"GET / HTTP/1.1\r\nHost: x\n\r\n"),
        RequestError::BadHeader(_)
    ));
    assert!(matches!(
        err(b"GET / HTTP/1.1\r\nHost: x\ry\r\n\r\n"),
        RequestError::BadHeader(_)
    ));
    assert!(matches!(
        err(b"GET /\r HTTP/1.1\r\n\r\n"),
        RequestError::BadRequestLine(_)
    ));
}

#[test]
fn malformed_headers() {
    for text in [
        &b"GET / HTTP/1.1\r\nHost x\r\n\r\n"[..],
        b"GET / HTTP/1.1\r\nHost : x\r\n\r\n",
        b"GET / HTTP/1.1\r\n: x\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: x\r\n  folded\r\n\r\n",
        b"GET / HTTP/1.1\r\nX(y): x\r\n\r\n",
    ] {
        let e = err(text);
        assert!(matches!(e, RequestError::BadHeader(_)), "{e:?}");
        assert_eq!(e.status(), 400);
    }
}

#[test]
fn long_lines_are_refused_without_waiting_for_their_end() {
    let mut text = b"GET / HTTP/1.1\r\nX-Big: ".to_vec();
    text.resize(text.len() + (1 << 20), b'a');
    assert_eq!(err(&text), RequestError::LineTooLong);
    let mut text = b"GET /".to_vec();
    text.resize(MAX_LINE_BYTES + 1, b'a');
    assert_eq!(err(&text), RequestError::LineTooLong);
    assert_eq!(err(&text).status(), 400);
    // Just under the limit is fine.
    let mut text = b"GET / HTTP/1.1\r\nX: ".to_vec();
    let pad = MAX_LINE_BYTES - 5;
    text.extend(std::iter::repeat_n(b'a', pad));
    text.extend_from_slice(b"\r\n\r\n");
    complete(&text);
    // Endless empty lines before a request are bounded too.
    assert_eq!(
        err(&b"\r\n".repeat(MAX_LINE_BYTES)),
        RequestError::LineTooLong
    );
}

#[test]
fn header_count_is_bounded() {
    let mut text = b"GET / HTTP/1.1\r\n".to_vec();
    for i in 0..MAX_HEADERS {
        text.extend_from_slice(format!("X-{i}: v\r\n").as_bytes());
    }
    let ok = [&text[..], b"\r\n"].concat();
    assert_eq!(complete(&ok).0.headers.len(), MAX_HEADERS);
    text.extend_from_slice(b"X-last: v\r\n\r\n");
    assert_eq!(err(&text), RequestError::TooManyHeaders);
}

#[test]
fn content_length_rules() {
    for v in ["", "-1", "+2", "0x10", "1 2", "2,2", "١"] {
        let text = format!("PUT / HTTP/1.1\r\nContent-Length: {v}\r\n\r\n{{}}");
        let e = err(text.as_bytes());
        assert!(
            matches!(e, RequestError::BadContentLength(_)),
            "{v:?}: {e:?}"
        );
        assert_eq!(e.status(), 400);
    }
    let e = err(b"PUT / HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\n{}");
    assert!(matches!(e, RequestError::BadContentLength(_)));
    // A body over the limit is refused from the head alone.
    let e = err(format!(
        "PUT / HTTP/1.1\r\nContent-Length: {}\r\n\r\n",
        MAX_BODY_BYTES + 1
    )
    .as_bytes());
    assert_eq!(
        (e.clone(), e.status()),
        (RequestError::BodyTooLarge(MAX_BODY_BYTES), 413)
    );
    let e = err(b"PUT / HTTP/1.1\r\nContent-Length: 99999999999999999999999999\r\n\r\n");
    assert_eq!(e, RequestError::BodyTooLarge(MAX_BODY_BYTES));
    // Exactly the limit is fine.
    let mut text =
        format!("PUT / HTTP/1.1\r\nContent-Length: {MAX_BODY_BYTES}\r\n\r\n").into_bytes();
    assert!(need_more(&text));
    text.resize(text.len() + MAX_BODY_BYTES, b' ');
    assert_eq!(complete(&text).0.body.len(), MAX_BODY_BYTES);
}

#[test]
fn transfer_encoding_is_not_implemented() {
    let e = err(b"PUT / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n");
    assert_eq!(
        (e.clone(), e.status()),
        (RequestError::TransferEncoding, 501)
    );
    let e = err(b"PUT / HTTP/1.1\r\nContent-Length: 2\r\nTransfer-Encoding: gzip\r\n\r\n{}");
    assert_eq!(e, RequestError::TransferEncoding);
}

#[test]
fn other_http_versions() {
    for v in ["HTTP/2.0", "HTTP/0.9", "HTTP/1.2", "HTTP/3.0"] {
        let e = err(format!("GET / {v}\r\n\r\n").as_bytes());
        assert_eq!(
            (e.clone(), e.status()),
            (RequestError::UnsupportedVersion, 505)
        );
    }
}

#[test]
fn arbitrary_bytes_never_panic() {
    // A cheap deterministic fuzz: mutations of a valid request.
    let base =
        b"PUT /machine-config HTTP/1.1\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello";
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    for _ in 0..20_000 {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let mut buf = base.to_vec();
        let pos = (seed as usize) % buf.len();
        buf[pos] = (seed >> 32) as u8;
        let cut = ((seed >> 16) as usize) % (buf.len() + 1);
        let _ = parse(&buf[..cut]);
    }
}

#[test]
fn a_request_trickled_one_byte_at_a_time_is_scanned_once() {
    // A large head (50 header lines of 1 KiB) and a body, fed one byte per
    // call: the bytes searched for line ends stay at most the request's
    // size (re-parsing from the start on every call would search each head
    // byte once per later byte: about 1.5 billion here).
    let mut text = b"PUT /reclaim HTTP/1.1\r\n".to_vec();
    for i in 0..50 {
        text.extend_from_slice(format!("X-Pad-{i:02}: {}\r\n", "a".repeat(1000)).as_bytes());
    }
    let body = format!("{{\"steal\": true}}{}", " ".repeat(10_000));
    text.extend_from_slice(format!("Content-Length: {}\r\n\r\n", body.len()).as_bytes());
    text.extend_from_slice(body.as_bytes());
    let mut parser = RequestParser::new();
    for k in 0..text.len() {
        assert!(matches!(
            parser.parse(&text[..k]),
            Ok(Parsed::NeedMore { .. })
        ));
    }
    assert!(
        parser.looked <= text.len(),
        "{} of {}",
        parser.looked,
        text.len()
    );
    let Ok(Parsed::Complete { request, consumed }) = parser.parse(&text) else {
        panic!("not complete");
    };
    assert_eq!((request.headers.len(), consumed), (51, text.len()));
    assert_eq!(request.body, body.as_bytes());
    // It starts afresh after a complete request: the next one in the buffer.
    let two = [&text[..], b"GET / HTTP/1.1\r\n\r\n"].concat();
    let Ok(Parsed::Complete { consumed, .. }) = parser.parse(&two) else {
        panic!("not complete");
    };
    let Ok(Parsed::Complete { request, .. }) = parser.parse(&two[consumed..]) else {
        panic!("second not complete");
    };
    assert_eq!(
        (request.method.as_str(), request.path.as_str()),
        ("GET", "/")
    );
}

#[test]
fn a_shorter_buffer_starts_the_parser_afresh() {
    let mut parser = RequestParser::new();
    let text = b"PUT /memory HTTP/1.1\r\nContent-Length: 2\r\n\r\n";
    assert!(matches!(parser.parse(text), Ok(Parsed::NeedMore { .. })));
    let (r, n) = match parser.parse(b"GET / HTTP/1.1\r\n\r\n") {
        Ok(Parsed::Complete { request, consumed }) => (request, consumed),
        other => panic!("{other:?}"),
    };
    assert_eq!((r.method.as_str(), n), ("GET", 18));
}

#[test]
fn responses_on_the_wire() {
    let r = Response::json(200, "{\"a\":1}".into()).to_bytes();
    assert_eq!(
        String::from_utf8(r).unwrap(),
        "HTTP/1.1 200 OK\r\nServer: teravm\r\nContent-Type: application/json\r\nContent-Length: 7\r\n\r\n{\"a\":1}"
    );
    let r = String::from_utf8(Response::no_content().to_bytes()).unwrap();
    assert_eq!(r, "HTTP/1.1 204 No Content\r\nServer: teravm\r\n\r\n");
    let mut f = Response::fault(405, "no \"quotes\"");
    f.allow = Some("GET, PUT");
    f.close = true;
    let r = String::from_utf8(f.to_bytes()).unwrap();
    assert!(r.starts_with("HTTP/1.1 405 Method Not Allowed\r\n"), "{r}");
    assert!(r.contains("\r\nAllow: GET, PUT\r\n"), "{r}");
    assert!(r.contains("\r\nConnection: close\r\n"), "{r}");
    let body = r.split("\r\n\r\n").nth(1).unwrap();
    let v: serde_json::Value = serde_json::from_str(body).unwrap();
    assert_eq!(v["fault_message"], "no \"quotes\"");
}
