//! `net=echo`: the first virtio-net through `virtio-drivers`'
//! `VirtIONetRaw`. One broadcast hello frame (EtherType 0x88b5, payload
//! "teravm guest net"), then every frame received of at least 12 bytes is
//! sent back with its two MACs swapped; shorter ones are dropped.
//!
//! `VirtIONetRaw`, not `VirtIONet`: `VirtIONet::send` waits for the used
//! ring with no bound (a device that never completes a transmit would hang
//! the serve loop, and with it every other device), while the raw driver's
//! `transmit_begin` / `poll_transmit` let the wait be bounded by a
//! [`Deadline`] and the device be given up as the firmware does. It also
//! leaves the buffers to us: a few of 2 KiB instead of one per queue entry.
//!
//! The crate accepts MAC, STATUS, EVENT_IDX, INDIRECT_DESC and VERSION_1
//! where offered (no offloads, no MRG_RXBUF), so with VERSION_1 every
//! buffer starts with the 12-byte `virtio_net_hdr_v1`, sent as zeros.

use alloc::boxed::Box;
use alloc::vec::Vec;

use virtio_drivers::device::net::VirtIONetRaw;
use virtio_drivers::transport::{DeviceType, Transport};

use crate::cmdline::Options;
use crate::devices::{find, status, GuestTransport, Serve};
use crate::hal::GuestHal;
use crate::io::Deadline;
use crate::say;

/// Descriptors per queue (QEMU's and Firecracker's queues hold 256).
const QUEUE: usize = 64;
/// Receive buffers posted (each one descriptor: header and frame). The
/// spec asks for buffers of at least 1526 bytes only (5.1.6.3.1, no
/// MRG_RXBUF, no GUEST_TSO/UFO), but Firecracker reads no frame from its
/// tap until the posted buffers add up to 65562 bytes (its
/// `MAX_BUFFER_SIZE`, whatever was negotiated): 33 or more of 2 KiB.
const NRX: usize = 40;
/// Bytes per buffer: at least the spec's 1526 (the crate's minimum).
const BUF: usize = 2048;
/// VIRTIO_NET_F_MAC.
const F_MAC: u64 = 1 << 5;
/// The MAC used when the device gives none (as the firmware's).
const DEFAULT_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 1];
/// The hello frame's payload.
const HELLO: &[u8] = b"teravm guest net";
/// How long one transmit may take before the device is given up.
const TX_TIMEOUT_MS: u64 = 20_000;
/// Most frames echoed in one serve round, so other devices get a turn.
const FRAMES_PER_POLL: usize = 16;

type Dev = VirtIONetRaw<GuestHal, GuestTransport, QUEUE>;

/// The net device left serving.
pub struct Net {
    dev: Dev,
    /// The receive buffers (never resized, so they stay put); the device
    /// may write those in `slot`.
    rx: Vec<[u8; BUF]>,
    /// For each token (head descriptor), the receive buffer it holds.
    slot: [Option<usize>; QUEUE],
    /// The frame being sent.
    tx: Box<[u8; BUF]>,
    /// Frames echoed so far.
    echoed: u64,
    /// False once the device is given up.
    live: bool,
    /// The device's window (what the waits name).
    base: u64,
}

/// `aa:bb:cc:dd:ee:ff`.
struct Mac([u8; 6]);

impl core::fmt::Display for Mac {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let m = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            m[0], m[1], m[2], m[3], m[4], m[5]
        )
    }
}

/// Sets the first virtio-net up, posts the receive buffers and sends the
/// hello frame. `None` (after its line) if there is no device or it fails.
pub fn start(options: &Options) -> Option<Box<dyn Serve>> {
    let Some(mut found) = find(options, DeviceType::Network, 0) else {
        say!("net error no device");
        return None;
    };
    let base = found.base;
    let offered = found.transport.read_device_features();
    let dev = match Dev::new(found.transport) {
        Ok(d) => d,
        Err(e) => {
            say!("net error {}", status(e));
            return None;
        }
    };
    // The crate reads config `mac` whether or not MAC was offered; without
    // MAC the field's contents are not the device's address.
    let mac = if offered & F_MAC != 0 {
        dev.mac_address()
    } else {
        DEFAULT_MAC
    };
    say!(
        "net device at {:#x} features {:#x}",
        base,
        crate::devices::accepted_features()
    );
    let mut net = Box::new(Net {
        dev,
        rx: alloc::vec![[0u8; BUF]; NRX],
        slot: [None; QUEUE],
        tx: Box::new([0u8; BUF]),
        echoed: 0,
        live: true,
        base,
    });
    for i in 0..NRX {
        if let Err(e) = net.post(i) {
            say!("net error {}", status(e));
            return None;
        }
    }
    let hdr = match net.dev.fill_buffer_header(&mut net.tx[..]) {
        Ok(h) => h,
        Err(e) => {
            say!("net error {}", status(e));
            return None;
        }
    };
    let frame = &mut net.tx[hdr..];
    frame[..6].fill(0xff);
    frame[6..12].copy_from_slice(&mac);
    frame[12..14].copy_from_slice(&0x88b5u16.to_be_bytes());
    frame[14..14 + HELLO.len()].copy_from_slice(HELLO);
    if !net.send(hdr + 14 + HELLO.len()) {
        return None;
    }
    say!("net sent hello from {}", Mac(mac));
    if let Some((n, bytes)) = options.net_send {
        // `net-send=`: n frames like the hello, padded to `bytes`.
        let len = (bytes as usize).clamp(14 + HELLO.len(), BUF - hdr);
        for _ in 0..n {
            if !net.send(hdr + len) {
                return None;
            }
        }
        say!("net sent {} frames of {} bytes", n, len);
    }
    Some(net)
}

