//! The HTTP/1.1 server on the API's Unix socket.
//!
//! Threads: one thread named `api` accepts connections; each connection is
//! served by its own thread named `api-conn`, at most
//! [`ServerLimits::max_connections`] at once (a connection beyond that is
//! closed at once). A thread per connection, rather than one epoll loop,
//! because each request ends in a blocking wait for the VMM's answer (a
//! synchronous shutdown can take tens of seconds while memory is freed), the
//! clients are few and local, and blocking code with a bounded thread count
//! is the simplest thing that keeps one slow client from holding up another.
//!
//! A request travels: the connection thread parses it ([`super::http`]),
//! routes it and checks its body ([`super::routing`]), sends an
//! [`ApiRequest`] with a fresh reply channel over the `to_vmm` channel,
//! writes 1 to the `wake` [`EventFd`] so the VMM's event loop looks at the
//! channel, waits on its own reply channel and writes the reply. Pipelined
//! requests are answered in order; keep-alive is the HTTP/1.1 default.
//!
//! Timeouts: a connection with no request under way is closed after
//! [`ServerLimits::idle_timeout`]; a request must arrive whole within
//! [`ServerLimits::request_timeout`] of its first byte (else 408 and close);
//! a reply write that blocks longer than [`ServerLimits::write_timeout`]
//! closes the connection. The wait for the VMM has no timeout: if the VMM
//! goes away (its receiver or the reply sender is dropped) the answer is 503.
//!
//! Stopping: dropping the [`ApiServer`] signals a stop [`EventFd`] that the
//! accept thread and every connection thread poll on, joins the accept
//! thread and removes the socket file. It does not join connection threads:
//! one may be waiting on the VMM, which may be the thread doing the drop.

use std::fs;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Sender};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::action::{ApiRequest, VmmActionError, VmmData};
use super::http::{self, Parsed, Request, Response};
use super::routing::{self, RouteError};

/// Errors of starting the API server.
#[derive(Debug, thiserror::Error)]
pub enum ApiServerError {
    /// The path does not fit in a `sockaddr_un`.
    #[error("API socket path {0} is too long (at most 107 bytes) or contains a NUL byte")]
    BadPath(PathBuf),
    /// A live process listens on the socket already.
    #[error("API socket {0} is in use by a running process")]
    InUse(PathBuf),
    /// Something other than a socket is at the path.
    #[error("refusing to create the API socket at {path}: a {kind} is there; remove it or choose another path")]
    NotASocket {
        /// The path.
        path: PathBuf,
        /// What is there ("regular file", "directory", "symbolic link", ...).
        kind: &'static str,
    },
    /// The existing path could not be inspected or a stale socket removed.
    #[error("cannot replace the stale API socket {path}: {source}")]
    Stale {
        /// The path.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// `socket`, `bind`, `chmod` or `listen` failed.
    #[error("cannot create the API socket at {path}: {source}")]
    Bind {
        /// The path.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// The stop event could not be created.
    #[error("cannot create the API server's stop event: {0}")]
    StopEvent(io::Error),
    /// The `api` thread could not be spawned.
    #[error("cannot spawn the api thread: {0}")]
    Spawn(io::Error),
}

/// Bounds on connections; [`ServerLimits::default`] is what
/// [`ApiServer::start`] uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerLimits {
    /// Most connections served at once; more are closed at once.
    pub max_connections: usize,
    /// A connection with no request under way is closed after this.
    pub idle_timeout: Duration,
    /// A request must arrive whole within this of its first byte.
    pub request_timeout: Duration,
    /// A reply write blocked this long closes the connection.
    pub write_timeout: Duration,
}

impl Default for ServerLimits {
    fn default() -> Self {
        ServerLimits {
            max_connections: 64,
            idle_timeout: Duration::from_secs(300),
            request_timeout: Duration::from_secs(10),
            write_timeout: Duration::from_secs(10),
        }
    }
}

/// State shared by the accept thread and the connection threads.
struct Shared {
    to_vmm: Sender<ApiRequest>,
    wake: EventFd,
    stop: EventFd,
    live: AtomicUsize,
    /// Requests handed to the VMM whose reply is not written yet.
    in_flight: Arc<AtomicUsize>,
    limits: ServerLimits,
}

/// The running API server; dropping it stops it and removes the socket.
#[derive(Debug)]
pub struct ApiServer {
    path: PathBuf,
    /// Device and inode of the socket file, to remove only our own.
    file_id: (u64, u64),
    stop: Arc<EventFd>,
    in_flight: Arc<AtomicUsize>,
    thread: Option<JoinHandle<()>>,
}

impl ApiServer {
    /// Binds the socket at `path` (mode 0600 whatever the umask; a stale
    /// socket file is replaced; any other file, a symbolic link, or a socket
    /// with a live listener is refused) and spawns the `api` thread. Each
    /// request is sent over `to_vmm`, then `wake` is written to wake the
    /// VMM's event loop.
    pub fn start(
        path: &Path,
        to_vmm: Sender<ApiRequest>,
        wake: EventFd,
    ) -> Result<ApiServer, ApiServerError> {
        Self::start_with_limits(path, to_vmm, wake, ServerLimits::default())
    }

