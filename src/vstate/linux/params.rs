//! The zero page (`boot_params`) a Linux kernel reads at entry: the e820
//! map built from teravm's guest map (RAM = the node slices, the low BIOS
//! area, the MP table and the MMIO gap reserved), the command line, and the
//! initrd placed within the kernel's limits. Pure functions over values.

use linux_loader::loader::bootparam::{boot_e820_entry, boot_params, setup_header};

use crate::memory::layout::{MMIO_GAP_END, MMIO_GAP_START};

/// Guest address of the zero page.
pub const ZERO_PAGE_ADDR: u64 = 0x7000;
/// Guest address of the kernel command line.
pub const CMDLINE_ADDR: u64 = 0x2_0000;
/// Room for the command line, NUL included.
pub const CMDLINE_MAX: usize = 0x1_0000;
/// End of the RAM below the EBDA that the kernel may use (639 KiB).
pub const EBDA_START: u64 = 0x9_fc00;
/// Start of the "high" memory where kernels are loaded (1 MiB).
pub const HIMEM_START: u64 = 0x10_0000;
/// Most e820 entries the zero page holds.
pub const E820_MAX: usize = 128;

/// e820 type: usable RAM.
pub const E820_RAM: u32 = 1;
/// e820 type: reserved.
pub const E820_RESERVED: u32 = 2;

const PAGE: u64 = 4096;
/// `type_of_loader`: undefined boot loader.
const LOADER_UNDEFINED: u8 = 0xff;
const KERNEL_BOOT_FLAG_MAGIC: u16 = 0xaa55;
const KERNEL_HDR_MAGIC: u32 = 0x5372_6448;
const KERNEL_MIN_ALIGNMENT: u32 = 0x0100_0000;

/// Firecracker's default kernel command line, adapted to teravm: the console
/// on ttyS0 (teravm has COM1 and no other console), and no
/// `8250.nr_uarts=0` (that would remove it).
pub const DEFAULT_KERNEL_CMDLINE: &str = "console=ttyS0 reboot=k panic=1 pci=off nomodule \
     i8042.noaux i8042.nomux i8042.nopnp i8042.dumbkbd";

/// Errors of the zero page.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ParamsError {
    /// The command line cannot carry the device parameters.
    #[error("kernel command line: {0}")]
    BadCmdline(String),
    /// The slices are empty, unsorted, overlapping, or cross the MMIO gap.
    #[error("the guest RAM slices are not a valid map: {0}")]
    BadSlices(String),
    /// The first slice does not cover the kernel's low memory.
    #[error("guest RAM must start at 0 and reach past {0:#x}")]
    NoLowMemory(u64),
    /// Too many entries for the zero page.
    #[error("the e820 map has {0} entries; the zero page holds {E820_MAX}")]
    TooManyEntries(usize),
    /// The command line is too long for the kernel or teravm's area.
    #[error("the command line is {len} bytes; this kernel takes at most {max}")]
    CmdlineTooLong {
        /// Bytes without the NUL.
        len: usize,
        /// Most bytes allowed.
        max: usize,
    },
    /// The initrd does not fit below the kernel's limit.
    #[error("the initrd ({size} bytes) does not fit in RAM between {low:#x} and {high:#x} (the kernel's initrd_addr_max and the first RAM region)")]
    InitrdDoesNotFit {
        /// Its size.
        size: u64,
        /// The lowest address it may take (end of the kernel).
        low: u64,
        /// The highest address it may end at.
        high: u64,
    },
}

/// One e820 entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct E820Entry {
    /// First address.
    pub addr: u64,
    /// Bytes.
    pub size: u64,
    /// [`E820_RAM`] or [`E820_RESERVED`].
    pub kind: u32,
}

impl E820Entry {
    fn ram(addr: u64, end: u64) -> Self {
        E820Entry {
            addr,
            size: end - addr,
            kind: E820_RAM,
        }
    }

