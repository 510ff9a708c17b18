//! Clients that misbehave on purpose, against the real binary's API socket
//! (no guest is started, so these run without /dev/kvm): idle connections
//! that would pin every slot, a request trickled one byte at a time, peers
//! of another uid, and what sits at the socket path before teravm starts.

mod common;

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::api::*;
use common::client::Connection;
use common::*;

/// The server's connection limit (`ServerLimits::default`).
const SLOTS: usize = 64;

/// The CPU time (user + system) the process `pid` has used so far.
fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name, which is in parentheses and may hold
    // spaces: state is the first, utime the 12th and stime the 13th.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
    Duration::from_millis(ticks * 1000 / hz)
}

/// Bytes written on `s` that its peer has not read yet (`SIOCOUTQ`).
fn unread(s: &UnixStream) -> i32 {
    let mut n: libc::c_int = 0;
    // SAFETY: TIOCOUTQ (SIOCOUTQ) writes one int through the pointer, which
    // is valid for the call; the result is checked.
    let rc = unsafe { libc::ioctl(s.as_raw_fd(), libc::TIOCOUTQ, &mut n) };
    assert_eq!(rc, 0, "SIOCOUTQ: {}", std::io::Error::last_os_error());
    n
}

/// A `PUT /reclaim` of `total` bytes: a large header block (50 headers of
/// about 1 KiB) and a body padded with spaces.
fn big_request(total: usize) -> Vec<u8> {
    let mut head = String::from("PUT /reclaim HTTP/1.1\r\nConnection: close\r\n");
    for i in 0..50 {
        head += &format!("X-Pad-{i:02}: {}\r\n", "a".repeat(1000));
    }
    let json = r#"{"workers_per_node": 3}"#;
    let clen_line = |n: usize| format!("Content-Length: {n}\r\n\r\n");
    let body_len = total - head.len() - clen_line(99999).len();
    head += &format!("Content-Length: {body_len:05}\r\n\r\n");
    let mut bytes = head.into_bytes();
    bytes.extend_from_slice(json.as_bytes());
    bytes.resize(bytes.len() + body_len - json.len(), b' ');
    assert_eq!(bytes.len(), total);
    bytes
}

#[test]
fn a_request_trickled_one_byte_at_a_time_costs_bounded_cpu() {
    let (vmm, sock, _dir) = start_api("trickle", &[]);
    let pid = vmm.child.id();
    let request = big_request(60 << 10);
    let mut s = UnixStream::connect(&sock).unwrap();
    s.set_read_timeout(Some(T)).unwrap();
    let before = cpu_time(pid);
    let t0 = Instant::now();
    let mut sent = 0;
    for byte in &request {
        // The server may give up on the request (408) and close.
        if s.write_all(std::slice::from_ref(byte)).is_err() {
            break;
        }
        sent += 1;
        // Wait until the server has read this byte, so that every byte is a
        // read of its own (the worst case for a parser that starts over).
        while unread(&s) > 0 {
            assert!(t0.elapsed() < 10 * T, "the server stopped reading");
            std::thread::yield_now();
        }
    }
    let (status, body) = read_until_close(&mut s);
    let used = cpu_time(pid) - before;
    eprintln!(
        "teravm used {} ms of CPU for {sent} of {} bytes sent one per read in {:?}: {status:?}",
        used.as_millis(),
        request.len(),
        t0.elapsed()
    );
    // Measured here: one poll and one read per byte cost about 0.3 s of CPU
    // for the whole request; re-parsing the buffer on every read (before
    // the incremental parser) cost 4.3 s, or ran into the request timeout
    // (408 after 10 s and 3.3 s of CPU) on a busier machine.
    assert!(
        used < Duration::from_millis(1500),
        "{} ms of CPU for one trickled request",
        used.as_millis()
    );
    assert_eq!(status, Some(204), "{body}");
    assert_eq!(get(&sock, "/vm/config")["reclaim"]["workers_per_node"], 3);
    stop(vmm);
}

/// Reads a reply up to the end of the connection: the status (None if the
/// server closed without a word) and the body.
fn read_until_close(s: &mut UnixStream) -> (Option<u16>, String) {
    let mut reply = Vec::new();
    let _ = s.read_to_end(&mut reply);
    let text = String::from_utf8_lossy(&reply);
    let status = text.split_whitespace().nth(1).and_then(|c| c.parse().ok());
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    (status, body.to_string())
}

