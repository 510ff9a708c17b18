//! `--snapshot`: Firecracker's snapshot API timed on the real Firecracker
//! (with `--peers firecracker`) and on teravm, the same requests to both.
//!
//! One round per run and guest, A B C A B C as the other rows:
//!
//! - create: the VMM boots the test guest (1 vCPU, `touch=all`, or for the
//!   sparse guest `touch=<MiB>`, then `tick=1`) from a config file; once
//!   it ticks, `PATCH /vm {"state": "Paused"}`, then `PUT /snapshot/create`
//!   (Full) timed until its answer; the memory file's length and blocks
//!   are read, the VMM killed (Firecracker's row, then teravm's at each
//!   `--workers` count: `reclaim.workers_per_node` of its config);
//! - load: a fresh process of the same VMM (API socket only), `PUT
//!   /snapshot/load` (File backend, `resume_vm`) of those files, timed
//!   until the guest's first `tick` line after resume
//!   (`snapshot-load-firecracker`, `snapshot-load-teravm-lazy`, once per
//!   run after the first count's create), or with `"memory_load": "Eager"`
//!   until the answer (`snapshot-load-teravm-eager-<w>`: the snapshot of
//!   the microVM that had `w` workers, loaded by a fresh teravm given `w`
//!   workers per node with `PUT /reclaim` before the clock);
//! - the files are removed after each load.
//!
//! The CPU time of the VMM process (user, system; `/proc/<pid>/stat`) is
//! read before and after the timed part. Before a round the free space of
//! `--snapshot-dir` (statvfs) must hold the memory file (Firecracker's:
//! all of RAM; teravm's: what the guest touched) plus a GiB; rows that
//! cannot are `not possible here`, as is a row whose first run fails (its
//! error said); a later run's failure is the bench's error.
//!
//! The processes and the two timed requests are [`crate::snapshot_vmm`]'s.
//! Everything runs on the bench's main thread but the consoles' readers.

use std::ffi::CString;
use std::io::Write as _;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::args::Args;
use crate::guest::guest_binary;
use crate::model::{BenchError, Peer};
use crate::snapshot_text::{
    self as text, snapshot_methods, SnapGuest, SnapMethod, SnapSample, SnapUnavailable,
};
use crate::snapshot_vmm::{Files, Kind, Setup};

/// Free space kept on the snapshot directory's file system.
const DISK_MARGIN: u64 = 1 << 30;

fn snap_err(what: impl Into<String>) -> BenchError {
    BenchError::Vm(format!("--snapshot: {}", what.into()))
}

/// Why the snapshot directory cannot hold a memory file of `need` bytes
/// with `free` bytes free (less [`DISK_MARGIN`]); `None` when it can.
pub fn disk_shortfall(need: u64, free: u64, dir: &Path, whose: &str) -> Option<String> {
    (need.saturating_add(DISK_MARGIN) > free).then(|| {
        format!(
            "{whose} memory file needs {:.1} GiB on disk and {} has {:.1} GiB free (statvfs), \
             less a 1 GiB margin",
            need as f64 / (1u64 << 30) as f64,
            dir.display(),
            free as f64 / (1u64 << 30) as f64
        )
    })
}

/// Bytes free to an unprivileged writer on `dir`'s file system.
fn free_bytes(dir: &Path) -> Result<u64, BenchError> {
    let path = CString::new(dir.as_os_str().as_bytes())
        .map_err(|_| snap_err(format!("{}: a NUL in the path", dir.display())))?;
    // SAFETY: statvfs only reads the NUL-terminated path and writes the
    // struct it is given; both live across the call.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::statvfs(path.as_ptr(), &mut st) } != 0 {
        return Err(snap_err(format!(
            "statvfs {}: {}",
            dir.display(),
            std::io::Error::last_os_error()
        )));
    }
    Ok(st.f_bavail.saturating_mul(st.f_frsize))
}

/// The samples and the rows that could not run, as a run goes.
struct Results {
    samples: Vec<SnapSample>,
    unavailable: Vec<SnapUnavailable>,
}

impl Results {
    fn skips(&self, guest: SnapGuest, method: SnapMethod) -> bool {
        self.unavailable
            .iter()
            .any(|u| u.guest == guest && u.method == method)
    }

    fn mark(&mut self, guest: SnapGuest, methods: &[SnapMethod], reason: &str) {
        for &method in methods {
            if !self.skips(guest, method) {
                self.unavailable.push(SnapUnavailable {
                    guest,
                    method,
                    reason: reason.to_string(),
                });
            }
        }
    }

