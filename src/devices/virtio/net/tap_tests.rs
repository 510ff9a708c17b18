//! The network device over a real tap, in a network namespace of its own
//! (no KVM; MockSplitQueue is the driver, [`crate::devices::virtio::Worker::run_once`] the
//! device's thread).
//!
//! Setup, reusable for a KVM test: a fresh thread `unshare(CLONE_NEWNET)`s
//! (only that thread moves; the namespace, its tap and its addresses go
//! away when the thread has exited and the tap is closed, so nothing is
//! left to delete), then runs `ip tuntap add dev tvtap0 mode tap`, `ip addr
//! add 10.0.0.1/24 dev tvtap0` and `ip link set tvtap0 up` (children
//! inherit the thread's namespace). Host → guest: a UDP datagram sent to
//! 10.0.0.2 makes the kernel send an ARP request out of the tap, which the
//! device must put in a receive buffer. Guest → host: an Ethernet + IPv4 +
//! UDP frame to the tap's MAC and 10.0.0.1 in a transmit chain must arrive
//! at a UDP socket bound to 10.0.0.1. No traffic leaves the namespace.
//! Without root or `/dev/net/tun` the test is skipped with a reason (and
//! fails under `CI=true`).

use std::net::UdpSocket;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use virtio_bindings::virtio_ring::{VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
use virtio_queue::desc::{split::Descriptor, RawDescriptor};
use virtio_queue::mock::MockSplitQueue;
use virtio_queue::Queue;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::*;
use crate::devices::virtio::test_utils::queue_evts;
use crate::devices::virtio::ActiveState;
use crate::devices::virtio::Worker;
use crate::devices::virtio::{VirtioDevice, VirtioInterrupt, VirtioInterruptType};

const TAP: &str = "tvtap0";

fn skip(test: &str, reason: impl std::fmt::Display) {
    if std::env::var("CI").is_ok_and(|v| v.eq_ignore_ascii_case("true")) {
        panic!("{test} cannot run in CI (CI=true): {reason}");
    }
    eprintln!("SKIPPED {test}: {reason}");
}

fn ip(args: &[&str]) -> Result<String, String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Moves this thread into a new network namespace holding an up tap with
/// 10.0.0.1/24; the tap's MAC, or why not.
fn netns_with_tap() -> Result<[u8; 6], String> {
    if !std::path::Path::new("/dev/net/tun").exists() {
        return Err("no /dev/net/tun".into());
    }
    // SAFETY: unshare takes flags only and touches no memory of ours;
    // CLONE_NEWNET moves just the calling thread (a thread of the test's
    // own) into a fresh network namespace.
    if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
        return Err(format!(
            "cannot make a network namespace (root needed): {}",
            std::io::Error::last_os_error()
        ));
    }
    ip(&["tuntap", "add", "dev", TAP, "mode", "tap"])?;
    ip(&["addr", "add", "10.0.0.1/24", "dev", TAP])?;
    ip(&["link", "set", TAP, "up"])?;
    let show = ip(&["-o", "link", "show", "dev", TAP])?;
    let mac = show
        .split_whitespace()
        .skip_while(|w| *w != "link/ether")
        .nth(1)
        .ok_or_else(|| format!("no MAC in {show:?}"))?;
    let mut out = [0u8; 6];
    for (o, h) in out.iter_mut().zip(mac.split(':')) {
        *o = u8::from_str_radix(h, 16).map_err(|e| format!("{mac}: {e}"))?;
    }
    Ok(out)
}

fn desc(addr: u64, len: u32, flags: u32, next: u16) -> RawDescriptor {
    RawDescriptor::from(Descriptor::new(addr, len, flags as u16, next))
}

struct NoIrq;

impl VirtioInterrupt for NoIrq {
    fn trigger(&self, _: VirtioInterruptType) -> std::io::Result<()> {
        Ok(())
    }
}

fn ipv4_checksum(h: &[u8]) -> u16 {
    let mut sum: u32 = h
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], c[1]])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// A 12-byte zero virtio-net header, then Ethernet, IPv4 and UDP from
/// 10.0.0.2:4000 to 10.0.0.1:`port`.
fn udp_frame(dst_mac: [u8; 6], port: u16, payload: &[u8]) -> Vec<u8> {
    let mut f = vec![0u8; VNET_HDR_BYTES];
    f.extend_from_slice(&dst_mac);
    f.extend_from_slice(&[2, 0, 0, 0, 0, 2]);
    f.extend_from_slice(&0x0800u16.to_be_bytes());
    let total = (20 + 8 + payload.len()) as u16;
    let mut iph = vec![0x45, 0];
    iph.extend_from_slice(&total.to_be_bytes());
    iph.extend_from_slice(&[0, 0, 0x40, 0, 64, 17, 0, 0, 10, 0, 0, 2, 10, 0, 0, 1]);
    let c = ipv4_checksum(&iph);
    iph[10..12].copy_from_slice(&c.to_be_bytes());
    f.extend_from_slice(&iph);
    f.extend_from_slice(&4000u16.to_be_bytes());
    f.extend_from_slice(&port.to_be_bytes());
    f.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
    f.extend_from_slice(&[0, 0]); // no UDP checksum (IPv4 allows it)
    f.extend_from_slice(payload);
    f
}

