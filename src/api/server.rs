//! The HTTP/1.1 server on the API's Unix socket.
//!
//! Threads: one thread named `api` accepts connections; each connection is
//! served by its own thread named `api-conn` (`conn`). A thread per
//! connection, rather than one epoll loop, because each request ends in a
//! blocking wait for the VMM's answer (a synchronous shutdown can take tens
//! of seconds while memory is freed), the clients are few and local, and
//! blocking code with a bounded thread count is the simplest thing that
//! keeps one slow client from holding up another.
//!
//! Who may connect: the peer's credentials (`SO_PEERCRED`) are read on
//! accept; a peer that is neither root nor teravm's own uid gets a 403 and
//! is closed (`peer`).
//!
//! Slots: at most [`ServerLimits::max_connections`] connections hold a slot
//! (`slots`). When all are taken, a new client takes the slot of the
//! connection idle the longest (closed quietly: it had no request under
//! way, or only a reply being written), else of a connection that has been
//! receiving a request for longer than
//! [`ServerLimits::request_timeout_under_pressure`] (answered 503). If every slot is busy with a
//! request, the new client gets a 503 with a `fault_message`, written
//! without blocking (`refused`): never a silent close. So idle, trickling
//! or non-reading clients cannot pin the API.
//!
//! A request travels: the connection thread parses it ([`super::http`]),
//! routes it and checks its body ([`super::routing`]), sends an
//! [`ApiRequest`] with a fresh reply channel over the `to_vmm` channel,
//! writes 1 to the `wake` [`EventFd`] so the VMM's event loop looks at the
//! channel, waits on its own reply channel and writes the reply. Pipelined
//! requests are answered in order; keep-alive is the HTTP/1.1 default.
//!
//! Timeouts: a connection with no request under way is closed after
//! [`ServerLimits::idle_timeout`] (or sooner when its slot is needed); a
//! request must arrive whole within [`ServerLimits::request_timeout`] of its
//! first byte (else 408 and close); a reply write that blocks longer than
//! [`ServerLimits::write_timeout`] closes the connection. The wait for the VMM has no timeout: if the VMM
//! goes away (its receiver or the reply sender is dropped) the answer is 503.
//!
//! The socket file (`socket`) is created at mode 0600 without following a
//! symbolic link, and a socket file already there is probed without
//! blocking: a live or unresponsive listener is refused, a stale file
//! replaced.
//!
//! Stopping: dropping the [`ApiServer`] signals a stop [`EventFd`] that the
//! accept thread and every connection thread poll on, joins the accept
//! thread and removes the socket file. It does not join connection threads:
//! one may be waiting on the VMM, which may be the thread doing the drop.

use std::fs;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::action::ApiRequest;

mod conn;
mod peer;
mod refused;
mod slots;
mod socket;

use refused::Refused;
use slots::Slots;

/// Errors of starting the API server.
#[derive(Debug, thiserror::Error)]
pub enum ApiServerError {
    /// The path does not fit in a `sockaddr_un`.
    #[error("API socket path {0} is too long (at most 107 bytes) or contains a NUL byte")]
    BadPath(PathBuf),
    /// A live process listens on the socket already.
    #[error("API socket {0} is in use by a running process")]
    InUse(PathBuf),
    /// A process listens on the socket but does not accept connections.
    #[error("API socket {0} belongs to a running process that accepts no connections (its backlog is full); stop it or choose another path")]
    Unresponsive(PathBuf),
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
    /// Most connections served at once. A new client beyond takes the slot
    /// of an idle (or too slow) connection, else gets a 503.
    pub max_connections: usize,
    /// A connection with no request under way is closed after this.
    pub idle_timeout: Duration,
    /// A request must arrive whole within this of its first byte.
    pub request_timeout: Duration,
    /// A reply write blocked this long closes the connection.
    pub write_timeout: Duration,
    /// When every slot is taken and none is idle, a request that has been
    /// arriving for this long loses its slot to a new client (503).
    pub request_timeout_under_pressure: Duration,
    /// The largest request body (`--http-api-max-payload-size`).
    pub max_body_bytes: usize,
}

impl Default for ServerLimits {
    fn default() -> Self {
        ServerLimits {
            max_connections: 64,
            idle_timeout: Duration::from_secs(300),
            request_timeout: Duration::from_secs(10),
            write_timeout: Duration::from_secs(10),
            request_timeout_under_pressure: Duration::from_secs(1),
            max_body_bytes: super::http::MAX_BODY_BYTES,
        }
    }
}

