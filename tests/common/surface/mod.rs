//! The walk over the whole API surface, shared by `tests/api_surface.rs`
//! (teravm against its pinned table) and `tests/fc_differential.rs`
//! (Firecracker and teravm side by side): one list of cases ([`cases`]),
//! every endpoint and method of Firecracker's API and teravm's own, each
//! with a valid body and invalid ones, and every field that names a host
//! path with hostile paths, before and after `InstanceStart`, against a
//! [`Target`] started with its default flags (seccomp on).
//!
//! Every case checks the rule (a 2xx, or a 4xx whose JSON body has a
//! non-empty `fault_message`, within [`ANSWER`], and the process alive and
//! answering `GET /` afterwards; for host paths a `GET /` on a second
//! connection meanwhile within [`QUICK`]) and records its answer; the walk
//! does not stop at the first failure. A dead or hung process is replaced
//! by a fresh one in the same phase.
#![allow(dead_code)]

pub mod cases;
pub mod hotplug_cases;

use std::io::ErrorKind;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::client::{format_request, Connection};
use crate::common::*;

/// The longest any answer may take (a FIFO must not hold a request longer).
pub const ANSWER: Duration = Duration::from_secs(5);
/// How fast a `GET /` on a second connection must answer meanwhile.
pub const QUICK: Duration = Duration::from_secs(3);
/// How long a process that was told to stop may take to exit.
pub const EXIT: Duration = Duration::from_secs(60);
/// The longest excerpt of a `fault_message` in the table.
pub const EXCERPT_CHARS: usize = 72;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Before,
    After,
}

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Phase::Before => "before InstanceStart",
            Phase::After => "after InstanceStart",
        }
    }
}

/// The class of answer a case expects, on top of the rule (a 2xx, or a
/// 4xx with a `fault_message`). Every exact answer is pinned besides by the
/// table, which must equal `docs/api-surface.md`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// Either class; which one is pinned by the table.
    Normal,
    /// A 4xx: the request is malformed (bad JSON, an unknown field, a
    /// wrong type, out of range, no body, a wrong method).
    Refused,
    /// A 2xx, after which the process exits 0 (the VM was told to stop); a
    /// 4xx fails the case.
    Ends,
}

/// One row of the table: an endpoint and a case, with an answer per phase.
pub struct Row {
    pub endpoint: String,
    pub case: String,
    pub before: Option<String>,
    pub after: Option<String>,
    /// The answers of the phase (one but where a case was sent twice).
    pub before_answers: Vec<Answer>,
    pub after_answers: Vec<Answer>,
}

impl Row {
    /// The answers of `phase`.
    pub fn answers(&self, phase: Phase) -> &[Answer] {
        match phase {
            Phase::Before => &self.before_answers,
            Phase::After => &self.after_answers,
        }
    }
}

/// What came back, as the differential test compares it: the status and
/// whether a non-empty `fault_message` came, or why nothing came.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    Status {
        status: u16,
        fault: bool,
    },
    /// No answer within [`ANSWER`].
    Timeout,
    /// The connection closed without an answer.
    Dropped,
    /// The connection was refused.
    NoConnection,
}

impl std::fmt::Display for Answer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Answer::Status {
                status,
                fault: true,
            } => write!(f, "{status} fault"),
            Answer::Status {
                status,
                fault: false,
            } => write!(f, "{status}"),
            Answer::Timeout => f.write_str("timeout"),
            Answer::Dropped => f.write_str("dropped"),
            Answer::NoConnection => f.write_str("no connection"),
        }
    }
}

/// The VMM a walk runs against, and how.
#[derive(Debug, Clone)]
pub struct Target {
    /// The binary (teravm, or Firecracker): started as
    /// `<program> --api-sock <sock> --id walk` in the walk's dir.
    pub program: PathBuf,
    /// The `PUT /boot-source` body each process is set up with, and which
    /// the walk sets again after the boot-source cases.
    pub boot_source: String,
    /// The label of that case.
    pub boot_label: String,
    /// Whether an action that ends the VM must end the process (exit 0
    /// within [`EXIT`]); if not, its answer is recorded and the process
    /// killed.
    pub wait_exit: bool,
}

/// One request of the walk.
pub struct Req {
    pub endpoint: String,
    pub case: String,
    pub method: String,
    pub path: String,
    pub body: Option<String>,
    /// Send a `GET /` on a second connection while this one is outstanding.
    pub probe: bool,
    pub expect: Expect,
}

pub fn req(endpoint: &str, case: &str, method: &str, path: &str, body: Option<&str>) -> Req {
    Req {
        endpoint: endpoint.to_string(),
        case: case.to_string(),
        method: method.to_string(),
        path: path.to_string(),
        body: body.map(str::to_string),
        probe: false,
        expect: Expect::Normal,
    }
}

