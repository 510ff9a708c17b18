//! `teravm`: parse the command line (teravm's flags and Firecracker's), set
//! up logging and metrics, run one microVM, exit with its code.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use teravm::config::LogLevel;
use teravm::config::{LoggerConfig, MetricsConfig, VmConfig};
use teravm::files::{FileOpener, OPEN_TIMEOUT};
use teravm::vmm::actions::opens::output_request;
use teravm::vmm::{self, VmmOptions, EXIT_ERROR};

/// `--version`'s words after the name (see [`Cli`]).
/// (`concat!` takes literals only: a test holds the number to
/// `teravm::api::FIRECRACKER_API_VERSION`.)
const VERSION: &str = concat!(
    "v1.17.0 (the Firecracker API version it implements; teravm ",
    env!("CARGO_PKG_VERSION"),
    ")"
);

/// Firecracker's API socket when none is named.
const DEFAULT_API_SOCK: &str = "/run/firecracker.socket";

/// The longest instance id, as in Firecracker.
const MAX_ID_LEN: usize = 64;

/// A minimal KVM VMM for microVMs with very large memory, which frees guest
/// memory at shutdown with worker threads pinned to each host NUMA node.
/// Firecracker's flags are accepted with their meaning (docs/firecracker.md).
///
/// `--version` says `teravm v<Firecracker API version> (...; teravm
/// <version>)`: orchestrators that check Firecracker's version read the
/// second word of its first line (Kata's `parseVersion` wants at least
/// 0.21.1), and what they check is the API they will speak (docs/fleet.md).
#[derive(Debug, Parser)]
#[command(name = "teravm", version = VERSION)]
struct Cli {
    /// Serve the HTTP API on this Unix socket (mode 0600; it grants full control of the microVM). Without it (and without --no-api), Firecracker's default, /run/firecracker.socket, where a jailer's orchestrator looks for it (Kata's jailed mode passes none).
    #[arg(long, value_name = "PATH")]
    api_sock: Option<PathBuf>,
    /// Configure the microVM from this JSON file (at most 1 MiB) and start it at once (with or without an API socket, as Firecracker does).
    #[arg(long, value_name = "FILE")]
    config_file: Option<PathBuf>,
    /// Run from the config file alone, without an API socket, starting at once.
    #[arg(long, requires = "config_file", conflicts_with = "api_sock")]
    no_api: bool,
    /// Instance id, shown by `GET /` and in log lines: 1 to 64 letters, digits and '-'.
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
    /// Log level: Off, Error, Warning, Info, Debug, Trace (any case; default Warning).
    #[arg(long = "level", visible_alias = "log-level", value_name = "LEVEL")]
    level: Option<String>,
    /// Write log lines to this file or FIFO (Firecracker's line format) instead of stderr.
    #[arg(long, value_name = "PATH")]
    log_path: Option<PathBuf>,
    /// Show the level in log lines.
    #[arg(long)]
    show_level: bool,
    /// Show the source file and line in log lines.
    #[arg(long)]
    show_log_origin: bool,
    /// Only log records of modules whose path starts with this (e.g. `teravm::vmm`).
    #[arg(long, value_name = "MODULE")]
    module: Option<String>,
    /// Write metrics (one JSON object per line) to this file or FIFO.
    #[arg(long, value_name = "PATH")]
    metrics_path: Option<PathBuf>,
    /// Log the guest's boot time.
    #[arg(long)]
    boot_timer: bool,
    /// The most bytes an API request body may have.
    #[arg(long, value_name = "BYTES", default_value_t = teravm::api::http::MAX_BODY_BYTES)]
    http_api_max_payload_size: usize,
    /// The jailer's process start time (CLOCK_MONOTONIC, microseconds).
    #[arg(long, value_name = "US")]
    start_time_us: Option<u64>,
    /// The jailer's process start CPU time (microseconds).
    #[arg(long, value_name = "US")]
    start_time_cpu_us: Option<u64>,
    /// The CPU time the jailer (the parent) used (microseconds).
    #[arg(long, value_name = "US")]
    parent_cpu_time_us: Option<u64>,
    /// Run without seccomp filters (not recommended).
    #[arg(long)]
    no_seccomp: bool,
    /// A JSON file: the MMDS's first contents.
    #[arg(long, value_name = "FILE")]
    metadata: Option<PathBuf>,
    /// Refused: a Firecracker seccomp BPF file (teravm builds its own filters).
    #[arg(long, value_name = "FILE", hide = true)]
    seccomp_filter: Option<OsString>,
    /// The most bytes of JSON the MMDS holds (default: the API's payload
    /// limit, as Firecracker).
    #[arg(long, value_name = "BYTES")]
    mmds_size_limit: Option<usize>,
    /// Refused: PCI devices (teravm has none).
    #[arg(long, hide = true)]
    enable_pci: bool,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Before any thread exists: every thread inherits the mask.
    if let Err(e) = teravm::vmm::signals::block() {
        eprintln!("teravm: {e}");
        return ExitCode::from(1);
    }
    teravm::logger::init(log::LevelFilter::Warn);
    // The seccomp policy first (the `output` thread installs its filter as
    // it starts), then the `output` thread, before any other thread: all of
    // teravm's own output goes through it from here on.
    let policy = teravm::seccomp::Policy::from_enabled(!cli.no_seccomp);
    if let Err(e) = teravm::seccomp::prepare(policy) {
        let message = format!("teravm: seccomp: {e}");
        teravm::seccomp::write_stderr_bounded(format!("{message}\n").as_bytes());
        return ExitCode::from(u8::try_from(EXIT_ERROR).unwrap_or(1));
    }
    if let Err(e) = teravm::output::start() {
        let message = format!("teravm: cannot start the output thread: {e}");
        teravm::seccomp::write_stderr_bounded(format!("{message}\n").as_bytes());
        return ExitCode::from(u8::try_from(EXIT_ERROR).unwrap_or(1));
    }
    let code = match run(cli) {
        Ok(code) => code,
        Err(message) => {
            teravm::output::line(&format!("teravm: {message}"));
            EXIT_ERROR
        }
    };
    // The summary and the last lines reach a stderr that is read; a full
    // one delays the exit by at most this.
    teravm::output::flush(teravm::output::EXIT_FLUSH_WAIT);
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}

