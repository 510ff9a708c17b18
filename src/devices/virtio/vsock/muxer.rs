//! The muxer: the host listener, the host streams still sending their
//! `CONNECT` line, the connections (keyed by (host port, guest port)) and
//! the packets owed to the guest, with one epoll fd over all host fds (the
//! device thread polls that fd).
//!
//! Bounded everywhere: [`MAX_CONNECTIONS`] connections and handshakes
//! together, [`MAX_HANDSHAKES`] handshakes, a [`MAX_CONNECT_LINE`]-byte line
//! read by its deadline, [`MAX_PENDING_RESETS`] resets of unknown
//! connections (while full the device leaves the TX queue alone), and the RX
//! queue holds each connection at most once.

use std::collections::{HashMap, HashSet, VecDeque};
use std::ffi::OsString;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};

use super::connection::Conn;
use super::metrics::VsockMetrics;
use super::packet::{op, VsockHeader, TYPE_STREAM};
use super::uds::connect_nonblocking;
use super::{
    VsockError, CONNECT_TIMEOUT_MS, LOCAL_PORT_FIRST, MAX_ACCEPTS_PER_PASS, MAX_CONNECTIONS,
    MAX_CONNECT_LINE, MAX_HANDSHAKES, MAX_PENDING_RESETS,
};

/// (host port, guest port).
pub type ConnKey = (u32, u32);

const LISTENER: u64 = 0;
/// Host events handled per wake (the rest stay ready: level-triggered).
const EVENTS_PER_PASS: usize = 64;

/// An accepted host stream sending its `CONNECT <port>\n` line.
#[derive(Debug)]
struct Handshake {
    stream: UnixStream,
    line: Vec<u8>,
    deadline: Instant,
}

#[derive(Debug, Clone, Copy)]
enum Token {
    Conn(ConnKey),
    Handshake,
}

/// Parses `CONNECT <port>` (any case, as Firecracker), the newline gone.
pub fn parse_connect(line: &[u8]) -> Option<u32> {
    let s = std::str::from_utf8(line).ok()?;
    let mut w = s.split_ascii_whitespace();
    let (cmd, port) = (w.next()?, w.next()?);
    if !cmd.eq_ignore_ascii_case("connect") || w.next().is_some() {
        return None;
    }
    port.parse().ok()
}

/// The vsock muxer.
#[derive(Debug)]
pub struct Muxer {
    guest_cid: u64,
    uds_path: PathBuf,
    listener: UnixListener,
    epoll: Epoll,
    conns: HashMap<ConnKey, Conn>,
    tokens: HashMap<u64, Token>,
    handshakes: HashMap<u64, Handshake>,
    rxq: VecDeque<ConnKey>,
    resets: VecDeque<ConnKey>,
    next_token: u64,
    local_ports: HashSet<u32>,
    last_local_port: u32,
    metrics: Arc<VsockMetrics>,
}

impl Muxer {
    /// A muxer for a guest of `guest_cid`, accepting on `listener` (bound at
    /// `uds_path`).
    pub fn new(
        guest_cid: u64,
        uds_path: PathBuf,
        listener: UnixListener,
        metrics: Arc<VsockMetrics>,
    ) -> Result<Muxer, VsockError> {
        listener
            .set_nonblocking(true)
            .map_err(VsockError::EventFd)?;
        let epoll = Epoll::new().map_err(VsockError::EventFd)?;
        epoll
            .ctl(
                ControlOperation::Add,
                listener.as_raw_fd(),
                EpollEvent::new(EventSet::IN, LISTENER),
            )
            .map_err(VsockError::EventFd)?;
        Ok(Muxer {
            guest_cid,
            uds_path,
            listener,
            epoll,
            conns: HashMap::new(),
            tokens: HashMap::new(),
            handshakes: HashMap::new(),
            rxq: VecDeque::new(),
            resets: VecDeque::new(),
            next_token: LISTENER + 1,
            local_ports: HashSet::new(),
            last_local_port: LOCAL_PORT_FIRST - 1,
            metrics,
        })
    }

    /// The epoll fd the device thread polls.
    pub fn epoll_fd(&self) -> RawFd {
        self.epoll.as_raw_fd()
    }

    /// Connections now.
    pub fn connections(&self) -> usize {
        self.conns.len()
    }

    /// Guest data buffered for the host, all connections.
    pub fn buffered(&self) -> usize {
        self.conns.values().map(Conn::buffered).sum()
    }

    /// Drops every connection and handshake (a device reset); the listener
    /// stays.
    pub fn reset(&mut self) {
        let n = self.conns.len() as u64;
        self.metrics.conns_removed.add(n);
        self.conns.clear();
        self.handshakes.clear();
        self.tokens.clear();
        self.rxq.clear();
        self.resets.clear();
        self.local_ports.clear();
    }

    fn token(&mut self) -> u64 {
        self.next_token = self.next_token.wrapping_add(1).max(LISTENER + 1);
        while self.tokens.contains_key(&self.next_token) {
            self.next_token = self.next_token.wrapping_add(1).max(LISTENER + 1);
        }
        self.next_token
    }