/// The walk: the process under test, the rows so far and the failures.
pub struct Walk {
    pub dir: PathBuf,
    pub target: Target,
    pub vmm: Vmm,
    pub sock: PathBuf,
    pub phase: Phase,
    spawned: u32,
    pub rows: Vec<Row>,
    pub failures: Vec<String>,
    /// What the case being run broke so far (one failure line per case).
    broken: Vec<String>,
    fifos: u32,
}

impl Walk {
    pub fn new(dir: PathBuf, target: Target) -> Walk {
        let (vmm, sock) = spawn_in(&dir, 0, Phase::Before, &target);
        Walk {
            dir,
            target,
            vmm,
            sock,
            phase: Phase::Before,
            spawned: 1,
            rows: Vec::new(),
            failures: Vec::new(),
            broken: Vec::new(),
            fifos: 0,
        }
    }

    /// A fresh teravm in `phase`, in place of the one under test; returns
    /// the old one.
    pub fn replace(&mut self, phase: Phase) -> (Vmm, PathBuf) {
        let (vmm, sock) = spawn_in(&self.dir, self.spawned, phase, &self.target);
        self.spawned += 1;
        (
            std::mem::replace(&mut self.vmm, vmm),
            std::mem::replace(&mut self.sock, sock),
        )
    }

    /// Notes what the case being run broke.
    pub fn fail(&mut self, what: String) {
        self.broken.push(what);
    }

    /// Ends a case: one failure line with all it broke, if anything.
    pub fn finish(&mut self, r: &Req) {
        if self.broken.is_empty() {
            return;
        }
        let broken = std::mem::take(&mut self.broken).join("; ");
        self.failures.push(format!(
            "[{}] {} {} {} ({}): {broken}",
            self.phase.name(),
            r.method,
            r.path,
            r.body
                .as_deref()
                .map_or("<no body>".into(), |b| shorten(b, 160)),
            r.case
        ));
    }

    fn record(&mut self, r: &Req, cell: String, answer: Answer) {
        let cell = cell.replace(self.dir.to_str().unwrap(), "$DIR");
        let row = match self
            .rows
            .iter_mut()
            .find(|row| row.endpoint == r.endpoint && row.case == r.case)
        {
            Some(row) => row,
            None => {
                self.rows.push(Row {
                    endpoint: r.endpoint.clone(),
                    case: r.case.clone(),
                    before: None,
                    after: None,
                    before_answers: Vec::new(),
                    after_answers: Vec::new(),
                });
                self.rows.last_mut().unwrap()
            }
        };
        let (slot, answers) = match self.phase {
            Phase::Before => (&mut row.before, &mut row.before_answers),
            Phase::After => (&mut row.after, &mut row.after_answers),
        };
        answers.push(answer);
        *slot = Some(match slot.take() {
            Some(old) => format!("{old}; {cell}"),
            None => cell,
        });
    }

    /// Runs one case and checks everything the module doc says.
    pub fn case(&mut self, r: Req) {
        let (cell, reply, answer) = self.exchange(&r);
        let mut cell = cell;
        if let Some((status, body)) = &reply {
            if let Err(why) = check_answer(*status, body) {
                self.fail(why);
            }
        }
        let status = reply.as_ref().map(|(s, _)| *s);
        match (r.expect, status) {
            (Expect::Refused, Some(s)) if !(400..500).contains(&s) => {
                self.fail(format!("a malformed request answered {s}, not a 4xx"));
            }
            (Expect::Ends, Some(s)) if !(200..300).contains(&s) => {
                self.fail(format!(
                    "an action that ends the VM answered {s}, not a 2xx"
                ));
            }
            _ => {}
        }
        match r.expect {
            Expect::Normal | Expect::Refused => {
                if let Some((note, why)) = self.check_alive() {
                    cell = format!("{cell}; {note}");
                    self.fail(why);
                }
            }
            Expect::Ends if !self.target.wait_exit => {
                let phase = self.phase;
                drop(self.replace(phase));
            }
            Expect::Ends => {
                if reply.as_ref().is_some_and(|(s, _)| (200..300).contains(s)) {
                    let phase = self.phase;
                    let (old, _) = self.replace(phase);
                    let (code, _, stderr) = old.wait(EXIT);
                    cell = format!("{cell}; exits {code}");
                    if code != 0 {
                        self.fail(format!("exit {code}; stderr tail: {}", tail(&stderr)));
                    }
                }
            }
        }
        self.record(&r, cell, answer);
        self.finish(&r);
    }

