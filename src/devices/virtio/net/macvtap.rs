//! A macvtap (or ipvtap) character device as a network interface's host
//! side: `host_dev_name` an absolute path, as flintlock names a macvtap
//! interface's node (`/dev/tap<ifindex>`). Upstream Firecracker takes only
//! TAP names (its `TUNSETIFF` refuses a path); its macvtap prototype
//! (firecracker#2217, the fork flintlock used) opens a path as a device node.
//!
//! Opening a character device can act on the host (a watchdog arms when it
//! is opened), so the node is opened only once sysfs says it is a macvtap
//! or ipvtap queue: `/sys/dev/char/<major>:<minor>/uevent` names it
//! (`DEVNAME=tap5`) and `/sys/class/{macvtap,ipvtap}/<name>/dev` has the
//! same numbers. After the open the fd's numbers are checked again, then it
//! is attached as a tap is (`TUNSETIFF` with the tap's flags, which a
//! macvtap takes without a name, the 12-byte header, no offloads).
//! `/dev/net/tun` itself is refused (an unattached tun fd would create a
//! tap on `TUNSETIFF`).
//!
//! Syscalls (the VMM's files thread): `statx`, `openat` read-only of two
//! sysfs files and `read`, `openat` of the node read-write and
//! non-blocking, `fstat`, then [`super::tap`]'s ioctls.

use std::fs::OpenOptions;
use std::io::Read;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::Path;

use super::tap::{attach, Tap};
use super::NetError;

/// Where sysfs is mounted.
const SYSFS: &str = "/sys";
/// The device classes whose nodes are taps.
const CLASSES: [&str; 2] = ["macvtap", "ipvtap"];
/// The most bytes read of a sysfs file (a uevent is a few short lines).
const MAX_SYSFS_BYTES: u64 = 4096;

/// Opens the macvtap or ipvtap node at `path` as a tap.
pub fn open_macvtap(path: &str) -> Result<Tap, NetError> {
    open_in(Path::new(SYSFS), path)
}

/// [`open_macvtap`] with sysfs at `sys` (a fake tree in tests).
fn open_in(sys: &Path, path: &str) -> Result<Tap, NetError> {
    let err = |why: String| NetError::Macvtap {
        path: path.to_string(),
        why,
    };
    let meta = std::fs::metadata(path).map_err(|e| err(format!("cannot be read: {e}")))?;
    if !meta.file_type().is_char_device() {
        return Err(err(
            "is not a character device (a path names a macvtap's node, /dev/tap<ifindex>)".into(),
        ));
    }
    let rdev = meta.rdev();
    vtap_class(sys, rdev).map_err(err)?;
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| err(format!("cannot be opened: {e}")))?;
    let now = file
        .metadata()
        .map_err(|e| err(format!("cannot be read once open: {e}")))?;
    if !now.file_type().is_char_device() || now.rdev() != rdev {
        return Err(err("was replaced while it was opened".into()));
    }
    attach(file, "", path.to_string())
}

/// The class (`macvtap` or `ipvtap`) of the character device `rdev`, from
/// sysfs at `sys`; `Err` says what it is instead.
fn vtap_class(sys: &Path, rdev: u64) -> Result<&'static str, String> {
    let (major, minor) = (libc::major(rdev), libc::minor(rdev));
    let numbers = format!("{major}:{minor}");
    let uevent = read_small(&sys.join("dev/char").join(&numbers).join("uevent"))
        .map_err(|e| format!("is character device {numbers}, which sysfs does not know: {e}"))?;
    let name = uevent
        .lines()
        .find_map(|l| l.strip_prefix("DEVNAME="))
        .unwrap_or("");
    let plain = !name.is_empty() && name != "." && name != ".." && !name.contains('/');
    if plain {
        for class in CLASSES {
            let dev = sys.join("class").join(class).join(name).join("dev");
            if read_small(&dev).is_ok_and(|d| d.trim() == numbers) {
                return Ok(class);
            }
        }
    }
    Err(format!(
        "is character device {numbers} ({name:?}), not a macvtap or ipvtap device"
    ))
}

