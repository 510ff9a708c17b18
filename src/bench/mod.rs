//! The reclaim benchmark: baselines and teravm side by side, statistics, CSV and SVG output.
//!
//! `teravm-bench` measures, in one run and side by side, how long it takes to
//! give fully touched guest memory back to the host:
//!
//! - `munmap`: one thread unmaps the region (what a VMM's `Drop` does);
//! - `exit`: a child process holding the memory is killed with `SIGKILL`,
//!   timed from the kill until `waitpid` returns;
//! - `teravm-<w>`: teravm's parallel reclaim with `w` workers per node;
//! - with `--vm`, end to end: `vm-kill` (a microVM killed with `SIGKILL`) and
//!   `vm-teravm-<w>` (the same microVM shut down through teravm's API).
//!
//! The methods alternate run by run so that drift hits them all alike. The
//! module owns the command line ([`cli`]), the statistics ([`stats`]), the
//! CSV, table ([`report`]) and SVG ([`svg`]) outputs, the child process of the
//! `exit` baseline ([`child`]) and the loop that runs it all ([`runner`]).
//! Everything runs in the calling thread except the reclaim and populate
//! workers of the memory module and the `exit` child, which is a separate
//! process (the bench binary re-executed), talked to through its stdout.

pub mod child;
pub mod cli;
pub mod report;
pub mod runner;
pub mod stats;
pub mod svg;
pub mod vm;

use std::fmt;

use crate::config::Backing;

/// Errors of the benchmark.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// A command-line value is wrong.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The requested size does not fit in the host's available memory.
    #[error(
        "--size-gib {size_gib} is too large: the host has {available_mib} MiB available \
         (MemAvailable), of which at most {usable_mib} MiB may be used (a margin of \
         {margin_mib} MiB is kept)"
    )]
    TooLarge {
        /// The requested size.
        size_gib: u64,
        /// MemAvailable of /proc/meminfo.
        available_mib: u64,
        /// The margin kept free.
        margin_mib: u64,
        /// What may be used.
        usable_mib: u64,
    },
    /// `/proc/meminfo` could not be read or has no MemAvailable line.
    #[error("cannot read MemAvailable from {path}: {reason}")]
    Meminfo {
        /// The file read.
        path: String,
        /// Why it failed.
        reason: String,
    },
    /// The host topology could not be read.
    #[error("cannot read the host topology: {0}")]
    Topology(String),
    /// Mapping, populating or reclaiming guest memory failed.
    #[error("guest memory: {0}")]
    Memory(String),
    /// The child process of the `exit` baseline failed.
    #[error("exit baseline child: {0}")]
    Child(String),
    /// An output file could not be written.
    #[error("cannot write {path}: {source}")]
    Write {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// `--vm` cannot run here (no teravm binary, no /dev/kvm).
    #[error("{0}")]
    VmUnavailable(String),
    /// A `--vm` run failed.
    #[error("--vm: {0}")]
    Vm(String),
}

impl BenchError {
    /// The process exit status for this error: 2 for an unavailable `--vm`,
    /// 1 otherwise.
    pub fn exit_code(&self) -> u8 {
        match self {
            BenchError::VmUnavailable(_) => 2,
            _ => 1,
        }
    }
}

/// The page size backing guest memory in a benchmark case.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, clap::ValueEnum)]
pub enum Pages {
    /// 4 KiB pages (`huge_pages: "None"`).
    #[value(name = "4k")]
    FourK,
    /// Transparent huge pages (`huge_pages: "Transparent"`).
    #[value(name = "thp")]
    Thp,
}

impl Pages {
    /// The name used on the command line and in outputs.
    pub fn name(self) -> &'static str {
        match self {
            Pages::FourK => "4k",
            Pages::Thp => "thp",
        }
    }
}

impl fmt::Display for Pages {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The name of a backing, as on the command line and in outputs.
pub fn backing_name(backing: Backing) -> &'static str {
    match backing {
        Backing::Anonymous => "anonymous",
        Backing::Memfd => "memfd",
    }
}

/// Parses a backing name (`anonymous` or `memfd`).
pub fn parse_backing(text: &str) -> Result<Backing, String> {
    match text {
        "anonymous" | "anon" => Ok(Backing::Anonymous),
        "memfd" => Ok(Backing::Memfd),
        _ => Err(format!(
            "unknown backing {text:?}; expected anonymous or memfd"
        )),
    }
}

/// How guest memory is given back to the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Method {
    /// One thread unmaps the region (and closes the memfd).
    Munmap,
    /// A process holding the memory is killed.
    Exit,
    /// teravm's reclaim executor with this many workers per node, then unmap.
    Teravm(u32),
    /// `--vm`: a teravm microVM killed with `SIGKILL`, timed until `waitpid`.
    VmKill,
    /// `--vm`: a teravm microVM shut down through its API (sync), with `w`
    /// workers per node, timed until the reply.
    VmShutdown(u32),
}

impl Method {
    /// Worker threads per node the method uses (1 for the baselines).
    pub fn workers(self) -> u32 {
        match self {
            Method::Munmap | Method::Exit | Method::VmKill => 1,
            Method::Teravm(w) | Method::VmShutdown(w) => w,
        }
    }

    /// Whether this is one of the baselines.
    pub fn is_baseline(self) -> bool {
        !matches!(self, Method::Teravm(_) | Method::VmShutdown(_))
    }
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Method::Munmap => f.write_str("munmap"),
            Method::Exit => f.write_str("exit"),
            Method::Teravm(w) => write!(f, "teravm-{w}"),
            Method::VmKill => f.write_str("vm-kill"),
            Method::VmShutdown(w) => write!(f, "vm-teravm-{w}"),
        }
    }
}

/// One page size and backing: the memory a series of runs is made on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Case {
    /// Page size.
    pub pages: Pages,
    /// Backing.
    pub backing: Backing,
}

impl fmt::Display for Case {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.pages, backing_name(self.backing))
    }
}

/// One timed run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    /// What was freed and how.
    pub case: Case,
    /// The method.
    pub method: Method,
    /// Guest memory size in GiB.
    pub size_gib: u64,
    /// Reclaim chunk size in MiB (teravm runs only).
    pub chunk_mib: Option<u64>,
    /// Run number, from 1.
    pub run: u32,
    /// Seconds the method took.
    pub seconds: f64,
}
