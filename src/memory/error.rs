//! The error of setting up guest memory ([`GuestMemoryError`]), apart from
//! [`super::guest`] so that the parts guest memory is made of
//! ([`super::mapping`], [`super::view`]) report it without importing the
//! module that owns them (no two modules import each other).

use super::admission::AdmissionError;
use super::plan::PlanError;

/// Errors setting up guest memory.
#[derive(Debug, thiserror::Error)]
pub enum GuestMemoryError {
    /// Guest RAM cannot be split over the selected nodes.
    #[error("cannot place guest memory: {0}")]
    Plan(#[from] PlanError),
    /// The hotplug region cannot be laid out.
    #[error("memory hotplug: {0}")]
    Hotplug(#[from] super::hotplug::HotplugLayoutError),
    /// No node of the topology has memory.
    #[error("no host node has memory")]
    NoNodes,
    /// A selected node is not in the host topology.
    #[error("host node {0} is not in the host topology")]
    UnknownNode(u32),
    /// A selected node does not exist on this host, so it cannot be bound.
    #[error("host node {0} does not exist on this host, so memory cannot be bound to it (choose existing nodes or numa_policy \"none\")")]
    HostLacksNode(u32),
    /// `memfd_create` failed.
    #[error("memfd_create for the slice of node {node} failed: {source}")]
    Memfd {
        /// The slice's node.
        node: u32,
        /// Why.
        source: std::io::Error,
    },
    /// The memfd could not be sized.
    #[error("cannot size the memfd of node {node} to {len} bytes: {source}")]
    Truncate {
        /// The slice's node.
        node: u32,
        /// The size.
        len: u64,
        /// Why.
        source: std::io::Error,
    },
    /// `mmap` failed.
    #[error("mmap of {len} bytes for node {node} failed: {source}")]
    Mmap {
        /// The slice's node.
        node: u32,
        /// The size.
        len: u64,
        /// Why.
        source: std::io::Error,
    },
    /// hugetlb pages could not be reserved.
    #[error("cannot map {len} bytes of {} MiB huge pages for node {node}: {source}; reserve huge pages on the host (/sys/kernel/mm/hugepages/hugepages-{}kB/nr_hugepages) or use huge_pages \"None\" or \"Transparent\"", page >> 20, page >> 10)]
    HugePages {
        /// The slice's node.
        node: u32,
        /// The size.
        len: u64,
        /// The huge page size.
        page: u64,
        /// Why.
        source: std::io::Error,
    },
    /// `madvise` (huge page advice) failed.
    #[error("madvise({advice}) of the slice of node {node} failed: {source}")]
    Madvise {
        /// The slice's node.
        node: u32,
        /// Which advice.
        advice: &'static str,
        /// Why.
        source: std::io::Error,
    },
    /// `mbind` failed.
    #[error("mbind of the slice of node {node} failed: {source}")]
    Mbind {
        /// The slice's node.
        node: u32,
        /// Why.
        source: std::io::Error,
    },
    /// The vm-memory view could not be built.
    #[error("cannot build the guest memory view: {0}")]
    View(String),
    /// The process may not get the memory the guest needs.
    #[error(transparent)]
    Admission(#[from] AdmissionError),
    /// guest_memfd backing was asked of a memory built without a VM.
    #[error("guest_memfd backing needs the KVM VM that creates its files")]
    GuestMemfdNeedsVm,
    /// guest_memfd has no hugetlb pages.
    #[error("guest_memfd backing has no {} MiB huge pages in this kernel (it takes 4 KiB pages only); use huge_pages \"None\"", page >> 20)]
    GuestMemfdPageSize {
        /// The page size asked for.
        page: u64,
    },
    /// `KVM_CREATE_GUEST_MEMFD` failed.
    #[error("KVM_CREATE_GUEST_MEMFD of {len} bytes for node {node} failed: {source}")]
    GuestMemfd {
        /// The slice's node.
        node: u32,
        /// The file's size.
        len: u64,
        /// Why.
        source: std::io::Error,
    },
}
