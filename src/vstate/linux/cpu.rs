//! Each vCPU's state at a Linux kernel's entry, at CPL0 as the boot
//! protocol ([`BootProtocol`]) wants. The 64-bit entry: the GDT (flat
//! 64-bit code, data, TSS), an empty IDT, identity page tables for the
//! first GiB (2 MiB pages), CR0/CR3/CR4/EFER, RSI = the zero page. The PVH
//! entry (as Firecracker sets it): a GDT of flat 32-bit code and data and a
//! busy 32-bit TSS, an empty IDT, protected mode without paging (CR0 =
//! PE|ET, CR4 = EFER = 0), RBX = the `hvm_start_info`. Both: the boot MSRs
//! Firecracker sets, the FPU, CPUID with the topology, and the LAPIC's
//! LINT0 (ExtINT) and LINT1 (NMI).
//!
//! Every vCPU gets the entry state, but only vCPU 0 (the BSP) runs it: with
//! the in-kernel irqchip KVM creates the others waiting for INIT/SIPI
//! (`KVM_MP_STATE_UNINITIALIZED`), and Linux starts them itself through the
//! in-kernel LAPIC once the MADT has told it they exist; the SIPI gives
//! them its own real-mode state.

use kvm_bindings::{kvm_fpu, kvm_lapic_state, kvm_regs, kvm_segment, kvm_sregs, CpuId, Msrs};
use kvm_ioctls::VcpuFd;

use super::params::ZERO_PAGE_ADDR;
use super::pvh::START_INFO_ADDR;
use super::{BootProtocol, LinuxEntry};
use crate::vstate::boot::{
    flat_segment, set_segments, CR0_ET, CR0_PE, CR0_PG, CR4_PAE, EFER_LMA, EFER_LME,
};
use crate::vstate::template::CpuSetup;

/// Guest address of the GDT.
pub const GDT_ADDR: u64 = 0x500;
/// Guest address of the (empty) IDT.
pub const IDT_ADDR: u64 = 0x520;
/// Top of the boot stack.
pub const BOOT_STACK: u64 = 0x8ff0;
/// The PML4; the PDPT and one page directory follow.
pub const PML4_ADDR: u64 = 0x9000;
const PDPT_ADDR: u64 = 0xa000;
const PD_ADDR: u64 = 0xb000;

/// null; 64-bit code (0x08); data (0x10); TSS (0x18).
pub const GDT: [u64; 4] = [
    0,
    0x00af_9b00_0000_ffff,
    0x00cf_9300_0000_ffff,
    0x008f_8b00_0000_ffff,
];
/// The PVH entry's GDT (Firecracker's): null; flat 32-bit code (0x08,
/// base 0, limit 4 GiB, DPL 0); flat 32-bit data (0x10); a busy 32-bit TSS
/// (0x18, base 0, limit 0x67).
pub const PVH_GDT: [u64; 4] = [
    0,
    0x00cf_9b00_0000_ffff,
    0x00cf_9300_0000_ffff,
    0x0000_8b00_0000_0067,
];
/// The PVH TSS's limit (a 32-bit TSS is 104 bytes).
const PVH_TSS_LIMIT: u32 = 0x67;
const CODE_SELECTOR: u16 = 0x08;
const DATA_SELECTOR: u16 = 0x10;
const TSS_SELECTOR: u16 = 0x18;

const PTE_TABLE: u64 = 0x3; // present, writable
const PTE_2M: u64 = 0x83; // present, writable, 2 MiB

pub use crate::vstate::msrs::boot_msrs;

const APIC_LVT0: usize = 0x350;
const APIC_LVT1: usize = 0x360;
const APIC_MODE_NMI: u32 = 0x4;
const APIC_MODE_EXTINT: u32 = 0x7;

/// Errors of vCPU setup for Linux.
#[derive(Debug, thiserror::Error)]
pub enum CpuError {
    /// An ioctl failed.
    #[error("vCPU {index}: {what} failed: {source}")]
    Ioctl {
        /// vCPU index.
        index: u8,
        /// Which ioctl.
        what: &'static str,
        /// KVM's error.
        source: kvm_ioctls::Error,
    },
    /// KVM took fewer MSRs than given.
    #[error("vCPU {index}: KVM_SET_MSRS set {set} of {wanted} MSRs")]
    Msrs {
        /// vCPU index.
        index: u8,
        /// How many it set.
        set: usize,
        /// How many were given.
        wanted: usize,
    },
    /// The MSR list could not be built.
    #[error("cannot build the MSR list: {0}")]
    MsrList(String),
    /// The CPUID list could not be built.
    #[error("cannot build the CPUID list: {0}")]
    CpuidList(String),
}

