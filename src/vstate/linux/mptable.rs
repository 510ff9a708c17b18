//! The Intel MultiProcessor table (spec 1.4) that tells Linux how many
//! vCPUs there are and how the legacy interrupts are wired: one processor
//! entry per vCPU (APIC id = vCPU index), the ISA bus, the in-kernel
//! IOAPIC, its 24 inputs, and the LAPIC's LINT0 (ExtINT) and LINT1 (NMI).
//!
//! It lives in the BIOS ROM area at [`MPTABLE_ADDR`] (reserved in the e820
//! map), where Linux scans for the floating pointer; there is room for far
//! more vCPUs than teravm allows.

/// Guest address of the MP floating pointer; the table follows it.
pub const MPTABLE_ADDR: u64 = 0xf_0000;
/// Bytes reserved for the floating pointer and the table.
pub const MPTABLE_MAX: usize = 0x1_0000;
/// Where the IOAPIC is.
pub const IOAPIC_ADDR: u32 = 0xfec0_0000;
/// Where each LAPIC is.
pub const LAPIC_ADDR: u32 = 0xfee0_0000;
/// IOAPIC inputs (KVM's in-kernel IOAPIC has 24).
pub const IOAPIC_PINS: u8 = 24;

const FLOATING_BYTES: usize = 16;
const HEADER_BYTES: usize = 44;
const CPU_ENTRY: u8 = 0;
const BUS_ENTRY: u8 = 1;
const IOAPIC_ENTRY: u8 = 2;
const INTSRC_ENTRY: u8 = 3;
const LINTSRC_ENTRY: u8 = 4;
const INT_TYPE_INT: u8 = 0;
const INT_TYPE_NMI: u8 = 1;
const INT_TYPE_EXTINT: u8 = 3;
const CPU_ENABLED: u8 = 1;
const CPU_BOOTPROCESSOR: u8 = 2;
const LAPIC_VERSION: u8 = 0x14;
const IOAPIC_VERSION: u8 = 0x11;
/// Family 6 (as KVM's default CPU) in the signature; FPU and APIC in the features.
const CPU_SIGNATURE: u32 = 0x600;
const CPU_FEATURES: u32 = 0x201;
const SPEC_REV_1_4: u8 = 4;

/// Errors of the MP table.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum MptableError {
    /// No vCPU, or more than the APIC ids that leave room for the IOAPIC.
    #[error("{0} vCPUs cannot be described in an MP table (1..=254)")]
    VcpuCount(usize),
}

/// The IOAPIC's id: the first APIC id after the vCPUs'.
pub fn ioapic_id(vcpus: usize) -> u8 {
    vcpus as u8
}

fn checksum(bytes: &[u8]) -> u8 {
    0u8.wrapping_sub(bytes.iter().fold(0u8, |a, b| a.wrapping_add(*b)))
}

