//! The host side of the guest console. vCPU threads hand the UART's output
//! bytes to a bounded [`ConsoleBuffer`] and move on: they never wait on the
//! host. One `console` thread ([`ConsoleWriter`]) drains the buffer to its
//! sinks (stdout, the `--serial-file`). When the host side does not keep up
//! (a stopped reader of a pipe, a full disk), the buffer fills and further
//! bytes are dropped and counted; a sink that fails (EPIPE, EIO, its size
//! cap) is closed and what it would have got is counted too. At shutdown
//! [`ConsoleWriter::finish`] waits a bounded time for the buffer to drain and
//! leaves a writer stuck in the host behind rather than wait on it.

use std::collections::VecDeque;
use std::io::{self, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Bytes the buffer holds before vCPUs' output is dropped.
pub const CONSOLE_BUFFER_BYTES: usize = 64 * 1024;

/// Errors of starting the console writer.
#[derive(Debug, thiserror::Error)]
pub enum ConsoleError {
    /// The `console` thread could not be spawned.
    #[error("cannot spawn the console thread: {0}")]
    Spawn(io::Error),
}

/// What the console did, for the final report and the metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ConsoleStats {
    /// Bytes the guest wrote to the console.
    pub guest_bytes: u64,
    /// Bytes that reached no sink: dropped while the buffer was full, left
    /// in it at shutdown, or refused by every sink.
    pub dropped_bytes: u64,
}

struct Queue {
    bytes: VecDeque<u8>,
    /// No more bytes will come: the writer drains what is left and ends.
    closed: bool,
    /// Bytes the writer took and has not finished writing.
    in_flight: u64,
}

/// The bounded buffer between the vCPUs and the `console` thread.
pub struct ConsoleBuffer {
    queue: Mutex<Queue>,
    /// Signalled when bytes arrive or the buffer is closed.
    more: Condvar,
    /// Signalled when the writer has drained the buffer.
    drained: Condvar,
    capacity: usize,
    guest_bytes: AtomicU64,
    dropped_bytes: AtomicU64,
    first_byte: OnceLock<Instant>,
}

impl std::fmt::Debug for ConsoleBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConsoleBuffer")
            .field("capacity", &self.capacity)
            .field("stats", &self.stats())
            .finish()
    }
}

