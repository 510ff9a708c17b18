//! The real Firecracker beside teravm over the API, for the tests that say
//! "as Firecracker": each VMM started with `--api-sock` only and its default
//! flags (seccomp on), in a dir of its own, and the same requests sent to
//! both. [`Both::same`] asserts the two answer alike (the status, and a
//! `fault_message` or none); [`Both::same_json`] that two 200s carry the
//! same JSON. Firecracker comes from [`super::firecracker`]
//! (`$TERAVM_FIRECRACKER`, else the shared build): where there is none the
//! test is skipped with the reason (a failure in CI).

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use super::api::T;
use super::client::request;
use super::{temp_dir, wait_for_api, Vmm};

/// One VMM of the pair.
pub struct Side {
    /// `firecracker` or `teravm`, for messages.
    pub name: &'static str,
    pub vmm: Vmm,
    pub sock: PathBuf,
    pub dir: PathBuf,
}

impl Side {
    /// Starts `program` with `--api-sock <dir>/api.sock` and `args`, in a
    /// fresh dir; returns once the API answers. Firecracker's log goes to
    /// `<dir>/fc.log`, so its stdout is the guest's console alone.
    pub fn start(name: &'static str, program: &Path, test: &str, args: &[&str]) -> Side {
        Side::start_in(name, Command::new(program), test, args)
    }

    /// [`Side::start`] with `cmd` (e.g. `ip netns exec <ns> <program>`).
    pub fn start_in(name: &'static str, mut cmd: Command, test: &str, args: &[&str]) -> Side {
        let dir = temp_dir(&format!("{test}-{name}"));
        let sock = dir.join("api.sock");
        cmd.arg("--api-sock")
            .arg(&sock)
            .args(args)
            .current_dir(&dir);
        if name == "firecracker" {
            let log = dir.join("fc.log");
            std::fs::write(&log, "").unwrap();
            cmd.arg("--log-path").arg(&log);
        }
        Side::spawn(name, cmd, sock, dir)
    }

    /// Spawns `cmd`, ready to run, and returns once its API on `sock`
    /// answers.
    pub fn spawn(name: &'static str, cmd: Command, sock: PathBuf, dir: PathBuf) -> Side {
        let vmm = Vmm::spawn_command(cmd);
        wait_for_api(&sock, T);
        Side {
            name,
            vmm,
            sock,
            dir,
        }
    }

    /// One request: (status, body).
    pub fn ask(&self, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
        request(&self.sock, method, path, body)
            .unwrap_or_else(|e| panic!("{} {method} {path}: {e}", self.name))
    }

    /// `PUT path body`, expecting 204.
    pub fn put_ok(&self, path: &str, body: &str) {
        let (s, b) = self.ask("PUT", path, Some(body));
        assert_eq!(s, 204, "{}: PUT {path} {body}: {b}", self.name);
    }

    /// `GET path`, expecting 200 and JSON.
    pub fn get(&self, path: &str) -> Value {
        let (s, b) = self.ask("GET", path, None);
        assert_eq!(s, 200, "{}: GET {path}: {b}", self.name);
        serde_json::from_str(&b).unwrap_or_else(|e| panic!("{}: GET {path}: {e}: {b}", self.name))
    }

