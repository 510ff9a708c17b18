//! `rng=<bytes>`: reads that many bytes from the first virtio-rng (virtio
//! 1.x, 5.4; `virtio-drivers` has no driver for it, so this is a minimal
//! one on the crate's transport and `VirtQueue`): one queue, one writable
//! buffer of up to [`CHUNK`] bytes at a time, each waited for with a
//! deadline. Says `rng <n> bytes <first 16 bytes in hex>` and then
//! `rng took <ms> ms`, or `rng error ...`. With `rng-dump` it keeps every
//! byte (the first [`DUMP_MAX`]) and, after those two lines, prints them:
//! `rng data <offset> <hex>`, [`DUMP_LINE`] bytes a line, then
//! `rng data end <n>` (the printing is not in the time taken).

use alloc::boxed::Box;
use alloc::vec::Vec;

use virtio_drivers::queue::VirtQueue;
use virtio_drivers::transport::{DeviceStatus, DeviceType, Transport};

use crate::cmdline::Options;
use crate::devices::{find, status, GuestTransport};
use crate::hal::GuestHal;
use crate::io::{self, Deadline};
use crate::say;

const F_VERSION_1: u64 = 1 << 32;
/// Bytes asked for in one request.
const CHUNK: usize = 4096;
/// How long one request may take (a rate limiter holds them).
const TIMEOUT_MS: u64 = 60_000;

/// Bytes `rng-dump` keeps and prints at most.
const DUMP_MAX: usize = 4 << 20;
/// Bytes of one `rng data` line.
const DUMP_LINE: usize = 128;

type Queue = VirtQueue<GuestHal, 8>;

/// Sets the device up: reset, features (VERSION_1 only), the queue,
/// DRIVER_OK. The error words on failure.
fn init(t: &mut GuestTransport) -> Result<Queue, &'static str> {
    t.set_status(DeviceStatus::empty());
    let deadline = Deadline::after_ms(10_000);
    while t.get_status() != DeviceStatus::empty() {
        if deadline.passed() {
            return Err("device reset did not complete");
        }
        core::hint::spin_loop();
    }
    t.set_status(DeviceStatus::ACKNOWLEDGE | DeviceStatus::DRIVER);
    if t.read_device_features() & F_VERSION_1 == 0 {
        return Err("device does not offer VERSION_1");
    }
    t.write_driver_features(F_VERSION_1);
    let ok = DeviceStatus::ACKNOWLEDGE | DeviceStatus::DRIVER | DeviceStatus::FEATURES_OK;
    t.set_status(ok);
    if !t.get_status().contains(DeviceStatus::FEATURES_OK) {
        return Err("device refused the features");
    }
    let mut q = Queue::new(t, 0, false, false).map_err(|_| "queue 0 unusable")?;
    q.set_dev_notify(false);
    t.set_status(ok | DeviceStatus::DRIVER_OK);
    Ok(q)
}

/// `rng=<bytes>`.
pub fn run(options: &Options, want: u64) {
    let Some(found) = find(options, DeviceType::EntropySource, 0) else {
        say!("rng error no device");
        return;
    };
    let mut t = found.transport;
    let mut q = match init(&mut t) {
        Ok(q) => q,
        Err(why) => {
            t.set_status(DeviceStatus::FAILED);
            say!("rng error {}", why);
            return;
        }
    };
    say!("rng device at {:#x}", found.base);
    let mut buf: Box<[u8; CHUNK]> = Box::new([0; CHUNK]);
    let mut first = [0u8; 16];
    let mut kept: Vec<u8> = if options.rng_dump {
        Vec::with_capacity((want as usize).min(DUMP_MAX))
    } else {
        Vec::new()
    };
    let (mut got, mut nfirst) = (0u64, 0usize);
    let t0 = io::now_ms();
    while got < want {
        let ask = (want - got).min(CHUNK as u64) as usize;
        // SAFETY: `buf` is not touched until the device has used it (popped
        // below); if it never is, the device is failed and `buf` leaked.
        let token = match unsafe { q.add(&[], &mut [&mut buf[..ask]]) } {
            Ok(tk) => tk,
            Err(e) => {
                say!("rng error {}", status(e));
                return;
            }
        };
        t.notify(0);
        let deadline = Deadline::after_ms(TIMEOUT_MS);
        while !q.can_pop() {
            if deadline.passed() {
                t.set_status(DeviceStatus::FAILED);
                core::mem::forget(buf);
                say!("rng error queue 0 timed out; device given up");
                return;
            }
            io::wait_for(found.base, io::WAIT_MS);
        }
        // SAFETY: the same buffer as given to `add`.
        let n = match unsafe { q.pop_used(token, &[], &mut [&mut buf[..ask]]) } {
            Ok(n) => (n as usize).min(ask),
            Err(e) => {
                say!("rng error {}", status(e));
                return;
            }
        };
        if n == 0 {
            say!("rng error the device gave 0 bytes");
            return;
        }
        let k = n.min(16 - nfirst);
        first[nfirst..nfirst + k].copy_from_slice(&buf[..k]);
        nfirst += k;
        if options.rng_dump {
            let keep = n.min(DUMP_MAX - kept.len());
            kept.extend_from_slice(&buf[..keep]);
        }
        got += n as u64;
    }
    let ms = io::now_ms() - t0;
    let mut hex = [0u8; 32];
    say!("rng {} bytes {}", got, to_hex(&first[..nfirst], &mut hex));
    say!("rng took {} ms", ms);
    if options.rng_dump {
        let mut hex = [0u8; 2 * DUMP_LINE];
        for (i, line) in kept.chunks(DUMP_LINE).enumerate() {
            say!("rng data {} {}", i * DUMP_LINE, to_hex(line, &mut hex));
        }
        say!("rng data end {}", kept.len());
    }
}

/// `bytes` in lower-case hex, written into `out` (twice their length).
fn to_hex<'a>(bytes: &[u8], out: &'a mut [u8]) -> &'a str {
    const D: &[u8; 16] = b"0123456789abcdef";
    for (i, b) in bytes.iter().enumerate() {
        out[2 * i] = D[usize::from(b >> 4)];
        out[2 * i + 1] = D[usize::from(b & 15)];
    }
    core::str::from_utf8(&out[..2 * bytes.len()]).unwrap_or("")
}
