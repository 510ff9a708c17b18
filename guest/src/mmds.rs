//! `mmds=<path>`: fetch `<path>` from the MMDS over the first virtio-net
//! with smoltcp (a TCP/IP stack made for this) over `VirtIONetRaw`, and
//! print `mmds <http-status> <first 200 bytes of the body>` on one line
//! (`\r` and `\n` as spaces).
//!
//! First `PUT /latest/api/token` with `X-metadata-token-ttl-seconds: 60`;
//! if that gives 200, its body is sent as `X-metadata-token` on the `GET`
//! (so the same words work for MMDS V1 and V2); `mmds-no-token` skips
//! that (a V2 MMDS then answers 401). `mmds-watch`: then the same `GET`
//! again until the answer changes, its line, and `mmds watched <n> gets`
//! (see [`watch`]; for a test that replaces the data while the guest
//! runs). Each request on its own
//! connection, HTTP/1.1 with `Host:` and `Connection: close`, read until
//! its `Content-Length` is met or the server closes. The MMDS address is
//! 169.254.169.254 unless `mmds-addr=`; the guest's own 169.254.0.2/16
//! unless `mmds-ip=` (the MMDS address is also the default route, for a
//! `mmds-addr=` outside that network). Everything has a deadline: a device
//! or an MMDS that never answers gives `mmds error <why>`, never a hang.

use alloc::string::String;
use alloc::vec;
use alloc::vec::Vec;
use core::fmt::Write;

use smoltcp::iface::{Config, Interface, SocketSet};
use smoltcp::phy::{self, DeviceCapabilities, Medium};
use smoltcp::socket::tcp;
use smoltcp::time::Instant;
use smoltcp::wire::{EthernetAddress, HardwareAddress, IpAddress, IpCidr, Ipv4Address};
use virtio_drivers::device::net::VirtIONetRaw;
use virtio_drivers::transport::{DeviceType, Transport};

use crate::cmdline::Options;
use crate::devices::{find, status, GuestTransport};
use crate::hal::GuestHal;
use crate::io::{now_ms, Deadline};
use crate::say;

const QUEUE: usize = 64;
/// Receive buffers posted (Firecracker reads its tap only once 65562 bytes
/// of buffers are posted; see net.rs).
const NRX: usize = 40;
const BUF: usize = 2048;
const F_MAC: u64 = 1 << 5;
const DEFAULT_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 1];
/// One request's whole deadline (connect, send, receive).
const REQUEST_MS: u64 = 30_000;
/// One transmit's.
const TX_MS: u64 = 5_000;
/// Most bytes of a response kept.
const MAX_RESPONSE: usize = 64 * 1024;
/// `mmds-watch`: how long it asks, and the pause between two `GET`s.
const WATCH_MS: u64 = 30_000;
const WATCH_PAUSE_MS: u64 = 50;

type Dev = VirtIONetRaw<GuestHal, GuestTransport, QUEUE>;

/// The device, its buffers, for smoltcp.
struct Nic {
    dev: Dev,
    rx: Vec<[u8; BUF]>,
    slot: [Option<usize>; QUEUE],
    tx: Vec<u8>,
    failed: Option<&'static str>,
    /// The device's window (what the waits name).
    base: u64,
}

struct RxToken(Vec<u8>);
struct TxToken<'a>(&'a mut Nic);

impl phy::RxToken for RxToken {
    fn consume<R, F: FnOnce(&[u8]) -> R>(self, f: F) -> R {
        f(&self.0)
    }
}

impl phy::TxToken for TxToken<'_> {
    fn consume<R, F: FnOnce(&mut [u8]) -> R>(self, len: usize, f: F) -> R {
        let nic = self.0;
        let hdr = nic.dev.fill_buffer_header(&mut nic.tx[..]).unwrap_or(12);
        let len = len.min(BUF - hdr);
        let r = f(&mut nic.tx[hdr..hdr + len]);
        nic.send(hdr + len);
        r
    }
}

