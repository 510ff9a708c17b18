//! One connection's thread (`api-conn`): reads requests with an incremental
//! parser, hands each to the VMM and writes the reply, keeping the
//! connection's slot informed of what it does (see `slots`).

use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::slots::Activity;
use super::Shared;
use crate::api::action::{ApiRequest, VmmActionError, VmmData};
use crate::api::http::{Parsed, Request, RequestParser, Response};
use crate::api::routing::{self, RouteError};

const CONTINUE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";

/// How long the reply to a client that lost its slot may take to write.
const LOST_SLOT_WRITE_TIMEOUT: Duration = Duration::from_millis(100);

/// What [`wait_readable`] saw.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Wait {
    Ready,
    Stop,
    Timeout,
}

/// Waits until `fd` is readable (or hung up), the stop event is signalled,
/// or `deadline` passes.
pub(super) fn wait_readable(fd: RawFd, stop: RawFd, deadline: Option<Instant>) -> io::Result<Wait> {
    loop {
        let timeout_ms = match deadline {
            None => -1,
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Ok(Wait::Timeout);
                }
                crate::util::poll_timeout_ms(Some(left))
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

/// Writes `response` (marked to close) and gives up the connection.
fn close_with(stream: &mut UnixStream, mut response: Response) {
    response.close = true;
    let _ = stream.write_all(&response.to_bytes());
}

/// The client had sent (part of) a request when its slot went to another
/// client: it gets a 503 rather than a silent close.
fn lost_slot(stream: &mut UnixStream, shared: &Shared) {
    let _ = stream.set_write_timeout(Some(LOST_SLOT_WRITE_TIMEOUT));
    let message = format!(
        "all {} API connections were in use and this one had been slow: it was closed to make room for another client; retry",
        shared.limits.max_connections
    );
    close_with(stream, Response::fault(503, &message));
}

/// Serves the connection that holds slot `id` until it closes, times out,
/// loses its slot or the server stops.
pub(super) fn serve_connection(mut stream: UnixStream, shared: &Shared, id: u64) {
    let limits = shared.limits;
    if stream.set_nonblocking(false).is_err()
        || stream
            .set_write_timeout(Some(limits.write_timeout))
            .is_err()
    {
        return;
    }
    // `buf[start..]` is the request under way (and any pipelined after it),
    // what `parser` has seen; bytes before `start` are answered already and
    // dropped before the next read, so each byte is moved at most once.
    let mut buf: Vec<u8> = Vec::with_capacity(4096);
    let mut start = 0;
    let mut parser = RequestParser::with_max_body(limits.max_body_bytes);
    let mut chunk = vec![0u8; 16 * 1024];
    let mut sent_continue = false;
    let mut activity = Activity::Idle;
    let mut idle_since = Instant::now();
    let mut request_started: Option<Instant> = None;
    loop {
        let send_continue = match parser.parse(&buf[start..]) {
            Ok(Parsed::Complete { request, consumed }) => {
                start += consumed;
                sent_continue = false;
                activity = Activity::Handling;
                if !shared.slots.set(id, activity) {
                    return lost_slot(&mut stream, shared);
                }
                shared.in_flight.fetch_add(1, Ordering::SeqCst);
                let mut response = shared.handle(&request);
                response.close |= !request.keep_alive;
                // The VMM is done: the slot may go to another client from
                // here (see `slots`); the reply is still written whole.
                activity = if start < buf.len() {
                    Activity::Receiving
                } else {
                    Activity::Idle
                };
                shared.slots.set(id, activity);
                let written = stream.write_all(&response.to_bytes());
                shared.in_flight.fetch_sub(1, Ordering::SeqCst);
                if written.is_err() || response.close {
                    return;
                }
                idle_since = Instant::now();
                request_started = (start < buf.len()).then_some(idle_since);
                continue;
            }
            Ok(Parsed::NeedMore { expect_continue }) => expect_continue && !sent_continue,
            Err(e) => {
                log::debug!("API server: bad request: {e}");
                return close_with(&mut stream, Response::fault(e.status(), &e.to_string()));
            }
        };
        if start > 0 {
            buf.drain(..start);
            start = 0;
        }
        let now_doing = if buf.is_empty() {
            Activity::Idle
        } else {
            Activity::Receiving
        };
        if now_doing != activity {
            activity = now_doing;
            if !shared.slots.set(id, activity) {
                if activity == Activity::Receiving {
                    lost_slot(&mut stream, shared);
                }
                return;
            }
        }
        // After the slot knows: a client told to continue is `Receiving`.
        if send_continue {
            if stream.write_all(CONTINUE).is_err() {
                return;
            }
            sent_continue = true;
        }
        let deadline = match request_started {
            Some(t) => t + limits.request_timeout,
            None => idle_since + limits.idle_timeout,
        };
        match wait_readable(stream.as_raw_fd(), shared.stop.as_raw_fd(), Some(deadline)) {
            Ok(Wait::Ready) => {}
            Ok(Wait::Timeout) => {
                if request_started.is_some() {
                    close_with(
                        &mut stream,
                        Response::fault(408, "the request did not arrive in time"),
                    );
                }
                return;
            }
            Ok(Wait::Stop) | Err(_) => return,
        }
        match stream.read(&mut chunk) {
            // The client closed, or the slot went to another client (which
            // shuts the reading side down).
            Ok(0) => {
                if !buf.is_empty() && !shared.slots.holds(id) {
                    lost_slot(&mut stream, shared);
                }
                return;
            }
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
        let latency = action.latency();
        let started = Instant::now();
        let (reply, answer) = mpsc::channel();
        if self.to_vmm.send(ApiRequest { action, reply }).is_err() {
            return shutting_down();
        }
        if let Err(e) = self.wake.write(1) {
            log::warn!("API server: cannot wake the VMM: {e}");
        }
        let answer = answer.recv();
        if let (Some(which), Ok(Ok(_))) = (latency, &answer) {
            // Firecracker's `latencies_us` (API level), on success only.
            let us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
            crate::metrics::record_latency_us(which, crate::metrics::LatencyLevel::Api, us);
        }
        match answer {
            Ok(Ok(VmmData::Empty)) => Response::no_content(),
            Ok(Ok(VmmData::Json(v))) => Response::json(200, v.to_string()),
            Ok(Ok(VmmData::Accepted(v))) => Response::json(202, v.to_string()),
            Ok(Err(VmmActionError::BadRequest(m))) => Response::fault(400, &m),
            Ok(Err(VmmActionError::Internal(m))) => Response::fault(500, &m),
            Ok(Err(VmmActionError::TooLarge(m))) => Response::fault(413, &m),
            Err(_) => shutting_down(),
        }
    }
}
