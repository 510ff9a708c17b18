//! A walk over the whole API surface, with the default flags (seccomp on):
//! every endpoint and method of Firecracker's API and teravm's own, each
//! with a valid body and invalid ones, and every field that names a host
//! path with hostile paths (missing, a directory, `/dev/zero`, a FIFO, a
//! symlink, an unreadable file, relative, empty, NUL, too long), before
//! and after `InstanceStart`.
//!
//! Every case asserts that the answer is a 2xx, or a 4xx whose JSON body
//! has a non-empty `fault_message` (never a 5xx, never a dropped
//! connection), that it comes within [`ANSWER`], and that teravm is still
//! alive afterwards and answers `GET /`. Every host-path case also sends a
//! `GET /` on a second connection while the first request is outstanding
//! and asserts it answers within [`QUICK`]. The actions that end the VM
//! (`SendCtrlAltDel` once started, `Shutdown`) run last or in a process of
//! their own, and assert a clean exit instead.
//!
//! The walk does not stop at the first failure: it records every case (a
//! dead process is replaced by a fresh one in the same phase), then fails
//! with the whole list. The table of answers must equal
//! `docs/api-surface.md` (so every status of every case is pinned: a
//! change fails the test until the doc is regenerated and reviewed); with
//! `TERAVM_WRITE_API_TABLE=1` it writes that table to the doc first.
//! Malformed requests must answer a 4xx, the actions that end the VM a
//! 2xx and a clean exit.

mod common;

use std::fmt::Write as _;
use std::io::ErrorKind;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use common::client::{format_request, Connection};
use common::*;

/// The longest any answer may take (a FIFO must not hold a request longer).
const ANSWER: Duration = Duration::from_secs(5);
/// How fast a `GET /` on a second connection must answer meanwhile.
const QUICK: Duration = Duration::from_secs(3);
/// How long a process that was told to stop may take to exit.
const EXIT: Duration = Duration::from_secs(60);
/// The longest excerpt of a `fault_message` in the table.
const EXCERPT_CHARS: usize = 72;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Before,
    After,
}

impl Phase {
    fn name(self) -> &'static str {
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
enum Expect {
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
struct Row {
    endpoint: String,
    case: String,
    before: Option<String>,
    after: Option<String>,
}

/// One request of the walk.
struct Req {
    endpoint: String,
    case: String,
    method: String,
    path: String,
    body: Option<String>,
    /// Send a `GET /` on a second connection while this one is outstanding.
    probe: bool,
    expect: Expect,
}

fn req(endpoint: &str, case: &str, method: &str, path: &str, body: Option<&str>) -> Req {
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
struct Walk {
    dir: PathBuf,
    vmm: Vmm,
    sock: PathBuf,
    phase: Phase,
    spawned: u32,
    rows: Vec<Row>,
    failures: Vec<String>,
    /// What the case being run broke so far (one failure line per case).
    broken: Vec<String>,
    fifos: u32,
}

impl Walk {
    fn new(dir: PathBuf) -> Walk {
        let (vmm, sock) = spawn_in(&dir, 0, Phase::Before);
        Walk {
            dir,
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
    fn replace(&mut self, phase: Phase) -> (Vmm, PathBuf) {
        let (vmm, sock) = spawn_in(&self.dir, self.spawned, phase);
        self.spawned += 1;
        (
            std::mem::replace(&mut self.vmm, vmm),
            std::mem::replace(&mut self.sock, sock),
        )
    }

    /// Notes what the case being run broke.
    fn fail(&mut self, what: String) {
        self.broken.push(what);
    }

    /// Ends a case: one failure line with all it broke, if anything.
    fn finish(&mut self, r: &Req) {
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

    fn record(&mut self, r: &Req, cell: String) {
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
                });
                self.rows.last_mut().unwrap()
            }
        };
        let slot = match self.phase {
            Phase::Before => &mut row.before,
            Phase::After => &mut row.after,
        };
        *slot = Some(match slot.take() {
            Some(old) => format!("{old}; {cell}"),
            None => cell,
        });
    }

    /// Runs one case and checks everything the module doc says.
    fn case(&mut self, r: Req) {
        let (cell, reply) = self.exchange(&r);
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
        self.record(&r, cell);
        self.finish(&r);
    }

    /// Sends the request; returns the table cell and the reply, if any.
    fn exchange(&mut self, r: &Req) -> (String, Option<(u16, String)>) {
        let mut conn = match Connection::open(&self.sock) {
            Ok(c) => c,
            Err(e) => {
                self.fail(format!("connect: {e}"));
                return (format!("NO CONNECTION ({e})"), None);
            }
        };
        conn.stream().set_read_timeout(Some(ANSWER)).unwrap();
        let started = Instant::now();
        let bytes = format_request(&r.method, &r.path, r.body.as_deref());
        if let Err(e) = conn.send_raw(bytes.as_bytes()) {
            self.fail(format!("send: {e}"));
            return (format!("SEND FAILED ({e})"), None);
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
                (
                    cell_of(reply.status, &body),
                    Some((reply.status, reply.body)),
                )
            }
            Err(e) => {
                let what = match e.kind() {
                    ErrorKind::WouldBlock | ErrorKind::TimedOut => {
                        format!("NO ANSWER within {ANSWER:?}")
                    }
                    _ => format!("DROPPED ({e})"),
                };
                self.fail(what.clone());
                (what, None)
            }
        }
    }

