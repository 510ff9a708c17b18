//! Tests of the server over a real Unix socket, with a fake VMM at the other
//! end of the channel that waits on the wake `EventFd` like the real one.

use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::{symlink, FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use serde_json::Value;
use vmm_sys_util::eventfd::EventFd;

use super::test_support::*;
use super::*;
use crate::api::action::{ReclaimMode, VmmAction};
use crate::config::{MachineConfig, ReclaimConfig};
use teravm_client::http::{self as client, Connection};

#[test]
fn statuses_for_vmm_answers() {
    let s = Setup::new();
    let mut c = s.conn();
    let r = c.exchange("GET", "/", None).unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(
        r.header("content-length"),
        Some(r.body.len().to_string().as_str())
    );
    assert_eq!(
        serde_json::from_str::<Value>(&r.body).unwrap()["id"],
        "fake"
    );

    let r = c
        .exchange(
            "PUT",
            "/machine-config",
            Some(r#"{"vcpu_count": 2, "mem_size_mib": 256}"#),
        )
        .unwrap();
    assert_eq!((r.status, r.body.as_str()), (204, ""));
    assert_eq!(r.header("content-length"), None);

    let body = r#"{"action_type": "SendCtrlAltDel"}"#;
    let (status, body) = c.request("PUT", "/actions", Some(body)).unwrap();
    assert_eq!(
        (status, fault(&body).as_str()),
        (400, "the guest is not running")
    );
    let body = r#"{"action_type": "Shutdown", "reclaim": "async"}"#;
    let (status, body) = c.request("PUT", "/actions", Some(body)).unwrap();
    assert_eq!((status, body.as_str()), (202, r#"{"state":"reclaiming"}"#));
    let (status, body) = c.request("GET", "/vm/config", None).unwrap();
    assert_eq!((status, fault(&body).as_str()), (500, "config lost"));

    assert_eq!(
        s.vmm.seen(),
        vec![
            VmmAction::GetInstanceInfo,
            VmmAction::PutMachineConfig(MachineConfig {
                vcpu_count: 2,
                mem_size_mib: 256,
                ..MachineConfig::default()
            }),
            VmmAction::SendCtrlAltDel,
            VmmAction::Shutdown(ReclaimMode::Async),
            VmmAction::GetVmConfig,
        ]
    );
}

#[test]
fn statuses_for_bad_requests() {
    let s = Setup::new();
    let (status, body) = client::request(
        s.sock(),
        "PUT",
        "/machine-config",
        Some(r#"{"vcpu_count": 0, "mem_size_mib": 64}"#),
    )
    .unwrap();
    assert_eq!(status, 400);
    assert!(fault(&body).contains("machine-config.vcpu_count"), "{body}");
    let (status, body) = client::request(s.sock(), "PUT", "/actions", None).unwrap();
    assert_eq!(status, 400);
    assert!(fault(&body).contains("needs a JSON body"), "{body}");

    let (status, body) = client::request(s.sock(), "GET", "/nope", None).unwrap();
    assert_eq!(status, 404);
    assert!(fault(&body).contains("/nope"));
    let r = Connection::open(s.sock())
        .unwrap()
        .exchange("DELETE", "/machine-config", None)
        .unwrap();
    assert_eq!(
        (r.status, r.header("allow")),
        (405, Some("GET, PUT, PATCH"))
    );
    fault(&r.body);

    let cases: [(&[u8], u16); 6] = [
        (
            b"PUT /memory HTTP/1.1\r\nContent-Length: 70000\r\n\r\n",
            413,
        ),
        (b"GET  / HTTP/1.1\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nContent-Length: x\r\n\r\n", 400),
        (b"GET / HTTP/2.0\r\n\r\n", 505),
        (
            b"PUT /actions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            501,
        ),
        (b"GET /\xff HTTP/1.1\r\n\r\n", 400),
    ];
    for (bytes, want) in cases {
        let r = raw(&s, bytes);
        assert_eq!(r.status, want, "{:?}", String::from_utf8_lossy(bytes));
        assert_eq!(r.header("connection"), Some("close"));
        assert_eq!(r.header("content-type"), Some("application/json"));
        fault(&r.body);
    }
    // None of these reached the VMM.
    assert!(s.vmm.seen().is_empty(), "{:?}", s.vmm.seen());
}

#[test]
fn vmm_gone_is_503() {
    let dir = TempDir::new();
    // The VMM's receiver is gone: the send fails.
    let (tx, rx) = mpsc::channel();
    drop(rx);
    let server = ApiServer::start(&dir.sock(), tx, EventFd::new(0).unwrap()).unwrap();
    let (status, body) = client::request(server.path(), "GET", "/", None).unwrap();
    assert_eq!(
        (status, fault(&body).as_str()),
        (503, "the VMM is shutting down")
    );
    drop(server);
    // The VMM drops the reply sender without answering.
    let (tx, rx) = mpsc::channel::<ApiRequest>();
    let wake = EventFd::new(0).unwrap();
    let wake2 = wake.try_clone().unwrap();
    let vmm = thread::spawn(move || {
        wake2.read().unwrap();
        drop(rx.recv().unwrap());
    });
    let server = ApiServer::start(&dir.sock(), tx, wake).unwrap();
    let (status, body) = client::request(server.path(), "GET", "/", None).unwrap();
    assert_eq!(
        (status, fault(&body).as_str()),
        (503, "the VMM is shutting down")
    );
    vmm.join().unwrap();
}

#[test]
fn clients_at_once_get_their_own_answers() {
    let s = Setup::new();
    // One client has sent half a request and waits.
    let body = r#"{"workers_per_node": 3, "steal": false}"#;
    let head = format!(
        "PUT /reclaim HTTP/1.1\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    let mut half = s.conn();
    half.send_raw(head.as_bytes()).unwrap();
    half.send_raw(&body.as_bytes()[..5]).unwrap();
    thread::scope(|scope| {
        for i in 1..=8u32 {
            let sock = s.sock();
            scope.spawn(move || {
                let mut c = Connection::open(sock).unwrap();
                for _ in 0..50 {
                    let body = format!(r#"{{"workers_per_node": {i}}}"#);
                    let (status, reply) = c.request("PUT", "/reclaim", Some(&body)).unwrap();
                    assert_eq!(status, 200);
                    let got: ReclaimConfig = serde_json::from_str(&reply).unwrap();
                    assert_eq!(got.workers_per_node, i);
                }
            });
        }
    });
    // The half request completes later, on its own connection.
    half.send_raw(&body.as_bytes()[5..]).unwrap();
    let r = half.read_reply().unwrap();
    assert_eq!(r.status, 200);
    let got: ReclaimConfig = serde_json::from_str(&r.body).unwrap();
    assert_eq!((got.workers_per_node, got.steal), (3, false));
}

#[test]
fn half_request_then_disconnect_does_not_disturb_others() {
    let s = Setup::new();
    for cut in [5, 30, 45] {
        let mut c = s.conn();
        let req =
            b"PUT /reclaim HTTP/1.1\r\nContent-Length: 26\r\n\r\n{\"workers_per_node\": 1}   ";
        c.send_raw(&req[..cut]).unwrap();
        drop(c);
        let (status, _) = client::request(s.sock(), "GET", "/", None).unwrap();
        assert_eq!(status, 200);
    }
    assert_eq!(s.vmm.seen(), vec![VmmAction::GetInstanceInfo; 3]);
}

#[test]
fn stalled_and_idle_clients_time_out() {
    let s = Setup::with_limits(ServerLimits {
        request_timeout: Duration::from_millis(200),
        idle_timeout: Duration::from_millis(400),
        ..ServerLimits::default()
    });
    let mut stalled = s.conn();
    stalled.send_raw(b"GET / HTTP/1.1\r\nHost: x").unwrap();
    let mut idle = s.conn();
    assert_eq!(idle.request("GET", "/", None).unwrap().0, 200);
    let start = Instant::now();
    let r = stalled.read_reply().unwrap();
    assert_eq!(r.status, 408);
    assert_eq!(r.header("connection"), Some("close"));
    // The idle connection is closed without a word.
    let mut byte = [0u8; 1];
    assert_eq!(idle.stream().read(&mut byte).unwrap(), 0);
    assert!(start.elapsed() < Duration::from_secs(5));
    // Others are served meanwhile and after.
    assert_eq!(client::request(s.sock(), "GET", "/", None).unwrap().0, 200);
}

#[test]
fn pipelined_requests_are_answered_in_order() {
    let s = Setup::new();
    let mut c = s.conn();
    let mut bytes = client::format_request("GET", "/", None);
    bytes += &client::format_request("PUT", "/reclaim", Some(r#"{"workers_per_node": 7}"#));
    bytes += &client::format_request("GET", "/nope", None);
    bytes += &client::format_request("PUT", "/memory", Some("{}"));
    c.send_raw(bytes.as_bytes()).unwrap();
    let statuses: Vec<u16> = (0..4).map(|_| c.read_reply().unwrap().status).collect();
    assert_eq!(statuses, [200, 200, 404, 204]);
}

#[test]
fn connection_close_and_http10_are_honoured() {
    let s = Setup::new();
    for req in [
        &b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n"[..],
        b"GET / HTTP/1.0\r\n\r\n",
    ] {
        let mut c = s.conn();
        c.send_raw(req).unwrap();
        let r = c.read_reply().unwrap();
        assert_eq!((r.status, r.header("connection")), (200, Some("close")));
        let mut byte = [0u8; 1];
        assert_eq!(c.stream().read(&mut byte).unwrap(), 0);
    }
    let mut c = s.conn();
    c.send_raw(b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
        .unwrap();
    assert_eq!(c.read_reply().unwrap().status, 200);
    assert_eq!(c.request("GET", "/", None).unwrap().0, 200);
}

#[test]
fn expect_continue_gets_100_then_the_reply() {
    let s = Setup::new();
    let mut stream = UnixStream::connect(s.sock()).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream
        .write_all(b"PUT /memory HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n")
        .unwrap();
    let mut buf = [0u8; 64];
    let n = stream.read(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"HTTP/1.1 100 Continue\r\n\r\n");
    stream.write_all(b"{}").unwrap();
    let n = stream.read(&mut buf).unwrap();
    assert!(buf[..n].starts_with(b"HTTP/1.1 204 No Content\r\n"));
}

#[test]
fn a_new_client_takes_the_slot_of_the_longest_idle() {
    let s = Setup::with_limits(ServerLimits {
        max_connections: 2,
        ..ServerLimits::default()
    });
    // Both connected, neither has sent a byte: both idle, `a` the longest.
    let mut a = s.conn();
    let mut b = s.conn();
    let mut c = s.conn();
    assert_eq!(c.request("GET", "/", None).unwrap().0, 200);
    // `a` was closed without a word: it had no request under way.
    let mut byte = [0u8; 1];
    assert_eq!(a.stream().read(&mut byte).unwrap(), 0);
    assert!(a.request("GET", "/", None).is_err());
    // `b` kept its slot (`c` was idle longer when `d` came).
    assert_eq!(b.request("GET", "/", None).unwrap().0, 200);
    let mut d = s.conn();
    assert_eq!(d.request("GET", "/", None).unwrap().0, 200);
    assert_eq!(c.stream().read(&mut byte).unwrap(), 0);
    assert_eq!(b.request("GET", "/", None).unwrap().0, 200);
}

#[test]
fn thousand_requests_on_one_connection() {
    let s = Setup::new();
    let mut c = s.conn();
    for i in 0..1000 {
        let (status, body) = c.request("GET", "/machine-config", None).unwrap();
        assert_eq!(status, 200, "request {i}");
        let m: MachineConfig = serde_json::from_str(&body).unwrap();
        assert_eq!(m, MachineConfig::default());
    }
    assert_eq!(s.vmm.seen().len(), 1000);
}

#[test]
fn socket_file_mode_threads_and_removal() {
    let s = Setup::new();
    let path = s.sock().to_path_buf();
    let meta = fs::symlink_metadata(&path).unwrap();
    assert!(meta.file_type().is_socket());
    assert_eq!(meta.permissions().mode() & 0o7777, 0o600);
    // The thread's name ("api") is checked on the real binary in
    // tests/api.rs: inside the test harness the OS-level names of spawned
    // threads are not reliable.
    // An open connection is closed when the server stops.
    let mut c = s.conn();
    assert_eq!(c.request("GET", "/", None).unwrap().0, 200);
    let Setup { server, vmm, _dir } = s;
    drop(server);
    assert!(!path.exists());
    let mut byte = [0u8; 1];
    assert_eq!(c.stream().read(&mut byte).unwrap(), 0);
    assert!(UnixStream::connect(&path).is_err());
    drop(vmm);
}

#[test]
fn stale_socket_is_replaced() {
    let dir = TempDir::new();
    drop(UnixListener::bind(dir.sock()).unwrap());
    assert!(fs::symlink_metadata(dir.sock())
        .unwrap()
        .file_type()
        .is_socket());
    let server = start_at(&dir.sock()).unwrap();
    assert!(UnixStream::connect(dir.sock()).is_ok());
    drop(server);
    assert!(!dir.sock().exists());
}

#[test]
fn live_socket_is_refused() {
    let dir = TempDir::new();
    let first = start_at(&dir.sock()).unwrap();
    let e = start_at(&dir.sock()).unwrap_err();
    assert!(matches!(e, ApiServerError::InUse(_)), "{e}");
    assert!(e.to_string().contains("in use"), "{e}");
    // The first server still works and still owns its file.
    assert!(UnixStream::connect(first.path()).is_ok());
}

#[test]
fn other_files_are_refused() {
    let dir = TempDir::new();
    let file = dir.0.join("file");
    fs::write(&file, "keep me").unwrap();
    let e = start_at(&file).unwrap_err();
    assert!(
        matches!(
            e,
            ApiServerError::NotASocket {
                kind: "regular file",
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(fs::read_to_string(&file).unwrap(), "keep me");

    let sub = dir.0.join("sub");
    fs::create_dir(&sub).unwrap();
    let e = start_at(&sub).unwrap_err();
    assert!(
        matches!(
            e,
            ApiServerError::NotASocket {
                kind: "directory",
                ..
            }
        ),
        "{e}"
    );

    // A symlink is refused whatever it points to (a stale socket here).
    let stale = dir.0.join("stale.sock");
    drop(UnixListener::bind(&stale).unwrap());
    let link = dir.0.join("link.sock");
    symlink(&stale, &link).unwrap();
    let e = start_at(&link).unwrap_err();
    assert!(
        matches!(
            e,
            ApiServerError::NotASocket {
                kind: "symbolic link",
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("symbolic link"), "{e}");
    assert!(fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());
    assert!(stale.exists());

    let long = dir.0.join("x".repeat(120));
    assert!(matches!(
        start_at(&long).unwrap_err(),
        ApiServerError::BadPath(_)
    ));
}

#[test]
fn drop_keeps_a_file_that_replaced_the_socket() {
    let dir = TempDir::new();
    let server = start_at(&dir.sock()).unwrap();
    fs::remove_file(dir.sock()).unwrap();
    fs::write(dir.sock(), "not ours").unwrap();
    drop(server);
    assert_eq!(fs::read_to_string(dir.sock()).unwrap(), "not ours");
}
