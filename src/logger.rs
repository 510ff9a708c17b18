//! teravm's `log` backend and its settings (Firecracker's `--level`,
//! `--log-path`, `--show-level`, `--show-log-origin`, `--module` and
//! `PUT /logger`).
//!
//! Without a log path, lines go to stderr as
//! `[   1.234s INFO  vcpu0] message` (time since start, level, thread).
//! With one, they go to that file or FIFO in Firecracker's shape,
//! `2024-01-02T03:04:05.123456789 [id:thread:LEVEL:file:line] message`
//! (level and origin as configured), so tools that read Firecracker's log
//! read teravm's. A log path is opened non-blocking: a FIFO nobody reads, or
//! reads slowly, never blocks a thread of teravm; a line that does not fit
//! is dropped and counted ([`missed_lines`], the metrics'
//! `logger.missed_log_count`).
//!
//! The logger formats a record under its settings' lock and hands the line
//! to [`crate::output`]'s bounded queue; only the `output` thread writes it
//! (to stderr, or to the log path's sink), so logging never waits on the
//! host and the lock is never held across a write. The logger uses
//! `output`, never the other way round ([`LineSink`] is `output`'s,
//! re-exported here).

use std::fs::File;
use std::io;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use crate::config::LoggerConfig;
pub use crate::output::LineSink;
use crate::output::SharedSink;

/// The `log` target of the shutdown summary's record: written to a log path
/// only, since the summary itself is already one of teravm's lines on
/// stderr (logged to stderr as well, it was printed twice at `--level info`).
pub const SUMMARY_TARGET: &str = "teravm::summary";

/// Longest log line written to a log path, newline included: a FIFO write
/// of at most `PIPE_BUF` bytes is atomic, so lines never interleave.
const MAX_LINE_BYTES: usize = 4096;

/// Errors of logger configuration.
#[derive(Debug, thiserror::Error)]
pub enum LoggerError {
    /// The log path could not be opened.
    #[error("cannot open the log path {path}: {source}")]
    Open {
        /// The path.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
}

struct Settings {
    sink: Option<SharedSink>,
    show_level: bool,
    show_origin: bool,
    module: Option<String>,
    instance_id: String,
}

struct Logger {
    start: Instant,
    settings: Mutex<Settings>,
}

/// Log lines dropped so far because the log path (or the output queue in
/// front of it) had no room for them.
pub fn missed_lines() -> u64 {
    crate::output::missed_log_lines()
}

/// The wall-clock time in the local time zone, as Firecracker writes it
/// (`%Y-%m-%dT%H:%M:%S.%9f`).
fn local_time() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let secs = libc::time_t::try_from(now.as_secs()).unwrap_or(0);
    // SAFETY: `tm` is plain data that localtime_r fills; both pointers are
    // to live locals; the result is checked.
    let tm = unsafe {
        let mut tm: libc::tm = std::mem::zeroed();
        if libc::localtime_r(&secs, &mut tm).is_null() {
            return format!("{}.{:09}", now.as_secs(), now.subsec_nanos());
        }
        tm
    };
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:09}",
        tm.tm_year + 1900,
        tm.tm_mon + 1,
        tm.tm_mday,
        tm.tm_hour,
        tm.tm_min,
        tm.tm_sec,
        now.subsec_nanos()
    )
}

impl Logger {
    /// Writes one record (through the module filter when `filtered`).
    /// Formats under the settings' lock, queues after it is released.
    fn write(&self, record: &log::Record, filtered: bool) {
        let s = self.settings.lock().unwrap_or_else(|p| p.into_inner());
        if let (true, Some(module)) = (filtered, &s.module) {
            if !record.module_path().is_some_and(|m| m.starts_with(module)) {
                return;
            }
        }
        let thread = std::thread::current();
        let thread = thread.name().unwrap_or("-");
        let origin = || {
            format!(
                "{}:{}",
                record.file().unwrap_or("?"),
                record.line().unwrap_or(0)
            )
        };
        if s.sink.is_none() {
            if record.target() == SUMMARY_TARGET {
                return;
            }
            let t = self.start.elapsed();
            let mut tag = format!("{:>4}.{:03}s", t.as_secs(), t.subsec_millis());
            if s.show_level {
                tag.push_str(&format!(" {:<5}", record.level()));
            }
            tag.push(' ');
            tag.push_str(thread);
            if s.show_origin {
                tag.push(' ');
                tag.push_str(&origin());
            }
            drop(s);
            crate::output::line(&format!("[{tag}] {}", record.args()));
            return;
        }
        let mut tag = format!("{}:{thread}", s.instance_id);
        if s.show_level {
            tag.push_str(&format!(":{}", record.level()));
        }
        if s.show_origin {
            tag.push(':');
            tag.push_str(&origin());
        }
        let mut line = format!("{} [{tag}] {}", local_time(), record.args());
        line.retain(|c| c != '\n' && c != '\r');
        if line.len() >= MAX_LINE_BYTES {
            let mut cut = MAX_LINE_BYTES - 1;
            while !line.is_char_boundary(cut) {
                cut -= 1;
            }
            line.truncate(cut);
        }
        line.push('\n');
        if let Some(sink) = s.sink.clone() {
            drop(s);
            crate::output::log_line(&sink, line.into_bytes());
        }
    }
}

