//! Tests of the output queue and its writer, and of [`LineSink`].

use super::*;
use std::sync::mpsc::{channel, Sender};

/// A stderr that hands each write to a channel.
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

/// A stderr whose first write never returns (a pipe nobody reads).
struct Stuck;
impl Write for Stuck {
    fn write(&mut self, _: &[u8]) -> io::Result<usize> {
        loop {
            std::thread::park();
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A stderr that is closed (EPIPE).
struct Broken;
impl Write for Broken {
    fn write(&mut self, _: &[u8]) -> io::Result<usize> {
        Err(io::Error::from_raw_os_error(libc::EPIPE))
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A queue of `capacity` bytes drained into `stderr` by a thread that
/// never ends (as the binary's).
fn spawn(capacity: usize, stderr: impl Write + Send + 'static) -> &'static OutputQueue {
    let q: &'static OutputQueue = Box::leak(Box::new(OutputQueue::new(capacity)));
    let mut stderr = stderr;
    q.set_writer(true);
    std::thread::spawn(move || q.drain(&mut stderr));
    q
}

#[test]
fn lines_and_bytes_arrive_in_order_and_flush_waits_for_them() {
    let (tx, rx) = channel();
    let q = spawn(1024, ToChannel(tx));
    q.line("one");
    q.raw(b"\r\x1b[K");
    q.line("two");
    assert!(q.flush(Duration::from_secs(10)));
    let got: Vec<u8> = rx.try_iter().flatten().collect();
    assert_eq!(got, b"one\n\r\x1b[Ktwo\n");
    assert_eq!((q.dropped_lines(), q.dropped_bytes()), (0, 0));
}

#[test]
fn a_stuck_stderr_never_blocks_a_push_and_flush_keeps_its_deadline() {
    let q = spawn(100, Stuck);
    // The first line goes to the stuck writer; then the queue fills.
    q.line("stuck in the host");
    while q.lock().writing_since.is_none() {
        std::thread::yield_now();
    }
    let started = Instant::now();
    for i in 0..10_000 {
        q.line(&format!("line {i:05}"));
    }
    q.raw(&[b'x'; 200]);
    let pushing = started.elapsed();
    assert!(pushing < Duration::from_secs(2), "{pushing:?}");
    // 100 bytes hold at most nine 11-byte lines (fewer if the write
    // counted as stalled meanwhile); the rest is dropped and counted.
    let queued = 10_000 - q.dropped_lines();
    assert!(queued <= 9, "{queued}");
    assert_eq!(q.dropped_bytes(), (10_000 - queued) * 11 + 200);
    let waited = Instant::now();
    assert!(!q.flush(Duration::from_millis(100)));
    let took = waited.elapsed();
    assert!(
        took >= Duration::from_millis(100) && took < Duration::from_secs(2),
        "{took:?}"
    );
}

#[test]
fn a_stalled_write_drops_what_comes_next_though_the_queue_has_room() {
    let q = spawn(1 << 20, Stuck);
    q.line("stuck in the host");
    while q.lock().writing_since.is_none() {
        std::thread::yield_now();
    }
    std::thread::sleep(STALL_AFTER + Duration::from_millis(20));
    for _ in 0..100 {
        q.line("dropped");
    }
    assert_eq!(q.dropped_lines(), 100);
    assert_eq!(q.dropped_bytes(), 800);
    assert!(q.lock().entries.is_empty());
}

#[test]
fn a_failed_write_is_counted() {
    let q = spawn(1024, Broken);
    q.line("lost");
    q.raw(b"also");
    assert!(q.flush(Duration::from_secs(10)));
    assert_eq!(q.dropped_lines(), 1);
    assert_eq!(q.dropped_bytes(), 9);
}

#[test]
fn without_a_writer_output_waits_and_flush_returns_at_once() {
    let q = OutputQueue::new(8);
    q.line("1234567");
    q.line("x");
    assert_eq!(q.dropped_lines(), 1);
    let started = Instant::now();
    assert!(!q.flush(Duration::from_secs(10)));
    assert!(started.elapsed() < Duration::from_secs(1));
    assert_eq!(q.take().len(), 1);
}

#[test]
fn log_lines_go_to_their_sink() {
    let dir = std::env::temp_dir().join(format!("teravm-output-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let path = dir.join("log");
    let file = std::fs::File::create(&path).unwrap();
    let sink: SharedSink = Arc::new(Mutex::new(LineSink::from_file(file, &path)));
    let (tx, rx) = channel();
    let q = spawn(1024, ToChannel(tx));
    q.log_line(&sink, b"to the log\n".to_vec());
    q.line("to stderr");
    assert!(q.flush(Duration::from_secs(10)));
    assert_eq!(std::fs::read(&path).unwrap(), b"to the log\n");
    let got: Vec<u8> = rx.try_iter().flatten().collect();
    assert_eq!(got, b"to stderr\n");
    assert_eq!(q.missed_log_lines(), 0);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_fifo_nobody_reads_drops_lines_instead_of_blocking() {
    let dir = std::env::temp_dir().join(format!("teravm-logger-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let fifo = dir.join("log.fifo");
    let _ = std::fs::remove_file(&fifo);
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path; the result is checked.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let opened = crate::files::open(&crate::files::OpenRequest {
        what: "test",
        path: fifo.clone(),
        spec: crate::files::OpenSpec::Output { blocking: false },
    })
    .unwrap();
    let mut sink = LineSink::from_file(opened.file, &fifo);
    let line = [b'x'; 1023]
        .iter()
        .copied()
        .chain([b'\n'])
        .collect::<Vec<u8>>();
    // A pipe holds 64 KiB by default: well before 1,000 lines of 1 KiB
    // the writes must start failing, and none of them may block.
    let written = (0..1000).filter(|_| sink.write_line(&line)).count();
    assert!(written > 0 && written < 1000, "{written}");
    let _ = std::fs::remove_dir_all(&dir);
}
