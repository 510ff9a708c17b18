//! The API: a wire-independent contract between the HTTP server and the VMM,
//! and the HTTP/1.1 server on a Unix socket.
//!
//! - [`action`]: what a request asks ([`VmmAction`]), what the VMM answers
//!   ([`VmmData`], [`VmmActionError`]) and the envelope with its own reply
//!   channel ([`ApiRequest`]). Knows nothing of HTTP.
//! - [`http`]: a strict, bounded HTTP/1.1 request parser (a pure function
//!   over bytes) and the response writer.
//! - [`routing`]: method and path to an action; bodies parsed and validated.
//! - [`server`]: the `api` thread on the Unix socket, talking to the VMM
//!   through an `mpsc` channel and an `EventFd`.
//! - [`shapes`]: the JSON shapes of the memory module's and a shutdown's
//!   reports.

/// The Firecracker release whose API and flags teravm implements and is
/// checked beside (tests/fc_differential.rs, the shared build, 81b38b9da).
pub const FIRECRACKER_API_VERSION: &str = "1.17.0";

pub mod action;
pub mod http;
pub mod routing;
pub mod server;
pub mod shapes;

pub use action::{ActionResult, ApiRequest, ReclaimMode, VmmAction, VmmActionError, VmmData};
pub use server::{ApiServer, ApiServerError, ServerLimits};
