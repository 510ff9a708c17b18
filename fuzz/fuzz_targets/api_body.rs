//! The body of each `PUT` resource: the first byte picks the resource
//! (machine-config, boot-source, memory, reclaim, actions: byte % 5), the
//! rest is the body. One target for the five bodies keeps the CI run short;
//! the seed corpus has valid bodies of each resource behind its byte.
#![no_main]

use libfuzzer_sys::fuzz_target;
use teravm_fuzz::{route_and_check, PUT_PATHS};

fuzz_target!(|data: &[u8]| {
    let Some((&pick, body)) = data.split_first() else {
        return;
    };
    let path = PUT_PATHS[usize::from(pick) % PUT_PATHS.len()];
    route_and_check("PUT", path, body);
});
