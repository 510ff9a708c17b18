//! The `exit` and `mrelease` baselines: a child process that holds fully
//! touched guest memory and is killed with `SIGKILL` (and, for `mrelease`,
//! reaped from the parent with `process_mrelease`).
//!
//! The child is the bench binary itself, re-executed with the hidden
//! `--exit-child` flag (no `fork()` in a threaded process). It maps and
//! populates its memory with the same code as the other methods, prints
//! `ready` on stdout and then blocks reading its stdin. The parent reads
//! `ready` and times the kill until `waitpid` returns: by then the kernel
//! has freed the child's memory. If the parent dies first, the child sees
//! end-of-file on stdin and exits.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::Duration;

use crate::args::Args;
use crate::model::{backing_name, BenchError, Case};
use crate::mrelease::{kill_and_reap, Reap};

/// The line the child prints once its memory is populated.
pub const READY: &str = "ready";

/// A child process holding populated memory, waiting to be killed.
#[derive(Debug)]
pub struct ExitChild {
    child: Child,
    // Held open so that the child keeps waiting; dropped after the kill.
    _stdin: ChildStdin,
}

/// The arguments that make the bench binary the child for `case`.
pub fn child_args(case: Case, args: &Args) -> Vec<String> {
    let mut out = vec![
        "--exit-child".to_string(),
        "--size-gib".to_string(),
        args.size_gib.to_string(),
        "--pages".to_string(),
        case.pages.to_string(),
        "--backing".to_string(),
        backing_name(case.backing).to_string(),
        "--sysfs-root".to_string(),
        args.sysfs_root.display().to_string(),
    ];
    if let Some(w) = args.populate_workers {
        out.push("--populate-workers".to_string());
        out.push(w.to_string());
    }
    out
}

impl ExitChild {
    /// Starts `exe` with `args` and waits until it prints [`READY`].
    pub fn spawn(exe: &Path, args: &[String]) -> Result<ExitChild, BenchError> {
        let mut child = Command::new(exe)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| BenchError::Child(format!("cannot start {}: {e}", exe.display())))?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(BenchError::Child("no pipes to the child".into()));
        };
        let mut line = String::new();
        let read = BufReader::new(stdout).read_line(&mut line);
        if read.is_err() || line.trim_end() != READY {
            let _ = child.kill();
            let status = child
                .wait()
                .map(|s| s.to_string())
                .unwrap_or_else(|e| e.to_string());
            return Err(BenchError::Child(format!(
                "it ended ({status}) before it was ready{}",
                match read {
                    Err(e) => format!(": {e}"),
                    Ok(_) if !line.is_empty() => format!(" (it said {:?})", line.trim_end()),
                    Ok(_) => String::new(),
                }
            )));
        }
        Ok(ExitChild {
            child,
            _stdin: stdin,
        })
    }

    /// Sends `SIGKILL` and reaps the child as `reap` says; the time from
    /// the kill until `waitpid` returns.
    pub fn kill_and_reap(mut self, reap: Reap) -> Result<Duration, BenchError> {
        kill_and_reap(&mut self.child, reap)
    }
}

/// The child's side: map and populate, say [`READY`], wait for the kill (or
/// for the parent to go away).
pub fn child_main(args: &Args) -> Result<(), BenchError> {
    let case = Case {
        pages: args.pages[0],
        backing: args.backing[0],
    };
    let held = crate::held::map_populated(case, args)?;
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{READY}")
        .and_then(|()| stdout.flush())
        .map_err(|e| BenchError::Child(format!("cannot say ready: {e}")))?;
    // Blocks until the parent kills us, or closes our stdin by going away.
    let mut sink = [0u8; 64];
    let mut stdin = std::io::stdin().lock();
    while matches!(stdin.read(&mut sink), Ok(n) if n > 0) {}
    drop(held);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    #[test]
    fn a_child_that_says_ready_is_killed_and_timed() {
        // `sh` stands in for the bench binary: it says ready and waits.
        let args = vec!["-c".to_string(), "echo ready; exec cat".to_string()];
        let child = ExitChild::spawn(Path::new("/bin/sh"), &args).unwrap();
        let elapsed = child.kill_and_reap(Reap::Wait).unwrap();
        assert!(elapsed > Duration::ZERO);
    }

    #[test]
    fn a_child_that_dies_before_ready_is_an_error() {
        let args = vec!["-c".to_string(), "echo oops; exit 3".to_string()];
        let err = ExitChild::spawn(Path::new("/bin/sh"), &args)
            .unwrap_err()
            .to_string();
        assert!(err.contains("before it was ready"), "{err}");
        assert!(err.contains("oops"), "{err}");
    }

    #[test]
    fn a_missing_binary_is_an_error() {
        let err = ExitChild::spawn(Path::new("/nonexistent/teravm-bench"), &[])
            .unwrap_err()
            .to_string();
        assert!(err.contains("cannot start"), "{err}");
    }

    #[test]
    fn child_args_name_the_case() {
        use clap::Parser;
        let args = Args::try_parse_from(["b", "--size-gib", "3", "--sysfs-root", "/x"]).unwrap();
        let case = Case {
            pages: crate::model::Pages::Thp,
            backing: teravm::config::Backing::Memfd,
        };
        let v = child_args(case, &args);
        assert_eq!(
            v,
            [
                "--exit-child",
                "--size-gib",
                "3",
                "--pages",
                "thp",
                "--backing",
                "memfd",
                "--sysfs-root",
                "/x"
            ]
        );
        let parsed = Args::try_parse_from(std::iter::once("b".to_string()).chain(v)).unwrap();
        assert!(parsed.exit_child);
        assert_eq!(parsed.sysfs_root, PathBuf::from("/x"));
    }
}
