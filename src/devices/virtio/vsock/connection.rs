//! One connection between a guest stream and a host Unix stream: its state,
//! its credit both ways, the guest data the host has not read yet (at most
//! [`CONN_TX_BUF_BYTES`]) and the control packets it owes the guest. No
//! epoll here: the muxer asks [`Conn::wanted_events`] after each change.
//!
//! Credit (virtio 5.10.6.3): the guest may have at most `buf_alloc -
//! (tx_cnt - fwd_cnt)` bytes in flight to the device; the device advertises
//! `buf_alloc` = [`CONN_TX_BUF_BYTES`] and counts in `fwd_cnt` what the host
//! read, so the credit is exactly the free room of the buffer, and a packet
//! past it is a guest that ignores credit: the connection is reset. The other
//! way, host data is read only up to the guest's own credit.

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::num::Wrapping;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use vmm_sys_util::epoll::EventSet;

use super::metrics::VsockMetrics;
use super::packet::{op, shutdown, VsockHeader};
use super::{
    CONNECT_TIMEOUT_MS, CONN_TX_BUF_BYTES, CREDIT_UPDATE_THRESHOLD, MAX_PKT_PAYLOAD,
    SHUTDOWN_TIMEOUT_MS,
};

/// Where a connection stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnState {
    /// Host-initiated: the request is owed to, or awaits, the guest.
    LocalInit,
    /// Guest-initiated: the host stream is connected, the response is owed.
    PeerInit,
    /// Data flows both ways.
    Established,
    /// One side is done: waiting for the guest's reset or the buffer to
    /// drain, until the deadline.
    Closing,
}

/// Control packets owed to the guest.
#[derive(Debug, Default)]
struct Owed {
    request: bool,
    response: bool,
    shutdown: bool,
    credit_update: bool,
    rst: bool,
}

/// One connection.
#[derive(Debug)]
pub struct Conn {
    /// The host side; None once killed (the host sees the stream close).
    pub(super) stream: Option<UnixStream>,
    /// The muxer's epoll token.
    pub(super) token: u64,
    /// The host-side port.
    pub(super) local_port: u32,
    /// The guest-side port.
    pub(super) peer_port: u32,
    pub(super) state: ConnState,
    pub(super) deadline: Option<Instant>,
    /// In the muxer's RX queue.
    pub(super) in_rxq: bool,
    /// The events registered with the muxer's epoll (None: not registered).
    pub(super) registered: Option<EventSet>,
    /// Host-initiated (its host port is the muxer's to free).
    pub(super) host_initiated: bool,
    tx_buf: VecDeque<u8>,
    tx_cnt: Wrapping<u32>,
    fwd_cnt: Wrapping<u32>,
    last_fwd_cnt_sent: Wrapping<u32>,
    rx_cnt: Wrapping<u32>,
    peer_buf_alloc: u32,
    peer_fwd_cnt: Wrapping<u32>,
    host_readable: bool,
    host_hup: bool,
    /// The host shut its write side (`shutdown(SHUT_WR)`: read gave EOF
    /// with no hang-up): it sends no more, and may still read.
    host_eof: bool,
    peer_shut: u32,
    owed: Owed,
    finished: bool,
}

impl Conn {
    fn new(stream: UnixStream, token: u64, local_port: u32, peer_port: u32) -> Conn {
        Conn {
            stream: Some(stream),
            token,
            local_port,
            peer_port,
            state: ConnState::LocalInit,
            deadline: None,
            in_rxq: false,
            registered: None,
            host_initiated: false,
            tx_buf: VecDeque::new(),
            tx_cnt: Wrapping(0),
            fwd_cnt: Wrapping(0),
            last_fwd_cnt_sent: Wrapping(0),
            rx_cnt: Wrapping(0),
            peer_buf_alloc: 0,
            peer_fwd_cnt: Wrapping(0),
            host_readable: false,
            host_hup: false,
            host_eof: false,
            peer_shut: 0,
            owed: Owed::default(),
            finished: false,
        }
    }

