//! `vmem-hostile`: a hostile virtio-mem driver (virtio 1.2, 5.15; device
//! ID 24). It sets the first virtio-mem device up (VERSION_1 and
//! `VIRTIO_MEM_F_UNPLUGGED_INACCESSIBLE`), reads its config, and sends
//! the requests the spec says a device must refuse, beside a few it must
//! take, checking each answer: one line per check, `vmem <check> ok` or
//! `vmem <check> FAILED <detail>`, then `vmem-hostile done <n> checks`
//! (`<f> failed` after it where some failed).
//!
//! The host asks for at least two blocks before the checks that need it
//! (`requested_size` >= 2 blocks; the driver waits for it). The region
//! should span at least two of the VMM's memory slots: the read of
//! unplugged memory reads the region's last block, which then lies in a
//! slot nothing was ever plugged into. That read comes last (Firecracker
//! documents that a guest touching unplugged memory may crash it); the
//! line `vmem reading unplugged memory` comes before it. The request of an
//! unknown type is the last request sent (Firecracker leaves it
//! unanswered).
//!
//! `vmem-touch-unplugged`: plugs the first `requested_size` of the region
//! in one PLUG, writes every page, says `vmem touch-unplugged plugged
//! <bytes>`, waits until the host asks for 0, unplugs it all in one
//! UNPLUG and, as soon as the answer comes, writes and reads every page of
//! it again (a guest that breaks `UNPLUGGED_INACCESSIBLE`), round after
//! round while any page reads back what was written (still in a memslot),
//! then says `vmem touch-unplugged done <kept> of <pages> pages kept,
//! <rounds> rounds, <refaulted> refaulted` (`<kept>`: of the first round;
//! `<refaulted>`: pages that read zero in a later round yet kept its write,
//! freed while still in a memslot).
//!
//! `mem-blk` (issue 34's contract word): waits until the host asks for at
//! least 2 MiB, plugs the first 2 MiB of the region (whole blocks), then
//! reads sector 0 of the first virtio-blk into a buffer at the region's
//! first byte, in plugged memory, as Linux's page cache may sit there, and
//! prints `mem-blk sector0 <32 hex digits of its first 16 bytes>`, or
//! `mem-blk ioerr` if the device refused the request. The buffer is filled
//! with 0xee first: a device that answers OK without writing shows it.

use core::ptr::{read_volatile, write_volatile};

use alloc::boxed::Box;

use virtio_drivers::device::blk::{VirtIOBlk, SECTOR_SIZE};
use virtio_drivers::queue::VirtQueue;
use virtio_drivers::transport::{DeviceStatus, DeviceType, Transport};

use crate::cmdline::Options;
use crate::devices::{find, status, GuestTransport};
use crate::hal::GuestHal;
use crate::io::Deadline;
use crate::{mem, say};

const F_VERSION_1: u64 = 1 << 32;
const F_UNPLUGGED_INACCESSIBLE: u64 = 1 << 1;
const PLUG: u16 = 0;
const UNPLUG: u16 = 1;
const UNPLUG_ALL: u16 = 2;
const STATE: u16 = 3;
const ACK: u16 = 0;
const ERROR: u16 = 3;
const PLUGGED: u16 = 0;
const UNPLUGGED: u16 = 1;
const MIXED: u16 = 2;
/// STATE requests in the flood.
const FLOOD: u32 = 10_000;
/// How long one request may take.
const TIMEOUT_MS: u64 = 30_000;

/// How long the request of an unknown type may take.
const UNKNOWN_TIMEOUT_MS: u64 = 3_000;

type Queue = VirtQueue<GuestHal, 8>;

/// The device's config space (virtio 1.2, 5.15.4).
#[derive(Clone, Copy, Debug)]
struct Config {
    block_size: u64,
    node_id: u16,
    addr: u64,
    region_size: u64,
    usable_region_size: u64,
    plugged_size: u64,
    requested_size: u64,
}

