//! The ACPI tables a Linux guest reads for its CPUs, interrupts and NUMA
//! nodes: RSDP → XSDT → FADT (hardware-reduced, with an empty DSDT), MADT
//! (one LAPIC per vCPU, the IOAPIC, LINT1 as NMI), SRAT (one proximity
//! domain per host node that holds a slice of guest RAM; the vCPUs spread
//! over them round-robin) and SLIT (the host's distances between those
//! nodes). Pure functions over values: [`tables`] returns the bytes to
//! write at [`RSDP_ADDR`], in the BIOS area `[0xe0000, 0xf0000)` that is
//! reserved in the e820 map and that Linux scans for the RSDP (the zero
//! page's `acpi_rsdp_addr` points there too).
//!
//! Guest node `g` is proximity domain `g`, and the `g`-th distinct host
//! node in guest address order. Linux numbers its nodes in the order it
//! meets proximity domains (CPU entries first, then memory); the
//! round-robin spread puts vCPU `i` on node `i % nodes`, so the CPU entries
//! meet domains 0, 1, ... in order and Linux's node `g` is domain `g`.

/// Guest address of the RSDP; the other tables follow it.
pub const RSDP_ADDR: u64 = 0xe_0000;
/// Bytes reserved for the tables (up to the MP table at 0xf0000).
pub const ACPI_MAX: usize = 0x1_0000;
/// SLIT distance of a node to itself.
pub const LOCAL_DISTANCE: u8 = 10;
/// SLIT distance between two nodes when the host does not say.
pub const REMOTE_DISTANCE: u8 = 20;

const HEADER_BYTES: usize = 36;
const RSDP_BYTES: usize = 36;
const OEM_ID: &[u8; 6] = b"TERAVM";
const OEM_TABLE_ID: &[u8; 8] = b"MICROVM ";
const CREATOR_ID: &[u8; 4] = b"TRVM";
const FADT_BYTES: usize = 276;
/// FADT flags: no fixed power button, no fixed sleep button, hardware-reduced ACPI.
const FADT_FLAGS: u32 = (1 << 4) | (1 << 5) | (1 << 20);
/// IA-PC boot flags: an 8042, no VGA, no MSI, no CMOS RTC.
const IAPC_BOOT_ARCH: u16 = (1 << 1) | (1 << 2) | (1 << 3) | (1 << 5);
const MADT_PCAT_COMPAT: u32 = 1;
const MADT_LAPIC: u8 = 0;
const MADT_IOAPIC: u8 = 1;
const MADT_LAPIC_NMI: u8 = 4;
const SRAT_CPU: u8 = 0;
const SRAT_MEMORY: u8 = 1;
const ENABLED: u32 = 1;
/// SRAT memory affinity: the range may be hot-plugged.
const HOT_PLUGGABLE: u32 = 2;

/// Errors of the ACPI tables.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AcpiError {
    /// No vCPU, or more than fit in 8-bit APIC ids beside the IOAPIC.
    #[error("{0} vCPUs cannot be described in the MADT (1..=254)")]
    VcpuCount(usize),
    /// No guest RAM.
    #[error("no guest NUMA node has memory")]
    NoNodes,
    /// The distance matrix is not square over the nodes.
    #[error("the distance matrix is not {0}x{0}")]
    Distances(usize),
    /// The tables outgrow their area.
    #[error("the ACPI tables take {0} bytes; the area holds {ACPI_MAX}")]
    TooBig(usize),
}

/// One guest NUMA node: the host node it is placed on and its RAM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestNode {
    /// The host node backing it.
    pub host_node: u32,
    /// Its guest RAM ranges `(guest_addr, len)`, in address order.
    pub ranges: Vec<(u64, u64)>,
    /// Its parts of the hotplug region (virtio-mem), listed hot-pluggable
    /// so the guest knows their node before any block is plugged.
    pub hotplug: Vec<(u64, u64)>,
}

/// The guest nodes of RAM `slices` (`(guest_addr, len, host_node)`, sorted by
/// address): one per distinct host node, numbered in order of first
/// appearance.
pub fn guest_nodes(slices: &[(u64, u64, u32)]) -> Vec<GuestNode> {
    let mut nodes: Vec<GuestNode> = Vec::new();
    for &(addr, len, host) in slices {
        match nodes.iter_mut().find(|n| n.host_node == host) {
            Some(n) => n.ranges.push((addr, len)),
            None => nodes.push(GuestNode {
                host_node: host,
                ranges: vec![(addr, len)],
                hotplug: Vec::new(),
            }),
        }
    }
    nodes
}

/// Adds the hotplug region's `parts` (`(guest_addr, len, host_node)`) to
/// the nodes of their host nodes (a part whose host node holds no RAM is
/// left out: it has no guest node).
pub fn add_hotplug(nodes: &mut [GuestNode], parts: &[(u64, u64, u32)]) {
    for &(addr, len, host) in parts {
        if let Some(n) = nodes.iter_mut().find(|n| n.host_node == host) {
            n.hotplug.push((addr, len));
        }
    }
}