impl Nic {
    fn post(&mut self, i: usize) -> virtio_drivers::Result<()> {
        // SAFETY: buffer i is ours (not posted), lives as long as the
        // device (both in `self`, kept until the guest parks), and is not
        // touched until its token comes back from the used ring.
        let token = unsafe { self.dev.receive_begin(&mut self.rx[i][..])? };
        self.slot[usize::from(token)] = Some(i);
        Ok(())
    }

    fn send(&mut self, len: usize) {
        if self.failed.is_some() {
            return;
        }
        // SAFETY: `tx` is not touched until the token is used; if it never
        // is, the device is given up (`failed`) and never used again.
        let token = match unsafe { self.dev.transmit_begin(&self.tx[..len]) } {
            Ok(t) => t,
            Err(e) => {
                self.failed = Some(status(e));
                return;
            }
        };
        let deadline = Deadline::after_ms(TX_MS);
        while self.dev.poll_transmit() != Some(token) {
            if deadline.passed() {
                self.failed = Some("transmit timed out");
                return;
            }
            crate::io::wait_for(self.base, crate::io::WAIT_MS);
        }
        // SAFETY: the same buffer as given to `transmit_begin`.
        if let Err(e) = unsafe { self.dev.transmit_complete(token, &self.tx[..len]) } {
            self.failed = Some(status(e));
        }
    }
}

impl phy::Device for Nic {
    type RxToken<'a> = RxToken;
    type TxToken<'a> = TxToken<'a>;

    fn receive(&mut self, _: Instant) -> Option<(Self::RxToken<'_>, Self::TxToken<'_>)> {
        if self.failed.is_some() {
            return None;
        }
        let token = self.dev.poll_receive()?;
        let Some(i) = self.slot.get_mut(usize::from(token)).and_then(Option::take) else {
            self.failed = Some("used a buffer it was not given");
            return None;
        };
        // SAFETY: buffer i is the one posted with this token.
        let got = unsafe { self.dev.receive_complete(token, &mut self.rx[i][..]) };
        let frame = match got {
            Ok((hdr, len)) => self.rx[i][hdr..hdr + len.min(BUF - hdr)].to_vec(),
            Err(e) => {
                self.failed = Some(status(e));
                return None;
            }
        };
        if let Err(e) = self.post(i) {
            self.failed = Some(status(e));
            return None;
        }
        Some((RxToken(frame), TxToken(self)))
    }

    fn transmit(&mut self, _: Instant) -> Option<Self::TxToken<'_>> {
        self.failed.is_none().then_some(TxToken(self))
    }

    fn capabilities(&self) -> DeviceCapabilities {
        let mut caps = DeviceCapabilities::default();
        caps.medium = Medium::Ethernet;
        caps.max_transmission_unit = 1514;
        caps
    }
}

fn now() -> Instant {
    Instant::from_millis(now_ms() as i64)
}

/// A response: status and body.
struct Reply {
    status: u16,
    body: Vec<u8>,
}

/// The status and body of a whole response in `buf`, once it is whole
/// (`closed`: the server closed, so what is there is all).
fn parse_reply(buf: &[u8], closed: bool) -> Option<Reply> {
    let head_end = buf.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = core::str::from_utf8(&buf[..head_end]).ok()?;
    let status = head.split(' ').nth(1)?.trim().parse().ok()?;
    let length = head.split("\r\n").find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim()
            .eq_ignore_ascii_case("content-length")
            .then(|| v.trim().parse::<usize>().ok())?
    });
    let body = &buf[head_end + 4..];
    match length {
        Some(n) if body.len() >= n => Some(Reply {
            status,
            body: body[..n].to_vec(),
        }),
        _ if closed => Some(Reply {
            status,
            body: body.to_vec(),
        }),
        _ => None,
    }
}

struct Stack {
    nic: Nic,
    iface: Interface,
    sockets: SocketSet<'static>,
    mmds: Ipv4Address,
    next_port: u16,
}

