//! The vsock's flows and hostile guests, over plain guest memory with a
//! hand-written driver (no KVM) and real Unix sockets in a temporary
//! directory. The bounds and hostile guests are in [`bounds`].

mod bounds;
mod persist;

use std::io::{Read, Write};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use virtio_bindings::virtio_ring::VRING_DESC_F_WRITE;
use virtio_queue::{Queue, QueueT};
use vm_memory::{Address, Bytes, GuestAddress, GuestMemoryMmap};

use super::muxer::parse_connect;
use super::packet::{op, shutdown, HeaderFault, TYPE_STREAM};
use super::*;
use crate::devices::virtio::test_utils::{guest_memory, Irq};
use crate::devices::virtio::ActiveState;
use crate::devices::virtio::Worker;
use crate::devices::virtio::{VirtioDevice, VirtioInterrupt};

pub(super) use crate::devices::virtio::test_utils::Mem;
const MIB: u64 = 1 << 20;
const CID: u64 = 42;
const RING_BASE: u64 = MIB;
const TX_BASE: u64 = 8 * MIB;
const TX_STRIDE: u64 = 0x11000;
const RX_BASE: u64 = 32 * MIB;
const RX_STRIDE: u64 = 0x10000;
const SIZE: u16 = 256;

pub(super) struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new() -> TempDir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let p = std::env::temp_dir().join(format!("tvm-vsock-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir(&p).unwrap();
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The driver's side of one split queue: descriptor `i` is always used for
/// avail slot `i % SIZE`, so at most SIZE chains are outstanding.
struct Ring {
    base: u64,
    avail_idx: u16,
    used_seen: u16,
}

impl Ring {
    fn desc(&self, i: u16) -> GuestAddress {
        GuestAddress(self.base + u64::from(i % SIZE) * 16)
    }
    fn avail(&self) -> GuestAddress {
        GuestAddress(self.base + 0x1000)
    }
    fn used(&self) -> GuestAddress {
        GuestAddress(self.base + 0x2000)
    }
}

struct Rig {
    mem: Mem,
    dev: Vsock<Mem>,
    irq: Arc<Irq>,
    rings: Vec<Ring>,
    dir: TempDir,
    uds: PathBuf,
}

fn memory() -> Mem {
    guest_memory(&[(0, 64 * MIB)])
}

fn rig() -> Rig {
    let dir = TempDir::new();
    let uds = dir.0.join("v.sock");
    let l = bind_uds(&uds).unwrap();
    let opts = VsockOptions {
        guest_cid: CID,
        uds_path: uds.clone(),
    };
    let dev = Vsock::new(opts, l).unwrap();
    let mut r = Rig {
        mem: memory(),
        dev,
        irq: Arc::new(Irq::default()),
        rings: Vec::new(),
        dir,
        uds,
    };
    r.activate();
    r
}

pub(super) fn queues(mem: &GuestMemoryMmap<()>, base: u64) -> Vec<Queue> {
    (0..3u64)
        .map(|i| {
            let b = base + i * 0x10000;
            mem.write_slice(&[0u8; 4], GuestAddress(b + 0x1000))
                .unwrap();
            mem.write_slice(&[0u8; 4], GuestAddress(b + 0x2000))
                .unwrap();
            let mut q = Queue::new(SIZE).unwrap();
            q.try_set_desc_table_address(GuestAddress(b)).unwrap();
            q.try_set_avail_ring_address(GuestAddress(b + 0x1000))
                .unwrap();
            q.try_set_used_ring_address(GuestAddress(b + 0x2000))
                .unwrap();
            q.set_ready(true);
            q
        })
        .collect()
}

impl Rig {
    fn activate(&mut self) {
        let qs = queues(&self.mem, RING_BASE);
        self.rings = (0..3u64)
            .map(|i| Ring {
                base: RING_BASE + i * 0x10000,
                avail_idx: 0,
                used_seen: 0,
            })
            .collect();
        let irq: Arc<dyn VirtioInterrupt> = self.irq.clone();
        self.dev
            .activate(ActiveState::new(self.mem.clone(), 1 << 32, qs, irq))
            .unwrap();
        let _ = self.dev.wake_evt().read();
        {
            let p = self.dev.wake.take();
            self.dev.process_wake(p);
        }
    }

    /// Adds a one-descriptor chain to queue `q`; returns its index.
    fn add(&mut self, q: usize, addr: u64, len: u32, flags: u16) -> u16 {
        let r = &mut self.rings[q];
        let i = r.avail_idx % SIZE;
        let mut raw = [0u8; 16];
        raw[0..8].copy_from_slice(&addr.to_le_bytes());
        raw[8..12].copy_from_slice(&len.to_le_bytes());
        raw[12..14].copy_from_slice(&flags.to_le_bytes());
        self.mem.write_slice(&raw, r.desc(i)).unwrap();
        let slot = r.avail().unchecked_add(4 + u64::from(i) * 2);
        self.mem.write_obj(i, slot).unwrap();
        r.avail_idx = r.avail_idx.wrapping_add(1);
        self.mem
            .write_obj(r.avail_idx, r.avail().unchecked_add(2))
            .unwrap();
        i
    }

    /// New used entries of queue `q`: (id, len).
    fn used(&mut self, q: usize) -> Vec<(u16, u32)> {
        let r = &mut self.rings[q];
        let idx: u16 = self.mem.read_obj(r.used().unchecked_add(2)).unwrap();
        let mut out = Vec::new();
        while r.used_seen != idx {
            let at = r
                .used()
                .unchecked_add(4 + u64::from(r.used_seen % SIZE) * 8);
            let id: u32 = self.mem.read_obj(at).unwrap();
            let len: u32 = self.mem.read_obj(at.unchecked_add(4)).unwrap();
            out.push((id as u16, len));
            r.used_seen = r.used_seen.wrapping_add(1);
        }
        out
    }

    /// Gives the device `n` RX buffers of `len` bytes.
    fn give_rx(&mut self, n: usize, len: u32) {
        for _ in 0..n {
            let i = self.rings[RXQ].avail_idx % SIZE;
            self.add(
                RXQ,
                RX_BASE + u64::from(i) * RX_STRIDE,
                len,
                VRING_DESC_F_WRITE as u16,
            );
        }
        self.dev.process_queue(RXQ);
    }

    /// Packets the guest received since the last call.
    fn recv(&mut self) -> Vec<(VsockHeader, Vec<u8>)> {
        self.used(RXQ)
            .into_iter()
            .map(|(id, len)| {
                let mut b = vec![0u8; len as usize];
                let at = GuestAddress(RX_BASE + u64::from(id) * RX_STRIDE);
                self.mem.read_slice(&mut b, at).unwrap();
                let h = VsockHeader::parse(&b).unwrap();
                assert_eq!(h.len as usize, b.len() - HEADER_BYTES, "{h:?}");
                (h, b[HEADER_BYTES..].to_vec())
            })
            .collect()
    }

    /// The guest sends one packet (one readable descriptor).
    fn send_raw(&mut self, hdr: &VsockHeader, payload: &[u8], desc_len: Option<u32>) {
        let i = self.rings[TXQ].avail_idx % SIZE;
        let at = TX_BASE + u64::from(i) * TX_STRIDE;
        self.mem
            .write_slice(&hdr.to_bytes(), GuestAddress(at))
            .unwrap();
        self.mem
            .write_slice(payload, GuestAddress(at + HEADER_BYTES as u64))
            .unwrap();
        let len = desc_len.unwrap_or((HEADER_BYTES + payload.len()) as u32);
        self.add(TXQ, at, len, 0);
        self.dev.process_queue(TXQ);
    }

    fn send(&mut self, local: u32, peer: u32, op: u16, payload: &[u8]) {
        let h = guest_hdr(local, peer, op, payload.len() as u32);
        self.send_raw(&h, payload, None);
    }

    /// Lets the host side's events through.
    /// Serves the host side as the device's thread would: waits for the
    /// muxer's fd to be readable (the host action a test just made is
    /// usually there already; at most 100 ms), then serves it until
    /// nothing more is ready (a bounded number of passes).
    fn pump(&mut self) {
        let fd = self.dev.host_fd();
        let ready = |ms: i32| {
            let mut p = libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one pollfd, valid for the call; `fd` is the muxer's
            // epoll fd, open while the device lives.
            unsafe { libc::poll(&mut p, 1, ms) > 0 }
        };
        ready(100);
        for _ in 0..16 {
            self.dev.process_host();
            if !ready(0) {
                break;
            }
        }
    }

    fn m(&self) -> VsockMetrics {
        self.dev.metrics().snapshot()
    }
}

/// A guest header: from guest port `peer` to host port `local`, with 64 KiB
/// of buffer and nothing consumed.
fn guest_hdr(local: u32, peer: u32, op: u16, len: u32) -> VsockHeader {
    VsockHeader {
        src_cid: CID,
        dst_cid: HOST_CID,
        src_port: peer,
        dst_port: local,
        len,
        type_: TYPE_STREAM,
        op,
        flags: 0,
        buf_alloc: 64 * 1024,
        fwd_cnt: 0,
    }
}

fn ops(p: &[(VsockHeader, Vec<u8>)]) -> Vec<u16> {
    p.iter().map(|(h, _)| h.op).collect()
}

/// A host process connects with `CONNECT port`; returns its stream and the
/// request the guest saw.
fn host_connect(r: &mut Rig, port: u32) -> (UnixStream, VsockHeader) {
    let mut s = UnixStream::connect(&r.uds).unwrap();
    s.write_all(format!("CONNECT {port}\n").as_bytes()).unwrap();
    r.pump();
    let got = r.recv();
    assert_eq!(ops(&got), vec![op::REQUEST], "{got:?}");
    let h = got[0].0;
    assert_eq!((h.src_cid, h.dst_cid, h.dst_port), (HOST_CID, CID, port));
    assert!(h.src_port >= LOCAL_PORT_FIRST && h.src_port < 1 << 31);
    assert_eq!(h.buf_alloc, CONN_TX_BUF_BYTES);
    (s, h)
}

fn read_line(s: &mut UnixStream) -> String {
    s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let mut out = Vec::new();
    let mut b = [0u8; 1];
    while s.read(&mut b).unwrap() == 1 {
        out.push(b[0]);
        if b[0] == b'\n' {
            break;
        }
    }
    String::from_utf8(out).unwrap()
}

fn read_n(s: &mut UnixStream, n: usize) -> Vec<u8> {
    s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let mut b = vec![0u8; n];
    s.read_exact(&mut b).unwrap();
    b
}

/// Whether the device closed the stream (a reset if it left data unread).
fn at_eof(s: &mut UnixStream) -> bool {
    s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let mut b = [0u8; 4096];
    loop {
        match s.read(&mut b) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) => return e.kind() == std::io::ErrorKind::ConnectionReset,
        }
    }
}

