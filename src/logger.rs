//! A minimal `log` backend: one line per record on stderr, with the time
//! since start, the level and the thread's name (`vcpu0`, `reclaim-n1-0`).

use std::io::Write;
use std::sync::OnceLock;
use std::time::Instant;

struct StderrLogger {
    start: Instant,
}

impl log::Log for StderrLogger {
    fn enabled(&self, metadata: &log::Metadata) -> bool {
        metadata.level() <= log::max_level()
    }

    fn log(&self, record: &log::Record) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let t = self.start.elapsed();
        let thread = std::thread::current();
        let _ = writeln!(
            std::io::stderr().lock(),
            "[{:>4}.{:03}s {:<5} {}] {}",
            t.as_secs(),
            t.subsec_millis(),
            record.level(),
            thread.name().unwrap_or("?"),
            record.args()
        );
    }

    fn flush(&self) {}
}

/// Installs the logger at `level` (once; later calls only change the level).
pub fn init(level: log::LevelFilter) {
    static LOGGER: OnceLock<StderrLogger> = OnceLock::new();
    let logger = LOGGER.get_or_init(|| StderrLogger {
        start: Instant::now(),
    });
    let _ = log::set_logger(logger);
    log::set_max_level(level);
}
