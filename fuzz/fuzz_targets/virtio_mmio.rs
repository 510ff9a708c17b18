//! A virtio-balloon behind the virtio-mmio transport, driven by an arbitrary
//! sequence of register accesses (`teravm_fuzz::balloon::virtio_mmio`
//! documents the input and what is checked): never panics, `DRIVER_OK` only
//! after `FEATURES_OK` with the device running, reads fill exactly the bytes
//! asked for.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = teravm_fuzz::balloon::virtio_mmio(data);
});
