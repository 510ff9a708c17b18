//! `--snapshot`'s processes: a VMM (Firecracker or teravm) started with
//! an API socket, its console read by a [`Console`], its stderr in a file
//! that an error quotes; the two requests a row times, the same for both
//! VMMs (Firecracker's API): the create of a booted, paused test guest
//! ([`Setup::create`]) and the load by a fresh process
//! ([`Setup::load`]); and the snapshot's files, removed when dropped.
//! Runs on the bench's main thread but the consoles' readers.

use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use teravm_client::http::{request, Connection};

use crate::args::Args;
use crate::guest::{covers_touched, Console, BOOT_TIMEOUT};
use crate::model::Pages;
use crate::resident::resident_of;
use crate::snapshot_text::{parse_user_sys, FileSize, SnapGuest, UserSys};

/// Which VMM a process is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The real Firecracker.
    Firecracker,
    /// teravm.
    Teravm,
}

/// Longest wait for an API request (a create of a large guest included).
const API_TIMEOUT: Duration = Duration::from_secs(1800);
/// Longest wait for the first `tick` after a load, or after the touch.
const TICK_TIMEOUT: Duration = Duration::from_secs(120);

/// The binaries and settings of a `--snapshot` run.
pub struct Setup<'a> {
    /// The command line.
    pub args: &'a Args,
    /// teravm's binary.
    pub teravm: PathBuf,
    /// Firecracker's, when its rows run.
    pub firecracker: Option<PathBuf>,
    /// The test guest.
    pub guest: PathBuf,
    /// Whether teravm binds guest memory to host nodes.
    pub bind: bool,
    /// Where the snapshot files go.
    pub dir: PathBuf,
}

/// A VMM process the bench started: its console (stdout), its stderr in a
/// file, its API socket, in a directory of its own (removed on drop).
struct Vmm {
    child: Child,
    console: Console,
    dir: PathBuf,
    sock: PathBuf,
}

