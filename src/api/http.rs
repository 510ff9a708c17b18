//! A small, strict HTTP/1.1 request parser and the response writer.
//!
//! [`parse_request`] is a pure function over the bytes received so far: it
//! either finds one complete request at the front of the buffer (and says
//! how many bytes it used, so pipelined requests follow), says it needs more
//! bytes, or refuses the input with a [`RequestError`] that carries the HTTP
//! status to answer with. It never panics and is bounded everywhere: the
//! request line and each header line are at most [`MAX_LINE_BYTES`], there
//! are at most [`MAX_HEADERS`] headers, and a body (only by `Content-Length`)
//! is at most [`MAX_BODY_BYTES`]. Lines end in CRLF; a bare CR or LF, a NUL
//! or any other control byte, obsolete line folding, or whitespace before a
//! header's colon are refused. `Transfer-Encoding` is refused with 501.

/// Longest request line or header line, CRLF included.
pub const MAX_LINE_BYTES: usize = 8 * 1024;
/// Most header fields in one request.
pub const MAX_HEADERS: usize = 64;
/// Largest request body.
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// Why a request was refused; each variant maps to one HTTP status.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// The request line is not `METHOD SP /target SP HTTP/x.y`.
    #[error("malformed request line: {0}")]
    BadRequestLine(&'static str),
    /// A header line is malformed.
    #[error("malformed header: {0}")]
    BadHeader(&'static str),
    /// A line is longer than [`MAX_LINE_BYTES`].
    #[error("a request line or header line is longer than {MAX_LINE_BYTES} bytes")]
    LineTooLong,
    /// More than [`MAX_HEADERS`] header fields.
    #[error("more than {MAX_HEADERS} header fields")]
    TooManyHeaders,
    /// `Content-Length` is not a single decimal number.
    #[error("invalid Content-Length: {0}")]
    BadContentLength(&'static str),
    /// The body is larger than the limit ([`MAX_BODY_BYTES`] unless the
    /// server was given another with `--http-api-max-payload-size`).
    #[error("the body is larger than {0} bytes")]
    BodyTooLarge(usize),
    /// `Transfer-Encoding` (chunked or any other) is not supported.
    #[error("Transfer-Encoding is not supported; send a Content-Length")]
    TransferEncoding,
    /// An `Expect` other than `100-continue`.
    #[error("only Expect: 100-continue is supported")]
    BadExpect,
    /// An HTTP version other than 1.0 and 1.1.
    #[error("HTTP version not supported; use HTTP/1.1")]
    UnsupportedVersion,
}

impl RequestError {
    /// The HTTP status code to answer with.
    pub fn status(&self) -> u16 {
        match self {
            RequestError::BodyTooLarge(_) => 413,
            RequestError::TransferEncoding => 501,
            RequestError::BadExpect => 417,
            RequestError::UnsupportedVersion => 505,
            RequestError::BadRequestLine(_)
            | RequestError::BadHeader(_)
            | RequestError::LineTooLong
            | RequestError::TooManyHeaders
            | RequestError::BadContentLength(_) => 400,
        }
    }
}

/// HTTP version of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    /// HTTP/1.0: the connection closes after the reply unless asked otherwise.
    Http10,
    /// HTTP/1.1: the connection stays open unless asked otherwise.
    Http11,
}

/// One parsed request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// The method, e.g. `GET` (a token; case-sensitive as HTTP says).
    pub method: String,
    /// The path of the request target, without a query string.
    pub path: String,
    /// The HTTP version.
    pub version: Version,
    /// Whether the connection stays open after the reply.
    pub keep_alive: bool,
    /// The header fields, names lower-cased, in order.
    pub headers: Vec<(String, String)>,
    /// The body (empty without `Content-Length`).
    pub body: Vec<u8>,
}

impl Request {
    /// The value of the first header named `name` (lower case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// What [`parse_request`] found at the front of the buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parsed {
    /// The buffer holds only part of a request. `expect_continue` is true when
    /// the head is complete, asks for `100-continue` and the body is missing:
    /// the server should then send `100 Continue` (once).
    NeedMore {
        /// Send `HTTP/1.1 100 Continue` before reading the body.
        expect_continue: bool,
    },
    /// A whole request, made of the first `consumed` bytes of the buffer.
    Complete {
        /// The request.
        request: Request,
        /// How many bytes of the buffer it used.
        consumed: usize,
    },
}

