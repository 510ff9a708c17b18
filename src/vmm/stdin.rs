//! Console input: the host's stdin to a Linux guest's ttyS0 (COM1's receive
//! FIFO), read on the event loop without ever blocking it.
//!
//! Only while a Linux guest runs, and only when stdin is a pipe (or socket)
//! or a terminal this process has in the foreground (not `/dev/null`, a
//! regular file, a closed stdin, or a terminal of a background job, which a
//! read or a mode change would stop with SIGTTIN/SIGTTOU). The loop reads
//! stdin once per readiness event, hands the UART what fits in its 64-byte
//! FIFO, and keeps the rest in a bounded [`InputBuffer`]
//! ([`INPUT_BUFFER_BYTES`]; beyond it bytes are dropped and counted). While
//! bytes wait, a timerfd retries every [`RETRY_PERIOD`] (the guest reading
//! its FIFO tells the VMM nothing). A terminal is put in raw mode (no line
//! editing, no echo, no signal keys: Ctrl-C goes to the guest, as in
//! Firecracker) and restored when the guest stops running, when the
//! process exits, and on a panic.

use std::collections::VecDeque;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::{Mutex, Once};
use std::time::Duration;

use event_manager::{EventOps, EventSet, Events};

use super::{Vmm, TOKEN_STDIN, TOKEN_STDIN_RETRY};
use crate::devices::SerialConsole;
use crate::vmm::lifecycle::Phase;

/// Most bytes of console input kept while the guest's FIFO is full.
pub const INPUT_BUFFER_BYTES: usize = 4096;
/// How often waiting input is offered to the UART again.
pub const RETRY_PERIOD: Duration = Duration::from_millis(10);
const STDIN_FD: RawFd = 0;

/// What happened to the console input, for the log at the end.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct InputStats {
    /// Bytes read from stdin.
    pub read_bytes: u64,
    /// Bytes handed to the UART.
    pub given_bytes: u64,
    /// Bytes dropped because the buffer was full.
    pub dropped_bytes: u64,
}

/// Input waiting for the guest: at most `capacity` bytes, the rest dropped
/// and counted.
#[derive(Debug)]
pub struct InputBuffer {
    bytes: VecDeque<u8>,
    capacity: usize,
    stats: InputStats,
}

impl InputBuffer {
    /// An empty buffer of `capacity` bytes.
    pub fn new(capacity: usize) -> Self {
        InputBuffer {
            bytes: VecDeque::with_capacity(capacity),
            capacity,
            stats: InputStats::default(),
        }
    }

    /// Keeps what fits of `input`; returns how many bytes were dropped.
    pub fn push(&mut self, input: &[u8]) -> usize {
        let room = self.capacity - self.bytes.len();
        let kept = room.min(input.len());
        self.bytes.extend(&input[..kept]);
        let dropped = input.len() - kept;
        self.stats.read_bytes += input.len() as u64;
        self.stats.dropped_bytes += dropped as u64;
        dropped
    }

    /// Offers the waiting bytes, oldest first, to `take`, which returns how
    /// many it took; removes those. Returns the number taken.
    pub fn drain_into(&mut self, mut take: impl FnMut(&[u8]) -> usize) -> usize {
        let taken = take(self.bytes.make_contiguous()).min(self.bytes.len());
        self.bytes.drain(..taken);
        self.stats.given_bytes += taken as u64;
        taken
    }

    /// Bytes waiting.
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// Whether nothing waits.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// The counters so far.
    pub fn stats(&self) -> InputStats {
        self.stats
    }
}

/// What stdin is, for console input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputKind {
    /// A pipe or a socket.
    Pipe,
    /// A terminal this process has in the foreground.
    Terminal,
}

/// What kind of console input `fd` can give, or `None` (closed, `/dev/null`
/// or another non-terminal device, a regular file, a background terminal).
pub fn input_kind(fd: RawFd) -> Option<InputKind> {
    // SAFETY: `st` is a plain struct on our stack for the kernel to fill.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat only writes into `st`; a closed `fd` fails with EBADF.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return None;
    }
    match st.st_mode & libc::S_IFMT {
        libc::S_IFIFO | libc::S_IFSOCK => Some(InputKind::Pipe),
        // SAFETY: isatty, tcgetpgrp and getpgrp only read process state.
        libc::S_IFCHR if unsafe { libc::isatty(fd) } == 1 => {
            // SAFETY: as above.
            let foreground = unsafe { libc::tcgetpgrp(fd) == libc::getpgrp() };
            foreground.then_some(InputKind::Terminal)
        }
        _ => None,
    }
}