    /// The line Linux prints for it at boot (`BIOS-e820: [mem A-B] usable`).
    pub fn linux_line(&self) -> String {
        let kind = if self.kind == E820_RAM {
            "usable"
        } else {
            "reserved"
        };
        format!(
            "BIOS-e820: [mem {:#018x}-{:#018x}] {kind}",
            self.addr,
            self.addr + self.size - 1
        )
    }
}

/// The e820 map of a guest whose RAM is `slices` (`(guest_addr, len)`, one
/// per node slice, sorted, none crossing the MMIO gap): each slice is one
/// RAM entry, except that the first loses the EBDA and BIOS area
/// `[0x9fc00, 1 MiB)` (where the MP table lives), which is reserved; the
/// MMIO gap is reserved. Adjacent slices stay separate entries, so the map
/// shows the node boundaries (Linux merges them when it sanitises the map).
pub fn e820_map(slices: &[(u64, u64)]) -> Result<Vec<E820Entry>, ParamsError> {
    let Some(&(first_addr, first_len)) = slices.first() else {
        return Err(ParamsError::BadSlices("no RAM".into()));
    };
    if first_addr != 0 || first_len <= HIMEM_START {
        return Err(ParamsError::NoLowMemory(HIMEM_START));
    }
    let mut prev_end = 0;
    for (i, &(addr, len)) in slices.iter().enumerate() {
        let end = addr
            .checked_add(len)
            .ok_or_else(|| ParamsError::BadSlices(format!("slice {i} overflows")))?;
        if len == 0 || (i > 0 && addr < prev_end) {
            return Err(ParamsError::BadSlices(format!(
                "slice {i} at {addr:#x} is empty or overlaps the one before"
            )));
        }
        if addr < MMIO_GAP_END && end > MMIO_GAP_START {
            return Err(ParamsError::BadSlices(format!(
                "slice {i} [{addr:#x}, {end:#x}) enters the MMIO gap"
            )));
        }
        prev_end = end;
    }
    let mut map = vec![
        E820Entry::ram(0, EBDA_START),
        E820Entry {
            addr: EBDA_START,
            size: HIMEM_START - EBDA_START,
            kind: E820_RESERVED,
        },
        E820Entry::ram(HIMEM_START, first_len),
    ];
    let mut gap_done = false;
    for &(addr, len) in &slices[1..] {
        if !gap_done && addr >= MMIO_GAP_END {
            map.push(gap_entry());
            gap_done = true;
        }
        map.push(E820Entry::ram(addr, addr + len));
    }
    if !gap_done {
        map.push(gap_entry());
    }
    if map.len() > E820_MAX {
        return Err(ParamsError::TooManyEntries(map.len()));
    }
    Ok(map)
}

fn gap_entry() -> E820Entry {
    E820Entry {
        addr: MMIO_GAP_START,
        size: MMIO_GAP_END - MMIO_GAP_START,
        kind: E820_RESERVED,
    }
}

/// The command line a kernel gets: `boot_args`, or
/// [`DEFAULT_KERNEL_CMDLINE`] when they are empty.
pub fn kernel_cmdline(boot_args: &str) -> &str {
    if boot_args.trim().is_empty() {
        DEFAULT_KERNEL_CMDLINE
    } else {
        boot_args
    }
}

/// `cmdline` with `params` appended (the virtio-mmio devices'
/// `virtio_mmio.device=4K@<addr>:<irq>`), built with linux-loader's
/// `Cmdline`, which refuses what a kernel would misread (anything but
/// printable ASCII) and a line past teravm's area.
pub fn with_params(cmdline: &str, params: &[String]) -> Result<String, ParamsError> {
    use linux_loader::cmdline::Cmdline;
    let bad = |e: linux_loader::cmdline::Error| ParamsError::BadCmdline(e.to_string());
    let mut line = Cmdline::new(CMDLINE_MAX).map_err(bad)?;
    line.insert_str(cmdline).map_err(bad)?;
    for p in params {
        line.insert_str(p).map_err(bad)?;
    }
    line.as_cstring()
        .map_err(bad)?
        .into_string()
        .map_err(|e| ParamsError::BadCmdline(e.to_string()))
}

