//! Block, net and vsock on the real binary and /dev/kvm with the default
//! flags (issue 18): the built-in firmware's drivers (`blk`,
//! `net=echo`, `vsock=echo:<port>`, `vsock=connect:<port>`) against
//! teravm's virtio-mmio devices, configured over the API as Firecracker's
//! clients do.

mod common;

use std::io::{Read, Write};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::api::*;
use common::guests::Guest;
use common::netns::{next_frame, packet_socket, Netns};
use common::peers::{echoed, uds_accept, vsock_connect};
use common::*;

/// teravm with an API socket in `dir`, configured by `sections` (path,
/// body) and the firmware's `args`, started.
fn start_with(
    g: Guest,
    dir: &Path,
    sections: &[(&str, String)],
    args: &str,
    wrap: Option<&str>,
) -> (Vmm, PathBuf) {
    let sock = dir.join("api.sock");
    let mut vmm = match wrap {
        None => Vmm::spawn(&["--api-sock", sock.to_str().unwrap()]),
        Some(netns) => {
            let mut cmd = Command::new("ip");
            cmd.args([
                "netns",
                "exec",
                netns,
                teravm(),
                "--api-sock",
                sock.to_str().unwrap(),
            ]);
            Vmm::spawn_command(cmd)
        }
    };
    wait_for_api(&sock, T);
    put_ok(
        &sock,
        "/machine-config",
        r#"{"vcpu_count": 1, "mem_size_mib": 128, "huge_pages": "None"}"#,
    );
    for (path, body) in sections {
        put_ok(&sock, path, body);
    }
    put_ok(&sock, "/boot-source", &g.boot_source(args));
    let (status, body) = action(&sock, r#"{"action_type": "InstanceStart"}"#);
    assert_eq!(status, 204, "{body}");
    let _ = &mut vmm;
    (vmm, sock)
}

fn shutdown_ok(vmm: Vmm, sock: &Path) {
    let (status, body) = action(sock, r#"{"action_type": "Shutdown"}"#);
    assert_eq!(status, 200, "{body}");
    assert_eq!(json(&body)["state"], "done", "{body}");
    let (code, _, stderr) = vmm.wait(T);
    assert_eq!(code, 0, "{stderr}");
}

fn drive(id: &str, path: &Path, read_only: bool) -> (String, String) {
    drive_on(id, path, read_only, "Sync")
}

/// [`drive`] with `io_engine` `engine` (`Sync` or `Async`).
fn drive_on(id: &str, path: &Path, read_only: bool, engine: &str) -> (String, String) {
    (
        format!("/drives/{id}"),
        format!(
            r#"{{"drive_id": "{id}", "path_on_host": "{}", "is_root_device": false, "is_read_only": {read_only}, "io_engine": "{engine}"}}"#,
            path.display()
        ),
    )
}

/// Pages of `file` in the page cache that are dirty (`cachestat`, Linux
/// 6.5+): written but not yet on the disk.
fn dirty_pages(file: &std::fs::File) -> u64 {
    use std::os::fd::AsRawFd;
    #[repr(C)]
    struct Range {
        off: u64,
        len: u64,
    }
    #[repr(C)]
    #[derive(Default)]
    struct CacheStat {
        nr_cache: u64,
        nr_dirty: u64,
        nr_writeback: u64,
        nr_evicted: u64,
        nr_recently_evicted: u64,
    }
    let range = Range { off: 0, len: 0 };
    let mut stat = CacheStat::default();
    // SAFETY: cachestat reads `range` and writes `stat`, both ours and of
    // the kernel's layout; the descriptor is open.
    let r = unsafe {
        libc::syscall(
            451, // __NR_cachestat on x86-64
            file.as_raw_fd(),
            &range as *const Range,
            &mut stat as *mut CacheStat,
            0u32,
        )
    };
    assert_eq!(r, 0, "cachestat: {}", std::io::Error::last_os_error());
    stat.nr_dirty
}

fn a_drive_is_read_written_flushed_and_named(g: Guest, engine: &str) {
    if !kvm_or_skip("blk_rw") {
        return;
    }
    let _big = big_memory();
    let dir = temp_dir(&format!("blk-rw-{engine}"));
    // The drive on a disk-backed filesystem (cargo's target dir), where an
    // fdatasync cleans the page cache's dirty pages (on tmpfs none ever is).
    let disk_dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "blk-rw-{}-{engine}-{}",
        g.name(),
        std::process::id()
    ));
    std::fs::create_dir_all(&disk_dir).unwrap();
    let disk = disk_dir.join("disk.img");
    let mut bytes = vec![0u8; 1 << 20];
    bytes[..16].copy_from_slice(b"teravm-disk-0123");
    let file = std::fs::File::create(&disk).unwrap();
    std::io::Write::write_all(&mut &file, &bytes).unwrap();
    file.sync_all().unwrap();
    assert_eq!(dirty_pages(&file), 0, "clean before the guest writes");
    let metrics = dir.join("metrics");
    let sock = dir.join("api.sock");
    let mut vmm = Vmm::spawn(&[
        "--api-sock",
        sock.to_str().unwrap(),
        "--metrics-path",
        metrics.to_str().unwrap(),
    ]);
    wait_for_api(&sock, T);
    put_ok(
        &sock,
        "/machine-config",
        r#"{"vcpu_count": 1, "mem_size_mib": 128, "huge_pages": "None"}"#,
    );
    // Writeback: FLUSH is offered, and done with fdatasync.
    put_ok(
        &sock,
        "/drives/data1",
        &format!(
            r#"{{"drive_id": "data1", "path_on_host": "{}", "is_root_device": false, "is_read_only": false, "cache_type": "Writeback", "io_engine": "{engine}"}}"#,
            disk.display()
        ),
    );
    put_ok(&sock, "/boot-source", &g.boot_source("blk then=idle"));
    let (status, body) = action(&sock, r#"{"action_type": "InstanceStart"}"#);
    assert_eq!(status, 204, "{body}");
    let cfg = get(&sock, "/vm/config");
    assert_eq!(cfg["drives"][0]["io_engine"], engine, "{cfg}");
    // FLUSH (feature bit 9) offered and accepted by the driver.
    let found = vmm.wait_line(&g.line("blk device at"), T);
    let features = found
        .split(" features 0x")
        .nth(1)
        .and_then(|f| u64::from_str_radix(f.split(' ').next()?, 16).ok())
        .unwrap_or_else(|| panic!("{found}"));
    assert_ne!(features & (1 << 9), 0, "FLUSH negotiated: {found}");
    let line = vmm.wait_line(&g.line("blk sector0"), T);
    assert!(line.ends_with(&hex(b"teravm-disk-0123")), "{line}");
    assert!(vmm.wait_line(&g.line("blk write"), T).ends_with("write ok"));
    // The firmware flushes after its write and before the read back.
    assert!(vmm
        .wait_line(&g.line("blk readback"), T)
        .ends_with("readback match"));
    // GET_ID: the file's dev/rdev/inode, as Firecracker answers.
    let id = vmm.wait_line(&g.line("blk id"), T);
    assert!(
        id.ends_with(&format!(
            "blk id {}",
            common::peers::firecracker_blk_id(&disk)
        )),
        "{id}"
    );
    // The write reached the disk: fdatasync left no dirty page (without it,
    // sector 1's page stays dirty until the kernel's writeback, 30 s on).
    assert_eq!(dirty_pages(&file), 0, "sector 1 written back by the FLUSH");
    // And the FLUSH was counted, once.
    let (status, body) = action(&sock, r#"{"action_type": "FlushMetrics"}"#);
    assert_eq!(status, 204, "{body}");
    let text = std::fs::read_to_string(&metrics).unwrap();
    let last: serde_json::Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    assert_eq!(last["block_data1"]["flush_count"], 1, "{last}");
    shutdown_ok(vmm, &sock);
    let after = std::fs::read(&disk).unwrap();
    assert_eq!(&after[512..1024], &[0xA5u8; 512][..], "sector 1 written");
    assert_eq!(&after[..512], &bytes[..512], "sector 0 untouched");
    assert_eq!(&after[1024..], &bytes[1024..], "nothing past sector 1");
    std::fs::remove_dir_all(&disk_dir).unwrap();
}

fn a_read_only_drive_refuses_writes_and_its_file_is_unchanged(g: Guest, engine: &str) {
    if !kvm_or_skip("blk_ro") {
        return;
    }
    let _big = big_memory();
    let dir = temp_dir(&format!("blk-ro-{engine}"));
    let disk = dir.join("ro.img");
    // Not a sector multiple: the 100 trailing bytes are not addressable.
    let bytes: Vec<u8> = (0..(64 << 10) + 100).map(|i| (i % 251) as u8).collect();
    std::fs::write(&disk, &bytes).unwrap();
    let (path, body) = drive_on("ro", &disk, true, engine);
    let (mut vmm, sock) = start_with(g, &dir, &[(&path, body)], "blk then=idle", None);
    let found = vmm.wait_line(&g.line("blk device at"), T);
    assert!(found.ends_with("capacity 128 sectors"), "{found}");
    assert!(vmm
        .wait_line(&g.line("blk write"), T)
        .ends_with("write ioerr"));
    assert!(vmm
        .wait_line(&g.line("blk readback"), T)
        .ends_with("readback mismatch"));
    shutdown_ok(vmm, &sock);
    assert_eq!(std::fs::read(&disk).unwrap(), bytes, "the file changed");
}

#[test]
fn drive_paths_that_are_not_drives_are_refused_and_teravm_lives() {
    let (vmm, sock, dir) = start_api("blk-bad-paths", &[]);
    let fifo = dir.join("fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path; the result is checked.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    for (p, needle) in [
        (dir.join("missing"), "No such file"),
        (dir.clone(), "Is a directory"),
        (PathBuf::from("/dev/zero"), "not a regular file"),
        (fifo, "not a regular file"),
        (PathBuf::from("/proc/self/mem"), "procfs"),
    ] {
        let (path, body) = drive("bad", &p, false);
        let (status, reply) = put(&sock, &path, &body);
        assert_fault(status, &reply, 400, needle);
    }
    assert_eq!(state(&sock), "Not started");
    drop(vmm);
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn a_tap_in_a_namespace_sees_the_guests_frame_and_gets_its_own_echoed(g: Guest) {
    if !kvm_or_skip("net_echo") {
        return;
    }
    let Some(ns) = Netns::new(&format!("net-{}", g.name())) else {
        skip(
            "net_echo",
            "cannot make a network namespace with a tap (ip, root)",
        );
        return;
    };
    let _big = big_memory();
    let dir = temp_dir("net-echo");
    let fd = packet_socket(&ns);
    let body = r#"{"iface_id": "eth0", "host_dev_name": "tap0", "guest_mac": "06:00:ac:10:00:02"}"#;
    let (mut vmm, sock) = start_with(
        g,
        &dir,
        &[("/network-interfaces/eth0", body.to_string())],
        "net=echo then=idle",
        Some(&ns.name),
    );
    let sent = vmm.wait_line(&g.line("net sent hello"), T);
    assert!(sent.ends_with("from 06:00:ac:10:00:02"), "{sent}");
    let hello = next_frame(&fd, T).expect("the guest's hello frame on the tap");
    assert_eq!(&hello[..6], &[0xff; 6]);
    assert_eq!(&hello[6..12], &[6, 0, 0xac, 0x10, 0, 2]);
    let payload = g.net_hello();
    assert!(hello
        .windows(payload.len())
        .any(|w| w == payload.as_bytes()));
    // A frame from the host side comes back with its MACs swapped.
    let mut frame = vec![6, 0, 0xac, 0x10, 0, 2, 2, 0, 0, 0, 0, 9, 0x88, 0xB5];
    frame.extend_from_slice(b"from the host side");
    // SAFETY: sends our buffer on our bound socket.
    let n = unsafe {
        libc::send(
            std::os::fd::AsRawFd::as_raw_fd(&fd),
            frame.as_ptr().cast(),
            frame.len(),
            0,
        )
    };
    assert_eq!(n as usize, frame.len());
    let echo = loop {
        let f = next_frame(&fd, T).expect("the echo");
        if f[..6] == [2, 0, 0, 0, 0, 9] {
            break f;
        }
    };
    assert_eq!(&echo[6..12], &[6, 0, 0xac, 0x10, 0, 2]);
    assert!(echo.windows(18).any(|w| w == b"from the host side"));
    vmm.wait_line(&g.line("net echoed"), T);
    shutdown_ok(vmm, &sock);
}

/// A missing tap, and a path (a macvtap's node, as flintlock sends one)
/// that is not a macvtap: a 400 naming it, under seccomp, nothing attached.
#[test]
fn a_missing_tap_or_a_path_that_is_no_macvtap_is_a_400_naming_it() {
    let (vmm, sock, dir) = start_api("net-missing", &[]);
    let file = dir.join("tap5");
    std::fs::write(&file, b"").unwrap();
    for (dev, why) in [
        ("no-such-tap0", "\"no-such-tap0\" does not exist"),
        ("/dev/null", "not a macvtap or ipvtap device"),
        ("/dev/net/tun", "not a macvtap or ipvtap device"),
        ("/dev/tap-teravm-none", "cannot be read"),
        (file.to_str().unwrap(), "is not a character device"),
    ] {
        let body = format!(r#"{{"iface_id": "eth0", "host_dev_name": "{dev}"}}"#);
        let (status, reply) = put(&sock, "/network-interfaces/eth0", &body);
        assert_fault(status, &reply, 400, why);
    }
    assert_eq!(state(&sock), "Not started");
    drop(vmm);
}

/// teravm with a vsock (CID 3, its socket in a temp dir) and `g` serving
/// `vsock=echo:5000`, started and listening: (teravm, API socket, the vsock
/// socket).
fn vsock_echo_started(g: Guest, name: &str) -> (Vmm, PathBuf, PathBuf) {
    let dir = temp_dir(name);
    let uds = dir.join("v.sock");
    let body = format!(r#"{{"guest_cid": 3, "uds_path": "{}"}}"#, uds.display());
    let (mut vmm, sock) = start_with(
        g,
        &dir,
        &[("/vsock", body)],
        "vsock=echo:5000 then=idle",
        None,
    );
    vmm.wait_line(&g.line("vsock listening on 5000"), T);
    (vmm, sock, uds)
}

fn vsock_echoes_host_connections_and_refuses_other_ports(g: Guest) {
    if !kvm_or_skip("vsock_echo") {
        return;
    }
    let _big = big_memory();
    let (mut vmm, sock, uds) = vsock_echo_started(g, "vsock-echo");
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&uds).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }
    for i in 0..4 {
        let (mut s, ok) = vsock_connect(&uds, 5000);
        assert!(ok.starts_with("OK "), "{ok:?}");
        echoed(&mut s, format!("echo me {i}\n").as_bytes());
        drop(s);
        vmm.wait_line(&g.line("vsock echo"), T);
    }
    // Nobody listens on 5001 in the guest: the host connection is closed.
    let (_s, line) = vsock_connect(&uds, 5001);
    assert!(!line.starts_with("OK"), "{line:?}");
    shutdown_ok(vmm, &sock);
}

fn a_guest_connection_reaches_the_hosts_listener_on_uds_port(g: Guest) {
    if !kvm_or_skip("vsock_connect") {
        return;
    }
    let _big = big_memory();
    let dir = temp_dir("vsock-connect");
    let uds = dir.join("v.sock");
    let listener = UnixListener::bind(format!("{}_6000", uds.display())).unwrap();
    let body = format!(r#"{{"guest_cid": 3, "uds_path": "{}"}}"#, uds.display());
    let (mut vmm, sock) = start_with(
        g,
        &dir,
        &[("/vsock", body)],
        "vsock=connect:6000 then=idle",
        None,
    );
    // Within T (read timeout T too): a guest that never connects fails.
    let mut conn = uds_accept(&listener);
    let mut got = String::new();
    conn.read_to_string(&mut got).unwrap();
    assert_eq!(got, g.greeting());
    let sent = vmm.wait_line(&g.line("vsock connect sent"), T);
    assert!(
        sent.ends_with(&format!("sent {} bytes", g.greeting().len())),
        "{sent}"
    );
    shutdown_ok(vmm, &sock);
}

fn each_device_has_its_metrics_group(g: Guest) {
    if !kvm_or_skip("device_metrics") {
        return;
    }
    let Some(ns) = Netns::new(&format!("metrics-{}", g.name())) else {
        skip(
            "device_metrics",
            "cannot make a network namespace with a tap (ip, root)",
        );
        return;
    };
    let _big = big_memory();
    let dir = temp_dir("device-metrics");
    let disk = dir.join("disk.img");
    std::fs::write(&disk, vec![0u8; 64 << 10]).unwrap();
    let metrics = dir.join("metrics");
    let uds = dir.join("v.sock");
    let sock = dir.join("api.sock");
    let fd = packet_socket(&ns);
    let mut cmd = Command::new("ip");
    cmd.args([
        "netns",
        "exec",
        &ns.name,
        teravm(),
        "--api-sock",
        sock.to_str().unwrap(),
        "--metrics-path",
        metrics.to_str().unwrap(),
    ]);
    let mut vmm = Vmm::spawn_command(cmd);
    wait_for_api(&sock, T);
    put_ok(
        &sock,
        "/machine-config",
        r#"{"vcpu_count": 1, "mem_size_mib": 128}"#,
    );
    let (path, body) = drive("d0", &disk, false);
    put_ok(&sock, &path, &body);
    put_ok(
        &sock,
        "/network-interfaces/eth0",
        r#"{"iface_id": "eth0", "host_dev_name": "tap0", "guest_mac": "06:00:ac:10:00:02"}"#,
    );
    put_ok(
        &sock,
        "/vsock",
        &format!(r#"{{"guest_cid": 7, "uds_path": "{}"}}"#, uds.display()),
    );
    put_ok(
        &sock,
        "/boot-source",
        &g.boot_source("blk vsock=echo:5000 net=echo then=idle"),
    );
    let (status, body) = action(&sock, r#"{"action_type": "InstanceStart"}"#);
    assert_eq!(status, 204, "{body}");
    // Drive each device: the drive once (the firmware's blk), one echoed
    // vsock line, the net's hello frame seen on the tap.
    vmm.wait_line(&g.line("blk id"), T);
    vmm.wait_line(&g.line("vsock listening on 5000"), T);
    let (mut s, ok) = vsock_connect(&uds, 5000);
    assert!(ok.starts_with("OK "), "{ok:?}");
    s.write_all(b"ping\n").unwrap();
    let mut echo = [0u8; 5];
    s.read_exact(&mut echo).unwrap();
    assert_eq!(&echo, b"ping\n");
    let hello = next_frame(&fd, T).expect("the guest's hello frame on the tap");
    assert_eq!(&hello[6..12], &[6, 0, 0xac, 0x10, 0, 2]);
    let (status, body) = action(&sock, r#"{"action_type": "FlushMetrics"}"#);
    assert_eq!(status, 204, "{body}");
    let text = std::fs::read_to_string(&metrics).unwrap();
    let last: serde_json::Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    let n = |group: &str, counter: &str| {
        last[group][counter]
            .as_u64()
            .unwrap_or_else(|| panic!("no {group}.{counter}: {last}"))
    };
    assert!(n("block_d0", "read_count") >= 2, "{last}");
    assert!(n("block_d0", "write_count") >= 1, "{last}");
    assert!(n("net_eth0", "tx_packets_count") >= 1, "{last}");
    // Firecracker's aggregate groups: with one device each, its counters.
    for c in ["read_count", "write_count", "read_bytes", "write_bytes"] {
        assert_eq!(n("block", c), n("block_d0", c), "block.{c}: {last}");
    }
    for c in ["tx_packets_count", "tx_bytes_count", "rx_packets_count"] {
        assert_eq!(n("net", c), n("net_eth0", c), "net.{c}: {last}");
    }
    // The hello frame: 14 bytes of Ethernet header and the payload.
    let hello_bytes = 14 + g.net_hello().len() as u64;
    assert!(n("net_eth0", "tx_bytes_count") >= hello_bytes, "{last}");
    assert!(
        n("vsock", "rx_bytes_count") >= 5,
        "the guest got ping: {last}"
    );
    assert!(
        n("vsock", "tx_bytes_count") >= 5,
        "and sent it back: {last}"
    );
    drop(s);
    shutdown_ok(vmm, &sock);
}

fn a_host_that_floods_and_never_reads_cannot_stop_the_shutdown(g: Guest) {
    if !kvm_or_skip("vsock_flood") {
        return;
    }
    let _big = big_memory();
    let (vmm, sock, uds) = vsock_echo_started(g, "vsock-flood");
    let (s, ok) = vsock_connect(&uds, 5000);
    assert!(ok.starts_with("OK "), "{ok:?}");
    // Write until the socket is full (the guest echoes into our never-read
    // receive side, then its credit stops it); never read.
    s.set_nonblocking(true).unwrap();
    let chunk = vec![0x5a; 64 << 10];
    let mut sent = 0usize;
    let deadline = Instant::now() + T;
    let mut w = &s;
    loop {
        match w.write(&chunk) {
            Ok(n) => sent += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(e) => panic!("{e}"),
        }
        assert!(
            Instant::now() < deadline,
            "the socket never filled ({sent} bytes)"
        );
    }
    assert!(sent > 0);
    // The guest did forward: its echo of our bytes waits in our receive
    // side (peeked, never read, so the host side stays full).
    let mut peek = vec![0u8; 4096];
    let deadline = Instant::now() + T;
    let echoed = loop {
        // SAFETY: recv into our own buffer of its length; MSG_PEEK leaves
        // the bytes queued.
        let n = unsafe {
            libc::recv(
                std::os::fd::AsRawFd::as_raw_fd(&s),
                peek.as_mut_ptr().cast(),
                peek.len(),
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        if n > 0 {
            break n as usize;
        }
        assert!(
            Instant::now() < deadline,
            "the guest never echoed any of the {sent} bytes"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(
        peek[..echoed].iter().all(|&b| b == 0x5a),
        "the echo is our bytes"
    );
    // The device still answers the VMM: the shutdown stops it, resets it
    // and reclaims, with the host side still full.
    shutdown_ok(vmm, &sock);
    drop(s);
}

/// Each test under both guests and both engines: `<test>::sync::<guest>`
/// (`io_engine` `Sync`) and `<test>::uring::<guest>` (`Async`, io_uring).
macro_rules! both_guests_and_engines {
    ($($test:ident),* $(,)?) => {$(
        mod $test {
            use super::*;
            fn sync(g: Guest) {
                super::$test(g, "Sync")
            }
            fn uring(g: Guest) {
                super::$test(g, "Async")
            }
            both_guests!(sync, uring);
        }
    )*};
}

both_guests_and_engines!(
    a_drive_is_read_written_flushed_and_named,
    a_read_only_drive_refuses_writes_and_its_file_is_unchanged,
);

both_guests!(
    a_tap_in_a_namespace_sees_the_guests_frame_and_gets_its_own_echoed,
    vsock_echoes_host_connections_and_refuses_other_ports,
    a_guest_connection_reaches_the_hosts_listener_on_uds_port,
    each_device_has_its_metrics_group,
    a_host_that_floods_and_never_reads_cannot_stop_the_shutdown,
);

/// What Firecracker answers to a request it refuses before InstanceStart
/// (`VmmActionError::OperationNotSupportedPreBoot`).
const FC_NOT_BEFORE_START: &str =
    "The requested operation is not supported before starting the microVM.";

/// `PATCH /network-interfaces/eth0` with a receive limiter on `sock`.
fn patch_eth0(sock: &Path) -> (u16, String) {
    let body = r#"{"iface_id": "eth0", "rx_rate_limiter": {"bandwidth": {"size": 1048576, "refill_time": 100}}}"#;
    client::request(sock, "PATCH", "/network-interfaces/eth0", Some(body)).unwrap()
}

/// Firecracker refuses `PATCH /network-interfaces/{id}` before
/// InstanceStart (its `UpdateNetworkInterface` is among the pre-boot
/// refusals), for an interface that exists on a real tap; so does teravm,
/// changing nothing, and once started it takes the same PATCH. Firecracker
/// is asked on the same tap where it is built.
#[test]
fn patching_a_network_interface_before_the_start_is_refused_as_on_firecracker() {
    let test = "patch_net_before_start";
    if !kvm_or_skip(test) {
        return;
    }
    let Some(ns) = Netns::new("patchnet") else {
        return skip(
            test,
            "cannot make a network namespace with a tap (ip, root)",
        );
    };
    let _big = big_memory();
    let dir = temp_dir(test);
    let iface =
        r#"{"iface_id": "eth0", "host_dev_name": "tap0", "guest_mac": "06:00:ac:10:00:02"}"#;
    let sock = dir.join("api.sock");
    let mut cmd = ns.command(teravm());
    cmd.arg("--api-sock").arg(&sock);
    let vmm = Vmm::spawn_command(cmd);
    wait_for_api(&sock, T);
    put_ok(
        &sock,
        "/machine-config",
        r#"{"vcpu_count": 1, "mem_size_mib": 128, "huge_pages": "None"}"#,
    );
    put_ok(&sock, "/network-interfaces/eth0", iface);
    let eth0 = |sock: &Path| get(sock, "/vm/config")["network-interfaces"][0].clone();
    let (status, body) = patch_eth0(&sock);
    assert_fault(
        status,
        &body,
        400,
        "the requested operation is not supported before starting the microVM",
    );
    let config = eth0(&sock);
    assert_eq!(config["iface_id"], "eth0", "{config}");
    assert!(
        config["rx_rate_limiter"].is_null(),
        "the refused PATCH changed the interface: {config}"
    );
    // Started, the same PATCH is taken.
    put_ok(
        &sock,
        "/boot-source",
        &Guest::Firmware.boot_source("net=echo then=idle"),
    );
    let (status, body) = action(&sock, r#"{"action_type": "InstanceStart"}"#);
    assert_eq!(status, 204, "{body}");
    let (status, body) = patch_eth0(&sock);
    assert_eq!(status, 204, "the PATCH once started: {body}");
    let config = eth0(&sock);
    assert_eq!(
        config["rx_rate_limiter"]["bandwidth"]["size"], 1048576,
        "{config}"
    );
    shutdown_ok(vmm, &sock);

    let Some(fc) = firecracker(test) else {
        return;
    };
    let fc_sock = dir.join("fc.sock");
    let mut cmd = ns.command(fc.to_str().unwrap());
    cmd.arg("--api-sock").arg(&fc_sock);
    let fc_vmm = Vmm::spawn_command(cmd);
    wait_for_api(&fc_sock, T);
    put_ok(&fc_sock, "/network-interfaces/eth0", iface);
    let (status, body) = patch_eth0(&fc_sock);
    assert_fault(status, &body, 400, FC_NOT_BEFORE_START);
    drop(fc_vmm);
}