#[test]
fn headers_and_connect_lines() {
    let h = guest_hdr(5, 6, op::RW, 3);
    assert_eq!(VsockHeader::parse(&h.to_bytes()), Some(h));
    assert_eq!(VsockHeader::parse(&[0; 43]), None);
    assert_eq!(h.check_from_guest(CID, 47), Ok(()));
    assert_eq!(h.check_from_guest(CID, 46), Err(HeaderFault::Len));
    assert_eq!(h.check_from_guest(CID + 1, 47), Err(HeaderFault::SrcCid));
    let mut d = h;
    d.dst_cid = CID;
    assert_eq!(d.check_from_guest(CID, 47), Err(HeaderFault::DstCid));
    d = h;
    d.len = MAX_PKT_PAYLOAD + 1;
    assert_eq!(d.check_from_guest(CID, usize::MAX), Err(HeaderFault::Len));
    assert_eq!(parse_connect(b"CONNECT 52"), Some(52));
    assert_eq!(parse_connect(b"connect 4294967295"), Some(u32::MAX));
    assert_eq!(parse_connect(b"CONNECT 4294967296"), None);
    assert_eq!(parse_connect(b"CONNECT"), None);
    assert_eq!(parse_connect(b"CONNECT 1 2"), None);
    assert_eq!(parse_connect(b"LISTEN 1"), None);
    assert_eq!(parse_connect(b"\xff 1"), None);
}

