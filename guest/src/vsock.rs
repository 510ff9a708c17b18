//! `vsock=echo:<port>` / `vsock=connect:<port>`: the first virtio-vsock
//! through `virtio-drivers`' `VirtIOSocket` and `VsockConnectionManager`,
//! with credit as the crate keeps it (each packet we send carries our
//! buf_alloc and fwd_cnt; a send the host has no room for is refused by
//! the crate, which sends one CREDIT_REQUEST; a CREDIT_REQUEST from the
//! host is answered CREDIT_UPDATE by the manager).
//!
//! echo: the manager accepts REQUESTs to `<port>` (and RSTs others);
//! every byte of a connection is read as it arrives and sent back as the
//! host's credit allows; when the connection closes (the host's SHUTDOWN,
//! which the manager answers RST, or the host's RST) the line says how many
//! bytes went back.
//!
//! connect: REQUEST from (guest_cid, 49152) to (2, `<port>`), the greeting
//! as one RW, SHUTDOWN (RCV|SEND), then the host's RST (or SHUTDOWN, which
//! the manager answers RST); each wait is 20 s at most. Bytes the host
//! sends are read and dropped.
//!
//! Limits of the crate, not worked around: sends wait for the tx used ring
//! with no bound (`add_notify_wait_pop`), so a device that never completes
//! a tx packet hangs the guest; the event queue gets no buffers, so a
//! TRANSPORT_RESET is never seen; bytes not yet echoed when the host shuts
//! the connection down are dropped (the manager RSTs at once).

use alloc::boxed::Box;
use alloc::vec::Vec;

use virtio_drivers::device::socket::{
    SocketError, VirtIOSocket, VsockAddr, VsockConnectionManager, VsockEvent, VsockEventType,
    VMADDR_CID_HOST,
};
use virtio_drivers::transport::DeviceType;
use virtio_drivers::Error;

use crate::cmdline::{Options, Vsock};
use crate::devices::{find, status, GuestTransport, Serve};
use crate::hal::GuestHal;
use crate::io::Deadline;
use crate::say;

/// Bytes per rx buffer, the 44-byte header included.
const RX_BUF: usize = 4096;
/// Our receive buffer per connection: the buf_alloc the host is given
/// (the firmware gives 16 KiB too).
const CONN_BUF: u32 = 16 * 1024;
/// Most bytes in one RW we send.
const MAX_PACKET: usize = 4096;
/// Bytes read but not yet echoed, per connection, past which no more are
/// read (so the host's credit, not our heap, bounds what it sends).
const PENDING_CAP: usize = 64 * 1024;
/// Our port for `vsock=connect:`.
const LOCAL_PORT: u32 = 49152;
/// What `vsock=connect:` sends.
const GREETING: &[u8] = b"hello from teravm guest\n";
/// Each wait of `vsock=connect:`.
const WAIT_MS: u64 = 20_000;
/// Most packets handled in one serve round.
const EVENTS_PER_POLL: usize = 16;
/// Driver errors in serving before the device is given up.
const MAX_ERRORS: u32 = 64;

type Manager = VsockConnectionManager<GuestHal, GuestTransport, RX_BUF>;

/// Prints a driver error in the firmware's words where it has them.
fn say_error(what: &str, e: Error) {
    match e {
        Error::SocketDeviceError(s) => say!("vsock {}error {}", what, socket_words(s)),
        e => say!("vsock {}error {}", what, status(e)),
    }
}

fn socket_words(e: SocketError) -> &'static str {
    match e {
        SocketError::ConnectionExists => "connection exists",
        SocketError::NotConnected => "not connected",
        SocketError::PeerSocketShutdown => "peer shut down",
        SocketError::BufferTooShort => "packet shorter than its header",
        SocketError::OutputBufferTooShort(_) => "host sent more than its credit",
        SocketError::BufferTooLong(..) => "buffer too long",
        SocketError::UnknownOperation(_) => "unknown operation",
        SocketError::InvalidOperation => "invalid operation",
        SocketError::InvalidNumber => "invalid number",
        SocketError::UnexpectedDataInPacket => "unexpected data in packet",
        SocketError::InsufficientBufferSpaceInPeer => "no credit",
        SocketError::RecycledWrongBuffer => "recycled wrong buffer",
    }
}