/// Ends the unstarted VMM with SIGTERM and checks that it exits cleanly.
fn stop(vmm: Vmm) {
    vmm.signal(libc::SIGTERM);
    let (code, _, stderr) = vmm.wait(T);
    assert_eq!(code, 0, "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// Sends `GET /` on `s` (asking to close after it) and reads the reply.
fn get_root(s: &mut UnixStream) -> (Option<u16>, String) {
    s.set_read_timeout(Some(T)).unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n")
        .unwrap();
    read_until_close(s)
}

/// Whether the server closed `s` without a word (its next read is the end).
fn closed_silently(s: &mut UnixStream) -> bool {
    s.set_read_timeout(Some(T)).unwrap();
    let mut byte = [0u8; 1];
    matches!(s.read(&mut byte), Ok(0))
}

#[test]
fn sixty_four_idle_clients_do_not_lock_out_the_sixty_fifth() {
    let (vmm, sock, _dir) = start_api("idle64", &[]);
    // Every slot taken by a client that connects and says nothing.
    let mut idle: Vec<UnixStream> = (0..SLOTS)
        .map(|_| UnixStream::connect(&sock).unwrap())
        .collect();
    // The 65th is served: the longest idle gave its slot up.
    let t0 = Instant::now();
    let mut c = Connection::open(&sock).unwrap();
    let (status, body) = c.request("GET", "/", None).unwrap();
    eprintln!("the 65th client was answered in {:?}", t0.elapsed());
    assert_eq!(status, 200, "{body}");
    assert_eq!(json(&body)["state"], "Not started");
    assert!(closed_silently(&mut idle[0]));
    // The others kept theirs and are served too.
    let (status, _) = get_root(&mut idle[1]);
    assert_eq!(status, Some(200));

    // Once they leave, all the slots serve as usual: 64 kept-alive clients
    // at once, each answered twice (no one lost its slot).
    drop(idle);
    drop(c);
    let mut clients: Vec<Connection> = (0..SLOTS)
        .map(|_| {
            let mut c = Connection::open(&sock).unwrap();
            assert_eq!(c.request("GET", "/", None).unwrap().0, 200);
            c
        })
        .collect();
    for c in &mut clients {
        assert_eq!(c.request("GET", "/machine-config", None).unwrap().0, 200);
    }
    drop(clients);
    stop(vmm);
}

#[test]
fn sixty_four_half_requests_get_the_sixty_fifth_a_503_or_a_slot() {
    let (vmm, sock, _dir) = start_api("half64", &[]);
    let half: Vec<UnixStream> = (0..SLOTS)
        .map(|_| {
            let mut s = UnixStream::connect(&sock).unwrap();
            s.write_all(b"PUT /reclaim HTTP/1.1\r\nContent-Length: 40\r\n\r\n{")
                .unwrap();
            s
        })
        .collect();
    // Whether those have been arriving for more than the pressure timeout
    // (1 s) when it comes decides which: a 503 that says why, or a slot
    // taken from the oldest half request. Never a silent close.
    let mut c = UnixStream::connect(&sock).unwrap();
    let (status, body) = get_root(&mut c);
    match status {
        Some(200) => assert_eq!(json(&body)["state"], "Not started"),
        Some(503) => {
            let fault = json(&body)["fault_message"].as_str().unwrap().to_string();
            assert!(fault.contains("all 64 API connections"), "{fault}");
        }
        other => panic!("{other:?}: {body}"),
    }
    drop(half);
    wait_for_api(&sock, T);
    stop(vmm);
}

/// The address of the socket at `path`, for raw syscalls.
fn sockaddr(path: &Path) -> libc::sockaddr_un {
    // SAFETY: sockaddr_un is plain old data; all zeroes is a valid value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.as_os_str().as_bytes();
    assert!(bytes.len() < addr.sun_path.len());
    for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    addr
}

const SOCKADDR_LEN: libc::socklen_t = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;

/// In a forked child that drops to uid and gid `uid`: connects to `sock`,
/// sends `GET /` and hands back what it read. `Err` carries the child's
/// wait status when it could not get that far.
fn get_root_as(uid: u32, sock: &Path) -> Result<String, i32> {
    let addr = sockaddr(sock);
    let request = b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n";
    let mut pipe = [0; 2];
    // SAFETY: `pipe` is valid for two ints; the result is checked.
    assert_eq!(
        unsafe { libc::pipe2(pipe.as_mut_ptr(), libc::O_CLOEXEC) },
        0
    );
    // SAFETY: the child only makes raw system calls on memory prepared
    // before the fork (no allocation, no locks) and ends with _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        // SAFETY: as above; each call's result decides the exit status.
        unsafe {
            let id = uid as libc::c_long;
            if libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()) != 0
                || libc::syscall(libc::SYS_setresgid, id, id, id) != 0
                || libc::syscall(libc::SYS_setresuid, id, id, id) != 0
            {
                libc::_exit(10);
            }
            let fd = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0);
            if fd < 0 {
                libc::_exit(11);
            }
            let sa = &addr as *const libc::sockaddr_un as *const libc::sockaddr;
            if libc::connect(fd, sa, SOCKADDR_LEN) != 0 {
                libc::_exit(12);
            }
            let n = request.len();
            if libc::write(fd, request.as_ptr().cast(), n) != n as isize {
                libc::_exit(13);
            }
            let mut buf = [0u8; 4096];
            loop {
                let n = libc::read(fd, buf.as_mut_ptr().cast(), buf.len());
                if n <= 0 {
                    break;
                }
                libc::write(pipe[1], buf.as_ptr().cast(), n as usize);
            }
            libc::_exit(0);
        }
    }
    // SAFETY: closing the write end, which this process owns.
    unsafe { libc::close(pipe[1]) };
    // SAFETY: the read end is owned here and by nothing else.
    let mut reader = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(pipe[0]) });
    let mut reply = String::new();
    reader.read_to_string(&mut reply).unwrap();
    let mut status = 0;
    // SAFETY: waiting for our own child; `status` is valid for the call.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    match libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status)) {
        Some(0) => Ok(reply),
        _ => Err(status),
    }
}

