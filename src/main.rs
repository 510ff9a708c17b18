//! `teravm`: parse the command line, set up logging, run one microVM, exit
//! with its code.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use teravm::config::VmConfig;
use teravm::vmm::{self, KvmTeardown, VmmOptions, EXIT_ERROR};

/// A minimal KVM VMM for microVMs with very large memory, which frees guest
/// memory at shutdown with worker threads pinned to each host NUMA node.
#[derive(Debug, Parser)]
#[command(name = "teravm", version)]
struct Cli {
    /// Serve the HTTP API on this Unix socket (mode 0600; it grants full control of the microVM).
    #[arg(long, value_name = "PATH")]
    api_sock: Option<PathBuf>,
    /// Configure the microVM from this JSON file.
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
    /// Also write the guest's serial console to this file.
    #[arg(long, value_name = "FILE")]
    serial_file: Option<PathBuf>,
    /// With an API socket: milliseconds the final state is served after reclaim, before exiting.
    #[arg(long, value_name = "MS", default_value_t = 1000)]
    linger_ms: u64,
    /// When KVM is torn down relative to reclaim (for measuring; the default was measured fastest).
    #[arg(long, value_enum, default_value_t = KvmTeardown::BeforeReclaim, hide = true)]
    kvm_teardown: KvmTeardown,
    /// Run without seccomp filters (each thread is confined by default).
    #[arg(long)]
    no_seccomp: bool,
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
    let policy = match cli.no_seccomp {
        true => teravm::seccomp::Policy::Off,
        false => teravm::seccomp::Policy::Enforce,
    };
    teravm::seccomp::prepare(policy).map_err(|e| e.to_string())?;
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
        start_at_once: cli.no_api,
        kvm_teardown: cli.kvm_teardown,
    };
    vmm::run(config, opts).map_err(|e| e.to_string())
}