fn read_u64(t: &GuestTransport, offset: usize) -> u64 {
    // Two 32-bit reads: what every virtio-mmio device takes.
    let lo: u32 = t.read_config_space(offset).unwrap_or(0);
    let hi: u32 = t.read_config_space(offset + 4).unwrap_or(0);
    u64::from(lo) | u64::from(hi) << 32
}

fn config(t: &GuestTransport) -> Config {
    let word: u32 = t.read_config_space(8).unwrap_or(0);
    Config {
        block_size: read_u64(t, 0),
        node_id: word as u16,
        addr: read_u64(t, 16),
        region_size: read_u64(t, 24),
        usable_region_size: read_u64(t, 32),
        plugged_size: read_u64(t, 40),
        requested_size: read_u64(t, 48),
    }
}

/// Reset, features, the one queue, DRIVER_OK.
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
    let offered = t.read_device_features();
    let want = F_VERSION_1 | F_UNPLUGGED_INACCESSIBLE;
    if offered & F_VERSION_1 == 0 {
        return Err("device does not offer VERSION_1");
    }
    t.write_driver_features(offered & want);
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

/// The driver: its transport, queue, and the count of checks.
struct Driver {
    /// The device's MMIO base.
    base: u64,
    t: GuestTransport,
    q: Queue,
    req: Box<[u8; 24]>,
    resp: Box<[u8; 10]>,
    checks: u32,
    failed: u32,
    /// A request went unanswered: its buffers stay the device's, and no
    /// more are sent.
    stuck: bool,
}

impl Driver {
    /// Sends one request; (type, state) of the answer, or why none came.
    fn send(&mut self, kind: u16, addr: u64, nb_blocks: u16) -> Result<(u16, u16), &'static str> {
        self.send_within(kind, addr, nb_blocks, TIMEOUT_MS)
    }

    /// [`Driver::send`], waiting at most `ms` for the answer.
    fn send_within(
        &mut self,
        kind: u16,
        addr: u64,
        nb_blocks: u16,
        ms: u64,
    ) -> Result<(u16, u16), &'static str> {
        if self.stuck {
            return Err("an earlier request went unanswered");
        }
        self.req.fill(0);
        self.req[0..2].copy_from_slice(&kind.to_le_bytes());
        self.req[8..16].copy_from_slice(&addr.to_le_bytes());
        self.req[16..18].copy_from_slice(&nb_blocks.to_le_bytes());
        self.resp.fill(0xff);
        // SAFETY: the buffers are not touched until the device has used
        // them (popped below); if it never does, they are leaked and the
        // device failed.
        let token =
            unsafe { self.q.add(&[&self.req[..]], &mut [&mut self.resp[..]]) }.map_err(status)?;
        self.t.notify(0);
        let deadline = Deadline::after_ms(ms);
        while !self.q.can_pop() {
            if deadline.passed() {
                self.stuck = true;
                return Err("no answer");
            }
            core::hint::spin_loop();
        }
        // SAFETY: the same buffers as given to `add`.
        unsafe {
            self.q
                .pop_used(token, &[&self.req[..]], &mut [&mut self.resp[..]])
        }
        .map_err(status)?;
        let r = &self.resp;
        Ok((
            u16::from_le_bytes([r[0], r[1]]),
            u16::from_le_bytes([r[8], r[9]]),
        ))
    }

    /// Records one check.
    fn check(&mut self, name: &str, ok: bool, detail: core::fmt::Arguments) {
        self.checks += 1;
        if ok {
            say!("vmem {} ok", name);
        } else {
            self.failed += 1;
            say!("vmem {} FAILED {}", name, detail);
        }
    }

    /// Sends a request and checks its answer's type (and state, if given).
    fn expect(&mut self, name: &str, req: (u16, u64, u16), want: u16, state: Option<u16>) {
        let got = self.send(req.0, req.1, req.2);
        let ok = match got {
            Ok((ty, st)) => ty == want && state.is_none_or(|s| s == st),
            Err(_) => false,
        };
        self.check(
            name,
            ok,
            format_args!(
                "request {} addr {:#x} nb_blocks {}: want {} state {:?}, got {:?}",
                req.0, req.1, req.2, want, state, got
            ),
        );
    }
}

