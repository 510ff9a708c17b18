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
//!
//! `blk-dev=<n>`: drive the `n`-th virtio-blk of the command line (from 0)
//! instead of the first.
//!
//! `blk-watch`: read sector 0 (`blk sector0 <hex>`, or the error's word),
//! then keep the drive and watch it as Linux's virtio-blk does: on each
//! configuration-change interrupt (`InterruptStatus` bit 1, acknowledged
//! as Linux's `vm_interrupt` does) read the capacity from the config space
//! again (around `ConfigGeneration`, as `virtio_cread` does), print `blk
//! config capacity <N> sectors`, and read sector 0 again (`blk sector0
//! ...`). This is how a guest sees a drive whose backing file the host
//! replaced (`PATCH /drives/{id}` with a new `path_on_host`). After `blk`
//! when both are given; the watch then runs in the serve loop (`then=idle`).

use alloc::boxed::Box;
use core::ptr::{read_volatile, write_volatile};

use virtio_drivers::device::blk::{VirtIOBlk, SECTOR_SIZE};
use virtio_drivers::transport::DeviceType;

use crate::cmdline::Options;
use crate::devices::{find, status, GuestTransport, Serve};
use crate::hal::GuestHal;
use crate::say;

/// Bytes of one `blk-read=` request.
const READ_CHUNK: usize = 64 << 10;

/// Runs `blk`, `blk-read=` and `blk-watch`, as the command line asks;
/// with `blk-watch`, returns the watch for the serve loop.
pub fn run(options: &Options) -> Option<Box<dyn Serve>> {
    let Some(found) = find(options, DeviceType::Block, options.blk_dev) else {
        say!("blk error no device");
        return None;
    };
    let base = found.base;
    let mut blk = match VirtIOBlk::<GuestHal, _>::new(found.transport) {
        Ok(b) => b,
        Err(e) => {
            say!("blk error {}", status(e));
            return None;
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
    if !options.blk_watch {
        return None;
    }
    say_sector0(&mut blk);
    Some(Box::new(Watch { blk, base }))
}

/// `blk-watch`: the drive, kept.
struct Watch {
    blk: VirtIOBlk<GuestHal, GuestTransport>,
    base: u64,
}

/// Offsets in a virtio-mmio window (virtio 1.2, 4.2.2).
const INTERRUPT_STATUS: u64 = 0x60;
const INTERRUPT_ACK: u64 = 0x64;
const CONFIG_GENERATION: u64 = 0xfc;
const CONFIG: u64 = 0x100;
/// InterruptStatus: the configuration changed.
const INT_CONFIG: u32 = 1 << 1;

impl Watch {
    /// A 32-bit register of the device's window.
    fn reg(&self, off: u64) -> u32 {
        // SAFETY: `base` is the device's identity-mapped, uncached
        // virtio-mmio window (`find`), whose registers these are; the
        // reads have no side effect.
        unsafe { read_volatile((self.base + off) as *const u32) }
    }

    /// The capacity in the config space (`virtio_blk_config.capacity`,
    /// le64 at offset 0), read as two 32-bit words between two equal
    /// `ConfigGeneration` reads.
    fn capacity(&self) -> u64 {
        let reg = |off| self.reg(off);
        loop {
            let generation = reg(CONFIG_GENERATION);
            let low = u64::from(reg(CONFIG));
            let high = u64::from(reg(CONFIG + 4));
            if reg(CONFIG_GENERATION) == generation {
                return low | high << 32;
            }
        }
    }
}

impl Serve for Watch {
    fn poll(&mut self) -> bool {
        // Linux's `vm_interrupt`: read InterruptStatus, write what was set
        // to InterruptACK. The used-buffer bit is acknowledged too: the
        // driver polls its used ring, as it does everywhere here.
        let status = self.reg(INTERRUPT_STATUS);
        if status != 0 {
            // SAFETY: as in `reg`; InterruptACK takes the bits to clear.
            unsafe { write_volatile((self.base + INTERRUPT_ACK) as *mut u32, status) };
        }
        // The serve loop's wait (`io::wait_for`) acknowledges what it woke
        // for, as an interrupt handler would, and keeps a config change.
        if status & INT_CONFIG != 0 || crate::io::take_config_change(self.base) {
            say!("blk config capacity {} sectors", self.capacity());
            say_sector0(&mut self.blk);
        }
        true
    }

    fn base(&self) -> u64 {
        self.base
    }
}

/// Reads sector 0 and prints its first 16 bytes, or the error's word.
fn say_sector0<T: virtio_drivers::transport::Transport>(blk: &mut VirtIOBlk<GuestHal, T>) {
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
    say_sector0(blk);
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
