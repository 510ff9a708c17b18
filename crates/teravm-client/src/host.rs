//! What the benchmark and the integration tests read from the host and from
//! teravm's output, one parser each: `MemAvailable` of `/proc/meminfo`, a
//! process's resident size from `/proc/<pid>/status`, the firmware's
//! `touched N MiB` line and teravm's `reclaimed` summary line.
//!
//! Pure parsers over text plus two small readers; it depends on nothing but
//! `std` and `thiserror`. Its unit tests are in `host_tests.rs`.

use std::path::Path;

/// How the firmware's line about the memory it dirtied starts.
pub const TOUCHED_PREFIX: &str = "teravm firmware: touched ";
/// How teravm's summary line starts.
pub const SUMMARY_PREFIX: &str = "teravm: reclaimed ";

/// Errors of reading the host's files.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The file has no such line, or one that does not parse.
    #[error("{path} has no valid {what} line")]
    Missing {
        /// The file.
        path: String,
        /// The line looked for.
        what: &'static str,
    },
}

/// A `<value> kB` (or bare `<value>`) field of a `/proc` file, in bytes.
fn kib_field(rest: &str) -> Option<u64> {
    let mut fields = rest.split_whitespace();
    let value: u64 = fields.next()?.parse().ok()?;
    match fields.next() {
        Some("kB") => value.checked_mul(1024),
        None => Some(value),
        Some(_) => None,
    }
}

/// MemAvailable, in bytes, from the text of `/proc/meminfo`.
pub fn parse_mem_available(meminfo: &str) -> Option<u64> {
    meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))
        .and_then(kib_field)
}

/// Reads MemAvailable, in bytes, from a meminfo file.
pub fn read_mem_available(path: &Path) -> Result<u64, HostError> {
    let text = std::fs::read_to_string(path).map_err(|source| HostError::Read {
        path: path.display().to_string(),
        source,
    })?;
    parse_mem_available(&text).ok_or_else(|| HostError::Missing {
        path: path.display().to_string(),
        what: "MemAvailable",
    })
}

/// VmRSS, in bytes, from the text of `/proc/<pid>/status`.
pub fn parse_vm_rss(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(kib_field)
}

/// The resident size of process `pid` in bytes; `None` once it is gone (or
/// a zombie, which has no VmRSS line).
pub fn rss_bytes(pid: u32) -> Option<u64> {
    parse_vm_rss(&std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?)
}

/// The N of the firmware's `teravm firmware: touched N MiB in T ms` line, in
/// MiB; text before the prefix (a partial line of the guest) is skipped.
pub fn parse_touched_mib(line: &str) -> Option<u64> {
    let at = line.find(TOUCHED_PREFIX)?;
    line[at + TOUCHED_PREFIX.len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// teravm's summary line, parsed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    /// Resident memory freed, MiB.
    pub mib: u64,
    /// Reclaim time, ms.
    pub ms: u64,
    /// Worker threads in all.
    pub workers: u32,
    /// Host nodes.
    pub nodes: u32,
}

/// Parses `teravm: reclaimed <MiB> MiB in <ms> ms (<x> GiB/s, <w> workers,
/// <n> nodes)` at the start of a line of teravm's stderr (the guest's
/// console is stdout: nothing it prints can pass for this line). The
/// worker and node counts are found by the word after them (`worker(s)`,
/// `node(s)`), so that more fields in the parentheses do not break it.
pub fn parse_summary(line: &str) -> Option<Summary> {
    if !line.starts_with(SUMMARY_PREFIX) {
        return None;
    }
    let words: Vec<&str> = line.split_whitespace().collect();
    if words.get(3) != Some(&"MiB") || words.get(4) != Some(&"in") {
        return None;
    }
    let count_before = |unit: &str| {
        words
            .windows(2)
            .find(|w| w[1].starts_with(unit))
            .and_then(|w| w[0].parse().ok())
    };
    Some(Summary {
        mib: words[2].parse().ok()?,
        ms: words.get(5)?.parse().ok()?,
        workers: count_before("worker")?,
        nodes: count_before("node")?,
    })
}

/// The first summary line among `lines`.
pub fn find_summary<'a>(lines: impl IntoIterator<Item = &'a str>) -> Option<Summary> {
    lines.into_iter().find_map(parse_summary)
}
