//! `route(method, path, body)` over arbitrary input, split at the first two
//! NUL bytes into method, path and body (a missing part is empty): never
//! panics, and every answer passes `route_and_check`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use teravm_fuzz::route_and_check;

fuzz_target!(|data: &[u8]| {
    let mut parts = data.splitn(3, |&b| b == 0);
    let method = String::from_utf8_lossy(parts.next().unwrap_or_default());
    let path = String::from_utf8_lossy(parts.next().unwrap_or_default());
    let body = parts.next().unwrap_or_default();
    route_and_check(&method, &path, body);
});