impl log::Log for Logger {
    fn enabled(&self, metadata: &log::Metadata) -> bool {
        metadata.level() <= log::max_level()
    }

    fn log(&self, record: &log::Record) {
        if self.enabled(record.metadata()) {
            self.write(record, true);
        }
    }

    fn flush(&self) {}
}

fn logger() -> &'static Logger {
    static LOGGER: OnceLock<Logger> = OnceLock::new();
    LOGGER.get_or_init(|| Logger {
        start: Instant::now(),
        settings: Mutex::new(Settings {
            sink: None,
            show_level: true,
            show_origin: false,
            module: None,
            instance_id: "anonymous-instance".into(),
        }),
    })
}

/// When the logger was installed: the start of the process, for the log's
/// timestamps and the boot timer.
pub fn process_start() -> Instant {
    logger().start
}

/// Installs the logger at `level` (once; later calls only change the level).
pub fn init(level: log::LevelFilter) {
    let _ = log::set_logger(logger());
    log::set_max_level(level);
}

/// The instance id shown in the lines written to a log path.
pub fn set_instance_id(id: &str) {
    logger()
        .settings
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .instance_id = id.to_string();
}

/// Applies `config` (the flags, the config file's `logger` section or
/// `PUT /logger`): absent fields keep their value. `log_file` is
/// `config.log_path` as the `files` thread opened it (append-only,
/// non-blocking), so a bad path was refused before anything changed.
pub fn configure(config: &LoggerConfig, log_file: Option<File>) -> Result<(), LoggerError> {
    let sink = match (&config.log_path, log_file) {
        (Some(path), Some(file)) => Some(LineSink::from_file(file, path)),
        (Some(path), None) => {
            return Err(LoggerError::Open {
                path: path.clone(),
                source: io::Error::other("the log path was not opened"),
            })
        }
        (None, _) => None,
    };
    let logger = logger();
    let _ = log::set_logger(logger);
    let mut s = logger.settings.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(sink) = sink {
        s.sink = Some(Arc::new(Mutex::new(sink)));
    }
    if let Some(show) = config.show_level {
        s.show_level = show;
    }
    if let Some(show) = config.show_log_origin {
        s.show_origin = show;
    }
    if let Some(module) = &config.module {
        s.module = Some(module.clone());
    }
    let changed_target = config.log_path.is_some();
    drop(s);
    if let Some(level) = config.level {
        log::set_max_level(level.0);
    }
    if changed_target {
        // The first line of a new log target, whatever the level and module
        // filter (as Firecracker's header line).
        logger.write(
            &log::Record::builder()
                .args(format_args!(
                    "Running teravm v{}",
                    env!("CARGO_PKG_VERSION")
                ))
                .level(log::Level::Info)
                .target(module_path!())
                .module_path(Some(module_path!()))
                .file(Some(file!()))
                .line(Some(line!()))
                .build(),
            false,
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::LogLevel;

    #[test]
    fn levels_in_every_spelling() {
        for (s, f) in [
            ("Off", log::LevelFilter::Off),
            ("ERROR", log::LevelFilter::Error),
            ("Warning", log::LevelFilter::Warn),
            ("WARN", log::LevelFilter::Warn),
            ("warn", log::LevelFilter::Warn),
            ("Info", log::LevelFilter::Info),
            ("Debug", log::LevelFilter::Debug),
            ("trace", log::LevelFilter::Trace),
        ] {
            assert_eq!(s.parse::<LogLevel>().unwrap(), LogLevel(f), "{s}");
        }
        let e = "loud".parse::<LogLevel>().unwrap_err().to_string();
        assert!(e.contains("\"loud\"") && e.contains("Warning"), "{e}");
        let l: LogLevel = serde_json::from_str("\"Debug\"").unwrap();
        assert_eq!(serde_json::to_string(&l).unwrap(), "\"Debug\"");
        assert!(serde_json::from_str::<LogLevel>("3").is_err());
    }

    #[test]
    fn local_time_has_firecrackers_shape() {
        let t = local_time();
        assert_eq!(t.len(), "2024-01-02T03:04:05.123456789".len(), "{t}");
        assert_eq!(&t[4..5], "-");
        assert_eq!(&t[10..11], "T");
        assert_eq!(&t[19..20], ".");
    }
}
