//! The MMDS detour of a network device: the guest's frames for the MMDS
//! address (ARP for it; any IPv4 packet to it, as Firecracker) are taken
//! off the transmit path, fed to a smoltcp [`Interface`] on a virtual
//! device (`Phy`) with a few TCP sockets listening on port 80, and the
//! HTTP requests they carry are answered from the shared [`crate::mmds::Mmds`]
//! ([`crate::mmds::http`]). The stack's output frames wait in a bounded
//! queue for the receive path, which takes them in turn with the tap's
//! frames ([`read_frame`]); a full queue drops (counted), so a guest that
//! does not read never blocks the device.
//!
//! A hostile guest gets bounded work: one frame in, at most
//! [`MAX_POLLS`] stack polls out; [`SOCKETS`] connections at a time (a
//! SYN beyond them is answered with a reset by smoltcp), each idle one
//! aborted after [`IDLE`]; a request is at most
//! [`crate::mmds::http::MAX_REQUEST_BYTES`]. No syscall beyond the
//! device's own: smoltcp is computation, the clock is the vDSO's
//! `clock_gettime` (allowed on every thread).
//!
//! The stack only runs when a frame comes: retransmissions and timeouts
//! happen on the guest's next frame (a lost frame here is only one the
//! guest did not take, when the queue is full).

use std::collections::VecDeque;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use smoltcp::iface::{Config, Interface, SocketHandle, SocketSet};
use smoltcp::phy::{self, Checksum, ChecksumCapabilities, DeviceCapabilities, Medium};
use smoltcp::socket::tcp;
use smoltcp::wire::{EthernetAddress, HardwareAddress, IpCidr, Ipv4Address};

use super::{Net, NetBackend, VNET_HDR_BYTES};
use crate::devices::virtio::DeviceMemory;
use crate::mmds::http::{self, Parsed, MAX_REQUEST_BYTES};
use crate::mmds::SharedMmds;

/// The MMDS's own MAC (Firecracker's).
pub const MMDS_MAC: [u8; 6] = [0x06, 0x01, 0x23, 0x45, 0x67, 0x01];
/// Connections at a time.
pub const SOCKETS: usize = 8;
/// An established connection with nothing from the guest for this long is
/// aborted.
pub const IDLE: Duration = Duration::from_secs(10);
/// Most output frames waiting for the guest.
pub const MAX_QUEUED: usize = 256;
/// Most stack polls per guest frame.
pub const MAX_POLLS: usize = 16;
/// The port the MMDS answers on.
const PORT: u16 = 80;
/// Each socket's send buffer.
const TX_BUFFER: usize = 16 * 1024;

/// What the detour needs to be made: the MMDS and its address.
#[derive(Debug, Clone)]
pub struct MmdsLink {
    /// The shared store.
    pub mmds: SharedMmds,
    /// The guest reaches it here.
    pub ipv4: Ipv4Addr,
}

/// Counters of the detour.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct MmdsCounts {
    /// Guest frames taken for the MMDS.
    pub rx_frames: u64,
    /// Frames for the MMDS that were not TCP (dropped but for ICMP echo).
    pub rx_unusual: u64,
    /// Frames the stack made.
    pub tx_frames: u64,
    /// Frames dropped because the queue for the guest was full.
    pub tx_dropped: u64,
    /// Requests answered.
    pub requests: u64,
    /// Connections aborted for idleness.
    pub idle_aborts: u64,
}

/// The smoltcp device: one guest frame in, the stack's frames out.
struct Phy {
    rx: Option<Vec<u8>>,
    tx: VecDeque<Vec<u8>>,
    dropped: u64,
}

struct RxToken(Vec<u8>);
struct TxToken<'a>(&'a mut Phy);

impl phy::RxToken for RxToken {
    fn consume<R, F: FnOnce(&[u8]) -> R>(self, f: F) -> R {
        f(&self.0)
    }
}