/// Err: the namespace could not be set up (a skip); any later failure
/// panics.
fn run_in_netns() -> Result<(), String> {
    let tap_mac = netns_with_tap()?;
    // Open errors name the tap.
    let e = open_tap("tvnosuch0").unwrap_err();
    assert!(matches!(e, NetError::TapMissing(_)) && e.to_string().contains("tvnosuch0"));
    let e = open_tap("lo").unwrap_err();
    assert!(matches!(e, NetError::TapAttach { .. }), "{e}");
    let tap = open_tap(TAP).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(tap.name(), TAP);

    let mem = Arc::new(GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 16 << 20)]).unwrap());
    let opts = NetOptions {
        iface_id: "eth0".into(),
        guest_mac: Some([2, 0, 0, 0, 0, 2]),
        ..Default::default()
    };
    let mut net: Net<Arc<GuestMemoryMmap<()>>> = Net::new(opts, tap).unwrap();
    let qs: Vec<_> = (0..2u64)
        .map(|i| MockSplitQueue::create(&*mem, GuestAddress((1 << 20) + i * 0x1_0000), 64))
        .collect();
    let queues: Vec<Queue> = qs.iter().map(|q| q.create_queue().unwrap()).collect();
    let acked = net.avail_features();
    net.activate(ActiveState::new(
        mem.clone(),
        acked,
        queues,
        Arc::new(NoIrq),
    ))
    .unwrap();
    let rx_buf = 4u64 << 20;
    for i in 0..32u16 {
        qs[RX_INDEX]
            .add_desc_chains(
                &[desc(
                    rx_buf + u64::from(i) * 0x1_0000,
                    0x1_0000,
                    VRING_DESC_F_WRITE,
                    0,
                )],
                i,
            )
            .unwrap();
    }
    let net = Arc::new(Mutex::new(net));
    let (qevts, clones) = queue_evts(2);
    let mut w = Worker::start(net.clone(), clones, EventFd::new(EFD_NONBLOCK).unwrap()).unwrap();
    w.run_once(Some(std::time::Duration::from_millis(100)))
        .unwrap(); // the activation: offloads set
    assert_eq!(
        net.lock()
            .unwrap()
            .metrics()
            .snapshot()
            .activate_fails
            .get(),
        0
    );

    // Host -> guest: an ARP request for 10.0.0.2 reaches a receive buffer.
    let host = UdpSocket::bind("10.0.0.1:0").unwrap();
    host.send_to(b"hello", "10.0.0.2:9").unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut found = false;
    let mut seen = 0u16;
    while !found && Instant::now() < deadline {
        w.run_once(Some(std::time::Duration::from_millis(100)))
            .unwrap();
        let idx = qs[RX_INDEX].used().idx().load();
        for i in seen..idx {
            let at = qs[RX_INDEX].used_addr().0 + 4 + u64::from(i) * 8;
            let id: u32 = mem.read_obj(GuestAddress(at)).unwrap();
            let len: u32 = mem.read_obj(GuestAddress(at + 4)).unwrap();
            let mut f = vec![0u8; len as usize];
            mem.read_slice(&mut f, GuestAddress(rx_buf + u64::from(id) * 0x1_0000))
                .unwrap();
            let num_buffers = u16::from_le_bytes([f[10], f[11]]);
            assert_eq!(num_buffers, 1);
            let eth = &f[VNET_HDR_BYTES..];
            if eth.len() >= 42 && eth[12..14] == [8, 6] && eth[38..42] == [10, 0, 0, 2] {
                assert_eq!(eth[6..12], tap_mac, "sent by the host's side of the tap");
                found = true;
            }
        }
        seen = idx;
    }
    assert!(found, "no ARP request for 10.0.0.2 reached the guest");

    // Guest -> host: a UDP datagram from the guest reaches a host socket.
    let sink = UdpSocket::bind("10.0.0.1:0").unwrap();
    sink.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let port = sink.local_addr().unwrap().port();
    let f = udp_frame(tap_mac, port, b"from the guest");
    let tx_buf = 2u64 << 20;
    mem.write_slice(&f, GuestAddress(tx_buf)).unwrap();
    qs[TX_INDEX]
        .add_desc_chains(
            &[
                desc(tx_buf, 12, VRING_DESC_F_NEXT, 1),
                desc(tx_buf + 12, (f.len() - 12) as u32, 0, 0),
            ],
            0,
        )
        .unwrap();
    qevts[TX_INDEX].write(1).unwrap();
    w.run_once(Some(std::time::Duration::from_millis(1000)))
        .unwrap();
    let mut got = [0u8; 64];
    let (n, from) = sink.recv_from(&mut got).expect("the guest's datagram");
    assert_eq!(&got[..n], b"from the guest");
    assert_eq!(from.to_string(), "10.0.0.2:4000");
    let s = net.lock().unwrap().metrics().snapshot();
    assert_eq!(
        (s.tx_packets_count.get(), s.tx_fails.get()),
        (1, 0),
        "{s:?}"
    );
    assert!(s.rx_packets_count.get() >= 1, "{s:?}");
    Ok(())
}

#[test]
fn frames_cross_a_real_tap_in_a_network_namespace() {
    let t = "frames_cross_a_real_tap_in_a_network_namespace";
    // A thread of its own: only it enters the namespace, which goes away
    // with it.
    match std::thread::spawn(run_in_netns).join() {
        Ok(Ok(())) => {}
        Ok(Err(reason)) => skip(t, reason),
        Err(p) => std::panic::resume_unwind(p),
    }
}