    fn full(&self) -> bool {
        self.conns.len() + self.handshakes.len() >= MAX_CONNECTIONS
    }

    /// One bounded pass over the host fds that are ready.
    pub fn process_host(&mut self, now: Instant) {
        let mut events = [EpollEvent::default(); EVENTS_PER_PASS];
        let n = match self.epoll.wait(0, &mut events) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => 0,
            Err(_) => {
                self.metrics.muxer_event_fails.inc();
                0
            }
        };
        for ev in &events[..n] {
            let set = EventSet::from_bits_truncate(ev.events);
            match ev.data() {
                LISTENER => self.accept(now),
                t => match self.tokens.get(&t).copied() {
                    Some(Token::Handshake) => self.handshake(t, now),
                    Some(Token::Conn(key)) => {
                        if let Some(c) = self.conns.get_mut(&key) {
                            c.host_event(set, &self.metrics);
                        }
                        self.sync(key);
                    }
                    None => self.metrics.muxer_event_fails.inc(),
                },
            }
        }
    }

    fn accept(&mut self, now: Instant) {
        for _ in 0..MAX_ACCEPTS_PER_PASS {
            let stream = match self.listener.accept() {
                Ok((s, _)) => s,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => {
                    self.metrics.conn_event_fails.inc();
                    return;
                }
            };
            if self.full() || self.handshakes.len() >= MAX_HANDSHAKES {
                // Closed at once: the host sees EOF instead of `OK`.
                self.metrics.conns_refused.inc();
                continue;
            }
            let t = self.token();
            let added = stream.set_nonblocking(true).and_then(|()| {
                self.epoll.ctl(
                    ControlOperation::Add,
                    stream.as_raw_fd(),
                    EpollEvent::new(EventSet::IN, t),
                )
            });
            if added.is_err() {
                self.metrics.conn_event_fails.inc();
                continue;
            }
            self.tokens.insert(t, Token::Handshake);
            let deadline = now + Duration::from_millis(CONNECT_TIMEOUT_MS);
            let line = Vec::with_capacity(MAX_CONNECT_LINE);
            self.handshakes.insert(
                t,
                Handshake {
                    stream,
                    line,
                    deadline,
                },
            );
        }
    }

    fn drop_handshake(&mut self, t: u64) -> Option<Handshake> {
        self.tokens.remove(&t);
        let h = self.handshakes.remove(&t)?;
        let _ = self.epoll.ctl(
            ControlOperation::Delete,
            h.stream.as_raw_fd(),
            EpollEvent::default(),
        );
        Some(h)
    }

    /// Reads the `CONNECT` line a byte at a time (never past its newline:
    /// what follows is the connection's data).
    fn handshake(&mut self, t: u64, now: Instant) {
        let Some(h) = self.handshakes.get_mut(&t) else {
            return;
        };
        let mut b = [0u8; 1];
        let done = loop {
            match h.stream.read(&mut b) {
                Ok(1) if b[0] == b'\n' => break Some(parse_connect(&h.line)),
                Ok(1) if h.line.len() + 1 < MAX_CONNECT_LINE => h.line.push(b[0]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break None,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // EOF, an error, a line too long.
                _ => break Some(None),
            }
        };
        let Some(port) = done else {
            return;
        };
        let Some(h) = self.drop_handshake(t) else {
            return;
        };
        let Some(peer_port) = port else {
            self.metrics.conns_refused.inc();
            return;
        };
        let local = self.allocate_local_port();
        let key = (local, peer_port);
        let t = self.token();
        let mut c = Conn::local_init(h.stream, t, local, peer_port, now);
        c.host_initiated = true;
        self.add(key, c);
    }

    fn allocate_local_port(&mut self) -> u32 {
        loop {
            self.last_local_port = (self.last_local_port.wrapping_add(1) & !(1 << 31)) | (1 << 30);
            let p = self.last_local_port;
            if self.local_ports.insert(p) && !self.conns.keys().any(|k| k.0 == p) {
                return p;
            }
        }
    }

    fn add(&mut self, key: ConnKey, c: Conn) {
        self.tokens.insert(c.token, Token::Conn(key));
        self.conns.insert(key, c);
        self.metrics.conns_added.inc();
        self.sync(key);
    }

    fn remove(&mut self, key: ConnKey) {
        if let Some(c) = self.conns.remove(&key) {
            self.tokens.remove(&c.token);
            if c.host_initiated {
                self.local_ports.remove(&key.0);
            }
            if let (Some(s), Some(_)) = (&c.stream, c.registered) {
                let _ = self.epoll.ctl(
                    ControlOperation::Delete,
                    s.as_raw_fd(),
                    EpollEvent::default(),
                );
            }
            self.metrics.conns_removed.inc();
        }
    }

    /// After a connection changed: forgets it if finished, else matches its
    /// epoll registration to what it wants and queues it for RX.
    fn sync(&mut self, key: ConnKey) {
        let Some(c) = self.conns.get_mut(&key) else {
            return;
        };
        if c.finished() {
            return self.remove(key);
        }
        let want = c.wanted_events();
        if want != c.registered {
            if let Some(s) = &c.stream {
                let fd = s.as_raw_fd();
                let ev = EpollEvent::new(want.unwrap_or(EventSet::empty()), c.token);
                let r = match (c.registered, want) {
                    (None, Some(_)) => self.epoll.ctl(ControlOperation::Add, fd, ev),
                    (Some(_), Some(_)) => self.epoll.ctl(ControlOperation::Modify, fd, ev),
                    _ => self.epoll.ctl(ControlOperation::Delete, fd, ev),
                };
                if r.is_err() {
                    self.metrics.muxer_event_fails.inc();
                }
            }
            // A closed stream left the epoll set with its fd.
            c.registered = want;
        }
        if c.has_rx() && !c.in_rxq {
            c.in_rxq = true;
            self.rxq.push_back(key);
        }
    }

    /// Whether the resets owed fill their queue (the device then leaves the
    /// TX queue for later).
    pub fn tx_stalled(&self) -> bool {
        self.resets.len() >= MAX_PENDING_RESETS
    }

    fn reset_unknown(&mut self, hdr: &VsockHeader) {
        if self.resets.len() < MAX_PENDING_RESETS {
            self.resets.push_back((hdr.dst_port, hdr.src_port));
        }
    }

    /// A checked packet from the guest (`payload`: its `len` bytes).
    pub fn from_guest(&mut self, hdr: &VsockHeader, payload: &[u8], now: Instant) {
        if hdr.type_ != TYPE_STREAM {
            return self.reset_unknown(hdr);
        }
        let key = (hdr.dst_port, hdr.src_port);
        match (self.conns.get_mut(&key), hdr.op) {
            (None, op::REQUEST) => self.guest_connect(hdr),
            (None, op::RST) => {}
            (None, _) => self.reset_unknown(hdr),
            (Some(_), op::RST) => self.remove(key),
            (Some(c), _) => {
                c.from_guest(hdr, payload, now, &self.metrics);
                self.sync(key);
            }
        }
    }

    /// A guest request for host port P: connects to `<uds_path>_<P>`.
    fn guest_connect(&mut self, hdr: &VsockHeader) {
        if self.full() {
            self.metrics.conns_refused.inc();
            return self.reset_unknown(hdr);
        }
        let mut path = OsString::from(self.uds_path.as_os_str());
        path.push(format!("_{}", hdr.dst_port));
        match connect_nonblocking(path.as_ref()) {
            Ok(stream) => {
                let t = self.token();
                self.add(
                    (hdr.dst_port, hdr.src_port),
                    Conn::peer_init(stream, t, hdr),
                );
            }
            Err(_) => {
                self.metrics.conns_refused.inc();
                self.reset_unknown(hdr);
            }
        }
    }

    /// Whether a packet is owed to the guest.
    pub fn has_rx(&self) -> bool {
        !self.resets.is_empty() || !self.rxq.is_empty()
    }

    /// The next packet for the guest, with up to `room` payload bytes read
    /// into `buf`.
    pub fn next_rx(
        &mut self,
        room: usize,
        buf: &mut [u8],
        now: Instant,
    ) -> Option<(VsockHeader, usize)> {
        if let Some((local, peer)) = self.resets.pop_front() {
            return Some((
                VsockHeader::to_guest(self.guest_cid, local, peer, op::RST),
                0,
            ));
        }
        for _ in 0..self.rxq.len() {
            let key = self.rxq.pop_front()?;
            let Some(c) = self.conns.get_mut(&key) else {
                continue;
            };
            c.in_rxq = false;
            let got = c.next_rx(self.guest_cid, room, buf, now, &self.metrics);
            self.sync(key);
            if got.is_some() {
                return got;
            }
        }
        None
    }

    /// The earliest deadline of a handshake or a connection.
    pub fn next_deadline(&self) -> Option<Instant> {
        let h = self.handshakes.values().map(|h| h.deadline);
        let c = self.conns.values().filter_map(|c| c.deadline);
        h.chain(c).min()
    }

    /// Closes handshakes and resets connections whose deadline passed.
    pub fn expire(&mut self, now: Instant) {
        let late: Vec<u64> = self
            .handshakes
            .iter()
            .filter(|(_, h)| now >= h.deadline)
            .map(|(t, _)| *t)
            .collect();
        for t in late {
            self.metrics.conns_refused.inc();
            self.drop_handshake(t);
        }
        let late: Vec<ConnKey> = self
            .conns
            .iter()
            .filter(|(_, c)| c.deadline.is_some_and(|d| now >= d))
            .map(|(k, _)| *k)
            .collect();
        for key in late {
            if let Some(c) = self.conns.get_mut(&key) {
                c.expire(now, &self.metrics);
            }
            self.sync(key);
        }
    }
}