impl Net {
    /// Posts receive buffer `i` (not in the device's hands now).
    fn post(&mut self, i: usize) -> virtio_drivers::Result<()> {
        // SAFETY: buffer i is ours (not posted), lives as long as the
        // device (both in `self`, which is never dropped while the device
        // may use it: a given-up device is kept, not dropped), and is not
        // touched again until its token comes back from the used ring.
        let token = unsafe { self.dev.receive_begin(&mut self.rx[i][..])? };
        self.slot[usize::from(token)] = Some(i);
        Ok(())
    }

    /// Sends the first `len` bytes of `tx` (header and frame) and waits for
    /// the device to use them. False (after the line) if the device is
    /// given up.
    fn send(&mut self, len: usize) -> bool {
        let frame = &self.tx[..len];
        // SAFETY: `tx` is not touched until the token is used; if it never
        // is, the device is given up and `tx` is never touched again.
        let token = match unsafe { self.dev.transmit_begin(frame) } {
            Ok(t) => t,
            Err(e) => return self.give_up(status(e)),
        };
        let deadline = Deadline::after_ms(TX_TIMEOUT_MS);
        while self.dev.poll_transmit() != Some(token) {
            if deadline.passed() {
                return self.give_up("queue 1 timed out; device given up");
            }
            crate::io::wait_for(self.base, crate::io::WAIT_MS);
        }
        // SAFETY: the same buffer as given to `transmit_begin`.
        match unsafe { self.dev.transmit_complete(token, &self.tx[..len]) } {
            Ok(_) => true,
            Err(e) => self.give_up(status(e)),
        }
    }

    fn give_up(&mut self, why: &str) -> bool {
        say!("net error {}", why);
        self.live = false;
        false
    }

    /// Echoes one received frame, if there is one. False if none.
    fn echo_one(&mut self) -> bool {
        let Some(token) = self.dev.poll_receive() else {
            return false;
        };
        let Some(i) = self.slot.get_mut(usize::from(token)).and_then(Option::take) else {
            self.give_up("used a buffer it was not given");
            return false;
        };
        // SAFETY: buffer i is the one posted with this token.
        let got = unsafe { self.dev.receive_complete(token, &mut self.rx[i][..]) };
        let (hdr, len) = match got {
            Ok(r) => r,
            Err(e) => {
                self.give_up(status(e));
                return false;
            }
        };
        let len = len.min(BUF - hdr);
        let runt = len < 12;
        if !runt {
            self.tx[..hdr + len].copy_from_slice(&self.rx[i][..hdr + len]);
        }
        // The buffer goes back first, as the firmware does.
        if let Err(e) = self.post(i) {
            self.give_up(status(e));
            return false;
        }
        if runt {
            return true;
        }
        // A header of zeros: no offloads were negotiated.
        let _ = self.dev.fill_buffer_header(&mut self.tx[..hdr]);
        let mut dst = [0u8; 6];
        dst.copy_from_slice(&self.tx[hdr..hdr + 6]);
        self.tx.copy_within(hdr + 6..hdr + 12, hdr);
        self.tx[hdr + 6..hdr + 12].copy_from_slice(&dst);
        if !self.send(hdr + len) {
            return false;
        }
        self.echoed += 1;
        if self.echoed <= 16 || self.echoed.is_multiple_of(16) {
            say!("net echoed {} frames", self.echoed);
        }
        true
    }
}

impl Serve for Net {
    fn poll(&mut self) -> bool {
        for _ in 0..FRAMES_PER_POLL {
            if !self.live || !self.echo_one() {
                break;
            }
        }
        self.live
    }

    fn base(&self) -> u64 {
        self.base
    }
}
