//! The vsock's bounds and hostile guests: the connection limit, credit
//! both ways, chains outside RAM, a flood of stray packets, the socket
//! file's mode and symlinks, the fuzz seeds; the CIDs taken.

use super::*;

#[test]
fn connections_are_bounded() {
    let mut r = rig();
    let l = UnixListener::bind(format!("{}_1", r.uds.display())).unwrap();
    l.set_nonblocking(true).unwrap();
    let mut held = Vec::new();
    let n = MAX_CONNECTIONS as u32 + 5;
    let mut got = Vec::new();
    for port in 0..n {
        if port % 200 == 0 {
            got.extend(r.recv());
            r.give_rx(200, 256);
        }
        r.send(1, 10_000 + port, op::REQUEST, &[]);
        if let Ok((s, _)) = l.accept() {
            s.set_nonblocking(false).unwrap();
            held.push(s);
        }
        assert!(r.dev.connections() <= MAX_CONNECTIONS);
    }
    got.extend(r.recv());
    let rst = got.iter().filter(|(h, _)| h.op == op::RST).count();
    let resp = got.iter().filter(|(h, _)| h.op == op::RESPONSE).count();
    assert_eq!((resp, rst), (MAX_CONNECTIONS, 5));
    assert_eq!(r.dev.connections(), MAX_CONNECTIONS);
    // A host connection past the limit is closed at once.
    let mut s = UnixStream::connect(&r.uds).unwrap();
    r.pump();
    assert!(at_eof(&mut s));
    r.dev.reset();
    assert_eq!(r.dev.connections(), 0);
    assert!(at_eof(&mut held[0]), "a reset closes the host streams");
}

/// An established guest-initiated connection with the host side accepted.
fn established(r: &mut Rig, port: u32) -> (UnixListener, UnixStream) {
    let l = UnixListener::bind(format!("{}_{port}", r.uds.display())).unwrap();
    r.send(port, 7000, op::REQUEST, &[]);
    assert_eq!(ops(&r.recv()), vec![op::RESPONSE]);
    let (h, _) = l.accept().unwrap();
    (l, h)
}

#[test]
fn a_host_that_does_not_read_bounds_the_buffer_and_a_guest_past_credit_is_reset() {
    let mut r = rig();
    r.give_rx(16, 4096);
    let (_l, mut h) = established(&mut r, 80);
    // Fill the host's socket buffer, then ours, within credit.
    let chunk = vec![0xa5u8; 16 * 1024];
    let mut sent = 0usize;
    while r.dev.buffered_bytes() + chunk.len() <= CONN_TX_BUF_BYTES as usize {
        r.send(80, 7000, op::RW, &chunk);
        sent += chunk.len();
        assert!(sent < 64 * MIB as usize, "the host socket never filled");
    }
    assert!(r.recv().iter().all(|(h, _)| h.op != op::RST));
    assert!(r.dev.buffered_bytes() <= CONN_TX_BUF_BYTES as usize);
    // The host reads everything: the buffer drains, the guest gets credit.
    let mut got = 0;
    h.set_nonblocking(true).unwrap();
    let mut b = vec![0u8; 1 << 20];
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while got < sent {
        assert!(
            std::time::Instant::now() < deadline,
            "the host read {got} of the {sent} bytes sent"
        );
        match h.read(&mut b) {
            Ok(n) => got += n,
            Err(_) => r.pump(),
        }
    }
    assert_eq!(r.dev.buffered_bytes(), 0);
    let up = r.recv();
    let last = up.last().unwrap().0;
    assert_eq!(last.op, op::CREDIT_UPDATE);
    assert_eq!(last.fwd_cnt as usize, sent);
    // Now a guest that ignores credit: the host stops reading again and the
    // guest sends past the buffer.
    let mut over = false;
    for _ in 0..(64 * MIB as usize / chunk.len()) {
        r.send(80, 7000, op::RW, &chunk);
        assert!(r.dev.buffered_bytes() <= CONN_TX_BUF_BYTES as usize);
        if r.m().credit_violations.get() > 0 {
            over = true;
            break;
        }
    }
    assert!(over);
    let last = ops(&r.recv());
    assert_eq!(last.last(), Some(&op::RST), "{last:?}");
    assert!(last[..last.len() - 1]
        .iter()
        .all(|&o| o == op::CREDIT_UPDATE));
    assert_eq!(r.dev.connections(), 0);
    assert_eq!(r.dev.buffered_bytes(), 0);
}

