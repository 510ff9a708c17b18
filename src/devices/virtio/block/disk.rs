//! The drive's backing store ([`Disk`]): a host file in production, a
//! recording disk in tests and the fuzz target. Only the device thread
//! calls it.

use std::fs::File;
use std::io::{Seek, SeekFrom};
use std::os::unix::fs::FileExt;

/// The drive's backing store, as the device thread uses it. Every call may
/// block (a hung NFS mount): only the device thread makes them.
pub trait Disk: Send {
    /// The size in bytes (for a file: `lseek(SEEK_END)`, which also works
    /// for a host block device, where `fstat` says 0).
    fn size_bytes(&self) -> std::io::Result<u64>;
    /// Fills `buf` from `offset` (`pread64`, retried on short reads and
    /// `EINTR`); end of file before `buf` is full is an error.
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()>;
    /// Writes all of `buf` at `offset` (`pwrite64`, retried).
    fn write_all_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()>;
    /// Makes written data durable (`fdatasync`).
    fn sync_data(&self) -> std::io::Result<()>;
    /// The file descriptor the io_uring engine submits on (None: not a
    /// file, the Sync engine only).
    fn raw_fd(&self) -> Option<std::os::fd::RawFd> {
        None
    }
}

impl Disk for File {
    fn size_bytes(&self) -> std::io::Result<u64> {
        let mut f: &File = self;
        f.seek(SeekFrom::End(0))
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        FileExt::read_exact_at(self, buf, offset)
    }

    fn write_all_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        FileExt::write_all_at(self, buf, offset)
    }

    fn sync_data(&self) -> std::io::Result<()> {
        File::sync_data(self)
    }

    fn raw_fd(&self) -> Option<std::os::fd::RawFd> {
        Some(std::os::fd::AsRawFd::as_raw_fd(self))
    }
}

/// The size of `disk` in bytes.
pub(crate) fn disk_size(disk: &dyn Disk) -> std::io::Result<u64> {
    disk.size_bytes()
}