#[test]
fn features_config_and_options() {
    let r = rig();
    assert_eq!(r.dev.device_type(), VIRTIO_ID_VSOCK);
    assert_eq!(r.dev.avail_features(), 1 << 32);
    assert_eq!(r.dev.queue_max_sizes(), &[256, 256, 256]);
    let mut c = [0xffu8; 12];
    r.dev.read_config(0, &mut c);
    assert_eq!(u64::from_le_bytes(c[..8].try_into().unwrap()), CID);
    assert_eq!(c[8..], [0; 4]);
    for (cid, ok) in [(2u64, false), (3, true), (u64::from(u32::MAX) + 1, false)] {
        let d = TempDir::new();
        let p = d.0.join("s");
        let v = Vsock::<Mem>::new(
            VsockOptions {
                guest_cid: cid,
                uds_path: p.clone(),
            },
            bind_uds(&p).unwrap(),
        );
        assert_eq!(v.is_ok(), ok, "cid {cid}");
    }
}

#[test]
fn host_connects_guest_accepts_data_both_ways_then_host_closes() {
    let mut r = rig();
    r.give_rx(8, 4096);
    let (mut s, req) = host_connect(&mut r, 52);
    let local = req.src_port;
    r.send(local, 52, op::RESPONSE, &[]);
    assert_eq!(read_line(&mut s), format!("OK {local}\n"));
    s.write_all(b"hello").unwrap();
    r.pump();
    let got = r.recv();
    assert_eq!(ops(&got), vec![op::RW]);
    assert_eq!(got[0].1, b"hello");
    r.send(local, 52, op::RW, b"world");
    assert_eq!(read_n(&mut s, 5), b"world");
    drop(s);
    r.pump();
    let got = r.recv();
    assert_eq!(ops(&got), vec![op::SHUTDOWN]);
    assert_eq!(got[0].0.flags, shutdown::BOTH);
    assert_eq!(r.dev.connections(), 1);
    r.send(local, 52, op::RST, &[]);
    assert_eq!(r.dev.connections(), 0);
    let m = r.m();
    assert_eq!((m.conns_added.get(), m.conns_removed.get()), (1, 1));
    assert_eq!((m.rx_bytes_count.get(), m.tx_bytes_count.get()), (5, 5));
}