impl phy::TxToken for TxToken<'_> {
    fn consume<R, F: FnOnce(&mut [u8]) -> R>(self, len: usize, f: F) -> R {
        let mut frame = vec![0u8; len];
        let r = f(&mut frame);
        if self.0.tx.len() < MAX_QUEUED {
            self.0.tx.push_back(frame);
        } else {
            self.0.dropped += 1;
        }
        r
    }
}

impl phy::Device for Phy {
    type RxToken<'a> = RxToken;
    type TxToken<'a> = TxToken<'a>;

    fn receive(
        &mut self,
        _: smoltcp::time::Instant,
    ) -> Option<(Self::RxToken<'_>, Self::TxToken<'_>)> {
        let frame = self.rx.take()?;
        Some((RxToken(frame), TxToken(self)))
    }

    fn transmit(&mut self, _: smoltcp::time::Instant) -> Option<Self::TxToken<'_>> {
        Some(TxToken(self))
    }

    fn capabilities(&self) -> DeviceCapabilities {
        let mut caps = DeviceCapabilities::default();
        caps.medium = Medium::Ethernet;
        caps.max_transmission_unit = 1514;
        // The guest may leave checksums to offload (as Firecracker, not
        // verified); the stack's own are computed.
        let mut sums = ChecksumCapabilities::default();
        sums.ipv4 = Checksum::Tx;
        sums.tcp = Checksum::Tx;
        sums.icmpv4 = Checksum::Tx;
        caps.checksum = sums;
        caps
    }
}

/// One connection's request bytes, response bytes not yet sent, and last
/// activity.
struct Conn {
    handle: SocketHandle,
    request: Vec<u8>,
    response: Vec<u8>,
    close_after: bool,
    last: Instant,
}

/// A network device's MMDS stack.
pub struct MmdsDetour {
    link: MmdsLink,
    iface: Interface,
    phy: Phy,
    sockets: SocketSet<'static>,
    conns: Vec<Conn>,
    epoch: Instant,
    /// Whether the receive path takes an MMDS frame next.
    mmds_turn: bool,
    counts: MmdsCounts,
}

impl std::fmt::Debug for MmdsDetour {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MmdsDetour")
            .field("ipv4", &self.link.ipv4)
            .field("counts", &self.counts)
            .finish_non_exhaustive()
    }
}

fn new_socket() -> tcp::Socket<'static> {
    let mut s = tcp::Socket::new(
        tcp::SocketBuffer::new(vec![0; MAX_REQUEST_BYTES]),
        tcp::SocketBuffer::new(vec![0; TX_BUFFER]),
    );
    s.set_timeout(Some(smoltcp::time::Duration::from_secs(IDLE.as_secs())));
    // Listening on a fresh socket cannot fail (port 80 is not 0).
    let _ = s.listen(PORT);
    s
}

impl MmdsDetour {
    /// A stack for `link`'s address.
    pub fn new(link: MmdsLink) -> MmdsDetour {
        let epoch = Instant::now();
        let mut phy = Phy {
            rx: None,
            tx: VecDeque::new(),
            dropped: 0,
        };
        let config = Config::new(HardwareAddress::Ethernet(EthernetAddress(MMDS_MAC)));
        let mut iface = Interface::new(config, &mut phy, smoltcp::time::Instant::ZERO);
        let ip: Ipv4Address = link.ipv4;
        // A /0 network: every guest address is a neighbour (its MAC learnt
        // from its ARP), whatever the guest's own subnet.
        iface.update_ip_addrs(|addrs| {
            let _ = addrs.push(IpCidr::new(ip.into(), 0));
        });
        let mut sockets = SocketSet::new(Vec::new());
        let conns = (0..SOCKETS)
            .map(|_| Conn {
                handle: sockets.add(new_socket()),
                request: Vec::new(),
                response: Vec::new(),
                close_after: false,
                last: epoch,
            })
            .collect();
        MmdsDetour {
            link,
            iface,
            phy,
            sockets,
            conns,
            epoch,
            mmds_turn: false,
            counts: MmdsCounts::default(),
        }
    }

