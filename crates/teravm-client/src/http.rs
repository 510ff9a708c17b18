//! A minimal HTTP client for tests and the benchmark: one request per
//! connection ([`request`]) or many on one kept-alive connection
//! ([`Connection`]), replies read by `Content-Length`.
//!
//! It is written for teravm's own server and is not a general HTTP client:
//! no chunked replies, no redirects. Reads time out after 60 seconds, so a
//! test against a broken server fails instead of hanging.

use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

/// Longest reply head the client accepts.
const MAX_HEAD_BYTES: usize = 64 * 1024;
/// How long a read may block.
const READ_TIMEOUT: Duration = Duration::from_secs(60);

/// Errors of the client that are not I/O errors (a malformed reply).
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The reply is not HTTP the client understands.
    #[error("malformed HTTP reply: {0}")]
    Malformed(&'static str),
}

impl From<ClientError> for io::Error {
    fn from(e: ClientError) -> io::Error {
        io::Error::new(io::ErrorKind::InvalidData, e)
    }
}

/// One HTTP reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// The status code.
    pub status: u16,
    /// The header fields, names lower-cased.
    pub headers: Vec<(String, String)>,
    /// The body, as text.
    pub body: String,
}

impl Reply {
    /// The value of the first header named `name` (lower case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Sends one request on a new connection and returns the status and body.
pub fn request(
    sock: &Path,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> io::Result<(u16, String)> {
    Connection::open(sock)?.request(method, path, body)
}

/// A kept-alive connection for many requests.
#[derive(Debug)]
pub struct Connection {
    stream: UnixStream,
    buf: Vec<u8>,
}

impl Connection {
    /// Connects to the socket at `sock`.
    pub fn open(sock: &Path) -> io::Result<Connection> {
        let stream = UnixStream::connect(sock)?;
        stream.set_read_timeout(Some(READ_TIMEOUT))?;
        Ok(Connection {
            stream,
            buf: Vec::new(),
        })
    }

    /// Sends one request and reads its reply: status and body.
    pub fn request(
        &mut self,
        method: &str,
        path: &str,
        body: Option<&str>,
    ) -> io::Result<(u16, String)> {
        let reply = self.exchange(method, path, body)?;
        Ok((reply.status, reply.body))
    }

    /// Sends one request and reads its whole reply. A server may answer
    /// before the whole request is in (a 413 for a body over its limit)
    /// and close: a write that fails on the closed connection is then
    /// followed by reading that early reply, and only without one is the
    /// write's error returned.
    pub fn exchange(&mut self, method: &str, path: &str, body: Option<&str>) -> io::Result<Reply> {
        if let Err(e) = self.send_raw(format_request(method, path, body).as_bytes()) {
            if !matches!(
                e.kind(),
                io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset
            ) {
                return Err(e);
            }
            return self.read_reply().map_err(|_| e);
        }
        self.read_reply()
    }

    /// Writes raw bytes (for malformed or pipelined requests).
    pub fn send_raw(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.stream.write_all(bytes)
    }

    /// The underlying stream (e.g. to shut down one direction).
    pub fn stream(&self) -> &UnixStream {
        &self.stream
    }

    /// Reads one reply (skipping `100 Continue`).
    pub fn read_reply(&mut self) -> io::Result<Reply> {
        loop {
            let reply = self.read_one()?;
            if reply.status != 100 {
                return Ok(reply);
            }
        }
    }

    fn fill(&mut self) -> io::Result<()> {
        let mut chunk = [0u8; 16 * 1024];
        let n = self.stream.read(&mut chunk)?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the server closed the connection",
            ));
        }
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(())
    }

    fn read_one(&mut self) -> io::Result<Reply> {
        let head_end = loop {
            if let Some(i) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i;
            }
            if self.buf.len() > MAX_HEAD_BYTES {
                return Err(ClientError::Malformed("reply head too long").into());
            }
            self.fill()?;
        };
        let head = String::from_utf8_lossy(&self.buf[..head_end]).into_owned();
        let mut lines = head.split("\r\n");
        let status_line = lines.next().unwrap_or("");
        let mut parts = status_line.splitn(3, ' ');
        if !parts.next().unwrap_or("").starts_with("HTTP/1.") {
            return Err(ClientError::Malformed("no HTTP/1.x status line").into());
        }
        let status: u16 = parts
            .next()
            .and_then(|s| s.parse().ok())
            .ok_or(ClientError::Malformed("bad status code"))?;
        let mut headers = Vec::new();
        for line in lines {
            let (name, value) = line
                .split_once(':')
                .ok_or(ClientError::Malformed("header without a colon"))?;
            headers.push((name.trim().to_ascii_lowercase(), value.trim().to_string()));
        }
        self.buf.drain(..head_end + 4);
        let length = headers
            .iter()
            .find(|(n, _)| n == "content-length")
            .map(|(_, v)| v.parse::<usize>())
            .transpose()
            .map_err(|_| ClientError::Malformed("bad Content-Length"))?;
        let body = match length {
            Some(n) => {
                while self.buf.len() < n {
                    self.fill()?;
                }
                self.buf.drain(..n).collect::<Vec<u8>>()
            }
            None if status == 204 || status == 304 || status < 200 => Vec::new(),
            None => {
                // Body up to the end of the connection.
                while self.fill().is_ok() {}
                std::mem::take(&mut self.buf)
            }
        };
        Ok(Reply {
            status,
            headers,
            body: String::from_utf8_lossy(&body).into_owned(),
        })
    }
}

/// The bytes of one request (with `Host` and, for a body, `Content-Length`
/// and `Content-Type`).
pub fn format_request(method: &str, path: &str, body: Option<&str>) -> String {
    match body {
        Some(b) => format!(
            "{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{b}",
            b.len()
        ),
        None => format!("{method} {path} HTTP/1.1\r\nHost: localhost\r\n\r\n"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    /// A server that answers 413 as soon as it has the head, and closes
    /// without reading the body: the client still gets the 413.
    #[test]
    fn an_early_reply_is_read_though_the_body_could_not_be_written() {
        let dir = std::env::temp_dir().join(format!("teravm-client-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let sock = dir.join("s.sock");
        let listener = UnixListener::bind(&sock).unwrap();
        let server = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") {
                s.read_exact(&mut byte).unwrap();
                head.push(byte[0]);
            }
            let body = r#"{"fault_message": "too large"}"#;
            write!(
                s,
                "HTTP/1.1 413 Payload Too Large\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            )
            .unwrap();
            // Closed with the body unread: the client's writes now fail.
        });
        let big = "x".repeat(8 << 20);
        let (status, body) = request(&sock, "PUT", "/reclaim", Some(&big)).unwrap();
        assert_eq!(status, 413, "{body}");
        assert!(body.contains("too large"), "{body}");
        server.join().unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }
}