/// The floating pointer and the table for `vcpus` vCPUs, to be written at
/// [`MPTABLE_ADDR`].
pub fn mptable(vcpus: usize) -> Result<Vec<u8>, MptableError> {
    if vcpus == 0 || vcpus > 254 {
        return Err(MptableError::VcpuCount(vcpus));
    }
    let table_addr = MPTABLE_ADDR as u32 + FLOATING_BYTES as u32;
    let ioapic = ioapic_id(vcpus);

    let mut entries = Vec::new();
    for i in 0..vcpus {
        entries.push(CPU_ENTRY);
        entries.push(i as u8);
        entries.push(LAPIC_VERSION);
        entries.push(CPU_ENABLED | if i == 0 { CPU_BOOTPROCESSOR } else { 0 });
        entries.extend(CPU_SIGNATURE.to_le_bytes());
        entries.extend(CPU_FEATURES.to_le_bytes());
        entries.extend([0u8; 8]);
    }
    entries.extend([BUS_ENTRY, 0]);
    entries.extend(b"ISA   ");
    entries.extend([IOAPIC_ENTRY, ioapic, IOAPIC_VERSION, 1]);
    entries.extend(IOAPIC_ADDR.to_le_bytes());
    for pin in 0..IOAPIC_PINS {
        // Conforming polarity and trigger, ISA bus IRQ `pin` to IOAPIC pin `pin`.
        entries.extend([INTSRC_ENTRY, INT_TYPE_INT, 0, 0, 0, pin, ioapic, pin]);
    }
    // LINT0 of every LAPIC is ExtINT (the PIC), LINT1 is NMI.
    entries.extend([LINTSRC_ENTRY, INT_TYPE_EXTINT, 0, 0, 0, 0, 0xff, 0]);
    entries.extend([LINTSRC_ENTRY, INT_TYPE_NMI, 0, 0, 0, 0, 0xff, 1]);
    let entry_count = (vcpus + 2 + usize::from(IOAPIC_PINS) + 2) as u16;

    let mut table = Vec::with_capacity(HEADER_BYTES + entries.len());
    table.extend(b"PCMP");
    table.extend(((HEADER_BYTES + entries.len()) as u16).to_le_bytes());
    table.push(SPEC_REV_1_4);
    table.push(0); // checksum, below
    table.extend(b"TERAVM  ");
    table.extend(b"microVM     ");
    table.extend(0u32.to_le_bytes()); // OEM table pointer
    table.extend(0u16.to_le_bytes()); // OEM table size
    table.extend(entry_count.to_le_bytes());
    table.extend(LAPIC_ADDR.to_le_bytes());
    table.extend(0u32.to_le_bytes()); // extended table length, checksum, reserved
    table.extend(entries);
    table[7] = checksum(&table);

    let mut out = Vec::with_capacity(FLOATING_BYTES + table.len());
    out.extend(b"_MP_");
    out.extend(table_addr.to_le_bytes());
    out.push(1); // length in 16-byte units
    out.push(SPEC_REV_1_4);
    out.push(0); // checksum, below
    out.extend([0u8; 5]); // feature bytes: the table is present, no default config
    out[10] = checksum(&out);
    out.extend(table);
    debug_assert!(out.len() <= MPTABLE_MAX);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sum(b: &[u8]) -> u8 {
        b.iter().fold(0u8, |a, x| a.wrapping_add(*x))
    }

    #[test]
    fn floating_pointer_and_header() {
        let t = mptable(4).unwrap();
        assert_eq!(&t[..4], b"_MP_");
        assert_eq!(
            u32::from_le_bytes(t[4..8].try_into().unwrap()),
            MPTABLE_ADDR as u32 + 16
        );
        assert_eq!(t[8], 1);
        assert_eq!(sum(&t[..16]), 0);
        let table = &t[16..];
        assert_eq!(&table[..4], b"PCMP");
        let len = u16::from_le_bytes([table[4], table[5]]) as usize;
        assert_eq!(len, table.len());
        assert_eq!(sum(table), 0);
        let count = u16::from_le_bytes([table[34], table[35]]);
        assert_eq!(count, 4 + 2 + 24 + 2);
        assert_eq!(
            u32::from_le_bytes(table[36..40].try_into().unwrap()),
            LAPIC_ADDR
        );
    }

    #[test]
    fn one_processor_entry_per_vcpu() {
        for vcpus in [1usize, 2, 7, 254] {
            let t = mptable(vcpus).unwrap();
            assert!(t.len() <= MPTABLE_MAX);
            let entries = &t[16 + HEADER_BYTES..];
            let cpus: Vec<&[u8]> = entries[..20 * vcpus].chunks(20).collect();
            for (i, c) in cpus.iter().enumerate() {
                assert_eq!(c[0], CPU_ENTRY);
                assert_eq!(c[1] as usize, i, "APIC id");
                assert_eq!(c[3] & CPU_ENABLED, CPU_ENABLED);
                assert_eq!(c[3] & CPU_BOOTPROCESSOR != 0, i == 0);
            }
            let rest = &entries[20 * vcpus..];
            assert_eq!(&rest[..8], b"\x01\x00ISA   ");
            assert_eq!(rest[8], IOAPIC_ENTRY);
            assert_eq!(rest[9], ioapic_id(vcpus));
            assert_eq!(
                u32::from_le_bytes(rest[12..16].try_into().unwrap()),
                IOAPIC_ADDR
            );
            let ints = &rest[16..16 + 8 * 24];
            for (pin, e) in ints.chunks(8).enumerate() {
                assert_eq!(
                    (e[0], e[5], e[6], e[7]),
                    (INTSRC_ENTRY, pin as u8, ioapic_id(vcpus), pin as u8)
                );
            }
            let lints = &rest[16 + 8 * 24..];
            assert_eq!(lints.len(), 16);
            assert_eq!(
                (lints[0], lints[1], lints[7]),
                (LINTSRC_ENTRY, INT_TYPE_EXTINT, 0)
            );
            assert_eq!(
                (lints[8], lints[9], lints[15]),
                (LINTSRC_ENTRY, INT_TYPE_NMI, 1)
            );
        }
    }

    #[test]
    fn bad_counts() {
        assert_eq!(mptable(0), Err(MptableError::VcpuCount(0)));
        assert_eq!(mptable(255), Err(MptableError::VcpuCount(255)));
    }
}
