//! The guest side's HTTP: requests parsed from a connection's bytes
//! (bounded: a request whose head and body pass [`MAX_REQUEST_BYTES`] is
//! refused), answered from the [`Mmds`] as Firecracker's MMDS answers:
//!
//! - `GET <path>`: V1 with or without a token (a missing or invalid one is
//!   only counted, as Firecracker does); V2 only with a valid
//!   `X-metadata-token` (or `X-aws-ec2-metadata-token`), else 401. The
//!   value at the path as JSON (`Accept: application/json`) or in the IMDS
//!   text format (`Accept: text/plain`, no `Accept`, or `imds_compat`).
//! - `PUT /latest/api/token` with `X-metadata-token-ttl-seconds` (or the
//!   `X-aws-ec2-...` spelling): a token, 200 text. A PUT with
//!   `X-Forwarded-For` is refused (400): a token is for the guest itself.
//! - Anything else: 405 with `Allow: GET, PUT`.
//!
//! Responses are `HTTP/1.x <code> ` + `Server`, `Connection: keep-alive`,
//! `Content-Type`, `Content-Length`, as Firecracker's micro_http writes.

use super::store::OutputFormat;
use super::token::TOKEN_PATH;
use super::{Mmds, MmdsVersion};

/// Most bytes of one request (head and body).
pub const MAX_REQUEST_BYTES: usize = 8192;

/// One parsed request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// `GET`, `PUT`, ...
    pub method: String,
    /// The path (the absolute URI's host removed).
    pub path: String,
    /// `HTTP/1.0` or `HTTP/1.1`.
    pub version: String,
    /// Headers, names lower-cased, values trimmed.
    pub headers: Vec<(String, String)>,
}

impl Request {
    /// The value of the first header named one of `names` (lower case),
    /// with the name as found.
    pub fn header(&self, names: &[&str]) -> Option<(&str, &str)> {
        names.iter().find_map(|n| {
            self.headers
                .iter()
                .find(|(k, _)| k == n)
                .map(|(k, v)| (k.as_str(), v.as_str()))
        })
    }
}

/// What the bytes received so far make.
#[derive(Debug, PartialEq, Eq)]
pub enum Parsed {
    /// Not a whole request yet.
    Incomplete,
    /// A request, and the bytes it took.
    Request(Request, usize),
    /// Not HTTP, or too long: answer 400 with this and close.
    Bad(String),
}

/// Parses the first request in `buf`.
pub fn parse(buf: &[u8]) -> Parsed {
    let Some(head_end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
        return if buf.len() >= MAX_REQUEST_BYTES {
            Parsed::Bad("Request too large.".into())
        } else {
            Parsed::Incomplete
        };
    };
    let Ok(head) = std::str::from_utf8(&buf[..head_end]) else {
        return Parsed::Bad("Invalid request.".into());
    };
    let mut lines = head.split("\r\n");
    let line = lines.next().unwrap_or_default();
    let mut parts = line.split(' ');
    let (Some(method), Some(uri), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Parsed::Bad("Invalid request.".into());
    };
    if !matches!(version, "HTTP/1.0" | "HTTP/1.1") {
        return Parsed::Bad("Unsupported HTTP version.".into());
    }
    if method.is_empty() || !method.bytes().all(|b| b.is_ascii_uppercase()) {
        return Parsed::Bad("Invalid HTTP method.".into());
    }
    let mut headers = Vec::new();
    for l in lines {
        let Some((k, v)) = l.split_once(':') else {
            return Parsed::Bad("Invalid header.".into());
        };
        headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
    }
    let mut length = 0usize;
    if let Some((_, v)) = headers.iter().find(|(k, _)| k == "content-length") {
        match v.parse::<usize>() {
            Ok(n) => length = n,
            Err(_) => return Parsed::Bad(format!("Invalid value. Key:Content-Length; Value:{v}")),
        }
    }
    let total = head_end + 4 + length;
    if total > MAX_REQUEST_BYTES {
        return Parsed::Bad("Request too large.".into());
    }
    if buf.len() < total {
        return Parsed::Incomplete;
    }
    let path = match uri.strip_prefix("http://") {
        Some(rest) => rest.find('/').map_or("", |i| &rest[i..]),
        None => uri,
    };
    let request = Request {
        method: method.to_string(),
        path: path.to_string(),
        version: version.to_string(),
        headers,
    };
    Parsed::Request(request, total)
}

/// A response, as bytes on the wire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// The status code.
    pub status: u16,
    /// `text/plain` or `application/json`.
    pub content_type: &'static str,
    /// Extra header lines (`Allow`, the token's TTL).
    pub extra: Vec<(String, String)>,
    /// The body.
    pub body: String,
}

const PLAIN: &str = "text/plain";
const JSON: &str = "application/json";