    /// A host-initiated connection: the request is owed to the guest, which
    /// must answer by the connect deadline.
    pub fn local_init(s: UnixStream, token: u64, local: u32, peer: u32, now: Instant) -> Conn {
        let mut c = Conn::new(s, token, local, peer);
        c.owed.request = true;
        c.deadline = Some(now + Duration::from_millis(CONNECT_TIMEOUT_MS));
        c
    }

    /// A guest-initiated connection whose host stream is connected: the
    /// response is owed.
    pub fn peer_init(s: UnixStream, token: u64, hdr: &VsockHeader) -> Conn {
        let mut c = Conn::new(s, token, hdr.dst_port, hdr.src_port);
        c.state = ConnState::PeerInit;
        c.owed.response = true;
        c.peer_buf_alloc = hdr.buf_alloc;
        c.peer_fwd_cnt = Wrapping(hdr.fwd_cnt);
        c
    }

    /// What the guest can still take.
    pub fn peer_credit(&self) -> u32 {
        let used = (self.rx_cnt - self.peer_fwd_cnt).0;
        self.peer_buf_alloc.saturating_sub(used)
    }

    /// Guest data the host has not read yet.
    pub fn buffered(&self) -> usize {
        self.tx_buf.len()
    }

    /// Done: the reset went to the guest (or none was owed); the muxer
    /// forgets it.
    pub fn finished(&self) -> bool {
        self.finished
    }

    fn wants_to_read(&self) -> bool {
        self.state == ConnState::Established
            && self.host_readable
            && !self.host_eof
            && self.peer_shut & shutdown::RCV == 0
            && self.stream.is_some()
            && self.peer_credit() > 0
    }

    /// Whether it has a packet for the guest.
    pub fn has_rx(&self) -> bool {
        let o = &self.owed;
        !self.finished
            && (o.rst
                || o.request
                || o.response
                || o.shutdown
                || o.credit_update
                || self.wants_to_read())
    }

    /// Tears it down: the host stream closes now, the guest gets a reset
    /// (unless it never heard of the connection).
    pub fn kill(&mut self, metrics: &VsockMetrics) {
        if self.finished {
            return;
        }
        metrics.conns_killed.inc();
        let never_told = self.state == ConnState::LocalInit && self.owed.request;
        self.stream = None;
        self.tx_buf = VecDeque::new();
        self.owed = Owed {
            rst: !never_told,
            ..Owed::default()
        };
        self.finished = never_told;
        self.state = ConnState::Closing;
        self.deadline = None;
    }

    /// The events to poll the host stream for; None: do not poll it (gone,
    /// or hung up: epoll reports a hang-up whatever the mask).
    pub fn wanted_events(&self) -> Option<EventSet> {
        if self.stream.is_none() || self.host_hup {
            return None;
        }
        let mut e = EventSet::empty();
        if self.state == ConnState::Established
            && !self.host_readable
            && !self.host_eof
            && self.peer_shut & shutdown::RCV == 0
            && !self.owed.shutdown
            && self.peer_credit() > 0
        {
            e |= EventSet::IN;
        }
        if !self.tx_buf.is_empty() {
            e |= EventSet::OUT;
        }
        Some(e)
    }

    /// The host stream's epoll events.
    pub fn host_event(&mut self, ev: EventSet, metrics: &VsockMetrics) {
        if ev.contains(EventSet::ERROR) {
            return self.kill(metrics);
        }
        if ev.contains(EventSet::OUT) {
            self.flush(metrics);
        }
        if ev.intersects(EventSet::IN | EventSet::HANG_UP | EventSet::READ_HANG_UP) {
            self.host_readable = true;
        }
        if ev.contains(EventSet::HANG_UP) {
            self.host_hup = true;
            // Closed for good: before it was established, or after a
            // half-close (the host can no longer read what the guest sends).
            if self.state != ConnState::Established || self.host_eof {
                self.kill(metrics);
            }
        }
    }

    /// The deadline passed: reset.
    pub fn expire(&mut self, now: Instant, metrics: &VsockMetrics) {
        if self.deadline.is_some_and(|d| now >= d) {
            self.kill(metrics);
        }
    }

