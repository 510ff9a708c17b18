//! The server's bounds under hostile clients, over a real socket with the
//! fake VMM: a client over the limit gets a 503, a slow request gives its
//! slot up under pressure, and a listener with a full backlog at the path
//! is refused without waiting.

use std::fs;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileTypeExt;
use std::path::Path;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::test_support::*;
use super::*;
use teravm_client::http::{self as client, Connection};

/// A connection that has sent the head of a `PUT /reclaim` asking for
/// `100 Continue` and got it: the server counts it as receiving a request.
fn half_request(s: &Setup) -> Connection {
    let mut c = s.conn();
    c.send_raw(b"PUT /reclaim HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 24\r\n\r\n")
        .unwrap();
    let mut got = [0u8; 25];
    c.stream().read_exact(&mut got).unwrap();
    assert_eq!(&got, b"HTTP/1.1 100 Continue\r\n\r\n");
    c
}

fn fault_of(reply: &client::Reply) -> String {
    let v: Value = serde_json::from_str(&reply.body).unwrap();
    v["fault_message"].as_str().unwrap().to_string()
}

#[test]
fn a_client_over_the_limit_gets_503_when_every_slot_is_busy() {
    let s = Setup::with_limits(ServerLimits {
        max_connections: 2,
        request_timeout_under_pressure: Duration::from_secs(3600),
        ..ServerLimits::default()
    });
    let mut a = half_request(&s);
    let mut b = half_request(&s);
    // The third is answered at once, without sending anything, and closed.
    let mut c = s.conn();
    let reply = c.read_reply().unwrap();
    assert_eq!(reply.status, 503);
    assert_eq!(reply.header("connection"), Some("close"));
    assert!(
        fault_of(&reply).contains("all 2 API connections are busy"),
        "{reply:?}"
    );
    let mut byte = [0u8; 1];
    assert_eq!(c.stream().read(&mut byte).unwrap(), 0);
    // The two finish their requests; then service is as usual.
    for conn in [&mut a, &mut b] {
        conn.send_raw(br#"{"workers_per_node": 2}"#).unwrap();
        conn.send_raw(b" ").unwrap();
        assert_eq!(conn.read_reply().unwrap().status, 200);
    }
    assert_eq!(client::request(s.sock(), "GET", "/", None).unwrap().0, 200);
}

#[test]
fn a_slow_request_gives_its_slot_up_under_pressure() {
    let s = Setup::with_limits(ServerLimits {
        max_connections: 1,
        request_timeout_under_pressure: Duration::ZERO,
        ..ServerLimits::default()
    });
    let mut slow = half_request(&s);
    let mut c = s.conn();
    assert_eq!(c.request("GET", "/", None).unwrap().0, 200);
    // The slow client is told why, not closed silently.
    let reply = slow.read_reply().unwrap();
    assert_eq!(reply.status, 503);
    assert!(
        fault_of(&reply).contains("closed to make room"),
        "{reply:?}"
    );
    assert_eq!(c.request("GET", "/", None).unwrap().0, 200);
}

#[test]
fn a_client_that_reads_no_replies_does_not_pin_its_slot() {
    let s = Setup::with_limits(ServerLimits {
        max_connections: 1,
        // The blocked write alone would hold the slot for an hour.
        write_timeout: Duration::from_secs(3600),
        ..ServerLimits::default()
    });
    let mut greedy = s.conn();
    assert_eq!(greedy.request("GET", "/", None).unwrap().0, 200);
    // Requests pipelined and their replies never read, until the client's
    // socket takes no more: the server has stopped reading, blocked
    // writing replies.
    let many = client::format_request("GET", "/machine-config", None).repeat(20_000);
    greedy.stream().set_nonblocking(true).unwrap();
    let mut sent = 0;
    while sent < many.len() {
        match greedy.stream().write(&many.as_bytes()[sent..]) {
            Ok(n) => sent += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(e) => panic!("{e}"),
        }
    }
    assert!(sent < many.len(), "the server read all {sent} bytes");
    // A new client is served: the greedy one gives its slot up (refused
    // with 503 while the greedy one's request is with the VMM).
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match Connection::open(s.sock())
            .unwrap()
            .exchange("GET", "/", None)
        {
            Ok(r) if r.status == 200 => break,
            Ok(r) => assert_eq!(r.status, 503, "{r:?}"),
            Err(e) => panic!("closed without a reply: {e}"),
        }
        assert!(Instant::now() < deadline, "the greedy client kept its slot");
        thread::yield_now();
    }
    // The greedy client reads the replies written (or, if its thread had
    // not read the requests yet when it lost the slot, a 503), then the end.
    greedy.stream().set_nonblocking(false).unwrap();
    let mut replies = Vec::new();
    if let Err(e) = greedy.stream().read_to_end(&mut replies) {
        assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}");
    }
    assert!(
        replies.starts_with(b"HTTP/1.1 200 OK\r\n")
            || replies.starts_with(b"HTTP/1.1 503 Service Unavailable\r\n"),
        "{:?}",
        String::from_utf8_lossy(&replies[..replies.len().min(200)])
    );
}

/// A listener at `path` whose backlog is full: connections to it neither
/// fail nor complete. The returned descriptors keep it so.
fn full_listener(path: &Path) -> Vec<OwnedFd> {
    let own = |fd: i32| {
        assert!(fd >= 0, "{}", std::io::Error::last_os_error());
        // SAFETY: `fd` is a new descriptor that nothing else owns.
        unsafe { OwnedFd::from_raw_fd(fd) }
    };
    // SAFETY: sockaddr_un is plain old data; all zeroes is a valid value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (d, s) in addr.sun_path.iter_mut().zip(path.as_os_str().as_bytes()) {
        *d = *s as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
    let sa = &addr as *const libc::sockaddr_un as *const libc::sockaddr;
    // SAFETY: plain syscalls on descriptors owned here and a valid address;
    // results are checked.
    let listener = own(unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0) });
    // SAFETY: as above.
    assert_eq!(unsafe { libc::bind(listener.as_raw_fd(), sa, len) }, 0);
    // SAFETY: as above.
    assert_eq!(unsafe { libc::listen(listener.as_raw_fd(), 0) }, 0);
    let mut fds = vec![listener];
    loop {
        // SAFETY: as above.
        let fd =
            own(unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_NONBLOCK, 0) });
        // SAFETY: as above.
        if unsafe { libc::connect(fd.as_raw_fd(), sa, len) } < 0 {
            let e = std::io::Error::last_os_error();
            assert_eq!(e.raw_os_error(), Some(libc::EAGAIN), "{e}");
            return fds;
        }
        fds.push(fd);
        assert!(fds.len() < 10_000, "the backlog never filled");
    }
}

#[test]
fn a_listener_with_a_full_backlog_is_refused_without_waiting() {
    let dir = TempDir::new();
    let path = dir.sock();
    let _held = full_listener(&path);
    // In a thread, so a probe that blocks fails the test instead of hanging.
    let (tx, rx) = mpsc::channel();
    let p = path.clone();
    thread::spawn(move || {
        let _ = tx.send(start_at(&p).map(|_| ()));
    });
    let e = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("starting the server hung on the full listener")
        .unwrap_err();
    assert!(matches!(e, ApiServerError::Unresponsive(_)), "{e}");
    assert!(e.to_string().contains("backlog is full"), "{e}");
    // The other process's socket is still there.
    assert!(fs::symlink_metadata(&path).unwrap().file_type().is_socket());
}
