//! A live progress line on stderr while populate and reclaim run, when
//! stderr is a terminal (plain lines otherwise: the summary and the log).
//! A `progress` thread redraws it every [`TICK`] from the atomic counters
//! and hands the bytes to [`crate::output`]'s bounded queue: a terminal
//! that stops reading stalls only the `output` writer; the redraws it has
//! no room for are dropped and counted.

use std::io::IsTerminal;
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::time::{Duration, Instant};

use crate::memory::{PopulateProgress, ReclaimReport};

/// How often the line is redrawn.
pub const TICK: Duration = Duration::from_millis(200);

const GIB: f64 = (1u64 << 30) as f64;

/// How long dropping the line waits for the thread to queue its erase
/// (so that it comes before the summary).
const ERASE_WAIT: Duration = Duration::from_millis(100);

/// The running progress line; dropping it erases the line.
pub struct ProgressLine {
    stop: Option<Sender<()>>,
    /// Disconnected when the thread has drawn its last and erased the line.
    ended: Option<Receiver<()>>,
}

impl ProgressLine {
    /// Starts redrawing `render()` on stderr if stderr is a terminal.
    pub fn spawn(render: impl Fn(Duration) -> String + Send + 'static) -> ProgressLine {
        if !std::io::stderr().is_terminal() {
            return ProgressLine {
                stop: None,
                ended: None,
            };
        }
        let (stop, stopped) = channel::<()>();
        let (ended_tx, ended) = channel::<()>();
        let started = Instant::now();
        let spawned = std::thread::Builder::new()
            .name("progress".into())
            .spawn(move || {
                crate::seccomp::install_thread(crate::seccomp::Role::Progress);
                let _ended = ended_tx;
                loop {
                    write_stderr(format!("\r\x1b[K{}", render(started.elapsed())).as_bytes());
                    if !matches!(stopped.recv_timeout(TICK), Err(RecvTimeoutError::Timeout)) {
                        write_stderr(b"\r\x1b[K");
                        break;
                    }
                }
            });
        match spawned {
            Ok(_) => ProgressLine {
                stop: Some(stop),
                ended: Some(ended),
            },
            Err(_) => ProgressLine {
                stop: None,
                ended: None,
            },
        }
    }
}

impl Drop for ProgressLine {
    fn drop(&mut self) {
        // The thread sees the channel close, queues the erase and ends;
        // wait a little for it (never long: it only queues).
        self.stop.take();
        if let Some(ended) = self.ended.take() {
            let _ = ended.recv_timeout(ERASE_WAIT);
        }
    }
}

/// Queues raw bytes for stderr, in order with teravm's lines.
fn write_stderr(bytes: &[u8]) {
    crate::output::raw(bytes);
}

/// `populate: 1.2 / 6.0 GiB, 2.4 GiB/s`.
pub fn populate_text(p: &PopulateProgress, elapsed: Duration) -> String {
    let done = p.bytes_done() as f64 / GIB;
    format!(
        "populate: {done:.1} / {:.1} GiB, {:.1} GiB/s",
        p.total_bytes() as f64 / GIB,
        done / elapsed.as_secs_f64().max(1e-3)
    )
}

/// `reclaim: 2.0 / 4.0 GiB, 12.3 GiB/s [n0 50% n1 40%]`.
pub fn reclaim_text(r: &ReclaimReport, elapsed: Duration) -> String {
    let done = r.address_bytes_done as f64 / GIB;
    let nodes: Vec<String> = r
        .nodes
        .iter()
        .map(|n| {
            let pct = (n.address_bytes_done * 100)
                .checked_div(n.address_bytes)
                .unwrap_or(100);
            format!("n{} {pct}%", n.node)
        })
        .collect();
    format!(
        "reclaim: {done:.1} / {:.1} GiB, {:.1} GiB/s [{}]",
        r.address_bytes as f64 / GIB,
        done / elapsed.as_secs_f64().max(1e-3),
        nodes.join(" ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::{NodeReport, ReclaimOptions};

    #[test]
    fn texts() {
        let p = PopulateProgress::new();
        assert_eq!(
            populate_text(&p, Duration::from_secs(1)),
            "populate: 0.0 / 0.0 GiB, 0.0 GiB/s"
        );
        let mut r =
            ReclaimReport::planned(&[(0, 2 << 30), (1, 2 << 30)], &ReclaimOptions::default());
        r.address_bytes_done = 2 << 30;
        r.nodes = vec![
            NodeReport {
                node: 0,
                address_bytes: 2 << 30,
                address_bytes_done: 1 << 30,
                resident_bytes_freed: 0,
                workers: 2,
                elapsed_ms: 0,
            },
            NodeReport {
                node: 1,
                address_bytes: 2 << 30,
                address_bytes_done: 1 << 30,
                resident_bytes_freed: 0,
                workers: 2,
                elapsed_ms: 0,
            },
        ];
        assert_eq!(
            reclaim_text(&r, Duration::from_millis(500)),
            "reclaim: 2.0 / 4.0 GiB, 4.0 GiB/s [n0 50% n1 50%]"
        );
    }
}