/// The terminal's settings before raw mode, for the panic hook.
static SAVED_TERMIOS: Mutex<Option<(RawFd, libc::termios)>> = Mutex::new(None);
static PANIC_HOOK: Once = Once::new();

fn restore_saved() {
    let saved = SAVED_TERMIOS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take();
    if let Some((fd, t)) = saved {
        // SAFETY: `t` is the termios tcgetattr gave for `fd`.
        unsafe { libc::tcsetattr(fd, libc::TCSANOW, &t) };
    }
}

/// A terminal in raw mode (ICANON, ECHO and ISIG off), put back as it was
/// when dropped, or by the panic hook.
#[derive(Debug)]
pub struct RawMode {
    fd: RawFd,
}

impl RawMode {
    /// Puts terminal `fd` in raw mode.
    pub fn enter(fd: RawFd) -> std::io::Result<RawMode> {
        // SAFETY: `t` is a plain struct on our stack for the kernel to fill.
        let mut t: libc::termios = unsafe { std::mem::zeroed() };
        // SAFETY: tcgetattr only writes into `t`.
        if unsafe { libc::tcgetattr(fd, &mut t) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        *SAVED_TERMIOS.lock().unwrap_or_else(|p| p.into_inner()) = Some((fd, t));
        PANIC_HOOK.call_once(|| {
            let previous = std::panic::take_hook();
            std::panic::set_hook(Box::new(move |info| {
                restore_saved();
                previous(info);
            }));
        });
        let mut raw = t;
        raw.c_lflag &= !(libc::ICANON | libc::ECHO | libc::ISIG);
        // SAFETY: `raw` is a valid termios derived from the terminal's own.
        if unsafe { libc::tcsetattr(fd, libc::TCSANOW, &raw) } != 0 {
            let e = std::io::Error::last_os_error();
            SAVED_TERMIOS
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take();
            return Err(e);
        }
        Ok(RawMode { fd })
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        let _ = self.fd;
        restore_saved();
    }
}

/// A non-blocking timerfd for the retries: `set(true)` fires every
/// [`RETRY_PERIOD`], `set(false)` stops it (and forgets expiries not read).
#[derive(Debug)]
struct RetryTimer {
    fd: vmm_sys_util::timerfd::TimerFd,
}

impl RetryTimer {
    fn new() -> std::io::Result<RetryTimer> {
        let fd = crate::util::nonblocking_timer()?;
        Ok(RetryTimer { fd })
    }

    fn set(&mut self, on: bool) -> std::io::Result<()> {
        let done = match on {
            true => self.fd.reset(RETRY_PERIOD, Some(RETRY_PERIOD)),
            false => self.fd.clear(),
        };
        Ok(done?)
    }

    /// Reads the expiry count, if any (never blocks).
    fn ack(&mut self) {
        let _ = self.fd.wait();
    }
}

/// stdin feeding a guest's COM1, while attached to the event loop.
#[derive(Debug)]
pub struct ConsoleInput {
    buffer: InputBuffer,
    retry: RetryTimer,
    retry_armed: bool,
    _raw: Option<RawMode>,
    /// Whether stdin is still watched (until EOF or an error).
    reading: bool,
}

impl ConsoleInput {
    fn new(kind: InputKind) -> std::io::Result<ConsoleInput> {
        let retry = RetryTimer::new()?;
        let raw = match kind {
            InputKind::Terminal => Some(RawMode::enter(STDIN_FD)?),
            InputKind::Pipe => None,
        };
        Ok(ConsoleInput {
            buffer: InputBuffer::new(INPUT_BUFFER_BYTES),
            retry,
            retry_armed: false,
            _raw: raw,
            reading: true,
        })
    }

