//! teravm's own output: the log lines, warnings, the shutdown summary, the
//! final error line and the terminal progress line. Like the guest console
//! ([`crate::devices::console`]), it goes through one bounded buffer that a
//! single writer drains, so no thread that serves a guest, a client or the
//! event loop ever writes to a host descriptor that can block.
//!
//! What it owns: the process-wide queue ([`OutputQueue`], one static
//! instance), the long-lived writer thread `output` that drains it, and
//! [`LineSink`], the non-blocking line writer that the log path and the
//! metrics path share.
//! How the threads talk: any thread pushes an entry (a line for stderr,
//! raw bytes for stderr, or a log record for the log path's
//! [`LineSink`]); the queue's mutex is held only to move an entry in or
//! out, never across a system call other than a futex wake. A push never
//! waits: what does not fit in [`OUTPUT_BUFFER_BYTES`] is dropped and
//! counted ([`dropped_lines`], [`dropped_bytes`] for stderr;
//! [`missed_log_lines`] for the log path), and so is everything pushed
//! while one write of the writer has been waiting on the host for
//! [`STALL_AFTER`] (a stderr nobody reads): the count then says at once
//! that output is being lost, not only once the queue is full. What is
//! queued or being written then is kept, for a reader who comes back. The
//! `output` thread takes the
//! whole queue at once and writes it to fd 2 (a blocking write: a stderr
//! nobody reads stalls only this thread) or to the log path's sink (opened
//! non-blocking). At exit, [`flush`] waits a bounded time for the queue to
//! drain, so that a reader who reads gets the summary and a full stderr
//! delays the exit by at most that time; a writer stuck in the host then
//! ends with the process.
//!
//! The binary spawns the writer with [`start`] first thing in `main`,
//! after [`crate::seccomp::prepare`] and before any other thread or
//! filter; the writer installs [`crate::seccomp::Role::Output`] as its
//! first statement. Until it runs (and in library users and unit tests that
//! never call [`start`]), pushed output waits in the queue.
//!
//! The SIGSYS handler cannot use the queue (it is not async-signal-safe);
//! it writes to fd 2 itself after a bounded `poll` (`seccomp::sigsys`).

use std::cell::Cell;
use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Bytes of teravm's own output the queue holds before further output is
/// dropped (a few thousand log lines; the writer also holds at most this
/// much while it writes).
pub const OUTPUT_BUFFER_BYTES: usize = 256 * 1024;

/// A write of the writer that has waited this long on the host marks its
/// destination as stalled: further output is dropped and counted until the
/// write returns.
pub const STALL_AFTER: Duration = Duration::from_millis(100);

/// How long the binary waits at exit for its output to be written.
pub const EXIT_FLUSH_WAIT: Duration = Duration::from_millis(200);

/// A log path's sink, shared by the logger (which queues records for it)
/// and the writer (the only thread that writes to it).
pub type SharedSink = Arc<Mutex<LineSink>>;

/// A file or FIFO written one line at a time without ever blocking: opened
/// `O_NONBLOCK`; a line the reader has no room for is dropped (the caller
/// counts it); the tail of a line written in part is kept and sent before
/// the next line, so lines are never cut or interleaved.
#[derive(Debug)]
pub struct LineSink {
    file: File,
    path: PathBuf,
    pending: Vec<u8>,
}

impl LineSink {
    /// A sink over `file`, already opened for appending (by the `files`
    /// thread, non-blocking) from `path`.
    pub fn from_file(file: File, path: &Path) -> LineSink {
        LineSink {
            file,
            path: path.to_path_buf(),
            pending: Vec::new(),
        }
    }

    /// The path it writes to.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes `line` (which ends with a newline); false if it was dropped.
    pub fn write_line(&mut self, line: &[u8]) -> bool {
        if !self.pending.is_empty() {
            match self.file.write(&self.pending) {
                Ok(n) => {
                    self.pending.drain(..n);
                }
                Err(_) => return false,
            }
            if !self.pending.is_empty() {
                return false;
            }
        }
        match self.file.write(line) {
            Ok(n) if n == line.len() => true,
            Ok(n) => {
                self.pending.extend_from_slice(&line[n..]);
                true
            }
            Err(_) => false,
        }
    }
}

/// Where an entry goes.
enum Dest {
    /// fd 2.
    Stderr,
    /// A log path.
    Log(SharedSink),
}

/// One queued piece of output.
struct Entry {
    dest: Dest,
    bytes: Vec<u8>,
    /// A whole line (counted in [`dropped_lines`]); raw bytes (the progress
    /// line's redraws) count only as bytes.
    is_line: bool,
}

struct State {
    entries: VecDeque<Entry>,
    /// Bytes in `entries`.
    queued_bytes: usize,
    /// The writer holds a batch it has not finished writing.
    busy: bool,
    /// When the writer's write under way began (none between writes).
    writing_since: Option<Instant>,
    /// A writer drains this queue.
    has_writer: bool,
}

