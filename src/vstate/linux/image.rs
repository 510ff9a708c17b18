//! The kernel and initrd files: what kind of image a file is (ELF `vmlinux`
//! or bzImage, from its first bytes), how the `files` thread opens and
//! checks them when the configuration is given (a regular file, its size,
//! the magic and bzImage header),
//! and the bzImage setup header parsed from raw bytes.

use std::path::Path;

use crate::files::{OpenRequest, OpenSpec};

/// Largest kernel image accepted (an uncompressed `vmlinux` with debug info
/// can reach a few hundred MiB; a stock one is ~50 MiB).
pub const MAX_KERNEL_BYTES: u64 = 512 << 20;
/// Largest initrd accepted.
pub const MAX_INITRD_BYTES: u64 = 1 << 30;

/// Offset of the bzImage setup header in the image.
const SETUP_HEADER_OFFSET: usize = 0x1f1;
/// Bytes read to recognise an image (the bzImage header ends before 0x270).
pub const PROBE_BYTES: usize = 0x270;
/// `HdrS`, at 0x202.
const HDRS_MAGIC: u32 = 0x5372_6448;
const ELF_MAGIC: [u8; 4] = *b"\x7fELF";
/// `loadflags` bit: the protected-mode code is loaded at 0x100000.
const LOADED_HIGH: u8 = 1;
/// `xloadflags` bit: the kernel has the 64-bit entry at `code32_start + 0x200`.
pub const XLF_KERNEL_64: u16 = 1;
/// Oldest boot protocol with the fields teravm fills (cmdline_size,
/// xloadflags, 64-bit entry): 2.12.
pub const MIN_BOOT_PROTOCOL: u16 = 0x020c;

/// Errors of the kernel and initrd files.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ImageError {
    /// The file could not be opened or read.
    #[error("cannot read {path}: {reason}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        reason: String,
    },
    /// Not a regular file.
    #[error("{path} is not a regular file")]
    NotAFile {
        /// The file.
        path: String,
    },
    /// Empty or larger than the cap.
    #[error("{path} is {bytes} bytes; it must be 1..={max} bytes")]
    Size {
        /// The file.
        path: String,
        /// Its size.
        bytes: u64,
        /// The cap.
        max: u64,
    },
    /// Neither an ELF file nor a bzImage.
    #[error("{path} is neither an ELF vmlinux nor a bzImage (no ELF magic, no HdrS header)")]
    UnknownFormat {
        /// The file.
        path: String,
    },
    /// An ELF file teravm cannot boot.
    #[error("{path} is an ELF file but not a 64-bit little-endian x86-64 executable")]
    BadElf {
        /// The file.
        path: String,
    },
    /// A bzImage teravm cannot boot.
    #[error("{path}: {reason}")]
    BadBzImage {
        /// The file.
        path: String,
        /// What is wrong with its header.
        reason: String,
    },
}

/// The kind of kernel image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelFormat {
    /// An uncompressed ELF `vmlinux`.
    Elf,
    /// A bzImage (`vmlinuz`), entered through its 64-bit entry point.
    BzImage,
}

/// The fields of a bzImage setup header that teravm checks and uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BzImageHeader {
    /// 512-byte sectors of real-mode setup code (0 means 4).
    pub setup_sects: u8,
    /// Boot protocol version (e.g. 0x020f for 2.15).
    pub version: u16,
    /// `loadflags`.
    pub loadflags: u8,
    /// Highest address the initrd may end at.
    pub initrd_addr_max: u32,
    /// Alignment the kernel must be loaded at.
    pub kernel_alignment: u32,
    /// `xloadflags`.
    pub xloadflags: u16,
    /// Longest command line the kernel takes (without the NUL).
    pub cmdline_size: u32,
    /// Compressed payload offset, from the protected-mode code.
    pub payload_offset: u32,
    /// Compressed payload length.
    pub payload_length: u32,
    /// Memory the kernel needs from its load address while decompressing.
    pub init_size: u32,
}

fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

