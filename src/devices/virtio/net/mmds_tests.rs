//! The MMDS detour against a hostile guest: ARP answered, malformed frames
//! and a SYN flood taken with bounded work and a bounded queue.

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use super::*;

const GUEST_MAC: [u8; 6] = [0x06, 0, 0xac, 0x10, 0, 2];
const GUEST_IP: [u8; 4] = [169, 254, 0, 2];
const MMDS_IP: [u8; 4] = [169, 254, 169, 254];

fn detour() -> MmdsDetour {
    MmdsDetour::new(MmdsLink {
        mmds: crate::mmds::shared(1024),
        ipv4: Ipv4Addr::from(MMDS_IP),
    })
}

fn arp_request() -> Vec<u8> {
    let mut f = vec![0xff; 6];
    f.extend(GUEST_MAC);
    f.extend([0x08, 0x06, 0, 1, 8, 0, 6, 4, 0, 1]);
    f.extend(GUEST_MAC);
    f.extend(GUEST_IP);
    f.extend([0; 6]);
    f.extend(MMDS_IP);
    f
}

fn syn(port: u16) -> Vec<u8> {
    let mut f = MMDS_MAC.to_vec();
    f.extend(GUEST_MAC);
    f.extend([0x08, 0x00]);
    f.extend([0x45, 0, 0, 40, 0, 0, 0x40, 0, 64, 6, 0, 0]);
    f.extend(GUEST_IP);
    f.extend(MMDS_IP);
    f.extend(port.to_be_bytes());
    f.extend(80u16.to_be_bytes());
    f.extend(1000u32.to_be_bytes());
    f.extend(0u32.to_be_bytes());
    f.extend([0x50, 0x02, 0xff, 0xff, 0, 0, 0, 0]);
    f
}

#[test]
fn arp_for_the_mmds_address_is_answered_with_its_mac() {
    let mut d = detour();
    let req = arp_request();
    assert_eq!(d.is_for_mmds(&req), Frame::Arp);
    d.take(&req, Frame::Arp);
    let mut buf = vec![0u8; 2048];
    let n = d.pop(&mut buf).expect("an ARP reply");
    let reply = &buf[VNET_HDR_BYTES..n];
    assert_eq!(&reply[..6], &GUEST_MAC);
    assert_eq!(&reply[6..12], &MMDS_MAC);
    assert_eq!(&reply[12..14], &[0x08, 0x06]);
    assert_eq!(&reply[20..22], &[0, 2], "an ARP reply");
    assert_eq!(&reply[28..32], &MMDS_IP);
    // ARP for another address, IPv4 elsewhere, runts: not the MMDS's.
    let mut other = req.clone();
    other[38..42].copy_from_slice(&[169, 254, 0, 1]);
    assert_eq!(d.is_for_mmds(&other), Frame::NotMmds);
    let mut elsewhere = syn(1);
    elsewhere[30..34].copy_from_slice(&[10, 0, 0, 1]);
    assert_eq!(d.is_for_mmds(&elsewhere), Frame::NotMmds);
    assert_eq!(d.is_for_mmds(&req[..13]), Frame::NotMmds);
    let mut udp = syn(1);
    udp[23] = 17;
    assert_eq!(d.is_for_mmds(&udp), Frame::Other);
}

#[test]
fn malformed_frames_and_a_syn_flood_are_bounded() {
    let mut d = detour();
    let start = Instant::now();
    // Truncations and garbage of every length after a valid head.
    let good = syn(1234);
    for len in 14..good.len() {
        let f = &good[..len];
        let kind = d.is_for_mmds(f);
        if kind != Frame::NotMmds {
            d.take(f, kind);
        }
    }
    let mut x = 0x1234_5678u32;
    for _ in 0..2000 {
        let mut f = good.clone();
        for b in f.iter_mut().skip(34) {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            *b = x as u8;
        }
        d.take(&f, Frame::Tcp);
    }
    // A flood of SYNs (after an ARP, so the stack knows where to answer),
    // none read back by the guest: the queue stays bounded, the excess is
    // dropped and counted.
    d.take(&arp_request(), Frame::Arp);
    for port in 0..20_000u16 {
        d.take(&syn(1024 + port % 30_000), Frame::Tcp);
    }
    assert!(d.phy.tx.len() <= MAX_QUEUED);
    let c = d.counts();
    assert!(c.tx_dropped > 0, "{c:?}");
    assert!(c.rx_frames >= 22_000, "{c:?}");
    assert!(
        start.elapsed() < Duration::from_secs(20),
        "{:?}",
        start.elapsed()
    );
    // Drained, it still answers ARP.
    let mut buf = vec![0u8; 2048];
    while d.pop(&mut buf).is_some() {}
    d.take(&arp_request(), Frame::Arp);
    assert!(d.has_output());
}
