//! Who is at the other end of a connection: the peer's credentials from
//! `SO_PEERCRED`, the rule on which peers may use the API (root, or the uid
//! teravm runs as), and a log that names each refused uid once.

use std::collections::HashSet;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;

/// The credentials the kernel recorded for the peer when it connected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct PeerCred {
    /// The peer's process id.
    pub(super) pid: i32,
    /// The peer's effective user id.
    pub(super) uid: u32,
}

/// `SO_PEERCRED` of a connected Unix socket.
pub(super) fn peer_cred(stream: &UnixStream) -> io::Result<PeerCred> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` and `len` are valid for writes for the whole call and
    // `len` holds the size of `cred`; the result is checked.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            &mut cred as *mut libc::ucred as *mut libc::c_void,
            &mut len,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(PeerCred {
        pid: cred.pid,
        uid: cred.uid,
    })
}

/// The uid teravm runs as (effective: the one that owns the socket file).
pub(super) fn own_uid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// Whether a peer with `peer_uid` may use the API of a teravm running as
/// `own_uid`: root, or the same user.
pub(super) fn peer_allowed(peer_uid: u32, own_uid: u32) -> bool {
    peer_uid == 0 || peer_uid == own_uid
}

/// Most refused uids remembered; beyond, refusals are logged at debug level.
const MAX_LOGGED_UIDS: usize = 64;

/// Logs the first refusal of each uid as a warning and the others at debug
/// level, so a client that retries cannot flood the log.
#[derive(Debug, Default)]
pub(super) struct RefusalLog {
    logged: HashSet<u32>,
}

impl RefusalLog {
    /// Whether the refusal of `uid` is the first one to log as a warning.
    pub(super) fn first(&mut self, uid: u32) -> bool {
        if self.logged.contains(&uid) || self.logged.len() >= MAX_LOGGED_UIDS {
            return false;
        }
        self.logged.insert(uid)
    }

    /// Logs the refusal of `peer`.
    pub(super) fn refused(&mut self, peer: PeerCred, own_uid: u32) {
        let message = format!(
            "API server: refused a connection from uid {} (pid {}): only root and uid {own_uid} may use this socket",
            peer.uid, peer.pid
        );
        if self.first(peer.uid) {
            log::warn!("{message} (further refusals of this uid are logged at debug level)");
        } else {
            log::debug!("{message}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_and_the_same_uid_only() {
        assert!(peer_allowed(0, 0));
        assert!(!peer_allowed(1000, 0));
        assert!(peer_allowed(1000, 1000));
        assert!(peer_allowed(0, 1000));
        assert!(!peer_allowed(1001, 1000));
        assert!(!peer_allowed(u32::MAX, 1000));
    }

    #[test]
    fn our_own_peer_is_us() {
        let (a, _b) = UnixStream::pair().unwrap();
        let cred = peer_cred(&a).unwrap();
        assert_eq!(cred.uid, own_uid());
        assert_eq!(cred.pid, std::process::id() as i32);
        assert!(peer_allowed(cred.uid, own_uid()));
    }

    #[test]
    fn each_uid_is_logged_once_and_the_log_is_bounded() {
        let mut log = RefusalLog::default();
        assert!(log.first(1000));
        assert!(!log.first(1000));
        assert!(log.first(1001));
        for uid in 2000..2000 + MAX_LOGGED_UIDS as u32 {
            log.first(uid);
        }
        assert!(!log.first(5000));
        assert_eq!(log.logged.len(), MAX_LOGGED_UIDS);
    }
}
