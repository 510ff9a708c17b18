//! The `openat` flag sets of the `files` thread (src/files.rs, which
//! re-exports them as `files::flags`): the only ones the filter of
//! [`super::Role::Files`] lets `openat` take. Here, beside the filter, so
//! that seccomp depends on nothing above it.

/// An image read whole (kernel, initrd): read-only, and non-blocking so
/// that opening a FIFO returns at once (it is then refused as not a
/// regular file).
pub const READ_IMAGE: i32 = libc::O_RDONLY | libc::O_NONBLOCK | libc::O_CLOEXEC;
/// What an output file is opened with besides its access mode: append,
/// create (mode 0600), never through a symlink, never blocking.
pub const OUTPUT: i32 =
    libc::O_APPEND | libc::O_CREAT | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC;
/// Output, write-only (a regular file, a FIFO with a reader).
pub const OUTPUT_WRITE: i32 = libc::O_WRONLY | OUTPUT;
/// Output to a FIFO with no reader yet, as Firecracker opens it: read
/// and write, so the open succeeds and lines wait in the pipe.
pub const OUTPUT_FIFO: i32 = libc::O_RDWR | OUTPUT;
/// A drive read and written (not created), non-blocking so that a FIFO
/// is refused at once.
pub const DRIVE_RW: i32 = libc::O_RDWR | libc::O_NONBLOCK | libc::O_CLOEXEC;
/// A snapshot's file, made new under a temporary name: write-only, never
/// an existing file (so never a FIFO or a device), never through a
/// symlink; renamed to its name once whole.
pub const SNAPSHOT_NEW: i32 =
    libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC;
