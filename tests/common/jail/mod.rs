//! Firecracker's own jailer, run as an orchestrator runs it (issue 37):
//! `jailer --id <uuid> --exec-file <bin> --uid --gid --chroot-base-dir
//! --netns --cgroup-version --cgroup ... --parent-cgroup --resource-limit
//! no-file=<n> --new-pid-ns --daemonize -- --api-sock /run/api.socket`,
//! with what an orchestrator puts in the chroot first: the kernel
//! hard-linked in, FIFOs for the log, the metrics and the serial console
//! (read here on threads of their own, so a line is an event to wait for),
//! and, where asked, the VM's own memory cgroup bind-mounted read-only at
//! `/sys/fs/cgroup` inside (the view a cgroup namespace gives; teravm's
//! admission reads its limit there, docs/fleet.md).
//!
//! The jailed process is not the test's child (the jailer forks twice and
//! exits): it is found by the pid file the jailer writes beside the exec
//! file in the chroot, and watched through a pidfd. Dropping a [`Jail`]
//! kills what is left, unmounts, and removes the chroot and the cgroups.

use std::collections::BTreeSet;
use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::client::request;
use super::replay::Fifo;

mod host;
// Not every test binary uses every part.
#[allow(unused_imports)]
pub use host::{cgroup_file, setup, shared_libraries, HostCgroup, Setup};

/// The uid and gid the jailed VMMs run as (no such user on the host).
pub const UID: u32 = 10_123;
/// See [`UID`].
pub const GID: u32 = 10_123;
/// The API socket inside the chroot, as given with `--api-sock`.
pub const API_SOCK: &str = "/run/api.socket";
/// Firecracker's default socket, which Kata's jailed mode expects.
pub const KATA_API_SOCK: &str = "/run/firecracker.socket";

/// What one jail is started with.
pub struct JailSpec<'a> {
    pub jailer: &'a Path,
    pub exec: &'a Path,
    /// Files hard-linked into the chroot's root under their name.
    pub link: &'a [(&'a Path, &'a str)],
    /// FIFOs made in the chroot's root (owned by the uid) and read here.
    pub fifos: &'a [&'a str],
    /// `/var/run/netns/<name>`.
    pub netns: Option<&'a Path>,
    pub cgroup: &'a HostCgroup,
    /// `--cgroup` values.
    pub limits: Vec<String>,
    /// Bind-mount the VM's memory cgroup read-only at `/sys/fs/cgroup`
    /// (v2) or `/sys/fs/cgroup/memory` (v1) inside the chroot.
    pub cgroup_view: bool,
    pub nofile: u64,
    /// teravm's or Firecracker's own arguments after `--api-sock`.
    pub args: &'a [&'a str],
    /// Kata's Go runtime's jailer command instead (`fc.go`): uid and gid
    /// 0, `--daemonize`, the netns, then `-- <args>` with no `--api-sock`
    /// (the VMM's default, `/run/firecracker.socket`, is where Kata looks);
    /// no cgroup, file limit or PID namespace.
    pub kata_go: bool,
}

/// A running (or finished) jailed VMM.
pub struct Jail {
    /// The API socket inside the chroot.
    pub api_sock: &'static str,
    /// A short symlink to the chroot's `run/` (see [`Jail::sock`]).
    run_link: PathBuf,
    pub id: String,
    pub base: PathBuf,
    /// `<base>/<exec name>/<id>/root`.
    pub root: PathBuf,
    pub exec_name: String,
    pub pid: u32,
    pidfd: OwnedFd,
    /// The cgroup dirs of this VM (`<controller root>/<parent>/<id>`).
    pub cgroup_dirs: Vec<PathBuf>,
    /// Dirs the jail made, removed deepest first.
    made: Vec<PathBuf>,
    mounts: Vec<PathBuf>,
    fifos: Vec<(String, Mutex<Fifo>)>,
}

fn fresh_id() -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!(
        "{:08x}-{:04x}-4000-8000-{:012x}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed),
        nanos
    )
}

