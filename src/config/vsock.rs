//! The `vsock` section and the body of `PUT /vsock`, in Firecracker's shape
//! (its swagger's `Vsock`): the guest's CID and the host Unix socket that
//! host-initiated connections come through (guest-initiated ones go to
//! `{uds_path}_{port}`). The socket is made by the VMM when it builds the
//! device.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::firecracker::check_path;
use super::{invalid, ConfigError};

/// The smallest guest CID: 0 to 2 are the hypervisor, the local loopback
/// and the host.
pub const MIN_GUEST_CID: u32 = 3;
/// The CID firecracker-go-sdk sends for a `VsockDevice` without one
/// (firecracker-containerd's `agent_api`): taken, as Firecracker takes it;
/// the device then reads CID 0 to the guest and expects it as the source of
/// the guest's packets (Linux's driver takes it as its own CID, and its
/// listeners bound to `VMADDR_CID_ANY` answer the host's connections).
pub const UNSET_GUEST_CID: u32 = 0;
/// Longest `uds_path`, in bytes: `sun_path` (108) less the NUL.
pub const MAX_UDS_PATH_LEN: usize = 107;

/// The vsock device: the `vsock` section and the body of `PUT /vsock`
/// (Firecracker's `Vsock`): `guest_cid` and `uds_path` required.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VsockConfig {
    /// The guest's context id, [`MIN_GUEST_CID`] to `u32::MAX - 1`
    /// (`u32::MAX` is `VMADDR_CID_ANY`).
    pub guest_cid: u32,
    /// The host Unix socket teravm listens on (at most
    /// [`MAX_UDS_PATH_LEN`] bytes).
    pub uds_path: PathBuf,
    /// Firecracker's deprecated id of the device: taken and shown, unused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vsock_id: Option<String>,
}

impl VsockConfig {
    /// Checks every field without touching the socket.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let unset = self.guest_cid == UNSET_GUEST_CID;
        if !unset && (self.guest_cid < MIN_GUEST_CID || self.guest_cid == u32::MAX) {
            return Err(invalid(
                "vsock.guest_cid",
                format!(
                    "{} is not a guest CID (1 and 2 are reserved, {} is VMADDR_CID_ANY; \
                     use {MIN_GUEST_CID}..={}, or 0 as firecracker-containerd sends it)",
                    self.guest_cid,
                    u32::MAX,
                    u32::MAX - 1
                ),
            ));
        }
        check_path("vsock.uds_path", &self.uds_path)?;
        let len = self.uds_path.as_os_str().len();
        if len > MAX_UDS_PATH_LEN {
            return Err(invalid(
                "vsock.uds_path",
                format!(
                    "{len} bytes is longer than a Unix socket path can be \
                     ({MAX_UDS_PATH_LEN} bytes)"
                ),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<VsockConfig, String> {
        serde_json::from_str(text).map_err(|e| e.to_string())
    }

    #[test]
    fn firecracker_shape() {
        let c = parse(r#"{"guest_cid": 3, "uds_path": "/tmp/v.sock"}"#).unwrap();
        assert_eq!(
            c,
            VsockConfig {
                guest_cid: 3,
                uds_path: "/tmp/v.sock".into(),
                vsock_id: None,
            }
        );
        c.validate().unwrap();
        let all = r#"{"guest_cid": 52, "uds_path": "v.sock", "vsock_id": "vsock0"}"#;
        let c = parse(all).unwrap();
        c.validate().unwrap();
        assert_eq!(
            serde_json::to_value(&c).unwrap(),
            serde_json::from_str::<serde_json::Value>(all).unwrap()
        );
        for (body, needle) in [
            (r#"{"uds_path": "v"}"#, "missing field `guest_cid`"),
            (r#"{"guest_cid": 3}"#, "missing field `uds_path`"),
            (
                r#"{"guest_cid": 3, "uds_path": "v", "cid": 3}"#,
                "unknown field `cid`",
            ),
            (r#"{"guest_cid": -1, "uds_path": "v"}"#, "invalid value"),
            (
                r#"{"guest_cid": 4294967296, "uds_path": "v"}"#,
                "invalid value",
            ),
            (r#"{"guest_cid": "3", "uds_path": "v"}"#, "invalid type"),
        ] {
            let e = parse(body).unwrap_err();
            assert!(e.contains(needle), "{body}: {e}");
        }
    }

    #[test]
    fn validation_names_the_field() {
        let mut c = VsockConfig {
            guest_cid: 2,
            uds_path: "v.sock".into(),
            vsock_id: None,
        };
        for cid in [1, 2, u32::MAX] {
            c.guest_cid = cid;
            let e = c.validate().unwrap_err().to_string();
            assert!(
                e.starts_with("invalid value for vsock.guest_cid: ") && e.contains("reserved"),
                "{e}"
            );
        }
        // firecracker-containerd's (go-sdk's `addVsock` without a CID).
        c.guest_cid = UNSET_GUEST_CID;
        c.validate().unwrap();
        c.guest_cid = u32::MAX - 1;
        c.validate().unwrap();
        for path in ["", "a\0b"] {
            c.uds_path = path.into();
            let e = c.validate().unwrap_err().to_string();
            assert!(e.contains("vsock.uds_path"), "{e}");
        }
        c.uds_path = "a".repeat(MAX_UDS_PATH_LEN).into();
        c.validate().unwrap();
        c.uds_path = "a".repeat(MAX_UDS_PATH_LEN + 1).into();
        let e = c.validate().unwrap_err().to_string();
        assert!(
            e.contains("vsock.uds_path") && e.contains("108 bytes"),
            "{e}"
        );
    }
}