    /// Sends the request; returns the table cell, the reply if any, and
    /// the answer.
    fn exchange(&mut self, r: &Req) -> (String, Option<(u16, String)>, Answer) {
        let mut conn = match Connection::open(&self.sock) {
            Ok(c) => c,
            Err(e) => {
                self.fail(format!("connect: {e}"));
                return (format!("NO CONNECTION ({e})"), None, Answer::NoConnection);
            }
        };
        conn.stream().set_read_timeout(Some(ANSWER)).unwrap();
        let started = Instant::now();
        let bytes = format_request(&r.method, &r.path, r.body.as_deref());
        if let Err(e) = conn.send_raw(bytes.as_bytes()) {
            self.fail(format!("send: {e}"));
            return (format!("SEND FAILED ({e})"), None, Answer::Dropped);
        }
        if r.probe {
            let probe = Instant::now();
            match quick_get(&self.sock) {
                Ok(200) if probe.elapsed() <= QUICK => {}
                Ok(status) => {
                    let why = format!(
                        "GET / on a second connection meanwhile answered {status} after {:?}",
                        probe.elapsed()
                    );
                    self.fail(why);
                }
                Err(e) => {
                    let why = format!(
                        "GET / on a second connection meanwhile got no answer after {:?}: {e}",
                        probe.elapsed()
                    );
                    self.fail(why);
                }
            }
        }
        match conn.read_reply() {
            Ok(reply) => {
                let took = started.elapsed();
                if took > ANSWER {
                    self.fail(format!("answered after {took:?}"));
                }
                let body = reply.body.replace(self.dir.to_str().unwrap(), "$DIR");
                let answer = Answer::Status {
                    status: reply.status,
                    fault: fault_message(&body).is_some_and(|m| !m.trim().is_empty()),
                };
                (
                    cell_of(reply.status, &body),
                    Some((reply.status, reply.body)),
                    answer,
                )
            }
            Err(e) => {
                let (what, answer) = match e.kind() {
                    ErrorKind::WouldBlock | ErrorKind::TimedOut => {
                        (format!("NO ANSWER within {ANSWER:?}"), Answer::Timeout)
                    }
                    _ => (format!("DROPPED ({e})"), Answer::Dropped),
                };
                self.fail(what.clone());
                (what, None, answer)
            }
        }
    }

