//! A running virtio-mem device whose queue's descriptor table, available
//! ring and requests come from the input (`teravm_fuzz::mem::virtio_mem`
//! documents the input): never panics, and its sink asserts that every
//! range and slot lies inside the device's region, block or slot aligned,
//! and agrees with what was plugged and mapped before.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = teravm_fuzz::mem::virtio_mem(data);
});
