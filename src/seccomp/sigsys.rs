//! The SIGSYS handler: a filter's `SECCOMP_RET_TRAP` lands here. It writes
//! one fixed line to stderr naming the system call and the thread, then ends
//! the process with [`EXIT_BAD_SYSCALL`]; the kernel frees its memory.
//!
//! Async-signal-safe: the handler reads a thread-local byte array (filled
//! with the thread's name before its filter was installed; a worker, which
//! installs none, asks `prctl(PR_GET_NAME)`), formats into a stack buffer,
//! and calls `poll(2)`, `write(2)` and `_exit(2)`; every filter allows these
//! calls. It cannot use teravm's output queue ([`crate::output`]): it
//! writes to fd 2 itself, but only after `poll` said within
//! [`STDERR_WAIT_MS`] that fd 2 has room ([`write_stderr_bounded`]), so a
//! stderr nobody reads drops the line instead of hanging the process.

use std::cell::Cell;
use std::sync::Once;

use super::syscall_names;
use super::SeccompError;

/// Exit code of a process that made a system call its filter forbids
/// (Firecracker's `FcExitCode::BadSyscall` is the same number).
pub const EXIT_BAD_SYSCALL: i32 = 148;

/// How long the handler waits for room on stderr before it gives up on
/// its line.
pub(super) const STDERR_WAIT_MS: i32 = 100;

/// Bytes of a thread name, as the kernel keeps it (`comm`, 15 + NUL).
const NAME_LEN: usize = 16;

thread_local! {
    /// This thread's name, NUL-padded, for the handler. A `const` thread
    /// local without a destructor: reading it is a plain TLS load.
    static THREAD_NAME: Cell<[u8; NAME_LEN]> = const { Cell::new([0; NAME_LEN]) };
}

/// `si_code` of a SIGSYS sent by seccomp.
const SYS_SECCOMP: i32 = 1;

/// The start of a `siginfo_t` for SIGSYS (the kernel's `_sigsys` member of
/// the union, which the libc crate does not expose on Linux).
#[repr(C)]
struct SigsysInfo {
    signo: i32,
    errno: i32,
    code: i32,
    _pad: i32,
    call_addr: *mut libc::c_void,
    syscall: i32,
    arch: u32,
}

/// Remembers the calling thread's kernel name (`prctl(PR_GET_NAME)`) for
/// the handler. Call it before the thread's filter is installed.
pub(super) fn remember_thread_name() {
    let mut name = [0u8; NAME_LEN];
    // SAFETY: PR_GET_NAME writes at most 16 bytes into the buffer, which
    // has 16.
    let rc = unsafe { libc::prctl(libc::PR_GET_NAME, name.as_mut_ptr()) };
    if rc != 0 {
        name[..1].copy_from_slice(b"?");
    }
    THREAD_NAME.with(|n| n.set(name));
}

/// Installs the handler for the whole process, once.
pub(super) fn install_handler() -> Result<(), SeccompError> {
    static ONCE: Once = Once::new();
    static mut FAILED: Option<i32> = None;
    ONCE.call_once(|| {
        // SAFETY: a zeroed sigaction is a valid value (empty mask, no flags).
        let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
        action.sa_sigaction = on_sigsys as *const () as libc::sighandler_t;
        action.sa_flags = libc::SA_SIGINFO;
        // SAFETY: `action` is initialised, its handler is an
        // `extern "C" fn(c_int, *mut siginfo_t, *mut c_void)` as SA_SIGINFO
        // wants; the old action is not wanted.
        let rc = unsafe { libc::sigaction(libc::SIGSYS, &action, std::ptr::null_mut()) };
        if rc != 0 {
            let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
            // SAFETY: written once, inside `call_once`, before any reader.
            unsafe { FAILED = Some(errno) };
        }
    });
    // SAFETY: only read after `call_once` has finished writing it.
    match unsafe { *std::ptr::addr_of!(FAILED) } {
        Some(errno) => Err(SeccompError::SigsysHandler(
            std::io::Error::from_raw_os_error(errno),
        )),
        None => Ok(()),
    }
}

/// A fixed-size line being written without allocating.
struct Line {
    buf: [u8; 256],
    len: usize,
}

impl Line {
    fn push(&mut self, bytes: &[u8]) {
        for &b in bytes {
            if self.len < self.buf.len() {
                self.buf[self.len] = b;
                self.len += 1;
            }
        }
    }

    fn push_hex(&mut self, mut v: u64) {
        self.push(b"0x");
        let mut digits = [0u8; 16];
        let mut i = digits.len();
        loop {
            i -= 1;
            digits[i] = b"0123456789abcdef"[(v & 0xf) as usize];
            v >>= 4;
            if v == 0 {
                break;
            }
        }
        self.push(&digits[i..]);
    }

    fn push_number(&mut self, n: i64) {
        if n < 0 {
            self.push(b"-");
        }
        let mut digits = [0u8; 20];
        let mut i = digits.len();
        let mut v = n.unsigned_abs();
        loop {
            i -= 1;
            digits[i] = b'0' + (v % 10) as u8;
            v /= 10;
            if v == 0 {
                break;
            }
        }
        self.push(&digits[i..]);
    }
}