/// Sets the first virtio-vsock up and does what `vsock=` asks: echo
/// returns the device to serve; connect is done here.
pub fn start(options: &Options) -> Option<Box<dyn Serve>> {
    let mode = options.vsock?;
    let Some(found) = find(options, DeviceType::Socket, 0) else {
        say!("vsock error no device");
        return None;
    };
    let base = found.base;
    let driver = match VirtIOSocket::<GuestHal, _, RX_BUF>::new(found.transport) {
        Ok(d) => d,
        Err(e) => {
            say_error("", e);
            return None;
        }
    };
    let mut mgr = Manager::new_with_capacity(driver, CONN_BUF);
    say!(
        "vsock device at {:#x} features {:#x} cid {}",
        base,
        crate::devices::accepted_features(),
        mgr.guest_cid()
    );
    match mode {
        Vsock::Echo(port) => {
            mgr.listen(port);
            say!("vsock listening on {}", port);
            Some(Box::new(Echo {
                mgr,
                conns: Vec::new(),
                errors: 0,
                base,
            }))
        }
        Vsock::Connect(port) => {
            connect(&mut mgr, base, port);
            // Dropping the driver would take the queues from a device that
            // still holds our rx buffers; it is left as it is instead.
            core::mem::forget(mgr);
            None
        }
    }
}

/// One host connection being echoed.
struct Conn {
    peer: VsockAddr,
    port: u32,
    /// Read, not yet sent back.
    pending: Vec<u8>,
    /// Bytes sent back.
    echoed: u64,
}

/// `vsock=echo:` left serving.
pub struct Echo {
    mgr: Manager,
    conns: Vec<Conn>,
    errors: u32,
    /// The device's window (what the waits name).
    base: u64,
}

impl Echo {
    fn conn(&self, peer: VsockAddr, port: u32) -> Option<usize> {
        self.conns
            .iter()
            .position(|c| c.peer == peer && c.port == port)
    }

    fn handle(&mut self, ev: VsockEvent) {
        let (peer, port) = (ev.source, ev.destination.port);
        match ev.event_type {
            // Only those to our port get here (the manager RSTs others).
            VsockEventType::ConnectionRequest => {
                if self.conn(peer, port).is_none() {
                    self.conns.push(Conn {
                        peer,
                        port,
                        pending: Vec::new(),
                        echoed: 0,
                    });
                }
            }
            VsockEventType::Disconnected { .. } => {
                // The manager has forgotten it (and answered a SHUTDOWN
                // with RST): nothing more can be sent.
                if let Some(i) = self.conn(peer, port) {
                    let c = self.conns.swap_remove(i);
                    say!("vsock echo {} bytes", c.echoed);
                }
            }
            VsockEventType::Received { .. }
            | VsockEventType::Connected
            | VsockEventType::CreditRequest
            | VsockEventType::CreditUpdate => {}
        }
    }

    /// Reads what connection `i` holds and sends back what the host's
    /// credit allows. False if the connection is gone (after its line).
    fn pump(&mut self, i: usize) -> bool {
        let mut buf = [0u8; MAX_PACKET];
        let c = &mut self.conns[i];
        while c.pending.len() < PENDING_CAP {
            match self.mgr.recv_buffer_available_bytes(c.peer, c.port) {
                Ok(0) => break,
                Ok(_) => {}
                Err(_) => return self.gone(i),
            }
            let room = (PENDING_CAP - c.pending.len()).min(buf.len());
            match self.mgr.recv(c.peer, c.port, &mut buf[..room]) {
                Ok(n) => c.pending.extend_from_slice(&buf[..n]),
                Err(_) => return self.gone(i),
            }
        }
        let c = &mut self.conns[i];
        while !c.pending.is_empty() {
            // The host's free credit is the crate's to know: try smaller
            // packets until one fits (only the first refusal sends a
            // CREDIT_REQUEST, until the host's CREDIT_UPDATE).
            let mut n = c.pending.len().min(MAX_PACKET);
            loop {
                match self.mgr.send(c.peer, c.port, &c.pending[..n]) {
                    Ok(()) => break,
                    Err(Error::SocketDeviceError(SocketError::InsufficientBufferSpaceInPeer))
                        if n > 1 =>
                    {
                        n /= 2
                    }
                    Err(Error::SocketDeviceError(SocketError::InsufficientBufferSpaceInPeer)) => {
                        return true
                    }
                    Err(Error::SocketDeviceError(SocketError::NotConnected)) => {
                        return self.gone(i)
                    }
                    Err(e) => {
                        say_error("", e);
                        self.errors += 1;
                        return true;
                    }
                }
            }
            c.pending.drain(..n);
            c.echoed += n as u64;
        }
        true
    }

