//! The host side of the network device: a tap opened by name (or a
//! macvtap's node by path, [`super::macvtap`]), and the
//! [`NetBackend`] trait the device's thread reads and writes frames through
//! (a tap in production, a recording backend in tests and fuzzing).
//!
//! Syscalls of [`open_named`] (the VMM's files thread): `socket` + `ioctl
//! SIOCGIFINDEX` + `close` (does the interface exist?), `openat
//! /dev/net/tun`, `ioctl TUNSETIFF`, `ioctl TUNSETVNETHDRSZ`, `ioctl
//! TUNSETOFFLOAD` (0). Of a [`Tap`] on the device's thread: `read`, `write`,
//! `ioctl TUNSETOFFLOAD`.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::net::UdpSocket;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;

use vmm_sys_util::ioctl::{ioctl_with_mut_ref, ioctl_with_ref, ioctl_with_val};

use super::features::{GUEST_CSUM, GUEST_TSO4, GUEST_TSO6, GUEST_UFO};
use super::{NetError, VNET_HDR_BYTES};

/// Where frames go and come from. Every call returns at once (the fd is
/// non-blocking); the device's thread polls [`AsRawFd::as_raw_fd`] for
/// readability, edge triggered, and reads until `WouldBlock`.
pub trait NetBackend: Send + AsRawFd {
    /// Reads one frame, with its virtio-net header, into `buf`; its length,
    /// or `WouldBlock` when none waits.
    fn read_frame(&mut self, buf: &mut [u8]) -> std::io::Result<usize>;
    /// Writes one frame, with its virtio-net header.
    fn write_frame(&mut self, frame: &[u8]) -> std::io::Result<usize>;
    /// Sets the offloads (`TUN_F_*`) the host may send in frames read.
    fn set_offload(&mut self, tun_flags: u32) -> std::io::Result<()>;
}

/// An open tap: `IFF_TAP | IFF_NO_PI | IFF_VNET_HDR`, non-blocking,
/// close-on-exec.
#[derive(Debug)]
pub struct Tap {
    file: File,
    name: String,
}

/// `struct ifreq`: the name and the first bytes of its union (flags or
/// index), as the kernel copies it.
#[repr(C, align(8))]
struct IfReq {
    name: [u8; libc::IFNAMSIZ],
    data: [u8; 24],
}

impl IfReq {
    fn named(name: &str) -> IfReq {
        let mut r = IfReq {
            name: [0; libc::IFNAMSIZ],
            data: [0; 24],
        };
        r.name[..name.len()].copy_from_slice(name.as_bytes());
        r
    }
}

fn check_name(name: &str) -> Result<(), NetError> {
    let bad = name.is_empty()
        || name.len() >= libc::IFNAMSIZ
        || name
            .bytes()
            .any(|b| b == 0 || b == b'/' || b.is_ascii_whitespace());
    if bad {
        return Err(NetError::TapName(name.to_string()));
    }
    Ok(())
}

/// Whether an interface named `name` exists in the calling thread's
/// network namespace (what `if_nametoindex` does).
fn interface_exists(name: &str) -> std::io::Result<bool> {
    let sock = UdpSocket::bind("0.0.0.0:0")?;
    let mut req = IfReq::named(name);
    // SAFETY: SIOCGIFINDEX reads the NUL-terminated name (check_name keeps
    // it under IFNAMSIZ bytes, the rest is zero) and writes an int into the
    // union; `req` is a live, writable buffer of the kernel's ifreq size.
    let rc = unsafe { ioctl_with_mut_ref(&sock, libc::SIOCGIFINDEX, &mut req) };
    if rc == 0 {
        return Ok(true);
    }
    let e = std::io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::ENODEV) {
        return Ok(false);
    }
    Err(e)
}

/// Opens the existing tap `name` (in the calling thread's network
/// namespace) with a 12-byte virtio-net header and no offloads; the device
/// sets the offloads when the guest has acked them. A tap that does not
/// exist is [`NetError::TapMissing`] (root could create one by opening it;
/// teravm never does).
pub fn open_named(name: &str) -> Result<Tap, NetError> {
    check_name(name)?;
    match interface_exists(name) {
        Ok(true) => {}
        Ok(false) => return Err(NetError::TapMissing(name.to_string())),
        Err(e) => {
            return Err(NetError::TapIoctl {
                name: name.to_string(),
                what: "SIOCGIFINDEX",
                source: e,
            })
        }
    }
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open("/dev/net/tun")
        .map_err(|source| NetError::TunOpen {
            name: name.to_string(),
            source,
        })?;
    attach(file, name, name.to_string())
}

