//! The test guest (issue 25) on the other VMMs: QEMU `-M microvm` and
//! Firecracker, each with its own virtio-mmio devices, driven by the
//! guest's drivers (the `virtio-drivers` crate; its own balloon driver).
//! Each case asserts the guest's result lines (`teravm guest: ...`, the
//! firmware's words) and what the host sees: the drive file's bytes, the
//! frames on the tap, the bytes over vsock, the balloon as the VMM reports
//! it. The launchers are tests/common/peers.rs.
//!
//! Where QEMU and Firecracker answer the same input differently, the test
//! says so at the assertion and /work/notes/i25/gpeers.md (docs/devices.md
//! once merged) says which the virtio spec supports.

mod common;

use std::io::Read;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};

use common::netns::{next_frame, packet_socket, Netns};
use common::peers::*;
use common::*;

const G: &str = "teravm guest: ";

/// The VMM binary for `kind`, or None having said why (KVM, QEMU,
/// Firecracker missing).
fn bin(kind: Kind, test: &str) -> Option<PathBuf> {
    if !kvm_or_skip(test) {
        return None;
    }
    assert!(
        guest().is_file(),
        "no test guest at {} (cargo build --release builds it)",
        guest().display()
    );
    match kind {
        Kind::Qemu => qemu(test),
        Kind::Firecracker => firecracker(test),
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A 1 MiB drive: a 16-byte signature, then bytes that are nowhere 0xa5
/// in sector 1, so a read back of the pattern can only be the guest's
/// write.
fn disk(dir: &Path) -> (PathBuf, Vec<u8>) {
    let path = dir.join("disk.img");
    let mut bytes: Vec<u8> = (0..1 << 20).map(|i| (i % 251) as u8).collect();
    bytes[..16].copy_from_slice(b"teravm-disk-0123");
    for b in &mut bytes[512..1024] {
        if *b == 0xa5 {
            *b = 0;
        }
    }
    std::fs::write(&path, &bytes).unwrap();
    (path, bytes)
}

/// What GET_ID answers for `d` on `kind` (QEMU: the `serial=`; Firecracker:
/// the file's dev/rdev/inode, whatever the drive_id).
fn expected_id(kind: Kind, path: &Path, id: &str) -> String {
    match kind {
        Kind::Qemu => id.to_string(),
        Kind::Firecracker => firecracker_blk_id(path),
    }
}

/// The guest asked for its reset (its last line) and the VMM exited 0 for
/// it: QEMU for the i8042 reset with `-no-reboot`, Firecracker for the
/// i8042 reset. (The guest's fallback, a triple fault, comes only after a
/// second with no stop: guest/src/io.rs `reset`; Firecracker exits 1 on a
/// triple fault.)
fn reset_exit(kind: Kind, (code, out, err): (i32, Vec<String>, String), what: &str) -> Vec<String> {
    eprintln!("{kind:?} console: {out:#?}");
    assert_eq!(
        out.last().map(String::as_str),
        Some("teravm guest: reset"),
        "{kind:?} {what}: the guest did not reset: stdout {out:?} stderr {err}"
    );
    assert_eq!(
        code, 0,
        "{kind:?} {what}: exit {code}: stdout {out:?} stderr {err}"
    );
    out
}

fn exited_ok(peer: Peer) -> Vec<String> {
    let kind = peer.kind;
    reset_exit(kind, peer.wait(), "exit")
}

fn stopped_ok(peer: Peer) -> Vec<String> {
    let kind = peer.kind;
    reset_exit(kind, peer.stop(), "stop")
}

/// VIRTIO_BLK_F_RO.
const RO: u64 = 1 << 5;

/// The accepted features of a `<name> device at 0x<base> features 0x<f>`
/// line.
fn features(line: &str) -> u64 {
    line.split(" features 0x")
        .nth(1)
        .and_then(|f| u64::from_str_radix(f.split(' ').next()?, 16).ok())
        .unwrap_or_else(|| panic!("no features in {line:?}"))
}

fn blk(kind: Kind, test: &str) {
    let Some(bin) = bin(kind, test) else { return };
    let _one = big_memory();
    let dir = temp_dir(test);
    let (path, bytes) = disk(&dir);
    let mut peer = Launch::new(kind, &bin, &dir, "touch=16 blk then=reset")
        .drive(&path, false, "gpeers-d0")
        .start();
    let found = peer.wait_line(&format!("{G}blk device at"));
    assert!(found.ends_with("capacity 2048 sectors"), "{found}");
    assert_eq!(features(&found) & RO, 0, "not read-only: {found}");
    let line = peer.wait_line(&format!("{G}blk sector0"));
    assert!(line.ends_with(&hex(&bytes[..16])), "{line}");
    let line = peer.wait_line(&format!("{G}blk write"));
    assert!(line.ends_with("blk write ok"), "{line}");
    let line = peer.wait_line(&format!("{G}blk readback"));
    assert!(line.ends_with("blk readback match"), "{line}");
    let line = peer.wait_line(&format!("{G}blk id"));
    let id = expected_id(kind, &path, "gpeers-d0");
    assert!(
        line.ends_with(&format!("blk id {id}")),
        "{kind:?} id {id:?}: {line}"
    );
    exited_ok(peer);
    let after = std::fs::read(&path).unwrap();
    assert_eq!(&after[512..1024], &[0xa5u8; 512][..], "sector 1 written");
    assert_eq!(&after[..512], &bytes[..512], "sector 0 untouched");
    assert_eq!(&after[1024..], &bytes[1024..], "nothing past sector 1");
}

fn blk_read_only(kind: Kind, test: &str) {
    let Some(bin) = bin(kind, test) else { return };
    let _one = big_memory();
    let dir = temp_dir(test);
    let (path, bytes) = disk(&dir);
    let mut peer = Launch::new(kind, &bin, &dir, "blk then=reset")
        .drive(&path, true, "gpeers-ro")
        .start();
    let found = peer.wait_line(&format!("{G}blk device at"));
    assert_ne!(
        features(&found) & RO,
        0,
        "VIRTIO_BLK_F_RO accepted: {found}"
    );
    let line = peer.wait_line(&format!("{G}blk sector0"));
    assert!(line.ends_with(&hex(&bytes[..16])), "{line}");
    let line = peer.wait_line(&format!("{G}blk write"));
    assert!(line.ends_with("blk write ioerr"), "{kind:?}: {line}");
    let line = peer.wait_line(&format!("{G}blk readback"));
    assert!(line.ends_with("blk readback mismatch"), "{line}");
    exited_ok(peer);
    assert_eq!(std::fs::read(&path).unwrap(), bytes, "the file changed");
}

const MAC: &str = "06:00:ac:10:00:02";
const MAC_BYTES: [u8; 6] = [6, 0, 0xac, 0x10, 0, 2];

fn net_echo(kind: Kind, test: &str) {
    let Some(bin) = bin(kind, test) else { return };
    let Some(ns) = Netns::new(test) else {
        skip(
            test,
            "cannot make a network namespace with a tap (ip, root)",
        );
        return;
    };
    let _one = big_memory();
    let dir = temp_dir(test);
    let fd = packet_socket(&ns);
    let mut peer = Launch::new(kind, &bin, &dir, "net=echo then=idle")
        .tap(&ns, MAC)
        .start();
    let sent = peer.wait_line(&format!("{G}net sent hello"));
    assert!(sent.ends_with(&format!("from {MAC}")), "{sent}");
    let hello = next_frame(&fd, T).expect("the guest's hello frame on the tap");
    assert_eq!(&hello[..6], &[0xff; 6], "broadcast");
    assert_eq!(&hello[6..12], &MAC_BYTES, "from the guest's MAC");
    assert!(
        hello.windows(16).any(|w| w == b"teravm guest net"),
        "{hello:02x?}"
    );
    let mut frame = MAC_BYTES.to_vec();
    frame.extend_from_slice(&[2, 0, 0, 0, 0, 9, 0x88, 0xB5]);
    frame.extend_from_slice(b"from the host side");
    send_frame(&fd, &frame);
    let echo = loop {
        let f = next_frame(&fd, T).expect("the echo of the host's frame");
        if f[..6] == [2, 0, 0, 0, 0, 9] {
            break f;
        }
    };
    assert_eq!(&echo[6..12], &MAC_BYTES, "MACs swapped");
    assert!(echo.windows(18).any(|w| w == b"from the host side"));
    peer.wait_line(&format!("{G}net echoed"));
    stopped_ok(peer);
}

/// Why a QEMU vsock case cannot run on this host, said (not a skip: no
/// machine CI runs on has vhost-vsock today, so CI must not fail on it).
fn qemu_vsock_unavailable(test: &str) -> bool {
    match vhost_vsock() {
        Ok(()) => false,
        Err(why) => {
            not_possible(test, why);
            true
        }
    }
}

fn vsock_echo(kind: Kind, test: &str) {
    if kind == Kind::Qemu && qemu_vsock_unavailable(test) {
        return;
    }
    let Some(bin) = bin(kind, test) else { return };
    let _one = big_memory();
    let dir = temp_dir(test);
    let uds = dir.join("v.sock");
    let cid = 3;
    let mut peer = Launch::new(kind, &bin, &dir, "vsock=echo:5000 then=idle")
        .vsock(cid, &uds)
        .start();
    peer.wait_line(&format!("{G}vsock listening on 5000"));
    for i in 0..3 {
        let mut s = match kind {
            Kind::Firecracker => {
                let (s, ok) = vsock_connect(&uds, 5000);
                assert!(ok.starts_with("OK "), "{ok:?}");
                s
            }
            Kind::Qemu => vsock_connect_cid(cid, 5000),
        };
        let msg = format!("echo me {i}\n");
        echoed(&mut s, msg.as_bytes());
        drop(s);
        let line = peer.wait_line(&format!("{G}vsock echo"));
        assert!(
            line.ends_with(&format!("echo {} bytes", msg.len())),
            "{line}"
        );
    }
    if kind == Kind::Firecracker {
        // Nobody listens on 5001 in the guest: the host connection is
        // closed without an OK.
        let (_s, line) = vsock_connect(&uds, 5001);
        assert!(!line.starts_with("OK"), "{line:?}");
    }
    stopped_ok(peer);
}

fn vsock_connect_case(kind: Kind, test: &str) {
    if kind == Kind::Qemu && qemu_vsock_unavailable(test) {
        return;
    }
    let Some(bin) = bin(kind, test) else { return };
    let _one = big_memory();
    let dir = temp_dir(test);
    let uds = dir.join("v.sock");
    // The host listens before the guest starts.
    let (fc_listener, qemu_listener) = match kind {
        Kind::Firecracker => (
            Some(UnixListener::bind(format!("{}_6000", uds.display())).unwrap()),
            None,
        ),
        Kind::Qemu => (None, Some(vsock_listen(6000))),
    };
    let mut peer = Launch::new(kind, &bin, &dir, "vsock=connect:6000 then=idle")
        .vsock(3, &uds)
        .start();
    let mut conn = match (&fc_listener, &qemu_listener) {
        (Some(l), _) => uds_accept(l),
        (_, Some(l)) => vsock_accept(l),
        _ => unreachable!(),
    };
    let mut got = String::new();
    conn.read_to_string(&mut got).unwrap();
    assert_eq!(got, "hello from teravm guest\n");
    let sent = peer.wait_line(&format!("{G}vsock connect"));
    assert!(sent.ends_with("connect sent 24 bytes"), "{sent}");
    stopped_ok(peer);
}

/// The balloon: inflated to a target set through the VMM's control
/// channel, the guest's `actual` as the VMM reports it, the guest's
/// statistics reaching the VMM, and deflated again.
fn balloon(kind: Kind, test: &str) {
    let Some(bin) = bin(kind, test) else { return };
    let _one = big_memory();
    let dir = temp_dir(test);
    let mem_mib = 256;
    let mut peer = Launch::new(kind, &bin, &dir, "touch=64 balloon then=idle")
        .mem_mib(mem_mib)
        .balloon(false)
        .start();
    peer.wait_line(&format!("{G}balloon device at"));
    peer.poll_stats(1);
    // 8 MiB, of the 64 touched.
    peer.set_balloon_pages(2048);
    peer.wait_line(&format!("{G}balloon actual 2048 pages"));
    let view = peer.balloon_until("actual 2048 pages", |v| v.actual_pages == 2048);
    assert_eq!(view.actual_pages, 2048);
    let view = peer.balloon_until("the guest's statistics", |v| v.total.is_some());
    eprintln!("{kind:?} balloon: {view:?}");
    let total = view.total.unwrap();
    let mem = mem_mib << 20;
    assert!(
        total <= mem && total >= mem - (mem >> 3),
        "MEMTOT {total} of {mem} bytes: {view:?}"
    );
    let free = view.free.expect("MEMFREE");
    assert!(free < total, "free {free} of {total}");
    // The touched 64 MiB are not free.
    assert!(free <= total - (64 << 20), "free {free} of {total}");
    peer.set_balloon_pages(0);
    peer.wait_line(&format!("{G}balloon actual 0 pages"));
    peer.balloon_until("deflated", |v| v.actual_pages == 0);
    stopped_ok(peer);
}

/// Free page reporting: 16 of the 64 touched MiB reported, and the guest
/// reads them back as zero (the VMM discarded them: they held the guest's
/// writes).
fn balloon_report(kind: Kind, test: &str) {
    let Some(bin) = bin(kind, test) else { return };
    let _one = big_memory();
    let dir = temp_dir(test);
    let mut peer = Launch::new(kind, &bin, &dir, "touch=64 balloon report=16 then=reset")
        .balloon(true)
        .start();
    let found = peer.wait_line(&format!("{G}balloon device at"));
    let line = peer.wait_line(&format!("{G}balloon reported"));
    assert!(
        line.ends_with("reported 16 MiB, read back zero: yes"),
        "{kind:?} ({found}): {line}"
    );
    exited_ok(peer);
}

macro_rules! matrix {
    ($($case:ident: $qemu:ident, $fc:ident;)*) => {$(
        #[test]
        fn $qemu() {
            $case(Kind::Qemu, stringify!($qemu));
        }
        #[test]
        fn $fc() {
            $case(Kind::Firecracker, stringify!($fc));
        }
    )*};
}

matrix! {
    blk: qemu_blk_reads_writes_reads_back_and_names_the_drive,
        firecracker_blk_reads_writes_reads_back_and_names_the_drive;
    blk_read_only: qemu_read_only_blk_refuses_the_write_and_the_file_is_unchanged,
        firecracker_read_only_blk_refuses_the_write_and_the_file_is_unchanged;
    net_echo: qemu_net_hello_reaches_the_tap_and_a_host_frame_is_echoed,
        firecracker_net_hello_reaches_the_tap_and_a_host_frame_is_echoed;
    vsock_echo: qemu_vsock_echoes_host_connections,
        firecracker_vsock_echoes_host_connections;
    vsock_connect_case: qemu_vsock_guest_connection_reaches_the_host,
        firecracker_vsock_guest_connection_reaches_the_host;
    balloon: qemu_balloon_follows_the_target_and_its_stats_reach_qemu,
        firecracker_balloon_follows_the_target_and_its_stats_reach_firecracker;
    balloon_report: qemu_reported_pages_read_back_zero,
        firecracker_reported_pages_read_back_zero;
}

/// `cargo build --release` leaves the test guest beside teravm, apart from
/// the built-in firmware (a flat binary inside teravm): an x86-64 ELF
/// executable whose PT_NOTE holds the Xen PVH entry note
/// (`XEN_ELFNOTE_PHYS32_ENTRY`, type 18, name "Xen"), pointing into an
/// executable PT_LOAD segment.
#[test]
fn the_test_guest_is_a_pvh_elf_beside_teravm() {
    let path = guest();
    assert_eq!(
        path.parent(),
        Path::new(teravm()).parent(),
        "beside the teravm binary"
    );
    let elf = std::fs::read(&path)
        .unwrap_or_else(|e| panic!("{} (cargo build --release builds it): {e}", path.display()));
    let u16_at = |o: usize| u16::from_le_bytes(elf[o..o + 2].try_into().unwrap());
    let u32_at = |o: usize| u32::from_le_bytes(elf[o..o + 4].try_into().unwrap());
    let u64_at = |o: usize| u64::from_le_bytes(elf[o..o + 8].try_into().unwrap());
    assert_eq!(&elf[..4], b"\x7fELF");
    assert_eq!(elf[4], 2, "ELFCLASS64");
    assert_eq!(elf[5], 1, "little-endian");
    assert_eq!(u16_at(16), 2, "ET_EXEC");
    assert_eq!(u16_at(18), 62, "EM_X86_64");
    let (phoff, phentsize, phnum) = (u64_at(0x20) as usize, u16_at(0x36) as usize, u16_at(0x38));
    assert_eq!(phentsize, 56);
    let mut loads = Vec::new();
    let mut entries = Vec::new();
    for i in 0..phnum as usize {
        let ph = phoff + i * phentsize;
        let (ty, flags) = (u32_at(ph), u32_at(ph + 4));
        let (offset, paddr, filesz, memsz) = (
            u64_at(ph + 8) as usize,
            u64_at(ph + 0x18),
            u64_at(ph + 0x20) as usize,
            u64_at(ph + 0x28),
        );
        match ty {
            1 => loads.push((paddr, memsz, flags)),
            4 => {
                let mut n = offset;
                while n + 12 <= offset + filesz {
                    let (namesz, descsz, kind) =
                        (u32_at(n) as usize, u32_at(n + 4) as usize, u32_at(n + 8));
                    let name = &elf[n + 12..n + 12 + namesz];
                    let desc = n + 12 + namesz.next_multiple_of(4);
                    if name == b"Xen\0" && kind == 18 {
                        entries.push(match descsz {
                            4 => u64::from(u32_at(desc)),
                            8 => u64_at(desc),
                            _ => panic!("PVH note of {descsz} bytes"),
                        });
                    }
                    n = desc + descsz.next_multiple_of(4);
                }
            }
            _ => {}
        }
    }
    assert_eq!(entries.len(), 1, "one XEN_ELFNOTE_PHYS32_ENTRY note");
    let entry = entries[0];
    assert!(entry < 1 << 32, "a 32-bit entry: {entry:#x}");
    assert!(
        loads
            .iter()
            .any(|&(p, m, f)| f & 1 != 0 && (p..p + m).contains(&entry)),
        "the entry {entry:#x} is in no executable PT_LOAD: {loads:x?}"
    );
}
