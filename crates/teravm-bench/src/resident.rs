//! What a VMM process holds resident, read from `/proc/<pid>/status`
//! (VmRSS: anonymous, file and shared memory) and `/proc/<pid>/smaps_rollup`
//! (AnonHugePages and ShmemPmdMapped: what of it is in transparent huge
//! pages), plus what its guest_memfd files hold ([`teravm_client::gmem`]:
//! those pages are in no page table of the process, so not in VmRSS).
//! Pure parsers plus one reader.

use crate::model::Resident;
use teravm_client::host::parse_vm_rss;

/// A `<value> kB` field of `smaps_rollup`, in bytes.
fn kib_line(text: &str, name: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .and_then(|rest| {
            let mut fields = rest.split_whitespace();
            let value: u64 = fields.next()?.parse().ok()?;
            (fields.next() == Some("kB")).then(|| value.checked_mul(1024))?
        })
}

/// The bytes in transparent huge pages, from the text of `smaps_rollup`:
/// anonymous (AnonHugePages) plus shared memory mapped with PMDs
/// (ShmemPmdMapped); `None` when it has neither line.
pub fn parse_huge_bytes(smaps_rollup: &str) -> Option<u64> {
    let anon = kib_line(smaps_rollup, "AnonHugePages");
    let shmem = kib_line(smaps_rollup, "ShmemPmdMapped");
    match (anon, shmem) {
        (None, None) => None,
        (a, s) => Some(a.unwrap_or(0) + s.unwrap_or(0)),
    }
}

/// What process `pid` holds resident now; `None` once it is gone.
pub fn resident_of(pid: u32) -> Option<Resident> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
    // A page of a guest_memfd that the VMM also mapped (the firmware, a
    // ring) is counted twice: a few MiB at most.
    let gmem =
        teravm_client::gmem::gmem_allocated_bytes(pid, teravm::memory::gmem::allocated_bytes)
            .ok()?;
    Some(Resident {
        bytes: parse_vm_rss(&status)? + gmem,
        huge_bytes: parse_huge_bytes(&rollup)?,
    })
}

/// Whether `resident` covers all of a guest's `size_bytes`.
pub fn covers(resident: &Resident, size_bytes: u64) -> bool {
    resident.bytes >= size_bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    // From QEMU 7.2 with a 512 MiB THP memory-backend-ram, preallocated.
    const QEMU_THP: &str =
        "5558159ed000-7ffe9b43b000 ---p 00000000 00:00 0                          [rollup]
Rss:              563352 kB
Pss:              561841 kB
Pss_Anon:         541228 kB
Pss_Shmem:             0 kB
Anonymous:        541228 kB
KSM:                   0 kB
LazyFree:              0 kB
AnonHugePages:    526336 kB
ShmemPmdMapped:        0 kB
FilePmdMapped:         0 kB
Shared_Hugetlb:        0 kB
";

    #[test]
    fn huge_pages_are_anonymous_plus_shmem_pmd_mapped() {
        assert_eq!(parse_huge_bytes(QEMU_THP), Some(526336 * 1024));
        assert_eq!(
            parse_huge_bytes("AnonHugePages: 2048 kB\nShmemPmdMapped: 4096 kB\n"),
            Some(6144 * 1024)
        );
        assert_eq!(parse_huge_bytes("ShmemPmdMapped: 4096 kB\n"), Some(4 << 20));
        assert_eq!(parse_huge_bytes("Rss: 1 kB\n"), None);
        assert_eq!(parse_huge_bytes("AnonHugePages: x kB\n"), None);
        // A field whose name only starts the same is not it.
        assert_eq!(parse_huge_bytes("AnonHugePagesX: 1 kB\n"), None);
    }

    #[test]
    fn this_process_has_a_resident_size() {
        let r = resident_of(std::process::id()).unwrap();
        assert!(r.bytes > 0 && r.huge_bytes <= r.bytes, "{r:?}");
        assert!(covers(&r, r.bytes) && !covers(&r, r.bytes + 1));
        assert!(resident_of(u32::MAX).is_none());
    }
}
