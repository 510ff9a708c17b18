//! The `boot-source` section: the kernel and initrd to boot (or the
//! built-in firmware) and the command line.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::firecracker::check_path;
use super::{invalid, ConfigError};

/// Longest firmware / kernel command line, in bytes.
pub const MAX_BOOT_ARGS_LEN: usize = 2048;

/// The `boot-source` section.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BootSource {
    /// A Linux kernel to boot (ELF vmlinux or bzImage); absent means the
    /// built-in firmware.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_image_path: Option<PathBuf>,
    /// An initrd for the kernel.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initrd_path: Option<PathBuf>,
    /// The command line of the firmware, or of the kernel (empty: the
    /// default kernel command line).
    #[serde(default)]
    pub boot_args: String,
}

impl BootSource {
    /// Checks every field without touching the files: they are opened and
    /// checked (a regular file, its size, the image's magic) by the `files`
    /// thread when the section is put, and read through those descriptors
    /// at start.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if let Some(kernel) = &self.kernel_image_path {
            check_path("boot-source.kernel_image_path", kernel)?;
        }
        if let Some(initrd) = &self.initrd_path {
            check_path("boot-source.initrd_path", initrd)?;
            if self.kernel_image_path.is_none() {
                return Err(invalid(
                    "boot-source.initrd_path",
                    "an initrd needs a kernel_image_path (the built-in firmware takes none)",
                ));
            }
        }
        if self.boot_args.len() > MAX_BOOT_ARGS_LEN {
            return Err(invalid(
                "boot-source.boot_args",
                format!("longer than {MAX_BOOT_ARGS_LEN} bytes"),
            ));
        }
        if let Some(c) = self
            .boot_args
            .chars()
            .find(|c| !(c.is_ascii_graphic() || *c == ' '))
        {
            return Err(invalid(
                "boot-source.boot_args",
                format!("contains {c:?}; only printable ASCII and spaces are allowed"),
            ));
        }
        Ok(())
    }
}