    /// Why the process under test is not healthy, if it is not (dead, or
    /// not answering `GET /`): a short note for the table and the details.
    /// An unhealthy process is replaced by a fresh one in the same phase.
    pub fn check_alive(&mut self) -> Option<(String, String)> {
        let phase = self.phase;
        let mut exited = self.vmm.child.try_wait().unwrap();
        let mut answered = Ok(0);
        if exited.is_none() {
            answered = quick_get(&self.sock);
            if answered.is_err() {
                // A dying process may not be reaped yet: give it a moment.
                let deadline = Instant::now() + QUICK;
                while exited.is_none() && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(10));
                    exited = self.vmm.child.try_wait().unwrap();
                }
            }
        }
        if let Some(status) = exited {
            let code = status
                .code()
                .map_or_else(|| format!("{status}"), |c| c.to_string());
            let (old, _) = self.replace(phase);
            let (_, _, stderr) = old.wait(EXIT);
            return Some((
                format!("DIED (exit {code})"),
                format!("teravm died (exit {code}); stderr tail: {}", tail(&stderr)),
            ));
        }
        let why = match answered {
            Ok(200) => return None,
            Ok(status) => format!("alive but GET / answered {status}"),
            Err(e) => format!("alive but GET / got no answer: {e}"),
        };
        drop(self.replace(phase));
        Some((why.clone(), why))
    }

    /// Runs `f` against a fresh teravm in the current phase, then goes back
    /// to the process under test.
    pub fn fresh(&mut self, f: impl FnOnce(&mut Walk)) {
        let phase = self.phase;
        let (main, main_sock) = self.replace(phase);
        f(self);
        let side = std::mem::replace(&mut self.vmm, main);
        self.sock = main_sock;
        drop(side);
    }

    fn fifo(&mut self) -> PathBuf {
        self.fifos += 1;
        let path = self.dir.join(format!("fifo-{}", self.fifos));
        let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
        // SAFETY: mkfifo on a NUL-terminated path we own.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
        path
    }

    /// The hostile values for a host-path field, as (label, JSON literal).
    /// Each call makes a fresh FIFO, so that no open of an earlier case
    /// holds its other end.
    pub fn hostile_paths(&mut self) -> Vec<(String, String)> {
        let d = self.dir.clone();
        let lit = |p: &Path| serde_json::to_string(p.to_str().unwrap()).unwrap();
        let fifo = self.fifo();
        let unreadable = d.join("unreadable");
        let readable_anyway = std::fs::File::open(&unreadable).is_ok();
        let long_name = d.join("a".repeat(300));
        let long_path = format!("{}/{}", d.display(), "a/".repeat(2100));
        vec![
            ("missing file".into(), lit(&d.join("missing"))),
            ("a directory".into(), lit(&d)),
            ("/dev/zero".into(), lit(Path::new("/dev/zero"))),
            ("a FIFO with no other end".into(), lit(&fifo)),
            (
                "symlink to a real file".into(),
                lit(&d.join("link-to-real")),
            ),
            ("dangling symlink".into(), lit(&d.join("link-dangling"))),
            (
                if readable_anyway {
                    "chmod 000 file (root reads it anyway)".into()
                } else {
                    "unreadable file (chmod 000)".into()
                },
                lit(&unreadable),
            ),
            (
                "relative path (real.txt)".into(),
                lit(Path::new("real.txt")),
            ),
            ("empty string".into(), "\"\"".into()),
            (
                "NUL inside (\\u0000)".into(),
                serde_json::to_string(&format!("{}/a\u{0}b", d.display())).unwrap(),
            ),
            ("300-byte file name".into(), lit(&long_name)),
            (
                "path over 4096 bytes".into(),
                serde_json::to_string(&long_path).unwrap(),
            ),
        ]
    }

    /// The host-path cases of one field: `body` makes the body from the
    /// JSON literal of the path.
    pub fn path_cases(
        &mut self,
        endpoint: &str,
        method: &str,
        path: &str,
        field: &str,
        body: impl Fn(&str) -> String,
    ) {
        for (label, lit) in self.hostile_paths() {
            let mut r = req(
                endpoint,
                &format!("{field}: {label}"),
                method,
                path,
                Some(&body(&lit)),
            );
            r.probe = true;
            self.case_noting_created(r);
        }
    }

    /// [`Walk::case`], noting in the cell when the case created the
    /// dangling symlink's target (a create that followed the symlink).
    pub fn case_noting_created(&mut self, r: Req) {
        let target = self.dir.join("nowhere");
        let (endpoint, case) = (r.endpoint.clone(), r.case.clone());
        self.case(r);
        if target.exists() {
            let _ = std::fs::remove_file(&target);
            let phase = self.phase;
            if let Some(row) = self
                .rows
                .iter_mut()
                .find(|row| row.endpoint == endpoint && row.case == case)
            {
                let slot = match phase {
                    Phase::Before => &mut row.before,
                    Phase::After => &mut row.after,
                };
                if let Some(cell) = slot {
                    cell.push_str(" (followed the symlink: created its target)");
                }
            }
        }
    }
}

/// Starts the target (default flags) with its working directory in `dir`,
/// configured small; starts the VM if `phase` is after `InstanceStart`.
fn spawn_in(dir: &Path, n: u32, phase: Phase, target: &Target) -> (Vmm, PathBuf) {
    let sock = dir.join(format!("api-{n}.sock"));
    let mut cmd = Command::new(&target.program);
    cmd.args(["--api-sock", sock.to_str().unwrap(), "--id", "walk"])
        .current_dir(dir);
    let vmm = Vmm::spawn_command(cmd);
    wait_for_api(&sock, EXIT);
    for (path, body) in [
        (
            "/machine-config",
            r#"{"vcpu_count": 1, "mem_size_mib": 128, "huge_pages": "None"}"#,
        ),
        ("/boot-source", target.boot_source.as_str()),
    ] {
        let (status, reply) =
            crate::common::client::request(&sock, "PUT", path, Some(body)).unwrap();
        assert_eq!(status, 204, "PUT {path}: {reply}");
    }
    if phase == Phase::After {
        let (status, reply) = crate::common::client::request(
            &sock,
            "PUT",
            "/actions",
            Some(r#"{"action_type": "InstanceStart"}"#),
        )
        .unwrap();
        assert_eq!(status, 204, "InstanceStart: {reply}");
    }
    (vmm, sock)
}

/// `GET /` on a new connection, waiting at most [`QUICK`].
fn quick_get(sock: &Path) -> std::io::Result<u16> {
    let mut conn = Connection::open(sock)?;
    conn.stream().set_read_timeout(Some(QUICK))?;
    conn.request("GET", "/", None).map(|(status, _)| status)
}

/// Whether an answer keeps the rule: a 2xx, or a 4xx with a non-empty
/// `fault_message`.
pub fn check_answer(status: u16, body: &str) -> Result<(), String> {
    match status {
        200..=299 => Ok(()),
        400..=499 => match fault_message(body) {
            Some(m) if !m.trim().is_empty() => Ok(()),
            _ => Err(format!("{status} without a fault_message: {body:?}")),
        },
        _ => Err(format!("answered {status}: {}", shorten(body, 300))),
    }
}

pub fn fault_message(body: &str) -> Option<String> {
    serde_json::from_str::<Value>(body).ok()?["fault_message"]
        .as_str()
        .map(str::to_string)
}

/// The table cell of an answer: the status and an excerpt of the fault.
pub fn cell_of(status: u16, body: &str) -> String {
    match fault_message(body) {
        Some(m) => {
            // Control characters (a NUL echoed from a path) as escapes.
            let m: String = m
                .chars()
                .map(|c| {
                    if c.is_control() {
                        c.escape_default().to_string()
                    } else {
                        c.to_string()
                    }
                })
                .collect();
            format!(
                "{status} `{}`",
                shorten(&m, EXCERPT_CHARS).replace('`', "'")
            )
        }
        None => status.to_string(),
    }
}

pub fn shorten(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_string()
    } else {
        let cut: String = s.chars().take(max).collect();
        format!("{cut}…")
    }
}

