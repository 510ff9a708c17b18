//! The one place where teravm opens host files once it runs: the `files`
//! thread ([`FileOpener`]). The kernel and initrd (read-only), the log and
//! metrics paths and the serial file (append-only, created 0600, never
//! through a symlink) are opened here and nowhere else, so that only this
//! thread's seccomp filter allows `openat`, with exactly the flag sets of
//! [`flags`]; no API connection thread and no event loop ever opens a path
//! (a FIFO or a hung mount could block it).
//!
//! Requests come over a channel, each with a callback run on this thread
//! when its files are open (or one failed). The event loop submits and goes
//! on ([`FileOpener::submit`]); its callback sends the result back and wakes
//! the loop, which answers the client then, or after a deadline if the open
//! never returns (a stuck open stops later opens, never the VMM). Start-up,
//! before any client is served, waits for its opens
//! ([`FileOpener::open_now`]).
//!
//! Checks happen here, on the opened descriptor (no path is looked at
//! twice): the file type, the size, an image's first bytes (a caller's
//! check), and for output that it is not on procfs or sysfs (so
//! `/proc/self/mem` cannot be opened for writing).

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The `openat` flag sets the `files` thread uses, and nothing else does.
/// They live with the filter that allows exactly these
/// ([`crate::seccomp::open_flags`]), so that seccomp needs nothing of this
/// module.
pub use crate::seccomp::open_flags as flags;

/// How long the event loop waits for the `files` thread before it answers
/// a client that the open did not finish.
pub const OPEN_TIMEOUT: Duration = Duration::from_secs(5);

/// `statfs.f_type` of procfs.
const PROC_SUPER_MAGIC: i64 = 0x9fa0;
/// `statfs.f_type` of sysfs.
const SYSFS_MAGIC: i64 = 0x6265_6572;

/// Checks an image's first bytes; the text says what is wrong.
pub type HeadCheck = fn(&Path, &[u8]) -> Result<(), String>;

/// How a file is opened and what it must be.
#[derive(Debug, Clone, Copy)]
pub enum OpenSpec {
    /// Read-only ([`flags::READ_IMAGE`]): a regular file of 1..=`max_bytes`
    /// bytes whose first `head_bytes` bytes pass `check`.
    ReadImage {
        /// The largest size allowed.
        max_bytes: u64,
        /// How many bytes `check` looks at (fewer if the file is shorter).
        head_bytes: usize,
        /// The check of those bytes, if any.
        check: Option<HeadCheck>,
    },
    /// Append-only output ([`flags::OUTPUT_WRITE`], or
    /// [`flags::OUTPUT_FIFO`] for a FIFO with no reader): a regular file, a
    /// FIFO, a terminal or `/dev/null`, not on procfs or sysfs. With
    /// `blocking`, `O_NONBLOCK` is cleared once open (the serial file, whose
    /// writer is the console thread that may wait).
    Output {
        /// Clear `O_NONBLOCK` after the open.
        blocking: bool,
    },
    /// A drive: read-only ([`flags::READ_IMAGE`]) or read-write
    /// ([`flags::DRIVE_RW`]), never created; a regular file or a block
    /// device, not on procfs or sysfs (`/proc/self/mem` is refused).
    Drive {
        /// Open read-only.
        read_only: bool,
    },
}

/// One file to open.
#[derive(Debug, Clone)]
pub struct OpenRequest {
    /// What the path is, as the user named it (`boot-source.kernel_image_path`).
    pub what: &'static str,
    /// The path.
    pub path: PathBuf,
    /// How.
    pub spec: OpenSpec,
}

/// An opened file.
#[derive(Debug)]
pub struct Opened {
    /// The descriptor.
    pub file: File,
    /// The path it was opened by.
    pub path: PathBuf,
    /// Its size when opened (0 for FIFOs and devices).
    pub len: u64,
}

/// Errors of opening files.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FilesError {
    /// The open or a check of the file failed.
    #[error("{what}: cannot use {path}: {reason}")]
    Refused {
        /// What the path is.
        what: &'static str,
        /// The path.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The `files` thread did not answer in time (an open stuck in the
    /// host: a hung mount).
    #[error("{what}: opening {path} did not finish within {ms} ms (a hung mount?)")]
    TimedOut {
        /// What the path is.
        what: &'static str,
        /// The path.
        path: PathBuf,
        /// The wait.
        ms: u128,
    },
    /// The `files` thread is gone.
    #[error("the files thread is not running")]
    Gone,
    /// The `files` thread could not be started.
    #[error("cannot spawn the files thread: {0}")]
    Spawn(String),
}

/// What the callback of a request gets.
pub type OpenResult = Result<Vec<Opened>, FilesError>;

type Callback = Box<dyn FnOnce(OpenResult) + Send>;

enum Work {
    /// Open and check files.
    Open {
        requests: Vec<OpenRequest>,
        done: Callback,
    },
    /// Another open of a host resource a user names (a tap, a vsock's
    /// socket), done here under this thread's filter.
    Run(Box<dyn FnOnce() + Send>),
}