/// Checks the command line against the kernel's `cmdline_size` (0: the
/// x86 default of 2047) and teravm's area.
pub fn check_cmdline(cmdline: &str, kernel_max: u32) -> Result<(), ParamsError> {
    let max = match kernel_max {
        0 => 2047,
        n => n as usize,
    }
    .min(CMDLINE_MAX - 1);
    if cmdline.len() > max {
        return Err(ParamsError::CmdlineTooLong {
            len: cmdline.len(),
            max,
        });
    }
    Ok(())
}

/// Where an initrd of `size` bytes goes: as high as possible, page aligned,
/// ending at or below `initrd_addr_max + 1` and the end of the first RAM
/// entry below 4 GiB that holds it, and above `kernel_end`.
pub fn initrd_addr(
    map: &[E820Entry],
    kernel_end: u64,
    initrd_addr_max: u32,
    size: u64,
) -> Result<u64, ParamsError> {
    let limit = u64::from(initrd_addr_max) + 1;
    let low = kernel_end.next_multiple_of(PAGE);
    let mut best = None;
    for e in map.iter().filter(|e| e.kind == E820_RAM) {
        let top = (e.addr + e.size).min(limit);
        let bottom = e.addr.max(low);
        if top < size || top - size < bottom {
            continue;
        }
        let addr = (top - size) & !(PAGE - 1);
        if addr >= bottom {
            best = best.max(Some(addr));
        }
    }
    best.ok_or(ParamsError::InitrdDoesNotFit {
        size,
        low,
        high: limit,
    })
}

/// Where the initrd is and how big.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InitrdPlacement {
    /// Guest address.
    pub addr: u64,
    /// Bytes.
    pub size: u64,
}

/// Fills the zero page: the image's own setup header when it has one
/// (bzImage), the loader fields, the command line, the initrd and the e820
/// map.
pub fn boot_params(
    image_header: Option<setup_header>,
    cmdline_len: usize,
    initrd: Option<InitrdPlacement>,
    map: &[E820Entry],
) -> Result<boot_params, ParamsError> {
    if map.len() > E820_MAX {
        return Err(ParamsError::TooManyEntries(map.len()));
    }
    let mut params = boot_params::default();
    if let Some(hdr) = image_header {
        params.hdr = hdr;
    }
    params.hdr.type_of_loader = LOADER_UNDEFINED;
    params.hdr.boot_flag = KERNEL_BOOT_FLAG_MAGIC;
    params.hdr.header = KERNEL_HDR_MAGIC;
    params.hdr.cmd_line_ptr = CMDLINE_ADDR as u32;
    params.hdr.cmdline_size = cmdline_len as u32 + 1;
    if image_header.is_none() {
        params.hdr.kernel_alignment = KERNEL_MIN_ALIGNMENT;
    }
    if let Some(i) = initrd {
        params.hdr.ramdisk_image = i.addr as u32;
        params.hdr.ramdisk_size = i.size as u32;
        params.ext_ramdisk_image = (i.addr >> 32) as u32;
        params.ext_ramdisk_size = (i.size >> 32) as u32;
    }
    for (slot, e) in params.e820_table.iter_mut().zip(map) {
        *slot = boot_e820_entry {
            addr: e.addr,
            size: e.size,
            r#type: e.kind,
        };
    }
    params.e820_entries = map.len() as u8;
    Ok(params)
}

#[cfg(test)]
mod cmdline_tests {
    use super::*;

    #[test]
    fn device_params_follow_the_boot_args() {
        let p = vec!["virtio_mmio.device=4K@0xc0001000:5".to_string()];
        assert_eq!(
            with_params("console=ttyS0 reboot=k", &p).unwrap(),
            "console=ttyS0 reboot=k virtio_mmio.device=4K@0xc0001000:5"
        );
        assert_eq!(with_params("quiet", &[]).unwrap(), "quiet");
        // A control character or a non-ASCII one is refused.
        assert!(with_params("a", &["b\u{1}c".to_string()]).is_err());
        assert!(with_params("caf\u{e9}", &[]).is_err());
    }
}

#[cfg(test)]
#[path = "params_tests.rs"]
mod tests;