fn plain(status: u16, body: impl Into<String>) -> Response {
    Response {
        status,
        content_type: PLAIN,
        extra: Vec::new(),
        body: body.into(),
    }
}

impl Response {
    /// The bytes of the response in HTTP `version`.
    pub fn to_bytes(&self, version: &str) -> Vec<u8> {
        let version = if version == "HTTP/1.0" {
            "HTTP/1.0"
        } else {
            "HTTP/1.1"
        };
        let mut s = format!(
            "{version} {} \r\nServer: Firecracker API\r\nConnection: keep-alive\r\n",
            self.status
        );
        for (k, v) in &self.extra {
            s.push_str(&format!("{k}: {v}\r\n"));
        }
        s.push_str(&format!(
            "Content-Type: {}\r\nContent-Length: {}\r\n\r\n",
            self.content_type,
            self.body.len()
        ));
        s.push_str(&self.body);
        s.into_bytes()
    }
}

const TOKEN_HEADERS: [&str; 2] = ["x-metadata-token", "x-aws-ec2-metadata-token"];
const TTL_HEADERS: [&str; 2] = [
    "x-metadata-token-ttl-seconds",
    "x-aws-ec2-metadata-token-ttl-seconds",
];

/// Collapses `//` in a path, as Firecracker does.
fn sanitize(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    for c in path.chars() {
        if !(c == '/' && out.ends_with('/')) {
            out.push(c);
        }
    }
    out
}

/// The answer to `request` (the MMDS locked by the caller).
pub fn respond(mmds: &mut Mmds, request: &Request) -> Response {
    if request.path.is_empty() || !request.path.starts_with('/') {
        return plain(400, "Invalid URI.");
    }
    match request.method.as_str() {
        "GET" => get(mmds, request),
        "PUT" => put(mmds, request),
        _ => {
            let mut r = plain(405, "Not allowed HTTP method.");
            r.extra.push(("Allow".into(), "GET, PUT".into()));
            r
        }
    }
}

fn get(mmds: &mut Mmds, request: &Request) -> Response {
    let token = request.header(&TOKEN_HEADERS).map(|(_, v)| v);
    let valid = token.is_some_and(|t| mmds.is_valid_token(t));
    match (mmds.version(), token) {
        (MmdsVersion::V2, None) => {
            mmds.counters.no_token += 1;
            return plain(
                401,
                "No MMDS token provided. Use `X-metadata-token` or `X-aws-ec2-metadata-token` \
                 header to specify the session token.",
            );
        }
        (MmdsVersion::V2, Some(_)) if !valid => {
            mmds.counters.invalid_token += 1;
            return plain(401, "MMDS token not valid.");
        }
        (MmdsVersion::V1, None) => mmds.counters.no_token += 1,
        (MmdsVersion::V1, Some(_)) if !valid => mmds.counters.invalid_token += 1,
        _ => {}
    }
    let (format, content_type) = match request.header(&["accept"]).map(|(_, v)| v) {
        None | Some("text/plain") => (OutputFormat::Imds, PLAIN),
        Some("application/json") => (OutputFormat::Json, JSON),
        Some(other) => return plain(400, format!("Unsupported value. Key:Accept; Value:{other}")),
    };
    let format = if mmds.imds_compat() {
        OutputFormat::Imds
    } else {
        format
    };
    let path = sanitize(&request.path);
    match mmds.store().get(&path, format) {
        Ok(body) => Response {
            status: 200,
            content_type,
            extra: Vec::new(),
            body,
        },
        Err(super::StoreError::NotFound) => {
            plain(404, format!("Resource not found: {}.", request.path))
        }
        Err(e) => plain(501, e.to_string()),
    }
}

fn put(mmds: &mut Mmds, request: &Request) -> Response {
    if request.header(&["x-forwarded-for"]).is_some() {
        return plain(400, "Unsupported header name. Key: X-Forwarded-For");
    }
    if sanitize(&request.path) != TOKEN_PATH {
        return plain(404, format!("Resource not found: {}.", request.path));
    }
    let Some((name, value)) = request.header(&TTL_HEADERS) else {
        return plain(
            400,
            "Token time to live value not found. Use `X-metadata-token-ttl-seconds` or \
             `X-aws-ec2-metadata-token-ttl-seconds` header to specify the token's lifetime.",
        );
    };
    let Ok(ttl) = value.parse::<u32>() else {
        return plain(400, format!("Invalid value. Key:{name}; Value:{value}"));
    };
    match mmds.generate_token(ttl) {
        Ok(token) => {
            let mut r = plain(200, token);
            r.extra.push((name.to_string(), ttl.to_string()));
            r
        }
        Err(e) => plain(400, e.to_string()),
    }
}
