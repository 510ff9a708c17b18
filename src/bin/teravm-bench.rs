//! `teravm-bench`: how fast guest memory goes back to the host, one munmap,
//! a process exit and teravm's parallel reclaim side by side. The work is in
//! [`teravm::bench`].

use std::process::ExitCode;

fn main() -> ExitCode {
    teravm::bench::cli::main_with(std::env::args_os())
}