/// State shared by the accept thread and the connection threads.
struct Shared {
    to_vmm: Sender<ApiRequest>,
    wake: EventFd,
    stop: EventFd,
    slots: Slots,
    /// Connection threads alive (those that lost their slot included).
    threads: AtomicUsize,
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
    /// with a live or unresponsive listener is refused) and spawns the `api` thread. Each
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
        socket::clear_path(path)?;
        let bind_err = |source| ApiServerError::Bind {
            path: path.to_path_buf(),
            source,
        };
        let listener = socket::bind_listener(path)?;
        let meta = fs::symlink_metadata(path).map_err(bind_err)?;
        let file_id = (meta.dev(), meta.ino());
        let in_flight = Arc::new(AtomicUsize::new(0));
        let shared = Arc::new(Shared {
            to_vmm,
            wake,
            stop,
            slots: Slots::new(
                limits.max_connections,
                limits.request_timeout_under_pressure,
            ),
            threads: AtomicUsize::new(0),
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

/// A `pollfd` waiting for input on `fd`.
fn pollin(fd: RawFd) -> libc::pollfd {
    libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }
}

/// Milliseconds until `deadline` for `poll` (rounded up; -1 for none).
fn poll_timeout(deadline: Option<Instant>) -> libc::c_int {
    crate::util::poll_timeout_ms(deadline.map(|d| d.saturating_duration_since(Instant::now())))
}

fn accept_loop(listener: UnixListener, shared: Arc<Shared>) {
    crate::seccomp::install_thread(crate::seccomp::Role::Api);
    let own_uid = peer::own_uid();
    let mut refusals = peer::RefusalLog::default();
    let max = shared.limits.max_connections;
    // Threads that lost their slot end at once; this bounds them anyway.
    let max_threads = max.saturating_mul(2);
    let busy = format!("all {max} API connections are busy with requests; retry later");
    let mut full_logged = false;
    let mut refused = Refused::new(max);
    let mut fds = Vec::new();
    loop {
        // The stop event, the listener, and the refused connections that
        // linger; woken at the latest when the first of those is due.
        fds.clear();
        fds.push(pollin(shared.stop.as_raw_fd()));
        fds.push(pollin(listener.as_raw_fd()));
        fds.extend(refused.fds().map(pollin));
        let timeout = poll_timeout(refused.next_deadline());
        // SAFETY: `fds` is a valid array of `fds.len()` pollfd for the call.
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout) };
        if rc < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            log::error!("API server: poll failed, stopping: {e}");
            return;
        }
        if fds[0].revents != 0 {
            return;
        }
        let ready: Vec<bool> = fds[2..].iter().map(|p| p.revents != 0).collect();
        refused.service(&ready);
        if fds[1].revents == 0 {
            continue;
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
        match peer::peer_cred(&stream) {
            Ok(p) if peer::peer_allowed(p.uid, own_uid) => {}
            Ok(p) => {
                refusals.refused(p, own_uid);
                let message = format!("only root and uid {own_uid} may use this API socket");
                refused.refuse(stream, 403, &message);
                continue;
            }
            Err(e) => {
                log::warn!("API server: cannot read a peer's credentials, closing: {e}");
                refused.refuse(stream, 403, "the peer's credentials could not be read");
                continue;
            }
        }
        let admitted = if shared.threads.load(Ordering::SeqCst) >= max_threads {
            None
        } else {
            stream.try_clone().ok().and_then(|c| shared.slots.admit(c))
        };
        let Some(id) = admitted else {
            if !full_logged {
                log::warn!("API server: {busy}: answering new clients 503");
                full_logged = true;
            }
            refused.refuse(stream, 503, &busy);
            continue;
        };
        full_logged = false;
        shared.threads.fetch_add(1, Ordering::SeqCst);
        let conn_shared = Arc::clone(&shared);
        let spawned = thread::Builder::new()
            .name("api-conn".into())
            .stack_size(256 * 1024)
            .spawn(move || {
                crate::seccomp::install_thread(crate::seccomp::Role::ApiConnection);
                let _slot = SlotGuard {
                    shared: &conn_shared,
                    id,
                };
                conn::serve_connection(stream, &conn_shared, id);
            });
        if let Err(e) = spawned {
            shared.slots.release(id);
            shared.threads.fetch_sub(1, Ordering::SeqCst);
            log::warn!("API server: cannot spawn a connection thread: {e}");
        }
    }
}

/// Frees a connection's slot and thread count when its thread ends, even by
/// a panic.
struct SlotGuard<'a> {
    shared: &'a Shared,
    id: u64,
}

impl Drop for SlotGuard<'_> {
    fn drop(&mut self) {
        self.shared.slots.release(self.id);
        self.shared.threads.fetch_sub(1, Ordering::SeqCst);
    }
}

/// How long dropping the server waits for replies under way to be written.
const IN_FLIGHT_GRACE: Duration = Duration::from_secs(2);

#[cfg(test)]
#[path = "server/limits_tests.rs"]
mod limits_tests;
#[cfg(test)]
mod test_support;
#[cfg(test)]
#[path = "server_tests.rs"]
mod tests;