#[test]
fn a_guest_that_does_not_read_stops_the_host_reads() {
    let mut r = rig();
    r.give_rx(64, 4096);
    let (_l, mut h) = established(&mut r, 81);
    // The guest offered 64 KiB: the host's 1 MiB stops there.
    h.set_nonblocking(true).unwrap();
    let data = vec![7u8; 1 << 20];
    let mut off = 0;
    while let Ok(n) = h.write(&data[off..]) {
        off += n;
    }
    r.pump();
    let got: usize = r.recv().iter().map(|(_, d)| d.len()).sum();
    assert_eq!(got, 64 * 1024, "exactly the guest's credit");
    r.pump();
    assert!(r.recv().is_empty());
    // The guest consumed it all: more comes.
    let mut up = guest_hdr(81, 7000, op::CREDIT_UPDATE, 0);
    up.fwd_cnt = 64 * 1024;
    r.send_raw(&up, &[], None);
    r.give_rx(0, 0);
    r.pump();
    let more: usize = r.recv().iter().map(|(_, d)| d.len()).sum();
    assert!(more > 0 && more <= 64 * 1024, "{more}");
    // A credit request is answered.
    r.send(81, 7000, op::CREDIT_REQUEST, &[]);
    assert_eq!(ops(&r.recv()), vec![op::CREDIT_UPDATE]);
}

#[test]
fn hostile_packets_are_dropped_and_every_chain_returned() {
    let mut r = rig();
    r.give_rx(8, 4096);
    let good = guest_hdr(1, 2, op::REQUEST, 0);
    let mut wrong_src = good;
    wrong_src.src_cid = CID + 1;
    let mut wrong_dst = good;
    wrong_dst.dst_cid = 1;
    let mut long = guest_hdr(1, 2, op::RW, 100);
    r.send_raw(&wrong_src, &[], None);
    r.send_raw(&wrong_dst, &[], None);
    r.send_raw(&long, &[0; 10], None); // len above the chain
    long.len = MAX_PKT_PAYLOAD + 1;
    r.send_raw(&long, &[], Some(u32::MAX)); // len above the limit
    r.send_raw(&good, &[], Some(20)); // short header
                                      // Outside RAM.
    r.add(TXQ, 64 * MIB, 44, 0);
    r.add(TXQ, 64 * MIB - 10, 44, 0);
    r.dev.process_queue(TXQ);
    assert_eq!(r.used(TXQ).len(), 7);
    assert_eq!(r.m().tx_packets_dropped.get(), 7);
    assert!(r.recv().is_empty(), "dropped packets get no answer");
    // A type the device does not speak: reset.
    let mut dgram = good;
    dgram.type_ = 2;
    r.send_raw(&dgram, &[], None);
    assert_eq!(ops(&r.recv()), vec![op::RST]);
}

#[test]
fn hostile_rx_chains_are_returned_unused() {
    let mut r = rig();
    r.send(1, 2, op::RW, b"x"); // a reset is owed
    r.add(RXQ, 64 * MIB - 8, 4096, VRING_DESC_F_WRITE as u16); // past RAM
    r.add(RXQ, RX_BASE, 10, VRING_DESC_F_WRITE as u16); // no room for a header
    r.add(RXQ, RX_BASE, 4096, 0); // not writable
    r.dev.process_queue(RXQ);
    assert_eq!(r.m().rx_chains_dropped.get(), 3);
    assert_eq!(
        r.used(RXQ).iter().map(|u| u.1).collect::<Vec<_>>(),
        [0, 0, 0]
    );
    r.give_rx(1, 4096);
    assert_eq!(ops(&r.recv()), vec![op::RST]);
}

