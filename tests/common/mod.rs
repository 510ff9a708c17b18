//! Helpers shared by the integration tests: the real `teravm` binary, temp
//! dirs, config files, output capture with deadlines, and a lock that keeps
//! the big-memory KVM tests of one test binary from running at once (cargo
//! runs test binaries one after another, so one lock per binary suffices).
//!
//! The HTTP client ([`client`]), the parsers of `/proc` and of teravm's
//! output ([`host`]) and the guest_memfd count ([`gmem`]) are the
//! `teravm-client` crate's, which the benchmark uses too.
#![allow(dead_code)]

pub mod api;
pub mod fc_api;
pub mod guests;
pub mod jail;
pub mod netns;
pub mod peers;
pub mod replay;
// Not every test binary uses every part.
#[allow(unused_imports)]
pub use teravm_client::{host, http as client};

/// What a teravm process holds in guest_memfd files, found and counted
/// here, independently of teravm's code: its descriptors whose link reads
/// `anon_inode:[kvm-gmem]` (`/proc/<pid>/fd`), each duplicated into the
/// test and asked of the kernel with `cachestat(2)` (written here, not
/// teravm's wrapper), and whether the host can have them at all, asked of
/// `/dev/kvm` here (`KVM_CHECK_EXTENSION`), not of teravm.
pub mod gmem {
    use std::os::fd::{AsRawFd, OwnedFd};

    #[allow(unused_imports)]
    pub use teravm_client::gmem::{gmem_fds, gmem_mappings};

    /// Bytes allocated in all of `pid`'s guest_memfds (0 where it has none).
    pub fn gmem_allocated_bytes(pid: u32) -> std::io::Result<u64> {
        teravm_client::gmem::gmem_allocated_bytes(pid, cached_bytes)
    }

    /// The pages of `file` in the page cache, in bytes: `cachestat(2)`
    /// (syscall 451) over the whole file.
    fn cached_bytes(file: &OwnedFd) -> std::io::Result<u64> {
        // struct cachestat_range and struct cachestat (include/uapi/linux/mman.h).
        let range: [u64; 2] = [0, 0];
        let mut stat = [0u64; 5];
        // SAFETY: the kernel reads `range` and writes `stat`, both ours and
        // of the sizes it expects; a bad descriptor is an error.
        let ret = unsafe {
            libc::syscall(
                451,
                file.as_raw_fd(),
                range.as_ptr(),
                stat.as_mut_ptr(),
                0 as libc::c_uint,
            )
        };
        if ret != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: sysconf takes no pointers.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64;
        Ok(stat[0] * page)
    }

    /// What the host's KVM lacks for guest RAM on guest_memfd as teravm
    /// backs it (docs: `KVM_CAP_GUEST_MEMFD` 234, `KVM_CAP_USER_MEMORY2`
    /// 231, and `GUEST_MEMFD_FLAG_MMAP | GUEST_MEMFD_FLAG_INIT_SHARED` in
    /// `KVM_CAP_GUEST_MEMFD_FLAGS` 244), asked of `/dev/kvm` here; None if
    /// nothing.
    pub fn host_lacks() -> Option<String> {
        let kvm = match std::fs::File::open("/dev/kvm") {
            Ok(f) => f,
            Err(e) => return Some(format!("/dev/kvm: {e}")),
        };
        // KVM_CHECK_EXTENSION: _IO(0xAE, 0x03).
        // SAFETY: the ioctl takes an integer, no pointer.
        let cap = |c: libc::c_ulong| unsafe { libc::ioctl(kvm.as_raw_fd(), 0xAE03, c) };
        let mut lacks = Vec::new();
        if cap(234) <= 0 {
            lacks.push("KVM_CAP_GUEST_MEMFD".to_string());
        }
        if cap(231) <= 0 {
            lacks.push("KVM_CAP_USER_MEMORY2".to_string());
        }
        let flags = cap(244).max(0);
        if flags & 0b11 != 0b11 {
            lacks.push(format!(
                "GUEST_MEMFD_FLAG_MMAP and INIT_SHARED in KVM_CAP_GUEST_MEMFD_FLAGS (it has {flags:#x})"
            ));
        }
        (!lacks.is_empty()).then(|| format!("this host's KVM lacks {}", lacks.join(", ")))
    }
}

use std::io::{BufRead, BufReader, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The teravm binary under test.
pub fn teravm() -> &'static str {
    env!("CARGO_BIN_EXE_teravm")
}

/// The test guest (issue 25), which the build leaves beside teravm's
/// binaries: `target/<profile>/teravm-guest` (build.rs).
pub fn guest() -> PathBuf {
    Path::new(teravm())
        .parent()
        .expect("teravm's directory")
        .join("teravm-guest")
}

