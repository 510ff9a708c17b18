//! What `teravm-bench` and teravm's integration tests use to talk to a
//! teravm process and to measure it from outside, with no dependency on
//! teravm itself (so the tests see teravm only through its binary and its
//! socket, as a user does):
//!
//! - [`http`]: a minimal HTTP client for the API socket;
//! - [`host`]: parsers of `/proc` and of teravm's output lines;
//! - [`gmem`]: the guest_memfds a process holds and the pages in them;
//! - [`not_possible`]: how a test says what this host cannot check.
#![deny(missing_docs)]
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod gmem;
pub mod host;
#[cfg(test)]
mod host_tests;
pub mod http;

/// Says that `test` cannot check what it is for on this host, because of a
/// property of the host itself (its kernel lacks a feature, its CPU runs
/// guest CPUID natively), not of a missing install: prints
/// `NOT POSSIBLE HERE: test: why` on stderr and, where the environment's
/// `TERAVM_NOT_POSSIBLE` names a file (`.ci/run` sets it), appends the line
/// there, so that the run's closing count lists it. Not a failure, in CI
/// either: no install step could make it possible.
pub fn not_possible(test: &str, why: impl std::fmt::Display) {
    use std::io::Write;
    let line = format!("NOT POSSIBLE HERE: {test}: {why}");
    eprintln!("{line}");
    if let Some(path) = std::env::var_os("TERAVM_NOT_POSSIBLE") {
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            // One write of the whole line: tests run on threads, and
            // O_APPEND keeps one write(2) whole, not two.
            let _ = f.write_all(format!("{line}\n").as_bytes());
        }
    }
}
