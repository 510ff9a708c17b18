//! A running virtio-vsock whose queues' descriptor tables, available rings,
//! buffers and host peers come from the input
//! (`teravm_fuzz::vsock::vsock_queues` documents the
//! input): never panics, and every guest memory access the device makes lies
//! inside guest RAM; connections and buffered bytes stay bounded.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = teravm_fuzz::vsock::vsock_queues(data);
});
