//! Small host helpers that several layers need, one copy each: a
//! non-blocking timerfd, a clock's time (the process CPU time), the
//! `poll`/`epoll_wait` timeout for a wait, and the text of a panic. It
//! depends on nothing else in the crate, so any module may use it (memory
//! and devices included) without reaching above its layer.

use std::any::Any;
use std::os::fd::FromRawFd;
use std::time::Duration;

use vmm_sys_util::timerfd::TimerFd;

/// A disarmed, non-blocking, close-on-exec `CLOCK_MONOTONIC` timer: rust-vmm's
/// [`TimerFd`] (arm it with `reset`, disarm it with `clear`, read the
/// expirations with `wait`), created with `TFD_NONBLOCK` so that a read with
/// nothing pending fails with `EAGAIN` instead of blocking the event loop.
/// (`TimerFd::new` makes a blocking one; making it non-blocking afterwards
/// would take an `fcntl(F_SETFL)`.) Its calls: `timerfd_create` here,
/// `timerfd_settime` (`reset`, `clear`) and `read` (`wait`) after; not
/// `is_armed`, which is `timerfd_gettime`.
pub fn nonblocking_timer() -> std::io::Result<TimerFd> {
    // SAFETY: plain syscall; the result is checked.
    let fd = unsafe {
        libc::timerfd_create(
            libc::CLOCK_MONOTONIC,
            libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` is a new timerfd that nothing else owns.
    Ok(unsafe { TimerFd::from_raw_fd(fd) })
}

/// The time of `clock` in microseconds (0 if the clock cannot be read).
pub fn clock_us(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec for the call to fill.
    if unsafe { libc::clock_gettime(clock, &mut ts) } != 0 {
        return 0;
    }
    (ts.tv_sec as u64) * 1_000_000 + (ts.tv_nsec as u64) / 1_000
}

/// The CPU time this process has used, in microseconds
/// (`CLOCK_PROCESS_CPUTIME_ID`: a `clock_gettime` call, not the vDSO).
pub fn process_cpu_us() -> u64 {
    clock_us(libc::CLOCK_PROCESS_CPUTIME_ID)
}

/// The timeout in milliseconds for `poll` or `epoll_wait` to wait `left`:
/// rounded up, so that a sub-millisecond rest waits instead of spinning; at
/// most `i32::MAX`; -1 (forever) for `None`.
pub fn poll_timeout_ms(left: Option<Duration>) -> i32 {
    left.map_or(-1, |d| {
        i32::try_from(d.as_nanos().div_ceil(1_000_000)).unwrap_or(i32::MAX)
    })
}

/// What a panic said: its payload when that is a `&str` or a `String`.
pub fn panic_text(payload: &(dyn Any + Send)) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("no message")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_timer_fires_and_never_blocks() {
        let mut t = nonblocking_timer().unwrap();
        assert!(t.wait().is_err(), "disarmed: EAGAIN, not a block");
        t.reset(Duration::from_millis(1), Some(Duration::from_millis(1)))
            .unwrap();
        std::thread::sleep(Duration::from_millis(5));
        assert!(t.wait().unwrap() >= 1);
        t.clear().unwrap();
        assert!(t.wait().is_err(), "cleared: nothing pending");
    }

    #[test]
    fn poll_timeouts_round_up() {
        assert_eq!(poll_timeout_ms(None), -1);
        assert_eq!(poll_timeout_ms(Some(Duration::ZERO)), 0);
        assert_eq!(poll_timeout_ms(Some(Duration::from_micros(300))), 1);
        assert_eq!(poll_timeout_ms(Some(Duration::from_millis(7))), 7);
        assert_eq!(poll_timeout_ms(Some(Duration::from_micros(7001))), 8);
        assert_eq!(poll_timeout_ms(Some(Duration::MAX)), i32::MAX);
    }

    #[test]
    fn panic_texts() {
        let s = std::panic::catch_unwind(|| panic!("plain")).unwrap_err();
        assert_eq!(panic_text(&*s), "plain");
        let n = 3;
        let f = std::panic::catch_unwind(|| panic!("formatted {n}")).unwrap_err();
        assert_eq!(panic_text(&*f), "formatted 3");
        let o = std::panic::catch_unwind(|| std::panic::panic_any(7u8)).unwrap_err();
        assert_eq!(panic_text(&*o), "no message");
    }

    #[test]
    fn process_cpu_time_moves() {
        let before = process_cpu_us();
        let mut x = 0u64;
        for i in 0..5_000_000u64 {
            x = std::hint::black_box(x.wrapping_add(i));
        }
        assert!(process_cpu_us() >= before);
        assert!(before > 0);
    }
}