    /// A step failed: in the first run its rows are not possible here (the
    /// error says why); later, the bench's error.
    fn failed(
        &mut self,
        run: u32,
        guest: SnapGuest,
        methods: &[SnapMethod],
        why: String,
    ) -> Result<(), BenchError> {
        let names: Vec<String> = methods.iter().map(|m| m.to_string()).collect();
        if run > 1 {
            return Err(snap_err(format!(
                "{} ({guest}), run {run}: {why}",
                names.join(", ")
            )));
        }
        eprintln!("{} ({guest}): {why}", names.join(", "));
        self.mark(guest, methods, &format!("its first run failed: {why}"));
        Ok(())
    }
}

/// One round of `kind` for `guest` at `workers`: the create
/// (`snapshot-create-<kind>[-<w>]`), then each load in `loads` (lazy or
/// eager) of the same files.
fn round(
    setup: &Setup<'_>,
    results: &mut Results,
    run: u32,
    guest: SnapGuest,
    kind: Kind,
    workers: u32,
    loads: &[(SnapMethod, bool)],
) -> Result<(), BenchError> {
    let create = match kind {
        Kind::Firecracker => SnapMethod::CreateFirecracker,
        Kind::Teravm => SnapMethod::CreateTeravm(workers),
    };
    let loads: Vec<(SnapMethod, bool)> = loads
        .iter()
        .copied()
        .filter(|(m, _)| !results.skips(guest, *m))
        .collect();
    if results.skips(guest, create) {
        return Ok(());
    }
    let files = Files::new(&setup.dir, &create.to_string());
    eprintln!(
        "[snapshot] run {run}/{}, {guest}: {create}",
        setup.args.runs
    );
    let (seconds, cpu, file, touched_mib) = match setup.create(kind, guest, workers, &files) {
        Ok(c) => c,
        Err(why) => {
            let mut all = vec![create];
            all.extend(loads.iter().map(|(m, _)| *m));
            return results.failed(run, guest, &all, why);
        }
    };
    results.samples.push(SnapSample {
        guest,
        method: create,
        run,
        seconds,
        answer_s: seconds,
        first_line_s: None,
        cpu,
        file: Some(file),
        resident_bytes: None,
        touched_mib,
    });
    for (method, eager) in loads {
        eprintln!(
            "[snapshot] run {run}/{}, {guest}: {method}",
            setup.args.runs
        );
        match setup.load(kind, &files, eager.then_some(workers), touched_mib) {
            Ok((answer_s, first, cpu, resident)) => results.samples.push(SnapSample {
                guest,
                method,
                run,
                seconds: if eager { answer_s } else { first },
                answer_s,
                first_line_s: Some(first),
                cpu,
                file: None,
                resident_bytes: Some(resident),
                touched_mib,
            }),
            Err(why) => results.failed(run, guest, &[method], why)?,
        }
    }
    Ok(())
}

/// The load average of `/proc/loadavg` (its first three fields).
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|t| t.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

/// Finds Firecracker when `--peers` names it: its path, or why not; and
/// the discovery line (`peers: firecracker found (...)`), said on stderr.
type Found = (Option<Result<PathBuf, String>>, Option<String>);
fn find_firecracker(args: &Args) -> Found {
    let path_var = std::env::var_os("PATH");
    let home = std::env::var_os("HOME").map(PathBuf::from);
    let mut out = None;
    let mut found = Vec::new();
    for &peer in &args.peers {
        if peer != Peer::Firecracker {
            eprintln!(
                "{peer}: no snapshot rows (teravm-bench drives Firecracker's snapshot API only)"
            );
            continue;
        }
        let d = crate::peers::discover(
            peer,
            args.firecracker.as_deref(),
            path_var.as_deref(),
            crate::firecracker::cached_build(home.as_deref()),
        );
        out = Some(d.binary.clone().map(|b| b.path));
        found.push(d);
    }
    let line = (!found.is_empty()).then(|| crate::peers::discovery_line(&found));
    if let Some(line) = &line {
        eprintln!("{line}");
    }
    (
        out.map(|r| r.map_err(|why| format!("not found: {why}"))),
        line,
    )
}

fn write_file(path: &Path, text: &str) -> Result<(), BenchError> {
    std::fs::write(path, text).map_err(|source| BenchError::Write {
        path: path.display().to_string(),
        source,
    })
}

