//! The differential test against the real Firecracker: the whole API walk
//! of `tests/api_surface.rs` (the one list of cases in
//! `tests/common/surface/`: every endpoint × method × body, before
//! `InstanceStart` and after) sent to Firecracker and to teravm in the same
//! order, each started with its default flags (seccomp on) in a temp dir of
//! its own holding the same files (the test guest as `vmlinux`, the
//! hostile paths, FIFOs made the same way), with the same boot source
//! (`kernel_image_path: "vmlinux"`). A case that gets no answer within the
//! walk's 5 s counts as `timeout` (Firecracker's API hangs for good on a
//! FIFO as `kernel_image_path`: the walk replaces a process that stops
//! answering, so one hang does not spoil the cases after it).
//!
//! Per case it compares the status and whether a `fault_message` came.
//! Every difference must be in [`INTENDED`] with its reason; the test fails
//! on a difference not there, AND on a listed one that no longer differs
//! (so the list stays true: a branch that closes a gap deletes its rows).
//! The side-by-side table goes into `docs/api-surface.md` between
//! [`BEGIN`] and [`END`]: written with `TERAVM_WRITE_DOCS=1`, otherwise
//! checked to equal what it would write.

mod common;
#[path = "common/surface/mod.rs"]
mod surface;

use std::fmt::Write as _;
use std::path::Path;

use common::*;
use surface::{Answer, Phase, Target, Walk};

#[path = "fc_differential/intended.rs"]
mod intended;
use intended::{Intended, INTENDED};

pub const BEGIN: &str = "<!-- fc_differential: begin -->";
pub const END: &str = "<!-- fc_differential: end -->";

/// The boot source of both walks: the test guest, which boots on both.
const BOOT: &str = r#"{"kernel_image_path": "vmlinux", "boot_args": "then=idle"}"#;

/// One compared case.
struct Compared {
    phase: Phase,
    endpoint: String,
    case: String,
    fc: String,
    teravm: String,
    listed: Option<&'static Intended>,
}

impl Compared {
    fn differs(&self) -> bool {
        self.fc != self.teravm
    }
}