/// The handle of the `files` thread; cloned freely.
#[derive(Clone)]
pub struct FileOpener {
    tx: Sender<Work>,
}

impl std::fmt::Debug for FileOpener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FileOpener")
    }
}

impl FileOpener {
    /// Starts the `files` thread, which installs its seccomp filter first.
    /// Call it before the main thread installs its own.
    pub fn spawn() -> Result<FileOpener, FilesError> {
        let (tx, rx) = channel::<Work>();
        std::thread::Builder::new()
            .name("files".into())
            .spawn(move || {
                crate::seccomp::install_thread(crate::seccomp::Role::Files);
                serve(rx);
            })
            .map_err(|e| FilesError::Spawn(e.to_string()))?;
        Ok(FileOpener { tx })
    }

    /// Opens `requests` on the `files` thread and runs `done` there with
    /// the files (in order) or the first error. Never blocks. If the thread
    /// is gone, `done` runs here with [`FilesError::Gone`].
    pub fn submit(
        &self,
        requests: Vec<OpenRequest>,
        done: impl FnOnce(OpenResult) + Send + 'static,
    ) {
        let work = Work::Open {
            requests,
            done: Box::new(done),
        };
        if let Err(back) = self.tx.send(work) {
            if let Work::Open { done, .. } = back.0 {
                done(Err(FilesError::Gone));
            }
        }
    }

    /// Runs `open` on the `files` thread (a tap, a vsock's socket: what a
    /// user names that is not a plain file) and gives its result to `done`
    /// there; `done` gets `None` if the thread is gone.
    pub fn run<T: Send + 'static>(
        &self,
        open: impl FnOnce() -> T + Send + 'static,
        done: impl FnOnce(Option<T>) + Send + 'static,
    ) {
        type Done<T> = Box<dyn FnOnce(Option<T>) + Send>;
        let done: Arc<Mutex<Option<Done<T>>>> = Arc::new(Mutex::new(Some(Box::new(done))));
        let ours = done.clone();
        let work = Work::Run(Box::new(move || {
            let r = open();
            if let Some(d) = ours.lock().unwrap_or_else(|p| p.into_inner()).take() {
                d(Some(r));
            }
        }));
        if self.tx.send(work).is_err() {
            if let Some(d) = done.lock().unwrap_or_else(|p| p.into_inner()).take() {
                d(None);
            }
        }
    }

    /// [`FileOpener::run`], waiting at most `timeout` (start-up).
    pub fn run_now<T: Send + 'static>(
        &self,
        open: impl FnOnce() -> T + Send + 'static,
        timeout: Duration,
    ) -> Result<T, FilesError> {
        let (tx, rx) = channel();
        self.run(open, move |r| {
            let _ = tx.send(r);
        });
        match rx.recv_timeout(timeout) {
            Ok(Some(r)) => Ok(r),
            Ok(None) | Err(RecvTimeoutError::Disconnected) => Err(FilesError::Gone),
            Err(RecvTimeoutError::Timeout) => Err(FilesError::TimedOut {
                what: "files",
                path: PathBuf::new(),
                ms: timeout.as_millis(),
            }),
        }
    }

    /// Opens `requests` and waits at most `timeout` for them (start-up).
    pub fn open_now(&self, requests: Vec<OpenRequest>, timeout: Duration) -> OpenResult {
        let first = requests
            .first()
            .map(|r| (r.what, r.path.clone()))
            .unwrap_or(("files", PathBuf::new()));
        let (tx, rx) = channel();
        self.submit(requests, move |r| {
            let _ = tx.send(r);
        });
        match rx.recv_timeout(timeout) {
            Ok(r) => r,
            Err(RecvTimeoutError::Timeout) => Err(FilesError::TimedOut {
                what: first.0,
                path: first.1,
                ms: timeout.as_millis(),
            }),
            Err(RecvTimeoutError::Disconnected) => Err(FilesError::Gone),
        }
    }

    /// Opens one file and waits (start-up).
    pub fn open_one(&self, request: OpenRequest, timeout: Duration) -> Result<Opened, FilesError> {
        self.open_now(vec![request], timeout)
            .and_then(|mut v| v.pop().ok_or(FilesError::Gone))
    }
}

fn serve(rx: Receiver<Work>) {
    while let Ok(work) = rx.recv() {
        match work {
            Work::Open { requests, done } => {
                let result = requests.iter().map(open).collect::<Result<Vec<_>, _>>();
                done(result);
            }
            Work::Run(job) => job(),
        }
    }
}

