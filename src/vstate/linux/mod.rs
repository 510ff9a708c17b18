//! Booting a Linux kernel instead of the built-in firmware: the kernel and
//! initrd files ([`image`]), the zero page and e820 map ([`params`]), the MP
//! table that lists the vCPUs ([`mptable`]), the ACPI tables that describe
//! the vCPUs, interrupts and guest NUMA nodes ([`acpi`]), CPUID with the vCPU topology
//! ([`cpuid`]), and each vCPU's CPL0 entry state ([`cpu`]).
//!
//! [`load`] writes everything into guest memory at start: the image through
//! rust-vmm's `linux-loader` (ELF `vmlinux` at its physical addresses, or a
//! bzImage at 1 MiB), the command line, the initrd, the zero page, the MP
//! table, the ACPI tables and the low tables. Linux takes the vCPUs from
//! the MADT; the MP table stays for `acpi=off`.
//!
//! The entry ([`BootProtocol`]): an ELF that carries a PVH note
//! (`XEN_ELFNOTE_PHYS32_ENTRY`) is entered there, as Firecracker and Cloud
//! Hypervisor do: 32-bit protected mode without paging, RBX = an
//! `hvm_start_info` ([`pvh`]) that gives the command line, the ACPI RSDP,
//! the e820 map and the initrd. A bzImage, or an ELF without the note, is
//! entered at its 64-bit entry with the zero page in RSI. Both run at CPL0,
//! which a PVM host emulates (slowly) in either mode.

pub mod acpi;
pub mod cpu;
pub mod cpuid;
pub mod image;
pub mod mptable;
pub mod params;
pub mod pvh;

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use linux_loader::loader::{BzImage, Elf, KernelLoader, PvhBootCapability};
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend};

use image::{
    kernel_format, BzImageHeader, ImageError, KernelFormat, MAX_INITRD_BYTES, PROBE_BYTES,
};
use params::{
    boot_params, check_cmdline, e820_map, initrd_addr, E820Entry, InitrdPlacement, ParamsError,
    CMDLINE_ADDR, HIMEM_START, ZERO_PAGE_ADDR,
};

/// Where a bzImage's decompressor puts the kernel (CONFIG_PHYSICAL_START).
const BZIMAGE_KERNEL_ADDR: u64 = 0x100_0000;
/// `initrd_addr_max` for an ELF kernel, which has no setup header: 2 GiB - 1.
const ELF_INITRD_ADDR_MAX: u32 = 0x7fff_ffff;
/// Offset of the 64-bit entry point from a bzImage's load address.
const BZIMAGE_ENTRY_64: u64 = 0x200;