/// Gives `path` to the jailed uid and gid.
pub fn chown(path: &Path) {
    let c = CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a NUL-terminated path; the result is checked.
    assert_eq!(
        unsafe { libc::chown(c.as_ptr(), UID, GID) },
        0,
        "chown {path:?}"
    );
}

fn run_ok(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The ancestors of `rel` under `root` that do not exist yet, deepest
/// first (what a `create_dir_all` of it would make).
fn missing_chain(root: &Path, rel: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut p = root.to_path_buf();
    for part in rel.split('/').filter(|s| !s.is_empty()) {
        p.push(part);
        if !p.exists() {
            out.push(p.clone());
        }
    }
    out.reverse();
    out
}

impl Jail {
    /// Prepares the chroot as an orchestrator does and runs the jailer;
    /// returns once the VMM answers on its socket inside the chroot.
    pub fn start(spec: &JailSpec) -> Jail {
        let id = fresh_id();
        let base = super::temp_dir("jail");
        let exec_name = spec.exec.file_name().unwrap().to_string_lossy().to_string();
        let root = base.join(&exec_name).join(&id).join("root");
        std::fs::create_dir_all(&root).unwrap();
        // The jailer chowns the chroot; the base must be traversable.
        std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o755)).unwrap();
        // A dynamically linked exec file (the shared build's Firecracker
        // is one) needs its loader and libraries inside; a static one
        // (teravm's, scripts/build-static.sh) names none.
        for lib in shared_libraries(spec.exec) {
            let dst = root.join(lib.strip_prefix("/").unwrap());
            std::fs::create_dir_all(dst.parent().unwrap()).unwrap();
            std::fs::copy(&lib, &dst).unwrap();
        }
        for (src, name) in spec.link {
            let dst = root.join(name);
            if std::fs::hard_link(src, &dst).is_err() {
                std::fs::copy(src, &dst).unwrap();
            }
        }
        let mut fifos = Vec::new();
        for name in spec.fifos {
            // Made and read as the orchestrators make and read theirs
            // (tests/common/replay.rs), owned by the jailed uid.
            let path = root.join(name);
            let mut fifo = Fifo::make(&path);
            chown(&path);
            fifo.read();
            fifos.push((name.to_string(), Mutex::new(fifo)));
        }
        let parent = format!(
            "{}/teravm-jail-{}",
            spec.cgroup.own_memory,
            std::process::id()
        )
        .trim_start_matches('/')
        .to_string();
        let rel = format!("{parent}/{id}");
        let mut ctrl_roots = vec![spec.cgroup.memory_root.clone()];
        if spec.cgroup.cpu_root != spec.cgroup.memory_root {
            ctrl_roots.push(spec.cgroup.cpu_root.clone());
        }
        let mut made = Vec::new();
        let mut cgroup_dirs = Vec::new();
        for r in &ctrl_roots {
            made.extend(missing_chain(r, &rel));
            cgroup_dirs.push(r.join(&rel));
        }
        let mut mounts = Vec::new();
        if spec.cgroup_view {
            // The VM's memory cgroup made ahead of the jailer (which
            // creates it with create_dir_all and writes the limits), then
            // bind-mounted read-only where a cgroup namespace would show it.
            let cg = spec.cgroup.memory_root.join(&rel);
            std::fs::create_dir_all(&cg).unwrap();
            let at = if spec.cgroup.version == 2 {
                root.join("sys/fs/cgroup")
            } else {
                root.join("sys/fs/cgroup/memory")
            };
            std::fs::create_dir_all(&at).unwrap();
            run_ok(Command::new("mount").arg("--bind").arg(&cg).arg(&at));
            mounts.push(at.clone());
            run_ok(
                Command::new("mount")
                    .args(["-o", "remount,bind,ro"])
                    .arg(&at),
            );
        }
        let api_sock = if spec.kata_go {
            KATA_API_SOCK
        } else {
            API_SOCK
        };
        let mut cmd = Command::new(spec.jailer);
        cmd.args(["--id", &id])
            .arg("--exec-file")
            .arg(spec.exec)
            .args(if spec.kata_go {
                ["--uid", "0", "--gid", "0"].map(String::from)
            } else {
                [
                    "--uid".into(),
                    UID.to_string(),
                    "--gid".into(),
                    GID.to_string(),
                ]
            })
            .arg("--chroot-base-dir")
            .arg(&base);
        if spec.kata_go {
            cmd.arg("--daemonize");
            if let Some(ns) = spec.netns {
                cmd.arg("--netns").arg(ns);
            }
            cmd.arg("--").args(spec.args);
        } else {
            if let Some(ns) = spec.netns {
                cmd.arg("--netns").arg(ns);
            }
            cmd.args(["--cgroup-version", &spec.cgroup.version.to_string()]);
            for l in &spec.limits {
                cmd.args(["--cgroup", l]);
            }
            cmd.args(["--parent-cgroup", &parent])
                .args(["--resource-limit", &format!("no-file={}", spec.nofile)])
                .args(["--new-pid-ns", "--daemonize", "--", "--api-sock", API_SOCK])
                .args(spec.args);
        }
        static LINKS: AtomicU32 = AtomicU32::new(0);
        let run_link = std::env::temp_dir().join(format!(
            "tvj-{}-{}",
            std::process::id(),
            LINKS.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_file(&run_link);
        std::os::unix::fs::symlink(root.join("run"), &run_link).unwrap();
        let mut jail = Jail {
            api_sock,
            run_link,
            id,
            base,
            root,
            exec_name,
            pid: 0,
            // Replaced below; a placeholder that owns a real descriptor.
            pidfd: std::fs::File::open("/dev/null").unwrap().into(),
            cgroup_dirs,
            made,
            mounts,
            fifos,
        };
        let out = super::output_within(cmd, Duration::from_secs(30));
        assert_eq!(out.0, 0, "the jailer failed: {}{}", out.1, out.2);
        // Daemonized, the jailer's first process exits at once; the pid
        // file comes later, from the parent of the new namespace's PID 1,
        // written whole (create_new, then one write) and so read until it
        // parses.
        let pid_file = jail.root.join(format!("{}.pid", jail.exec_name));
        let deadline = Instant::now() + Duration::from_secs(30);
        jail.pid = loop {
            let text = std::fs::read_to_string(&pid_file).unwrap_or_default();
            if let Ok(pid) = text.trim().parse() {
                break pid;
            }
            assert!(
                Instant::now() < deadline,
                "no pid in {pid_file:?} 30 s after the jailer exited"
            );
            std::thread::sleep(Duration::from_millis(10));
        };
        // SAFETY: pidfd_open takes a pid and flags; the result is checked.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, jail.pid as libc::pid_t, 0) };
        assert!(
            fd >= 0,
            "pidfd_open({}): {}",
            jail.pid,
            std::io::Error::last_os_error()
        );
        // SAFETY: a new descriptor that nothing else owns.
        jail.pidfd = unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) };
        jail.wait_for_api();
        jail
    }

    /// The API socket's path on the host, through a short link to the
    /// chroot's `run/` (a socket's path is at most 107 bytes; the chroot's
    /// own, with a UUID in it, can be longer).
    pub fn sock(&self) -> PathBuf {
        let name = Path::new(self.api_sock).file_name().unwrap();
        self.run_link.join(name)
    }

    fn wait_for_api(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match request(&self.sock(), "GET", "/", None) {
                Ok((200, _)) => return,
                Ok((s, b)) => panic!("GET / answered {s}: {b}"),
                Err(e) => {
                    assert!(
                        self.alive(),
                        "the jailed {} exited before its API answered ({e})",
                        self.exec_name
                    );
                    assert!(Instant::now() < deadline, "no API within 30 s: {e}");
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
        }
    }

    /// One request on the socket inside the chroot.
    pub fn ask(&self, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
        request(&self.sock(), method, path, body)
            .unwrap_or_else(|e| panic!("{} {method} {path}: {e}", self.exec_name))
    }

    /// Whether the jailed process still runs.
    pub fn alive(&self) -> bool {
        !self.exited_within(Duration::ZERO)
    }

    /// Waits for the jailed process to end (its pidfd becomes readable).
    pub fn exited_within(&self, timeout: Duration) -> bool {
        let mut pfd = libc::pollfd {
            fd: self.pidfd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one pollfd on our stack.
        unsafe { libc::poll(&mut pfd, 1, timeout.as_millis() as i32) > 0 }
    }

    /// Sends `signo` to the jailed process (through its pidfd).
    pub fn signal(&self, signo: i32) {
        // SAFETY: pidfd_send_signal with our pidfd, no siginfo.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                self.pidfd.as_raw_fd(),
                signo,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            )
        };
        assert_eq!(
            rc,
            0,
            "pidfd_send_signal: {}",
            std::io::Error::last_os_error()
        );
    }

    /// The next line of the FIFO `name` that contains `needle`, within
    /// `timeout`; panics with what came instead.
    pub fn wait_line(&self, name: &str, needle: &str, timeout: Duration) -> String {
        let mut fifo = self
            .fifos
            .iter()
            .find(|(n, _)| n == name)
            .expect("a FIFO of the jail")
            .1
            .lock()
            .unwrap();
        fifo.wait(|l| l.contains(needle), timeout)
            .unwrap_or_else(|| {
                panic!(
                    "{}: no {needle:?} on {name} within {timeout:?}; it said:\n{}",
                    self.exec_name,
                    fifo.seen.join("\n")
                )
            })
    }

    /// A line of `/proc/<pid>/status` (`Uid:` ...), its value.
    pub fn status_field(&self, field: &str) -> String {
        let s = std::fs::read_to_string(format!("/proc/{}/status", self.pid)).unwrap();
        s.lines()
            .find_map(|l| l.strip_prefix(field))
            .map(|v| v.trim().to_string())
            .unwrap_or_default()
    }

    /// What is left in the chroot: (relative path with the exec file's
    /// name as `<exec>`, kind and mode, uid, gid), sorted.
    pub fn listing(&self) -> BTreeSet<String> {
        let mut out = BTreeSet::new();
        let mut stack = vec![self.root.clone()];
        while let Some(dir) = stack.pop() {
            for e in std::fs::read_dir(&dir).unwrap().map_while(Result::ok) {
                let p = e.path();
                let m = std::fs::symlink_metadata(&p).unwrap();
                let rel = p.strip_prefix(&self.root).unwrap().to_string_lossy();
                let rel = rel.replace(&self.exec_name, "<exec>");
                out.insert(format!("{rel} {:o} {}:{}", m.mode(), m.uid(), m.gid()));
                if m.is_dir() && !self.mounts.iter().any(|mnt| p.starts_with(mnt)) {
                    stack.push(p);
                }
            }
        }
        out
    }
}

impl Drop for Jail {
    fn drop(&mut self) {
        if self.pid != 0 && self.alive() {
            self.signal(libc::SIGKILL);
            self.exited_within(Duration::from_secs(10));
        }
        // Whatever else runs in the VM's cgroup (a VMM whose pid was never
        // read, a test that failed half-way) is the jail's too.
        for dir in &self.cgroup_dirs {
            let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
            for pid in procs
                .lines()
                .filter_map(|l| l.trim().parse::<libc::pid_t>().ok())
            {
                // SAFETY: kill takes a pid and a signal; a gone pid is ESRCH.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
        for m in self.mounts.iter().rev() {
            let _ = Command::new("umount").arg(m).status();
        }
        let _ = std::fs::remove_dir_all(&self.base);
        let _ = std::fs::remove_file(&self.run_link);
        // A cgroup dir goes once its last task has gone; the kernel may
        // take a moment after the exit to let go of it.
        let deadline = Instant::now() + Duration::from_secs(5);
        for d in &self.made {
            while std::fs::remove_dir(d).is_err() && d.exists() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}