    /// Reads what stdin has, never blocking: at most the bytes `FIONREAD`
    /// says are there (stdin's file description is shared with the
    /// process that started teravm, so it is not made non-blocking), and
    /// only after `poll` says it is readable or at its end; false at EOF or
    /// on an error.
    fn read_stdin(&mut self) -> bool {
        let mut chunk = [0u8; INPUT_BUFFER_BYTES];
        let mut pfd = libc::pollfd {
            fd: STDIN_FD,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd on our stack; no wait (timeout 0).
        if unsafe { libc::poll(&mut pfd, 1, 0) } <= 0 {
            return true;
        }
        let mut ready: libc::c_int = 0;
        // SAFETY: FIONREAD writes one int into `ready`.
        if unsafe { libc::ioctl(STDIN_FD, libc::FIONREAD, &mut ready) } != 0 {
            ready = 0;
        }
        let want = match usize::try_from(ready) {
            Ok(0) | Err(_) if pfd.revents & (libc::POLLHUP | libc::POLLERR) != 0 => chunk.len(),
            // Readable with nothing to read: another reader took the bytes.
            Ok(0) | Err(_) => return true,
            Ok(n) => n.min(chunk.len()),
        };
        // SAFETY: reads into our own buffer, at most its length; `want`
        // bytes are there (or the other end is gone: read returns 0).
        let n = unsafe { libc::read(STDIN_FD, chunk.as_mut_ptr().cast(), want) };
        match n {
            0 => false,
            n if n > 0 => {
                let dropped = self.buffer.push(&chunk[..n as usize]);
                if dropped > 0 {
                    log::debug!("console input: {dropped} bytes dropped, the guest reads slower");
                }
                true
            }
            _ => {
                let e = std::io::Error::last_os_error();
                match e.kind() {
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted => true,
                    _ => {
                        log::warn!("console input: reading stdin failed: {e}; no more input");
                        false
                    }
                }
            }
        }
    }

    /// Gives the UART what fits; (dis)arms the retry timer.
    fn flush(&mut self, serial: &Mutex<SerialConsole>) {
        if !self.buffer.is_empty() {
            let mut uart = serial.lock().unwrap_or_else(|p| p.into_inner());
            self.buffer.drain_into(|b| uart.enqueue_input(b));
        }
        let want = !self.buffer.is_empty();
        if want != self.retry_armed {
            match self.retry.set(want) {
                Ok(()) => self.retry_armed = want,
                Err(e) => log::warn!("console input: retry timer: {e}"),
            }
        }
    }
}

impl Vmm {
    /// Attaches stdin while a Linux guest runs, and detaches it (restoring
    /// the terminal) once it no longer does. Called after every event.
    pub(in crate::vmm) fn sync_console_input(&mut self, ops: &mut EventOps) {
        let running = matches!(&self.phase, Phase::Running(m) if m.console_input.is_some());
        match (&self.console_input, running) {
            (None, true) if !self.console_input_tried => {
                self.console_input_tried = true;
                let Some(kind) = input_kind(STDIN_FD) else {
                    return;
                };
                let input = match ConsoleInput::new(kind) {
                    Ok(i) => i,
                    Err(e) => {
                        log::warn!("console input: cannot use stdin: {e}");
                        return;
                    }
                };
                let sources = [
                    (STDIN_FD, TOKEN_STDIN),
                    (input.retry.fd.as_raw_fd(), TOKEN_STDIN_RETRY),
                ];
                for (fd, token) in sources {
                    if let Err(e) = ops.add(Events::with_data_raw(fd, token, EventSet::IN)) {
                        log::warn!("console input: cannot watch source {token}: {e:?}");
                        return;
                    }
                }
                log::info!("console input: stdin ({kind:?}) to the guest's ttyS0");
                self.console_input = Some(input);
            }
            (Some(_), false) => {
                if let Some(input) = self.console_input.take() {
                    self.detach_console_input(input, ops);
                }
            }
            _ => {}
        }
    }

    fn detach_console_input(&mut self, input: ConsoleInput, ops: &mut EventOps) {
        if input.reading {
            let _ = ops.remove(Events::with_data_raw(STDIN_FD, TOKEN_STDIN, EventSet::IN));
        }
        let retry = input.retry.fd.as_raw_fd();
        let _ = ops.remove(Events::with_data_raw(
            retry,
            TOKEN_STDIN_RETRY,
            EventSet::IN,
        ));
        let s = input.buffer.stats();
        log::info!(
            "console input: {} bytes read from stdin, {} given to the guest, {} waiting, {} dropped",
            s.read_bytes,
            s.given_bytes,
            input.buffer.len(),
            s.dropped_bytes
        );
        // Dropping `input` restores the terminal.
    }

    /// stdin is readable, or the retry timer fired.
    pub(in crate::vmm) fn on_console_input(&mut self, token: u32, ops: &mut EventOps) {
        let Phase::Running(microvm) = &self.phase else {
            return;
        };
        let (Some(input), Some(serial)) = (self.console_input.as_mut(), &microvm.console_input)
        else {
            return;
        };
        if token == TOKEN_STDIN_RETRY {
            input.retry.ack();
        } else if input.reading && !input.read_stdin() {
            input.reading = false;
            let _ = ops.remove(Events::with_data_raw(STDIN_FD, TOKEN_STDIN, EventSet::IN));
            log::info!("console input: stdin ended");
        }
        input.flush(serial);
    }
}

#[cfg(test)]
#[path = "stdin_tests.rs"]
mod tests;
