//! userfaultfd guest memory, Firecracker's `Uffd` memory backend, in its
//! protocol so that its page fault handlers serve teravm: a userfaultfd
//! (`O_CLOEXEC | O_NONBLOCK`, kernel faults too, `UFFD_FEATURE_EVENT_REMOVE`
//! as Firecracker asks), each RAM slice registered for missing pages, then
//! one message on a connection to the handler's Unix socket: the JSON list
//! of [`GuestRegionUffdMapping`] with the userfaultfd as `SCM_RIGHTS`.
//!
//! teravm keeps the userfaultfd and the connection for the memory's life
//! (a session owned by the mappings, dropped after they are unmapped).
//! A missing page is then filled only by the handler: a thread that touches
//! one waits until it is served. No thread of this module waits on guest
//! memory; the connection's `connect` and `sendmsg` wait at most
//! [`HANDSHAKE_TIMEOUT`] for a handler that does not accept.
//!
//! Who waits on a handler that never answers (or died: teravm's copy of
//! the userfaultfd keeps it open, so faults wait rather than fail): every
//! thread that reads or writes a page it has not served. The vCPUs (in
//! KVM; a signal, the kick, ends the wait), the device threads (virtio
//! queues and buffers through a view; nothing ends their wait, and those
//! that run their pass under their device's mutex, net, vsock and entropy,
//! make whoever locks it wait too), the discard workers (`MADV_DONTNEED`
//! of a registered range waits until the handler reads its
//! `UFFD_EVENT_REMOVE`), the workers of a snapshot's memory file, and a
//! populate. Not a reclaim: it unregisters first. The connection's hang-up
//! ([`crate::memory::GuestMemory::uffd_handler_connection`]) says the
//! handler is gone.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// `UFFD_API` (linux/userfaultfd.h).
const UFFD_API: u64 = 0xAA;
/// `UFFDIO_API`: `_IOWR(0xAA, 0x3F, struct uffdio_api)` (24 bytes).
pub(crate) const UFFDIO_API: u64 = 0xc018_aa3f;
/// `UFFDIO_REGISTER`: `_IOWR(0xAA, 0x00, struct uffdio_register)` (32 bytes).
pub(crate) const UFFDIO_REGISTER: u64 = 0xc020_aa00;
/// `UFFDIO_UNREGISTER`: `_IOR(0xAA, 0x01, struct uffdio_range)` (16 bytes).
pub(crate) const UFFDIO_UNREGISTER: u64 = 0x8010_aa01;
/// `USERFAULTFD_IOC_NEW`: `_IO(0xAA, 0x00)`, on `/dev/userfaultfd`.
pub(crate) const USERFAULTFD_IOC_NEW: u64 = 0xaa00;
/// `UFFDIO_REGISTER_MODE_MISSING`.
const MODE_MISSING: u64 = 1;
/// `UFFD_FEATURE_EVENT_REMOVE`: `MADV_DONTNEED` / `MADV_REMOVE` of a
/// registered range is an event the handler reads (Firecracker asks it for
/// its balloon), and the madvising thread waits until it is read.
pub const UFFD_FEATURE_EVENT_REMOVE: u64 = 1 << 3;
/// Longest wait of `connect` and `sendmsg` for the handler.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Firecracker's example handlers read the message into this many bytes
/// (`uffd_utils.rs`); a longer one is cut there.
pub const HANDLER_MESSAGE_BYTES: usize = 1024;