    /// [`ApiServer::start`] with other connection limits and timeouts.
    pub fn start_with_limits(
        path: &Path,
        to_vmm: Sender<ApiRequest>,
        wake: EventFd,
        limits: ServerLimits,
    ) -> Result<ApiServer, ApiServerError> {
        let stop = EventFd::new(EFD_NONBLOCK).map_err(ApiServerError::StopEvent)?;
        let stop_handle = Arc::new(stop.try_clone().map_err(ApiServerError::StopEvent)?);
        clear_path(path)?;
        let bind_err = |source| ApiServerError::Bind {
            path: path.to_path_buf(),
            source,
        };
        let listener = bind_listener(path)?;
        let meta = fs::symlink_metadata(path).map_err(bind_err)?;
        let file_id = (meta.dev(), meta.ino());
        let in_flight = Arc::new(AtomicUsize::new(0));
        let shared = Arc::new(Shared {
            to_vmm,
            wake,
            stop,
            live: AtomicUsize::new(0),
            in_flight: Arc::clone(&in_flight),
            limits,
        });
        let thread = thread::Builder::new()
            .name("api".into())
            .spawn(move || accept_loop(listener, shared));
        let thread = match thread {
            Ok(t) => t,
            Err(e) => {
                let _ = fs::remove_file(path);
                return Err(ApiServerError::Spawn(e));
            }
        };
        Ok(ApiServer {
            path: path.to_path_buf(),
            file_id,
            stop: stop_handle,
            in_flight,
            thread: Some(thread),
        })
    }

    /// The path of the socket.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        if let Err(e) = self.stop.write(1) {
            log::error!("cannot stop the API server: {e}");
            return;
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        // Let replies the VMM has already given be written (e.g. the answer
        // to a sync Shutdown when the process exits with no linger), or the
        // process would exit with the connection thread still holding them.
        // Requests the VMM never took get 503 once its receiver is dropped.
        let deadline = Instant::now() + IN_FLIGHT_GRACE;
        while self.in_flight.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(1));
        }
        // Remove the socket only if it is still the one we bound.
        if let Ok(m) = fs::symlink_metadata(&self.path) {
            if (m.dev(), m.ino()) == self.file_id {
                if let Err(e) = fs::remove_file(&self.path) {
                    log::warn!("cannot remove API socket {}: {e}", self.path.display());
                }
            }
        }
    }
}

fn file_kind(ft: fs::FileType) -> &'static str {
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

/// Makes room for the socket: nothing there, or a stale socket (removed).
fn clear_path(path: &Path) -> Result<(), ApiServerError> {
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
    match UnixStream::connect(path) {
        Ok(_) => Err(ApiServerError::InUse(path.to_path_buf())),
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
            log::info!("replacing stale API socket {}", path.display());
            fs::remove_file(path).map_err(stale)
        }
        Err(e) => Err(stale(e)),
    }
}