/// `tchar` of RFC 9110: the bytes of a method or header name.
fn is_token(s: &[u8]) -> bool {
    !s.is_empty()
        && s.iter()
            .all(|&b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

fn parse_request_line(line: &[u8]) -> Result<(String, String, Version), RequestError> {
    let line = std::str::from_utf8(line)
        .map_err(|_| RequestError::BadRequestLine("not ASCII (invalid UTF-8)"))?;
    if !line.is_ascii() {
        return Err(RequestError::BadRequestLine("not ASCII"));
    }
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(RequestError::BadRequestLine(
            "not three parts separated by single spaces",
        ));
    };
    if !is_token(method.as_bytes()) {
        return Err(RequestError::BadRequestLine("invalid method"));
    }
    if !target.starts_with('/') || !target.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(RequestError::BadRequestLine(
            "the target is not an absolute path",
        ));
    }
    let version = match version {
        "HTTP/1.1" => Version::Http11,
        "HTTP/1.0" => Version::Http10,
        v if v.len() == 8
            && v.starts_with("HTTP/")
            && v.as_bytes()[5].is_ascii_digit()
            && v.as_bytes()[6] == b'.'
            && v.as_bytes()[7].is_ascii_digit() =>
        {
            return Err(RequestError::UnsupportedVersion)
        }
        _ => return Err(RequestError::BadRequestLine("invalid HTTP version")),
    };
    let path = target.split('?').next().unwrap_or(target);
    Ok((method.to_string(), path.to_string(), version))
}

fn parse_header(line: &[u8]) -> Result<(String, String), RequestError> {
    if matches!(line.first(), Some(b' ' | b'\t')) {
        return Err(RequestError::BadHeader("obsolete line folding"));
    }
    let colon = line
        .iter()
        .position(|&b| b == b':')
        .ok_or(RequestError::BadHeader("no colon"))?;
    let (name, value) = (&line[..colon], &line[colon + 1..]);
    if !is_token(name) {
        return Err(RequestError::BadHeader("invalid field name"));
    }
    // Field values: visible ASCII, space, tab and obs-text; no controls.
    if value.iter().any(|&b| b != b'\t' && (b < 0x20 || b == 0x7f)) {
        return Err(RequestError::BadHeader("control byte in a field value"));
    }
    let value = String::from_utf8_lossy(value);
    let value = value.trim_matches(|c| c == ' ' || c == '\t');
    Ok((
        String::from_utf8_lossy(name).to_ascii_lowercase(),
        value.to_string(),
    ))
}

/// Parses the request at the front of `buf` from scratch. See the module
/// doc; a server that reads a request in pieces uses a [`RequestParser`],
/// which gives the same answers without looking at a byte twice.
pub fn parse_request(buf: &[u8]) -> Result<Parsed, RequestError> {
    RequestParser::new().parse(buf)
}

/// Where a [`RequestParser`] is in the request at the front of the buffer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum Phase {
    /// Skipping empty lines before the request line.
    #[default]
    Leading,
    /// Looking for the end of the request line.
    RequestLine,
    /// Looking for the end of the next header line (or the empty line).
    Headers,
    /// The head is parsed: waiting for the body's bytes.
    Body {
        /// Where the body starts in the buffer.
        start: usize,
        /// The body's length (`Content-Length`, else 0).
        len: usize,
        /// Whether the connection stays open after the reply.
        keep_alive: bool,
        /// The client asked for `100 Continue`.
        expect_continue: bool,
    },
}

/// The incremental form of [`parse_request`], for a buffer that grows.
///
/// Call [`RequestParser::parse`] with the bytes received so far each time
/// more arrive; between calls the buffer may only grow at its end. The
/// parser remembers where it stopped: how far it searched the current line
/// for its end, the request line and header fields already parsed, and once
/// the head is complete just how many body bytes it still needs. So each
/// byte is scanned once for a line end and then parsed once with its line,
/// and a request trickled in one byte per read costs time linear in its
/// size instead of quadratic. The answers are exactly those of
/// [`parse_request`] on the same bytes.
///
/// After it answers [`Parsed::Complete`] or an error it starts afresh: the
/// caller drops the consumed bytes from the front of the buffer (or closes
/// the connection) before the next call. A buffer shorter than the last one
/// also starts it afresh.
#[derive(Debug, Clone)]
pub struct RequestParser {
    /// The largest body accepted.
    max_body_bytes: usize,
    phase: Phase,
    /// Start of the line being looked for (or of the empty lines skipped).
    line_start: usize,
    /// The current line has been searched for its LF up to here.
    scanned: usize,
    /// The buffer's length at the last call.
    seen: usize,
    method: String,
    path: String,
    version: Option<Version>,
    headers: Vec<(String, String)>,
    /// Bytes searched for a line end, in all (tests check it stays linear).
    #[cfg(test)]
    looked: usize,
}

