//! `parse_request` over arbitrary bytes: never panics, and what it returns
//! is consistent: a complete request lies within the input, within every
//! limit, and is found the same way in any longer buffer, while every
//! shorter prefix of it only asks for more bytes. And the incremental
//! `RequestParser`, fed the same bytes in pieces (their sizes drawn from the
//! input), answers exactly as `parse_request` does on each prefix.
#![no_main]

use libfuzzer_sys::fuzz_target;
use teravm::api::http::{
    parse_request, Parsed, RequestParser, MAX_BODY_BYTES, MAX_HEADERS, MAX_LINE_BYTES,
};

/// Feeds `data` to a `RequestParser` in pieces of 1 to 64 bytes (sizes
/// taken from the data itself) and checks its answers against
/// `parse_request` on the same prefix: the final one always, and those on
/// the way at about 16 points (checking each would make every input cost
/// time quadratic in its length).
fn check_incremental(data: &[u8]) {
    let mut parser = RequestParser::new();
    let check_every = data.len() / 16 + 1;
    let mut next_check = check_every;
    let mut end = 0;
    let mut i = 0;
    loop {
        let step = data.get(i).map_or(1, |b| usize::from(b % 64) + 1);
        i += 1;
        end = (end + step).min(data.len());
        let got = parser.parse(&data[..end]);
        let last = !matches!(got, Ok(Parsed::NeedMore { .. })) || end == data.len();
        if last || end >= next_check {
            assert_eq!(got, parse_request(&data[..end]), "after {end} bytes");
            next_check = end + check_every;
        }
        if last {
            return;
        }
    }
}

fuzz_target!(|data: &[u8]| {
    check_incremental(data);
    let result = parse_request(data);
    match &result {
        Err(e) => {
            assert!(matches!(e.status(), 400 | 413 | 417 | 501 | 505), "{e:?}");
        }
        Ok(Parsed::NeedMore { .. }) => {
            // The parser must refuse, not wait forever, once the input is
            // longer than any request it accepts.
            let biggest = MAX_LINE_BYTES * (MAX_HEADERS + 3) + MAX_BODY_BYTES;
            assert!(data.len() <= biggest, "NeedMore after {} bytes", data.len());
        }
        Ok(Parsed::Complete { request, consumed }) => {
            let consumed = *consumed;
            assert!(
                consumed <= data.len(),
                "consumed {consumed} of {}",
                data.len()
            );
            assert!(request.body.len() <= MAX_BODY_BYTES);
            assert!(request.headers.len() <= MAX_HEADERS);
            assert!(request.path.starts_with('/'), "{:?}", request.path);
            assert!(!request.path.contains('?'), "{:?}", request.path);
            assert!(!request.method.is_empty());
            for (name, value) in &request.headers {
                assert!(!name.is_empty());
                assert_eq!(name, &name.to_ascii_lowercase());
                assert!(!value.contains(['\r', '\n', '\0']), "{value:?}");
            }
            let declared = request
                .header("content-length")
                .map(|v| v.parse::<usize>().unwrap())
                .unwrap_or(0);
            assert_eq!(request.body.len(), declared);
            assert_eq!(
                &data[consumed - request.body.len()..consumed],
                &request.body[..]
            );

            // The request is made of its `consumed` bytes only...
            assert_eq!(parse_request(&data[..consumed]), result);
            // ...so more bytes after it change nothing (pipelining)...
            let mut longer = data[..consumed].to_vec();
            longer.extend_from_slice(b"GET / HTTP/1.1\r\n\r\n");
            assert_eq!(parse_request(&longer), result);
            // ...and a shorter prefix is never an error nor complete: the
            // answer must not depend on how the bytes were split in reads.
            let step = (consumed / 16).max(1);
            for k in (0..consumed).step_by(step).chain([consumed - 1]) {
                match parse_request(&data[..k]) {
                    Ok(Parsed::NeedMore { .. }) => {}
                    other => panic!("prefix of {k} bytes of a {consumed}-byte request: {other:?}"),
                }
            }
        }
    }
});
