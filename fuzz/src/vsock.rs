//! What the fuzz target `vsock_queues` runs (a thin wrapper over
//! [`vsock_queues`]).
//!
//! Guest memory is two small regions with a hole between them; around every
//! call into the device a [`WriteCheck`] looks at the pages it wrote: only
//! the used rings and buffers an RX descriptor marks device-writable. The host side is real: a listener in a temporary directory, a
//! `<uds>_1` listener for guest connections, host streams the input opens,
//! writes, drains and closes.

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress};

use crate::driver::{memory, push_avail, take, Layout, Mem, NoIrq, Rings, WriteCheck};
use teravm::devices::virtio::vsock::packet::{VsockHeader, TYPE_STREAM};
use teravm::devices::virtio::vsock::RXQ;
use teravm::devices::virtio::vsock::{bind_uds, Vsock, VsockOptions, HOST_CID, LOCAL_PORT_FIRST};
use teravm::devices::virtio::ActiveState;
use teravm::devices::virtio::{QueueHandler, VirtioDevice, VIRTIO_F_VERSION_1};

const MIB: u64 = 1 << 20;
/// Low RAM: [0, 4 MiB); the hole: [4 MiB, 8 MiB); high RAM: [8 MiB, 12 MiB).
const LOW_LEN: u64 = 4 * MIB;
const HIGH: u64 = 8 * MIB;
const HIGH_LEN: u64 = 4 * MIB;
const RING_BASE: u64 = MIB;
const RING_STRIDE: u64 = 0x1_0000;
const DATA_BASE: u64 = 2 * MIB;
const CID: u64 = 3;

struct Dir(PathBuf);

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn activate(v: &mut Vsock<Mem>, mem: &Mem, size: u16) -> Vec<Rings> {
    let mut rings = Vec::new();
    let mut queues = Vec::new();
    for i in 0..3u64 {
        let r = Rings {
            base: RING_BASE + i * RING_STRIDE,
            size,
        };
        let _ = mem.write_slice(&[0u8; 4], r.avail());
        let _ = mem.write_slice(&[0u8; 4], GuestAddress(r.base + 0x2000));
        let mut q = Queue::new(256).expect("256 is a valid queue size");
        let _ = q.try_set_size(size);
        let _ = q.try_set_desc_table_address(GuestAddress(r.base));
        let _ = q.try_set_avail_ring_address(r.avail());
        let _ = q.try_set_used_ring_address(GuestAddress(r.base + 0x2000));
        q.set_ready(true);
        rings.push(r);
        queues.push(q);
    }
    let _ = v.activate(ActiveState::new(
        mem.clone(),
        VIRTIO_F_VERSION_1,
        queues,
        Arc::new(NoIrq),
    ));
    rings
}

/// What the device's thread does on a wake: the passes marked pending.
fn wake(v: &mut Vsock<Mem>) {
    let pending = QueueHandler::wake(v).take();
    v.process_wake(pending);
}

/// Runs `f` on the device and checks what it wrote.
fn checked(
    mem: &Mem,
    rings: &[Rings],
    check: &mut WriteCheck,
    v: &mut Vsock<Mem>,
    f: impl FnOnce(&mut Vsock<Mem>),
) {
    check.before(mem, rings, &rings[RXQ]);
    f(v);
    check.after(mem);
}

/// Test memory's RAM regions, for the shared driver.
const LAYOUT: Layout = Layout {
    low_len: LOW_LEN,
    high: HIGH,
    high_len: HIGH_LEN,
};