/// The Firecracker binary: `$TERAVM_FIRECRACKER` (as `.ci/run` exports
/// it), else where `../shared/peers/build-firecracker.sh` caches its build
/// (`${XDG_CACHE_HOME:-$HOME/.cache}/teravm-peers/firecracker-81b38b9da/
/// bin/firecracker`). None, having said why, where there is none (a
/// failure in CI: [`skip`]).
pub fn firecracker(test: &str) -> Option<PathBuf> {
    let path = match std::env::var_os("TERAVM_FIRECRACKER") {
        Some(p) => PathBuf::from(p),
        None => std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache")))
            .unwrap_or_default()
            .join("teravm-peers/firecracker-81b38b9da/bin/firecracker"),
    };
    if path.is_file() {
        return Some(path);
    }
    skip(
        test,
        format!(
            "no Firecracker at {} (build it with ../shared/peers/build-firecracker.sh, \
             or name one in TERAVM_FIRECRACKER)",
            path.display()
        ),
    );
    None
}

/// Whether this run is CI's (`CI=true`, as `.ci/run` and CI services set
/// it): there everything a test needs is installed, so a test that cannot
/// run is a failure, not a skip.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v.eq_ignore_ascii_case("true"))
}

/// Skips `test` for `reason`: prints `SKIPPED test: reason` on a
/// developer's machine; panics in CI ([`in_ci`]), where a skip would count
/// as a pass.
pub fn skip(test: &str, reason: impl std::fmt::Display) {
    if in_ci() {
        panic!("{test} cannot run in CI (CI=true): {reason}");
    }
    eprintln!("SKIPPED {test}: {reason}");
}

/// `teravm_client::not_possible`: a host property says `NOT POSSIBLE
/// HERE` (listed by `.ci/run`), not a failure.
pub use teravm_client::not_possible;

/// Whether this host's KVM can back guest RAM with guest_memfd as teravm
/// needs it, asked of `/dev/kvm` by the test itself ([`gmem::host_lacks`]);
/// where not, says so ([`not_possible`]) and the test returns. teravm's own
/// check must agree with the host's (a teravm that refused guest_memfd on a
/// host that has it fails here, not NOT POSSIBLE).
pub fn gmem_or_not_possible(test: &str) -> bool {
    let host = gmem::host_lacks();
    let teravm = teravm::vstate::vm::Vm::guest_memfd_available().err();
    assert_eq!(
        host.is_none(),
        teravm.is_none(),
        "{test}: the host's KVM says {host:?}, teravm's check {teravm:?}"
    );
    match host {
        None => true,
        Some(why) => {
            not_possible(test, why);
            false
        }
    }
}

/// Whether /dev/kvm can be used; prints why a test is skipped when not
/// (and fails the test in CI, see [`skip`]).
pub fn kvm_or_skip(test: &str) -> bool {
    match teravm::vstate::vm::Vm::available() {
        Ok(()) => true,
        Err(e) => {
            skip(test, e);
            false
        }
    }
}

static BIG: Mutex<()> = Mutex::new(());

/// Held by every test that makes the host commit gigabytes.
pub fn big_memory() -> MutexGuard<'static, ()> {
    BIG.lock().unwrap_or_else(|p| p.into_inner())
}

/// A fresh temp dir for one test.
pub fn temp_dir(name: &str) -> PathBuf {
    static N: AtomicU32 = AtomicU32::new(0);
    // The process id at a fixed width (pid_max is at most 2^22, 7 digits),
    // so that a path's length, which some messages quote, does not depend
    // on it.
    let dir = std::env::temp_dir().join(format!(
        "teravm-test-{:07}-{}-{}",
        std::process::id(),
        name,
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Writes `json` as a config file in `dir`.
pub fn config_file(dir: &Path, json: &str) -> PathBuf {
    let path = dir.join("vm.json");
    std::fs::write(&path, json).unwrap();
    path
}

/// A config of `vcpus` vCPUs and `mib` MiB running the firmware with `args`.
pub fn config_json(vcpus: u32, mib: u64, args: &str, extra: &str) -> String {
    format!(
        r#"{{"machine-config": {{"vcpu_count": {vcpus}, "mem_size_mib": {mib}}},
            "boot-source": {{"boot_args": "{args}"}}{extra}}}"#
    )
}

/// A fake sysfs tree with `nodes` NUMA nodes, each with CPUs drawn from
/// the host's CPU 0 and 1 and 8 GiB of memory.
pub fn fake_sysfs(dir: &Path, nodes: u32) -> PathBuf {
    let root = dir.join("sys");
    let base = root.join("devices/system/node");
    std::fs::create_dir_all(&base).unwrap();
    std::fs::write(base.join("online"), format!("0-{}\n", nodes - 1)).unwrap();
    for n in 0..nodes {
        let d = base.join(format!("node{n}"));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("cpulist"), format!("{}\n", n % 2)).unwrap();
        std::fs::write(
            d.join("meminfo"),
            format!("Node {n} MemTotal:       8388608 kB\nNode {n} MemFree:        8000000 kB\n"),
        )
        .unwrap();
    }
    root
}