#[test]
fn a_host_half_close_closes_one_direction_only() {
    let mut r = rig();
    r.give_rx(8, 4096);
    let (mut s, req) = host_connect(&mut r, 52);
    let local = req.src_port;
    r.send(local, 52, op::RESPONSE, &[]);
    assert_eq!(read_line(&mut s), format!("OK {local}\n"));
    s.write_all(b"last words").unwrap();
    // The host shuts its write side only.
    s.shutdown(std::net::Shutdown::Write).unwrap();
    r.pump();
    let got = r.recv();
    assert_eq!(ops(&got), vec![op::RW, op::SHUTDOWN]);
    assert_eq!(got[0].1, b"last words");
    // "The sender sends no more": the guest may still send.
    assert_eq!(got[1].0.flags, shutdown::SEND);
    r.send(local, 52, op::RW, b"answer");
    assert_eq!(read_n(&mut s, 6), b"answer");
    assert_eq!(r.dev.connections(), 1);
    // The guest is done too: its shutdown ends it with our reset, and the
    // host reads EOF.
    let mut sh = guest_hdr(local, 52, op::SHUTDOWN, 0);
    sh.flags = shutdown::SEND;
    r.send_raw(&sh, &[], None);
    assert_eq!(ops(&r.recv()), vec![op::RST]);
    assert!(at_eof(&mut s));
    assert_eq!(r.dev.connections(), 0);
}

#[test]
fn a_full_close_after_a_half_close_resets() {
    let mut r = rig();
    r.give_rx(8, 4096);
    let (mut s, req) = host_connect(&mut r, 52);
    let local = req.src_port;
    r.send(local, 52, op::RESPONSE, &[]);
    assert_eq!(read_line(&mut s), format!("OK {local}\n"));
    s.shutdown(std::net::Shutdown::Write).unwrap();
    r.pump();
    assert_eq!(ops(&r.recv()), vec![op::SHUTDOWN]);
    drop(s);
    r.pump();
    assert_eq!(ops(&r.recv()), vec![op::RST]);
    assert_eq!(r.dev.connections(), 0);
}

#[test]
fn guest_refuses_a_host_connection_and_bad_lines_close() {
    let mut r = rig();
    r.give_rx(8, 4096);
    let (mut s, req) = host_connect(&mut r, 7);
    r.send(req.src_port, 7, op::RST, &[]);
    assert!(at_eof(&mut s));
    assert_eq!(r.dev.connections(), 0);
    // Not CONNECT; a line past 32 bytes; no line by the deadline.
    let mut bad = UnixStream::connect(&r.uds).unwrap();
    bad.write_all(b"HELLO 7\n").unwrap();
    let mut long = UnixStream::connect(&r.uds).unwrap();
    long.write_all(&[b'1'; 40]).unwrap();
    let mut slow = UnixStream::connect(&r.uds).unwrap();
    slow.write_all(b"CONN").unwrap();
    r.pump();
    assert!(at_eof(&mut bad));
    assert!(at_eof(&mut long));
    assert!(r.dev.next_timeout(Instant::now()).is_some());
    r.dev
        .process_timers(Instant::now() + Duration::from_millis(CONNECT_TIMEOUT_MS + 1));
    assert!(at_eof(&mut slow));
    assert!(r.recv().is_empty(), "no request for a bad line");
    assert_eq!(r.m().conns_refused.get(), 3);
    // A guest that never answers: reset at the deadline.
    let (mut s, req) = host_connect(&mut r, 8);
    r.dev
        .process_timers(Instant::now() + Duration::from_millis(CONNECT_TIMEOUT_MS + 1));
    assert!(at_eof(&mut s));
    let got = r.recv();
    assert_eq!(ops(&got), vec![op::RST]);
    assert_eq!(got[0].0.src_port, req.src_port);
}