/// Errors of setting up userfaultfd guest memory.
#[derive(Debug, thiserror::Error)]
pub enum UffdError {
    /// `userfaultfd(2)` failed.
    #[error("userfaultfd(O_CLOEXEC|O_NONBLOCK) failed: {0} (no /dev/userfaultfd could be opened; through the call, handling the guest's faults in KVM needs CAP_SYS_PTRACE or vm.unprivileged_userfaultfd = 1)")]
    Create(io::Error),
    /// `USERFAULTFD_IOC_NEW` on `/dev/userfaultfd` failed.
    #[error("USERFAULTFD_IOC_NEW on /dev/userfaultfd failed: {0}")]
    CreateFromDevice(io::Error),
    /// `UFFDIO_API` failed or lacks a feature.
    #[error("UFFDIO_API asking for UFFD_FEATURE_EVENT_REMOVE failed: {0}")]
    Api(io::Error),
    /// `UFFDIO_REGISTER` of a slice failed.
    #[error("UFFDIO_REGISTER (missing pages) of {addr:#x}+{len:#x} failed: {source}")]
    Register {
        /// Host address of the slice.
        addr: usize,
        /// Its length.
        len: usize,
        /// Why.
        source: io::Error,
    },
    /// The connection to the handler could not be made.
    #[error("cannot connect to the page fault handler's socket {}: {source}", path.display())]
    Connect {
        /// The socket's path (`backend_path`).
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// The message could not be sent.
    #[error("cannot send the memory regions and the userfaultfd to the page fault handler at {}: {source}", path.display())]
    Send {
        /// The socket's path.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
}

/// One registered region as the handler is told it: Firecracker's
/// `GuestRegionUffdMapping`, with its field names and meaning.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct GuestRegionUffdMapping {
    /// Host virtual address of the region's first byte in teravm.
    pub base_host_virt_addr: u64,
    /// Its length in bytes.
    pub size: usize,
    /// Where its contents start in the memory file.
    pub offset: u64,
    /// The page size backing it, in bytes.
    pub page_size: usize,
    /// The same, in bytes despite its name (Firecracker's deprecated field,
    /// still sent).
    pub page_size_kib: usize,
}

/// `struct uffdio_api`.
#[repr(C)]
#[derive(Default)]
struct UffdioApi {
    api: u64,
    features: u64,
    ioctls: u64,
}

/// `struct uffdio_range`.
#[repr(C)]
#[derive(Default)]
struct UffdioRange {
    start: u64,
    len: u64,
}

/// `struct uffdio_register`.
#[repr(C)]
#[derive(Default)]
struct UffdioRegister {
    range: UffdioRange,
    mode: u64,
    ioctls: u64,
}

/// A userfaultfd, its registered ranges, and the connection to its handler.
#[derive(Debug)]
pub(crate) struct UffdSession {
    uffd: OwnedFd,
    ranges: Vec<(usize, usize)>,
    socket: Option<OwnedFd>,
}

impl UffdSession {
    /// A userfaultfd with Firecracker's features (`UFFDIO_API`), nothing
    /// registered yet: from `device` (`/dev/userfaultfd`, opened by the
    /// `files` thread) where there is one, as Firecracker makes it; that is
    /// how an unprivileged process gets one whose faults KVM may take (a
    /// jail's, which the jailer makes and gives to its uid), else from the
    /// `userfaultfd(2)` call.
    pub(crate) fn new(device: Option<&std::fs::File>) -> Result<UffdSession, UffdError> {
        let flags = libc::O_CLOEXEC | libc::O_NONBLOCK;
        let fd = match device {
            // SAFETY: USERFAULTFD_IOC_NEW takes the flags as its argument
            // and returns a new descriptor; nothing is written to memory.
            Some(dev) => unsafe {
                libc::ioctl(dev.as_raw_fd(), USERFAULTFD_IOC_NEW as _, flags) as libc::c_long
            },
            // SAFETY: userfaultfd takes flags only and returns a new descriptor.
            None => unsafe { libc::syscall(libc::SYS_userfaultfd, flags) },
        };
        if fd < 0 {
            let e = io::Error::last_os_error();
            return Err(match device {
                Some(_) => UffdError::CreateFromDevice(e),
                None => UffdError::Create(e),
            });
        }
        // SAFETY: a fresh descriptor that nothing else owns.
        let uffd = unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) };
        let mut api = UffdioApi {
            api: UFFD_API,
            features: UFFD_FEATURE_EVENT_REMOVE,
            ioctls: 0,
        };
        // SAFETY: the kernel reads and writes `api`, a `struct uffdio_api`.
        let ret = unsafe { libc::ioctl(uffd.as_raw_fd(), UFFDIO_API as _, &mut api) };
        if ret != 0 {
            return Err(UffdError::Api(io::Error::last_os_error()));
        }
        if api.features & UFFD_FEATURE_EVENT_REMOVE == 0 {
            return Err(UffdError::Api(io::Error::from_raw_os_error(libc::EINVAL)));
        }
        Ok(UffdSession {
            uffd,
            ranges: Vec::new(),
            socket: None,
        })
    }

    /// Registers `addr..addr + len` (page-aligned, mapped private
    /// anonymous) for missing-page faults.
    pub(crate) fn register(&mut self, addr: usize, len: usize) -> Result<(), UffdError> {
        let mut reg = UffdioRegister {
            range: UffdioRange {
                start: addr as u64,
                len: len as u64,
            },
            mode: MODE_MISSING,
            ioctls: 0,
        };
        // SAFETY: the kernel reads and writes `reg`, a `struct
        // uffdio_register`; registering changes no memory contents.
        let ret = unsafe { libc::ioctl(self.uffd.as_raw_fd(), UFFDIO_REGISTER as _, &mut reg) };
        if ret != 0 {
            let source = io::Error::last_os_error();
            return Err(UffdError::Register { addr, len, source });
        }
        self.ranges.push((addr, len));
        Ok(())
    }

    /// Connects to the handler's socket at `path` and sends it `regions`
    /// (JSON) with the userfaultfd in one message; the connection is kept.
    pub(crate) fn handshake(
        &mut self,
        path: &Path,
        regions: &[GuestRegionUffdMapping],
    ) -> Result<(), UffdError> {
        let body = serde_json::to_vec(regions).map_err(|e| UffdError::Send {
            path: path.to_path_buf(),
            source: io::Error::other(e),
        })?;
        if body.len() > HANDLER_MESSAGE_BYTES {
            log::warn!(
                "the memory regions' message to the page fault handler is {} bytes ({} regions); Firecracker's example handlers read {HANDLER_MESSAGE_BYTES}",
                body.len(),
                regions.len()
            );
        }
        let socket = connect(path).map_err(|source| UffdError::Connect {
            path: path.to_path_buf(),
            source,
        })?;
        send_with_fd(&socket, &body, self.uffd.as_raw_fd()).map_err(|source| UffdError::Send {
            path: path.to_path_buf(),
            source,
        })?;
        self.socket = Some(socket);
        Ok(())
    }

    /// The connection to the handler (once the handshake is done).
    pub(crate) fn handler_connection(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        use std::os::fd::AsFd;
        self.socket.as_ref().map(|s| s.as_fd())
    }

    /// Unregisters every range (waking any thread that waits on one of its
    /// faults: it then faults as private anonymous memory) and closes the
    /// userfaultfd and the connection. Before guest memory is freed.
    pub(crate) fn close(self) {
        for &(addr, len) in &self.ranges {
            let mut range = UffdioRange {
                start: addr as u64,
                len: len as u64,
            };
            // SAFETY: the kernel reads `range`; unregistering a range
            // of ours changes no memory contents.
            let ret =
                unsafe { libc::ioctl(self.uffd.as_raw_fd(), UFFDIO_UNREGISTER as _, &mut range) };
            if ret != 0 {
                log::warn!(
                    "UFFDIO_UNREGISTER of {addr:#x}+{len:#x} failed: {}",
                    io::Error::last_os_error()
                );
            }
        }
    }
}