/// A running teravm whose stdout lines arrive on a channel.
pub struct Vmm {
    pub child: Child,
    lines: Receiver<String>,
    pub stdout: Vec<String>,
    err_lines: Receiver<String>,
    pub stderr: Vec<String>,
}

impl Vmm {
    pub fn spawn(args: &[&str]) -> Vmm {
        Self::spawn_env(args, &[])
    }

    /// Like `spawn`, with extra environment variables.
    pub fn spawn_env(args: &[&str], env: &[(&str, &str)]) -> Vmm {
        let mut cmd = Command::new(teravm());
        cmd.args(args).envs(env.iter().copied());
        Vmm::spawn_command(cmd)
    }

    /// Spawns `cmd` (which must end up exec'ing teravm in the same process,
    /// e.g. `sh -c 'umask 0; exec teravm ...'`) with its output captured.
    pub fn spawn_command(mut cmd: Command) -> Vmm {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn teravm");
        let lines = read_lines(child.stdout.take().unwrap());
        let err_lines = read_lines(child.stderr.take().unwrap());
        Vmm {
            child,
            lines,
            stdout: Vec::new(),
            err_lines,
            stderr: Vec::new(),
        }
    }

    /// Waits for a stderr line (teravm's own output: the summary, logs)
    /// containing `needle` and returns it.
    pub fn wait_err_line(&mut self, needle: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.err_lines.recv_timeout(left) {
                Ok(line) => {
                    self.stderr.push(line.clone());
                    if line.contains(needle) {
                        return line;
                    }
                }
                Err(_) => {
                    let _ = self.child.kill();
                    panic!(
                        "no stderr line with {needle:?} within {timeout:?}; stderr so far: {:?}",
                        self.stderr
                    );
                }
            }
        }
    }

    /// Takes every line the process has written so far, waiting at most
    /// `timeout` for more (for a message about a process that is gone):
    /// (stdout, stderr).
    pub fn drain(&mut self, timeout: Duration) -> (Vec<String>, Vec<String>) {
        while let Ok(line) = self.lines.recv_timeout(timeout) {
            self.stdout.push(line);
        }
        while let Ok(line) = self.err_lines.recv_timeout(timeout) {
            self.stderr.push(line);
        }
        (self.stdout.clone(), self.stderr.clone())
    }

    /// The next stdout line, waiting at most `within`; None if none came
    /// (or stdout closed).
    pub fn next_line(&mut self, within: Duration) -> Option<String> {
        let line = self.lines.recv_timeout(within).ok()?;
        self.stdout.push(line.clone());
        Some(line)
    }

    /// Waits for a stdout line containing `needle` and returns it.
    pub fn wait_line(&mut self, needle: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.stdout.push(line.clone());
                    if line.contains(needle) {
                        return line;
                    }
                }
                Err(e) => {
                    let _ = self.child.kill();
                    let why = match e {
                        RecvTimeoutError::Timeout => format!("within {timeout:?}"),
                        RecvTimeoutError::Disconnected => "before stdout closed (it exited)".into(),
                    };
                    panic!(
                        "no line with {needle:?} {why}; stdout so far: {:?}",
                        self.stdout
                    );
                }
            }
        }
    }

    pub fn signal(&self, signo: i32) {
        // SAFETY: sending a signal to our own child process.
        assert_eq!(unsafe { libc::kill(self.child.id() as i32, signo) }, 0);
    }

    /// The resident set of the running process, in bytes (0 once it is gone).
    pub fn rss_bytes(&self) -> u64 {
        host::rss_bytes(self.child.id()).unwrap_or(0)
    }

    /// Waits for exit; returns (code, all stdout lines, all of stderr).
    pub fn wait(mut self, timeout: Duration) -> (i32, Vec<String>, String) {
        let deadline = Instant::now() + timeout;
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!(
                    "teravm did not exit within {timeout:?}; stdout: {:?}",
                    self.stdout
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        // Both readers end at EOF: once every holder of the pipes is gone.
        while let Ok(line) = self.lines.recv_timeout(Duration::from_secs(5)) {
            self.stdout.push(line);
        }
        while let Ok(line) = self.err_lines.recv_timeout(Duration::from_secs(5)) {
            self.stderr.push(line);
        }
        let mut stderr = self.stderr.join("\n");
        stderr.push('\n');
        (
            status.code().unwrap_or(-1),
            std::mem::take(&mut self.stdout),
            stderr,
        )
    }
}