/// A sysfs file's text, at most [`MAX_SYSFS_BYTES`], opened read-only and
/// non-blocking (the flags the files thread may open with).
fn read_small(path: &Path) -> std::io::Result<String> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    let mut text = String::new();
    file.take(MAX_SYSFS_BYTES).read_to_string(&mut text)?;
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake sysfs tree for the tests: `numbers` ("M:m") named `name` in
    /// `class`.
    fn fake_sysfs(root: &Path, numbers: &str, name: &str, class: &str) {
        let dev = root.join("dev/char").join(numbers);
        std::fs::create_dir_all(&dev).unwrap();
        let (major, minor) = numbers.split_once(':').unwrap();
        std::fs::write(
            dev.join("uevent"),
            format!("MAJOR={major}\nMINOR={minor}\nDEVNAME={name}\n"),
        )
        .unwrap();
        let node = root.join("class").join(class).join(name);
        std::fs::create_dir_all(&node).unwrap();
        std::fs::write(node.join("dev"), format!("{numbers}\n")).unwrap();
    }

    fn temp(tag: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("teravm-vtap-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn why(e: NetError) -> String {
        match e {
            NetError::Macvtap { why, .. } => why,
            other => panic!("not a Macvtap error: {other}"),
        }
    }

    #[test]
    fn sysfs_says_which_nodes_are_taps() {
        let root = temp("class");
        fake_sysfs(&root, "243:5", "tap5", "macvtap");
        fake_sysfs(&root, "244:7", "tap7", "ipvtap");
        fake_sysfs(&root, "10:130", "watchdog", "misc");
        assert_eq!(vtap_class(&root, libc::makedev(243, 5)), Ok("macvtap"));
        assert_eq!(vtap_class(&root, libc::makedev(244, 7)), Ok("ipvtap"));
        let e = vtap_class(&root, libc::makedev(10, 130)).unwrap_err();
        assert!(
            e.contains("\"watchdog\"") && e.contains("not a macvtap"),
            "{e}"
        );
        let e = vtap_class(&root, libc::makedev(243, 6)).unwrap_err();
        assert!(
            e.contains("243:6") && e.contains("sysfs does not know"),
            "{e}"
        );
        // The class must hold the same numbers, not only the name.
        fake_sysfs(&root, "243:8", "tap5", "macvtap");
        std::fs::write(root.join("class/macvtap/tap5/dev"), "243:5\n").unwrap();
        assert!(vtap_class(&root, libc::makedev(243, 8)).is_err());
        // A name with a '/' (the tun device is "net/tun") never leaves the class.
        fake_sysfs(&root, "10:200", "net/tun", "macvtap");
        assert!(vtap_class(&root, libc::makedev(10, 200)).is_err());
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn what_is_not_a_macvtap_is_refused_before_it_is_opened() {
        // The host's real sysfs: /dev/null is "null", /dev/net/tun "net/tun".
        for path in ["/dev/null", "/dev/net/tun"] {
            if !Path::new(path).exists() {
                continue;
            }
            let w = why(open_macvtap(path).unwrap_err());
            assert!(w.contains("not a macvtap or ipvtap device"), "{path}: {w}");
        }
        let w = why(open_macvtap("/dev/tap-teravm-nosuch").unwrap_err());
        assert!(w.starts_with("cannot be read"), "{w}");
        let dir = temp("file");
        let file = dir.join("tap5");
        std::fs::write(&file, b"").unwrap();
        let w = why(open_macvtap(file.to_str().unwrap()).unwrap_err());
        assert!(w.starts_with("is not a character device"), "{w}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_node_sysfs_vouches_for_is_attached_as_a_tap() {
        // sysfs (fake) says /dev/null is a macvtap; the open goes on to the
        // tap's TUNSETIFF, which /dev/null refuses: the whole path runs.
        let root = temp("attach");
        fake_sysfs(&root, "1:3", "tap3", "macvtap");
        let e = open_in(&root, "/dev/null").unwrap_err();
        assert!(
            matches!(&e, NetError::TapAttach { name, .. } if name == "/dev/null"),
            "{e}"
        );
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn open_tap_sends_a_path_here() {
        let e = super::super::open_tap("/dev/null").unwrap_err();
        assert!(matches!(e, NetError::Macvtap { .. }), "{e}");
        assert!(
            e.to_string().starts_with("host device \"/dev/null\" "),
            "{e}"
        );
    }
}