impl BzImageHeader {
    /// Parses and checks the header from an image's first bytes; `Err` says
    /// what is wrong, `Ok(None)` means no `HdrS` magic (not a bzImage).
    pub fn parse(image: &[u8]) -> Result<Option<BzImageHeader>, String> {
        if image.len() < 0x206 || le32(image, 0x202) != HDRS_MAGIC {
            return Ok(None);
        }
        if image.len() < PROBE_BYTES {
            return Err(format!(
                "the bzImage header is cut short ({} bytes)",
                image.len()
            ));
        }
        let h = BzImageHeader {
            setup_sects: image[SETUP_HEADER_OFFSET],
            version: le16(image, 0x206),
            loadflags: image[0x211],
            initrd_addr_max: le32(image, 0x22c),
            kernel_alignment: le32(image, 0x230),
            xloadflags: le16(image, 0x236),
            cmdline_size: le32(image, 0x238),
            payload_offset: le32(image, 0x248),
            payload_length: le32(image, 0x24c),
            init_size: le32(image, 0x260),
        };
        if h.version < MIN_BOOT_PROTOCOL {
            return Err(format!(
                "boot protocol {}.{:02} is too old; teravm needs 2.12 or later",
                h.version >> 8,
                h.version & 0xff
            ));
        }
        if h.loadflags & LOADED_HIGH == 0 {
            return Err("the kernel is not loaded high (a zImage, not a bzImage)".into());
        }
        if h.xloadflags & XLF_KERNEL_64 == 0 {
            return Err("the kernel has no 64-bit entry point (XLF_KERNEL_64 is clear)".into());
        }
        Ok(Some(h))
    }

    /// Bytes of real-mode setup before the protected-mode code.
    pub fn setup_bytes(&self) -> u64 {
        (u64::from(if self.setup_sects == 0 {
            4
        } else {
            self.setup_sects
        }) + 1)
            * 512
    }
}

/// Recognises a kernel image from its first bytes.
pub fn kernel_format(path: &Path, head: &[u8]) -> Result<KernelFormat, ImageError> {
    let name = path.display().to_string();
    if head.starts_with(&ELF_MAGIC) {
        // EI_CLASS 2 (64-bit), EI_DATA 1 (little endian), e_machine 62 (x86-64).
        let ok = head.len() >= 20 && head[4] == 2 && head[5] == 1 && le16(head, 18) == 62;
        return if ok {
            Ok(KernelFormat::Elf)
        } else {
            Err(ImageError::BadElf { path: name })
        };
    }
    match BzImageHeader::parse(head) {
        Ok(Some(_)) => Ok(KernelFormat::BzImage),
        Ok(None) => Err(ImageError::UnknownFormat { path: name }),
        Err(reason) => Err(ImageError::BadBzImage { path: name, reason }),
    }
}

/// How the `files` thread opens a kernel (`PUT /boot-source`, the config
/// file): a regular file of at most [`MAX_KERNEL_BYTES`] whose header is an
/// x86-64 ELF or a bzImage with a 64-bit entry point.
pub fn kernel_request(what: &'static str, path: &Path) -> OpenRequest {
    OpenRequest {
        what,
        path: path.to_path_buf(),
        spec: OpenSpec::ReadImage {
            max_bytes: MAX_KERNEL_BYTES,
            head_bytes: PROBE_BYTES,
            check: Some(|_, head| {
                kernel_format(Path::new("it"), head)
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            }),
        },
    }
}

