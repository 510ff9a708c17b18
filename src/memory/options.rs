//! What guest memory is asked to be: the memory module's own option types,
//! free of any file format (the config file's serde types are converted into
//! these by `config`).

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// The page size backing guest RAM.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PageSize {
    /// 4 KiB pages only (`MADV_NOHUGEPAGE`).
    Small,
    /// Transparent huge pages (`MADV_HUGEPAGE`), the default.
    #[default]
    Transparent,
    /// hugetlb 2 MiB pages (reserved on the host).
    Huge2M,
    /// hugetlb 1 GiB pages (reserved on the host).
    Huge1G,
}

impl PageSize {
    /// The size of a hugetlb page, for the hugetlb page sizes.
    pub fn hugetlb_bytes(self) -> Option<u64> {
        match self {
            PageSize::Huge2M => Some(2 * MIB),
            PageSize::Huge1G => Some(GIB),
            PageSize::Small | PageSize::Transparent => None,
        }
    }

    /// The `MAP_HUGE_*` / `MFD_HUGE_*` size bits of a hugetlb page size.
    pub(crate) fn huge_flag(self) -> libc::c_int {
        match self {
            PageSize::Huge2M => libc::MAP_HUGE_2MB,
            PageSize::Huge1G => libc::MAP_HUGE_1GB,
            PageSize::Small | PageSize::Transparent => 0,
        }
    }
}

/// What backs guest RAM.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Backing {
    /// Private anonymous memory, the default.
    #[default]
    Anonymous,
    /// Shared memory from memfds: each node slice striped over several
    /// memfds (see [`crate::memory::guest`]), so hole punches of different
    /// stripes run in parallel.
    Memfd,
    /// KVM's own memory files (`KVM_CREATE_GUEST_MEMFD`, mapped into teravm
    /// too): striped as memfd is, 4 KiB pages, freed by hole punches
    /// ([`crate::memory::gmem`]).
    GuestMemfd,
}

/// How each node slice is bound to its host node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum NumaPolicy {
    /// `MPOL_BIND`: pages only from the slice's node (the default).
    #[default]
    Bind,
    /// `MPOL_PREFERRED`: the slice's node first, others when it is full.
    Preferred,
    /// No `mbind`: the kernel's default policy.
    None,
}

impl NumaPolicy {
    /// The `mbind` mode, if any.
    pub(crate) fn mbind_mode(self) -> Option<libc::c_int> {
        match self {
            NumaPolicy::Bind => Some(libc::MPOL_BIND),
            NumaPolicy::Preferred => Some(libc::MPOL_PREFERRED),
            NumaPolicy::None => None,
        }
    }
}

/// How to lay out and back guest RAM.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MemoryOptions {
    /// Guest RAM in bytes (the MMIO gap is not counted).
    pub mem_bytes: u64,
    /// Page size.
    pub page_size: PageSize,
    /// Anonymous, memfd or guest_memfd.
    pub backing: Backing,
    /// Host nodes to spread RAM over; `None` means every node with memory.
    pub host_nodes: Option<Vec<u32>>,
    /// How each slice is bound to its node.
    pub policy: NumaPolicy,
    /// All of it will be faulted in at start ([`crate::memory::GuestMemory::populate`]):
    /// then admission checks that this process may get that much memory
    /// before anything is mapped.
    pub populate: bool,
}
