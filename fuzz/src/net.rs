//! What the fuzz target `net_queues` runs (a thin wrapper over
//! [`net_queues`]), over a [`RecordingBackend`] tap.
//!
//! Guest memory is two small regions with a hole between them (standing in
//! for the MMIO gap). Around every call into the device a
//! [`WriteCheck`] looks at the pages it wrote: the device may only have
//! written the used rings and buffers that some receive descriptor (direct
//! or in an indirect table) marks device-writable. Frames the device sends are
//! between the header and [`MAX_BUFFER_BYTES`] long; used lengths never
//! exceed it.

use std::collections::VecDeque;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::{Arc, Mutex, PoisonError};

use virtio_queue::{Queue, QueueT};
use vm_memory::{Address, Bytes, GuestAddress};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::driver::{memory, push_avail, take, Layout, Mem, NoIrq, Rings, WriteCheck};
use teravm::devices::virtio::net::features::{
    GUEST_CSUM, GUEST_TSO4, GUEST_TSO6, GUEST_UFO, MRG_RXBUF,
};
use teravm::devices::virtio::net::{
    Net, NetBackend, NetOptions, MAX_BUFFER_BYTES, RX_INDEX, VNET_HDR_BYTES,
};
use teravm::devices::virtio::ActiveState;
use teravm::devices::virtio::{QueueHandler, VirtioDevice};

/// What a [`RecordingBackend`] saw and holds.
#[derive(Debug, Default)]
pub struct Recorded {
    /// Frames the device wrote, with their headers.
    pub sent: Vec<Vec<u8>>,
    /// Frames waiting for the device to read, with their headers.
    pub to_guest: VecDeque<Vec<u8>>,
    /// Every `set_offload` call's flags.
    pub offloads: Vec<u32>,
    /// Reads the device made that returned a frame.
    pub reads: usize,
    /// Refuse writes (as a tap whose queue is gone).
    pub fail_writes: bool,
}

/// A backend that records what the device sends and hands it queued
/// frames; its fd is an eventfd written when a frame is queued.
#[derive(Debug, Clone)]
pub struct RecordingBackend {
    /// What it saw and holds.
    pub state: Arc<Mutex<Recorded>>,
    evt: Arc<EventFd>,
}

impl RecordingBackend {
    /// An empty backend.
    pub fn new() -> RecordingBackend {
        RecordingBackend {
            state: Arc::default(),
            evt: Arc::new(EventFd::new(EFD_NONBLOCK).expect("eventfd")),
        }
    }

    /// Locks what it saw.
    pub fn lock(&self) -> std::sync::MutexGuard<'_, Recorded> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues a frame (with its header) for the device and signals the fd.
    pub fn push(&self, frame: Vec<u8>) {
        self.lock().to_guest.push_back(frame);
        let _ = self.evt.write(1);
    }
}

impl Default for RecordingBackend {
    fn default() -> Self {
        RecordingBackend::new()
    }
}

impl AsRawFd for RecordingBackend {
    fn as_raw_fd(&self) -> RawFd {
        self.evt.as_raw_fd()
    }
}

impl NetBackend for RecordingBackend {
    fn read_frame(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let mut s = self.lock();
        let Some(f) = s.to_guest.pop_front() else {
            let _ = self.evt.read();
            return Err(std::io::ErrorKind::WouldBlock.into());
        };
        s.reads += 1;
        // A tap truncates what does not fit.
        let n = f.len().min(buf.len());
        buf[..n].copy_from_slice(&f[..n]);
        Ok(n)
    }

    fn write_frame(&mut self, frame: &[u8]) -> std::io::Result<usize> {
        let mut s = self.lock();
        if s.fail_writes {
            return Err(std::io::Error::from_raw_os_error(libc::EIO));
        }
        assert!(
            (VNET_HDR_BYTES..=MAX_BUFFER_BYTES).contains(&frame.len()),
            "frame of {} bytes sent",
            frame.len()
        );
        s.sent.push(frame.to_vec());
        Ok(frame.len())
    }

    fn set_offload(&mut self, tun_flags: u32) -> std::io::Result<()> {
        self.lock().offloads.push(tun_flags);
        Ok(())
    }
}

const KIB: u64 = 1 << 10;
/// Low RAM: [0, 256 KiB); the hole: [256, 512 KiB); high RAM: [512, 768 KiB).
const LOW_LEN: u64 = 256 * KIB;
const HIGH: u64 = 512 * KIB;
const HIGH_LEN: u64 = 256 * KIB;
/// Queue q's rings: descriptors at RING_BASE + q * RING_STRIDE, the
/// available ring 4 KiB above, the used ring 8 KiB above.
const RING_BASE: u64 = 4 * KIB;
const RING_STRIDE: u64 = 16 * KIB;
/// Where op 3 writes the driver's data.
const DATA_BASE: u64 = 64 * KIB;

fn activate(net: &mut Net<Mem>, mem: &Mem, acked: u64, size: u16) -> Vec<Rings> {
    let mut rings = Vec::new();
    let mut queues = Vec::new();
    for i in 0..2u64 {
        let r = Rings {
            base: RING_BASE + i * RING_STRIDE,
            size,
        };
        let _ = mem.write_slice(&[0u8; 4], r.avail());
        let _ = mem.write_slice(&[0u8; 4], r.used());
        let mut q = Queue::new(256).expect("256 is a valid queue size");
        let _ = q.try_set_size(size);
        let _ = q.try_set_desc_table_address(GuestAddress(r.base));
        let _ = q.try_set_avail_ring_address(r.avail());
        let _ = q.try_set_used_ring_address(r.used());
        q.set_ready(true);
        rings.push(r);
        queues.push(q);
    }
    let _ = net.activate(ActiveState::new(
        mem.clone(),
        acked,
        queues,
        Arc::new(NoIrq),
    ));
    rings
}

