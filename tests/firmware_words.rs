//! Issue 26's two contract words in the built-in firmware, on the real
//! binary and /dev/kvm with the default flags: `blk-read=<MiB>` against a
//! real drive file (firmware/blk_read.S) and `mmds=<path>` against a real
//! TCP/IP stack, Linux's, behind a tap in a network namespace
//! (firmware/mmds.S).

mod common;
#[path = "firmware_words/host_mmds.rs"]
mod host_mmds;

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::api::*;
use common::*;
use host_mmds::{HostMmds, TOKEN};

/// teravm (inside `netns` when given) with an API socket in `dir`,
/// `--metrics-path dir/metrics`, configured by `sections` (path, body),
/// booting the firmware with `args`, started.
fn start(
    dir: &Path,
    sections: &[(String, String)],
    args: &str,
    netns: Option<&str>,
) -> (Vmm, PathBuf) {
    let sock = dir.join("api.sock");
    let metrics = dir.join("metrics");
    let mut cmd = match netns {
        None => Command::new(teravm()),
        Some(ns) => {
            let mut cmd = Command::new("ip");
            cmd.args(["netns", "exec", ns, teravm()]);
            cmd
        }
    };
    cmd.args([
        "--api-sock",
        sock.to_str().unwrap(),
        "--metrics-path",
        metrics.to_str().unwrap(),
    ]);
    let vmm = Vmm::spawn_command(cmd);
    wait_for_api(&sock, T);
    put_ok(
        &sock,
        "/machine-config",
        r#"{"vcpu_count": 1, "mem_size_mib": 128, "huge_pages": "None"}"#,
    );
    for (path, body) in sections {
        put_ok(&sock, path, body);
    }
    put_ok(
        &sock,
        "/boot-source",
        &format!(r#"{{"boot_args": "{args}"}}"#),
    );
    let (status, body) = action(&sock, r#"{"action_type": "InstanceStart"}"#);
    assert_eq!(status, 204, "{body}");
    (vmm, sock)
}

/// The last metrics line after a FlushMetrics.
fn metrics(dir: &Path, sock: &Path) -> serde_json::Value {
    let (status, body) = action(sock, r#"{"action_type": "FlushMetrics"}"#);
    assert_eq!(status, 204, "{body}");
    let text = std::fs::read_to_string(dir.join("metrics")).unwrap();
    serde_json::from_str(text.lines().last().unwrap()).unwrap()
}

/// `blk-read=<ask>` against a drive file of `size` bytes: the line, and
/// the drive's read_bytes and read_count from the metrics.
fn blk_read(name: &str, size: u64, ask: u64) -> (String, u64, u64) {
    let _big = big_memory();
    let dir = temp_dir(name);
    let disk = dir.join("disk.img");
    let f = std::fs::File::create(&disk).unwrap();
    f.set_len(size).unwrap();
    let drive = (
        "/drives/d0".to_string(),
        format!(
            r#"{{"drive_id": "d0", "path_on_host": "{}", "is_root_device": false, "is_read_only": true}}"#,
            disk.display()
        ),
    );
    let (mut vmm, sock) = start(&dir, &[drive], &format!("blk-read={ask} then=idle"), None);
    let line = vmm.wait_line("teravm firmware: blk read", T);
    eprintln!("{line}");
    vmm.wait_line("teravm firmware: idle", T);
    let m = metrics(&dir, &sock);
    let n = |c: &str| {
        m["block_d0"][c]
            .as_u64()
            .unwrap_or_else(|| panic!("no block_d0.{c}: {m}"))
    };
    let (bytes, count) = (n("read_bytes"), n("read_count"));
    shutdown_ok(vmm, &sock);
    (line, bytes, count)
}

/// "teravm firmware: blk read <MiB> MiB in <ms> ms": (MiB, ms).
fn read_line(line: &str) -> (u64, u64) {
    let rest = line
        .strip_prefix("teravm firmware: blk read ")
        .unwrap_or_else(|| panic!("{line:?}"));
    let w: Vec<&str> = rest.split(' ').collect();
    assert!(
        w.len() == 5 && w[1] == "MiB" && w[2] == "in" && w[4] == "ms",
        "{line:?}"
    );
    let num = |s: &str| s.parse::<u64>().unwrap_or_else(|_| panic!("{line:?}"));
    (num(w[0]), num(w[3]))
}

#[test]
fn blk_read_reads_what_it_says_in_64_kib_requests() {
    if !kvm_or_skip("blk_read") {
        return;
    }
    let (line, bytes, count) = blk_read("blk-read", 16 * MIB, 4);
    let (mib, ms) = read_line(&line);
    assert_eq!(mib, 4, "{line}");
    assert!(ms < 60_000, "{line}");
    assert_eq!(bytes, 4 * MIB, "the drive's read_bytes");
    assert_eq!(count, 4 * MIB / (64 << 10), "one request per 64 KiB");
}

#[test]
fn blk_read_of_more_than_the_drive_reads_it_whole() {
    if !kvm_or_skip("blk_read_small") {
        return;
    }
    // 3 MiB and 4 KiB: 48 full requests and a short one; the line rounds
    // the MiB down.
    let size = 3 * MIB + 4096;
    let (line, bytes, count) = blk_read("blk-read-small", size, 64);
    assert_eq!(read_line(&line).0, 3, "{line}");
    assert_eq!(bytes, size, "the whole drive was read");
    assert_eq!(count, 49);
}

// ---------------------------------------------------------------------------
// mmds=<path>

/// Boots the firmware with `mmds=<path>` against `mmds`: its mmds line.
fn fetch(name: &str, mmds: &HostMmds, path: &str) -> String {
    let _big = big_memory();
    let dir = temp_dir(name);
    let (mut vmm, sock) = start(
        &dir,
        &mmds.sections(),
        &format!("mmds={path} then=idle"),
        Some(&mmds.ns.name),
    );
    let line = vmm.wait_line("teravm firmware: mmds ", T);
    eprintln!("{line}");
    vmm.wait_line("teravm firmware: idle", T);
    shutdown_ok(vmm, &sock);
    line
}

fn mmds_or_skip(test: &str, v2: bool, files: Vec<(&'static str, String)>) -> Option<HostMmds> {
    if !kvm_or_skip(test) {
        return None;
    }
    let m = HostMmds::start(test, v2, files);
    if m.is_none() {
        skip(
            test,
            "cannot make a network namespace with a tap (ip, root)",
        );
    }
    m
}

/// The body the tests serve: two lines, then more than 200 bytes.
fn long_body() -> String {
    format!("line one\r\nline two\n{}", "x".repeat(300))
}

#[test]
fn mmds_fetches_a_path_with_the_token_it_was_given() {
    let Some(mmds) = mmds_or_skip("mmds_v2", true, vec![("/latest/meta-data/x", long_body())])
    else {
        return;
    };
    let line = fetch("mmds-v2", &mmds, "/latest/meta-data/x");
    let shown: String = long_body()[..200].replace(['\r', '\n'], " ");
    assert_eq!(line, format!("teravm firmware: mmds 200 {shown}"));
    let seen = mmds.seen(2);
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert_eq!(
        (seen[0].method.as_str(), seen[0].path.as_str()),
        ("PUT", "/latest/api/token")
    );
    assert_eq!(seen[0].header("x-metadata-token-ttl-seconds"), Some("60"));
    assert_eq!(
        (seen[1].method.as_str(), seen[1].path.as_str()),
        ("GET", "/latest/meta-data/x")
    );
    assert_eq!(seen[1].header("x-metadata-token"), Some(TOKEN), "{seen:?}");
    assert!(
        seen[1].ended_by_client,
        "the firmware ended the GET at Content-Length and closed: {seen:?}"
    );
    for s in &seen {
        assert_eq!(s.header("host"), Some("169.254.169.254"), "{s:?}");
        assert_eq!(s.header("connection"), Some("close"), "{s:?}");
    }
}

#[test]
fn mmds_says_404_for_a_missing_path() {
    let Some(mmds) = mmds_or_skip("mmds_404", true, vec![("/latest/meta-data/x", long_body())])
    else {
        return;
    };
    let line = fetch("mmds-404", &mmds, "/latest/meta-data/missing");
    assert_eq!(line, "teravm firmware: mmds 404 not found");
    let seen = mmds.seen(2);
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert_eq!(seen[1].path, "/latest/meta-data/missing");
    assert_eq!(seen[1].header("x-metadata-token"), Some(TOKEN), "{seen:?}");
}

#[test]
fn mmds_without_a_token_gets_without_one() {
    let Some(mmds) = mmds_or_skip("mmds_v1", false, vec![("/v1", "{\"a\": 1}".to_string())]) else {
        return;
    };
    let line = fetch("mmds-v1", &mmds, "/v1");
    assert_eq!(line, "teravm firmware: mmds 200 {\"a\": 1}");
    let seen = mmds.seen(2);
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert_eq!(seen[0].method, "PUT");
    assert_eq!(seen[1].header("x-metadata-token"), None, "{seen:?}");
    assert!(seen[1].ended_by_client, "ended at Content-Length: {seen:?}");
}

/// What the guest sent on the tap (seen by an AF_PACKET socket there):
/// ARP requests for the MMDS address and TCP SYNs to its port 80.
#[derive(Debug, Default)]
struct Sent {
    arp_requests: u32,
    syns: u32,
}

#[test]
fn mmds_asks_again_for_what_goes_unanswered() {
    let Some(mut mmds) = (if kvm_or_skip("mmds_retx") {
        HostMmds::start_deaf("mmds_retx", true, vec![("/r", "again".to_string())], true)
    } else {
        return;
    }) else {
        skip(
            "mmds_retx",
            "cannot make a network namespace with a tap (ip, root)",
        );
        return;
    };
    // Watch the tap: after the first ARP request Linux answers ARP, after
    // the first SYN the server takes connections; the firmware must ask
    // again for both.
    let fd = common::netns::packet_socket(&mmds.ns);
    let fetcher = {
        let ns = mmds.ns.name.clone();
        let sections = mmds.sections();
        std::thread::spawn(move || {
            let _big = big_memory();
            let dir = temp_dir("mmds-retx");
            let (mut vmm, sock) = start(&dir, &sections, "mmds=/r then=idle", Some(&ns));
            let line = vmm.wait_line("teravm firmware: mmds ", T);
            vmm.wait_line("teravm firmware: idle", T);
            shutdown_ok(vmm, &sock);
            line
        })
    };
    let guest_mac = [6u8, 0, 0xac, 0x10, 0, 2];
    let mut sent = Sent::default();
    let deadline = std::time::Instant::now() + T;
    let mut buf = vec![0u8; 2048];
    while (sent.arp_requests < 2 || sent.syns < 3) && std::time::Instant::now() < deadline {
        let mut pfd = libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one pollfd on our stack.
        if unsafe { libc::poll(&mut pfd, 1, 100) } <= 0 {
            if fetcher.is_finished() {
                break; // and nothing left to read
            }
            continue;
        }
        // SAFETY: reads into our buffer of its length.
        let n = unsafe { libc::recv(pfd.fd, buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 42 || buf[6..12] != guest_mac {
            continue;
        }
        let f = &buf[..n as usize];
        if f[12..14] == [8, 6] && f[20..22] == [0, 1] && f[38..42] == [169, 254, 169, 254] {
            sent.arp_requests += 1;
            if sent.arp_requests == 1 {
                mmds.answer_arp();
            }
        } else if n >= 54
            && f[12..14] == [8, 0]
            && f[23] == 6
            && f[36..38] == [0, 80]
            && f[47] & 0x12 == 0x02
        {
            sent.syns += 1;
            if sent.syns == 1 {
                mmds.open_queue();
            }
        }
    }
    let line = fetcher.join().unwrap();
    eprintln!("{line}; {sent:?}");
    assert_eq!(line, "teravm firmware: mmds 200 again");
    assert!(
        sent.arp_requests >= 2,
        "the ARP request was sent again: {sent:?}"
    );
    // The token's connection twice (the first SYN dropped), the GET's once.
    assert!(sent.syns >= 3, "the SYN was sent again: {sent:?}");
    assert_eq!(mmds.seen(2).len(), 2);
}

#[test]
fn bad_mmds_words_are_a_bad_command_line() {
    if !kvm_or_skip("mmds_bad_words") {
        return;
    }
    let _big = big_memory();
    for args in [
        "mmds=",
        "mmds=/x mmds-addr=169.254.169",
        "mmds=/x mmds-addr=169.254.169.256",
        "mmds=/x mmds-ip=169.254.0.2x",
    ] {
        let dir = temp_dir("mmds-bad");
        let (mut vmm, _sock) = start(&dir, &[], args, None);
        let line = vmm.wait_line("teravm firmware: ", T);
        assert_eq!(line, "teravm firmware: bad command line", "{args:?}");
    }
}
