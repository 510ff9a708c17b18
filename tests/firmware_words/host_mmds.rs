//! The host-side MMDS of tests/firmware_words.rs: a small HTTP server on
//! Linux's own TCP/IP stack in a network namespace, behind the tap teravm
//! gives the guest.

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use crate::common;
use crate::common::api::T;

/// The token the host-side MMDS hands out.
pub const TOKEN: &str = "teravm-test-token-0123456789abcdef";

/// A request the host-side MMDS saw: method, path, headers (names lower
/// case).
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
    /// A GET's answer stayed open: whether the firmware closed it (its FIN
    /// came, rather than the server's read timeout).
    pub ended_by_client: bool,
}

impl Seen {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// The requests a [`HostMmds`] has answered, in order.
#[derive(Default)]
struct Log {
    all: Mutex<Vec<Seen>>,
    changed: Condvar,
}

/// The MMDS the firmware talks to in these tests: a small HTTP server on
/// Linux's own TCP/IP stack, bound to 169.254.169.254:80 on the host end of
/// a tap (`tap0`, 169.254.169.254/16) in a network namespace of its own;
/// teravm runs in that namespace and gets the tap as eth0. It answers
/// `PUT /latest/api/token` (with X-metadata-token-ttl-seconds) with
/// [`TOKEN`] when `v2`, else 405; and `GET <path>` from `files` (404 when
/// missing), with `v2` only with the token (401 without). The token's
/// answer closes at once (the firmware ends at our FIN); a GET's answer
/// stays open until the firmware closes (it must end at Content-Length).
/// To fetch from another MMDS (teravm's own), give `fetch` what this gives
/// it: the sections that configure teravm, the namespace, the requests seen.
pub struct HostMmds {
    pub ns: common::netns::Netns,
    seen: Arc<Log>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    go: Option<std::sync::mpsc::Sender<()>>,
    _filler: Option<std::net::TcpStream>,
}

fn sysctl(ns: &common::netns::Netns, setting: &str) {
    let ok = ns
        .command("sysctl")
        .args(["-q", "-w", setting])
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "sysctl {setting} in {}", ns.name);
}

impl HostMmds {
    /// None where a namespace with a tap cannot be made.
    pub fn start(tag: &str, v2: bool, files: Vec<(&'static str, String)>) -> Option<HostMmds> {
        Self::start_deaf(tag, v2, files, false)
    }

    /// Like `start`; with `deaf`, Linux ignores ARP on the tap (arp_ignore
    /// 8) until [`HostMmds::answer_arp`], and the server's accept queue is
    /// full (backlog 0 and a connection of our own in it, so Linux drops
    /// SYNs) until [`HostMmds::open_queue`].
    pub fn start_deaf(
        tag: &str,
        v2: bool,
        files: Vec<(&'static str, String)>,
        deaf: bool,
    ) -> Option<HostMmds> {
        let ns = common::netns::Netns::new(tag)?;
        let ok = Command::new("ip")
            .args([
                "-n",
                &ns.name,
                "addr",
                "add",
                "169.254.169.254/16",
                "dev",
                "tap0",
            ])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "ip addr add in {}", ns.name);
        let seen = Arc::new(Log::default());
        let stop = Arc::new(AtomicBool::new(false));
        let listener = in_netns(&ns, || {
            std::net::TcpListener::bind("169.254.169.254:80").expect("bind 169.254.169.254:80")
        });
        let (go_tx, go_rx) = std::sync::mpsc::channel();
        let mut filler = None;
        if deaf {
            sysctl(&ns, "net.ipv4.conf.tap0.arp_ignore=8");
            assert!(Command::new("ip")
                .args(["-n", &ns.name, "link", "set", "lo", "up"])
                .status()
                .is_ok_and(|s| s.success()));
            // SAFETY: listen again on our listening socket: a new backlog.
            assert_eq!(unsafe { libc::listen(listener.as_raw_fd(), 0) }, 0);
            filler = Some(in_netns(&ns, || {
                std::net::TcpStream::connect("169.254.169.254:80").expect("the filler")
            }));
        } else {
            go_tx.send(()).unwrap();
        }
        let (s, st) = (seen.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            if deaf {
                // Until open_queue: then the filler is taken and dropped.
                if go_rx.recv().is_err() {
                    return;
                }
                let _ = listener.accept();
            }
            serve(listener, v2, &files, &s, &st)
        });
        Some(HostMmds {
            ns,
            seen,
            stop,
            thread: Some(thread),
            go: Some(go_tx),
            _filler: filler,
        })
    }