/// The guest node (proximity domain) of vCPU `vcpu` among `nodes` nodes.
pub fn vcpu_node(vcpu: usize, nodes: usize) -> usize {
    vcpu % nodes.max(1)
}

fn checksum(bytes: &[u8]) -> u8 {
    0u8.wrapping_sub(bytes.iter().fold(0u8, |a, b| a.wrapping_add(*b)))
}

/// A table: the standard header with `signature` and `revision`, then
/// `body`, its length and checksum filled in.
fn table(signature: &[u8; 4], revision: u8, body: &[u8]) -> Vec<u8> {
    let len = (HEADER_BYTES + body.len()) as u32;
    let mut t = Vec::with_capacity(len as usize);
    t.extend(signature);
    t.extend(len.to_le_bytes());
    t.push(revision);
    t.push(0); // checksum, below
    t.extend(OEM_ID);
    t.extend(OEM_TABLE_ID);
    t.extend(1u32.to_le_bytes()); // OEM revision
    t.extend(CREATOR_ID);
    t.extend(1u32.to_le_bytes()); // creator revision
    t.extend(body);
    t[9] = checksum(&t);
    t
}

/// The DSDT: no AML (no device needs describing; the legacy UART and
/// i8042 are found at their fixed ports).
pub fn dsdt() -> Vec<u8> {
    table(b"DSDT", 2, &[])
}

/// The FADT (revision 6.5), hardware-reduced, pointing at the DSDT.
pub fn fadt(dsdt_addr: u64) -> Vec<u8> {
    let mut b = vec![0u8; FADT_BYTES - HEADER_BYTES];
    let at = |off: usize| off - HEADER_BYTES;
    b[at(40)..at(44)].copy_from_slice(&(dsdt_addr as u32).to_le_bytes());
    b[at(109)..at(111)].copy_from_slice(&IAPC_BOOT_ARCH.to_le_bytes());
    b[at(112)..at(116)].copy_from_slice(&FADT_FLAGS.to_le_bytes());
    b[at(131)] = 5; // minor version
    b[at(140)..at(148)].copy_from_slice(&dsdt_addr.to_le_bytes());
    table(b"FACP", 6, &b)
}

/// The MADT: a LAPIC per vCPU (APIC id = ACPI processor uid = vCPU
/// index), the IOAPIC (id after the vCPUs', GSI base 0), and LINT1 of every
/// LAPIC as NMI. ISA interrupts map one to one onto IOAPIC pins, as KVM
/// routes them, so there are no source overrides.
pub fn madt(vcpus: usize) -> Result<Vec<u8>, AcpiError> {
    if vcpus == 0 || vcpus > 254 {
        return Err(AcpiError::VcpuCount(vcpus));
    }
    let mut b = Vec::new();
    b.extend(super::mptable::LAPIC_ADDR.to_le_bytes());
    b.extend(MADT_PCAT_COMPAT.to_le_bytes());
    for i in 0..vcpus {
        b.extend([MADT_LAPIC, 8, i as u8, i as u8]);
        b.extend(ENABLED.to_le_bytes());
    }
    b.extend([MADT_IOAPIC, 12, super::mptable::ioapic_id(vcpus), 0]);
    b.extend(super::mptable::IOAPIC_ADDR.to_le_bytes());
    b.extend(0u32.to_le_bytes()); // GSI base
    b.extend([MADT_LAPIC_NMI, 6, 0xff, 0, 0, 1]); // all processors, LINT1
    Ok(table(b"APIC", 5, &b))
}

/// The SRAT: each vCPU's LAPIC in its node ([`vcpu_node`]), then each
/// node's RAM ranges in its node, then its hotplug parts (enabled and
/// hot-pluggable, as QEMU lists virtio-mem's region).
pub fn srat(nodes: &[GuestNode], vcpus: usize) -> Result<Vec<u8>, AcpiError> {
    if nodes.is_empty() {
        return Err(AcpiError::NoNodes);
    }
    let mut b = Vec::new();
    b.extend(1u32.to_le_bytes()); // reserved, 1 for compatibility
    b.extend(0u64.to_le_bytes());
    for i in 0..vcpus {
        let pxm = vcpu_node(i, nodes.len()) as u32;
        let p = pxm.to_le_bytes();
        b.extend([SRAT_CPU, 16, p[0], i as u8]);
        b.extend(ENABLED.to_le_bytes());
        b.extend([0, p[1], p[2], p[3]]); // SAPIC EID, domain bits 8..31
        b.extend(0u32.to_le_bytes()); // clock domain
    }
    for (pxm, node) in nodes.iter().enumerate() {
        let ram = node.ranges.iter().map(|&r| (r, ENABLED));
        let hotplug = node.hotplug.iter().map(|&r| (r, ENABLED | HOT_PLUGGABLE));
        for ((addr, len), flags) in ram.chain(hotplug) {
            b.extend([SRAT_MEMORY, 40]);
            b.extend((pxm as u32).to_le_bytes());
            b.extend([0u8; 2]);
            b.extend(addr.to_le_bytes()); // base, low then high dword
            b.extend(len.to_le_bytes()); // length, low then high dword
            b.extend([0u8; 4]);
            b.extend(flags.to_le_bytes());
            b.extend([0u8; 8]);
        }
    }
    Ok(table(b"SRAT", 3, &b))
}