    /// Connection `i` was closed by the crate (it RSTs once a shut-down
    /// connection's bytes are all read).
    fn gone(&mut self, i: usize) -> bool {
        let c = self.conns.swap_remove(i);
        say!("vsock echo {} bytes", c.echoed);
        false
    }
}

impl Serve for Echo {
    fn poll(&mut self) -> bool {
        for _ in 0..EVENTS_PER_POLL {
            match self.mgr.poll() {
                Ok(Some(ev)) => self.handle(ev),
                Ok(None) => break,
                Err(e) => {
                    say_error("", e);
                    self.errors += 1;
                }
            }
        }
        let mut i = 0;
        while i < self.conns.len() {
            if self.pump(i) {
                i += 1;
            }
        }
        if self.errors >= MAX_ERRORS {
            say!("vsock error {} driver errors; device given up", self.errors);
            return false;
        }
        true
    }

    fn base(&self) -> u64 {
        self.base
    }
}

/// What a wait of `vsock=connect:` ended with.
enum Wait {
    /// The event waited for.
    Done,
    /// The host closed the connection (RST, or a SHUTDOWN answered RST).
    Closed,
    /// The deadline passed.
    TimedOut,
    /// A driver error (said).
    Failed,
}

/// Polls until `done` says an event for our connection is the one waited
/// for, the connection closes, or 20 s pass. Bytes the host sends are read
/// and dropped.
fn wait(
    mgr: &mut Manager,
    base: u64,
    host: VsockAddr,
    done: impl Fn(&VsockEventType) -> bool,
) -> Wait {
    let deadline = Deadline::after_ms(WAIT_MS);
    let mut sink = [0u8; MAX_PACKET];
    loop {
        match mgr.poll() {
            Ok(Some(ev)) if ev.source == host && ev.destination.port == LOCAL_PORT => {
                if done(&ev.event_type) {
                    return Wait::Done;
                }
                match ev.event_type {
                    VsockEventType::Disconnected { .. } => return Wait::Closed,
                    VsockEventType::Received { .. } => {
                        while let Ok(n) = mgr.recv(host, LOCAL_PORT, &mut sink) {
                            if n == 0 {
                                break;
                            }
                        }
                    }
                    _ => {}
                }
            }
            Ok(_) => {
                if deadline.passed() {
                    return Wait::TimedOut;
                }
                crate::io::wait_for(base, crate::io::WAIT_MS);
            }
            Err(e) => {
                say_error("connect ", e);
                return Wait::Failed;
            }
        }
    }
}

fn connect(mgr: &mut Manager, base: u64, port: u32) {
    let host = VsockAddr {
        cid: VMADDR_CID_HOST,
        port,
    };
    if let Err(e) = mgr.connect(host, LOCAL_PORT) {
        return say_error("connect ", e);
    }
    match wait(mgr, base, host, |t| *t == VsockEventType::Connected) {
        Wait::Done => {}
        Wait::Closed => return say!("vsock connect refused"),
        Wait::TimedOut => return say!("vsock connect error timed out"),
        Wait::Failed => return,
    }
    loop {
        match mgr.send(host, LOCAL_PORT, GREETING) {
            Ok(()) => break,
            Err(Error::SocketDeviceError(SocketError::InsufficientBufferSpaceInPeer)) => {
                // The crate has sent a CREDIT_REQUEST: wait for the update.
                match wait(mgr, base, host, |t| *t == VsockEventType::CreditUpdate) {
                    Wait::Done => {}
                    Wait::Closed => return say!("vsock connect error reset by the host"),
                    Wait::TimedOut => return say!("vsock connect error timed out"),
                    Wait::Failed => return,
                }
            }
            Err(e) => return say_error("connect ", e),
        }
    }
    if let Err(e) = mgr.shutdown(host, LOCAL_PORT) {
        return say_error("connect ", e);
    }
    match wait(mgr, base, host, |t| {
        matches!(t, VsockEventType::Disconnected { .. })
    }) {
        Wait::Done | Wait::Closed => {}
        Wait::TimedOut => {
            say!("vsock connect error no RST from the host");
            // Drop it on our side too (an RST), so the manager forgets it.
            let _ = mgr.force_close(host, LOCAL_PORT);
        }
        Wait::Failed => return,
    }
    say!("vsock connect sent {} bytes", GREETING.len());
}