/// Firecracker's rule for instance ids.
fn check_id(id: &str) -> Result<(), String> {
    if id.is_empty() || id.len() > MAX_ID_LEN {
        return Err(format!(
            "invalid --id: {} bytes; it must be 1 to {MAX_ID_LEN} letters, digits and '-'",
            id.len()
        ));
    }
    if let Some(c) = id
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || *c == '-'))
    {
        return Err(format!(
            "invalid --id: {c:?} is not allowed; only letters, digits and '-'"
        ));
    }
    Ok(())
}

/// A Firecracker flag whose feature teravm lacks.
fn refused_flag(cli: &Cli) -> Option<&'static str> {
    if cli.seccomp_filter.is_some() {
        Some(
            "--seccomp-filter is not supported: teravm installs its own per-thread filters \
             (turn them off with --no-seccomp)",
        )
    } else if cli.enable_pci {
        Some("--enable-pci is not supported: teravm has no PCI devices")
    } else {
        None
    }
}

fn run(cli: Cli) -> Result<i32, String> {
    if let Some(message) = refused_flag(&cli) {
        return Err(message.into());
    }
    check_id(&cli.id)?;
    teravm::logger::set_instance_id(&cli.id);
    let level = match &cli.level {
        Some(s) => Some(s.parse::<LogLevel>().map_err(|e| format!("--level: {e}"))?),
        None => None,
    };
    if cli.http_api_max_payload_size == 0 {
        return Err("--http-api-max-payload-size must be at least 1".into());
    }
    // The `files` thread opens every path named below (and later over the
    // API); it installs its filter first thing.
    let files = FileOpener::spawn().map_err(|e| e.to_string())?;
    let flags_logger = LoggerConfig {
        log_path: cli.log_path.clone(),
        level,
        show_level: cli.show_level.then_some(true),
        show_log_origin: cli.show_log_origin.then_some(true),
        module: cli.module.clone(),
    };
    flags_logger.validate().map_err(|e| e.to_string())?;
    configure_logger(&files, &flags_logger).map_err(|e| format!("--log-path: {e}"))?;
    if let Some(path) = &cli.metrics_path {
        let metrics = MetricsConfig {
            metrics_path: path.clone(),
        };
        metrics.validate().map_err(|e| e.to_string())?;
        configure_metrics(&files, &metrics).map_err(|e| format!("--metrics-path: {e}"))?;
    }
    let api_sock = match (&cli.api_sock, cli.no_api) {
        (None, false) => Some(PathBuf::from(DEFAULT_API_SOCK)),
        (sock, _) => sock.clone(),
    };
    let mut config = match &cli.config_file {
        Some(path) => VmConfig::from_file(path).map_err(|e| e.to_string())?,
        None => VmConfig::default(),
    };
    // The config file's logger and metrics sections act like the flags.
    if let Some(logger) = config.logger.take() {
        configure_logger(&files, &logger).map_err(|e| format!("config file logger: {e}"))?;
    }
    if let Some(metrics) = config.metrics.take() {
        configure_metrics(&files, &metrics).map_err(|e| format!("config file metrics: {e}"))?;
    }
    report_startup_time(&cli);
    let mmds = teravm::mmds::shared(cli.mmds_size_limit.unwrap_or(cli.http_api_max_payload_size));
    if let Some(path) = &cli.metadata {
        let text =
            std::fs::read(path).map_err(|e| format!("--metadata {}: {e}", path.display()))?;
        let value: serde_json::Value = serde_json::from_slice(&text)
            .map_err(|e| format!("--metadata {}: not valid JSON: {e}", path.display()))?;
        teravm::mmds::lock(&mmds)
            .store_mut()
            .put(value)
            .map_err(|e| format!("--metadata {}: {e}", path.display()))?;
    }
    let opts = VmmOptions {
        id: cli.id,
        sysfs_root: cli.sysfs_root,
        api_sock,
        serial_file: cli.serial_file,
        linger: Duration::from_millis(cli.linger_ms),
        start_at_once: cli.config_file.is_some(),
        serial_file_max_bytes: cli.serial_file_max_bytes,
        boot_timer: cli.boot_timer,
        seccomp: !cli.no_seccomp,
        api_max_payload_bytes: cli.http_api_max_payload_size,
        mmds,
        files,
    };
    vmm::run(config, opts).map_err(|e| e.to_string())
}

