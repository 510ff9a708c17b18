//! A running virtio-blk device whose descriptor table, available ring,
//! headers and buffers come from the input
//! (`teravm_fuzz::block::block_queues` documents the
//! input): never panics, and its recording disk asserts that every file
//! access lies inside the drive's sectors and that a read-only drive is
//! never written.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = teravm_fuzz::block::block_queues(data);
});