impl ConsoleBuffer {
    /// An empty buffer of `capacity` bytes.
    pub fn new(capacity: usize) -> Arc<ConsoleBuffer> {
        Arc::new(ConsoleBuffer {
            queue: Mutex::new(Queue {
                bytes: VecDeque::with_capacity(capacity.min(CONSOLE_BUFFER_BYTES)),
                closed: false,
                in_flight: 0,
            }),
            more: Condvar::new(),
            drained: Condvar::new(),
            capacity,
            guest_bytes: AtomicU64::new(0),
            dropped_bytes: AtomicU64::new(0),
            first_byte: OnceLock::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Queue> {
        // The lock is only held to move bytes in and out, never across I/O.
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes the guest's bytes: queues what fits and drops (and counts) the
    /// rest. Never blocks on the host.
    pub fn push(&self, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        self.first_byte.get_or_init(Instant::now);
        self.guest_bytes
            .fetch_add(bytes.len() as u64, Ordering::Relaxed);
        let mut q = self.lock();
        let room = if q.closed {
            0
        } else {
            self.capacity.saturating_sub(q.bytes.len())
        };
        let taken = room.min(bytes.len());
        q.bytes.extend(&bytes[..taken]);
        drop(q);
        if taken < bytes.len() {
            self.count_dropped((bytes.len() - taken) as u64);
        }
        if taken > 0 {
            self.more.notify_one();
        }
    }

    fn count_dropped(&self, n: u64) {
        self.dropped_bytes.fetch_add(n, Ordering::Relaxed);
    }

    /// When the guest first wrote to its console (the firmware's first line:
    /// the boot timer's mark).
    pub fn first_byte_at(&self) -> Option<Instant> {
        self.first_byte.get().copied()
    }

    /// The counts so far.
    pub fn stats(&self) -> ConsoleStats {
        ConsoleStats {
            guest_bytes: self.guest_bytes.load(Ordering::Relaxed),
            dropped_bytes: self.dropped_bytes.load(Ordering::Relaxed),
        }
    }

    /// Waits for bytes; `None` once closed and empty. Returns everything
    /// queued at once, so the queue is free again while the writer writes.
    fn take(&self) -> Option<Vec<u8>> {
        let mut q = self.lock();
        loop {
            if !q.bytes.is_empty() {
                q.in_flight = q.bytes.len() as u64;
                return Some(q.bytes.drain(..).collect());
            }
            if q.closed {
                return None;
            }
            q = self.more.wait(q).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// The writer is done with what it took last.
    fn batch_done(&self) {
        let mut q = self.lock();
        q.in_flight = 0;
        if q.bytes.is_empty() {
            self.drained.notify_all();
        }
    }

    /// Closes the buffer and waits until the writer has drained it or
    /// `deadline` passes; bytes still queued or in a write stuck in the
    /// host then are counted as dropped.
    fn close_and_drain(&self, deadline: Instant) {
        let mut q = self.lock();
        q.closed = true;
        self.more.notify_all();
        while q.in_flight > 0 || !q.bytes.is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                let stuck = q.bytes.len() as u64 + q.in_flight;
                q.bytes.clear();
                q.in_flight = 0;
                drop(q);
                self.count_dropped(stuck);
                return;
            }
            q = self
                .drained
                .wait_timeout(q, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

/// The UART's output side: what vm-superio's `Serial` writes into.
#[derive(Debug, Clone)]
pub struct ConsoleOut(Arc<ConsoleBuffer>);

impl ConsoleOut {
    /// Output into `buffer`.
    pub fn new(buffer: Arc<ConsoleBuffer>) -> Self {
        ConsoleOut(buffer)
    }
}

impl Write for ConsoleOut {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.push(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// One place the console's bytes go.
pub struct ConsoleSink {
    name: String,
    out: Box<dyn Write + Send>,
    /// Bytes this sink may still take (a `--serial-file` size cap).
    budget: Option<u64>,
}

impl ConsoleSink {
    /// A sink called `name` (for the log) writing to `out`, taking at most
    /// `max_bytes` in all when given.
    pub fn new(
        name: impl Into<String>,
        out: Box<dyn Write + Send>,
        max_bytes: Option<u64>,
    ) -> Self {
        ConsoleSink {
            name: name.into(),
            out,
            budget: max_bytes,
        }
    }

    /// Writes `bytes`; returns how many it refused (over its cap) or an
    /// error that closes it.
    fn write(&mut self, bytes: &[u8]) -> io::Result<u64> {
        let take = match self.budget {
            Some(left) => usize::try_from(left).unwrap_or(usize::MAX).min(bytes.len()),
            None => bytes.len(),
        };
        self.out.write_all(&bytes[..take])?;
        self.out.flush()?;
        if let Some(left) = &mut self.budget {
            *left -= take as u64;
        }
        Ok((bytes.len() - take) as u64)
    }
}

/// The `console` thread and the buffer it drains.
pub struct ConsoleWriter {
    buffer: Arc<ConsoleBuffer>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for ConsoleWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConsoleWriter")
            .field("buffer", &self.buffer)
            .finish()
    }
}

impl ConsoleWriter {
    /// Starts the `console` thread draining a new buffer of `capacity`
    /// bytes into `sinks`. `on_first_output` runs on that thread when the
    /// guest's first bytes arrive (the boot timer).
    pub fn spawn(
        capacity: usize,
        sinks: Vec<ConsoleSink>,
        on_first_output: Option<Box<dyn FnOnce(Instant) + Send>>,
    ) -> Result<ConsoleWriter, ConsoleError> {
        let buffer = ConsoleBuffer::new(capacity);
        let shared = buffer.clone();
        let thread = std::thread::Builder::new()
            .name("console".into())
            .spawn(move || {
                crate::seccomp::install_thread(crate::seccomp::Role::Console);
                drain(&shared, sinks, on_first_output)
            })
            .map_err(ConsoleError::Spawn)?;
        Ok(ConsoleWriter {
            buffer,
            thread: Some(thread),
        })
    }

    /// The buffer the UART writes into.
    pub fn buffer(&self) -> &Arc<ConsoleBuffer> {
        &self.buffer
    }

    /// Ends the console: waits at most `wait` for the queued bytes to be
    /// written, then returns the counts. A writer still stuck in the host
    /// (a pipe nobody reads) is left behind, not joined; it ends with the
    /// process.
    pub fn finish(mut self, wait: Duration) -> ConsoleStats {
        self.buffer.close_and_drain(Instant::now() + wait);
        if let Some(thread) = self.thread.take() {
            if thread.is_finished() {
                let _ = thread.join();
            }
        }
        self.buffer.stats()
    }
}

impl Drop for ConsoleWriter {
    fn drop(&mut self) {
        if self.thread.is_some() {
            // Not finished explicitly (an error path): close without waiting.
            self.buffer.close_and_drain(Instant::now());
        }
    }
}

fn drain(
    buffer: &ConsoleBuffer,
    mut sinks: Vec<ConsoleSink>,
    mut on_first_output: Option<Box<dyn FnOnce(Instant) + Send>>,
) {
    let mut logged_drops = false;
    while let Some(bytes) = buffer.take() {
        if let (Some(f), Some(at)) = (on_first_output.take(), buffer.first_byte_at()) {
            f(at);
        }
        let mut delivered = false;
        sinks.retain_mut(|sink| match sink.write(&bytes) {
            Ok(refused) => {
                delivered |= refused < bytes.len() as u64;
                if refused > 0 {
                    log::warn!(
                        "console: {} reached its size cap; its further output is dropped",
                        sink.name
                    );
                    return false;
                }
                true
            }
            Err(e) => {
                log::warn!("console: writing to {} failed ({e}); closing it", sink.name);
                false
            }
        });
        if !delivered {
            buffer.count_dropped(bytes.len() as u64);
        }
        buffer.batch_done();
        if !logged_drops && buffer.stats().dropped_bytes > 0 {
            logged_drops = true;
            log::warn!(
                "console: the host side does not keep up; guest output is dropped and counted"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::{channel, Sender};

    /// A sink that hands each write to a channel.
    struct ToChannel(Sender<Vec<u8>>);
    impl Write for ToChannel {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            let _ = self.0.send(buf.to_vec());
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    /// A sink that blocks forever on its first write (a pipe nobody reads).
    struct Stuck(Mutex<()>, Condvar);
    impl Write for Stuck {
        fn write(&mut self, _: &[u8]) -> io::Result<usize> {
            let g = self.0.lock().unwrap();
            let _g = self.1.wait_while(g, |_| true).unwrap();
            unreachable!()
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    struct Broken;
    impl Write for Broken {
        fn write(&mut self, _: &[u8]) -> io::Result<usize> {
            Err(io::Error::from_raw_os_error(libc::EPIPE))
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn bytes_reach_every_sink() {
        let (tx, rx) = channel();
        let (tx2, rx2) = channel();
        let (first_tx, first_rx) = channel();
        let w = ConsoleWriter::spawn(
            1024,
            vec![
                ConsoleSink::new("a", Box::new(ToChannel(tx)), None),
                ConsoleSink::new("b", Box::new(ToChannel(tx2)), None),
            ],
            Some(Box::new(move |at| first_tx.send(at).unwrap())),
        )
        .unwrap();
        let mut out = ConsoleOut::new(w.buffer().clone());
        out.write_all(b"hello\n").unwrap();
        let w_first = w.buffer().first_byte_at();
        assert!(w_first.is_some());
        let stats = w.finish(Duration::from_secs(10));
        assert_eq!(first_rx.try_recv().ok(), w_first);
        let got: Vec<u8> = rx.try_iter().flatten().collect();
        let got2: Vec<u8> = rx2.try_iter().flatten().collect();
        assert_eq!(got, b"hello\n");
        assert_eq!(got2, b"hello\n");
        assert_eq!(
            stats,
            ConsoleStats {
                guest_bytes: 6,
                dropped_bytes: 0
            }
        );
    }

    #[test]
    fn a_stuck_sink_never_blocks_the_guest_and_drops_are_counted() {
        let w = ConsoleWriter::spawn(
            16,
            vec![ConsoleSink::new(
                "stuck",
                Box::new(Stuck(Mutex::new(()), Condvar::new())),
                None,
            )],
            None,
        )
        .unwrap();
        let buffer = w.buffer().clone();
        // Far more than the buffer holds: every push returns at once.
        for _ in 0..1000 {
            buffer.push(b"0123456789");
        }
        let start = Instant::now();
        let stats = w.finish(Duration::from_millis(100));
        assert!(start.elapsed() < Duration::from_secs(5));
        assert_eq!(stats.guest_bytes, 10_000);
        // Nothing got anywhere: the write in flight is stuck, so every byte
        // is counted.
        assert_eq!(stats.dropped_bytes, 10_000, "{stats:?}");
    }

    #[test]
    fn a_failed_sink_is_closed_and_its_bytes_counted() {
        let w = ConsoleWriter::spawn(
            1024,
            vec![ConsoleSink::new("broken", Box::new(Broken), None)],
            None,
        )
        .unwrap();
        w.buffer().push(b"lost");
        let stats = w.finish(Duration::from_secs(10));
        assert_eq!(stats.dropped_bytes, 4);
    }

    #[test]
    fn a_size_cap_stops_a_sink() {
        let (tx, rx) = channel();
        let w = ConsoleWriter::spawn(
            1024,
            vec![ConsoleSink::new("capped", Box::new(ToChannel(tx)), Some(3))],
            None,
        )
        .unwrap();
        w.buffer().push(b"abcdef");
        let stats = w.finish(Duration::from_secs(10));
        let got: Vec<u8> = rx.try_iter().flatten().collect();
        assert_eq!(got, b"abc");
        assert_eq!(stats.guest_bytes, 6);
    }
}