/// `socket`, `fchmod(0600)`, `bind`, `chmod(0600)`, `listen`: the file is
/// created no more open than 0600 (the socket's own mode, masked by the
/// umask), then set to exactly 0600.
fn bind_listener(path: &Path) -> Result<UnixListener, ApiServerError> {
    let err = |source| ApiServerError::Bind {
        path: path.to_path_buf(),
        source,
    };
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
    // SAFETY: plain syscall with constant arguments; the result is checked.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(err(io::Error::last_os_error()));
    }
    // SAFETY: `fd` is a new descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: `fd` is a valid descriptor owned here; the result is checked.
    if unsafe { libc::fchmod(fd.as_raw_fd(), 0o600) } < 0 {
        return Err(err(io::Error::last_os_error()));
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + bytes.len() + 1;
    // SAFETY: `addr` is a valid sockaddr_un, `len` is within its size (checked
    // above) and covers the NUL-terminated path; the result is checked.
    let rc = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            &addr as *const libc::sockaddr_un as *const libc::sockaddr,
            len as libc::socklen_t,
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
        fs::set_permissions(path, fs::Permissions::from_mode(0o600))?;
        // SAFETY: the listener's descriptor is valid; the result is checked.
        if unsafe { libc::listen(listener.as_raw_fd(), 128) } < 0 {
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

/// What [`wait_readable`] saw.
#[derive(Debug, PartialEq, Eq)]
enum Wait {
    Ready,
    Stop,
    Timeout,
}

/// Waits until `fd` is readable (or hung up), the stop event is signalled,
/// or `deadline` passes.
fn wait_readable(fd: RawFd, stop: RawFd, deadline: Option<Instant>) -> io::Result<Wait> {
    loop {
        let timeout_ms = match deadline {
            None => -1,
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Ok(Wait::Timeout);
                }
                // Round up so a sub-millisecond rest does not spin.
                left.as_millis().saturating_add(1).min(i32::MAX as u128) as i32
            }
        };
        let mut fds = [
            libc::pollfd {
                fd: stop,
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: `fds` is a valid array of two pollfd for the whole call.
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), 2, timeout_ms) };
        if rc < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if fds[0].revents != 0 {
            return Ok(Wait::Stop);
        }
        if fds[1].revents != 0 {
            return Ok(Wait::Ready);
        }
    }
}

