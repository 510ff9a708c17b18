//! What `teravm-bench` and teravm's integration tests use to talk to a
//! teravm process and to measure it from outside, with no dependency on
//! teravm itself (so the tests see teravm only through its binary and its
//! socket, as a user does):
//!
//! - [`http`]: a minimal HTTP client for the API socket;
//! - [`host`]: parsers of `/proc` and of teravm's output lines;
//! - [`gmem`]: the guest_memfds a process holds and the pages in them.
#![deny(missing_docs)]
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod gmem;
pub mod host;
#[cfg(test)]
mod host_tests;
pub mod http;