#[test]
fn data_after_the_connect_line_is_not_swallowed() {
    let mut r = rig();
    r.give_rx(8, 4096);
    let mut s = UnixStream::connect(&r.uds).unwrap();
    s.write_all(b"connect 9\nearly").unwrap();
    r.pump();
    let got = r.recv();
    assert_eq!(ops(&got), vec![op::REQUEST]);
    let local = got[0].0.src_port;
    r.send(local, 9, op::RESPONSE, &[]);
    r.pump();
    let got = r.recv();
    assert_eq!(ops(&got), vec![op::RW]);
    assert_eq!(got[0].1, b"early");
}

#[test]
fn guest_connects_to_a_host_listener_and_a_refused_port_is_reset() {
    let mut r = rig();
    r.give_rx(8, 4096);
    let l = UnixListener::bind(format!("{}_1234", r.uds.display())).unwrap();
    r.send(1234, 5000, op::REQUEST, &[]);
    let got = r.recv();
    assert_eq!(ops(&got), vec![op::RESPONSE]);
    assert_eq!((got[0].0.src_port, got[0].0.dst_port), (1234, 5000));
    let (mut h, _) = l.accept().unwrap();
    r.send(1234, 5000, op::RW, b"hello from teravm firmware\n");
    assert_eq!(read_line(&mut h), "hello from teravm firmware\n");
    h.write_all(b"pong").unwrap();
    r.pump();
    let got = r.recv();
    assert_eq!(
        (ops(&got), got[0].1.clone()),
        (vec![op::RW], b"pong".to_vec())
    );
    // The guest closes: its shutdown, then our reset once the data is out.
    let mut sh = guest_hdr(1234, 5000, op::SHUTDOWN, 0);
    sh.flags = shutdown::BOTH;
    r.send_raw(&sh, &[], None);
    assert_eq!(ops(&r.recv()), vec![op::RST]);
    assert!(at_eof(&mut h));
    assert_eq!(r.dev.connections(), 0);
    // Nobody at <uds>_99: refused.
    r.send(99, 5001, op::REQUEST, &[]);
    let got = r.recv();
    assert_eq!(ops(&got), vec![op::RST]);
    assert_eq!((got[0].0.src_port, got[0].0.dst_port), (99, 5001));
    // Data for a connection that does not exist: reset.
    r.send(99, 5001, op::RW, b"x");
    assert_eq!(ops(&r.recv()), vec![op::RST]);
}

#[test]
fn the_worker_serves_a_host_connection_and_exits() {
    use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};
    let mut r = rig();
    for _ in 0..4 {
        let i = r.rings[RXQ].avail_idx;
        r.add(
            RXQ,
            RX_BASE + u64::from(i) * RX_STRIDE,
            4096,
            VRING_DESC_F_WRITE as u16,
        );
    }
    let uds = r.uds.clone();
    let mem = r.mem.clone();
    let rx_used = r.rings[RXQ].used();
    let dev = Arc::new(Mutex::new(std::mem::replace(&mut r.dev, {
        let p = r.dir.0.join("other");
        Vsock::new(
            VsockOptions {
                guest_cid: CID,
                uds_path: p.clone(),
            },
            bind_uds(&p).unwrap(),
        )
        .unwrap()
    })));
    let evts: Vec<EventFd> = (0..3)
        .map(|_| EventFd::new(EFD_NONBLOCK).unwrap())
        .collect();
    let kick = evts[RXQ].try_clone().unwrap();
    let exit = EventFd::new(EFD_NONBLOCK).unwrap();
    let w = Worker::start(dev.clone(), evts, exit.try_clone().unwrap()).unwrap();
    let t = std::thread::spawn(move || w.run());
    kick.write(1).unwrap();
    let mut s = UnixStream::connect(&uds).unwrap();
    s.write_all(b"CONNECT 3\n").unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while mem.read_obj::<u16>(rx_used.unchecked_add(2)).unwrap() == 0 {
        assert!(Instant::now() < deadline, "no request reached the guest");
        std::thread::sleep(Duration::from_millis(5));
    }
    exit.write(1).unwrap();
    t.join().unwrap().unwrap();
    assert_eq!(dev.lock().unwrap().connections(), 1);
}
