//! The PVH boot protocol's start info (Xen's `hvm_start_info`, version 1,
//! `xen/include/public/arch-x86/hvm/start_info.h`), which a kernel entered
//! at its `XEN_ELFNOTE_PHYS32_ENTRY` finds through RBX: the command line,
//! the ACPI RSDP, the memory map and the modules (the initrd). Pure
//! functions over values; [`super::load`] writes what they return, and
//! [`super::cpu`] sets the registers of the entry.
//!
//! Where it lies: below the zero page's address (which a PVH boot leaves
//! unused), as Firecracker puts it (`PVH_INFO_START` 0x6000, the module
//! list at 0x6040); the memory map follows at 0x6080 rather than at
//! Firecracker's 0x7000, so the Linux protocol's zero page and the PVH
//! tables never share an address.

use linux_loader::loader::elf::start_info::{
    hvm_memmap_table_entry, hvm_modlist_entry, hvm_start_info, XEN_HVM_START_MAGIC_VALUE,
};
use vm_memory::ByteValued;

use super::acpi::RSDP_ADDR;
use super::params::{E820Entry, InitrdPlacement, CMDLINE_ADDR, E820_MAX};

/// Guest address of the `hvm_start_info` (RBX at the entry).
pub const START_INFO_ADDR: u64 = 0x6000;
/// Guest address of the module list (one entry: the initrd).
pub const MODLIST_ADDR: u64 = 0x6040;
/// Guest address of the memory map.
pub const MEMMAP_ADDR: u64 = 0x6080;
/// Bytes the memory map may take: [`E820_MAX`] entries.
pub const MEMMAP_MAX: usize = E820_MAX * std::mem::size_of::<hvm_memmap_table_entry>();
/// The start info's version: 1 has `rsdp_paddr` and the memory map.
pub const START_INFO_VERSION: u32 = 1;

/// Errors of the PVH start info.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PvhError {
    /// The memory map does not fit its area.
    #[error("the memory map has {0} entries; the PVH start info holds {E820_MAX}")]
    TooManyEntries(usize),
}

/// The start info for a guest with memory map `map` (the zero page's e820
/// map, entry for entry: PVH memory map types are e820's) and `initrd` as
/// module 0, as `(guest address, bytes)`: the `hvm_start_info`, the memory
/// map, and the module list when there is an initrd.
pub fn start_info(
    map: &[E820Entry],
    initrd: Option<InitrdPlacement>,
) -> Result<Vec<(u64, Vec<u8>)>, PvhError> {
    if map.len() > E820_MAX {
        return Err(PvhError::TooManyEntries(map.len()));
    }
    let memmap: Vec<u8> = map
        .iter()
        .flat_map(|e| {
            hvm_memmap_table_entry {
                addr: e.addr,
                size: e.size,
                type_: e.kind,
                reserved: 0,
            }
            .as_slice()
            .to_vec()
        })
        .collect();
    let mut info = hvm_start_info {
        magic: XEN_HVM_START_MAGIC_VALUE,
        version: START_INFO_VERSION,
        cmdline_paddr: CMDLINE_ADDR,
        rsdp_paddr: RSDP_ADDR,
        memmap_paddr: MEMMAP_ADDR,
        memmap_entries: map.len() as u32,
        ..Default::default()
    };
    let mut out = Vec::with_capacity(3);
    if let Some(i) = initrd {
        info.nr_modules = 1;
        info.modlist_paddr = MODLIST_ADDR;
        let module = hvm_modlist_entry {
            paddr: i.addr,
            size: i.size,
            ..Default::default()
        };
        out.push((MODLIST_ADDR, module.as_slice().to_vec()));
    }
    out.push((START_INFO_ADDR, info.as_slice().to_vec()));
    out.push((MEMMAP_ADDR, memmap));
    Ok(out)
}
