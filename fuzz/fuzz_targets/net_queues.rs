//! A running virtio-net device over a recording tap whose queues'
//! descriptor tables, available rings, buffers and incoming frames come
//! from the input (`teravm_fuzz::net::net_queues`
//! documents the input): never panics, writes guest memory only inside the
//! used rings and the buffers the driver marked device-writable, and sends
//! frames no longer than the device's bound.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = teravm_fuzz::net::net_queues(data);
});
