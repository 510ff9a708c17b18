use super::*;
use crate::devices::bus::PioDevice;
use std::os::fd::{FromRawFd, IntoRawFd, OwnedFd};

#[test]
fn buffer_keeps_up_to_its_capacity_and_counts_the_rest() {
    let mut b = InputBuffer::new(8);
    assert_eq!(b.push(b"hello"), 0);
    assert_eq!(b.push(b"world"), 2);
    assert_eq!(b.len(), 8);
    let s = b.stats();
    assert_eq!((s.read_bytes, s.dropped_bytes, s.given_bytes), (10, 2, 0));
    // A sink that takes 3 bytes at a time sees the oldest first.
    let mut seen = Vec::new();
    assert_eq!(
        b.drain_into(|x| {
            seen.extend_from_slice(&x[..3]);
            3
        }),
        3
    );
    assert_eq!(seen, b"hel");
    // Room again: the new bytes queue behind the old ones (the ring wraps).
    assert_eq!(b.push(b"XYZ"), 0);
    let mut all = Vec::new();
    b.drain_into(|x| {
        all.extend_from_slice(x);
        x.len()
    });
    assert_eq!(all, b"loworXYZ");
    assert!(b.is_empty());
    assert_eq!(b.stats().given_bytes, 11);
    // A sink claiming more than it was offered takes only what there is.
    b.push(b"ab");
    assert_eq!(b.drain_into(|_| 100), 2);
}

#[test]
fn input_reaches_the_uart_fifo_as_the_guest_reads() {
    let irq = vmm_sys_util::eventfd::EventFd::new(libc::EFD_NONBLOCK).unwrap();
    let serial = Mutex::new(SerialConsole::with_irq(
        Vec::new(),
        crate::devices::SerialIrq::EventFd(irq.try_clone().unwrap()),
    ));
    // The guest's driver enables the received-data interrupt.
    serial.lock().unwrap().write(1, &[0x01]);
    let mut b = InputBuffer::new(INPUT_BUFFER_BYTES);
    let input: Vec<u8> = (0..100u8).collect();
    b.push(&input);
    let fill = |b: &mut InputBuffer| {
        let mut uart = serial.lock().unwrap();
        b.drain_into(|x| uart.enqueue_input(x))
    };
    assert_eq!(fill(&mut b), 64, "the 16550's FIFO holds 64 bytes");
    assert_eq!(b.len(), 36);
    assert_eq!(irq.read().unwrap(), 1, "the guest was interrupted");
    assert_eq!(fill(&mut b), 0, "nothing fits until the guest reads");
    // The guest reads 10 bytes from RBR, in order.
    for want in 0..10u8 {
        let mut d = [0u8];
        serial.lock().unwrap().read(0, &mut d);
        assert_eq!(d[0], want);
    }
    assert_eq!(fill(&mut b), 10);
    assert_eq!(b.len(), 26);
    let mut lsr = [0u8];
    serial.lock().unwrap().read(5, &mut lsr);
    assert_eq!(lsr[0] & 1, 1, "data ready");
    assert_eq!(b.stats().given_bytes, 74);
}

#[test]
fn only_pipes_and_foreground_terminals_are_input() {
    let null = std::fs::File::open("/dev/null").unwrap();
    assert_eq!(input_kind(null.as_raw_fd()), None, "/dev/null");
    let file = std::fs::File::open("Cargo.toml").unwrap();
    assert_eq!(input_kind(file.as_raw_fd()), None, "a regular file");
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: both are new descriptors that this test owns.
    let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    assert_eq!(input_kind(r.as_raw_fd()), Some(InputKind::Pipe));
    let closed = r.into_raw_fd();
    // SAFETY: closing the descriptor taken out of `r` above.
    unsafe { libc::close(closed) };
    drop(w);
    assert_eq!(input_kind(closed), None, "a closed descriptor");
}

/// A pseudo-terminal pair: (master, slave).
fn pty() -> (OwnedFd, OwnedFd) {
    // SAFETY: plain syscalls on descriptors this test owns; results checked.
    unsafe {
        let m = libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY);
        assert!(m >= 0);
        assert_eq!(libc::grantpt(m), 0);
        assert_eq!(libc::unlockpt(m), 0);
        let mut name = [0 as libc::c_char; 128];
        assert_eq!(libc::ptsname_r(m, name.as_mut_ptr(), name.len()), 0);
        let s = libc::open(name.as_ptr(), libc::O_RDWR | libc::O_NOCTTY);
        assert!(s >= 0);
        (OwnedFd::from_raw_fd(m), OwnedFd::from_raw_fd(s))
    }
}

fn lflag(fd: RawFd) -> libc::tcflag_t {
    // SAFETY: `t` is filled by tcgetattr, whose result is checked.
    unsafe {
        let mut t: libc::termios = std::mem::zeroed();
        assert_eq!(libc::tcgetattr(fd, &mut t), 0);
        t.c_lflag
    }
}

#[test]
fn raw_mode_is_undone_when_dropped() {
    let (_master, slave) = pty();
    let fd = slave.as_raw_fd();
    let before = lflag(fd);
    let cooked = libc::ICANON | libc::ECHO | libc::ISIG;
    assert_eq!(before & cooked, cooked, "a new pty is cooked");
    let raw = RawMode::enter(fd).unwrap();
    assert_eq!(lflag(fd) & cooked, 0);
    drop(raw);
    assert_eq!(lflag(fd), before);
    // Not a terminal: an error, and nothing saved for the panic hook.
    let null = std::fs::File::open("/dev/null").unwrap();
    assert!(RawMode::enter(null.as_raw_fd()).is_err());
    assert!(SAVED_TERMIOS.lock().unwrap().is_none());
}

#[test]
fn a_terminal_without_a_controlling_session_is_not_input() {
    // This process's pty slave is not its controlling terminal, so it has
    // no foreground group that is ours: reading it could stop the process.
    let (_master, slave) = pty();
    assert_eq!(input_kind(slave.as_raw_fd()), None);
}
