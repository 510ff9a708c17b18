//! The Unix sockets at the edge: the listener at `uds_path`
//! ([`bind_uds`], called by the VMM on its `files` thread) and the
//! non-blocking connects to `<uds_path>_<port>` ([`connect_nonblocking`],
//! on the device thread). std has no unbound socket, so `socket`, `fchmod`
//! before `bind`, `bind`, `listen` and `connect` are libc calls here.
//!
//! Why `fchmod` before `bind`: Linux creates the socket file with the mode
//! of the socket's own inode less the umask, so the file never exists with
//! more than 0600, whatever the umask; `bind` creates the file itself and
//! fails on any existing name, a symlink included (dangling or not), so no
//! symlink is followed. Only a umask that takes the owner's bits away makes
//! the mode less than 0600; that is set right through an `O_PATH |
//! O_NOFOLLOW` fd (`/proc/self/fd/N`), which cannot be a symlink either.

use std::fs;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;

use super::VsockError;

/// The mode of the socket file.
pub const SOCKET_MODE: u32 = 0o600;
/// The listener's backlog.
const BACKLOG: i32 = 128;

/// A `sockaddr_un` for `path`, or None if it does not fit (107 bytes and a
/// NUL) or holds a NUL.
fn sockaddr(path: &Path) -> Option<(libc::sockaddr_un, libc::socklen_t)> {
    let bytes = path.as_os_str().as_bytes();
    // SAFETY: sockaddr_un is plain old data; all zeroes is a valid value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    if bytes.is_empty() || bytes.len() >= addr.sun_path.len() || bytes.contains(&0) {
        return None;
    }
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + bytes.len() + 1;
    Some((addr, len as libc::socklen_t))
}

/// A new non-blocking, close-on-exec `AF_UNIX` stream socket.
fn stream_socket() -> io::Result<OwnedFd> {
    // SAFETY: socket() takes no pointers; the fd it returns is new and
    // owned by nobody else.
    let fd = unsafe {
        libc::socket(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd was just returned by socket() and is owned here only.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Connects to the Unix socket at `path` without blocking: a listener whose
/// backlog is full answers `WouldBlock` (the caller refuses the connection);
/// a path that does not fit a socket address is `InvalidInput`.
pub fn connect_nonblocking(path: &Path) -> io::Result<UnixStream> {
    let (addr, len) = sockaddr(path).ok_or(io::ErrorKind::InvalidInput)?;
    let fd = stream_socket()?;
    // SAFETY: addr is a valid sockaddr_un of `len` bytes that outlives the
    // call; fd is an open socket.
    let rc = unsafe {
        libc::connect(
            fd.as_raw_fd(),
            (&addr as *const libc::sockaddr_un).cast(),
            len,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(UnixStream::from(fd))
}

/// Creates the listening socket at `path`, mode 0600, non-blocking:
/// refuses any name that exists (a symlink, a file, a socket, stale or
/// not), as Firecracker's `bind` does; like Firecracker, teravm leaves its
/// socket behind at exit, so a second run on the same `uds_path` removes
/// it first. Never follows a symlink at `path`.
pub fn bind_uds(path: &Path) -> Result<UnixListener, VsockError> {
    let bad = |why| VsockError::BadPath(path.to_path_buf(), why);
    let (addr, len) = sockaddr(path)
        .ok_or_else(|| bad("it must be 1 to 107 bytes without NUL (a Unix socket address)"))?;
    let bind_err = |e| VsockError::Bind(path.to_path_buf(), e);
    // An existing name (a file, a symlink, a socket stale or not) is
    // refused, as Firecracker's bind refuses it: the caller removes a stale
    // socket. So nothing is unlinked here and no symlink is followed.
    match fs::symlink_metadata(path) {
        Ok(_) => return Err(VsockError::PathExists(path.to_path_buf())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(bind_err(e)),
    }
    let fd = stream_socket().map_err(bind_err)?;
    // SAFETY: fd is an open socket; fchmod takes no pointers.
    if unsafe { libc::fchmod(fd.as_raw_fd(), SOCKET_MODE as libc::mode_t) } < 0 {
        return Err(bind_err(io::Error::last_os_error()));
    }
    // SAFETY: addr is a valid sockaddr_un of `len` bytes that outlives the
    // call; fd is an open, unbound socket.
    let rc = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&addr as *const libc::sockaddr_un).cast(),
            len,
        )
    };
    if rc < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EADDRINUSE) {
            return Err(VsockError::PathExists(path.to_path_buf()));
        }
        return Err(bind_err(e));
    }
    // SAFETY: fd is an open, bound socket; listen takes no pointers.
    if unsafe { libc::listen(fd.as_raw_fd(), BACKLOG) } < 0 {
        return Err(bind_err(io::Error::last_os_error()));
    }
    Ok(UnixListener::from(fd))
}
