//! The host ends of the guest's devices on QEMU and Firecracker: vsock
//! (Firecracker's Unix socket protocol; AF_VSOCK for QEMU's vhost-vsock),
//! accepts with a deadline, and a raw frame onto a tap.

use std::io::Write;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::time::{Duration, Instant};

use super::T;

/// Writes `msg` on `s` and asserts the same bytes come back (an echoing
/// guest at the other end).
pub fn echoed(s: &mut (impl std::io::Read + Write), msg: &[u8]) {
    s.write_all(msg).unwrap();
    let mut back = vec![0u8; msg.len()];
    s.read_exact(&mut back).unwrap();
    assert_eq!(back, msg, "the echo");
}

/// Firecracker's host side of vsock: connect to `uds`, `CONNECT <port>`,
/// read the answer line (`OK <host port>` when the guest took it).
pub fn vsock_connect(uds: &Path, port: u32) -> (UnixStream, String) {
    let deadline = Instant::now() + T;
    let mut s = loop {
        match UnixStream::connect(uds) {
            Ok(s) => break s,
            Err(e) => {
                assert!(Instant::now() < deadline, "{e}");
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    };
    s.set_read_timeout(Some(T)).unwrap();
    s.write_all(format!("CONNECT {port}\n").as_bytes()).unwrap();
    let mut line = String::new();
    // One byte at a time: what follows the line is the guest's.
    let mut byte = [0u8; 1];
    while !line.ends_with('\n') {
        match std::io::Read::read(&mut s, &mut byte) {
            Ok(1) => line.push(byte[0] as char),
            _ => break,
        }
    }
    (s, line)
}

/// An AF_VSOCK stream socket, for QEMU's vhost-vsock (read and written as
/// any stream socket; UnixStream only carries the descriptor).
fn vsock_socket() -> OwnedFd {
    // SAFETY: a new socket; the result is checked.
    let fd = unsafe { libc::socket(libc::AF_VSOCK, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    assert!(fd >= 0, "AF_VSOCK: {}", std::io::Error::last_os_error());
    // SAFETY: a new descriptor nothing else owns.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

fn vsock_addr(cid: u32, port: u32) -> libc::sockaddr_vm {
    // SAFETY: plain data, zeroed, then filled.
    let mut a: libc::sockaddr_vm = unsafe { std::mem::zeroed() };
    a.svm_family = libc::AF_VSOCK as libc::sa_family_t;
    a.svm_cid = cid;
    a.svm_port = port;
    a
}

/// QEMU's host side of vsock: connect to (`cid`, `port`) over AF_VSOCK,
/// retried until the guest listens or [`T`] passes.
pub fn vsock_connect_cid(cid: u32, port: u32) -> UnixStream {
    use std::os::fd::AsRawFd;
    let deadline = Instant::now() + T;
    loop {
        let fd = vsock_socket();
        let a = vsock_addr(cid, port);
        // SAFETY: connects our socket to a sockaddr_vm of its size.
        let rc = unsafe {
            libc::connect(
                fd.as_raw_fd(),
                (&a as *const libc::sockaddr_vm).cast(),
                std::mem::size_of::<libc::sockaddr_vm>() as u32,
            )
        };
        if rc == 0 {
            let s = UnixStream::from(fd);
            s.set_read_timeout(Some(T)).unwrap();
            return s;
        }
        let e = std::io::Error::last_os_error();
        assert!(Instant::now() < deadline, "vsock connect {cid}:{port}: {e}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// QEMU's host side of a guest connection: an AF_VSOCK listener on `port`
/// (any cid); [`vsock_accept`] takes one connection.
pub fn vsock_listen(port: u32) -> OwnedFd {
    use std::os::fd::AsRawFd;
    let fd = vsock_socket();
    let a = vsock_addr(libc::VMADDR_CID_ANY, port);
    // SAFETY: binds our socket to a sockaddr_vm of its size; then listens.
    let rc = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&a as *const libc::sockaddr_vm).cast(),
            std::mem::size_of::<libc::sockaddr_vm>() as u32,
        )
    };
    assert_eq!(
        rc,
        0,
        "vsock bind {port}: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: listen on our bound socket.
    assert_eq!(unsafe { libc::listen(fd.as_raw_fd(), 4) }, 0);
    fd
}

/// One connection on a [`vsock_listen`] socket, within [`T`].
pub fn vsock_accept(listener: &OwnedFd) -> UnixStream {
    use std::os::fd::AsRawFd;
    accept_within(listener.as_raw_fd())
}

/// One connection on `listener` (Firecracker's `<uds>_<port>`), within
/// [`T`]: a guest that never connects fails the test instead of hanging it.
pub fn uds_accept(listener: &UnixListener) -> UnixStream {
    use std::os::fd::AsRawFd;
    accept_within(listener.as_raw_fd())
}

fn accept_within(listener: std::os::fd::RawFd) -> UnixStream {
    let mut pfd = libc::pollfd {
        fd: listener,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one pollfd on our stack.
    let n = unsafe { libc::poll(&mut pfd, 1, T.as_millis() as i32) };
    assert_eq!(n, 1, "no connection within {T:?}");
    // SAFETY: accepts on the caller's listening socket; the address is not
    // wanted.
    let fd = unsafe {
        libc::accept4(
            listener,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            libc::SOCK_CLOEXEC,
        )
    };
    assert!(fd >= 0, "accept: {}", std::io::Error::last_os_error());
    // SAFETY: a new descriptor nothing else owns.
    let s = UnixStream::from(unsafe { OwnedFd::from_raw_fd(fd) });
    s.set_read_timeout(Some(T)).unwrap();
    s
}

/// Sends `frame` on the AF_PACKET socket `fd` (from [`super::netns`]).
pub fn send_frame(fd: &OwnedFd, frame: &[u8]) {
    use std::os::fd::AsRawFd;
    // SAFETY: sends our buffer on our bound socket.
    let n = unsafe { libc::send(fd.as_raw_fd(), frame.as_ptr().cast(), frame.len(), 0) };
    assert_eq!(
        n,
        frame.len() as isize,
        "{}",
        std::io::Error::last_os_error()
    );
}