#[test]
fn a_peer_of_another_uid_is_refused_with_403() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        skip(
            "a_peer_of_another_uid",
            "needs root to connect as another uid",
        );
        return;
    }
    let (vmm, sock, dir) = start_api("peercred", &[]);
    // The socket is 0600; loosen it, as a careless operator might, so that
    // another user can connect at all: the credential check is what stops it.
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o666)).unwrap();
    const NOBODY: u32 = 65534;
    for _ in 0..3 {
        let reply = get_root_as(NOBODY, &sock).expect("the child could not connect");
        assert!(reply.starts_with("HTTP/1.1 403 Forbidden\r\n"), "{reply}");
        let body = reply.split_once("\r\n\r\n").unwrap().1;
        let fault = json(body)["fault_message"].as_str().unwrap().to_string();
        assert!(fault.contains("only root and uid 0"), "{fault}");
    }
    // Root (here the same uid) is served, also through a forked child.
    let reply = get_root_as(0, &sock).unwrap();
    assert!(reply.starts_with("HTTP/1.1 200 OK\r\n"), "{reply}");
    vmm.signal(libc::SIGTERM);
    let (code, _, stderr) = vmm.wait(T);
    assert_eq!(code, 0, "{stderr}");
    // Three refusals, one warning.
    let warnings = stderr
        .lines()
        .filter(|l| l.contains("refused a connection from uid 65534"))
        .count();
    assert_eq!(warnings, 1, "{stderr}");
}

/// Binds a listener at `path` with a backlog of 0 and fills it: a blocking
/// connect to it would wait for ever. The descriptors keep it so.
fn full_listener(path: &Path) -> Vec<OwnedFd> {
    let addr = sockaddr(path);
    let sa = &addr as *const libc::sockaddr_un as *const libc::sockaddr;
    let own = |fd: i32| {
        assert!(fd >= 0, "{}", std::io::Error::last_os_error());
        // SAFETY: `fd` is a new descriptor that nothing else owns.
        unsafe { OwnedFd::from_raw_fd(fd) }
    };
    // SAFETY: plain syscalls on descriptors owned here and a valid address;
    // results are checked.
    let listener = own(unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0) });
    // SAFETY: as above.
    assert_eq!(
        unsafe { libc::bind(listener.as_raw_fd(), sa, SOCKADDR_LEN) },
        0
    );
    // SAFETY: as above.
    assert_eq!(unsafe { libc::listen(listener.as_raw_fd(), 0) }, 0);
    let mut fds = vec![listener];
    loop {
        let flags = libc::SOCK_STREAM | libc::SOCK_NONBLOCK;
        // SAFETY: as above.
        let fd = own(unsafe { libc::socket(libc::AF_UNIX, flags, 0) });
        // SAFETY: as above.
        if unsafe { libc::connect(fd.as_raw_fd(), sa, SOCKADDR_LEN) } < 0 {
            let e = std::io::Error::last_os_error();
            assert_eq!(e.raw_os_error(), Some(libc::EAGAIN), "{e}");
            return fds;
        }
        fds.push(fd);
        assert!(fds.len() < 10_000, "the backlog never filled");
    }
}

#[test]
fn a_listener_with_a_full_backlog_at_the_path_is_refused_promptly() {
    let dir = temp_dir("fullbacklog");
    let sock = dir.join("api.sock");
    let _held = full_listener(&sock);
    // A probe that blocked would hang here until `run` gives up (a panic).
    let (code, _, stderr) = run(&["--api-sock", sock.to_str().unwrap()], T);
    assert_eq!(code, 1, "{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("backlog is full"), "{stderr}");
    assert!(stderr.contains(sock.to_str().unwrap()), "{stderr}");
    assert!(std::fs::symlink_metadata(&sock)
        .unwrap()
        .file_type()
        .is_socket());
}

#[test]
fn the_socket_is_0600_even_under_a_umask_that_masks_the_owner() {
    let dir = temp_dir("umask");
    let sock = dir.join("api.sock");
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(r#"umask 0277; exec "$0" --api-sock "$1""#)
        .arg(teravm())
        .arg(&sock);
    let vmm = Vmm::spawn_command(cmd);
    wait_for_api(&sock, T);
    let meta = std::fs::symlink_metadata(&sock).unwrap();
    assert!(meta.file_type().is_socket());
    assert_eq!(meta.permissions().mode() & 0o7777, 0o600);
    stop(vmm);
}