    fn header(&mut self, guest_cid: u64, op: u16) -> VsockHeader {
        let mut h = VsockHeader::to_guest(guest_cid, self.local_port, self.peer_port, op);
        h.buf_alloc = CONN_TX_BUF_BYTES;
        h.fwd_cnt = self.fwd_cnt.0;
        self.last_fwd_cnt_sent = self.fwd_cnt;
        self.owed.credit_update = false;
        h
    }

    /// The next packet for the guest, its payload (at most `room` bytes)
    /// read from the host into `buf`; None: nothing to send now.
    pub fn next_rx(
        &mut self,
        guest_cid: u64,
        room: usize,
        buf: &mut [u8],
        now: Instant,
        metrics: &VsockMetrics,
    ) -> Option<(VsockHeader, usize)> {
        if self.finished {
            return None;
        }
        if self.owed.rst {
            self.owed.rst = false;
            self.finished = true;
            return Some((self.header(guest_cid, op::RST), 0));
        }
        if self.owed.request {
            self.owed.request = false;
            return Some((self.header(guest_cid, op::REQUEST), 0));
        }
        if self.owed.response {
            self.owed.response = false;
            self.state = ConnState::Established;
            return Some((self.header(guest_cid, op::RESPONSE), 0));
        }
        if self.wants_to_read() {
            let n = (self.peer_credit() as usize)
                .min(room)
                .min(MAX_PKT_PAYLOAD as usize)
                .min(buf.len());
            if n > 0 {
                let r = match self.stream.as_mut() {
                    Some(s) => s.read(&mut buf[..n]),
                    None => Ok(0),
                };
                match r {
                    Ok(0) if self.host_hup => {
                        // The host closed its side: tell the guest (both
                        // directions), wait for its reset.
                        self.host_readable = false;
                        self.owed.shutdown = true;
                        self.state = ConnState::Closing;
                        self.deadline = Some(now + Duration::from_millis(SHUTDOWN_TIMEOUT_MS));
                    }
                    Ok(0) => {
                        // A half-close (the host shut its write side only):
                        // the guest hears "no more to receive" and may go on
                        // sending; the connection ends when it shuts its side
                        // too. (Firecracker closes both directions here.)
                        self.host_readable = false;
                        self.host_eof = true;
                        self.owed.shutdown = true;
                        self.after_drain();
                    }
                    Ok(k) => {
                        self.rx_cnt += Wrapping(k as u32);
                        let mut h = self.header(guest_cid, op::RW);
                        h.len = k as u32;
                        return Some((h, k));
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.host_readable = false,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(_) => {
                        metrics.rx_read_fails.inc();
                        self.kill(metrics);
                        return self.next_rx(guest_cid, room, buf, now, metrics);
                    }
                }
            }
        }
        if self.owed.shutdown {
            self.owed.shutdown = false;
            let mut h = self.header(guest_cid, op::SHUTDOWN);
            h.flags = if self.state == ConnState::Closing {
                shutdown::BOTH
            } else {
                shutdown::SEND
            };
            return Some((h, 0));
        }
        if self.owed.credit_update {
            return Some((self.header(guest_cid, op::CREDIT_UPDATE), 0));
        }
        None
    }

    /// A packet from the guest for this connection (not a reset: the muxer
    /// drops the connection for that).
    pub fn from_guest(
        &mut self,
        hdr: &VsockHeader,
        payload: &[u8],
        now: Instant,
        metrics: &VsockMetrics,
    ) {
        if self.finished || self.owed.rst {
            return;
        }
        self.peer_buf_alloc = hdr.buf_alloc;
        self.peer_fwd_cnt = Wrapping(hdr.fwd_cnt);
        match hdr.op {
            op::RESPONSE if self.state == ConnState::LocalInit && !self.owed.request => {
                self.state = ConnState::Established;
                self.deadline = None;
                let ok = format!("OK {}\n", self.local_port);
                let wrote = self.stream.as_mut().map(|s| s.write(ok.as_bytes()));
                if !matches!(wrote, Some(Ok(n)) if n == ok.len()) {
                    metrics.tx_write_fails.inc();
                    self.kill(metrics);
                }
            }
            op::RW if self.accepts_data() => self.forward_to_host(payload, metrics),
            op::CREDIT_UPDATE => {}
            op::CREDIT_REQUEST => self.owed.credit_update = true,
            op::SHUTDOWN => {
                self.peer_shut |= hdr.flags & shutdown::BOTH;
                if self.peer_shut == shutdown::BOTH && self.state != ConnState::Closing {
                    self.state = ConnState::Closing;
                    self.deadline = Some(now + Duration::from_millis(SHUTDOWN_TIMEOUT_MS));
                }
                self.after_drain();
            }
            // A second request, a response out of turn, data before the
            // handshake or after the guest's own shutdown, unknown ops.
            _ => self.kill(metrics),
        }
    }

    fn accepts_data(&self) -> bool {
        matches!(self.state, ConnState::Established | ConnState::Closing)
            && self.peer_shut & shutdown::SEND == 0
            && self.stream.is_some()
    }

    fn forward_to_host(&mut self, data: &[u8], metrics: &VsockMetrics) {
        let room = CONN_TX_BUF_BYTES as usize - self.tx_buf.len();
        if data.len() > room {
            metrics.credit_violations.inc();
            return self.kill(metrics);
        }
        self.tx_cnt += Wrapping(data.len() as u32);
        let mut rest = data;
        if self.tx_buf.is_empty() {
            match self.write_host(data, metrics) {
                Some(n) => rest = &data[n..],
                None => return,
            }
        }
        self.tx_buf.extend(rest);
        self.after_drain();
    }

    /// Writes what the host takes now; None if the stream broke (killed).
    fn write_host(&mut self, mut data: &[u8], metrics: &VsockMetrics) -> Option<usize> {
        let s = self.stream.as_mut()?;
        let mut done = 0;
        while !data.is_empty() {
            match s.write(data) {
                Ok(0) => break,
                Ok(n) => {
                    done += n;
                    data = &data[n..];
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(_) => {
                    metrics.tx_write_fails.inc();
                    self.kill(metrics);
                    return None;
                }
            }
        }
        self.fwd_cnt += Wrapping(done as u32);
        Some(done)
    }

    /// The host stream can take more: writes the buffer out.
    fn flush(&mut self, metrics: &VsockMetrics) {
        let Some(s) = self.stream.as_mut() else {
            return;
        };
        let (mut done, mut broke) = (0usize, false);
        while !self.tx_buf.is_empty() {
            let (a, _) = self.tx_buf.as_slices();
            match s.write(a) {
                Ok(0) => break,
                Ok(n) => {
                    self.tx_buf.drain(..n);
                    done += n;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(_) => {
                    broke = true;
                    break;
                }
            }
        }
        self.fwd_cnt += Wrapping(done as u32);
        if broke {
            metrics.tx_flush_fails.inc();
            return self.kill(metrics);
        }
        self.after_drain();
    }

    /// After data moved to the host: a credit update when the guest may
    /// think the buffer nearly full; the shutdowns the guest asked for once
    /// the buffer is empty.
    fn after_drain(&mut self) {
        let seen_used = (self.tx_cnt - self.last_fwd_cnt_sent).0;
        if seen_used >= CREDIT_UPDATE_THRESHOLD && self.fwd_cnt != self.last_fwd_cnt_sent {
            self.owed.credit_update = true;
        }
        if !self.tx_buf.is_empty() {
            return;
        }
        let guest_done = self.peer_shut == shutdown::BOTH
            || (self.host_eof && self.peer_shut & shutdown::SEND != 0);
        if guest_done {
            // Everything the guest sent is out, and neither side sends any
            // more: the reset ends it.
            self.stream = None;
            self.owed.rst = true;
            self.state = ConnState::Closing;
        } else if self.peer_shut & shutdown::SEND != 0 {
            if let Some(s) = &self.stream {
                let _ = s.shutdown(Shutdown::Write);
            }
        }
    }
}