impl Stack {
    /// `ms` of the stack running (answering what comes) and nothing sent
    /// of ours.
    fn pause(&mut self, ms: u64) {
        let until = Deadline::after_ms(ms);
        while !until.passed() {
            self.iface.poll(now(), &mut self.nic, &mut self.sockets);
            crate::io::wait_for(self.nic.base, ms.min(u64::from(crate::io::WAIT_MS)) as u16);
        }
    }

    /// One request on a new connection.
    fn request(&mut self, text: &str) -> Result<Reply, &'static str> {
        let socket = tcp::Socket::new(
            tcp::SocketBuffer::new(vec![0; 16 * 1024]),
            tcp::SocketBuffer::new(vec![0; 4096]),
        );
        let handle = self.sockets.add(socket);
        self.next_port = self.next_port.wrapping_add(1).max(49152);
        let remote = (IpAddress::Ipv4(self.mmds), 80);
        let s = self.sockets.get_mut::<tcp::Socket>(handle);
        if s.connect(self.iface.context(), remote, self.next_port)
            .is_err()
        {
            self.sockets.remove(handle);
            return Err("cannot connect");
        }
        let deadline = Deadline::after_ms(REQUEST_MS);
        let (mut sent, mut got) = (0usize, Vec::new());
        let result = loop {
            self.iface.poll(now(), &mut self.nic, &mut self.sockets);
            if let Some(why) = self.nic.failed {
                break Err(why);
            }
            let s = self.sockets.get_mut::<tcp::Socket>(handle);
            if s.can_send() && sent < text.len() {
                sent += s.send_slice(&text.as_bytes()[sent..]).unwrap_or(0);
            }
            while s.can_recv() && got.len() < MAX_RESPONSE {
                let mut chunk = [0u8; 2048];
                match s.recv_slice(&mut chunk) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => got.extend_from_slice(&chunk[..n]),
                }
            }
            let closed = sent == text.len() && !s.may_recv();
            if let Some(reply) = parse_reply(&got, closed) {
                break Ok(reply);
            }
            if closed || (!s.is_open() && sent < text.len()) {
                break Err("connection closed");
            }
            if deadline.passed() {
                break Err("timed out");
            }
            // Asleep until a frame or a used tx buffer (well under
            // smoltcp's retransmission times).
            crate::io::wait_for(self.nic.base, crate::io::WAIT_MS);
        };
        // Close and let the FIN go (bounded); then forget the socket.
        self.sockets.get_mut::<tcp::Socket>(handle).close();
        let linger = Deadline::after_ms(500);
        while !linger.passed() {
            self.iface.poll(now(), &mut self.nic, &mut self.sockets);
            let s = self.sockets.get_mut::<tcp::Socket>(handle);
            if !s.is_open() || s.state() == tcp::State::TimeWait {
                break;
            }
        }
        self.sockets.get_mut::<tcp::Socket>(handle).abort();
        self.iface.poll(now(), &mut self.nic, &mut self.sockets);
        self.sockets.remove(handle);
        result
    }
}

/// Sets the device and stack up: `None` after an error line.
fn stack(options: &Options) -> Option<Stack> {
    let Some(mut found) = find(options, DeviceType::Network, 0) else {
        say!("mmds error no net device");
        return None;
    };
    let offered = found.transport.read_device_features();
    let base = found.base;
    let dev = match Dev::new(found.transport) {
        Ok(d) => d,
        Err(e) => {
            say!("mmds error {}", status(e));
            return None;
        }
    };
    let mac = if offered & F_MAC != 0 {
        dev.mac_address()
    } else {
        DEFAULT_MAC
    };
    let mut nic = Nic {
        dev,
        rx: vec![[0u8; BUF]; NRX],
        slot: [None; QUEUE],
        tx: vec![0u8; BUF],
        failed: None,
        base,
    };
    for i in 0..NRX {
        if let Err(e) = nic.post(i) {
            say!("mmds error {}", status(e));
            return None;
        }
    }
    let mut config = Config::new(HardwareAddress::Ethernet(EthernetAddress(mac)));
    config.random_seed = now_ms();
    let mut iface = Interface::new(config, &mut nic, now());
    let [a, b, c, d] = options.mmds_ip;
    iface.update_ip_addrs(|addrs| {
        let _ = addrs.push(IpCidr::new(IpAddress::v4(a, b, c, d), 16));
    });
    let [a, b, c, d] = options.mmds_addr;
    let mmds = Ipv4Address::new(a, b, c, d);
    let _ = iface.routes_mut().add_default_ipv4_route(mmds);
    Some(Stack {
        nic,
        iface,
        sockets: SocketSet::new(Vec::new()),
        mmds,
        next_port: 49152,
    })
}