/// A `SOCK_STREAM` Unix socket connected to `path`, its sends (and the
/// connect) bounded by [`HANDSHAKE_TIMEOUT`].
fn connect(path: &Path) -> io::Result<OwnedFd> {
    use std::os::unix::ffi::OsStrExt;
    let bytes = path.as_os_str().as_bytes();
    // SAFETY: sockaddr_un is plain data; all zeroes is valid.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    if bytes.len() >= addr.sun_path.len() || bytes.contains(&0) {
        return Err(io::Error::from_raw_os_error(libc::ENAMETOOLONG));
    }
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (d, &b) in addr.sun_path.iter_mut().zip(bytes) {
        *d = b as libc::c_char;
    }
    // SAFETY: socket takes no pointers and returns a new descriptor.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor that nothing else owns.
    let socket = unsafe { OwnedFd::from_raw_fd(fd) };
    let timeout = libc::timeval {
        tv_sec: HANDSHAKE_TIMEOUT.as_secs() as libc::time_t,
        tv_usec: 0,
    };
    // SAFETY: the kernel reads a `timeval` of the size given.
    let ret = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_SNDTIMEO,
            (&timeout as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    if ret != 0 {
        return Err(io::Error::last_os_error());
    }
    let len = (std::mem::size_of::<libc::sa_family_t>() + bytes.len() + 1) as libc::socklen_t;
    loop {
        // SAFETY: the kernel reads `len` bytes of `addr`, ours.
        let ret = unsafe {
            libc::connect(
                socket.as_raw_fd(),
                (&addr as *const libc::sockaddr_un).cast(),
                len,
            )
        };
        if ret == 0 {
            return Ok(socket);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// One `sendmsg` of `body` with `fd` as `SCM_RIGHTS`; all of `body` or an
/// error.
fn send_with_fd(socket: &OwnedFd, body: &[u8], fd: libc::c_int) -> io::Result<()> {
    let mut iov = libc::iovec {
        iov_base: body.as_ptr() as *mut libc::c_void,
        iov_len: body.len(),
    };
    // Room for one descriptor's control message, 8-byte aligned.
    let mut control = [0u64; 4];
    // SAFETY: CMSG_SPACE only computes a size.
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<libc::c_int>() as u32) } as usize;
    debug_assert!(space <= std::mem::size_of_val(&control));
    // SAFETY: msghdr is plain data; all zeroes is valid.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: `msg` points at `control`, `space` bytes of ours, so the
    // first header lies in it and holds one descriptor.
    unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<libc::c_int>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<libc::c_int>(), fd);
    }
    loop {
        // SAFETY: the kernel reads `msg`, its iovec (`body`) and its control
        // message, all alive for the call.
        let sent = unsafe { libc::sendmsg(socket.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
        if sent >= 0 {
            if sent as usize == body.len() {
                return Ok(());
            }
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                format!("sent {sent} of {} bytes", body.len()),
            ));
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `_IOWR` / `_IOR` of type 0xAA.
    fn ioc(dir: u64, nr: u64, size: usize) -> u64 {
        (dir << 30) | ((size as u64) << 16) | (UFFD_API << 8) | nr
    }

    #[test]
    fn ioctl_numbers_are_the_kernels_and_the_filters() {
        assert_eq!(UFFDIO_API, ioc(3, 0x3f, std::mem::size_of::<UffdioApi>()));
        assert_eq!(
            UFFDIO_REGISTER,
            ioc(3, 0x00, std::mem::size_of::<UffdioRegister>())
        );
        assert_eq!(
            UFFDIO_UNREGISTER,
            ioc(2, 0x01, std::mem::size_of::<UffdioRange>())
        );
        assert_eq!(USERFAULTFD_IOC_NEW, ioc(0, 0x00, 0));
        use crate::seccomp::filters as f;
        assert_eq!(
            (
                UFFDIO_API,
                UFFDIO_REGISTER,
                UFFDIO_UNREGISTER,
                USERFAULTFD_IOC_NEW
            ),
            (
                f::UFFDIO_API,
                f::UFFDIO_REGISTER,
                f::UFFDIO_UNREGISTER,
                f::USERFAULTFD_IOC_NEW
            )
        );
    }

    /// A session from `/dev/userfaultfd` (a jail's way) is a userfaultfd
    /// like the call's: it takes `UFFDIO_API` with Firecracker's features
    /// and a registration. Where the host has no device (before Linux 6.1)
    /// or this uid may not open it, there is nothing to check.
    #[test]
    fn a_session_from_the_device_registers_memory() {
        let dev = match std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/userfaultfd")
        {
            Ok(d) => d,
            Err(e) => {
                return teravm_client::not_possible(
                    "memory::uffd::a_session_from_the_device_registers_memory",
                    format!("/dev/userfaultfd: {e}"),
                );
            }
        };
        let mut session = UffdSession::new(Some(&dev)).unwrap();
        let len = 2 << 20;
        // SAFETY: a new private anonymous mapping, unmapped below.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(addr, libc::MAP_FAILED);
        session.register(addr as usize, len).unwrap();
        drop(session);
        // SAFETY: the mapping made above, no longer registered.
        unsafe { libc::munmap(addr, len) };
        // A descriptor that is not the device is refused, not mistaken.
        let null = std::fs::File::open("/dev/null").unwrap();
        assert!(matches!(
            UffdSession::new(Some(&null)),
            Err(UffdError::CreateFromDevice(_))
        ));
    }
}