/// Opens and checks one file (on the `files` thread).
pub fn open(req: &OpenRequest) -> Result<Opened, FilesError> {
    let refused = |reason: String| FilesError::Refused {
        what: req.what,
        path: req.path.clone(),
        reason,
    };
    if req.path.as_os_str().is_empty() {
        return Err(refused("the path is empty".into()));
    }
    let file = match req.spec {
        OpenSpec::ReadImage { .. } | OpenSpec::Drive { read_only: true } => {
            open_flags(&req.path, flags::READ_IMAGE)
        }
        OpenSpec::Drive { read_only: false } => open_flags(&req.path, flags::DRIVE_RW),
        OpenSpec::Output { .. } => match open_flags(&req.path, flags::OUTPUT_WRITE) {
            Err(e) if e.raw_os_error() == Some(libc::ENXIO) => {
                open_flags(&req.path, flags::OUTPUT_FIFO)
            }
            other => other,
        },
    }
    .map_err(|e| match e.raw_os_error() {
        Some(libc::ELOOP) => refused("it is a symlink (teravm does not follow them here)".into()),
        _ => refused(e.to_string()),
    })?;
    let meta = file.metadata().map_err(|e| refused(e.to_string()))?;
    let kind = meta.file_type();
    match req.spec {
        OpenSpec::ReadImage {
            max_bytes,
            head_bytes,
            check,
        } => {
            if !kind.is_file() {
                return Err(refused(format!(
                    "not a regular file ({})",
                    kind_name(&meta)
                )));
            }
            if meta.len() == 0 || meta.len() > max_bytes {
                return Err(refused(format!(
                    "{} bytes; it must be 1..={max_bytes} bytes",
                    meta.len()
                )));
            }
            let mut file = file;
            if let Some(check) = check {
                let mut head = vec![0u8; head_bytes.min(meta.len() as usize)];
                file.read_exact(&mut head)
                    .map_err(|e| refused(e.to_string()))?;
                check(&req.path, &head).map_err(refused)?;
            }
            Ok(Opened {
                file,
                path: req.path.clone(),
                len: meta.len(),
            })
        }
        OpenSpec::Drive { .. } => {
            if !(kind.is_file() || kind.is_block_device()) {
                return Err(refused(format!(
                    "not a regular file or block device ({})",
                    kind_name(&meta)
                )));
            }
            if on_pseudo_fs(&file) {
                return Err(refused("it is on procfs or sysfs".into()));
            }
            clear_nonblock(&file).map_err(|e| refused(e.to_string()))?;
            Ok(Opened {
                file,
                path: req.path.clone(),
                len: meta.len(),
            })
        }
        OpenSpec::Output { blocking } => {
            let device_ok = kind.is_char_device() && (is_terminal(&file) || is_dev_null(&meta));
            if !(kind.is_file() || kind.is_fifo() || device_ok) {
                return Err(refused(format!(
                    "not a regular file, FIFO, terminal or /dev/null ({})",
                    kind_name(&meta)
                )));
            }
            if on_pseudo_fs(&file) {
                return Err(refused("it is on procfs or sysfs".into()));
            }
            if blocking {
                clear_nonblock(&file).map_err(|e| refused(e.to_string()))?;
            }
            Ok(Opened {
                file,
                path: req.path.clone(),
                len: meta.len(),
            })
        }
    }
}

/// `openat(AT_FDCWD, path, flags, 0600)` with exactly `flags`.
fn open_flags(path: &Path, flags: i32) -> std::io::Result<File> {
    let mut o = OpenOptions::new();
    match flags & libc::O_ACCMODE {
        libc::O_RDONLY => o.read(true),
        libc::O_WRONLY => o.write(true),
        _ => o.read(true).write(true),
    };
    // Std adds O_CLOEXEC itself; the access mode came from read/write; the
    // rest (O_APPEND and O_CREAT included) are custom flags, so the call
    // carries exactly `flags`.
    o.custom_flags(flags & !libc::O_ACCMODE).mode(0o600);
    if flags & libc::O_CREAT != 0 {
        // Std refuses O_CREAT as a custom flag without create(true) only
        // through its own bookkeeping; say it both ways.
        o.create(true);
    }
    o.open(path)
}

fn kind_name(meta: &std::fs::Metadata) -> &'static str {
    let t = meta.file_type();
    if t.is_dir() {
        "a directory"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_symlink() {
        "a symlink"
    } else {
        "a regular file"
    }
}

fn is_terminal(file: &File) -> bool {
    // SAFETY: `t` is a plain struct on our stack for TCGETS to fill; the fd
    // is ours.
    let mut t: libc::termios = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::ioctl(file.as_raw_fd(), libc::TCGETS, &mut t) == 0 }
}

fn is_dev_null(meta: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::MetadataExt;
    meta.rdev() == libc::makedev(1, 3)
}

fn on_pseudo_fs(file: &File) -> bool {
    // SAFETY: `st` is a plain struct on our stack for fstatfs to fill.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above; the fd is ours.
    if unsafe { libc::fstatfs(file.as_raw_fd(), &mut st) } != 0 {
        return true;
    }
    let t = st.f_type as i64;
    t == PROC_SUPER_MAGIC || t == SYSFS_MAGIC
}

fn clear_nonblock(file: &File) -> std::io::Result<()> {
    let fd = file.as_raw_fd();
    // SAFETY: F_GETFL and F_SETFL on our own fd take no pointers.
    let fl = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    // SAFETY: as above.
    if fl < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, fl & !libc::O_NONBLOCK) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
#[path = "files_tests.rs"]
mod tests;