impl Vmm {
    /// Starts `kind` from `bin` with an API socket and, when given, a
    /// config file (the microVM then boots at once); waits until the
    /// socket answers.
    fn spawn(
        kind: Kind,
        bin: &Path,
        config: Option<&str>,
        setup: &Setup<'_>,
    ) -> Result<Vmm, String> {
        static STARTS: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "teravm-bench-snapvmm-{}-{}",
            std::process::id(),
            STARTS.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let sock = dir.join("api.sock");
        let stderr = std::fs::File::create(dir.join("stderr"))
            .map_err(|e| format!("{}/stderr: {e}", dir.display()))?;
        let mut command = Command::new(bin);
        command.arg("--api-sock").arg(&sock);
        if let Some(config) = config {
            let cfg = dir.join("vm.json");
            std::fs::write(&cfg, config).map_err(|e| format!("{}: {e}", cfg.display()))?;
            command.arg("--config-file").arg(cfg);
        }
        if kind == Kind::Teravm {
            command.arg("--sysfs-root").arg(&setup.args.sysfs_root);
        }
        command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr);
        if setup.pages() == Pages::FourK {
            // SAFETY: the closure runs in the child between fork and exec; it
            // makes one system call (prctl, async-signal-safe), allocates
            // nothing and takes no lock.
            unsafe {
                command.pre_exec(|| {
                    if libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let mut child = command
            .spawn()
            .map_err(|e| format!("cannot run {}: {e}", bin.display()))?;
        let console = Console::new(child.stdout.take().ok_or("no pipe to its console")?);
        let mut vmm = Vmm {
            child,
            console,
            dir,
            sock,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while request(&vmm.sock, "GET", "/", None).is_err() {
            if Instant::now() > deadline || !matches!(vmm.child.try_wait(), Ok(None)) {
                return Err(vmm.why("its API socket never answered"));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(vmm)
    }

    /// `why`, with the last lines of the process's stderr.
    fn why(&self, why: impl Into<String>) -> String {
        let text = std::fs::read_to_string(self.dir.join("stderr")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
        let tail = lines[lines.len().saturating_sub(3)..].join(" | ");
        let mut why = why.into();
        if !tail.is_empty() {
            why.push_str(&format!("; it said: {tail}"));
        }
        why
    }

    /// A connection to its API, opened before a clock starts.
    fn connect(&self) -> Result<Connection, String> {
        let conn = Connection::open(&self.sock)
            .map_err(|e| format!("connect {}: {e}", self.sock.display()))?;
        conn.stream()
            .set_read_timeout(Some(API_TIMEOUT))
            .map_err(|e| e.to_string())?;
        Ok(conn)
    }

    /// One request that must be answered 2xx.
    fn call(
        &self,
        conn: &mut Connection,
        method: &str,
        path: &str,
        body: &str,
    ) -> Result<(), String> {
        let (status, reply) = conn
            .request(method, path, Some(body))
            .map_err(|e| self.why(format!("{method} {path}: {e}")))?;
        if !(200..300).contains(&status) {
            return Err(self.why(format!(
                "{method} {path} answered {status} {}",
                reply.trim()
            )));
        }
        Ok(())
    }

    /// Its user and system clock ticks now.
    fn ticks(&self) -> (u64, u64) {
        std::fs::read_to_string(format!("/proc/{}/stat", self.child.id()))
            .ok()
            .and_then(|l| parse_user_sys(&l))
            .unwrap_or((0, 0))
    }
}

impl Drop for Vmm {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The CPU seconds from `then` to `now` (clock ticks).
fn user_sys(then: (u64, u64), now: (u64, u64)) -> UserSys {
    let hz = crate::cputime::ticks_per_sec() as f64;
    UserSys {
        user_s: now.0.saturating_sub(then.0) as f64 / hz,
        sys_s: now.1.saturating_sub(then.1) as f64 / hz,
    }
}

/// A snapshot's two files, removed on drop.
pub struct Files {
    state: PathBuf,
    mem: PathBuf,
}

impl Files {
    /// `<dir>/<name>.state` and `<dir>/<name>.mem`.
    pub fn new(dir: &Path, name: &str) -> Files {
        Files {
            state: dir.join(format!("{name}.state")),
            mem: dir.join(format!("{name}.mem")),
        }
    }
}

impl Drop for Files {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.state);
        let _ = std::fs::remove_file(&self.mem);
    }
}

impl Setup<'_> {
    /// The page size of guest RAM: the first of `--pages`.
    pub fn pages(&self) -> Pages {
        self.args.pages.first().copied().unwrap_or(Pages::FourK)
    }

    fn binary(&self, kind: Kind) -> &Path {
        match kind {
            Kind::Firecracker => self
                .firecracker
                .as_deref()
                .unwrap_or(Path::new("firecracker")),
            Kind::Teravm => &self.teravm,
        }
    }

    /// The config that boots the test guest with 1 vCPU; teravm's with
    /// `workers` per node.
    fn config(&self, kind: Kind, guest: SnapGuest, workers: u32) -> String {
        let huge_pages = match self.pages() {
            Pages::FourK => "None",
            Pages::Thp => "Transparent",
        };
        let boot = serde_json::json!({
            "kernel_image_path": self.guest.display().to_string(),
            "boot_args": guest.boot_args(),
        });
        let machine = serde_json::json!({
            "vcpu_count": 1, "mem_size_mib": guest.size_gib << 10, "smt": false,
            "huge_pages": huge_pages,
        });
        match kind {
            Kind::Firecracker => serde_json::json!({
                "boot-source": boot, "drives": [], "machine-config": machine,
            }),
            Kind::Teravm => serde_json::json!({
                "boot-source": boot, "machine-config": machine,
                "memory": {"backing": "anonymous",
                           "numa_policy": if self.bind { "bind" } else { "none" },
                           "populate": false},
                "reclaim": {"workers_per_node": workers},
            }),
        }
        .to_string()
    }

    /// Boots the guest, pauses it and times the create into `files`.
    pub fn create(
        &self,
        kind: Kind,
        guest: SnapGuest,
        workers: u32,
        files: &Files,
    ) -> Result<(f64, UserSys, FileSize, u64), String> {
        let config = self.config(kind, guest, workers);
        let mut vmm = Vmm::spawn(kind, self.binary(kind), Some(&config), self)?;
        let touched_mib = vmm
            .console
            .wait_touched(BOOT_TIMEOUT)
            .map_err(|e| vmm.why(e))?;
        vmm.console
            .wait_word("tick ", TICK_TIMEOUT)
            .map_err(|e| vmm.why(e))?;
        let mut conn = vmm.connect()?;
        vmm.call(&mut conn, "PATCH", "/vm", r#"{"state": "Paused"}"#)?;
        let body = serde_json::json!({
            "snapshot_type": "Full",
            "snapshot_path": files.state.display().to_string(),
            "mem_file_path": files.mem.display().to_string(),
        })
        .to_string();
        let before = vmm.ticks();
        let start = Instant::now();
        vmm.call(&mut conn, "PUT", "/snapshot/create", &body)?;
        let seconds = start.elapsed().as_secs_f64();
        let cpu = user_sys(before, vmm.ticks());
        let meta =
            std::fs::metadata(&files.mem).map_err(|e| format!("{}: {e}", files.mem.display()))?;
        let file = FileSize {
            len: meta.len(),
            disk: meta.blocks() * 512,
        };
        if file.len != guest.full_bytes() {
            return Err(format!(
                "the memory file is {} bytes long, not the guest's {}",
                file.len,
                guest.full_bytes()
            ));
        }
        Ok((seconds, cpu, file, touched_mib))
    }

    /// A fresh process loads `files` and resumes; `eager`: teravm's
    /// `memory_load: "Eager"` with that many workers per node (`PUT
    /// /reclaim {"workers_per_node": w}` before the clock: the loading
    /// process's own reclaim settings are the load's), whose answer must
    /// find what the guest touched (`touched_mib`) resident. The answer's time, the first
    /// line's, the CPU time over the row's part (until the answer for an
    /// eager load, the first line for a lazy one) and the resident size at
    /// the end of that part.
    pub fn load(
        &self,
        kind: Kind,
        files: &Files,
        eager: Option<u32>,
        touched_mib: u64,
    ) -> Result<(f64, f64, UserSys, u64), String> {
        let mut vmm = Vmm::spawn(kind, self.binary(kind), None, self)?;
        let mut body = serde_json::json!({
            "snapshot_path": files.state.display().to_string(),
            "mem_backend": {"backend_type": "File",
                            "backend_path": files.mem.display().to_string()},
            "resume_vm": true,
        });
        let mut conn = vmm.connect()?;
        if let Some(workers) = eager {
            body["memory_load"] = "Eager".into();
            let reclaim = serde_json::json!({ "workers_per_node": workers }).to_string();
            vmm.call(&mut conn, "PUT", "/reclaim", &reclaim)?;
        }
        let eager = eager.is_some();
        let before = vmm.ticks();
        let start = Instant::now();
        vmm.call(&mut conn, "PUT", "/snapshot/load", &body.to_string())?;
        let answer = start.elapsed().as_secs_f64();
        let mut end = (vmm.ticks(), resident_of(vmm.child.id()));
        vmm.console
            .wait_word("tick ", TICK_TIMEOUT)
            .map_err(|e| vmm.why(e))?;
        let first = start.elapsed().as_secs_f64();
        if !eager {
            end = (vmm.ticks(), resident_of(vmm.child.id()));
        }
        let resident = end
            .1
            .ok_or_else(|| vmm.why("its /proc files cannot be read"))?;
        if eager && !covers_touched(&resident, touched_mib) {
            return Err(format!(
                "the eager load answered holding {} MiB resident, less than the {touched_mib} \
                 MiB the guest touched",
                resident.bytes >> 20
            ));
        }
        Ok((answer, first, user_sys(before, end.0), resident.bytes))
    }
}