fn accept_loop(listener: UnixListener, shared: Arc<Shared>) {
    crate::seccomp::install_thread(crate::seccomp::Role::Api);
    loop {
        match wait_readable(listener.as_raw_fd(), shared.stop.as_raw_fd(), None) {
            Ok(Wait::Ready) | Ok(Wait::Timeout) => {}
            Ok(Wait::Stop) => return,
            Err(e) => {
                log::error!("API server: poll failed, stopping: {e}");
                return;
            }
        }
        let stream = match listener.accept() {
            Ok((s, _)) => s,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                ) =>
            {
                continue
            }
            Err(e) => {
                // E.g. out of descriptors: do not spin.
                log::warn!("API server: accept failed: {e}");
                thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        if shared.live.fetch_add(1, Ordering::SeqCst) >= shared.limits.max_connections {
            shared.live.fetch_sub(1, Ordering::SeqCst);
            log::warn!("API server: too many connections, closing a new one");
            continue;
        }
        let conn_shared = Arc::clone(&shared);
        let spawned = thread::Builder::new()
            .name("api-conn".into())
            .stack_size(256 * 1024)
            .spawn(move || {
                crate::seccomp::install_thread(crate::seccomp::Role::ApiConnection);
                serve_connection(stream, &conn_shared);
                conn_shared.live.fetch_sub(1, Ordering::SeqCst);
            });
        if let Err(e) = spawned {
            shared.live.fetch_sub(1, Ordering::SeqCst);
            log::warn!("API server: cannot spawn a connection thread: {e}");
        }
    }
}

/// How long dropping the server waits for replies under way to be written.
const IN_FLIGHT_GRACE: Duration = Duration::from_secs(2);

const CONTINUE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";

fn serve_connection(mut stream: UnixStream, shared: &Shared) {
    let limits = shared.limits;
    if stream.set_nonblocking(false).is_err()
        || stream
            .set_write_timeout(Some(limits.write_timeout))
            .is_err()
    {
        return;
    }
    let mut buf: Vec<u8> = Vec::with_capacity(4096);
    let mut chunk = vec![0u8; 16 * 1024];
    let mut sent_continue = false;
    let mut idle_since = Instant::now();
    let mut request_started: Option<Instant> = None;
    loop {
        match http::parse_request(&buf) {
            Ok(Parsed::Complete { request, consumed }) => {
                buf.drain(..consumed);
                sent_continue = false;
                shared.in_flight.fetch_add(1, Ordering::SeqCst);
                let mut response = shared.handle(&request);
                response.close |= !request.keep_alive;
                let written = stream.write_all(&response.to_bytes());
                shared.in_flight.fetch_sub(1, Ordering::SeqCst);
                if written.is_err() || response.close {
                    return;
                }
                idle_since = Instant::now();
                request_started = (!buf.is_empty()).then_some(idle_since);
                continue;
            }
            Ok(Parsed::NeedMore { expect_continue }) => {
                if expect_continue && !sent_continue {
                    if stream.write_all(CONTINUE).is_err() {
                        return;
                    }
                    sent_continue = true;
                }
            }
            Err(e) => {
                log::debug!("API server: bad request: {e}");
                let mut response = Response::fault(e.status(), &e.to_string());
                response.close = true;
                let _ = stream.write_all(&response.to_bytes());
                return;
            }
        }
        let deadline = match request_started {
            Some(t) => t + limits.request_timeout,
            None => idle_since + limits.idle_timeout,
        };
        match wait_readable(stream.as_raw_fd(), shared.stop.as_raw_fd(), Some(deadline)) {
            Ok(Wait::Ready) => {}
            Ok(Wait::Timeout) => {
                if request_started.is_some() {
                    let mut r = Response::fault(408, "the request did not arrive in time");
                    r.close = true;
                    let _ = stream.write_all(&r.to_bytes());
                }
                return;
            }
            Ok(Wait::Stop) | Err(_) => return,
        }
        match stream.read(&mut chunk) {
            Ok(0) => return,
            Ok(n) => {
                if buf.is_empty() {
                    request_started = Some(Instant::now());
                }
                buf.extend_from_slice(&chunk[..n]);
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock
                ) => {}
            Err(_) => return,
        }
    }
}

impl Shared {
    /// Routes one request, has the VMM do it, and makes the response.
    fn handle(&self, request: &Request) -> Response {
        let action = match routing::route(&request.method, &request.path, &request.body) {
            Ok(a) => a,
            Err(e) => {
                let mut r = Response::fault(e.status(), &e.to_string());
                if let RouteError::MethodNotAllowed { allow, .. } = e {
                    r.allow = Some(allow);
                }
                return r;
            }
        };
        let shutting_down = || {
            let mut r = Response::fault(503, "the VMM is shutting down");
            r.close = true;
            r
        };
        let (reply, answer) = mpsc::channel();
        if self.to_vmm.send(ApiRequest { action, reply }).is_err() {
            return shutting_down();
        }
        if let Err(e) = self.wake.write(1) {
            log::warn!("API server: cannot wake the VMM: {e}");
        }
        match answer.recv() {
            Ok(Ok(VmmData::Empty)) => Response::no_content(),
            Ok(Ok(VmmData::Json(v))) => Response::json(200, v.to_string()),
            Ok(Ok(VmmData::Accepted(v))) => Response::json(202, v.to_string()),
            Ok(Err(VmmActionError::BadRequest(m))) => Response::fault(400, &m),
            Ok(Err(VmmActionError::Internal(m))) => Response::fault(500, &m),
            Err(_) => shutting_down(),
        }
    }
}

#[cfg(test)]
#[path = "server_tests.rs"]
mod tests;
