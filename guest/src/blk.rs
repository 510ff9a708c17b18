//! `blk`: drive the first virtio-blk once through `virtio-drivers`'
//! `VirtIOBlk`: read sector 0, write sector 1, flush (the crate sends it
//! only when FLUSH was negotiated), read sector 1 back, GET_ID. A refused
//! write (a read-only drive) is still tried and shows the device's answer.

use virtio_drivers::device::blk::{VirtIOBlk, SECTOR_SIZE};
use virtio_drivers::transport::DeviceType;

use crate::cmdline::Options;
use crate::devices::{find, status};
use crate::hal::GuestHal;
use crate::say;

/// Runs the `blk` sequence.
pub fn run(options: &Options) {
    let Some(found) = find(options, DeviceType::Block, 0) else {
        say!("blk error no device");
        return;
    };
    let base = found.base;
    let mut blk = match VirtIOBlk::<GuestHal, _>::new(found.transport) {
        Ok(b) => b,
        Err(e) => {
            say!("blk error {}", status(e));
            return;
        }
    };
    say!(
        "blk device at {:#x} capacity {} sectors{}",
        base,
        blk.capacity(),
        if blk.readonly() { " read-only" } else { "" }
    );
    let mut sector = [0u8; SECTOR_SIZE];
    match blk.read_blocks(0, &mut sector) {
        Ok(()) => {
            let mut hex = crate::io::Line::new();
            for b in &sector[..16] {
                let _ = core::fmt::Write::write_fmt(&mut hex, format_args!("{b:02x}"));
            }
            say!("blk sector0 {}", hex.as_str());
        }
        Err(e) => say!("blk sector0 {}", status(e)),
    }
    let pattern = [0xa5u8; SECTOR_SIZE];
    let wrote = blk.write_blocks(1, &pattern);
    match wrote {
        Ok(()) => {
            say!("blk write ok");
            if let Err(e) = blk.flush() {
                say!("blk flush {}", status(e));
            }
        }
        Err(e) => say!("blk write {}", status(e)),
    }
    let mut back = [0u8; SECTOR_SIZE];
    match blk.read_blocks(1, &mut back) {
        Ok(()) if back == pattern => say!("blk readback match"),
        Ok(()) => say!("blk readback mismatch"),
        Err(e) => say!("blk readback {}", status(e)),
    }
    let mut id = [0u8; 20];
    match blk.device_id(&mut id) {
        Ok(n) => {
            let mut text = crate::io::Line::new();
            for &b in &id[..n] {
                let c = if (b' '..=b'~').contains(&b) {
                    b as char
                } else {
                    '?'
                };
                let _ = core::fmt::Write::write_fmt(&mut text, format_args!("{c}"));
            }
            say!("blk id {}", text.as_str());
        }
        Err(e) => say!("blk get_id {}", status(e)),
    }
}