/// How the `files` thread opens an initrd: a regular file of
/// 1..=[`MAX_INITRD_BYTES`] bytes.
pub fn initrd_request(what: &'static str, path: &Path) -> OpenRequest {
    OpenRequest {
        what,
        path: path.to_path_buf(),
        spec: OpenSpec::ReadImage {
            max_bytes: MAX_INITRD_BYTES,
            head_bytes: 0,
            check: None,
        },
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::fs::File;

    /// A minimal bzImage header (protocol 2.15, loaded high, 64-bit entry).
    pub(crate) fn bzimage_head() -> Vec<u8> {
        let mut b = vec![0u8; 0x1000];
        b[0x1f1] = 27;
        b[0x202..0x206].copy_from_slice(&HDRS_MAGIC.to_le_bytes());
        b[0x206..0x208].copy_from_slice(&0x020fu16.to_le_bytes());
        b[0x211] = LOADED_HIGH;
        b[0x214..0x218].copy_from_slice(&0x10_0000u32.to_le_bytes());
        b[0x22c..0x230].copy_from_slice(&0x7fff_ffffu32.to_le_bytes());
        b[0x230..0x234].copy_from_slice(&0x20_0000u32.to_le_bytes());
        b[0x236..0x238].copy_from_slice(&0x7fu16.to_le_bytes());
        b[0x238..0x23c].copy_from_slice(&2047u32.to_le_bytes());
        b[0x248..0x24c].copy_from_slice(&0x3b1u32.to_le_bytes());
        b[0x24c..0x250].copy_from_slice(&0xd6_0000u32.to_le_bytes());
        b[0x260..0x264].copy_from_slice(&0x300_0000u32.to_le_bytes());
        b
    }

    fn elf_head() -> Vec<u8> {
        let mut b = vec![0u8; 64];
        b[..4].copy_from_slice(&ELF_MAGIC);
        b[4] = 2;
        b[5] = 1;
        b[18] = 62;
        b
    }

    #[test]
    fn bzimage_header_fields() {
        let h = BzImageHeader::parse(&bzimage_head()).unwrap().unwrap();
        assert_eq!(h.setup_sects, 27);
        assert_eq!(h.setup_bytes(), 28 * 512);
        assert_eq!(h.version, 0x020f);
        assert_eq!(h.initrd_addr_max, 0x7fff_ffff);
        assert_eq!(h.kernel_alignment, 0x20_0000);
        assert_eq!(h.cmdline_size, 2047);
        assert_eq!(h.payload_offset, 0x3b1);
        assert_eq!(h.payload_length, 0xd6_0000);
        assert_eq!(h.init_size, 0x300_0000);
        let mut zero = bzimage_head();
        zero[0x1f1] = 0;
        assert_eq!(
            BzImageHeader::parse(&zero).unwrap().unwrap().setup_bytes(),
            5 * 512
        );
    }

    #[test]
    fn bad_bzimage_headers_say_why() {
        let mut old = bzimage_head();
        old[0x206..0x208].copy_from_slice(&0x0204u16.to_le_bytes());
        assert!(BzImageHeader::parse(&old).unwrap_err().contains("2.04"));
        let mut low = bzimage_head();
        low[0x211] = 0;
        assert!(BzImageHeader::parse(&low).unwrap_err().contains("zImage"));
        let mut no64 = bzimage_head();
        no64[0x236] = 0;
        assert!(BzImageHeader::parse(&no64)
            .unwrap_err()
            .contains("XLF_KERNEL_64"));
        assert!(BzImageHeader::parse(&bzimage_head()[..0x210])
            .unwrap_err()
            .contains("cut short"));
        assert_eq!(BzImageHeader::parse(&[0u8; 0x400]), Ok(None));
        assert_eq!(BzImageHeader::parse(&[]), Ok(None));
    }

    #[test]
    fn formats_from_magic() {
        let p = Path::new("k");
        assert_eq!(kernel_format(p, &elf_head()), Ok(KernelFormat::Elf));
        assert_eq!(kernel_format(p, &bzimage_head()), Ok(KernelFormat::BzImage));
        let mut elf32 = elf_head();
        elf32[4] = 1;
        assert!(matches!(
            kernel_format(p, &elf32),
            Err(ImageError::BadElf { .. })
        ));
        let mut arm = elf_head();
        arm[18] = 183;
        assert!(matches!(
            kernel_format(p, &arm),
            Err(ImageError::BadElf { .. })
        ));
        assert!(matches!(
            kernel_format(p, b"#!/bin/sh\n"),
            Err(ImageError::UnknownFormat { .. })
        ));
    }

    #[test]
    fn every_bad_file_is_an_error() {
        use crate::files::{open, FilesError};
        let dir = std::env::temp_dir().join(format!("teravm-image-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let kernel = |p: &Path| open(&kernel_request("kernel", p)).map(|o| o.len);
        let initrd = |p: &Path| open(&initrd_request("initrd", p)).map(|o| o.len);
        let reason = |r: Result<u64, FilesError>| match r {
            Err(FilesError::Refused { reason, .. }) => reason,
            other => panic!("{other:?}"),
        };
        let missing = dir.join("missing");
        assert!(reason(kernel(&missing)).contains("No such file"));
        assert!(reason(kernel(&dir)).contains("not a regular file"));
        let empty = dir.join("empty");
        std::fs::write(&empty, b"").unwrap();
        assert!(reason(kernel(&empty)).starts_with("0 bytes"));
        assert!(reason(initrd(&empty)).starts_with("0 bytes"));
        let text = dir.join("text");
        std::fs::write(&text, b"not a kernel at all").unwrap();
        assert!(reason(kernel(&text)).contains("neither an ELF vmlinux nor a bzImage"));
        assert_eq!(initrd(&text), Ok(19));
        let huge = dir.join("huge");
        let f = File::create(&huge).unwrap();
        f.set_len(MAX_KERNEL_BYTES + 1).unwrap();
        assert!(reason(kernel(&huge)).contains("it must be 1..="));
        let bz = dir.join("bz");
        std::fs::write(&bz, bzimage_head()).unwrap();
        assert_eq!(kernel(&bz), Ok(0x1000));
        let elf = dir.join("elf");
        std::fs::write(&elf, elf_head()).unwrap();
        assert_eq!(kernel(&elf), Ok(64));
        for e in [kernel(&missing).unwrap_err(), kernel(&huge).unwrap_err()] {
            assert!(!e.to_string().contains('\n'));
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