/// `vmem-hostile`.
pub fn run(options: &Options) {
    let Some((mut d, c)) = open(options, "vmem-hostile") else {
        return;
    };
    say!(
        "vmem device at {:#x} block {:#x} node {} region {:#x}+{:#x} usable {:#x} plugged {:#x} requested {:#x}",
        d.base,
        c.block_size,
        c.node_id,
        c.addr,
        c.region_size,
        c.usable_region_size,
        c.plugged_size,
        c.requested_size
    );
    if c.block_size == 0 || c.region_size < 2 * c.block_size {
        say!("vmem error a region of fewer than two blocks");
        return;
    }
    // The host asks for two blocks; wait for it (it may PATCH after boot).
    let Some(c) = wait_requested(&d, |r| r >= 2 * c.block_size) else {
        return;
    };
    checks(&mut d, &c);
    say!("vmem reading unplugged memory");
    let last = c.addr + c.region_size - c.block_size;
    unplugged_read(&mut d, last);
    if d.failed == 0 {
        say!("vmem-hostile done {} checks", d.checks);
    } else {
        say!("vmem-hostile done {} checks {} failed", d.checks, d.failed);
    }
}

/// The device set up, its config, and a driver; None (said) if not.
fn open(options: &Options, what: &str) -> Option<(Driver, Config)> {
    let Some(found) = find(options, DeviceType::Memory, 0) else {
        say!("vmem error no device");
        return None;
    };
    let mut t = found.transport;
    let q = match init(&mut t) {
        Ok(q) => q,
        Err(why) => {
            t.set_status(DeviceStatus::FAILED);
            say!("vmem error {}", why);
            return None;
        }
    };
    let c = config(&t);
    if !mem::map_range(c.addr, c.addr + c.region_size) {
        say!("vmem error cannot map the region for {}", what);
        return None;
    }
    let d = Driver {
        base: found.base,
        t,
        q,
        req: Box::new([0; 24]),
        resp: Box::new([0; 10]),
        checks: 0,
        failed: 0,
        stuck: false,
    };
    Some((d, c))
}

/// Waits until `ok(requested_size)`, at most 60 s; the config then.
fn wait_requested(d: &Driver, ok: impl Fn(u64) -> bool) -> Option<Config> {
    let deadline = Deadline::after_ms(60_000);
    loop {
        let c = config(&d.t);
        if ok(c.requested_size) {
            return Some(c);
        }
        if deadline.passed() {
            say!("vmem error requested_size stayed {:#x}", c.requested_size);
            return None;
        }
        core::hint::spin_loop();
    }
}