/// A bounded queue of output and its drop counts; the binary's is static
/// ([`start`], [`line()`], ...), tests make their own.
pub struct OutputQueue {
    state: Mutex<State>,
    /// Signalled when entries arrive.
    more: Condvar,
    /// Signalled when the writer has written everything queued.
    drained: Condvar,
    capacity: usize,
    dropped_lines: AtomicU64,
    dropped_bytes: AtomicU64,
    missed_log_lines: AtomicU64,
}

impl std::fmt::Debug for OutputQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutputQueue")
            .field("capacity", &self.capacity)
            .field("dropped_lines", &self.dropped_lines())
            .field("dropped_bytes", &self.dropped_bytes())
            .field("missed_log_lines", &self.missed_log_lines())
            .finish()
    }
}

impl OutputQueue {
    /// An empty queue of `capacity` bytes, with no writer yet.
    pub const fn new(capacity: usize) -> OutputQueue {
        OutputQueue {
            state: Mutex::new(State {
                entries: VecDeque::new(),
                queued_bytes: 0,
                busy: false,
                writing_since: None,
                has_writer: false,
            }),
            more: Condvar::new(),
            drained: Condvar::new(),
            capacity,
            dropped_lines: AtomicU64::new(0),
            dropped_bytes: AtomicU64::new(0),
            missed_log_lines: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Held only to move entries, never across I/O; a panic cannot
        // happen while it is held, but a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues `entry` if it fits and the writer is not stalled, else drops
    /// and counts it. Never blocks on the host.
    fn push(&self, entry: Entry) {
        let len = entry.bytes.len();
        let mut s = self.lock();
        let stalled = s.writing_since.is_some_and(|t| t.elapsed() >= STALL_AFTER);
        if !stalled && s.queued_bytes + len <= self.capacity {
            s.queued_bytes += len;
            s.entries.push_back(entry);
            drop(s);
            self.more.notify_one();
        } else {
            drop(s);
            self.count_lost(&entry);
        }
    }

    /// Counts `entry` as lost (not queued, or not written).
    fn count_lost(&self, entry: &Entry) {
        match entry.dest {
            Dest::Stderr => {
                if entry.is_line {
                    self.dropped_lines.fetch_add(1, Ordering::Relaxed);
                }
                self.dropped_bytes
                    .fetch_add(entry.bytes.len() as u64, Ordering::Relaxed);
            }
            Dest::Log(_) => {
                self.missed_log_lines.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Queues `text` and a newline for stderr.
    pub fn line(&self, text: &str) {
        let mut bytes = Vec::with_capacity(text.len() + 1);
        bytes.extend_from_slice(text.as_bytes());
        bytes.push(b'\n');
        self.push(Entry {
            dest: Dest::Stderr,
            bytes,
            is_line: true,
        });
    }

    /// Queues raw bytes for stderr (no newline added; counted as bytes).
    pub fn raw(&self, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        self.push(Entry {
            dest: Dest::Stderr,
            bytes: bytes.to_vec(),
            is_line: false,
        });
    }

    /// Queues one log line (newline included) for a log path's sink.
    pub fn log_line(&self, sink: &SharedSink, line: Vec<u8>) {
        self.push(Entry {
            dest: Dest::Log(sink.clone()),
            bytes: line,
            is_line: true,
        });
    }

    /// Lines for stderr that were dropped (the queue was full) or failed to
    /// be written.
    pub fn dropped_lines(&self) -> u64 {
        self.dropped_lines.load(Ordering::Relaxed)
    }

    /// Bytes for stderr (lines and raw bytes) dropped or failed.
    pub fn dropped_bytes(&self) -> u64 {
        self.dropped_bytes.load(Ordering::Relaxed)
    }

    /// Log lines for a log path that were dropped (the queue was full, or
    /// the sink had no room).
    pub fn missed_log_lines(&self) -> u64 {
        self.missed_log_lines.load(Ordering::Relaxed)
    }

    /// Waits at most `wait` until everything queued so far is written.
    /// True if it was; at once (true only if empty) without a writer.
    pub fn flush(&self, wait: Duration) -> bool {
        let deadline = Instant::now() + wait;
        let mut s = self.lock();
        if !s.has_writer {
            return s.entries.is_empty();
        }
        while s.busy || !s.entries.is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            s = self
                .drained
                .wait_timeout(s, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        true
    }

    /// Marks the queue as drained by a writer (or not): set before the
    /// writer is spawned, so that a flush right after waits for it.
    fn set_writer(&self, has_writer: bool) {
        self.lock().has_writer = has_writer;
    }

    /// The writer's side: waits for entries and takes them all, so the
    /// queue is free again while they are written.
    fn take(&self) -> VecDeque<Entry> {
        let mut s = self.lock();
        while s.entries.is_empty() {
            s = self.more.wait(s).unwrap_or_else(|p| p.into_inner());
        }
        s.busy = true;
        s.queued_bytes = 0;
        std::mem::take(&mut s.entries)
    }

    /// The writer's side: done with the batch it took.
    fn batch_done(&self) {
        let mut s = self.lock();
        s.busy = false;
        if s.entries.is_empty() {
            self.drained.notify_all();
        }
    }

    /// The writer's loop: writes each entry to `stderr` or its sink,
    /// counting what fails. Never returns.
    fn drain(&self, stderr: &mut dyn Write) -> ! {
        loop {
            for entry in self.take() {
                self.lock().writing_since = Some(Instant::now());
                let written = match &entry.dest {
                    Dest::Stderr => stderr.write_all(&entry.bytes).is_ok(),
                    Dest::Log(sink) => sink
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .write_line(&entry.bytes),
                };
                self.lock().writing_since = None;
                if !written {
                    self.count_lost(&entry);
                }
            }
            self.batch_done();
        }
    }
}

/// fd 2, written without std's stderr lock (which another thread's
/// `eprintln!` could hold).
struct Fd2;

impl Write for Fd2 {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        // SAFETY: writes at most `buf.len()` bytes from a live slice to fd 2.
        let n = unsafe { libc::write(libc::STDERR_FILENO, buf.as_ptr().cast(), buf.len()) };
        usize::try_from(n).map_err(|_| io::Error::last_os_error())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The process's queue.
static OUTPUT: OutputQueue = OutputQueue::new(OUTPUT_BUFFER_BYTES);

thread_local! {
    /// Whether this thread is the `output` writer (which must not wait on
    /// its own queue).
    static IS_WRITER: Cell<bool> = const { Cell::new(false) };
}

/// Starts the `output` thread (once; later calls do nothing). Call it
/// before any other thread is started and after
/// [`crate::seccomp::prepare`]: the thread installs its own filter. It is
/// started with every asynchronous signal blocked, so that SIGTERM and its
/// kin, which the event loop reads from a signalfd, never land on it.
pub fn start() -> io::Result<()> {
    static STARTED: AtomicBool = AtomicBool::new(false);
    if STARTED.swap(true, Ordering::AcqRel) {
        return Ok(());
    }
    OUTPUT.set_writer(true);
    let old = block_async_signals();
    let spawned = std::thread::Builder::new().name("output".into()).spawn(|| {
        crate::seccomp::install_thread(crate::seccomp::Role::Output);
        IS_WRITER.with(|w| w.set(true));
        OUTPUT.drain(&mut Fd2)
    });
    restore_signals(&old);
    if spawned.is_err() {
        OUTPUT.set_writer(false);
        STARTED.store(false, Ordering::Release);
    }
    spawned.map(|_| ())
}

/// Blocks every signal but the synchronous ones (a fault, a filter's
/// SIGSYS, an abort) in the calling thread; returns the mask before.
fn block_async_signals() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data that sigfillset/sigdelset initialise;
    // pthread_sigmask reads `set` and writes the old mask into `old`, both
    // live locals.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut set);
        for sync in [
            libc::SIGSYS,
            libc::SIGSEGV,
            libc::SIGBUS,
            libc::SIGFPE,
            libc::SIGILL,
            libc::SIGTRAP,
            libc::SIGABRT,
        ] {
            libc::sigdelset(&mut set, sync);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old);
        old
    }
}

fn restore_signals(old: &libc::sigset_t) {
    // SAFETY: `old` is the mask pthread_sigmask returned; no old mask wanted.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, old, std::ptr::null_mut()) };
}

/// Whether the calling thread is the `output` writer.
pub fn is_writer_thread() -> bool {
    IS_WRITER.with(Cell::get)
}

/// Queues one of teravm's own lines for stderr (a newline is added).
pub fn line(text: &str) {
    OUTPUT.line(text);
}

/// Queues raw bytes for stderr (the terminal progress line).
pub fn raw(bytes: &[u8]) {
    OUTPUT.raw(bytes);
}

/// Queues a log line (newline included) for the log path's `sink`.
pub fn log_line(sink: &SharedSink, line: Vec<u8>) {
    OUTPUT.log_line(sink, line);
}

/// Waits at most `wait` for teravm's queued output to be written (at exit;
/// at once from the writer itself). True if it was.
pub fn flush(wait: Duration) -> bool {
    if is_writer_thread() {
        return false;
    }
    OUTPUT.flush(wait)
}

/// Lines of teravm's own output that stderr did not take (dropped when the
/// queue was full, or failed to be written).
pub fn dropped_lines() -> u64 {
    OUTPUT.dropped_lines()
}

/// Bytes of teravm's own output that stderr did not take.
pub fn dropped_bytes() -> u64 {
    OUTPUT.dropped_bytes()
}

/// Log lines that did not reach the log path.
pub fn missed_log_lines() -> u64 {
    OUTPUT.missed_log_lines()
}

#[cfg(test)]
#[path = "output_tests.rs"]
mod tests;
