//! A network namespace with a tap for the tests that attach a virtio-net
//! (as tests/devices.rs makes one): `ip netns add`, a tap `tap0` in it, up;
//! an AF_PACKET socket on that tap to see the guest's frames. The namespace
//! is deleted when dropped; no traffic leaves it.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::Command;
use std::time::{Duration, Instant};

/// A network namespace with a tap `tap0`, removed when dropped.
pub struct Netns {
    pub name: String,
}

impl Netns {
    /// None where namespaces or taps cannot be made (not root, no `ip`).
    pub fn new(tag: &str) -> Option<Netns> {
        let name = format!("teravm-{tag}-{}", std::process::id());
        let ok = |args: &[&str]| {
            Command::new("ip")
                .args(args)
                .status()
                .is_ok_and(|s| s.success())
        };
        if !ok(&["netns", "add", &name]) {
            return None;
        }
        let ns = Netns { name };
        let n = ns.name.clone();
        if !(ok(&["-n", &n, "tuntap", "add", "dev", "tap0", "mode", "tap"])
            && ok(&["-n", &n, "link", "set", "tap0", "up"]))
        {
            return None;
        }
        Some(ns)
    }

    /// `ip netns exec NAME` then `program` (ip execs it: the child is it).
    pub fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.name, program]);
        cmd
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

/// An AF_PACKET socket bound to `tap0` inside `ns` (made on a thread that
/// enters the namespace; the socket keeps it).
pub fn packet_socket(ns: &Netns) -> OwnedFd {
    packet_socket_on(ns, "tap0")
}

/// An AF_PACKET socket bound to the interface `dev` inside `ns`.
pub fn packet_socket_on(ns: &Netns, dev: &str) -> OwnedFd {
    let path = format!("/var/run/netns/{}", ns.name);
    let dev = dev.to_string();
    std::thread::spawn(move || {
        let f = std::fs::File::open(&path).unwrap();
        // SAFETY: setns on this thread with a namespace fd we hold.
        assert_eq!(unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) }, 0);
        let proto = (libc::ETH_P_ALL as u16).to_be();
        // SAFETY: a new socket; the result is checked.
        let fd = unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                proto.into(),
            )
        };
        assert!(fd >= 0, "{}", std::io::Error::last_os_error());
        // SAFETY: a new descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let name = std::ffi::CString::new(dev).unwrap();
        // SAFETY: a NUL-terminated name.
        let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
        assert!(index > 0);
        // SAFETY: plain data, zeroed, then filled.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = proto;
        sll.sll_ifindex = index as i32;
        // SAFETY: binds our socket to a valid sockaddr_ll of its size.
        let rc = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&sll as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            )
        };
        assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
        fd
    })
    .join()
    .unwrap()
}

/// The next frame with the firmware's EtherType 0x88B5 on `fd`, within
/// `timeout`.
pub fn next_frame(fd: &OwnedFd, timeout: Duration) -> Option<Vec<u8>> {
    let deadline = Instant::now() + timeout;
    let mut buf = vec![0u8; 2048];
    while Instant::now() < deadline {
        let mut pfd = libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one pollfd on our stack.
        if unsafe { libc::poll(&mut pfd, 1, 100) } <= 0 {
            continue;
        }
        // SAFETY: reads into our buffer of its length.
        let n = unsafe { libc::recv(pfd.fd, buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n >= 14 && buf[12] == 0x88 && buf[13] == 0xB5 {
            return Some(buf[..n as usize].to_vec());
        }
    }
    None
}

/// teravm in `ns` (128 MiB, metrics in `dir/metrics`) with eth0 on
/// `host_dev_name` (`iface`: more fields, each after a comma), the test
/// guest running `args`, started: (teravm, API socket).
pub fn start_on(
    ns: &Netns,
    dir: &std::path::Path,
    host_dev_name: &str,
    iface: &str,
    args: &str,
) -> (super::Vmm, std::path::PathBuf) {
    start_program_on(super::teravm(), ns, dir, host_dev_name, iface, args)
}

/// [`start_on`] with `program`, teravm or the real Firecracker (the same
/// requests; Firecracker's log goes to `<dir>/fc.log`, and the metrics file
/// is made first, as Firecracker opens it without creating it).
pub fn start_program_on(
    program: &str,
    ns: &Netns,
    dir: &std::path::Path,
    host_dev_name: &str,
    iface: &str,
    args: &str,
) -> (super::Vmm, std::path::PathBuf) {
    use super::api::{action, put_ok, T};
    let sock = dir.join("api.sock");
    let mut cmd = ns.command(program);
    cmd.arg("--api-sock").arg(&sock);
    if program != super::teravm() {
        let log = dir.join("fc.log");
        std::fs::write(&log, "").unwrap();
        cmd.arg("--log-path").arg(&log);
    }
    std::fs::write(dir.join("metrics"), "").unwrap();
    let vmm = super::Vmm::spawn_command(cmd);
    super::wait_for_api(&sock, T);
    put_ok(
        &sock,
        "/machine-config",
        r#"{"vcpu_count": 1, "mem_size_mib": 128, "huge_pages": "None"}"#,
    );
    put_ok(
        &sock,
        "/metrics",
        &format!(r#"{{"metrics_path": "{}"}}"#, dir.join("metrics").display()),
    );
    put_ok(
        &sock,
        "/network-interfaces/eth0",
        &format!(r#"{{"iface_id": "eth0", "host_dev_name": "{host_dev_name}"{iface}}}"#),
    );
    let boot = super::guests::Guest::TestGuest.boot_source(args);
    put_ok(&sock, "/boot-source", &boot);
    let (status, body) = action(&sock, r#"{"action_type": "InstanceStart"}"#);
    assert_eq!(status, 204, "{body}");
    (vmm, sock)
}