/// The SLIT for `distances[i][j]` between guest nodes `i` and `j`.
pub fn slit(distances: &[Vec<u8>]) -> Result<Vec<u8>, AcpiError> {
    let n = distances.len();
    if n == 0 || distances.iter().any(|row| row.len() != n) {
        return Err(AcpiError::Distances(n));
    }
    let mut b = Vec::with_capacity(8 + n * n);
    b.extend((n as u64).to_le_bytes());
    for row in distances {
        b.extend(row);
    }
    Ok(table(b"SLIT", 1, &b))
}

/// A distance matrix Linux accepts (10 on the diagonal, more than 10
/// elsewhere): `host(i, j)` where it gives one, else 10 / 20.
pub fn distances(nodes: &[GuestNode], host: impl Fn(u32, u32) -> Option<u8>) -> Vec<Vec<u8>> {
    nodes
        .iter()
        .map(|a| {
            nodes
                .iter()
                .map(|b| {
                    if a.host_node == b.host_node {
                        LOCAL_DISTANCE
                    } else {
                        host(a.host_node, b.host_node)
                            .filter(|&d| d > LOCAL_DISTANCE)
                            .unwrap_or(REMOTE_DISTANCE)
                    }
                })
                .collect()
        })
        .collect()
}

/// Host node `from`'s distance to host node `to`, from
/// `/sys/devices/system/node/node<from>/distance` (one number per online
/// node, in node order); `None` where the host does not have them. Without
/// that directory (a jail without `/sys`), the log says once that the
/// defaults are used.
pub fn host_distance(from: u32, to: u32) -> Option<u8> {
    let sys = std::path::Path::new("/sys/devices/system/node");
    let Ok(online) = std::fs::read_to_string(sys.join("online")) else {
        static SAID: std::sync::Once = std::sync::Once::new();
        SAID.call_once(|| {
            log::warn!(
                "ACPI SLIT: no {}: the guest's node distances are the defaults \
                 ({LOCAL_DISTANCE} local, {REMOTE_DISTANCE} remote), not the host's",
                sys.join("online").display()
            )
        });
        return None;
    };
    let online = crate::memory::numa::parse_list(online.trim(), sys).ok()?;
    let column = online.iter().position(|&n| n == to as usize)?;
    let row = std::fs::read_to_string(sys.join(format!("node{from}/distance"))).ok()?;
    row.split_whitespace().nth(column)?.parse().ok()
}

fn rsdp(xsdt_addr: u64) -> Vec<u8> {
    let mut r = Vec::with_capacity(RSDP_BYTES);
    r.extend(b"RSD PTR ");
    r.push(0); // checksum of the first 20 bytes, below
    r.extend(OEM_ID);
    r.push(2); // revision: ACPI 2.0+, with an XSDT
    r.extend(0u32.to_le_bytes()); // no RSDT
    r.extend((RSDP_BYTES as u32).to_le_bytes());
    r.extend(xsdt_addr.to_le_bytes());
    r.push(0); // extended checksum, below
    r.extend([0u8; 3]);
    r[8] = checksum(&r[..20]);
    r[32] = checksum(&r);
    r
}

/// All the tables for `vcpus` vCPUs over `nodes`, as one block to write at
/// [`RSDP_ADDR`]: the RSDP, then the DSDT, FADT, MADT, SRAT, SLIT and
/// XSDT, each 8-byte aligned.
pub fn tables(
    vcpus: usize,
    nodes: &[GuestNode],
    distances: &[Vec<u8>],
) -> Result<Vec<u8>, AcpiError> {
    if distances.len() != nodes.len() {
        return Err(AcpiError::Distances(nodes.len()));
    }
    let mut out = vec![0u8; RSDP_BYTES];
    let put = |out: &mut Vec<u8>, t: Vec<u8>| {
        out.resize(out.len().next_multiple_of(8), 0);
        let addr = RSDP_ADDR + out.len() as u64;
        out.extend(t);
        addr
    };
    let dsdt_addr = put(&mut out, dsdt());
    let listed = [
        put(&mut out, fadt(dsdt_addr)),
        put(&mut out, madt(vcpus)?),
        put(&mut out, srat(nodes, vcpus)?),
        put(&mut out, slit(distances)?),
    ];
    let xsdt_body: Vec<u8> = listed.iter().flat_map(|a| a.to_le_bytes()).collect();
    let xsdt_addr = put(&mut out, table(b"XSDT", 1, &xsdt_body));
    out[..RSDP_BYTES].copy_from_slice(&rsdp(xsdt_addr));
    if out.len() > ACPI_MAX {
        return Err(AcpiError::TooBig(out.len()));
    }
    Ok(out)
}

#[cfg(test)]
#[path = "acpi_tests.rs"]
mod tests;