    /// The microVM's state as `GET /` says it.
    pub fn state(&self) -> String {
        self.get("/")["state"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    }
}

/// Whether `body` carries a `fault_message`.
pub fn has_fault(body: &str) -> bool {
    serde_json::from_str::<Value>(body).is_ok_and(|v| v["fault_message"].is_string())
}

/// Where teravm's `tv` differs from Firecracker's `fc`, field by field
/// (objects recursively, anything else by value), one line each: a field
/// Firecracker has that teravm lacks or answers otherwise, or one teravm
/// adds. A field that is `null` on one side and absent on the other is
/// the same (Firecracker writes some `None`s as `null`, teravm leaves them
/// out, and the other way round: a JSON client reads both as "none").
/// `differs` lists the dotted paths (`memory`, `machine-config.smt`)
/// allowed to differ or to be teravm's own.
pub fn field_differences(fc: &Value, tv: &Value, differs: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    walk_fields(fc, tv, "", differs, &mut out);
    out
}

fn walk_fields(fc: &Value, tv: &Value, at: &str, differs: &[&str], out: &mut Vec<String>) {
    let join = |k: &str| {
        if at.is_empty() {
            k.to_string()
        } else {
            format!("{at}.{k}")
        }
    };
    match (fc, tv) {
        (Value::Object(f), Value::Object(t)) => {
            for (k, fv) in f {
                let path = join(k);
                match t.get(k) {
                    Some(tv) => walk_fields(fv, tv, &path, differs, out),
                    None if !fv.is_null() && !differs.contains(&path.as_str()) => {
                        out.push(format!("{path}: Firecracker {fv}, teravm has none"))
                    }
                    None => {}
                }
            }
            for (k, tv) in t {
                let path = join(k);
                if !f.contains_key(k) && !tv.is_null() && !differs.contains(&path.as_str()) {
                    out.push(format!("{path}: teravm's own ({tv}), Firecracker has none"));
                }
            }
        }
        (Value::Array(f), Value::Array(t)) if f.len() == t.len() => {
            // Elements by position; a path names them `<array>[]`.
            let path = format!("{at}[]");
            for (fv, tv) in f.iter().zip(t) {
                walk_fields(fv, tv, &path, differs, out);
            }
        }
        _ if fc != tv && !differs.contains(&at) => {
            out.push(format!("{at}: Firecracker {fc}, teravm {tv}"));
        }
        _ => {}
    }
}

/// Firecracker and teravm, side by side.
pub struct Both {
    pub fc: Side,
    pub tv: Side,
}

impl Both {
    /// Firecracker (`fc`) and teravm, each with `args` after `--api-sock`.
    pub fn start(test: &str, fc: &Path, args: &[&str]) -> Both {
        Both {
            fc: Side::start("firecracker", fc, test, args),
            tv: Side::start("teravm", Path::new(super::teravm()), test, args),
        }
    }

    /// The same request to both: (Firecracker's, teravm's).
    pub fn ask(
        &self,
        method: &str,
        path: &str,
        body: Option<&str>,
    ) -> ((u16, String), (u16, String)) {
        (
            self.fc.ask(method, path, body),
            self.tv.ask(method, path, body),
        )
    }

    /// The same request to both, which must answer alike: the same status,
    /// and a `fault_message` in both or in neither. Returns teravm's answer
    /// (for its own, finer checks).
    pub fn same(&self, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
        let ((fs, fb), (ts, tb)) = self.ask(method, path, body);
        assert!(
            fs == ts && has_fault(&fb) == has_fault(&tb),
            "{method} {path} {body:?}: Firecracker {fs} {fb:?}, teravm {ts} {tb:?}"
        );
        (ts, tb)
    }

    /// `PUT path body` to both, each answering 204.
    pub fn put_ok(&self, path: &str, body: &str) {
        self.fc.put_ok(path, body);
        self.tv.put_ok(path, body);
    }

    /// `GET path` on both, each 200 with the same JSON; returns it.
    pub fn same_json(&self, path: &str) -> Value {
        let (f, t) = (self.fc.get(path), self.tv.get(path));
        assert_eq!(f, t, "GET {path}: Firecracker {f}, teravm {t}");
        t
    }

    /// `GET path` on both, each 200, the fields alike but for `differs`
    /// ([`field_differences`]); returns teravm's JSON.
    pub fn same_fields(&self, path: &str, differs: &[&str]) -> Value {
        let (f, t) = (self.fc.get(path), self.tv.get(path));
        let d = field_differences(&f, &t, differs);
        assert!(
            d.is_empty(),
            "GET {path}:\n{}\nFirecracker {f}\nteravm {t}",
            d.join("\n")
        );
        t
    }

    /// Configures both with the test guest (`args` on its command line),
    /// `machine` (the `PUT /machine-config` body) and `InstanceStart`.
    pub fn boot_test_guest(&self, machine: &str, args: &str) {
        let boot = super::guests::Guest::TestGuest.boot_source(args);
        self.put_ok("/machine-config", machine);
        self.put_ok("/boot-source", &boot);
        let (s, b) = self.same(
            "PUT",
            "/actions",
            Some(r#"{"action_type": "InstanceStart"}"#),
        );
        assert_eq!(s, 204, "InstanceStart: {b}");
    }
}