/// Test memory's RAM regions, for the shared driver.
const LAYOUT: Layout = Layout {
    low_len: LOW_LEN,
    high: HIGH,
    high_len: HIGH_LEN,
};

/// Runs `f` on the device and checks what it wrote.
fn checked(
    mem: &Mem,
    rings: &[Rings],
    check: &mut WriteCheck,
    net: &mut Net<Mem>,
    f: impl FnOnce(&mut Net<Mem>),
) {
    check.before(mem, rings, &rings[RX_INDEX]);
    f(net);
    check.after(mem);
    for r in rings {
        let idx: u16 = mem.read_obj(r.used().unchecked_add(2)).unwrap_or(0);
        for k in 0..r.size.min(idx) {
            let at = r.used().unchecked_add(8 + u64::from(k) * 8);
            let len: u32 = mem.read_obj(at).unwrap_or(0);
            // A guest may point a receive buffer at its own used ring.
            assert!(
                len as usize <= MAX_BUFFER_BYTES || check.buffer_overlaps(at.0, 4),
                "used length {len}"
            );
        }
    }
}

/// What the device's thread does on a wake: the passes marked pending.
fn wake(net: &mut Net<Mem>) {
    let pending = QueueHandler::wake(net).take();
    net.process_wake(pending);
}

/// `net_queues`: a running network device over a [`RecordingBackend`],
/// whose queues' descriptor tables, available rings, buffers and incoming
/// frames come from the input. Header: options (bit 0 a MAC, 1 the driver
/// drops `MRG_RXBUF`, 2 it drops the guest offloads), queue size
/// (`1 << (b % 9)`). Then ops, by `byte % 10`:
/// 0 descriptor `[q, index, sel, addr u32, len u32, flags, next]`;
/// 1 available entry `[q, head]`; 2 notify `[q]`; 3 data `[off u16, 8 bytes]`;
/// 4 a frame from the tap `[len u16, fill, hdr flags, gso type]`;
/// 5 tap readable; 6 reset and start again; 7 wake;
/// 8 available index `[q, u16]`; 9 toggle tap write failures.
/// Returns (frames sent, frames received).
pub fn net_queues(data: &[u8]) -> (u64, u64) {
    if data.len() < 2 {
        return (0, 0);
    }
    let (flags, size) = (data[0], 1u16 << (data[1] % 9));
    let mut rest = &data[2..];
    let mem = memory(&LAYOUT);
    let backend = RecordingBackend::new();
    let opts = NetOptions {
        iface_id: "eth0".into(),
        guest_mac: (flags & 1 != 0).then_some([2, 0, 0, 0, 0, 1]),
        ..Default::default()
    };
    let mut net: Net<Mem> = Net::with_backend(opts, Box::new(backend.clone())).expect("net device");
    let mut acked = net.avail_features();
    if flags & 2 != 0 {
        acked &= !MRG_RXBUF;
    }
    if flags & 4 != 0 {
        acked &= !(GUEST_CSUM | GUEST_TSO4 | GUEST_TSO6 | GUEST_UFO);
    }
    let mut rings = activate(&mut net, &mem, acked, size);
    let mut check = WriteCheck::default();
    checked(&mem, &rings, &mut check, &mut net, wake);
    while let Some(op) = take(1, &mut rest) {
        let q_of = |b: u8| usize::from(b) % 2;
        match op[0] % 10 {
            0 => {
                let Some(d) = take(13, &mut rest) else { break };
                LAYOUT.write_desc(&mem, &rings[q_of(d[0])], &d);
            }
            1 => {
                let Some(d) = take(2, &mut rest) else { break };
                push_avail(&mem, &rings[q_of(d[0])], u16::from(d[1]));
            }
            2 => {
                let Some(d) = take(1, &mut rest) else { break };
                checked(&mem, &rings, &mut check, &mut net, |n| {
                    n.process_queue(q_of(d[0]))
                });
            }
            3 => {
                let Some(d) = take(10, &mut rest) else { break };
                let off = u64::from(u16::from_le_bytes([d[0], d[1]])) * 8;
                let _ = mem.write_slice(&d[2..10], GuestAddress(DATA_BASE + off));
            }
            4 => {
                let Some(d) = take(5, &mut rest) else { break };
                let len = usize::from(u16::from_le_bytes([d[0], d[1]])) * 2;
                let mut f = vec![d[2]; len];
                if len >= 2 {
                    f[0] = d[3] & 1;
                    f[1] = d[4] % 6;
                }
                backend.push(f);
            }
            5 => checked(&mem, &rings, &mut check, &mut net, |n| n.process_tap()),
            6 => {
                net.reset();
                check.reset();
                rings = activate(&mut net, &mem, acked, size);
            }
            7 => checked(&mem, &rings, &mut check, &mut net, wake),
            8 => {
                let Some(d) = take(3, &mut rest) else { break };
                let r = &rings[q_of(d[0])];
                let idx = u16::from_le_bytes([d[1], d[2]]);
                let _ = mem.write_obj(idx, r.avail().unchecked_add(2));
            }
            _ => {
                let mut s = backend.lock();
                s.fail_writes = !s.fail_writes;
            }
        }
    }
    let m = net.metrics().snapshot();
    net.reset();
    assert!(!net.is_active());
    // However many frames waited in the tap, the device read at most one
    // more than it delivered, dropped or refused per pass.
    let s = backend.lock();
    assert!(s.reads as u64 <= m.rx_packets_count.get() + m.rx_dropped_frames.get() + 1);
    (m.tx_packets_count.get(), m.rx_packets_count.get())
}
