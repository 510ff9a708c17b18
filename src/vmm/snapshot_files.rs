//! A snapshot create's two files, on the `files` thread: made new under a
//! temporary name beside their final one (`.<name>.partial`, opened
//! [`crate::seccomp::open_flags::SNAPSHOT_NEW`]: never an existing file, a
//! FIFO or a symlink), then, once the create job has written and synced
//! them, renamed to their names (the memory file first; a state file that
//! cannot be renamed takes the memory file back), or removed. Only the
//! `files` thread opens for writing, renames and removes; the job only
//! writes into the descriptors. A temporary name also keeps a guest loaded
//! lazily from the very memory file being replaced whole: its mapping keeps
//! the old file.

use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use crate::snapshot::CreateSnapshotParams;

/// One file written under a temporary name.
#[derive(Debug)]
pub struct Partial {
    /// `snapshot_path` or `mem_file_path`.
    pub what: &'static str,
    /// The temporary file, open for writing.
    pub file: File,
    temp: PathBuf,
    path: PathBuf,
}

impl Partial {
    fn create(what: &'static str, path: &Path) -> Result<Partial, String> {
        let err = |e: std::io::Error| format!("{what} {}: {e}", path.display());
        let name = path
            .file_name()
            .ok_or_else(|| format!("{what} {}: names no file", path.display()))?;
        let mut temp_name = OsString::from(".");
        temp_name.push(name);
        temp_name.push(".partial");
        let temp = path.with_file_name(temp_name);
        // A leftover of a create that was killed mid-way goes first.
        let _ = std::fs::remove_file(&temp);
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            // With std's O_WRONLY|O_CREAT|O_EXCL|O_CLOEXEC: SNAPSHOT_NEW.
            .custom_flags(libc::O_NOFOLLOW)
            .open(&temp)
            .map_err(err)?;
        Ok(Partial {
            what,
            file,
            temp,
            path: path.to_path_buf(),
        })
    }

    /// The final name.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// The memory file and the state file of one create.
#[derive(Debug)]
pub struct SnapshotFiles {
    /// The memory file.
    pub mem: Partial,
    /// The state file.
    pub state: Partial,
}

impl SnapshotFiles {
    /// Makes both temporary files (on the `files` thread).
    pub fn create(params: &CreateSnapshotParams) -> Result<SnapshotFiles, String> {
        let mem = Partial::create("mem_file_path", &params.mem_file_path)?;
        match Partial::create("snapshot_path", &params.snapshot_path) {
            Ok(state) => Ok(SnapshotFiles { mem, state }),
            Err(e) => {
                let _ = std::fs::remove_file(&mem.temp);
                Err(e)
            }
        }
    }

    /// Renames both to their names, the memory file first (on the `files`
    /// thread); on a failure nothing that looks like a snapshot is left.
    pub fn commit(self) -> Result<(), String> {
        let SnapshotFiles { mem, state } = self;
        let rename = |p: &Partial| {
            std::fs::rename(&p.temp, &p.path)
                .map_err(|e| format!("{} {}: cannot rename: {e}", p.what, p.path.display()))
        };
        if let Err(e) = rename(&mem) {
            let _ = std::fs::remove_file(&mem.temp);
            let _ = std::fs::remove_file(&state.temp);
            return Err(e);
        }
        if let Err(e) = rename(&state) {
            let _ = std::fs::remove_file(&mem.path);
            let _ = std::fs::remove_file(&state.temp);
            return Err(e);
        }
        Ok(())
    }

    /// Removes both temporary files (on the `files` thread).
    pub fn discard(self) {
        let _ = std::fs::remove_file(&self.mem.temp);
        let _ = std::fs::remove_file(&self.state.temp);
    }
}