/// The message for a forbidden call `nr` with its first three arguments
/// made by thread `name`.
fn message(nr: i64, args: [u64; 3], name: &[u8; NAME_LEN]) -> Line {
    let mut line = Line {
        buf: [0; 256],
        len: 0,
    };
    let name_len = name.iter().position(|&b| b == 0).unwrap_or(NAME_LEN);
    line.push(b"teravm: seccomp: thread ");
    line.push(&name[..name_len]);
    line.push(b" made a forbidden system call ");
    line.push_number(nr);
    line.push(b" (");
    line.push(syscall_names::name(nr).as_bytes());
    line.push(b") with arguments ");
    for (i, arg) in args.into_iter().enumerate() {
        if i > 0 {
            line.push(b", ");
        }
        line.push_hex(arg);
    }
    line.push(b"; exiting with code ");
    line.push_number(i64::from(EXIT_BAD_SYSCALL));
    line.push(b"\n");
    line
}

/// The first three arguments of the trapped call, from the registers the
/// kernel saved (`rdi`, `rsi`, `rdx`): an `ioctl`'s request number, a
/// `prctl`'s option, an `mmap`'s protection.
fn trapped_args(ctx: *mut libc::c_void) -> [u64; 3] {
    #[cfg(all(target_arch = "x86_64", target_env = "gnu"))]
    {
        // SAFETY: a SA_SIGINFO handler's third argument is the interrupted
        // context, a valid `ucontext_t`; we only read its saved registers.
        let gregs = unsafe { &(*ctx.cast::<libc::ucontext_t>()).uc_mcontext.gregs };
        let reg = |r: libc::c_int| gregs[r as usize] as u64;
        [reg(libc::REG_RDI), reg(libc::REG_RSI), reg(libc::REG_RDX)]
    }
    #[cfg(not(all(target_arch = "x86_64", target_env = "gnu")))]
    {
        let _ = ctx;
        [0; 3]
    }
}

extern "C" fn on_sigsys(_signo: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel hands a SA_SIGINFO handler a valid siginfo_t, whose
    // layout for SIGSYS starts as `SigsysInfo` (the kernel's `_sigsys`).
    let info = unsafe { &*info.cast::<SigsysInfo>() };
    if info.code != SYS_SECCOMP {
        // A SIGSYS sent by someone else (kill -SYS): not a filter's verdict.
        return;
    }
    let mut name = THREAD_NAME.with(Cell::get);
    if name[0] == 0 {
        // A thread that installed no filter of its own (a worker, under its
        // spawner's): ask the kernel; every filter allows PR_GET_NAME.
        // SAFETY: PR_GET_NAME writes at most 16 bytes into `name` (16).
        unsafe { libc::prctl(libc::PR_GET_NAME, name.as_mut_ptr()) };
    }
    let line = message(i64::from(info.syscall), trapped_args(ctx), &name);
    write_stderr_bounded(&line.buf[..line.len]);
    // SAFETY: _exit(2) is async-signal-safe and ends the process at once.
    unsafe { libc::_exit(EXIT_BAD_SYSCALL) };
}

/// Writes `bytes` (at most a few hundred: one line) to fd 2 if `poll` says
/// within `STDERR_WAIT_MS` (100 ms) that it has room; drops them otherwise.
/// Async-signal-safe (`poll` and `write` only, no allocation, no lock).
/// A pipe that `poll` calls writable has a free buffer, which takes a
/// line this short without waiting; only another writer filling it in
/// between could still make the write wait.
pub fn write_stderr_bounded(bytes: &[u8]) {
    let mut pfd = libc::pollfd {
        fd: libc::STDERR_FILENO,
        events: libc::POLLOUT,
        revents: 0,
    };
    // SAFETY: one valid pollfd on our stack; a bounded wait.
    let ready = unsafe { libc::poll(&mut pfd, 1, STDERR_WAIT_MS) };
    if ready == 1 && pfd.revents & libc::POLLOUT != 0 {
        // SAFETY: writes `bytes.len()` bytes from a live slice to fd 2.
        unsafe { libc::write(libc::STDERR_FILENO, bytes.as_ptr().cast(), bytes.len()) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_message_names_the_call_and_the_thread() {
        let mut name = [0u8; NAME_LEN];
        name[..5].copy_from_slice(b"vcpu0");
        let line = message(libc::SYS_ioctl, [13, 0xae80, 0], &name);
        assert_eq!(
            std::str::from_utf8(&line.buf[..line.len]).unwrap(),
            "teravm: seccomp: thread vcpu0 made a forbidden system call 16 (ioctl) with \
             arguments 0xd, 0xae80, 0x0; exiting with code 148\n"
        );
        let line = message(-7, [u64::MAX; 3], &[b'x'; NAME_LEN]);
        let text = std::str::from_utf8(&line.buf[..line.len]).unwrap();
        assert!(text.contains("thread xxxxxxxxxxxxxxxx made"), "{text}");
        assert!(
            text.contains("call -7 (?) with arguments 0xffffffffffffffff,"),
            "{text}"
        );
        assert!(text.ends_with("exiting with code 148\n"), "{text}");
    }

    #[test]
    fn the_thread_name_is_the_kernels() {
        std::thread::Builder::new()
            .name("sigsys-name".into())
            .spawn(|| {
                remember_thread_name();
                let name = THREAD_NAME.with(Cell::get);
                assert_eq!(&name[..12], b"sigsys-name\0");
            })
            .unwrap()
            .join()
            .unwrap();
    }
}