/// `vmem-touch-unplugged` (see the top).
pub fn touch_unplugged(options: &Options) {
    let Some((mut d, c)) = open(options, "vmem-touch-unplugged") else {
        return;
    };
    let b = c.block_size.max(1);
    let Some(c) = wait_requested(&d, |r| r >= b) else {
        return;
    };
    let blocks = u16::try_from(c.requested_size / b).unwrap_or(u16::MAX);
    let (a, bytes) = (c.addr, u64::from(blocks) * b);
    if d.send(PLUG, a, blocks) != Ok((ACK, 0)) {
        say!("vmem error plug of {} blocks refused", blocks);
        return;
    }
    for off in (0..bytes).step_by(4096) {
        // SAFETY: plugged just now, identity-mapped by `open`.
        unsafe { write_volatile((a + off) as *mut u64, !(a + off)) };
    }
    say!("vmem touch-unplugged plugged {}", bytes);
    if wait_requested(&d, |r| r == 0).is_none() {
        return;
    }
    if d.send(UNPLUG, a, blocks) != Ok((ACK, 0)) {
        say!("vmem error unplug of {} blocks refused", blocks);
        return;
    }
    // At once, and again while any page still reads back what was written
    // (the slot is still in KVM), for at most 30 s: whatever the device
    // frees while the guest can still fault a page back in would stay.
    let deadline = Deadline::after_ms(30_000);
    let (mut first, mut rounds, mut refaulted) = (None, 0u64, 0u64);
    loop {
        rounds += 1;
        let mut kept = 0u64;
        for off in (0..bytes).step_by(4096) {
            let p = (a + off) as *mut u64;
            // SAFETY: mapped by `open`; the VMM answers a page outside its
            // memslots (unplugged memory) as MMIO.
            let before = unsafe { read_volatile(p) };
            // SAFETY: as above.
            unsafe { write_volatile(p, a + off + rounds) };
            // SAFETY: as above.
            if unsafe { read_volatile(p) } == a + off + rounds {
                kept += 1;
                // Zero before the write, yet the write stayed: the page
                // was freed while still in a memslot, and came back.
                if rounds > 1 && before == 0 {
                    refaulted += 1;
                }
            }
        }
        first.get_or_insert(kept);
        if kept == 0 || deadline.passed() {
            break;
        }
    }
    say!(
        "vmem touch-unplugged done {} of {} pages kept, {} rounds, {} refaulted",
        first.unwrap_or(0),
        bytes / 4096,
        rounds,
        refaulted
    );
}

/// The requests, in order; the plugged block is the region's first.
fn checks(d: &mut Driver, c: &Config) {
    let (a, b) = (c.addr, c.block_size);
    let blocks = |bytes: u64| u16::try_from(bytes / b).unwrap_or(u16::MAX);
    let end = a + c.region_size;
    d.expect("plug-past-end", (PLUG, end, 1), ERROR, None);
    d.expect("plug-straddling-end", (PLUG, end - b, 2), ERROR, None);
    d.expect("plug-below-region", (PLUG, a - b, 1), ERROR, None);
    d.expect("plug-unaligned", (PLUG, a + 4096, 1), ERROR, None);
    d.expect("plug-zero-blocks", (PLUG, a, 0), ERROR, None);
    d.expect("plug-overflow", (PLUG, u64::MAX - b + 1, 2), ERROR, None);
    let too_many = blocks(c.requested_size) + 1;
    d.expect("plug-beyond-requested", (PLUG, a, too_many), ERROR, None);
    d.expect("unplug-never-plugged", (UNPLUG, a, 1), ERROR, None);
    d.expect("plug-one", (PLUG, a, 1), ACK, None);
    d.expect("plug-overlapping", (PLUG, a, 1), ERROR, None);
    d.expect("plug-overlapping-two", (PLUG, a, 2), ERROR, None);
    d.expect("state-plugged", (STATE, a, 1), ACK, Some(PLUGGED));
    d.expect("state-mixed", (STATE, a, 2), ACK, Some(MIXED));
    d.expect("state-outside", (STATE, end, 1), ERROR, None);
    // The flood: one block at a time over the usable region.
    let usable = blocks(c.usable_region_size).max(1);
    let mut bad = None;
    for i in 0..FLOOD {
        let k = u64::from(i % u32::from(usable));
        let want = if k == 0 { PLUGGED } else { UNPLUGGED };
        match d.send(STATE, a + k * b, 1) {
            Ok((ACK, s)) if s == want => {}
            other => {
                bad = Some((i, other));
                break;
            }
        }
    }
    d.check(
        "state-flood",
        bad.is_none(),
        format_args!("{} requests: first bad {:?}", FLOOD, bad),
    );
    // The plugged block is memory: written, read back.
    let mut wrong = None;
    for off in (0..b).step_by(4096) {
        // SAFETY: the block the device just plugged, identity-mapped.
        unsafe { write_volatile((a + off) as *mut u64, a + off) };
    }
    for off in (0..b).step_by(4096) {
        // SAFETY: as above.
        let v = unsafe { read_volatile((a + off) as *const u64) };
        if v != a + off && wrong.is_none() {
            wrong = Some((a + off, v));
        }
    }
    d.check(
        "plugged-readback",
        wrong.is_none(),
        format_args!("first wrong (addr, value) {:?}", wrong),
    );
    d.expect("unplug-two-one-plugged", (UNPLUG, a, 2), ERROR, None);
    d.expect("unplug-one", (UNPLUG, a, 1), ACK, None);
    d.expect("state-after-unplug", (STATE, a, 2), ACK, Some(UNPLUGGED));
    d.expect("unplug-all", (UNPLUG_ALL, 0, 0), ACK, None);
    // Last of the requests: Firecracker answers an unknown type with
    // nothing at all (its queue handler returns an error), so the wait is
    // short and nothing is sent after it.
    let got = d.send_within(7, a, 1, UNKNOWN_TIMEOUT_MS);
    d.check(
        "unknown-type",
        matches!(got, Ok((ERROR, _))),
        format_args!("request 7: want {}, got {:?}", ERROR, got),
    );
}

