//! What the orchestrator replays (tests/kata_replay.rs,
//! tests/containerd_replay.rs) share: a VMM started the way an orchestrator
//! starts it (its own flags, its working directory), the logger and
//! metrics FIFOs it makes and reads, the hybrid-vsock `CONNECT` its agent
//! client sends, the drive files it hands over, and the guest's blk lines
//! (`blk-watch`, docs/devices.md) on each side.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

use super::api::T;
use super::fc_api::Side;

/// The test guest's line prefix.
pub const G: &str = "teravm guest: ";

/// Starts `cmd` (the VMM, maybe behind `ip netns exec`) in `dir` with
/// exactly the orchestrator's `args`, and waits until `sock` (the API
/// socket those args name, resolved against `dir`) answers.
pub fn start_side(name: &'static str, mut cmd: Command, dir: &Path, args: &[&str]) -> Side {
    let sock_arg = args
        .iter()
        .position(|a| *a == "--api-sock")
        .map(|i| args[i + 1])
        .expect("--api-sock");
    let sock = dir.join(sock_arg);
    cmd.args(args).current_dir(dir);
    Side::spawn(name, cmd, sock, dir.to_path_buf())
}

/// A named pipe the orchestrator made (`mkfifo`) and reads line by line
/// on a thread of its own, as Kata's `fcListenToFifo` and a
/// firecracker-containerd client do.
pub struct Fifo {
    pub path: PathBuf,
    lines: Receiver<String>,
    pub seen: Vec<String>,
}

impl Fifo {
    /// `mkfifo path` (mode 0700, as both orchestrators make theirs).
    pub fn make(path: &Path) -> Fifo {
        let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a NUL-terminated path.
        let rc = unsafe { libc::mkfifo(c.as_ptr(), 0o700) };
        assert_eq!(rc, 0, "mkfifo {}", path.display());
        Fifo {
            path: path.to_path_buf(),
            lines: channel().1,
            seen: Vec::new(),
        }
    }

    /// Starts reading it. The reader holds it read-write, so that it never
    /// sees an end of file between two writers (the orchestrators open
    /// theirs non-blocking and read on).
    pub fn read(&mut self) {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&self.path)
            .unwrap();
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(file).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        self.lines = rx;
    }

    /// The next line for which `want` holds, within `timeout`; None if none
    /// came.
    pub fn wait(&mut self, want: impl Fn(&str) -> bool, timeout: Duration) -> Option<String> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = self.lines.recv_timeout(left).ok()?;
            self.seen.push(line.clone());
            if want(&line) {
                return Some(line);
            }
        }
    }
}

impl Fifo {
    /// The first line that came, waiting at most `timeout`; None if none.
    pub fn first(&mut self, timeout: Duration) -> Option<String> {
        match self.seen.first() {
            Some(l) => Some(l.clone()),
            None => self.wait(|_| true, timeout),
        }
    }
}

/// Whether `line` is a log line in Firecracker's shape with the level and
/// without the origin (`show_level: true, show_log_origin: false`):
/// `<date>T<time> [<id>:<thread>:<LEVEL>] <message>`.
pub fn log_line_shape(line: &str, id: &str) -> bool {
    let Some((stamp, rest)) = line.split_once(' ') else {
        return false;
    };
    let Some(head) = rest.strip_prefix('[').and_then(|r| r.split_once("] ")) else {
        return false;
    };
    let parts: Vec<&str> = head.0.split(':').collect();
    stamp.len() > 20
        && stamp.as_bytes()[10] == b'T'
        && parts.len() == 3
        && parts[0] == id
        && ["ERROR", "WARN", "INFO", "DEBUG", "TRACE"].contains(&parts[2])
}

/// Whether process `pid` holds `path` open (a link in `/proc/<pid>/fd`).
pub fn holds_open(pid: u32, path: &Path) -> bool {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.flatten()
        .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|l| l == path))
}

/// A metrics line as an orchestrator takes it: one JSON object.
pub fn metrics_object(line: &str) -> bool {
    serde_json::from_str::<serde_json::Value>(line).is_ok_and(|v| v.is_object())
}

/// The hybrid-vsock handshake an agent client sends (Kata's `hvsock://`
/// dialer, firecracker-containerd's `vsock.DialContext`): connect to the
/// device's `uds`, `CONNECT <port>\n`, read `OK <host port>\n`; then sends
/// `data` and reads it back from the guest's echo.
pub fn vsock_echo(uds: &Path, port: u32, data: &[u8]) -> Result<(), String> {
    let mut s = UnixStream::connect(uds).map_err(|e| format!("connect {}: {e}", uds.display()))?;
    s.set_read_timeout(Some(T)).unwrap();
    s.write_all(format!("CONNECT {port}\n").as_bytes())
        .map_err(|e| e.to_string())?;
    let mut ack = Vec::new();
    let mut b = [0u8; 1];
    while b[0] != b'\n' {
        s.read_exact(&mut b)
            .map_err(|e| format!("reading the ack: {e} (so far {ack:?})"))?;
        ack.push(b[0]);
    }
    if !ack.starts_with(b"OK ") {
        return Err(format!("ack {:?}", String::from_utf8_lossy(&ack)));
    }
    s.write_all(data).map_err(|e| e.to_string())?;
    let mut back = vec![0u8; data.len()];
    s.read_exact(&mut back)
        .map_err(|e| format!("reading the echo: {e}"))?;
    if back != data {
        return Err(format!("echo {back:?}"));
    }
    Ok(())
}

/// A drive file of `len` bytes that begins with `head` (a 16-byte
/// signature), the rest a pattern.
pub fn drive_file(path: &Path, head: &[u8; 16], len: usize) {
    let mut bytes: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
    bytes[..16].copy_from_slice(head);
    std::fs::write(path, bytes).unwrap();
}

/// Lower-case hex, as the guest prints sector 0's first 16 bytes.
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The guest's next `blk ...` line on `side`.
pub fn blk_line(side: &mut Side, what: &str) -> String {
    let line = side.vmm.wait_line(&format!("{G}blk {what}"), T);
    line[line.find(G).unwrap() + G.len()..].to_string()
}

/// What the guest prints on `side` after the host replaced the watched
/// drive's file: the new capacity, then sector 0 again.
pub fn replaced(side: &mut Side) -> (String, String) {
    (blk_line(side, "config"), blk_line(side, "sector0"))
}

/// Sends `signal` to the side's VMM and waits (at most `within`, the
/// orchestrator's own limit) for it to be gone; its exit status.
pub fn signal_and_wait(side: Side, signal: i32, within: Duration) -> std::process::ExitStatus {
    side.vmm.signal(signal);
    wait_gone(side, within)
}

/// Waits (at most `within`) for the side's VMM to exit; its status.
pub fn wait_gone(mut side: Side, within: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + within;
    loop {
        if let Some(s) = side.vmm.child.try_wait().unwrap() {
            return s;
        }
        assert!(
            Instant::now() < deadline,
            "{} still runs after {within:?}; stdout {:?}",
            side.name,
            side.vmm.drain(Duration::from_millis(10)).0
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}