    /// Linux answers ARP on the tap again.
    pub fn answer_arp(&self) {
        sysctl(&self.ns, "net.ipv4.conf.tap0.arp_ignore=0");
    }

    /// The server takes connections again.
    pub fn open_queue(&mut self) {
        if let Some(go) = self.go.take() {
            let _ = go.send(());
        }
    }

    /// What configures teravm for it: eth0 on the namespace's tap.
    pub fn sections(&self) -> Vec<(String, String)> {
        vec![(
            "/network-interfaces/eth0".to_string(),
            r#"{"iface_id": "eth0", "host_dev_name": "tap0", "guest_mac": "06:00:ac:10:00:02"}"#
                .to_string(),
        )]
    }

    /// The requests seen, once there are `n` (within T).
    pub fn seen(&self, n: usize) -> Vec<Seen> {
        let (all, _) = self
            .seen
            .changed
            .wait_timeout_while(self.seen.all.lock().unwrap(), T, |v| v.len() < n)
            .unwrap();
        all.clone()
    }
}

impl Drop for HostMmds {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.go.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// `f` run on a thread inside `ns` (what it makes, sockets, stays there).
fn in_netns<R: Send + 'static>(
    ns: &common::netns::Netns,
    f: impl FnOnce() -> R + Send + 'static,
) -> R {
    let path = format!("/var/run/netns/{}", ns.name);
    std::thread::spawn(move || {
        let file = std::fs::File::open(&path).unwrap();
        // SAFETY: setns on this thread with a namespace fd we hold.
        let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
        f()
    })
    .join()
    .unwrap()
}

/// Accepts until `stop`, one connection at a time.
fn serve(
    listener: std::net::TcpListener,
    v2: bool,
    files: &[(&'static str, String)],
    seen: &Log,
    stop: &AtomicBool,
) {
    while !stop.load(Ordering::Relaxed) {
        let mut pfd = libc::pollfd {
            fd: listener.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one pollfd on our stack.
        if unsafe { libc::poll(&mut pfd, 1, 100) } <= 0 {
            continue;
        }
        let Ok((mut conn, _)) = listener.accept() else {
            continue;
        };
        conn.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let Some(req) = read_request(&mut conn) else {
            continue;
        };
        let (code, body, close_now) = if req.method == "PUT" && req.path == "/latest/api/token" {
            match (v2, req.header("x-metadata-token-ttl-seconds")) {
                (false, _) => (405, "not here".to_string(), true),
                (true, Some(_)) => (200, TOKEN.to_string(), true),
                (true, None) => (400, "no ttl".to_string(), true),
            }
        } else if req.method == "GET" {
            if v2 && req.header("x-metadata-token") != Some(TOKEN) {
                (401, "no token".to_string(), false)
            } else {
                match files.iter().find(|(p, _)| *p == req.path) {
                    Some((_, b)) => (200, b.clone(), false),
                    None => (404, "not found".to_string(), false),
                }
            }
        } else {
            (405, "no".to_string(), true)
        };
        let reason = match code {
            200 => "OK",
            401 => "Unauthorized",
            404 => "Not Found",
            _ => "Whatever",
        };
        let head = format!(
            "HTTP/1.1 {code} {reason}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        let _ = conn.write_all(head.as_bytes());
        let _ = conn.write_all(body.as_bytes());
        let mut req = req;
        if !close_now {
            // Until the firmware's FIN (or the read timeout).
            let mut rest = Vec::new();
            req.ended_by_client = conn.read_to_end(&mut rest).is_ok();
        }
        seen.all.lock().unwrap().push(req);
        seen.changed.notify_all();
    }
}

/// One request: the request line and headers (a body is not expected).
fn read_request(conn: &mut std::net::TcpStream) -> Option<Seen> {
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        if conn.read(&mut byte).ok()? == 0 || buf.len() > 8192 {
            return None;
        }
        buf.push(byte[0]);
    }
    let text = String::from_utf8(buf).ok()?;
    let mut lines = text.split("\r\n");
    let mut first = lines.next()?.split(' ');
    let (method, path) = (first.next()?.to_string(), first.next()?.to_string());
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    Some(Seen {
        method,
        path,
        headers,
        ended_by_client: false,
    })
}