pub fn tail(stderr: &str) -> String {
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(3)..].join(" | ")
}

/// The first 64 bytes of an x86-64 ELF file: enough for the cheap check of
/// `PUT /boot-source` (the walk never starts it).
pub fn elf_head() -> Vec<u8> {
    let mut b = vec![0u8; 64];
    b[..4].copy_from_slice(b"\x7fELF");
    b[4] = 2; // 64-bit
    b[5] = 1; // little endian
    b[6] = 1; // version
    b[16] = 2; // ET_EXEC
    b[18] = 62; // x86-64
    b
}

/// The files the hostile paths point at.
pub fn hostile_files(dir: &Path) {
    std::fs::write(dir.join("real.txt"), "a real file\n").unwrap();
    std::os::unix::fs::symlink(dir.join("real.txt"), dir.join("link-to-real")).unwrap();
    std::os::unix::fs::symlink(dir.join("nowhere"), dir.join("link-dangling")).unwrap();
    let unreadable = dir.join("unreadable");
    std::fs::write(&unreadable, "unreadable\n").unwrap();
    std::fs::set_permissions(&unreadable, std::fs::Permissions::from_mode(0o000)).unwrap();
}

/// The whole walk against `target` in `dir` (which gets the hostile
/// files): the cases before `InstanceStart`, the start, the cases after
/// it, then the actions that end the VM, each in a process of its own but
/// the last, which ends the process under test.
pub fn run(dir: &Path, target: Target) -> Walk {
    hostile_files(dir);
    let mut w = Walk::new(dir.to_path_buf(), target);

    cases::walk_phase(&mut w);
    w.case(req(
        "PUT /actions",
        "InstanceStart",
        "PUT",
        "/actions",
        Some(r#"{"action_type": "InstanceStart"}"#),
    ));

    w.phase = Phase::After;
    if let Some((_, why)) = w.check_alive() {
        let r = req("PUT /actions", "InstanceStart", "PUT", "/actions", None);
        w.fail(why);
        w.finish(&r);
    }
    if get_state(&w.sock) != "Running" {
        // The start failed or the process was replaced: start a fresh one.
        drop(w.replace(Phase::After));
    }
    cases::walk_phase(&mut w);

    let ep = "PUT /actions";
    for (case, body) in [
        ("SendCtrlAltDel", r#"{"action_type": "SendCtrlAltDel"}"#),
        (
            "Shutdown async",
            r#"{"action_type": "Shutdown", "reclaim": "async"}"#,
        ),
    ] {
        w.fresh(|w| {
            let mut r = req(ep, case, "PUT", "/actions", Some(body));
            r.expect = Expect::Ends;
            w.case(r);
        });
    }
    let mut r = req(
        ep,
        "Shutdown sync",
        "PUT",
        "/actions",
        Some(r#"{"action_type": "Shutdown", "reclaim": "sync"}"#),
    );
    r.expect = Expect::Ends;
    w.case(r);
    let _ = std::fs::set_permissions(
        dir.join("unreadable"),
        std::fs::Permissions::from_mode(0o600),
    );
    w
}

pub fn get_state(sock: &Path) -> String {
    match crate::common::client::request(sock, "GET", "/", None) {
        Ok((200, body)) => serde_json::from_str::<Value>(&body).unwrap()["state"]
            .as_str()
            .unwrap_or("")
            .to_string(),
        _ => String::new(),
    }
}