/// `vsock_queues`: a running vsock whose queues, buffers and host peers come
/// from the input. Header: queue size (`1 << (b % 9)`). Then ops, by
/// `byte % 8`:
/// 0 descriptor `[q, index, sel, addr u32, len u32, flags, next]`;
/// 1 available entry `[q, head]`; 2 notify `[q]`; 3 data `[off u16, 8 bytes]`;
/// 4 a well-formed guest packet on TX `[op, ports, len u16, credit u16]`
///   (`op % 9`, flags `op >> 6`; ports: bits 0-1 the host port, plus the
///   first host-initiated port with bit 3; bits 4-5 the guest port - 100;
///   credit in 4-byte units) in descriptor `255 - n % 64`, and a notify;
/// 5 host `[what, arg]`: connect with `CONNECT 100 + arg % 4`, write `arg *
///   64` bytes, drain the streams and accept at `<uds>_1`, close one;
/// 6 reset and start again; 7 host events and deadlines `[late]`.
/// Returns how many packets reached the guest.
pub fn vsock_queues(data: &[u8]) -> usize {
    let Some((&size_b, mut rest)) = data.split_first() else {
        return 0;
    };
    let size = 1u16 << (size_b % 9);
    static N: AtomicUsize = AtomicUsize::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let dir = Dir(std::env::temp_dir().join(format!("tvm-fz-{}-{n}", std::process::id())));
    let _ = std::fs::remove_dir_all(&dir.0);
    if std::fs::create_dir(&dir.0).is_err() {
        return 0;
    }
    let uds = dir.0.join("v");
    let Ok(listener) = bind_uds(&uds) else {
        return 0;
    };
    let port1 = UnixListener::bind(dir.0.join("v_1")).ok();
    if let Some(l) = &port1 {
        let _ = l.set_nonblocking(true);
    }
    let mem = memory(&LAYOUT);
    let opts = VsockOptions {
        guest_cid: CID,
        uds_path: uds.clone(),
    };
    let Ok(mut v) = Vsock::<Mem>::new(opts, listener) else {
        return 0;
    };
    let mut check = WriteCheck::default();
    let mut rings = activate(&mut v, &mem, size);
    checked(&mem, &rings, &mut check, &mut v, wake);
    let mut hosts: Vec<UnixStream> = Vec::new();
    let mut pkt_n: u16 = 0;
    while let Some(op) = take(1, &mut rest) {
        let q_of = |b: u8| usize::from(b) % 3;
        match op[0] % 8 {
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
                checked(&mem, &rings, &mut check, &mut v, |v| {
                    v.process_queue(q_of(d[0]))
                });
            }
            3 => {
                let Some(d) = take(10, &mut rest) else { break };
                let off = u64::from(u16::from_le_bytes([d[0], d[1]])) * 8;
                let _ = mem.write_slice(&d[2..10], GuestAddress(DATA_BASE + off));
            }
            4 => {
                let Some(d) = take(6, &mut rest) else { break };
                let len = u32::from(u16::from_le_bytes([d[2], d[3]]));
                let h = VsockHeader {
                    src_cid: CID,
                    dst_cid: HOST_CID,
                    src_port: 100 + u32::from((d[1] >> 4) & 3),
                    dst_port: u32::from(d[1] & 3) + u32::from(d[1] & 8 != 0) * LOCAL_PORT_FIRST,
                    len,
                    type_: TYPE_STREAM,
                    op: u16::from(d[0] % 9),
                    flags: u32::from(d[0] >> 6),
                    buf_alloc: u32::from(u16::from_le_bytes([d[4], d[5]])) * 4,
                    fwd_cnt: 0,
                };
                pkt_n = pkt_n.wrapping_add(1);
                let r = &rings[1];
                let i = (255 - pkt_n % 64) % r.size;
                let at = HIGH + u64::from(pkt_n % 32) * 0x2_0000;
                let _ = mem.write_slice(&h.to_bytes(), GuestAddress(at));
                let mut raw = [0u8; 16];
                raw[0..8].copy_from_slice(&at.to_le_bytes());
                raw[8..12].copy_from_slice(&(44 + len).to_le_bytes());
                let _ = mem.write_slice(&raw, r.desc(i));
                push_avail(&mem, r, i);
                checked(&mem, &rings, &mut check, &mut v, |v| v.process_queue(1));
            }
            5 => {
                let Some(d) = take(2, &mut rest) else { break };
                let i = usize::from(d[1]) % hosts.len().max(1);
                match d[0] % 4 {
                    0 if hosts.len() < 8 => {
                        if let Ok(mut s) = UnixStream::connect(&uds) {
                            let _ = s.set_nonblocking(true);
                            let _ = s.write(format!("CONNECT {}\n", 100 + d[1] % 4).as_bytes());
                            hosts.push(s);
                        }
                    }
                    1 if i < hosts.len() => {
                        let _ = hosts[i].write(&vec![d[1]; usize::from(d[1]) * 64]);
                    }
                    2 => {
                        let mut b = [0u8; 4096];
                        for s in &mut hosts {
                            while matches!(s.read(&mut b), Ok(n) if n > 0) {}
                        }
                        if let Some(l) = &port1 {
                            while let Ok((s, _)) = l.accept() {
                                let _ = s.set_nonblocking(true);
                                if hosts.len() < 8 {
                                    hosts.push(s);
                                }
                            }
                        }
                    }
                    3 if i < hosts.len() => drop(hosts.swap_remove(i)),
                    _ => {}
                }
            }
            6 => {
                v.reset();
                check.reset();
                rings = activate(&mut v, &mem, size);
                checked(&mem, &rings, &mut check, &mut v, wake);
            }
            _ => {
                let Some(d) = take(1, &mut rest) else { break };
                let late = Duration::from_millis(u64::from(d[0] & 1) * 5000);
                checked(&mem, &rings, &mut check, &mut v, |v| {
                    v.process_host();
                    v.process_timers(Instant::now() + late);
                    wake(v);
                });
            }
        }
        assert!(v.connections() <= teravm::devices::virtio::vsock::MAX_CONNECTIONS);
        assert!(
            v.buffered_bytes() <= 8 * teravm::devices::virtio::vsock::CONN_TX_BUF_BYTES as usize
        );
    }
    v.reset();
    v.metrics().rx_packets_count.get() as usize
}