/// Errors of loading a Linux kernel.
#[derive(Debug, thiserror::Error)]
pub enum LinuxError {
    /// The kernel or initrd file is unusable.
    #[error(transparent)]
    Image(#[from] ImageError),
    /// linux-loader refused the image.
    #[error("cannot load the kernel {path}: {source}")]
    Load {
        /// The image.
        path: PathBuf,
        /// linux-loader's error.
        source: linux_loader::loader::Error,
    },
    /// The zero page could not be made.
    #[error(transparent)]
    Params(#[from] ParamsError),
    /// The PVH start info could not be made.
    #[error(transparent)]
    Pvh(#[from] pvh::PvhError),
    /// The MP table could not be made.
    #[error(transparent)]
    Mptable(#[from] mptable::MptableError),
    /// The ACPI tables could not be made.
    #[error(transparent)]
    Acpi(#[from] acpi::AcpiError),
    /// A file could not be read into guest memory.
    #[error("cannot read {path} into guest memory: {reason}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// Writing into guest memory failed.
    #[error("cannot write {what} at guest address {addr:#x}: {source}")]
    GuestWrite {
        /// What was being written.
        what: &'static str,
        /// Where.
        addr: u64,
        /// vm-memory's error.
        source: vm_memory::GuestMemoryError,
    },
}

/// An image already opened (by the `files` thread, `crate::files`): the
/// start job reads it through its descriptor and opens nothing.
#[derive(Debug, Clone)]
pub struct ImageFile {
    /// The path it was opened by (for messages).
    pub path: PathBuf,
    /// The open file, shared by the starts that use it.
    pub file: Arc<File>,
}

impl ImageFile {
    /// Opens `path` read-only (tests and tools; teravm itself opens images
    /// on the `files` thread).
    pub fn open(path: &Path) -> Result<ImageFile, LinuxError> {
        let file = File::open(path).map_err(|e| LinuxError::Read {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        Ok(ImageFile {
            path: path.to_path_buf(),
            file: Arc::new(file),
        })
    }

    /// A descriptor of its own at offset 0 (a dup shares the offset, so
    /// every reader seeks first).
    fn reader(&self) -> Result<File, LinuxError> {
        let read_err = |e: std::io::Error| LinuxError::Read {
            path: self.path.clone(),
            reason: e.to_string(),
        };
        let mut f = self.file.try_clone().map_err(read_err)?;
        f.seek(SeekFrom::Start(0)).map_err(read_err)?;
        Ok(f)
    }

    /// Its size now.
    fn len(&self) -> Result<u64, LinuxError> {
        self.file
            .metadata()
            .map(|m| m.len())
            .map_err(|e| LinuxError::Read {
                path: self.path.clone(),
                reason: e.to_string(),
            })
    }
}

/// What to boot.
#[derive(Debug, Clone)]
pub struct KernelSpec {
    /// The ELF vmlinux or bzImage.
    pub kernel: ImageFile,
    /// An initrd, if any.
    pub initrd: Option<ImageFile>,
    /// The command line (already defaulted, see [`params::kernel_cmdline`]).
    pub cmdline: String,
}

/// How vCPU 0 enters the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BootProtocol {
    /// Linux's 64-bit boot protocol: long mode, the first GiB
    /// identity-mapped, RSI = the zero page.
    Linux64,
    /// The PVH entry: 32-bit protected mode, paging off, RBX = the
    /// `hvm_start_info` at [`pvh::START_INFO_ADDR`].
    Pvh,
}

impl std::fmt::Display for BootProtocol {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            BootProtocol::Linux64 => "the Linux 64-bit boot protocol",
            BootProtocol::Pvh => "the PVH entry",
        })
    }
}

/// Where the kernel is entered, for the vCPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinuxEntry {
    /// The entry point: the 64-bit one, or the PVH one (a 32-bit physical
    /// address) for [`BootProtocol::Pvh`].
    pub entry: u64,
    /// How it is entered.
    pub protocol: BootProtocol,
    /// Number of vCPUs (for the CPUID topology).
    pub vcpus: u8,
    /// The image's format.
    pub format: KernelFormat,
}

/// Loads the kernel (and initrd) into `mem` and writes the zero page, the
/// command line, the MP table, the ACPI tables and the low tables. `slices`
/// are the guest RAM slices `(guest_addr, len, host_node)`, sorted; the
/// e820 map and the guest NUMA nodes ([`acpi::guest_nodes`]) are built
/// from them, with the host's distances between the nodes; the hotplug
/// region's `hotplug` parts (same shape) join their nodes in the SRAT only
/// (virtio-mem memory is in no e820 entry: the driver adds it).
pub fn load<M: GuestMemoryBackend>(
    mem: &M,
    spec: &KernelSpec,
    slices: &[(u64, u64, u32)],
    hotplug: &[(u64, u64, u32)],
    vcpus: u8,
) -> Result<(LinuxEntry, Vec<E820Entry>), LinuxError> {
    let ranges: Vec<(u64, u64)> = slices.iter().map(|&(a, l, _)| (a, l)).collect();
    let map = e820_map(&ranges)?;
    let mut nodes = acpi::guest_nodes(slices);
    acpi::add_hotplug(&mut nodes, hotplug);
    let acpi_tables = acpi::tables(
        usize::from(vcpus),
        &nodes,
        &acpi::distances(&nodes, acpi::host_distance),
    )?;
    let kernel = &spec.kernel;
    let read_err = |e: std::io::Error| LinuxError::Read {
        path: kernel.path.clone(),
        reason: e.to_string(),
    };
    let mut head = vec![0u8; PROBE_BYTES.min(kernel.len()? as usize)];
    kernel.reader()?.read_exact(&mut head).map_err(read_err)?;
    let format = kernel_format(&kernel.path, &head)?;
    let mut file = kernel.reader()?;
    let load_err = |source| LinuxError::Load {
        path: kernel.path.clone(),
        source,
    };
    let (entry, protocol, kernel_end, header, initrd_max, cmdline_max) = match format {
        KernelFormat::Elf => {
            let r = Elf::load(mem, None, &mut file, Some(GuestAddress(HIMEM_START)))
                .map_err(load_err)?;
            let (entry, protocol) = match r.pvh_boot_cap {
                PvhBootCapability::PvhEntryPresent(pvh) => {
                    log::info!(
                            "kernel has a PVH entry at {:#x}: entering there (its 64-bit entry is {:#x})",
                            pvh.0,
                            r.kernel_load.0
                        );
                    (pvh.0, BootProtocol::Pvh)
                }
                _ => {
                    log::info!(
                        "kernel has no PVH note: entering at its 64-bit entry {:#x}",
                        r.kernel_load.0
                    );
                    (r.kernel_load.0, BootProtocol::Linux64)
                }
            };
            (entry, protocol, r.kernel_end, None, ELF_INITRD_ADDR_MAX, 0)
        }
        KernelFormat::BzImage => {
            let r = BzImage::load(mem, None, &mut file, Some(GuestAddress(HIMEM_START)))
                .map_err(load_err)?;
            let h =
                BzImageHeader::parse(&head)
                    .ok()
                    .flatten()
                    .ok_or(ImageError::UnknownFormat {
                        path: kernel.path.display().to_string(),
                    })?;
            // The decompressor needs init_size bytes from where it puts the kernel.
            let end = r
                .kernel_end
                .max(BZIMAGE_KERNEL_ADDR + u64::from(h.init_size));
            (
                r.kernel_load.0 + BZIMAGE_ENTRY_64,
                BootProtocol::Linux64,
                end,
                r.setup_header,
                h.initrd_addr_max,
                h.cmdline_size,
            )
        }
    };
    check_cmdline(&spec.cmdline, cmdline_max)?;
    let write = |what: &'static str, addr: u64, bytes: &[u8]| {
        mem.write_slice(bytes, GuestAddress(addr))
            .map_err(|source| LinuxError::GuestWrite { what, addr, source })
    };
    let mut line = spec.cmdline.as_bytes().to_vec();
    line.push(0);
    write("the command line", CMDLINE_ADDR, &line)?;

    let initrd = match &spec.initrd {
        None => None,
        Some(image) => {
            let size = image.len()?;
            if size == 0 || size > MAX_INITRD_BYTES {
                return Err(ImageError::Size {
                    path: image.path.display().to_string(),
                    bytes: size,
                    max: MAX_INITRD_BYTES,
                }
                .into());
            }
            let addr = initrd_addr(&map, kernel_end, initrd_max, size)?;
            let mut f = image.reader()?;
            mem.read_exact_volatile_from(GuestAddress(addr), &mut f, size as usize)
                .map_err(|e| LinuxError::Read {
                    path: image.path.clone(),
                    reason: e.to_string(),
                })?;
            Some(InitrdPlacement { addr, size })
        }
    };
    match protocol {
        BootProtocol::Linux64 => {
            let mut zero_page = boot_params(header, spec.cmdline.len(), initrd, &map)?;
            zero_page.acpi_rsdp_addr = acpi::RSDP_ADDR;
            mem.write_obj(zero_page, GuestAddress(ZERO_PAGE_ADDR))
                .map_err(|source| LinuxError::GuestWrite {
                    what: "the zero page",
                    addr: ZERO_PAGE_ADDR,
                    source,
                })?;
        }
        BootProtocol::Pvh => {
            for (addr, bytes) in pvh::start_info(&map, initrd)? {
                write("the PVH start info", addr, &bytes)?;
            }
        }
    }
    write(
        "the MP table",
        mptable::MPTABLE_ADDR,
        &mptable::mptable(usize::from(vcpus))?,
    )?;
    write("the ACPI tables", acpi::RSDP_ADDR, &acpi_tables)?;
    for (addr, bytes) in cpu::tables(protocol) {
        write("the boot tables", addr, &bytes)?;
    }
    Ok((
        LinuxEntry {
            entry,
            protocol,
            vcpus,
            format,
        },
        map,
    ))
}

#[cfg(test)]
#[path = "load_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "pvh_tests.rs"]
mod pvh_tests;
