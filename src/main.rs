//! `teravm`: parse the command line, set up logging, run one microVM, exit
//! with its code.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use teravm::config::VmConfig;
use teravm::vmm::{self, VmmOptions, EXIT_ERROR};

/// A minimal KVM VMM for microVMs with very large memory, which frees guest
/// memory at shutdown with worker threads pinned to each host NUMA node.
#[derive(Debug, Parser)]
#[command(name = "teravm", version)]
struct Cli {
    /// Serve the HTTP API on this Unix socket (mode 0600; it grants full control of the microVM).
    #[arg(long, value_name = "PATH")]
    api_sock: Option<PathBuf>,
    /// Configure the microVM from this JSON file and start it at once (with or without an API socket, as Firecracker does).
    #[arg(long, value_name = "FILE")]
    config_file: Option<PathBuf>,
    /// Run from the config file alone, without an API socket, starting at once.
    #[arg(long, requires = "config_file", conflicts_with = "api_sock")]
    no_api: bool,
    /// Instance id, shown by `GET /`.
    #[arg(long, default_value = "teravm")]
    id: String,
    /// Where the host NUMA topology is read from (`<DIR>/devices/system/node`).
    #[arg(long, value_name = "DIR", default_value = "/sys")]
    sysfs_root: PathBuf,
    /// Also write the guest's serial console to this file (created with mode 0600; never through a symlink).
    #[arg(long, value_name = "FILE")]
    serial_file: Option<PathBuf>,
    /// Write at most this many bytes to the serial file.
    #[arg(long, value_name = "BYTES", requires = "serial_file")]
    serial_file_max_bytes: Option<u64>,
    /// With an API socket: milliseconds the final state is served after an API `Shutdown`, before exiting.
    #[arg(long, value_name = "MS", default_value_t = 1000)]
    linger_ms: u64,
    /// Log level: error, warn, info, debug, trace.
    #[arg(long, value_name = "LEVEL", default_value = "warn", value_parser = parse_level)]
    log_level: log::LevelFilter,
}

fn parse_level(s: &str) -> Result<log::LevelFilter, String> {
    s.parse()
        .map_err(|_| format!("{s:?} is not one of off, error, warn, info, debug, trace"))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    teravm::logger::init(cli.log_level);
    let code = match run(cli) {
        Ok(code) => code,
        Err(message) => {
            eprintln!("teravm: {message}");
            EXIT_ERROR
        }
    };
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}

fn run(cli: Cli) -> Result<i32, String> {
    if cli.api_sock.is_none() && !cli.no_api {
        return Err("give --api-sock PATH, or --no-api with --config-file FILE".into());
    }
    let config = match &cli.config_file {
        Some(path) => VmConfig::from_file(path).map_err(|e| e.to_string())?,
        None => VmConfig::default(),
    };
    let opts = VmmOptions {
        id: cli.id,
        sysfs_root: cli.sysfs_root,
        api_sock: cli.api_sock,
        serial_file: cli.serial_file,
        linger: Duration::from_millis(cli.linger_ms),
        start_at_once: cli.config_file.is_some(),
        serial_file_max_bytes: cli.serial_file_max_bytes,
    };
    vmm::run(config, opts).map_err(|e| e.to_string())
}