/// Runs the `--snapshot` rows and writes their outputs.
pub fn run(args: &Args) -> Result<(), BenchError> {
    let teravm = crate::vm::teravm_binary()?;
    let guest_bin = guest_binary().map_err(BenchError::VmUnavailable)?;
    let host = crate::held::topology(&args.sysfs_root)?;
    let load_before = load_average();
    let mut guests = vec![SnapGuest {
        size_gib: args.size_gib,
        touch_mib: None,
    }];
    if let Some(size_gib) = args.sparse_gib {
        let available = teravm_client::host::read_mem_available(Path::new("/proc/meminfo"))?;
        crate::args::check_size(args.sparse_touch_mib.div_ceil(1024), available)?;
        guests.push(SnapGuest {
            size_gib,
            touch_mib: Some(args.sparse_touch_mib),
        });
    }
    let dir = args.snapshot_dir.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("teravm-bench-snap-{}", std::process::id()))
    });
    let made_dir = !dir.exists();
    std::fs::create_dir_all(&dir).map_err(|e| snap_err(format!("{}: {e}", dir.display())))?;
    let (fc, peers_line) = find_firecracker(args);
    let setup = Setup {
        args,
        teravm,
        firecracker: fc.as_ref().and_then(|r| r.as_ref().ok().cloned()),
        guest: guest_bin,
        bind: crate::held::host_binds(&host),
        dir: dir.clone(),
    };
    let mut results = Results {
        samples: Vec::new(),
        unavailable: Vec::new(),
    };
    let fc_rows = [SnapMethod::CreateFirecracker, SnapMethod::LoadFirecracker];
    let free = free_bytes(&dir)?;
    for &guest in &guests {
        if let Some(Err(why)) = &fc {
            results.mark(guest, &fc_rows, why);
        }
        if let Some(why) = disk_shortfall(guest.full_bytes(), free, &dir, "Firecracker's") {
            let why = format!("its Full snapshot writes all of guest RAM: {why}");
            results.mark(guest, &fc_rows, &why);
        }
        if let Some(why) = disk_shortfall(guest.touched_bytes(), free, &dir, "teravm's") {
            let teravm_rows: Vec<SnapMethod> = snapshot_methods(false, &args.workers);
            results.mark(guest, &teravm_rows, &why);
        }
    }
    for run in 1..=args.runs {
        for &guest in &guests {
            if setup.firecracker.is_some() {
                let load = [(SnapMethod::LoadFirecracker, false)];
                let kind = Kind::Firecracker;
                round(&setup, &mut results, run, guest, kind, 1, &load)?;
            }
            for (i, &w) in args.workers.iter().enumerate() {
                let mut loads = vec![(SnapMethod::LoadTeravmEager(w), true)];
                if i == 0 {
                    loads.insert(0, (SnapMethod::LoadTeravmLazy, false));
                }
                round(&setup, &mut results, run, guest, Kind::Teravm, w, &loads)?;
            }
        }
    }
    if made_dir {
        let _ = std::fs::remove_dir(&dir);
    }
    let rows = text::rows(&results.samples);
    let mut out = std::io::stdout().lock();
    let _ = write!(out, "{}", text::table(&rows, &results.unavailable));
    let _ = write!(out, "{}", text::resident_text(&rows));
    let mut notes: Vec<String> = peers_line.into_iter().collect();
    notes.push(format!(
        "{} pages, anonymous memory, 1 vCPU; files in {}; load average before {load_before}, \
             after {} (/proc/loadavg)",
        setup.pages(),
        dir.display(),
        load_average()
    ));
    for note in &notes {
        let _ = writeln!(out, "{note}");
    }
    let _ = out.flush();
    if let Some(path) = &args.csv {
        write_file(path, &text::csv(&results.samples))?;
    }
    if let Some(path) = &args.svg {
        let title = format!(
            "Snapshots of the test guest, median of {} run(s) each",
            args.runs
        );
        let svg = crate::snapshot_svg::plot(&rows, &results.unavailable, &title, &notes);
        write_file(path, &svg)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_memory_file_that_does_not_fit_says_so() {
        let dir = Path::new("/snap");
        assert_eq!(disk_shortfall(2 << 30, 4 << 30, dir, "teravm's"), None);
        let why = disk_shortfall(64 << 30, 58 << 30, dir, "Firecracker's").unwrap();
        assert_eq!(
            why,
            "Firecracker's memory file needs 64.0 GiB on disk and /snap has 58.0 GiB free \
             (statvfs), less a 1 GiB margin"
        );
        // The margin counts.
        assert!(disk_shortfall(3 << 30, (3 << 30) + (1 << 29), dir, "x").is_some());
    }

    #[test]
    fn the_statvfs_of_the_temp_dir_is_read() {
        assert!(free_bytes(&std::env::temp_dir()).unwrap() > 0);
        assert!(free_bytes(Path::new("/nonexistent/dir")).is_err());
    }
}