/// The low tables every vCPU shares, as `(guest address, bytes)`: GDT, IDT
/// and, for the 64-bit entry, the identity page tables of the first GiB
/// (the PVH entry runs without paging).
pub fn tables(protocol: BootProtocol) -> Vec<(u64, Vec<u8>)> {
    let gdt_of = |gdt: &[u64]| gdt.iter().flat_map(|e| e.to_le_bytes()).collect();
    if protocol == BootProtocol::Pvh {
        return vec![(GDT_ADDR, gdt_of(&PVH_GDT)), (IDT_ADDR, vec![0; 8])];
    }
    let gdt = gdt_of(&GDT);
    let pml4 = (PDPT_ADDR | PTE_TABLE).to_le_bytes().to_vec();
    let pdpt = (PD_ADDR | PTE_TABLE).to_le_bytes().to_vec();
    let pd = (0..512u64)
        .flat_map(|i| ((i << 21) | PTE_2M).to_le_bytes())
        .collect();
    vec![
        (GDT_ADDR, gdt),
        (IDT_ADDR, vec![0; 8]),
        (PML4_ADDR, pml4),
        (PDPT_ADDR, pdpt),
        (PD_ADDR, pd),
    ]
}

fn segment(selector: u16, type_: u8, long: bool) -> kvm_segment {
    flat_segment(selector, type_, 0, long, 0xf_ffff)
}

/// The entry's segments, tables and control registers in `sregs` (read
/// from the vCPU, so the fields this does not own keep KVM's values).
pub fn setup_sregs(sregs: &mut kvm_sregs, protocol: BootProtocol) {
    match protocol {
        BootProtocol::Linux64 => setup_sregs_64(sregs),
        BootProtocol::Pvh => setup_sregs_pvh(sregs),
    }
}

/// Protected mode, paging off, flat 32-bit CPL0 segments that match
/// [`PVH_GDT`] (limits in bytes, as KVM wants them: 4 GiB - 1).
fn setup_sregs_pvh(sregs: &mut kvm_sregs) {
    set_segments(
        sregs,
        flat_segment(CODE_SELECTOR, 0xb, 0, false, 0xffff_ffff),
        flat_segment(DATA_SELECTOR, 0x3, 0, false, 0xffff_ffff),
        (TSS_SELECTOR, PVH_TSS_LIMIT, 0),
    );
    sregs.gdt.base = GDT_ADDR;
    sregs.gdt.limit = (PVH_GDT.len() * 8 - 1) as u16;
    sregs.idt.base = IDT_ADDR;
    sregs.idt.limit = 7;
    sregs.cr0 = CR0_PE | CR0_ET;
    sregs.cr3 = 0;
    sregs.cr4 = 0;
    sregs.efer = 0;
}

/// Long mode, paging and CPL0 flat segments.
fn setup_sregs_64(sregs: &mut kvm_sregs) {
    set_segments(
        sregs,
        segment(CODE_SELECTOR, 0xb, true),
        segment(DATA_SELECTOR, 0x3, false),
        (TSS_SELECTOR, 0xf_ffff, 1),
    );
    sregs.gdt.base = GDT_ADDR;
    sregs.gdt.limit = (GDT.len() * 8 - 1) as u16;
    sregs.idt.base = IDT_ADDR;
    sregs.idt.limit = 7;
    sregs.cr0 = CR0_PE | CR0_ET | CR0_PG;
    sregs.cr3 = PML4_ADDR;
    sregs.cr4 = CR4_PAE;
    sregs.efer = EFER_LME | EFER_LMA;
}

/// The general registers at `entry`: for the 64-bit entry the boot stack
/// and RSI = the zero page; for the PVH entry RBX = the `hvm_start_info`
/// and nothing else (no stack: the PVH ABI gives none).
pub fn entry_regs(entry: u64, protocol: BootProtocol) -> kvm_regs {
    match protocol {
        BootProtocol::Linux64 => kvm_regs {
            rip: entry,
            rsp: BOOT_STACK,
            rbp: BOOT_STACK,
            rsi: ZERO_PAGE_ADDR,
            rflags: 0x2,
            ..Default::default()
        },
        BootProtocol::Pvh => kvm_regs {
            rip: entry,
            rbx: START_INFO_ADDR,
            rflags: 0x2,
            ..Default::default()
        },
    }
}

