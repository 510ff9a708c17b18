//! The file calls of the memory file, on raw pointers into guest memory
//! (the kernel copies; no Rust reference to guest memory is made): `pwrite`
//! from a mapping, `pread` into one, and the data extents of a file by
//! `lseek(SEEK_DATA / SEEK_HOLE)`.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, RawFd};

/// Writes `len` bytes read from host address `src` to `file` at `offset`,
/// one `pwrite` after another until all are written (a short write goes
/// on; `EINTR` retries; a write of 0 is `WriteZero`).
///
/// # Safety
/// `src..src+len` is readable memory of this process for the whole call.
pub(super) unsafe fn pwrite_all(file: &File, src: usize, len: u64, offset: u64) -> io::Result<()> {
    // SAFETY: the caller's contract is `positioned_all`'s for a write.
    unsafe { positioned_all(file, src, len, offset, Io::Write) }
}

/// Reads `len` bytes of `file` at `offset` into host address `dst`, one
/// `pread` after another until all are read; the end of the file before
/// that is `UnexpectedEof`.
///
/// # Safety
/// `dst..dst+len` is writable memory of this process for the whole call,
/// which nothing reads as a Rust reference meanwhile.
pub(super) unsafe fn pread_exact(file: &File, dst: usize, len: u64, offset: u64) -> io::Result<()> {
    // SAFETY: the caller's contract is `positioned_all`'s for a read.
    unsafe { positioned_all(file, dst, len, offset, Io::Read) }
}

/// Which way [`positioned_all`] copies.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Io {
    /// `pread` into memory.
    Read,
    /// `pwrite` from memory.
    Write,
}

/// `pread` or `pwrite` of `len` bytes at host address `addr` and file
/// `offset`, one call after another until all are done (a short one goes
/// on; `EINTR` retries; 0 bytes is `UnexpectedEof` for a read, `WriteZero`
/// for a write).
///
/// # Safety
/// `addr..addr+len` is memory of this process for the whole call: readable
/// for a write; writable, and read by nothing as a Rust reference, for a
/// read.
unsafe fn positioned_all(
    file: &File,
    addr: usize,
    len: u64,
    offset: u64,
    way: Io,
) -> io::Result<()> {
    let mut done = 0u64;
    while done < len {
        let at = libc::off64_t::try_from(offset + done)
            .map_err(|_| io::Error::from_raw_os_error(libc::EFBIG))?;
        let want = usize::try_from(len - done).unwrap_or(usize::MAX);
        let at_addr = (addr + done as usize) as *mut libc::c_void;
        let n = match way {
            // SAFETY: the caller guarantees the range is readable; the
            // kernel reads at most `want` bytes from `at_addr`, inside it.
            Io::Write => unsafe { libc::pwrite64(file.as_raw_fd(), at_addr, want, at) },
            // SAFETY: the caller guarantees the range is writable and not
            // borrowed; the kernel writes at most `want` bytes from `at_addr`.
            Io::Read => unsafe { libc::pread64(file.as_raw_fd(), at_addr, want, at) },
        };
        match n {
            n if n > 0 => done += n as u64,
            0 if way == Io::Read => return Err(io::Error::from(io::ErrorKind::UnexpectedEof)),
            0 => return Err(io::Error::from(io::ErrorKind::WriteZero)),
            _ => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
    Ok(())
}

/// `lseek(fd, offset, whence)`; `None` for `ENXIO` (no data at or after
/// `offset`, or `offset` at or past the end).
fn seek(fd: RawFd, offset: u64, whence: libc::c_int) -> io::Result<Option<u64>> {
    let at =
        libc::off64_t::try_from(offset).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: lseek on a descriptor touches no memory of this process; a
    // bad descriptor is an error return. Only its return value is used (the
    // file position it moves is never read: all I/O here is positioned).
    let r = unsafe { libc::lseek64(fd, at, whence) };
    if r >= 0 {
        return Ok(Some(r as u64));
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::ENXIO) => Ok(None),
        _ => Err(e),
    }
}

/// What [`data_extents`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Extents {
    /// The extents were given to the callback.
    Walked,
    /// The file has no `SEEK_DATA` (`ESPIPE`, `EINVAL`: guest_memfd, some
    /// file systems): nothing was given; the caller decides.
    Unsupported,
}

/// Calls `f(start, end)` for each data extent of `fd` within `start..end`
/// (file offsets, clipped to the window), in order. `SEEK_HOLE` counts the
/// end of the file as a hole, so nothing past it is given.
pub(super) fn data_extents(
    fd: RawFd,
    start: u64,
    end: u64,
    f: &mut dyn FnMut(u64, u64) -> io::Result<()>,
) -> io::Result<Extents> {
    let mut pos = start;
    while pos < end {
        let data = match seek(fd, pos, libc::SEEK_DATA) {
            Ok(Some(d)) => d,
            Ok(None) => break,
            Err(e)
                if pos == start
                    && matches!(e.raw_os_error(), Some(libc::ESPIPE | libc::EINVAL)) =>
            {
                return Ok(Extents::Unsupported)
            }
            Err(e) => return Err(e),
        };
        if data >= end {
            break;
        }
        let hole = seek(fd, data, libc::SEEK_HOLE)?.unwrap_or(end).min(end);
        if hole <= data {
            return Err(io::Error::other("SEEK_HOLE went backwards"));
        }
        f(data, hole)?;
        pos = hole;
    }
    Ok(Extents::Walked)
}