    /// Why the process under test is not healthy, if it is not (dead, or
    /// not answering `GET /`): a short note for the table and the details.
    /// An unhealthy process is replaced by a fresh one in the same phase.
    fn check_alive(&mut self) -> Option<(String, String)> {
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
    fn fresh(&mut self, f: impl FnOnce(&mut Walk)) {
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
    fn hostile_paths(&mut self) -> Vec<(String, String)> {
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
    fn path_cases(
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
    fn case_noting_created(&mut self, r: Req) {
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

/// Starts teravm (default flags) with its working directory in `dir`,
/// configured small; starts the VM if `phase` is after `InstanceStart`.
fn spawn_in(dir: &Path, n: u32, phase: Phase) -> (Vmm, PathBuf) {
    let sock = dir.join(format!("api-{n}.sock"));
    let mut cmd = Command::new(teravm());
    cmd.args(["--api-sock", sock.to_str().unwrap(), "--id", "walk"])
        .current_dir(dir);
    let vmm = Vmm::spawn_command(cmd);
    wait_for_api(&sock, EXIT);
    for (path, body) in [
        (
            "/machine-config",
            r#"{"vcpu_count": 1, "mem_size_mib": 128, "huge_pages": "None"}"#,
        ),
        ("/boot-source", r#"{"boot_args": "then=idle"}"#),
    ] {
        let (status, reply) = common::client::request(&sock, "PUT", path, Some(body)).unwrap();
        assert_eq!(status, 204, "PUT {path}: {reply}");
    }
    if phase == Phase::After {
        let (status, reply) = common::client::request(
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
fn check_answer(status: u16, body: &str) -> Result<(), String> {
    match status {
        200..=299 => Ok(()),
        400..=499 => match fault_message(body) {
            Some(m) if !m.trim().is_empty() => Ok(()),
            _ => Err(format!("{status} without a fault_message: {body:?}")),
        },
        _ => Err(format!("answered {status}: {}", shorten(body, 300))),
    }
}

fn fault_message(body: &str) -> Option<String> {
    serde_json::from_str::<Value>(body).ok()?["fault_message"]
        .as_str()
        .map(str::to_string)
}

/// The table cell of an answer: the status and an excerpt of the fault.
fn cell_of(status: u16, body: &str) -> String {
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

fn shorten(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_string()
    } else {
        let cut: String = s.chars().take(max).collect();
        format!("{cut}…")
    }
}

fn tail(stderr: &str) -> String {
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(3)..].join(" | ")
}

/// The same body with the first field's value replaced by `[]` (a string
/// for a body without fields).
fn wrong_type(valid: &str) -> String {
    let mut v: Value = serde_json::from_str(valid).unwrap();
    let map = v.as_object_mut().unwrap();
    let Some(key) = map.keys().next().cloned() else {
        return r#""a string""#.into();
    };
    // An array where one is due (cpu-config's lists) takes a string.
    let wrong = if map[&key].is_array() {
        json!("a string")
    } else {
        json!([])
    };
    map.insert(key, wrong);
    v.to_string()
}

/// The same body with an unknown field added.
fn unknown_field(valid: &str) -> String {
    let mut v: Value = serde_json::from_str(valid).unwrap();
    v.as_object_mut()
        .unwrap()
        .insert("no_such_field".into(), json!(1));
    v.to_string()
}

const BAD_JSON: &str = "{ not json }";

/// The generic cases of a resource that takes a body: valid, bad JSON,
/// unknown field, wrong type, `out_of_range` (if any), empty body, not an
/// object.
fn body_cases(w: &mut Walk, method: &str, path: &str, valid: &str, out_of_range: &[(&str, &str)]) {
    let ep = format!("{method} {path}");
    let e = ep.as_str();
    w.case(req(e, "valid", method, path, Some(valid)));
    let refused = |case: &str, body: &str| {
        let mut r = req(e, case, method, path, Some(body));
        r.expect = Expect::Refused;
        r
    };
    w.case(refused("bad JSON", BAD_JSON));
    w.case(refused("unknown field", &unknown_field(valid)));
    w.case(refused("wrong type", &wrong_type(valid)));
    // The extra cases: those named "out of range ...", "unknown ...",
    // "missing ..." or "bad ..." are malformed; the others are variants
    // whose answer the table pins.
    for (case, body) in out_of_range {
        let malformed = ["out of range", "unknown ", "missing ", "bad "];
        if malformed.iter().any(|m| case.starts_with(m)) {
            w.case(refused(case, body));
        } else {
            w.case(req(e, case, method, path, Some(body)));
        }
    }
    w.case(refused("empty body", ""));
    w.case(refused("not an object ([])", "[]"));
}

/// A GET resource: valid, with a body, and a wrong method.
fn get_cases(w: &mut Walk, path: &str, wrong: &str) {
    let ep = format!("GET {path}");
    w.case(req(&ep, "valid", "GET", path, None));
    w.case(req(&ep, "with a body", "GET", path, Some("{}")));
    let ep = format!("{wrong} {path}");
    let mut r = req(&ep, "wrong method", wrong, path, Some("{}"));
    r.expect = Expect::Refused;
    w.case(r);
}

/// A resource: method, path, a valid body, out-of-range bodies.
type Unsupported<'a> = (&'a str, &'a str, String, Vec<(&'a str, String)>);

/// Firecracker's drives, network interfaces and vsock: checked by the API
/// thread, then put by the VMM (which opens the file, the TAP device or
/// the socket, and answers 400 when it cannot).
fn device_cases(w: &mut Walk) {
    let d = w.dir.display().to_string();
    let drive = r#"{"drive_id": "rootfs", "path_on_host": "/dev/null", "is_root_device": true, "is_read_only": false}"#;
    let bodies: Vec<Unsupported> = vec![
        (
            "PUT",
            "/drives/rootfs",
            drive.to_string(),
            vec![
                (
                    "id differs from the path's",
                    drive.replace("\"rootfs\"", "\"other\""),
                ),
                (
                    "io_engine Async",
                    drive.replace('}', r#", "io_engine": "Async"}"#),
                ),
                (
                    "rate_limiter",
                    drive.replace(
                        '}',
                        r#", "rate_limiter": {"bandwidth": {"size": 1, "refill_time": 100}}}"#,
                    ),
                ),
            ],
        ),
        (
            "PATCH",
            "/drives/rootfs",
            r#"{"drive_id": "rootfs", "path_on_host": "/dev/null"}"#.into(),
            vec![],
        ),
        (
            "PUT",
            "/network-interfaces/eth0",
            r#"{"iface_id": "eth0", "host_dev_name": "tap0"}"#.into(),
            vec![(
                "multicast guest_mac",
                r#"{"iface_id": "eth0", "host_dev_name": "tap0", "guest_mac": "01:00:5e:00:00:01"}"#
                    .into(),
            )],
        ),
        (
            "PATCH",
            "/network-interfaces/eth0",
            r#"{"iface_id": "eth0"}"#.into(),
            vec![],
        ),
        (
            "PUT",
            "/vsock",
            format!(r#"{{"guest_cid": 3, "uds_path": "{d}/v.sock"}}"#),
            vec![(
                "out of range (guest_cid 0)",
                format!(r#"{{"guest_cid": 0, "uds_path": "{d}/v.sock"}}"#),
            )],
        ),
    ];
    for (method, path, valid, oor) in &bodies {
        let oor: Vec<(&str, &str)> = oor.iter().map(|(c, b)| (*c, b.as_str())).collect();
        body_cases(w, method, path, valid, &oor);
    }
    // The MMDS's contents are any JSON (an unknown field, another type, an
    // array are metadata too, as in Firecracker): only non-JSON is refused.
    for (method, valid) in [
        ("PUT", r#"{"latest": {"x": 1}}"#),
        ("PATCH", r#"{"latest": {"x": 2}}"#),
    ] {
        let ep = format!("{method} /mmds");
        w.case(req(&ep, "valid", method, "/mmds", Some(valid)));
        w.case(req(&ep, "an array", method, "/mmds", Some("[]")));
        for (case, body) in [("bad JSON", BAD_JSON), ("empty body", "")] {
            let mut r = req(&ep, case, method, "/mmds", Some(body));
            r.expect = Expect::Refused;
            w.case(r);
        }
    }
    for path in ["/drives/rootfs", "/network-interfaces/eth0", "/vsock"] {
        let ep = format!("DELETE {path}");
        w.case(req(&ep, "wrong method", "DELETE", path, None));
    }
    // Host paths: the VMM opens them (or makes the socket).
    w.path_cases(
        "PUT /drives/rootfs",
        "PUT",
        "/drives/rootfs",
        "path_on_host",
        |p| {
            format!(
                r#"{{"drive_id": "rootfs", "path_on_host": {p}, "is_root_device": true, "is_read_only": false}}"#
            )
        },
    );
    w.path_cases("PUT /vsock", "PUT", "/vsock", "uds_path", |p| {
        format!(r#"{{"guest_cid": 3, "uds_path": {p}}}"#)
    });
}

/// Firecracker's resources for features teravm lacks.
fn unsupported_cases(w: &mut Walk) {
    let d = w.dir.display().to_string();
    let bodies: Vec<Unsupported> = vec![
        (
            "PUT",
            "/mmds/config",
            r#"{"network_interfaces": ["eth0"], "version": "V2"}"#.into(),
            vec![],
        ),
        (
            "PUT",
            "/snapshot/create",
            format!(r#"{{"snapshot_path": "{d}/snap", "mem_file_path": "{d}/mem"}}"#),
            vec![],
        ),
        (
            "PUT",
            "/snapshot/load",
            format!(
                r#"{{"snapshot_path": "{d}/snap", "mem_backend": {{"backend_path": "{d}/mem", "backend_type": "File"}}}}"#
            ),
            vec![],
        ),
        (
            "PUT",
            "/cpu-config",
            r#"{"cpuid_modifiers": [], "msr_modifiers": []}"#.into(),
            vec![],
        ),
        (
            "PUT",
            "/entropy",
            r#"{"rate_limiter": {"bandwidth": {"size": 1, "refill_time": 100}}}"#.into(),
            vec![],
        ),
        ("PATCH", "/vm", r#"{"state": "Paused"}"#.into(), vec![]),
        (
            "PUT",
            "/hotplug/memory",
            r#"{"total_size_mib": 1024, "slot_size_mib": 128, "block_size_mib": 2}"#.into(),
            vec![],
        ),
        (
            "PATCH",
            "/hotplug/memory",
            r#"{"requested_size_mib": 256}"#.into(),
            vec![],
        ),
        (
            "PUT",
            "/serial",
            format!(r#"{{"serial_out_path": "{d}/serial.out"}}"#),
            vec![],
        ),
    ];
    for (method, path, valid, oor) in &bodies {
        let oor: Vec<(&str, &str)> = oor.iter().map(|(c, b)| (*c, b.as_str())).collect();
        body_cases(w, method, path, valid, &oor);
    }
    for path in ["/mmds", "/hotplug/memory"] {
        let ep = format!("GET {path}");
        w.case(req(&ep, "valid", "GET", path, None));
    }
    for path in [
        "/mmds",
        "/snapshot/create",
        "/cpu-config",
        "/entropy",
        "/vm",
        "/hotplug/memory",
        "/serial",
    ] {
        let ep = format!("DELETE {path}");
        w.case(req(&ep, "wrong method", "DELETE", path, None));
    }
}

/// The cases of one phase, except the actions that end the VM.
fn walk_phase(w: &mut Walk) {
    let d = w.dir.display().to_string();
    let elf = format!("{d}/vmlinux-head");

    // GET-only resources.
    get_cases(w, "/", "PUT");
    get_cases(w, "/version", "PUT");
    get_cases(w, "/vm/config", "PUT");
    w.case(req("GET /vm", "not a resource", "GET", "/vm", None));
    w.case(req(
        "GET /nowhere",
        "not a resource",
        "GET",
        "/nowhere",
        None,
    ));

    // machine-config.
    get_cases(w, "/machine-config", "DELETE");
    body_cases(
        w,
        "PUT",
        "/machine-config",
        r#"{"vcpu_count": 1, "mem_size_mib": 128, "huge_pages": "None"}"#,
        &[
            (
                "out of range (vcpu_count 0)",
                r#"{"vcpu_count": 0, "mem_size_mib": 128}"#,
            ),
            (
                "out of range (vcpu_count 300, over u8)",
                r#"{"vcpu_count": 300, "mem_size_mib": 128}"#,
            ),
            (
                "out of range (mem_size_mib 1)",
                r#"{"vcpu_count": 1, "mem_size_mib": 1}"#,
            ),
            (
                "out of range (mem_size_mib u64::MAX)",
                r#"{"vcpu_count": 1, "mem_size_mib": 18446744073709551615}"#,
            ),
            (
                "1G huge pages on 129 MiB",
                r#"{"vcpu_count": 1, "mem_size_mib": 129, "huge_pages": "1G"}"#,
            ),
            (
                "smt with an odd vcpu_count",
                r#"{"vcpu_count": 3, "mem_size_mib": 128, "smt": true}"#,
            ),
            (
                "vcpu_count over Firecracker's 32",
                r#"{"vcpu_count": 33, "mem_size_mib": 128}"#,
            ),
            ("missing mem_size_mib", r#"{"vcpu_count": 1}"#),
        ],
    );
    body_cases(
        w,
        "PATCH",
        "/machine-config",
        r#"{"vcpu_count": 1}"#,
        &[
            ("out of range (mem_size_mib 0)", r#"{"mem_size_mib": 0}"#),
            ("empty patch {}", "{}"),
            ("huge_pages 1G on 128 MiB", r#"{"huge_pages": "1G"}"#),
        ],
    );

    // boot-source, then its host paths (a valid kernel for the initrd's).
    std::fs::write(&elf, elf_head()).unwrap();
    body_cases(
        w,
        "PUT",
        "/boot-source",
        r#"{"boot_args": "then=idle"}"#,
        &[
            (
                "boot_args over 2048 bytes",
                &format!(r#"{{"boot_args": "{}"}}"#, "a".repeat(2100)),
            ),
            ("boot_args with \\u0007", r#"{"boot_args": "a\u0007b"}"#),
            (
                "initrd without a kernel",
                &format!(r#"{{"initrd_path": "{d}/real.txt"}}"#),
            ),
            (
                "kernel_image_path: an x86-64 ELF head",
                &format!(r#"{{"kernel_image_path": "{elf}"}}"#),
            ),
            (
                "kernel_image_path: a text file",
                &format!(r#"{{"kernel_image_path": "{d}/real.txt"}}"#),
            ),
        ],
    );
    w.case(req(
        "GET /boot-source",
        "wrong method",
        "GET",
        "/boot-source",
        None,
    ));
    let p = "/boot-source";
    w.path_cases("PUT /boot-source", "PUT", p, "kernel_image_path", |p| {
        format!(r#"{{"kernel_image_path": {p}}}"#)
    });
    w.path_cases("PUT /boot-source", "PUT", p, "initrd_path", |p| {
        format!(r#"{{"kernel_image_path": "{elf}", "initrd_path": {p}}}"#)
    });
    // Back to the firmware for the start.
    w.case(req(
        "PUT /boot-source",
        "valid (back to the firmware)",
        "PUT",
        p,
        Some(r#"{"boot_args": "then=idle"}"#),
    ));

    // logger.
    let log = format!("{d}/teravm.log");
    body_cases(
        w,
        "PUT",
        "/logger",
        &format!(r#"{{"log_path": "{log}", "level": "Info", "show_level": true}}"#),
        &[
            ("level only", r#"{"level": "Debug"}"#),
            ("unknown level", r#"{"level": "Loud"}"#),
            ("bad module", r#"{"module": "a b"}"#),
        ],
    );
    w.case(req("GET /logger", "wrong method", "GET", "/logger", None));
    w.path_cases("PUT /logger", "PUT", "/logger", "log_path", |p| {
        format!(r#"{{"log_path": {p}}}"#)
    });
    w.case(req(
        "PUT /logger",
        "valid (back to the log file)",
        "PUT",
        "/logger",
        Some(&format!(r#"{{"log_path": "{log}"}}"#)),
    ));

    // metrics: once per process, so each path case runs in a fresh one.
    let metrics = format!(r#"{{"metrics_path": "{d}/metrics-{:?}.json"}}"#, w.phase);
    let metrics_valid = metrics.clone();
    w.case(req(
        "PUT /actions",
        "FlushMetrics (no metrics path)",
        "PUT",
        "/actions",
        Some(r#"{"action_type": "FlushMetrics"}"#),
    ));
    for (case, body) in [
        ("bad JSON", BAD_JSON.to_string()),
        ("unknown field", unknown_field(&metrics)),
        ("wrong type", wrong_type(&metrics)),
        ("missing metrics_path", "{}".to_string()),
        ("empty body", String::new()),
        ("not an object ([])", "[]".to_string()),
    ] {
        w.case(req("PUT /metrics", case, "PUT", "/metrics", Some(&body)));
    }
    w.case(req("GET /metrics", "wrong method", "GET", "/metrics", None));
    for (label, lit) in w.hostile_paths() {
        w.fresh(|w| {
            let mut r = req(
                "PUT /metrics",
                &format!("metrics_path: {label}"),
                "PUT",
                "/metrics",
                Some(&format!(r#"{{"metrics_path": {lit}}}"#)),
            );
            r.probe = true;
            w.case_noting_created(r);
            // A flush to whatever it opened must not hang or fail either.
            let mut r = req(
                "PUT /actions",
                &format!("FlushMetrics to metrics_path: {label}"),
                "PUT",
                "/actions",
                Some(r#"{"action_type": "FlushMetrics"}"#),
            );
            r.probe = true;
            w.case(r);
        });
    }
    w.case(req(
        "PUT /metrics",
        "valid",
        "PUT",
        "/metrics",
        Some(&metrics_valid),
    ));
    w.case(req(
        "PUT /metrics",
        "a second time",
        "PUT",
        "/metrics",
        Some(&metrics_valid),
    ));

    // actions that leave the VM as it is.
    let a = "/actions";
    let ep = "PUT /actions";
    w.case(req(
        ep,
        "FlushMetrics",
        "PUT",
        a,
        Some(r#"{"action_type": "FlushMetrics"}"#),
    ));
    for (case, body) in [
        ("bad JSON", BAD_JSON),
        (
            "unknown field",
            r#"{"action_type": "FlushMetrics", "no_such_field": 1}"#,
        ),
        ("wrong type", r#"{"action_type": 5}"#),
        ("unknown action_type", r#"{"action_type": "Reboot"}"#),
        (
            "reclaim with FlushMetrics",
            r#"{"action_type": "FlushMetrics", "reclaim": "sync"}"#,
        ),
        (
            "Shutdown with reclaim \"later\"",
            r#"{"action_type": "Shutdown", "reclaim": "later"}"#,
        ),
        ("missing action_type", "{}"),
        ("empty body", ""),
        ("not an object ([])", "[]"),
    ] {
        w.case(req(ep, case, "PUT", a, Some(body)));
    }
    w.case(req("GET /actions", "wrong method", "GET", a, None));
    if w.phase == Phase::Before {
        for (case, body) in [
            ("SendCtrlAltDel", r#"{"action_type": "SendCtrlAltDel"}"#),
            (
                "Shutdown sync",
                r#"{"action_type": "Shutdown", "reclaim": "sync"}"#,
            ),
            (
                "Shutdown async",
                r#"{"action_type": "Shutdown", "reclaim": "async"}"#,
            ),
        ] {
            w.case(req(ep, case, "PUT", a, Some(body)));
        }
    } else {
        w.case(req(
            ep,
            "InstanceStart",
            "PUT",
            a,
            Some(r#"{"action_type": "InstanceStart"}"#),
        ));
    }

    // teravm's own resources.
    get_cases(w, "/memory", "PATCH");
    body_cases(
        w,
        "PUT",
        "/memory",
        r#"{"backing": "anonymous", "numa_policy": "none", "populate": false}"#,
        &[
            ("unknown backing", r#"{"backing": "floppy"}"#),
            (
                "out of range (host_nodes [5000])",
                r#"{"host_nodes": [5000]}"#,
            ),
            ("host_nodes []", r#"{"host_nodes": []}"#),
            ("host_nodes [0, 0]", r#"{"host_nodes": [0, 0]}"#),
            (
                "host_nodes [7] (not on this host)",
                r#"{"host_nodes": [7]}"#,
            ),
        ],
    );
    get_cases(w, "/reclaim", "DELETE");
    body_cases(
        w,
        "PUT",
        "/reclaim",
        r#"{"workers_per_node": 1, "chunk_mib": 64, "parallel_threshold_mib": 1024, "steal": true}"#,
        &[
            (
                "out of range (workers_per_node 0)",
                r#"{"workers_per_node": 0}"#,
            ),
            ("out of range (chunk_mib 3)", r#"{"chunk_mib": 3}"#),
            (
                "out of range (chunk_mib u64::MAX)",
                r#"{"chunk_mib": 18446744073709551615}"#,
            ),
        ],
    );

    balloon_cases(w);
    device_cases(w);
    unsupported_cases(w);
}

/// Firecracker's balloon; free page hinting is refused (its endpoints too).
fn balloon_cases(w: &mut Walk) {
    get_cases(w, "/balloon", "DELETE");
    body_cases(
        w,
        "PUT",
        "/balloon",
        r#"{"amount_mib": 0, "deflate_on_oom": true, "stats_polling_interval_s": 1}"#,
        &[
            (
                "out of range (amount_mib -1)",
                r#"{"amount_mib": -1, "deflate_on_oom": true}"#,
            ),
            (
                "amount_mib above the guest's RAM",
                r#"{"amount_mib": 129, "deflate_on_oom": true}"#,
            ),
            (
                "free_page_hinting true",
                r#"{"amount_mib": 0, "deflate_on_oom": true, "free_page_hinting": true}"#,
            ),
        ],
    );
    body_cases(
        w,
        "PATCH",
        "/balloon",
        r#"{"amount_mib": 1}"#,
        &[("amount_mib above the guest's RAM", r#"{"amount_mib": 129}"#)],
    );
    get_cases(w, "/balloon/statistics", "PUT");
    body_cases(
        w,
        "PATCH",
        "/balloon/statistics",
        r#"{"stats_polling_interval_s": 1}"#,
        &[],
    );
    body_cases(
        w,
        "PATCH",
        "/balloon/hinting/start",
        r#"{"acknowledge_on_stop": true}"#,
        &[],
    );
    body_cases(w, "PATCH", "/balloon/hinting/stop", "{}", &[]);
    get_cases(w, "/balloon/hinting/status", "PATCH");
}

/// The first 64 bytes of an x86-64 ELF file: enough for the cheap check of
/// `PUT /boot-source` (the walk never starts it).
fn elf_head() -> Vec<u8> {
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
fn hostile_files(dir: &Path) {
    std::fs::write(dir.join("real.txt"), "a real file\n").unwrap();
    std::os::unix::fs::symlink(dir.join("real.txt"), dir.join("link-to-real")).unwrap();
    std::os::unix::fs::symlink(dir.join("nowhere"), dir.join("link-dangling")).unwrap();
    let unreadable = dir.join("unreadable");
    std::fs::write(&unreadable, "unreadable\n").unwrap();
    std::fs::set_permissions(&unreadable, std::fs::Permissions::from_mode(0o000)).unwrap();
}

#[test]
fn every_endpoint_and_method_before_and_after_start() {
    if !kvm_or_skip("every_endpoint_and_method_before_and_after_start") {
        return;
    }
    let dir = temp_dir("surface");
    hostile_files(&dir);
    let mut w = Walk::new(dir.clone());

    walk_phase(&mut w);
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
    walk_phase(&mut w);

    // The actions that end the VM, last: each in a process of its own but
    // the last, which ends the process under test.
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

    // The table is the doc: every answer of every case is pinned there.
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/api-surface.md");
    let table = table(&w);
    if std::env::var_os("TERAVM_WRITE_API_TABLE").is_some_and(|v| v == "1") {
        std::fs::write(&path, &table).unwrap();
        eprintln!("wrote {}", path.display());
    }
    let doc = std::fs::read_to_string(&path).unwrap_or_default();
    if doc != table {
        let differ: Vec<String> = table
            .lines()
            .zip(
                doc.lines()
                    .chain(std::iter::repeat("<end of docs/api-surface.md>")),
            )
            .filter(|(t, d)| t != d)
            .take(10)
            .map(|(t, d)| format!("  walked: {t}\n  doc:    {d}"))
            .collect();
        w.failures.push(format!(
            "the answers differ from docs/api-surface.md (regenerate it: \
             TERAVM_WRITE_API_TABLE=1 cargo test --release --test api_surface, \
             and review the diff); first lines that differ:\n{}",
            if differ.is_empty() {
                "  (the doc has more lines)".to_string()
            } else {
                differ.join("\n")
            }
        ));
    }
    let _ = std::fs::set_permissions(
        dir.join("unreadable"),
        std::fs::Permissions::from_mode(0o600),
    );
    assert!(
        w.failures.is_empty(),
        "{} of the cases broke the rule:\n{}",
        w.failures.len(),
        w.failures.join("\n")
    );
    let _ = std::fs::remove_dir_all(&dir);
}

fn get_state(sock: &Path) -> String {
    match common::client::request(sock, "GET", "/", None) {
        Ok((200, body)) => serde_json::from_str::<Value>(&body).unwrap()["state"]
            .as_str()
            .unwrap_or("")
            .to_string(),
        _ => String::new(),
    }
}

/// The table: endpoint × case → the answer before and after the start.
fn table(w: &Walk) -> String {
    let mut out = String::from(TABLE_INTRO);
    let cell = |c: &Option<String>| c.as_deref().unwrap_or("–").replace('|', "\\|");
    let mut endpoints: Vec<&str> = Vec::new();
    for row in &w.rows {
        if !endpoints.contains(&row.endpoint.as_str()) {
            endpoints.push(&row.endpoint);
        }
    }
    for endpoint in endpoints {
        let _ = write!(
            out,
            "\n### `{endpoint}`\n\n| case | before InstanceStart | after InstanceStart |\n|---|---|---|\n"
        );
        for row in w.rows.iter().filter(|row| row.endpoint == endpoint) {
            let _ = writeln!(
                out,
                "| {} | {} | {} |",
                row.case.replace('|', "\\|"),
                cell(&row.before),
                cell(&row.after)
            );
        }
    }
    let _ = write!(
        out,
        "\n## Cases that broke the rule in this run ({})\n\n",
        w.failures.len()
    );
    if w.failures.is_empty() {
        out.push_str("None.\n");
    }
    for f in &w.failures {
        let f = f.replace(w.dir.to_str().unwrap(), "$DIR");
        let _ = writeln!(out, "- {}", shorten(&f, 400).replace('|', "\\|"));
    }
    out
}

const TABLE_INTRO: &str = "\
# The API surface, walked

Generated by `tests/api_surface.rs` from one run against the real binary
with the default flags (seccomp on) and real `/dev/kvm`; do not edit by
hand. To regenerate:

```
TERAVM_WRITE_API_TABLE=1 cargo test --release --test api_surface
```

The walk sends every endpoint and method of Firecracker's API (its
swagger) and teravm's own (`/memory`, `/reclaim`), each with a valid body
and invalid ones (bad JSON, an unknown field, a wrong type, out-of-range
values, an empty body, a wrong method), once before `InstanceStart` and
once after it, on a 1-vCPU, 128 MiB firmware guest. Every field that names
a host path (`boot-source` `kernel_image_path` and `initrd_path`, `logger`
`log_path`, `metrics` `metrics_path`, `drives` `path_on_host` and `vsock`
`uds_path`) also gets hostile paths: a
missing file, a directory, `/dev/zero`, a FIFO with no other end (a fresh
one each time), a symlink to a real file and a dangling one, a chmod 000
file (the tests run as root, who reads it anyway: the case says so), a
relative path (teravm runs in the test's temp dir, where `real.txt`
exists), an empty string, a NUL inside, a 300-byte file name and a path
over 4096 bytes. `metrics_path` can be set once per process, so each of
its cases runs in a fresh teravm, followed by a `FlushMetrics`.

The rule for every case: the answer is a 2xx, or a 4xx whose JSON body has
a non-empty `fault_message`; it comes within 5 s; no 5xx, no dropped
connection; afterwards the process is alive (`try_wait`) and answers
`GET /`. For the host-path cases, a `GET /` on a second connection sent
while the request is outstanding must answer within 3 s. The actions that
end the VM (`SendCtrlAltDel` once started, `Shutdown` sync and async) run
last, each ending its own process, and must answer a 2xx and exit 0.
Malformed requests (bad JSON, an unknown field, a wrong type, out of
range, an empty body, not an object, a wrong method) must answer a 4xx.
The test fails when its table differs from this page: every answer below
is the expected one. Where a process dies,
the cell says so and the walk goes on with a fresh one in the same phase.

A cell is the status code and the start of the `fault_message`; `$DIR` is
the walk's temp dir. `–`: not sent in that phase.
";