#[test]
fn a_reset_stream_of_stray_packets_cannot_grow_the_reset_queue() {
    let mut r = rig();
    // No RX buffers: every reset waits; the TX queue stops at the bound.
    for i in 0..(MAX_PENDING_RESETS + 50) as u32 {
        let h = guest_hdr(1, i, op::RW, 0);
        let at = TX_BASE + u64::from(i % SIZE as u32) * TX_STRIDE;
        r.mem.write_slice(&h.to_bytes(), GuestAddress(at)).unwrap();
        r.add(TXQ, at, 44, 0);
        if i % 200 == 199 {
            r.dev.process_queue(TXQ);
            let _ = r.used(TXQ);
        }
    }
    r.dev.process_queue(TXQ);
    let _ = r.used(TXQ);
    assert_eq!(r.m().tx_packets_count.get() as usize, MAX_PENDING_RESETS);
    // Buffers arrive: the resets go out and the TX queue resumes.
    r.give_rx(255, 256);
    assert!(r.dev.wake_evt().read().unwrap() > 0);
    {
        let p = r.dev.wake.take();
        r.dev.process_wake(p);
    }
    r.give_rx(0, 0);
    assert_eq!(r.recv().len(), 255);
    assert_eq!(
        r.m().tx_packets_count.get() as usize,
        MAX_PENDING_RESETS + 50
    );
}

#[test]
fn socket_file_is_0600_and_symlinks_and_files_are_refused() {
    let d = TempDir::new();
    let p = d.0.join("api.vsock");
    // SAFETY: umask takes no pointers; a permissive umask for this test.
    let old = unsafe { libc::umask(0) };
    let l = bind_uds(&p);
    // SAFETY: as above, restoring the old umask.
    unsafe { libc::umask(old) };
    let l = l.unwrap();
    let m = std::fs::symlink_metadata(&p).unwrap();
    assert!(m.file_type().is_socket());
    assert_eq!(m.permissions().mode() & 0o7777, 0o600);
    // A live socket is refused, and so is a stale one (as Firecracker's
    // bind refuses it: the caller removes it).
    assert!(matches!(bind_uds(&p), Err(VsockError::PathExists(_))));
    drop(l);
    assert!(matches!(bind_uds(&p), Err(VsockError::PathExists(_))));
    // A symlink (to nothing, or to a file) is refused, its target untouched.
    let target = d.0.join("target");
    let link = d.0.join("link");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    assert!(matches!(bind_uds(&link), Err(VsockError::PathExists(_))));
    assert!(!target.exists());
    std::fs::write(&target, b"keep").unwrap();
    assert!(matches!(bind_uds(&link), Err(VsockError::PathExists(_))));
    assert!(matches!(bind_uds(&target), Err(VsockError::PathExists(_))));
    assert_eq!(std::fs::read(&target).unwrap(), b"keep");
    let long = d.0.join("x".repeat(120));
    assert!(matches!(bind_uds(&long), Err(VsockError::BadPath(..))));
}

#[test]
fn cid_0_is_taken_as_firecracker_takes_it_and_1_and_2_refused() {
    // firecracker-containerd's vsock has no CID: go-sdk sends 0, and
    // Firecracker builds the device with it.
    let dir = TempDir::new();
    for cid in [0u64, 1, 2, 3] {
        let uds = dir.0.join(format!("v{cid}.sock"));
        let opts = VsockOptions {
            guest_cid: cid,
            uds_path: uds.clone(),
        };
        let made = Vsock::<Mem>::new(opts, bind_uds(&uds).unwrap());
        match cid {
            1 | 2 => assert!(
                matches!(made, Err(VsockError::ReservedCid(c)) if c == cid),
                "{cid}: {:?}",
                made.err()
            ),
            _ => assert!(made.is_ok(), "{cid}: {:?}", made.err()),
        }
    }
}