impl Default for RequestParser {
    fn default() -> Self {
        RequestParser::new()
    }
}

impl RequestParser {
    /// A parser at the start of a request, taking bodies of up to
    /// [`MAX_BODY_BYTES`].
    pub fn new() -> RequestParser {
        RequestParser::with_max_body(MAX_BODY_BYTES)
    }

    /// A parser taking bodies of up to `max_body_bytes`.
    pub fn with_max_body(max_body_bytes: usize) -> RequestParser {
        RequestParser {
            max_body_bytes,
            phase: Phase::default(),
            line_start: 0,
            scanned: 0,
            seen: 0,
            method: String::new(),
            path: String::new(),
            version: None,
            headers: Vec::new(),
            #[cfg(test)]
            looked: 0,
        }
    }

    fn restart(&mut self) {
        *self = RequestParser::with_max_body(self.max_body_bytes);
    }

    /// Parses what `buf` holds of the request at its front, continuing from
    /// the last call. See the type's doc.
    pub fn parse(&mut self, buf: &[u8]) -> Result<Parsed, RequestError> {
        if buf.len() < self.seen {
            self.restart();
        }
        self.seen = buf.len();
        let result = self.advance(buf);
        if !matches!(result, Ok(Parsed::NeedMore { .. })) {
            self.restart();
        }
        result
    }

    fn advance(&mut self, buf: &[u8]) -> Result<Parsed, RequestError> {
        const MORE: Result<Parsed, RequestError> = Ok(Parsed::NeedMore {
            expect_continue: false,
        });
        loop {
            match self.phase {
                Phase::Leading => match buf.get(self.line_start..self.line_start + 2) {
                    // Ignore empty lines before a request (RFC 9112 2.2),
                    // within the limit.
                    Some(b"\r\n") => {
                        self.line_start += 2;
                        self.scanned = self.line_start;
                        if self.line_start >= MAX_LINE_BYTES {
                            return Err(RequestError::LineTooLong);
                        }
                    }
                    Some(_) => self.phase = Phase::RequestLine,
                    // One byte: it may still become an empty line, unless
                    // it is a bare LF.
                    None if buf.get(self.line_start) == Some(&b'\n') => {
                        return Err(RequestError::BadHeader("a line ends in a bare LF"));
                    }
                    None => return MORE,
                },
                Phase::RequestLine => {
                    let Some(end) = self.next_line(buf)? else {
                        return MORE;
                    };
                    let line = &buf[self.line_start..end];
                    if line.contains(&b'\r') {
                        return Err(RequestError::BadRequestLine("a bare CR"));
                    }
                    let (method, path, version) = parse_request_line(line)?;
                    (self.method, self.path, self.version) = (method, path, Some(version));
                    self.start_line(end + 2);
                    self.phase = Phase::Headers;
                }
                Phase::Headers => {
                    let Some(end) = self.next_line(buf)? else {
                        return MORE;
                    };
                    let line = &buf[self.line_start..end];
                    self.start_line(end + 2);
                    if line.is_empty() {
                        self.phase = self.head_done(end + 2)?;
                        continue;
                    }
                    if line.contains(&b'\r') {
                        return Err(RequestError::BadHeader("a bare CR"));
                    }
                    if self.headers.len() == MAX_HEADERS {
                        return Err(RequestError::TooManyHeaders);
                    }
                    self.headers.push(parse_header(line)?);
                }
                Phase::Body {
                    start,
                    len,
                    keep_alive,
                    expect_continue,
                } => {
                    let Some(body) = buf.get(start..start + len) else {
                        return Ok(Parsed::NeedMore {
                            expect_continue: expect_continue && len > 0,
                        });
                    };
                    let request = Request {
                        method: std::mem::take(&mut self.method),
                        path: std::mem::take(&mut self.path),
                        version: self.version.unwrap_or(Version::Http11),
                        keep_alive,
                        headers: std::mem::take(&mut self.headers),
                        body: body.to_vec(),
                    };
                    return Ok(Parsed::Complete {
                        request,
                        consumed: start + len,
                    });
                }
            }
        }
    }

    /// The next line starts at `at`.
    fn start_line(&mut self, at: usize) {
        self.line_start = at;
        self.scanned = at;
    }

