//! Connections the accept thread answers itself and does not serve: peers
//! refused by their credentials (403) and clients over the connection limit
//! (503). The reply is written without blocking, then the connection
//! lingers a moment, its input read and dropped, so that a client that
//! writes its request after connecting still finds its socket open and
//! reads the reply, instead of failing on a closed socket. Lingering
//! connections are few (at most `cap`, the oldest closed first) and short
//! (at most [`LINGER`]), and the accept thread polls them with the
//! listener, so they cost no thread.

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use crate::api::http::Response;

/// How long a refused connection stays open after its reply.
pub(super) const LINGER: Duration = Duration::from_secs(1);

/// Input read from a lingering connection per wake-up, at most.
const DRAIN_BYTES: usize = 64 * 1024;

/// The refused connections that linger.
#[derive(Debug)]
pub(super) struct Refused {
    cap: usize,
    conns: VecDeque<(UnixStream, Instant)>,
}

impl Refused {
    /// At most `cap` (at least 1) connections linger at once.
    pub(super) fn new(cap: usize) -> Refused {
        Refused {
            cap: cap.max(1),
            conns: VecDeque::new(),
        }
    }

    /// Answers `status` with a `fault_message` on `stream` and lets it
    /// linger. The write never blocks (a zero write timeout): a new
    /// connection's socket buffer always has room for these few hundred
    /// bytes; if it had not, the reply would be dropped, not waited for.
    pub(super) fn refuse(&mut self, stream: UnixStream, status: u16, message: &str) {
        let mut response = Response::fault(status, message);
        response.close = true;
        if stream.set_nonblocking(true).is_err() {
            return;
        }
        let _ = (&stream).write(&response.to_bytes());
        if self.conns.len() == self.cap {
            self.conns.pop_front();
        }
        self.conns.push_back((stream, Instant::now() + LINGER));
    }

    /// The descriptors to poll for input.
    pub(super) fn fds(&self) -> impl Iterator<Item = RawFd> + '_ {
        self.conns.iter().map(|(s, _)| s.as_raw_fd())
    }

    /// When the first lingering connection is due to close.
    pub(super) fn next_deadline(&self) -> Option<Instant> {
        self.conns.front().map(|(_, d)| *d)
    }

    /// After a poll: `ready[i]` tells whether the `i`-th of [`Refused::fds`]
    /// had an event. Drops what those clients sent, and closes connections
    /// whose client has closed or whose time is up.
    pub(super) fn service(&mut self, ready: &[bool]) {
        let now = Instant::now();
        let mut scratch = [0u8; 4096];
        let mut i = 0;
        self.conns.retain(|(stream, deadline)| {
            let had_event = ready.get(i).copied().unwrap_or(false);
            i += 1;
            if now >= *deadline {
                return false;
            }
            if !had_event {
                return true;
            }
            let mut drained = 0;
            while drained < DRAIN_BYTES {
                match (&*stream).read(&mut scratch) {
                    Ok(0) => return false,
                    Ok(n) => drained += n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(_) => return false,
                }
            }
            true
        });
    }

    /// How many connections linger.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.conns.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_client_reads_its_reply_after_writing_its_request() {
        let mut refused = Refused::new(2);
        let (server, mut client) = UnixStream::pair().unwrap();
        refused.refuse(server, 503, "busy");
        // The client writes after the refusal: its socket is still open.
        client.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
        refused.service(&[true]);
        assert_eq!(refused.len(), 1);
        client.shutdown(std::net::Shutdown::Write).unwrap();
        let mut reply = String::new();
        client
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        // The client's end of input closes the lingering connection.
        refused.service(&[true]);
        assert_eq!(refused.len(), 0);
        client.read_to_string(&mut reply).unwrap();
        assert!(
            reply.starts_with("HTTP/1.1 503 Service Unavailable\r\n"),
            "{reply}"
        );
        assert!(reply.contains("Connection: close\r\n"), "{reply}");
        assert!(reply.ends_with(r#"{"fault_message":"busy"}"#), "{reply}");
    }

    #[test]
    fn lingering_is_bounded_in_number() {
        let mut refused = Refused::new(2);
        let pairs: Vec<_> = (0..3).map(|_| UnixStream::pair().unwrap()).collect();
        let mut clients = Vec::new();
        for (server, client) in pairs {
            refused.refuse(server, 403, "no");
            clients.push(client);
        }
        assert_eq!(refused.len(), 2);
        // The oldest was closed: its client reads the reply, then the end.
        let mut reply = String::new();
        clients[0].read_to_string(&mut reply).unwrap();
        assert!(reply.starts_with("HTTP/1.1 403 "), "{reply}");
        assert_eq!(refused.fds().count(), 2);
        assert!(refused.next_deadline().is_some());
    }
}
