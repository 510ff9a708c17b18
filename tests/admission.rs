//! Memory admission with the real binary in a real memory cgroup: a guest
//! to be populated that does not fit the cgroup's limit is refused with exit
//! 1 and a message naming the numbers, before anything is touched (without
//! admission the OOM killer ends it: exit 137, no message).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{config_file, config_json, kvm_or_skip, skip, temp_dir, teravm, Vmm};

const T: Duration = Duration::from_secs(60);

/// A memory cgroup made for one test, removed on drop (once empty).
struct Cgroup {
    dir: PathBuf,
}

impl Cgroup {
    /// A child cgroup limited to `limit` bytes: v2 under `/sys/fs/cgroup`
    /// (memory.max), or v1 under this process's memory cgroup
    /// (memory.limit_in_bytes). Why not, where neither can be made.
    fn create(limit: u64) -> Result<Cgroup, String> {
        let name = format!("teravm-admission-{}", std::process::id());
        let own = std::fs::read_to_string("/proc/self/cgroup").map_err(|e| e.to_string())?;
        let root = Path::new("/sys/fs/cgroup");
        let mut tried = Vec::new();
        // v2: the unified hierarchy mounted at /sys/fs/cgroup with the memory
        // controller enabled for children.
        let controllers =
            std::fs::read_to_string(root.join("cgroup.subtree_control")).unwrap_or_default();
        if controllers.split_whitespace().any(|c| c == "memory") {
            match Self::make(&root.join(&name), "memory.max", limit) {
                Ok(c) => return Ok(c),
                Err(e) => tried.push(format!("v2: {e}")),
            }
        } else {
            tried.push("v2: no memory controller in /sys/fs/cgroup/cgroup.subtree_control".into());
        }
        // v1: a child of our own memory cgroup.
        let v1 = own.lines().find_map(|l| {
            let mut p = l.splitn(3, ':');
            let (_, c, path) = (p.next()?, p.next()?, p.next()?);
            c.split(',')
                .any(|c| c == "memory")
                .then(|| path.trim_start_matches('/').to_string())
        });
        match v1 {
            Some(path) => {
                let dir = root.join("memory").join(path).join(&name);
                match Self::make(&dir, "memory.limit_in_bytes", limit) {
                    Ok(c) => return Ok(c),
                    Err(e) => tried.push(format!("v1: {e}")),
                }
            }
            None => tried.push("v1: no memory hierarchy in /proc/self/cgroup".into()),
        }
        Err(tried.join("; "))
    }

    fn make(dir: &Path, limit_file: &str, limit: u64) -> Result<Cgroup, String> {
        std::fs::create_dir(dir).map_err(|e| format!("mkdir {}: {e}", dir.display()))?;
        let cgroup = Cgroup {
            dir: dir.to_path_buf(),
        };
        std::fs::write(dir.join(limit_file), limit.to_string())
            .map_err(|e| format!("{}/{limit_file}: {e}", dir.display()))?;
        Ok(cgroup)
    }

    /// Spawns teravm with `args` inside the cgroup: a shell moves itself in,
    /// then execs teravm, so nothing runs outside the limit.
    fn spawn_teravm(&self, args: &[&str]) -> Vmm {
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg(r#"echo $$ > "$0/cgroup.procs" && exec "$@""#)
            .arg(&self.dir)
            .arg(teravm())
            .args(args);
        Vmm::spawn_command(cmd)
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.dir);
    }
}

fn populate_config(dir: &Path, mib: u64) -> PathBuf {
    config_file(
        dir,
        &config_json(
            1,
            mib,
            "touch=16 then=reset",
            r#", "memory": {"populate": true}"#,
        ),
    )
}

#[test]
fn a_populated_guest_larger_than_the_cgroup_is_refused() {
    if !kvm_or_skip("a_populated_guest_larger_than_the_cgroup_is_refused") {
        return;
    }
    let cgroup = match Cgroup::create(1 << 30) {
        Ok(c) => c,
        Err(why) => {
            skip(
                "a_populated_guest_larger_than_the_cgroup_is_refused",
                format!("cannot make a memory cgroup ({why})"),
            );
            return;
        }
    };
    let dir = temp_dir("admission");
    let cfg = populate_config(&dir, 4096);
    let vmm = cgroup.spawn_teravm(&["--config-file", cfg.to_str().unwrap(), "--no-api"]);
    let (code, stdout, stderr) = vmm.wait(T);
    assert_eq!(
        code, 1,
        "refused, not killed; stdout {stdout:?}, stderr {stderr}"
    );
    assert!(stderr.contains("populating 4096 MiB"), "{stderr}");
    assert!(stderr.contains("limit 1024 MiB"), "{stderr}");
    assert!(stderr.contains(cgroup.dir.to_str().unwrap()), "{stderr}");
    assert_eq!(
        stderr
            .lines()
            .filter(|l| l.contains("populating 4096 MiB"))
            .count(),
        1,
        "one line: {stderr}"
    );

    // The same cgroup admits (and populates) a guest that fits.
    let cfg = populate_config(&dir, 256);
    let vmm = cgroup.spawn_teravm(&["--config-file", cfg.to_str().unwrap(), "--no-api"]);
    let (code, stdout, stderr) = vmm.wait(T);
    assert_eq!(code, 0, "stdout {stdout:?}, stderr {stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}
