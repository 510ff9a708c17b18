//! What the jail tests take from the host: Firecracker's jailer, the
//! static teravm, this host's cgroup hierarchy, an exec file's libraries.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::Jail;

/// Firecracker's jailer, beside the Firecracker binary (the shared build
/// puts both in one `bin/`).
pub fn jailer_beside(firecracker: &Path) -> PathBuf {
    firecracker.with_file_name("jailer")
}

/// The static teravm, from `scripts/build-static.sh` (issue 37's
/// contract), built into `target/static` so that this build does not wait
/// on the lock of the `cargo test` that runs it: a no-op when it is fresh
/// (`.ci/run` builds it before the tests). Err says why there is none.
/// `$TERAVM_STATIC`, where set, is used as it is.
pub fn static_teravm() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("TERAVM_STATIC") {
        return Ok(PathBuf::from(p));
    }
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new(repo.join("scripts/build-static.sh"))
        .env("CARGO_TARGET_DIR", repo.join("target/static"))
        .output()
        .map_err(|e| format!("cannot run scripts/build-static.sh: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "scripts/build-static.sh failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout.lines().last().unwrap_or_default();
    Ok(PathBuf::from(last))
}

/// The cgroup hierarchy this host has for memory and cpu, as the jailer
/// will use it: v2 where the unified hierarchy at /sys/fs/cgroup has both
/// controllers, else v1 where both are mounted (these PVM hosts: v1
/// controllers and a v2 hierarchy without any).
#[derive(Debug, Clone)]
pub struct HostCgroup {
    pub version: u8,
    /// Where the memory controller's hierarchy is mounted.
    pub memory_root: PathBuf,
    /// Where the cpu controller's hierarchy is mounted.
    pub cpu_root: PathBuf,
    /// This process's own cgroup in the memory hierarchy (relative).
    pub own_memory: String,
}

impl HostCgroup {
    /// Asks the host (`/proc/self/mounts`, `cgroup.controllers`,
    /// `/proc/self/cgroup`). None, with why, where neither version has both.
    pub fn detect() -> Result<HostCgroup, String> {
        let mounts = std::fs::read_to_string("/proc/self/mounts").map_err(|e| e.to_string())?;
        let own = std::fs::read_to_string("/proc/self/cgroup").map_err(|e| e.to_string())?;
        let own_in = |pred: &dyn Fn(&str) -> bool| {
            own.lines()
                .find_map(|l| {
                    let mut f = l.splitn(3, ':');
                    let (_, ctrls, path) = (f.next()?, f.next()?, f.next()?);
                    pred(ctrls).then(|| path.trim_start_matches('/').to_string())
                })
                .unwrap_or_default()
        };
        for line in mounts.lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() > 3 && f[2] == "cgroup2" {
                let dir = PathBuf::from(f[1]);
                let ctrls =
                    std::fs::read_to_string(dir.join("cgroup.controllers")).unwrap_or_default();
                let has = |c: &str| ctrls.split_whitespace().any(|x| x == c);
                if has("memory") && has("cpu") {
                    return Ok(HostCgroup {
                        version: 2,
                        memory_root: dir.clone(),
                        cpu_root: dir,
                        own_memory: own_in(&|c| c.is_empty()),
                    });
                }
            }
        }
        let v1 = |ctrl: &str| {
            mounts.lines().find_map(|line| {
                let f: Vec<&str> = line.split_whitespace().collect();
                (f.len() > 3 && f[2] == "cgroup" && f[3].split(',').any(|o| o == ctrl))
                    .then(|| PathBuf::from(f[1]))
            })
        };
        match (v1("memory"), v1("cpu")) {
            (Some(memory_root), Some(cpu_root)) => Ok(HostCgroup {
                version: 1,
                memory_root,
                cpu_root,
                own_memory: own_in(&|c| c.split(',').any(|x| x == "memory")),
            }),
            _ => Err(
                "this host mounts neither a cgroup v2 hierarchy with the memory and cpu \
                      controllers nor v1 memory and cpu hierarchies"
                    .into(),
            ),
        }
    }

    /// The jailer's `--cgroup` values for a memory limit and a CPU quota
    /// (in µs per 100 ms period), in this host's version's file names.
    pub fn limits(&self, memory_bytes: u64, cpu_quota_us: u64) -> Vec<String> {
        match self.version {
            2 => vec![
                format!("memory.max={memory_bytes}"),
                format!("cpu.max={cpu_quota_us} 100000"),
            ],
            _ => vec![
                format!("memory.limit_in_bytes={memory_bytes}"),
                format!("cpu.cfs_quota_us={cpu_quota_us}"),
            ],
        }
    }

    /// The memory limit file's name in this version.
    pub fn memory_limit_file(&self) -> &'static str {
        if self.version == 2 {
            "memory.max"
        } else {
            "memory.limit_in_bytes"
        }
    }
}

/// The loader and libraries `ldd` names for `exec` (none for a static
/// binary).
pub fn shared_libraries(exec: &Path) -> Vec<PathBuf> {
    let out = Command::new("ldd").arg(exec).output().expect("ldd");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let path = match l.split_once("=>") {
                Some((_, right)) => right.split_whitespace().next()?,
                None => l.split_whitespace().next()?,
            };
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect()
}

/// Everything the jail tests need, or why it is missing.
pub struct Setup {
    pub firecracker: PathBuf,
    pub jailer: PathBuf,
    pub teravm: PathBuf,
    pub cgroup: HostCgroup,
}

pub fn setup(test: &str) -> Option<Setup> {
    if !super::super::kvm_or_skip(test) {
        return None;
    }
    // SAFETY: geteuid has no arguments and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        super::super::skip(test, "the jailer needs root (mknod, mount, cgroups)");
        return None;
    }
    let firecracker = super::super::firecracker(test)?;
    let jailer = jailer_beside(&firecracker);
    if !jailer.exists() {
        super::super::skip(test, format!("no jailer beside {}", firecracker.display()));
        return None;
    }
    let teravm = match static_teravm() {
        Ok(p) => p,
        Err(e) => {
            super::super::skip(test, e);
            return None;
        }
    };
    let cgroup = match HostCgroup::detect() {
        Ok(c) => c,
        Err(e) => {
            super::super::not_possible(test, e);
            return None;
        }
    };
    Some(Setup {
        firecracker,
        jailer,
        teravm,
        cgroup,
    })
}

/// Reads a cgroup file of the VM (`<root>/<parent>/<id>/<file>`).
pub fn cgroup_file(j: &Jail, root: &Path, file: &str) -> String {
    let dir = j
        .cgroup_dirs
        .iter()
        .find(|d| d.starts_with(root))
        .expect("the VM's cgroup under that root");
    std::fs::read_to_string(dir.join(file))
        .unwrap_or_else(|e| panic!("{}: {e}", dir.join(file).display()))
}