/// Reads, writes, reads again the block at `at`, never plugged.
fn unplugged_read(d: &mut Driver, at: u64) {
    let p = at as *mut u64;
    // SAFETY: mapped by `map_range`; the VMM answers it (unplugged
    // memory), or does not (then the guest does not go on).
    let before = unsafe { read_volatile(p) };
    d.check(
        "unplugged-read",
        before == 0,
        format_args!("{:#x} read {:#x}", at, before),
    );
    // SAFETY: as above.
    unsafe { write_volatile(p, 0x5a5a_5a5a_5a5a_5a5a) };
    // SAFETY: as above.
    let after = unsafe { read_volatile(p) };
    d.check(
        "unplugged-write-dropped",
        after == 0,
        format_args!("{:#x} read {:#x} after a write", at, after),
    );
}

/// Bytes `mem-blk` plugs.
const MEM_BLK_BYTES: u64 = 2 << 20;

/// `mem-blk` (see the top).
pub fn mem_blk(options: &Options) {
    let Some((mut d, c)) = open(options, "mem-blk") else {
        return;
    };
    let b = c.block_size.max(1);
    let want = MEM_BLK_BYTES.div_ceil(b) * b;
    if c.region_size < want {
        say!("mem-blk error a region of {:#x} bytes", c.region_size);
        return;
    }
    // The driver is up: a VMM that takes the target only then (Firecracker)
    // can be asked now.
    say!("mem-blk waiting for {} bytes", want);
    let Some(c) = wait_requested(&d, |r| r >= want) else {
        return;
    };
    let blocks = u16::try_from(want / b).unwrap_or(u16::MAX);
    match d.send(PLUG, c.addr, blocks) {
        Ok((ACK, _)) => {}
        other => {
            say!("mem-blk error plug of {} blocks: {:?}", blocks, other);
            return;
        }
    }
    let Some(found) = find(options, DeviceType::Block, 0) else {
        say!("mem-blk error no block device");
        return;
    };
    let mut blk = match VirtIOBlk::<GuestHal, _>::new(found.transport) {
        Ok(blk) => blk,
        Err(e) => {
            say!("mem-blk error {}", status(e));
            return;
        }
    };
    // SAFETY: the region's first 2 MiB are plugged (answered ACK above) and
    // identity-mapped by `open`; nothing else in the guest uses them.
    let buf = unsafe { core::slice::from_raw_parts_mut(c.addr as *mut u8, SECTOR_SIZE) };
    buf.fill(0xee);
    match blk.read_blocks(0, buf) {
        Ok(()) => {
            let mut hex = crate::io::Line::new();
            for byte in &buf[..16] {
                let _ = core::fmt::Write::write_fmt(&mut hex, format_args!("{byte:02x}"));
            }
            say!("mem-blk sector0 {}", hex.as_str());
        }
        Err(virtio_drivers::Error::IoError | virtio_drivers::Error::Unsupported) => {
            say!("mem-blk ioerr")
        }
        Err(e) => say!("mem-blk error {}", status(e)),
    }
}