    /// The counters.
    pub fn counts(&self) -> MmdsCounts {
        MmdsCounts {
            tx_dropped: self.phy.dropped,
            ..self.counts
        }
    }

    /// Whether frames wait for the guest.
    pub fn has_output(&self) -> bool {
        !self.phy.tx.is_empty()
    }

    /// Whether `frame` (Ethernet, no virtio-net header) is for the MMDS.
    pub fn is_for_mmds(&self, frame: &[u8]) -> Frame {
        classify(frame, self.link.ipv4)
    }

    fn now(&self) -> smoltcp::time::Instant {
        smoltcp::time::Instant::from_micros(
            i64::try_from(self.epoch.elapsed().as_micros()).unwrap_or(i64::MAX),
        )
    }

    /// Takes a guest frame for the MMDS: runs the stack and answers what
    /// requests are complete.
    pub fn take(&mut self, frame: &[u8], kind: Frame) {
        self.counts.rx_frames += 1;
        if kind == Frame::Other {
            self.counts.rx_unusual += 1;
        }
        self.phy.rx = Some(frame.to_vec());
        for _ in 0..MAX_POLLS {
            let now = self.now();
            let changed = self.iface.poll(now, &mut self.phy, &mut self.sockets);
            let served = self.serve();
            if changed == smoltcp::iface::PollResult::None && !served {
                break;
            }
        }
        self.phy.rx = None;
    }

    /// Reads requests, queues responses, sends what fits, recycles closed
    /// sockets. Whether anything was sent or closed.
    fn serve(&mut self) -> bool {
        let mut progress = false;
        let now = Instant::now();
        for c in &mut self.conns {
            let s = self.sockets.get_mut::<tcp::Socket>(c.handle);
            if !s.is_open() {
                // Closed (or timed out): listen again, fresh.
                *s = new_socket();
                c.request.clear();
                c.response.clear();
                c.close_after = false;
                continue;
            }
            if !s.is_active() {
                c.last = now; // listening
                continue;
            }
            while s.can_recv() && c.request.len() < MAX_REQUEST_BYTES {
                let room = MAX_REQUEST_BYTES - c.request.len();
                let got = s
                    .recv(|b| {
                        let n = b.len().min(room);
                        (n, b[..n].to_vec())
                    })
                    .unwrap_or_default();
                if got.is_empty() {
                    break;
                }
                c.request.extend_from_slice(&got);
                c.last = now;
            }
            // Answer every whole request (keep-alive), one response at a
            // time in flight.
            while c.response.is_empty() && !c.close_after {
                match http::parse(&c.request) {
                    Parsed::Incomplete => break,
                    Parsed::Request(req, used) => {
                        c.request.drain(..used);
                        c.close_after = req
                            .header(&["connection"])
                            .is_some_and(|(_, v)| v.eq_ignore_ascii_case("close"));
                        let resp = http::respond(&mut crate::mmds::lock(&self.link.mmds), &req);
                        c.response = resp.to_bytes(&req.version);
                        self.counts.requests += 1;
                    }
                    Parsed::Bad(why) => {
                        c.request.clear();
                        let resp = http::Response {
                            status: 400,
                            content_type: "text/plain",
                            extra: Vec::new(),
                            body: why,
                        };
                        c.response = resp.to_bytes("HTTP/1.1");
                        c.close_after = true;
                    }
                }
            }
            if !c.response.is_empty() && s.can_send() {
                let n = s.send_slice(&c.response).unwrap_or(0);
                c.response.drain(..n);
                progress |= n > 0;
            }
            let done_sending = c.response.is_empty();
            if done_sending && (c.close_after || !s.may_recv()) && s.may_send() {
                // The guest closed its side, or the request was bad.
                s.close();
                progress = true;
            }
            if now.duration_since(c.last) > IDLE {
                s.abort();
                self.counts.idle_aborts += 1;
                progress = true;
            }
        }
        progress
    }