/// Applies a logger section, its log path opened by the `files` thread.
fn configure_logger(files: &FileOpener, config: &LoggerConfig) -> Result<(), String> {
    let file = match &config.log_path {
        Some(path) => Some(
            files
                .open_one(output_request("logger.log_path", path, false), OPEN_TIMEOUT)
                .map_err(|e| e.to_string())?
                .file,
        ),
        None => None,
    };
    teravm::logger::configure(config, file).map_err(|e| e.to_string())
}

/// Sets up the metrics, their path opened by the `files` thread.
fn configure_metrics(files: &FileOpener, config: &MetricsConfig) -> Result<(), String> {
    let request = output_request("metrics.metrics_path", &config.metrics_path, false);
    let opened = files
        .open_one(request, OPEN_TIMEOUT)
        .map_err(|e| e.to_string())?;
    teravm::metrics::configure(config, opened.file).map_err(|e| e.to_string())
}

/// Logs (and puts in the metrics) the start-up time the jailer's flags let
/// teravm compute, as Firecracker does.
fn report_startup_time(cli: &Cli) {
    let (wall_us, cpu_us) = teravm::metrics::process_startup_times(
        cli.start_time_us,
        cli.start_time_cpu_us,
        cli.parent_cpu_time_us,
    );
    if let Some(us) = wall_us {
        log::info!("process start-up took {us} us since the jailer's start time");
    }
    if let Some(us) = cpu_us {
        log::info!("process start-up used {us} us of CPU (with the parent's)");
    }
}

#[cfg(test)]
mod tests {
    use super::VERSION;

    /// Kata's `parseVersion`: the second word of the first line, its `v`
    /// trimmed, is the Firecracker version whose API teravm speaks.
    #[test]
    fn the_version_line_reads_as_firecrackers() {
        let line = format!("teravm {VERSION}");
        let second = line.split(' ').nth(1).unwrap().trim_start_matches('v');
        assert_eq!(second, teravm::api::FIRECRACKER_API_VERSION);
        assert!(line.ends_with(&format!("teravm {})", env!("CARGO_PKG_VERSION"))));
    }
}