fn lapic_reg(state: &kvm_lapic_state, at: usize) -> u32 {
    let b: Vec<u8> = state.regs[at..at + 4].iter().map(|&c| c as u8).collect();
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

fn set_lapic_reg(state: &mut kvm_lapic_state, at: usize, value: u32) {
    for (i, b) in value.to_le_bytes().into_iter().enumerate() {
        state.regs[at + i] = b as _;
    }
}

/// LINT0 delivers ExtINT (the PIC), LINT1 NMI, as a BIOS leaves them.
pub fn setup_lint(state: &mut kvm_lapic_state) {
    let lvt0 = lapic_reg(state, APIC_LVT0);
    set_lapic_reg(state, APIC_LVT0, (lvt0 & !0x700) | (APIC_MODE_EXTINT << 8));
    let lvt1 = lapic_reg(state, APIC_LVT1);
    set_lapic_reg(state, APIC_LVT1, (lvt1 & !0x700) | (APIC_MODE_NMI << 8));
}

/// Sets CPUID (`cpu`'s, with the topology of vCPU `index` of `entry.vcpus`), MSRs,
/// FPU, LAPIC LINTs, special and general registers for `entry`.
pub fn configure(
    fd: &VcpuFd,
    index: u8,
    cpu: &CpuSetup,
    entry: &LinuxEntry,
) -> Result<(), CpuError> {
    let vcpus = entry.vcpus;
    let ioctl = |what: &'static str| {
        move |source| CpuError::Ioctl {
            index,
            what,
            source,
        }
    };
    let mut entries = cpu.cpuid.as_slice().to_vec();
    super::cpuid::set_topology(&mut entries, index, vcpus, cpu.smt);
    let cpuid = CpuId::from_entries(&entries).map_err(|e| CpuError::CpuidList(format!("{e:?}")))?;
    fd.set_cpuid2(&cpuid).map_err(ioctl("KVM_SET_CPUID2"))?;

    let entries = &cpu.msrs;
    let msrs = Msrs::from_entries(entries).map_err(|e| CpuError::MsrList(format!("{e:?}")))?;
    let set = fd.set_msrs(&msrs).map_err(ioctl("KVM_SET_MSRS"))?;
    if set != entries.len() {
        return Err(CpuError::Msrs {
            index,
            set,
            wanted: entries.len(),
        });
    }
    let fpu = kvm_fpu {
        fcw: 0x37f,
        mxcsr: 0x1f80,
        ..Default::default()
    };
    fd.set_fpu(&fpu).map_err(ioctl("KVM_SET_FPU"))?;
    let mut lapic = fd.get_lapic().map_err(ioctl("KVM_GET_LAPIC"))?;
    setup_lint(&mut lapic);
    fd.set_lapic(&lapic).map_err(ioctl("KVM_SET_LAPIC"))?;
    let mut sregs = fd.get_sregs().map_err(ioctl("KVM_GET_SREGS"))?;
    setup_sregs(&mut sregs, entry.protocol);
    fd.set_sregs(&sregs).map_err(ioctl("KVM_SET_SREGS"))?;
    fd.set_regs(&entry_regs(entry.entry, entry.protocol))
        .map_err(ioctl("KVM_SET_REGS"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vstate::msrs::{MSR_IA32_MISC_ENABLE, MSR_LSTAR, MSR_MTRR_DEF_TYPE};

    #[test]
    fn cpl0_long_mode() {
        let mut s = kvm_sregs::default();
        setup_sregs(&mut s, BootProtocol::Linux64);
        assert_eq!(s.cs.selector, CODE_SELECTOR);
        assert_eq!((s.cs.dpl, s.cs.l, s.cs.db), (0, 1, 0));
        assert_eq!(s.ss.selector, DATA_SELECTOR);
        assert_eq!(s.cr0, 0x8000_0011);
        assert_eq!(s.cr3, PML4_ADDR);
        assert_eq!(s.cr4, 0x20);
        assert_eq!(s.efer, 0x500);
        // The selectors index DPL-0 descriptors of the right kind.
        assert_eq!((GDT[usize::from(CODE_SELECTOR >> 3)] >> 45) & 3, 0);
        assert_ne!((GDT[usize::from(CODE_SELECTOR >> 3)] >> 53) & 1, 0, "L bit");
        assert_eq!(
            (GDT[usize::from(TSS_SELECTOR >> 3)] >> 40) & 0xf,
            0xb,
            "busy TSS"
        );
        let r = entry_regs(0x100_0000, BootProtocol::Linux64);
        assert_eq!((r.rip, r.rsi, r.rflags), (0x100_0000, ZERO_PAGE_ADDR, 2));
    }

    /// A kvm_segment as the CPU would load it from GDT descriptor `d`
    /// (the limit scaled by the granularity bit, as KVM wants it).
    fn from_descriptor(d: u64, selector: u16) -> kvm_segment {
        let g = ((d >> 55) & 1) as u8;
        let raw = (((d >> 32) & 0xf_0000) | (d & 0xffff)) as u32;
        kvm_segment {
            base: ((d >> 16) & 0xff_ffff) | ((d >> 32) & 0xff00_0000),
            limit: if g == 1 { (raw << 12) | 0xfff } else { raw },
            selector,
            type_: ((d >> 40) & 0xf) as u8,
            present: ((d >> 47) & 1) as u8,
            dpl: ((d >> 45) & 3) as u8,
            db: ((d >> 54) & 1) as u8,
            s: ((d >> 44) & 1) as u8,
            l: ((d >> 53) & 1) as u8,
            g,
            ..Default::default()
        }
    }

    #[test]
    fn pvh_is_32_bit_protected_mode_without_paging() {
        let mut s = kvm_sregs {
            cr0: 0x8000_0011,
            cr3: 0x1000,
            cr4: 0x20,
            efer: 0x500,
            ..Default::default()
        };
        setup_sregs(&mut s, BootProtocol::Pvh);
        assert_eq!((s.cr0, s.cr3, s.cr4, s.efer), (0x11, 0, 0, 0));
        // Flat 32-bit CPL0 code: base 0, 4 GiB, execute/read accessed.
        let cs = s.cs;
        assert_eq!(
            (cs.base, cs.limit, cs.type_, cs.s),
            (0, 0xffff_ffff, 0xb, 1)
        );
        assert_eq!((cs.db, cs.l, cs.g, cs.dpl, cs.present), (1, 0, 1, 0, 1));
        for d in [s.ds, s.es, s.fs, s.gs, s.ss] {
            assert_eq!(
                (d.base, d.limit, d.type_, d.db, d.dpl),
                (0, 0xffff_ffff, 3, 1, 0)
            );
            assert_eq!(d.selector, DATA_SELECTOR);
        }
        assert_eq!((s.tr.type_, s.tr.s, s.tr.present), (0xb, 0, 1), "busy TSS");
        // The registers match the GDT written to guest memory, descriptor
        // for descriptor, so a reload of any selector changes nothing.
        assert_eq!(s.gdt.base, GDT_ADDR);
        assert_eq!(usize::from(s.gdt.limit) + 1, PVH_GDT.len() * 8);
        assert_eq!(PVH_GDT[0], 0);
        for seg in [s.cs, s.ds, s.ss, s.tr] {
            let d = PVH_GDT[usize::from(seg.selector >> 3)];
            assert_eq!(from_descriptor(d, seg.selector), seg);
        }
        let t = tables(BootProtocol::Pvh);
        assert_eq!(t.len(), 2, "no page tables without paging");
        assert_eq!(
            t[0],
            (
                GDT_ADDR,
                PVH_GDT.iter().flat_map(|e| e.to_le_bytes()).collect()
            )
        );
        let r = entry_regs(0x100_0040, BootProtocol::Pvh);
        assert_eq!(
            r,
            kvm_regs {
                rip: 0x100_0040,
                rbx: START_INFO_ADDR,
                rflags: 2,
                ..Default::default()
            }
        );
    }

    #[test]
    fn tables_identity_map_the_first_gib() {
        let t = tables(BootProtocol::Linux64);
        let find = |addr| t.iter().find(|(a, _)| *a == addr).unwrap().1.clone();
        let u = |b: &[u8], i: usize| u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().unwrap());
        assert_eq!(u(&find(PML4_ADDR), 0), PDPT_ADDR | 3);
        assert_eq!(u(&find(PDPT_ADDR), 0), PD_ADDR | 3);
        let pd = find(PD_ADDR);
        assert_eq!(pd.len(), 4096);
        for i in [0usize, 8, 511] {
            assert_eq!(u(&pd, i), ((i as u64) << 21) | 0x83);
        }
        assert_eq!(find(GDT_ADDR).len(), 32);
        // Nothing overlaps the zero page or the stack.
        for (addr, bytes) in &t {
            let end = addr + bytes.len() as u64;
            assert!(end <= ZERO_PAGE_ADDR || *addr >= ZERO_PAGE_ADDR + 4096);
            assert!(end <= BOOT_STACK - 0x1000 || *addr >= BOOT_STACK);
        }
    }

    #[test]
    fn msrs_as_firecracker() {
        let m = boot_msrs();
        let get = |i| m.iter().find(|e| e.index == i).map(|e| e.data);
        assert_eq!(get(MSR_IA32_MISC_ENABLE), Some(1));
        assert_eq!(get(MSR_MTRR_DEF_TYPE), Some(0x806));
        assert_eq!(get(MSR_LSTAR), Some(0));
        assert_eq!(m.len(), 11);
    }

    #[test]
    fn lints() {
        let mut s = kvm_lapic_state::default();
        set_lapic_reg(&mut s, APIC_LVT0, 0x1_0700);
        setup_lint(&mut s);
        assert_eq!(lapic_reg(&s, APIC_LVT0), 0x1_0700);
        assert_eq!(lapic_reg(&s, APIC_LVT1), 0x400);
        set_lapic_reg(&mut s, APIC_LVT0, 0x1_0000);
        setup_lint(&mut s);
        assert_eq!(lapic_reg(&s, APIC_LVT0), 0x1_0700);
    }
}