    /// The next frame for the guest into `buf` (after a zeroed virtio-net
    /// header): its length with the header.
    fn pop(&mut self, buf: &mut [u8]) -> Option<usize> {
        let frame = self.phy.tx.pop_front()?;
        let n = VNET_HDR_BYTES + frame.len();
        if n > buf.len() {
            self.phy.dropped += 1;
            return None;
        }
        buf[..VNET_HDR_BYTES].fill(0);
        buf[VNET_HDR_BYTES..n].copy_from_slice(&frame);
        self.counts.tx_frames += 1;
        Some(n)
    }
}

/// What a guest frame is to the MMDS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Frame {
    /// Not for the MMDS: to the tap.
    NotMmds,
    /// ARP about the MMDS address.
    Arp,
    /// IPv4 TCP to the MMDS address.
    Tcp,
    /// Other IPv4 to the MMDS address (taken, not forwarded).
    Other,
}

/// Classifies an Ethernet frame (no virtio-net header).
pub fn classify(frame: &[u8], ip: Ipv4Addr) -> Frame {
    const ETH: usize = 14;
    if frame.len() < ETH {
        return Frame::NotMmds;
    }
    let ip = ip.octets();
    match u16::from_be_bytes([frame[12], frame[13]]) {
        0x0806 => {
            // Ethernet/IPv4 ARP: target protocol address at 24..28.
            let arp = &frame[ETH..];
            if arp.len() >= 28 && arp[..6] == [0, 1, 8, 0, 6, 4] && arp[24..28] == ip {
                Frame::Arp
            } else {
                Frame::NotMmds
            }
        }
        0x0800 => {
            let p = &frame[ETH..];
            if p.len() < 20 || p[0] >> 4 != 4 || p[16..20] != ip {
                return Frame::NotMmds;
            }
            if p[9] == 6 {
                Frame::Tcp
            } else {
                Frame::Other
            }
        }
        _ => Frame::NotMmds,
    }
}

/// The transmit path's call: `frame` (with its virtio-net header) is the
/// MMDS's, and taken, or not (to the tap).
pub fn detour(detour: &mut Option<Box<MmdsDetour>>, frame: &[u8]) -> bool {
    let Some(d) = detour.as_mut() else {
        return false;
    };
    let Some(eth) = frame.get(VNET_HDR_BYTES..) else {
        return false;
    };
    let kind = d.is_for_mmds(eth);
    if kind == Frame::NotMmds {
        return false;
    }
    d.take(eth, kind);
    true
}

/// The receive path's read: the next frame for the guest, from the MMDS
/// or the tap, in turn when both have one.
pub fn read_frame(
    detour: &mut Option<Box<MmdsDetour>>,
    backend: &mut Box<dyn NetBackend>,
    buf: &mut [u8],
) -> std::io::Result<usize> {
    let Some(d) = detour.as_mut() else {
        return backend.read_frame(buf);
    };
    if d.mmds_turn {
        if let Some(n) = d.pop(buf) {
            d.mmds_turn = false;
            return Ok(n);
        }
    }
    match backend.read_frame(buf) {
        Ok(n) => {
            d.mmds_turn = d.has_output();
            Ok(n)
        }
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => match d.pop(buf) {
            Some(n) => Ok(n),
            None => Err(e),
        },
        Err(e) => Err(e),
    }
}

impl<M: DeviceMemory> Net<M> {
    /// Answers the guest's MMDS frames on this device (before it runs).
    pub fn set_mmds(&mut self, link: MmdsLink) {
        self.mmds = Some(Box::new(MmdsDetour::new(link)));
    }

    /// The MMDS detour's counters, if it has one.
    pub fn mmds_counts(&self) -> Option<MmdsCounts> {
        self.mmds.as_ref().map(|d| d.counts())
    }
}

#[cfg(test)]
#[path = "mmds_tests.rs"]
mod tests;
