//! The socket file: making room for it (a stale socket is replaced, a live
//! one or any other file refused), binding it at mode 0600 without following
//! a symbolic link, and the probe that tells a live teravm's socket from a
//! stale one without ever blocking.

use std::fs;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::UnixListener;
use std::path::Path;

use super::ApiServerError;

/// The mode of the socket file.
const SOCKET_MODE: libc::mode_t = 0o600;

/// How many connections the kernel queues before the `api` thread accepts.
const BACKLOG: libc::c_int = 128;

pub(super) fn file_kind(ft: fs::FileType) -> &'static str {
    if ft.is_symlink() {
        "symbolic link"
    } else if ft.is_dir() {
        "directory"
    } else if ft.is_file() {
        "regular file"
    } else if ft.is_fifo() {
        "FIFO"
    } else if ft.is_block_device() || ft.is_char_device() {
        "device"
    } else {
        "file that is not a socket"
    }
}

/// The address of `path` and its length.
fn sockaddr(path: &Path) -> Result<(libc::sockaddr_un, libc::socklen_t), ApiServerError> {
    let bytes = path.as_os_str().as_bytes();
    // SAFETY: sockaddr_un is plain old data; all zeroes is a valid value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    if bytes.is_empty() || bytes.len() >= addr.sun_path.len() || bytes.contains(&0) {
        return Err(ApiServerError::BadPath(path.to_path_buf()));
    }
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + bytes.len() + 1;
    Ok((addr, len as libc::socklen_t))
}

/// A new Unix stream socket (`flags` added to the type, e.g. non-blocking).
fn new_socket(flags: libc::c_int) -> io::Result<OwnedFd> {
    // SAFETY: plain syscall with constant arguments; the result is checked.
    let fd = unsafe {
        libc::socket(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC | flags,
            0,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// What is listening on a socket file.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Probe {
    /// A process accepted the connection: the socket is in use.
    Live,
    /// A process listens but its backlog is full: in use, not answering.
    Unresponsive,
    /// Nobody listens: the file is left over.
    Stale,
}

/// Connects to `path` without blocking. A listener whose backlog is full
/// makes a blocking `connect` wait indefinitely; a non-blocking one answers
/// `EAGAIN` at once, so the probe never waits.
pub(super) fn probe(path: &Path) -> Result<io::Result<Probe>, ApiServerError> {
    let (addr, len) = sockaddr(path)?;
    let fd = match new_socket(libc::SOCK_NONBLOCK) {
        Ok(fd) => fd,
        Err(e) => return Ok(Err(e)),
    };
    // SAFETY: `addr` is a valid sockaddr_un of which `len` bytes are used;
    // the result is checked.
    let rc = unsafe {
        libc::connect(
            fd.as_raw_fd(),
            &addr as *const libc::sockaddr_un as *const libc::sockaddr,
            len,
        )
    };
    if rc == 0 {
        return Ok(Ok(Probe::Live));
    }
    let e = io::Error::last_os_error();
    Ok(match e.raw_os_error() {
        Some(libc::EAGAIN) | Some(libc::EINPROGRESS) => Ok(Probe::Unresponsive),
        Some(libc::ECONNREFUSED) => Ok(Probe::Stale),
        _ => Err(e),
    })
}

/// Makes room for the socket: nothing there, or a stale socket (removed).
pub(super) fn clear_path(path: &Path) -> Result<(), ApiServerError> {
    let stale = |source| ApiServerError::Stale {
        path: path.to_path_buf(),
        source,
    };
    let meta = match fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(stale(e)),
    };
    if !meta.file_type().is_socket() {
        return Err(ApiServerError::NotASocket {
            path: path.to_path_buf(),
            kind: file_kind(meta.file_type()),
        });
    }
    match probe(path)?.map_err(stale)? {
        Probe::Live => Err(ApiServerError::InUse(path.to_path_buf())),
        Probe::Unresponsive => Err(ApiServerError::Unresponsive(path.to_path_buf())),
        Probe::Stale => {
            log::info!("replacing stale API socket {}", path.display());
            // unlink removes the name itself, never what a link points to.
            fs::remove_file(path).map_err(stale)
        }
    }
}

/// `socket`, `fchmod(0600)`, `bind`, `listen`.
///
/// No call here takes the path and follows a symbolic link. `bind` creates
/// the file itself and fails if anything (a link included) is at the path;
/// the file's mode comes from the socket's inode, set with `fchmod` on the
/// descriptor before `bind`, masked by the umask. So the file is 0600 from
/// the moment it exists, with no window in which it is more open and no
/// `chmod` by path that a link swapped in after `bind` could redirect.
/// Only a umask that masks the owner's own bits (e.g. 0277) leaves it less
/// than 0600; that is corrected with `fchmodat(AT_SYMLINK_NOFOLLOW)`, which
/// refuses to act on a link.
pub(super) fn bind_listener(path: &Path) -> Result<UnixListener, ApiServerError> {
    let err = |source| ApiServerError::Bind {
        path: path.to_path_buf(),
        source,
    };
    let (addr, len) = sockaddr(path)?;
    let fd = new_socket(0).map_err(err)?;
    // SAFETY: `fd` is a valid descriptor owned here; the result is checked.
    if unsafe { libc::fchmod(fd.as_raw_fd(), SOCKET_MODE) } < 0 {
        return Err(err(io::Error::last_os_error()));
    }
    // SAFETY: `addr` is a valid sockaddr_un, `len` is within its size (checked
    // by `sockaddr`) and covers the NUL-terminated path; the result is checked.
    let rc = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            &addr as *const libc::sockaddr_un as *const libc::sockaddr,
            len,
        )
    };
    if rc < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::AddrInUse {
            return Err(ApiServerError::InUse(path.to_path_buf()));
        }
        return Err(err(e));
    }
    let listener = UnixListener::from(fd);
    let finish = || -> io::Result<()> {
        fix_mode(path)?;
        // SAFETY: the listener's descriptor is valid; the result is checked.
        if unsafe { libc::listen(listener.as_raw_fd(), BACKLOG) } < 0 {
            return Err(io::Error::last_os_error());
        }
        listener.set_nonblocking(true)
    };
    if let Err(e) = finish() {
        let _ = fs::remove_file(path);
        return Err(err(e));
    }
    Ok(listener)
}

/// Sets the socket file to exactly 0600 if the umask took owner bits away,
/// never following a link.
fn fix_mode(path: &Path) -> io::Result<()> {
    let meta = fs::symlink_metadata(path)?;
    if !meta.file_type().is_socket() {
        return Err(io::Error::other(format!(
            "a {} replaced the socket file",
            file_kind(meta.file_type())
        )));
    }
    if meta.permissions().mode() & 0o7777 == SOCKET_MODE {
        return Ok(());
    }
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: `c_path` is a valid NUL-terminated string for the whole call;
    // the result is checked.
    let rc = unsafe {
        libc::fchmodat(
            libc::AT_FDCWD,
            c_path.as_ptr(),
            SOCKET_MODE,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
