//! `blk`: drive the first virtio-blk once through `virtio-drivers`'
//! `VirtIOBlk`: read sector 0, write sector 1, flush (the crate sends it
//! only when FLUSH was negotiated), read sector 1 back, GET_ID. A refused
//! write (a read-only drive) is still tried and shows the device's answer.
//!
//! `blk-read=<MiB>` (issue 26's contract word): read that many MiB from the
//! first drive in 64 KiB requests, one at a time, from sector 0 on (round
//! again from 0 at the end of a smaller drive), and print
//! `blk read <MiB> MiB in <ms> ms` by the guest's TSC clock. After `blk`
//! when both are given.

use virtio_drivers::device::blk::{VirtIOBlk, SECTOR_SIZE};
use virtio_drivers::transport::DeviceType;

use crate::cmdline::Options;
use crate::devices::{find, status};
use crate::hal::GuestHal;
use crate::say;

/// Bytes of one `blk-read=` request.
const READ_CHUNK: usize = 64 << 10;

/// Runs `blk` and `blk-read=`, as the command line asks.
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
        "blk device at {:#x} features {:#x} capacity {} sectors",
        base,
        crate::devices::accepted_features(),
        blk.capacity()
    );
    if options.blk {
        sequence(&mut blk);
    }
    if let Some(mib) = options.blk_read_mib {
        timed_read(&mut blk, mib);
    }
}

/// `blk-read=<MiB>`: 64 KiB requests, timed by the TSC.
fn timed_read<T: virtio_drivers::transport::Transport>(blk: &mut VirtIOBlk<GuestHal, T>, mib: u64) {
    let per = (READ_CHUNK / SECTOR_SIZE) as u64;
    let capacity = blk.capacity();
    if capacity < per {
        say!(
            "blk read error capacity {} sectors (64 KiB needed)",
            capacity
        );
        return;
    }
    let mut buf = alloc::vec![0u8; READ_CHUNK];
    let requests = mib * ((1 << 20) / READ_CHUNK as u64);
    let t0 = crate::io::now_ms();
    let mut sector = 0u64;
    for _ in 0..requests {
        if sector + per > capacity {
            sector = 0;
        }
        if let Err(e) = blk.read_blocks(sector as usize, &mut buf) {
            say!("blk read error {} at sector {}", status(e), sector);
            return;
        }
        sector += per;
    }
    say!("blk read {} MiB in {} ms", mib, crate::io::now_ms() - t0);
}

/// `blk`: read, write, flush, read back, GET_ID.
fn sequence<T: virtio_drivers::transport::Transport>(blk: &mut VirtIOBlk<GuestHal, T>) {
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