/// Bytes as text: ASCII as it is (`\r`, `\n` and other controls as
/// spaces), anything else as `?`. (Not `from_utf8_lossy` or `format!`:
/// liballoc's prebuilt ones need an unwinder the guest has not.)
fn one_line(bytes: &[u8]) -> String {
    bytes
        .iter()
        .map(|&b| match b {
            b' '..=b'~' => b as char,
            0x80.. => '?',
            _ => ' ',
        })
        .collect()
}

/// `mmds <status> <first 200 bytes of the body>`.
fn say_reply(r: &Reply) {
    let text = one_line(&r.body[..r.body.len().min(200)]);
    say!("mmds {} {}", r.status, text);
}

/// `mmds-watch`: the same `GET` (same token) again, every `WATCH_PAUSE_MS`,
/// until its status or body differs from `first`; then that reply's line
/// and `mmds watched <n> gets` (the `GET`s after the first, for a test
/// that counts the MMDS's requests). Within `WATCH_MS`, else `mmds error
/// unchanged after <n> gets`; an error ends it with its `mmds error` line.
fn watch(st: &mut Stack, get: &str, first: &Reply) {
    let deadline = Deadline::after_ms(WATCH_MS);
    let mut n = 0u64;
    loop {
        if deadline.passed() {
            say!("mmds error unchanged after {} gets", n);
            return;
        }
        st.pause(WATCH_PAUSE_MS);
        n += 1;
        match st.request(get) {
            Ok(r) if r.status == first.status && r.body == first.body => {}
            Ok(r) => {
                say_reply(&r);
                say!("mmds watched {} gets", n);
                return;
            }
            Err(why) => {
                say!("mmds error {}", why);
                return;
            }
        }
    }
}

/// The `mmds=` word.
pub fn run(options: &Options, path: &str) {
    let Some(mut st) = stack(options) else {
        return;
    };
    let mut host = String::new();
    let _ = write!(host, "{}", Ipv4Address::from(options.mmds_addr));
    let mut put = String::new();
    for part in [
        "PUT /latest/api/token HTTP/1.1\r\nHost: ",
        &host,
        "\r\nX-metadata-token-ttl-seconds: 60\r\nConnection: close\r\n\r\n",
    ] {
        put.push_str(part);
    }
    let token = match options.mmds_no_token {
        true => None,
        false => match st.request(&put) {
            Ok(r) if r.status == 200 => Some(one_line(&r.body)),
            Ok(_) => None,
            Err(why) => {
                say!("mmds error {}", why);
                return;
            }
        },
    };
    let mut get = String::new();
    for part in ["GET ", path, " HTTP/1.1\r\nHost: ", &host, "\r\n"] {
        get.push_str(part);
    }
    if let Some(t) = &token {
        for part in ["X-metadata-token: ", t.trim(), "\r\n"] {
            get.push_str(part);
        }
    }
    get.push_str("Connection: close\r\n\r\n");
    let first = match st.request(&get) {
        Ok(r) => {
            say_reply(&r);
            r
        }
        Err(why) => {
            say!("mmds error {}", why);
            core::mem::forget(st);
            return;
        }
    };
    if options.mmds_watch {
        watch(&mut st, &get, &first);
    }
    // The device stays set up (its buffers are the device's) until the
    // guest parks.
    core::mem::forget(st);
}