    /// Where the current line ends: `Ok(Some(end))` with
    /// `buf[line_start..end]` the line without its CRLF, `Ok(None)` if the
    /// line is not complete yet. Searches only bytes it has not searched.
    fn next_line(&mut self, buf: &[u8]) -> Result<Option<usize>, RequestError> {
        let limit = buf.len().min(self.line_start + MAX_LINE_BYTES);
        let from = self.scanned.max(self.line_start);
        if from < limit {
            #[cfg(test)]
            {
                self.looked += limit - from;
            }
            if let Some(i) = buf[from..limit].iter().position(|&b| b == b'\n') {
                let lf = from + i;
                if lf == self.line_start || buf[lf - 1] != b'\r' {
                    return Err(RequestError::BadHeader("a line ends in a bare LF"));
                }
                return Ok(Some(lf - 1));
            }
            self.scanned = limit;
        }
        if buf.len() - self.line_start >= MAX_LINE_BYTES {
            return Err(RequestError::LineTooLong);
        }
        Ok(None)
    }

    /// The head ended before `body_start`: the headers that matter, checked.
    fn head_done(&self, body_start: usize) -> Result<Phase, RequestError> {
        let version = self.version.unwrap_or(Version::Http11);
        let mut content_length = None;
        let mut keep_alive = version == Version::Http11;
        let mut expect_continue = false;
        for (name, value) in &self.headers {
            match name.as_str() {
                "content-length" => {
                    if content_length.is_some() {
                        return Err(RequestError::BadContentLength("given twice"));
                    }
                    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
                        return Err(RequestError::BadContentLength("not a decimal number"));
                    }
                    // Too many digits to parse is simply too large.
                    let n = value.parse::<usize>().unwrap_or(usize::MAX);
                    if n > self.max_body_bytes {
                        return Err(RequestError::BodyTooLarge(self.max_body_bytes));
                    }
                    content_length = Some(n);
                }
                "transfer-encoding" => return Err(RequestError::TransferEncoding),
                "connection"
                    if value
                        .split(',')
                        .any(|t| t.trim().eq_ignore_ascii_case("keep-alive")) =>
                {
                    keep_alive = true;
                }
                "expect" => {
                    if !value.eq_ignore_ascii_case("100-continue") {
                        return Err(RequestError::BadExpect);
                    }
                    expect_continue = version == Version::Http11;
                }
                _ => {}
            }
        }
        // `close` wins over `keep-alive` whatever their order.
        if self.headers.iter().any(|(n, v)| {
            n == "connection" && v.split(',').any(|t| t.trim().eq_ignore_ascii_case("close"))
        }) {
            keep_alive = false;
        }
        Ok(Phase::Body {
            start: body_start,
            len: content_length.unwrap_or(0),
            keep_alive,
            expect_continue,
        })
    }
}

/// The reason phrase of a status code this server uses.
pub fn reason_phrase(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        200 => "OK",
        202 => "Accepted",
        204 => "No Content",
        400 => "Bad Request",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        413 => "Content Too Large",
        417 => "Expectation Failed",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        503 => "Service Unavailable",
        505 => "HTTP Version Not Supported",
        _ => "Unknown",
    }
}

/// One response, ready to be written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// The status code.
    pub status: u16,
    /// The JSON body (none for 204).
    pub body: Option<String>,
    /// The methods of an `Allow` header (for 405).
    pub allow: Option<&'static str>,
    /// Close the connection after this response (`Connection: close`).
    pub close: bool,
}

impl Response {
    /// A response with a JSON body.
    pub fn json(status: u16, body: String) -> Response {
        Response {
            status,
            body: Some(body),
            allow: None,
            close: false,
        }
    }

    /// 204 No Content.
    pub fn no_content() -> Response {
        Response {
            status: 204,
            body: None,
            allow: None,
            close: false,
        }
    }

    /// An error response: `{"fault_message": "..."}`.
    pub fn fault(status: u16, message: &str) -> Response {
        let body = serde_json::json!({ "fault_message": message }).to_string();
        Response::json(status, body)
    }

    /// The bytes on the wire. Every response but 204 has a JSON body with
    /// `Content-Type` and `Content-Length`; a 204 has neither, as RFC 9110
    /// says a server must not send `Content-Length` with it.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut head = format!(
            "HTTP/1.1 {} {}\r\nServer: teravm\r\n",
            self.status,
            reason_phrase(self.status)
        );
        if let Some(allow) = self.allow {
            head.push_str(&format!("Allow: {allow}\r\n"));
        }
        if self.close {
            head.push_str("Connection: close\r\n");
        }
        let body = self.body.as_deref().unwrap_or("");
        if self.status != 204 {
            head.push_str(&format!(
                "Content-Type: application/json\r\nContent-Length: {}\r\n",
                body.len()
            ));
        }
        head.push_str("\r\n");
        let mut bytes = head.into_bytes();
        if self.status != 204 {
            bytes.extend_from_slice(body.as_bytes());
        }
        bytes
    }
}

#[cfg(test)]
#[path = "http_tests.rs"]
mod tests;
