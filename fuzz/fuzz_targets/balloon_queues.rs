//! A running virtio-balloon whose queues' descriptor tables, available rings
//! and buffers come from the input
//! (`teravm_fuzz::balloon::balloon_queues` documents the input):
//! never panics, and its discard sink asserts that every range lies inside
//! guest RAM, aligned to whole pages.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = teravm_fuzz::balloon::balloon_queues(data);
});