impl Drop for Vmm {
    /// A test that fails midway must not leave a teravm (and its guest
    /// memory) behind.
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Waits until the API on `sock` answers `GET /`; panics after `timeout`.
pub fn wait_for_api(sock: &Path, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    loop {
        match client::request(sock, "GET", "/", None) {
            Ok((200, _)) => return,
            Ok((status, body)) => panic!("GET / answered {status}: {body}"),
            Err(e) if Instant::now() > deadline => {
                panic!(
                    "the API on {} did not answer within {timeout:?}: {e}",
                    sock.display()
                )
            }
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

/// Runs teravm to its end.
pub fn run(args: &[&str], timeout: Duration) -> (i32, Vec<String>, String) {
    Vmm::spawn(args).wait(timeout)
}

/// Reads `from` line by line on a thread of its own.
fn read_lines(from: impl Read + Send + 'static) -> Receiver<String> {
    let (tx, lines) = channel();
    std::thread::spawn(move || {
        for line in BufReader::new(from).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    lines
}

/// Runs `cmd` (any program: a peer such as Firecracker) to its end within
/// `timeout`: (exit code, stdout, stderr). One that runs on is killed and
/// the test panics with what it wrote, instead of hanging on `output()`.
pub fn output_within(mut cmd: Command, timeout: Duration) -> (i32, String, String) {
    let what = format!("{:?}", cmd.get_program());
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {what}: {e}"));
    let out = read_lines(child.stdout.take().unwrap());
    let err = read_lines(child.stderr.take().unwrap());
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            let out: Vec<String> = out.try_iter().collect();
            let err: Vec<String> = err.try_iter().collect();
            panic!(
                "{what} did not exit within {timeout:?} (killed); stdout: {out:?}; stderr: {err:?}"
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    // Both readers end at EOF, once the child (and anything it left
    // holding the pipes) is gone; a deadline all the same.
    let collect = |rx: Receiver<String>| {
        let mut v = Vec::new();
        while let Ok(line) = rx.recv_timeout(Duration::from_secs(5)) {
            v.push(line);
        }
        v.join("\n")
    };
    (status.code().unwrap_or(-1), collect(out), collect(err))
}

/// Parses the summary line on teravm's stderr: (MiB reclaimed, workers,
/// nodes). Only a line that starts with it counts: the guest's console is
/// stdout, and nothing it prints can pass for teravm's summary.
pub fn summary(stderr: &str) -> (u64, u32, u32) {
    let s = host::find_summary(stderr.lines())
        .unwrap_or_else(|| panic!("no summary line in stderr: {stderr}"));
    (s.mib, s.workers, s.nodes)
}

/// The N of the firmware's `touched N MiB in ...` line.
pub fn touched_mib(line: &str) -> u64 {
    host::parse_touched_mib(line).unwrap_or_else(|| panic!("not a touched line: {line:?}"))
}

/// A pipe: (read end, write end).
pub fn pipe() -> (OwnedFd, OwnedFd) {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 writes.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: both are new descriptors that nothing else owns.
    unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
}

/// Fills the pipe behind `w` until a write would block, then makes it
/// blocking again: the next writer waits until someone reads.
pub fn fill(w: &OwnedFd) -> usize {
    let fd = w.as_raw_fd();
    // SAFETY: fcntl on a descriptor we own.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    // SAFETY: as above.
    assert_eq!(
        unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) },
        0
    );
    let chunk = [b'x'; 4096];
    let mut filled = 0;
    loop {
        // SAFETY: writes from our buffer of that length.
        let n = unsafe { libc::write(fd, chunk.as_ptr().cast(), chunk.len()) };
        if n <= 0 {
            break;
        }
        filled += n as usize;
    }
    // SAFETY: as above.
    assert_eq!(unsafe { libc::fcntl(fd, libc::F_SETFL, flags) }, 0);
    filled
}

/// The resident size of process `pid`, in bytes (0 once it is gone).
pub fn rss_bytes_of(pid: u32) -> u64 {
    host::rss_bytes(pid).unwrap_or(0)
}

/// The read-write mappings of process `pid`, as `(start, end)` host
/// addresses from `/proc/<pid>/maps` (empty if it cannot be read).
pub fn rw_mappings(pid: u32) -> Vec<(u64, u64)> {
    let Ok(maps) = std::fs::read_to_string(format!("/proc/{pid}/maps")) else {
        return Vec::new();
    };
    maps.lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (range, perms) = (f.next()?, f.next()?);
            let (a, b) = range.split_once('-')?;
            let a = u64::from_str_radix(a, 16).ok()?;
            let b = u64::from_str_radix(b, 16).ok()?;
            perms.starts_with("rw").then_some((a, b))
        })
        .collect()
}