fn answers(a: &[Answer]) -> String {
    if a.is_empty() {
        return "–".into();
    }
    a.iter()
        .map(Answer::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

fn walk(name: &str, program: &Path) -> Walk {
    let dir = temp_dir(name);
    std::fs::copy(guest(), dir.join("vmlinux")).expect("copy the test guest");
    let target = Target {
        program: program.to_path_buf(),
        boot_source: BOOT.into(),
        boot_label: "valid (back to the test guest)".into(),
        wait_exit: false,
    };
    surface::run(&dir, target)
}

#[test]
fn firecracker_and_teravm_answer_the_walk_alike() {
    let test = "firecracker_and_teravm_answer_the_walk_alike";
    if !kvm_or_skip(test) {
        return;
    }
    let Some(fc_bin) = firecracker(test) else {
        return;
    };
    let teravm_bin = Path::new(teravm()).to_path_buf();
    // The two walks at once: each has its own processes and dir.
    let (fc, tv) = std::thread::scope(|s| {
        let fc = s.spawn(|| walk("diff-fc", &fc_bin));
        let tv = s.spawn(|| walk("diff-teravm", &teravm_bin));
        (fc.join().unwrap(), tv.join().unwrap())
    });

    if let Some(dump) = std::env::var_os("TERAVM_DIFF_DUMP") {
        // Both walks' cells (with the fault excerpts), for a reader.
        let mut out = String::new();
        for row in &fc.rows {
            let tv_row = tv
                .rows
                .iter()
                .find(|r| r.endpoint == row.endpoint && r.case == row.case);
            for (phase, fc_cell, tv_cell) in [
                (
                    "before",
                    &row.before,
                    tv_row.and_then(|r| r.before.as_ref()),
                ),
                ("after", &row.after, tv_row.and_then(|r| r.after.as_ref())),
            ] {
                let _ = writeln!(
                    out,
                    "[{phase}] {} {:?}\n  fc: {}\n  tv: {}",
                    row.endpoint,
                    row.case,
                    fc_cell.as_deref().unwrap_or("-"),
                    tv_cell.map_or("-", String::as_str)
                );
            }
        }
        std::fs::write(dump, out).unwrap();
    }
    let mut compared = Vec::new();
    let mut failures = Vec::new();
    for phase in [Phase::Before, Phase::After] {
        for row in &fc.rows {
            let fc_a = row.answers(phase);
            let tv_row = tv
                .rows
                .iter()
                .find(|r| r.endpoint == row.endpoint && r.case == row.case);
            let tv_a = tv_row.map_or(&[][..], |r| r.answers(phase));
            if fc_a.is_empty() && tv_a.is_empty() {
                continue;
            }
            compared.push(Compared {
                phase,
                endpoint: row.endpoint.clone(),
                case: row.case.clone(),
                fc: answers(fc_a),
                teravm: answers(tv_a),
                listed: intended::find(phase, &row.endpoint, &row.case),
            });
        }
    }
    for row in &tv.rows {
        if !fc
            .rows
            .iter()
            .any(|r| r.endpoint == row.endpoint && r.case == row.case)
        {
            failures.push(format!(
                "{} {:?}: walked on teravm only (the walks must be the same)",
                row.endpoint, row.case
            ));
        }
    }
    for c in &compared {
        match (c.differs(), c.listed) {
            (true, None) => failures.push(format!(
                "[{}] {} {:?}: Firecracker {}, teravm {}: a difference not in INTENDED",
                c.phase.name(),
                c.endpoint,
                c.case,
                c.fc,
                c.teravm
            )),
            (false, Some(i)) if !i.is_pattern() => failures.push(format!(
                "[{}] {} {:?}: both {}, but INTENDED lists it ({}): delete the row",
                c.phase.name(),
                c.endpoint,
                c.case,
                c.fc,
                i.why
            )),
            _ => {}
        }
    }
    for i in INTENDED {
        if !compared
            .iter()
            .any(|c| c.differs() && c.listed.is_some_and(|l| std::ptr::eq(l, i)))
        {
            failures.push(format!(
                "INTENDED row {:?} {} {:?} matches no case that differs: delete it",
                i.phase, i.endpoint, i.case
            ));
        }
    }

    let section = section(&compared);
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/api-surface.md");
    let doc = std::fs::read_to_string(&path).unwrap_or_default();
    let (head, now) = match (doc.find(BEGIN), doc.find(END)) {
        (Some(b), Some(e)) if b < e => (doc[..b].to_string(), doc[b..e + END.len()].to_string()),
        _ => (format!("{}\n\n", doc.trim_end()), String::new()),
    };
    if std::env::var_os("TERAVM_WRITE_DOCS").is_some_and(|v| v == "1") {
        std::fs::write(&path, format!("{head}{section}\n")).unwrap();
        eprintln!("wrote {}", path.display());
    } else if now != section {
        failures.push(
            "docs/api-surface.md's differential section differs from this run \
             (regenerate it: TERAVM_WRITE_DOCS=1 cargo test --release --test \
             fc_differential, and review the diff)"
                .into(),
        );
    }
    let differ = compared.iter().filter(|c| c.differs()).count();
    eprintln!("{differ} of {} cases differ", compared.len());
    for f in fc.failures.iter().chain(&tv.failures) {
        // The walk's own rule, for the record (api_surface.rs enforces it
        // for teravm; Firecracker is the oracle here).
        eprintln!("rule: {f}");
    }
    assert!(
        failures.is_empty(),
        "{} problems:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// The doc section: the counts, the listed differences, the whole table.
fn section(compared: &[Compared]) -> String {
    let differ = compared.iter().filter(|c| c.differs()).count();
    let mut out = format!("{BEGIN}\n{INTRO}");
    let _ = writeln!(
        out,
        "\n**{differ} of {} cases differ**, each listed in `INTENDED` \
         (`tests/fc_differential/intended.rs`) with its reason.\n",
        compared.len()
    );
    out.push_str("| phase | endpoint | case | Firecracker | teravm | verdict |\n");
    out.push_str("|---|---|---|---|---|---|\n");
    for c in compared {
        let verdict = match (c.differs(), c.listed) {
            (false, _) => "same".to_string(),
            (true, Some(i)) => match i.pending {
                Some(branch) => format!("differs, pending: {branch} ({})", i.why),
                None => format!("differs: {}", i.why),
            },
            (true, None) => "differs, NOT LISTED".to_string(),
        };
        let _ = writeln!(
            out,
            "| {} | `{}` | {} | {} | {} | {} |",
            match c.phase {
                Phase::Before => "before",
                Phase::After => "after",
            },
            c.endpoint,
            c.case.replace('|', "\\|"),
            c.fc,
            c.teravm,
            verdict.replace('|', "\\|")
        );
    }
    out.push_str(END);
    out
}

const INTRO: &str = "
## teravm beside Firecracker

Generated by `tests/fc_differential.rs`; do not edit by hand. To
regenerate:

```
TERAVM_WRITE_DOCS=1 cargo test --release --test fc_differential
```

The same walk as above, sent to the real Firecracker (81b38b9da, the
shared build) and to teravm in the same order, each with its default
flags (seccomp on), in a temp dir of its own with the same files, both
booting the test guest (`kernel_image_path: \"vmlinux\"`). A cell is the
status and `fault` when a non-empty `fault_message` came; `timeout`: no
answer within 5 s (the walk then replaces the process). The test fails
on a difference that is not listed, and on a listed one that no longer
differs.
";

/// The 200 bodies, compared field by field with the real Firecracker's: the
/// same microVM configured on both with the same requests (1 vCPU, 128 MiB,
/// the test guest, a read-only drive on one shared file, a balloon, an
/// entropy device), `GET /machine-config`, `GET /balloon` and `GET
/// /vm/config` before `InstanceStart` and once the guest runs. Every field
/// Firecracker answers must be in teravm's answer with the same value, and
/// teravm may add none, but for [`intended::BODY_DIFFERS`] (which fails
/// on a row no field needs).
#[test]
fn the_200_bodies_are_firecrackers() {
    let test = "the_200_bodies_are_firecrackers";
    if !kvm_or_skip(test) {
        return;
    }
    let Some(fc) = firecracker(test) else {
        return;
    };
    let mut both = common::fc_api::Both::start(test, &fc, &[]);
    let disk = temp_dir("bodies-disk").join("disk.img");
    std::fs::write(&disk, vec![0u8; 1 << 20]).unwrap();
    both.put_ok(
        "/machine-config",
        r#"{"vcpu_count": 1, "mem_size_mib": 128, "huge_pages": "None"}"#,
    );
    both.put_ok(
        "/boot-source",
        &common::guests::Guest::TestGuest.boot_source("then=idle"),
    );
    both.put_ok(
        "/drives/rootfs",
        &format!(
            r#"{{"drive_id": "rootfs", "path_on_host": "{}", "is_root_device": false, "is_read_only": true}}"#,
            disk.display()
        ),
    );
    both.put_ok(
        "/balloon",
        r#"{"amount_mib": 16, "deflate_on_oom": true, "stats_polling_interval_s": 1}"#,
    );
    both.put_ok("/entropy", "{}");
    let mut used = Vec::new();
    let mut differences = Vec::new();
    let mut compare = |both: &common::fc_api::Both, phase: &str| {
        for path in ["/machine-config", "/balloon", "/vm/config"] {
            let (f, t) = (both.fc.get(path), both.tv.get(path));
            for d in common::fc_api::field_differences(&f, &t, &[]) {
                let field = d.split(':').next().unwrap_or_default().to_string();
                match intended::BODY_DIFFERS
                    .iter()
                    .find(|(p, fd, _)| *p == path && *fd == field)
                {
                    Some(row) => used.push(row),
                    None => differences.push(format!("[{phase}] GET {path}: {d}")),
                }
            }
        }
    };
    compare(&both, "before");
    let (s, b) = both.same(
        "PUT",
        "/actions",
        Some(r#"{"action_type": "InstanceStart"}"#),
    );
    assert_eq!(s, 204, "{b}");
    for side in [&mut both.fc, &mut both.tv] {
        side.vmm.wait_line("teravm guest: idle", common::api::T);
    }
    compare(&both, "after");
    for row in intended::BODY_DIFFERS {
        if !used.iter().any(|u| std::ptr::eq(*u, row)) {
            differences.push(format!(
                "BODY_DIFFERS {} {} ({}): no field differs there now: delete the row",
                row.0, row.1, row.2
            ));
        }
    }
    assert!(differences.is_empty(), "{}", differences.join("\n"));
}

/// Firecracker's answer to a load once something configured the boot.
const LOAD_AFTER_CONFIGURING: &str = "Load snapshot error: Loading a microVM snapshot not allowed \
                                      after configuring boot-specific resources.";
/// Firecracker's answer to a create while the vCPUs run.
const CREATE_WHILE_RUNNING: &str = "Create snapshot error: Cannot save the microVM state: \
                                    Operation not allowed: save/restore unavailable while running";

fn fault(body: &str) -> String {
    serde_json::from_str::<serde_json::Value>(body).unwrap()["fault_message"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// The state checks of `PUT /snapshot/create` and `/snapshot/load`, text
/// for text where a client may match them: which requests count as
/// configuring the boot (a load after one is refused with Firecracker's
/// `LoadSnapshotNotAllowed`, after the others it is tried: Firecracker
/// then fails on the missing files and exits, teravm answers otherwise
/// but not that), a create before the start and while running, a load
/// once started. Each case in a fresh pair of processes.
#[test]
fn the_snapshot_state_checks_are_firecrackers() {
    let test = "the_snapshot_state_checks_are_firecrackers";
    if !kvm_or_skip(test) {
        return;
    }
    let Some(fc) = firecracker(test) else {
        return;
    };
    let load = r#"{"snapshot_path": "snap", "mem_backend": {"backend_path": "mem", "backend_type": "File"}}"#;
    let create = r#"{"snapshot_path": "snap", "mem_file_path": "mem"}"#;
    let boot = common::guests::Guest::TestGuest.boot_source("then=idle");
    let disk = temp_dir("snapshot-checks-disk").join("disk.img");
    std::fs::write(&disk, vec![0u8; 1 << 20]).unwrap();
    let drive = format!(
        r#"{{"drive_id": "data", "path_on_host": "{}", "is_root_device": false, "is_read_only": true}}"#,
        disk.display()
    );
    let configuring: Vec<(&str, String)> = vec![
        (
            "/machine-config",
            r#"{"vcpu_count": 1, "mem_size_mib": 128}"#.into(),
        ),
        ("/boot-source", boot.clone()),
        ("/drives/data", drive),
        (
            "/balloon",
            r#"{"amount_mib": 0, "deflate_on_oom": false}"#.into(),
        ),
        ("/vsock", r#"{"guest_cid": 3, "uds_path": "v.sock"}"#.into()),
        ("/entropy", "{}".into()),
        (
            "/hotplug/memory",
            r#"{"total_size_mib": 1024, "slot_size_mib": 128, "block_size_mib": 2}"#.into(),
        ),
    ];
    for (path, body) in &configuring {
        let both = common::fc_api::Both::start(test, &fc, &[]);
        both.put_ok(path, body);
        let ((fs, fb), (ts, tb)) = both.ask("PUT", "/snapshot/load", Some(load));
        assert_eq!(
            (fs, fault(&fb).as_str(), ts, fault(&tb).as_str()),
            (400, LOAD_AFTER_CONFIGURING, 400, LOAD_AFTER_CONFIGURING),
            "a load after PUT {path}"
        );
    }
    let not_configuring: Vec<(&str, &str)> = vec![
        ("/logger", r#"{"level": "Info"}"#),
        ("/mmds", r#"{"latest": {"x": 1}}"#),
        ("/cpu-config", "{}"),
        ("/serial", r#"{"serial_out_path": "serial.out"}"#),
    ];
    for (path, body) in &not_configuring {
        let both = common::fc_api::Both::start(test, &fc, &[]);
        both.put_ok(path, body);
        // Firecracker tries the load (and exits: the files are missing).
        let ((fs, fb), (ts, tb)) = both.ask("PUT", "/snapshot/load", Some(load));
        assert!(
            fs == 400 && ts == 400 && !fb.contains("not allowed") && !tb.contains("not allowed"),
            "a load after PUT {path}: Firecracker {fs} {fb}, teravm {ts} {tb}"
        );
    }
    // A create before the start: both name the start.
    let both = common::fc_api::Both::start(test, &fc, &[]);
    let ((fs, fb), (ts, tb)) = both.ask("PUT", "/snapshot/create", Some(create));
    let pre = "not supported before starting the microVM";
    assert!(
        fs == 400 && ts == 400 && fault(&fb).contains(pre) && fault(&tb).contains(pre),
        "a create before the start: Firecracker {fs} {fb}, teravm {ts} {tb}"
    );
    // Running: a create is refused with Firecracker's words, a load too.
    both.boot_test_guest(r#"{"vcpu_count": 1, "mem_size_mib": 128}"#, "then=idle");
    let ((fs, fb), (ts, tb)) = both.ask("PUT", "/snapshot/create", Some(create));
    assert_eq!(
        (fs, fault(&fb).as_str(), ts, fault(&tb).as_str()),
        (400, CREATE_WHILE_RUNNING, 400, CREATE_WHILE_RUNNING),
        "a create while running"
    );
    let post = "not supported after starting the microVM";
    let ((fs, fb), (ts, tb)) = both.ask("PUT", "/snapshot/load", Some(load));
    assert!(
        fs == 400 && ts == 400 && fault(&fb).contains(post) && fault(&tb).contains(post),
        "a load once started: Firecracker {fs} {fb}, teravm {ts} {tb}"
    );
    // Neither wrote a file.
    for side in [&both.fc, &both.tv] {
        assert!(
            !side.dir.join("snap").exists() && !side.dir.join("mem").exists(),
            "{}",
            side.name
        );
    }
}