/// Makes `file` a tap: `TUNSETIFF` (`ifr_name` the interface for
/// `/dev/net/tun`; a macvtap's fd ignores it and takes only the flags),
/// the 12-byte header, no offloads. `name` is what errors and
/// [`Tap::name`] say.
pub(super) fn attach(file: File, ifr_name: &str, name: String) -> Result<Tap, NetError> {
    let ioctl_err = |what, source| NetError::TapIoctl {
        name: name.clone(),
        what,
        source,
    };
    let mut req = IfReq::named(ifr_name);
    let flags = (libc::IFF_TAP | libc::IFF_NO_PI | libc::IFF_VNET_HDR) as i16;
    req.data[..2].copy_from_slice(&flags.to_ne_bytes());
    // SAFETY: TUNSETIFF reads an ifreq (name and flags) from `req` and may
    // write the name back; `req` is a live buffer of ifreq's size. `file`
    // is the tun control device or a macvtap's node.
    if unsafe { ioctl_with_mut_ref(&file, libc::TUNSETIFF as _, &mut req) } < 0 {
        return Err(NetError::TapAttach {
            name,
            source: std::io::Error::last_os_error(),
        });
    }
    let hdr = VNET_HDR_BYTES as libc::c_int;
    // SAFETY: TUNSETVNETHDRSZ reads one int from the pointer; `hdr` lives
    // across the call.
    if unsafe { ioctl_with_ref(&file, libc::TUNSETVNETHDRSZ as _, &hdr) } < 0 {
        return Err(ioctl_err(
            "TUNSETVNETHDRSZ",
            std::io::Error::last_os_error(),
        ));
    }
    let mut tap = Tap {
        file,
        name: name.clone(),
    };
    // A tap used before may keep offloads the next guest has not acked.
    tap.set_offload(0)
        .map_err(|e| ioctl_err("TUNSETOFFLOAD", e))?;
    Ok(tap)
}

impl Tap {
    /// The interface's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Another handle on the same tap (`dup`): a device gets its own, so
    /// the configured one stays when a start fails.
    pub fn try_clone(&self) -> std::io::Result<Tap> {
        Ok(Tap {
            file: self.file.try_clone()?,
            name: self.name.clone(),
        })
    }
}

impl AsRawFd for Tap {
    fn as_raw_fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }
}

impl NetBackend for Tap {
    fn read_frame(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.file.read(buf)
    }

    fn write_frame(&mut self, frame: &[u8]) -> std::io::Result<usize> {
        self.file.write(frame)
    }

    fn set_offload(&mut self, tun_flags: u32) -> std::io::Result<()> {
        // SAFETY: TUNSETOFFLOAD takes its flags by value and touches no
        // memory of ours; `file` is an attached tap.
        let rc = unsafe {
            ioctl_with_val(
                &self.file,
                libc::TUNSETOFFLOAD as _,
                libc::c_ulong::from(tun_flags),
            )
        };
        if rc < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }
}

/// The tap's offloads for the features the driver acked (Firecracker's
/// rule): what the guest takes in received frames.
pub fn tap_offload_for(acked: u64) -> u32 {
    let mut f = 0;
    for (feature, tun) in [
        (GUEST_CSUM, libc::TUN_F_CSUM),
        (GUEST_TSO4, libc::TUN_F_TSO4),
        (GUEST_TSO6, libc::TUN_F_TSO6),
        (GUEST_UFO, libc::TUN_F_UFO),
    ] {
        if acked & feature != 0 {
            f |= tun;
        }
    }
    f
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_offloads() {
        for bad in ["", "a/b", "has space", "sixteen-bytes-xx", "nul\0"] {
            assert!(
                matches!(check_name(bad), Err(NetError::TapName(_))),
                "{bad:?}"
            );
        }
        assert!(check_name("tap0").is_ok());
        assert!(check_name("fifteen-bytes-x").is_ok());
        assert_eq!(tap_offload_for(0), 0);
        assert_eq!(
            tap_offload_for(GUEST_CSUM | GUEST_TSO4 | GUEST_TSO6 | GUEST_UFO),
            libc::TUN_F_CSUM | libc::TUN_F_TSO4 | libc::TUN_F_TSO6 | libc::TUN_F_UFO
        );
        assert_eq!(tap_offload_for(GUEST_TSO6), libc::TUN_F_TSO6);
        // Host-side features do not change what the tap sends.
        assert_eq!(tap_offload_for(super::super::features::HOST_TSO4), 0);
    }

    #[test]
    fn a_missing_tap_is_named() {
        let e = open_named("tvnosuch0").unwrap_err();
        assert!(matches!(e, NetError::TapMissing(_)), "{e}");
        assert!(e.to_string().contains("\"tvnosuch0\""), "{e}");
    }
}
