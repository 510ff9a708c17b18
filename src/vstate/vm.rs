//! The KVM VM: `/dev/kvm`, the VM fd, memslots, vCPU creation, and for
//! Linux guests the in-kernel irqchip (PIC, IOAPIC, LAPICs), the PIT and
//! irqfds (the built-in firmware runs without any of them).

use std::os::fd::{AsRawFd, FromRawFd};

use kvm_bindings::{
    kvm_create_guest_memfd, kvm_pit_config, kvm_userspace_memory_region,
    kvm_userspace_memory_region2, CpuId, KVM_MAX_CPUID_ENTRIES, KVM_MEM_GUEST_MEMFD,
    KVM_PIT_SPEAKER_DUMMY,
};
use kvm_ioctls::{Kvm, VcpuFd, VmFd};
use vmm_sys_util::eventfd::EventFd;

use crate::memory::gmem::{
    GuestMemfdSource, GuestMemfdSupport, GUEST_MEMFD_FLAGS, KVM_CAP_GUEST_MEMFD,
    KVM_CAP_GUEST_MEMFD_FLAGS, KVM_CAP_USER_MEMORY2,
};
use crate::memory::GmemBinding;

/// Memslots KVM took in this process (`KVM_SET_USER_MEMORY_REGION` or
/// `..._2` answered 0 for a slot of non-zero size): the metrics line's
/// `teravm.memslots.added`.
pub static MEMSLOTS_ADDED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
/// Of those, the ones given `KVM_MEM_LOG_DIRTY_PAGES`
/// (`teravm.memslots.dirty_log`, what `track_dirty_pages` asks).
pub static MEMSLOTS_DIRTY_LOG: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The fault that makes this kernel look as if it offered no guest_memfd
/// flags (`KVM_CAP_GUEST_MEMFD_FLAGS` 0: no `GUEST_MEMFD_FLAG_MMAP`), as a
/// kernel before 6.18 does.
pub const GUEST_MEMFD_NO_MMAP: &str = "guest-memfd-no-mmap";

/// Where KVM may put the three pages of its real-mode TSS (VMX hosts), just
/// below the BIOS ROM and outside guest RAM (in the MMIO gap), as Firecracker does.
const KVM_TSS_ADDR: usize = 0xfffb_d000;

/// Errors of the VM.
#[derive(Debug, thiserror::Error)]
pub enum VmError {
    /// The VM fd could not be duplicated (for the memslots handle).
    #[error("cannot duplicate the VM fd: {0}")]
    DupVm(std::io::Error),
    /// `/dev/kvm` could not be opened.
    #[error("cannot open /dev/kvm: {0} (is KVM enabled, and may this user use it?)")]
    OpenKvm(kvm_ioctls::Error),
    /// `KVM_CREATE_VM` failed.
    #[error("KVM_CREATE_VM failed: {0}")]
    CreateVm(kvm_ioctls::Error),
    /// The host lacks memslots for this guest.
    #[error("the guest needs {needed} memslots; this host's KVM has {available}")]
    TooManyMemslots {
        /// Slots the guest needs.
        needed: usize,
        /// Slots KVM offers.
        available: usize,
    },
    /// `KVM_SET_USER_MEMORY_REGION` failed.
    #[error("KVM_SET_USER_MEMORY_REGION for slot {slot} ({size} bytes at guest {guest_addr:#x}) failed: {source}")]
    SetUserMemoryRegion {
        /// The slot.
        slot: u32,
        /// Guest address.
        guest_addr: u64,
        /// Size in bytes.
        size: u64,
        /// KVM's error.
        source: kvm_ioctls::Error,
    },
    /// `KVM_GET_DIRTY_LOG` failed.
    #[error("KVM_GET_DIRTY_LOG failed: {0}")]
    DirtyLog(kvm_ioctls::Error),
    /// `KVM_GET_SUPPORTED_CPUID` failed.
    #[error("KVM_GET_SUPPORTED_CPUID failed: {0}")]
    SupportedCpuid(kvm_ioctls::Error),
    /// `KVM_CREATE_IRQCHIP` failed.
    #[error("KVM_CREATE_IRQCHIP failed: {0}")]
    CreateIrqchip(kvm_ioctls::Error),
    /// `KVM_CREATE_PIT2` failed.
    #[error("KVM_CREATE_PIT2 failed: {0}")]
    CreatePit(kvm_ioctls::Error),
    /// `KVM_IRQFD` failed.
    #[error("KVM_IRQFD for GSI {gsi} failed: {source}")]
    Irqfd {
        /// The interrupt line.
        gsi: u32,
        /// KVM's error.
        source: kvm_ioctls::Error,
    },
    /// `KVM_IOEVENTFD` failed.
    #[error("KVM_IOEVENTFD at MMIO {addr:#x} failed: {source}")]
    Ioeventfd {
        /// The address.
        addr: u64,
        /// KVM's error.
        source: kvm_ioctls::Error,
    },
    /// `KVM_CREATE_VCPU` failed.
    #[error("KVM_CREATE_VCPU {index} failed: {source}")]
    CreateVcpu {
        /// vCPU index.
        index: u8,
        /// KVM's error.
        source: kvm_ioctls::Error,
    },
}

/// One memslot: guest physical range backed by host virtual memory (and
/// for guest_memfd memory, by a range of its file).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemorySlot<'m> {
    /// Guest physical address.
    pub guest_addr: u64,
    /// Size in bytes.
    pub size: u64,
    /// Host virtual address of the mapping.
    pub host_addr: u64,
    /// The guest_memfd behind it, registered with
    /// `KVM_SET_USER_MEMORY_REGION2` and `KVM_MEM_GUEST_MEMFD`.
    pub guest_memfd: Option<GmemBinding<'m>>,
    /// `KVM_MEM_LOG_DIRTY_PAGES`: KVM logs the pages the guest writes
    /// (`machine-config.track_dirty_pages`).
    pub dirty_log: bool,
}

/// `KVM_MEM_LOG_DIRTY_PAGES`.
pub const KVM_MEM_LOG_DIRTY_PAGES: u32 = 1;

/// `/dev/kvm`, opened once at start-up (before any seccomp filter), so that
/// the `start` job creates VMs from it and opens nothing read-write.
#[derive(Debug)]
pub struct KvmDevice(std::fs::File);

impl KvmDevice {
    /// Opens `/dev/kvm`.
    pub fn open() -> Result<KvmDevice, VmError> {
        let fd = Kvm::open_with_cloexec(true).map_err(VmError::OpenKvm)?;
        // SAFETY: `fd` was just opened for us and nothing else owns it.
        Ok(KvmDevice(unsafe {
            <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd)
        }))
    }

    /// What KVM offers for guest_memfd here (`KVM_CHECK_EXTENSION` on
    /// `/dev/kvm`; the fault [`GUEST_MEMFD_NO_MMAP`] hides the flags).
    pub fn guest_memfd_support(&self) -> GuestMemfdSupport {
        let Ok(kvm) = self.kvm() else {
            return GuestMemfdSupport::default();
        };
        let cap = |c: u32| kvm.check_extension_raw(u64::from(c));
        let mut flags = u64::try_from(cap(KVM_CAP_GUEST_MEMFD_FLAGS)).unwrap_or(0);
        if crate::faults::injected(GUEST_MEMFD_NO_MMAP) {
            flags = 0;
        }
        GuestMemfdSupport {
            user_memory2: cap(KVM_CAP_USER_MEMORY2) > 0,
            guest_memfd: cap(KVM_CAP_GUEST_MEMFD) > 0,
            flags,
        }
    }

    /// A `Kvm` of its own over a duplicate of the descriptor.
    pub(super) fn kvm(&self) -> Result<Kvm, VmError> {
        let dup = self.0.try_clone().map_err(|e| {
            VmError::OpenKvm(kvm_ioctls::Error::new(
                e.raw_os_error().unwrap_or(libc::EBADF),
            ))
        })?;
        let fd = std::os::fd::IntoRawFd::into_raw_fd(dup);
        // SAFETY: `fd` is a descriptor of /dev/kvm that we own and give to
        // the `Kvm`, which closes it.
        Ok(unsafe { <Kvm as std::os::fd::FromRawFd>::from_raw_fd(fd) })
    }
}

/// `KVM_REINJECT_CONTROL` (`_IO(KVMIO, 0x71)`, a pointer to
/// `kvm_reinject_control` as its argument).
pub const KVM_REINJECT_CONTROL: u64 = 0xae71;

/// The KVM VM.
pub struct Vm {
    kvm: Kvm,
    fd: VmFd,
    irqchip: bool,
    /// The thread that turns the PIT's tick reinjection off
    /// ([`Vm::setup_irqchip`]); joined before the VM fd closes.
    pit_reinject_off: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Vm {
    /// Joins the PIT thread first: it uses the VM fd, which closes only
    /// once this returns (the fields drop after it).
    fn drop(&mut self) {
        if let Some(thread) = self.pit_reinject_off.take() {
            let _ = thread.join();
        }
    }
}

impl Vm {
    /// Opens `/dev/kvm` and creates a VM (tests, tools).
    pub fn new() -> Result<Vm, VmError> {
        let kvm = Kvm::new().map_err(VmError::OpenKvm)?;
        let fd = kvm.create_vm().map_err(VmError::CreateVm)?;
        Ok(Vm {
            kvm,
            fd,
            irqchip: false,
            pit_reinject_off: None,
        })
    }

    /// Creates a VM on `/dev/kvm` opened already (the `start` job).
    pub fn create(device: &KvmDevice) -> Result<Vm, VmError> {
        let kvm = device.kvm()?;
        let fd = kvm.create_vm().map_err(VmError::CreateVm)?;
        Ok(Vm {
            kvm,
            fd,
            irqchip: false,
            pit_reinject_off: None,
        })
    }

    /// Whether `/dev/kvm` can be opened (tests and benchmarks skip without it).
    pub fn available() -> Result<(), VmError> {
        Kvm::new().map(|_| ()).map_err(VmError::OpenKvm)
    }

    /// Whether this host's KVM backs guest RAM with guest_memfd as teravm
    /// needs it (the same check a `guest_memfd` backing gets at PUT), or
    /// what it lacks, in words (tests say `NOT POSSIBLE HERE` with it).
    pub fn guest_memfd_available() -> Result<(), String> {
        KvmDevice::open()
            .map_err(|e| e.to_string())?
            .guest_memfd_support()
            .check()
    }

    /// Registers guest RAM, one memslot per mapping.
    ///
    /// # Safety
    ///
    /// Each slot's host range must be a mapping that stays valid until the VM
    /// is dropped or the mapping is unmapped (KVM follows an `munmap` through
    /// its MMU notifier, so unmapping first is sound; handing KVM memory that
    /// is later reused for something else is not).
    pub unsafe fn register_memory(&self, slots: &[MemorySlot]) -> Result<(), VmError> {
        let available = self.kvm.get_nr_memslots();
        if slots.len() > available {
            return Err(VmError::TooManyMemslots {
                needed: slots.len(),
                available,
            });
        }
        for (slot, s) in (0u32..).zip(slots) {
            // SAFETY: the caller's guarantee, for each slot.
            unsafe { set_region(&self.fd, slot, s) }?;
        }
        Ok(())
    }

    /// `KVM_GET_DIRTY_LOG` of memslot `slot` of `size` bytes: one bit per
    /// 4 KiB page written since the last call (tests; snapshots would use
    /// it, and the VMM thread's seccomp role does not allow it yet).
    pub fn dirty_log(&self, slot: u32, size: u64) -> Result<Vec<u64>, VmError> {
        self.fd
            .get_dirty_log(slot, size as usize)
            .map_err(VmError::DirtyLog)
    }

    /// The CPUID KVM supports on this host, handed to every vCPU.
    pub fn supported_cpuid(&self) -> Result<CpuId, VmError> {
        self.kvm
            .get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
            .map_err(VmError::SupportedCpuid)
    }

    /// Creates the in-kernel irqchip (PIC, IOAPIC, a LAPIC per vCPU) and the
    /// PIT, for a Linux guest. Must come before the vCPUs are created.
    ///
    /// The PIT is created with lost-tick reinjection on, and KVM turns it
    /// off again when it destroys the VM: two `synchronize_srcu` calls on
    /// the VM's irq SRCU, back to back, the second one a full grace period
    /// (measured here: 0.1 to 17 ms, asleep, in the middle of the serial
    /// VM close, at every shutdown of a guest with an irqchip). So a
    /// thread of its own (`pit`) turns reinjection off while the guest
    /// boots (`KVM_REINJECT_CONTROL`, QEMU's `lost_tick_policy=discard`: a
    /// late PIT tick is merged, as on hardware, instead of delivered
    /// again; Linux reads time from the TSC or the LAPIC timer once it has
    /// booted), and the close finds nothing to unregister. Its cost falls
    /// at shutdown only for a VM that lives less than one grace period.
    pub fn setup_irqchip(&mut self) -> Result<(), VmError> {
        if let Err(e) = self.fd.set_tss_address(KVM_TSS_ADDR) {
            // Only VMX needs it; PVM and SVM hosts may refuse it harmlessly.
            log::debug!("KVM_SET_TSS_ADDR: {e} (ignored)");
        }
        self.fd.create_irq_chip().map_err(VmError::CreateIrqchip)?;
        self.irqchip = true;
        let pit = kvm_pit_config {
            flags: KVM_PIT_SPEAKER_DUMMY,
            ..Default::default()
        };
        self.fd.create_pit2(pit).map_err(VmError::CreatePit)?;
        let fd = self.fd.as_raw_fd();
        let spawned = std::thread::Builder::new()
            .name("pit".into())
            .spawn(move || pit_reinject_off(fd));
        match spawned {
            Ok(thread) => self.pit_reinject_off = Some(thread),
            // Nothing lost but speed: the close unregisters it instead.
            Err(e) => log::debug!("no thread for KVM_REINJECT_CONTROL: {e}"),
        }
        Ok(())
    }

    /// Makes a write to `fd` raise interrupt line `gsi` (needs the irqchip).
    pub fn register_irqfd(&self, fd: &EventFd, gsi: u32) -> Result<(), VmError> {
        self.fd
            .register_irqfd(fd, gsi)
            .map_err(|source| VmError::Irqfd { gsi, source })
    }

    /// Registers `fd` to be written when the guest writes the 32-bit
    /// `datamatch` at MMIO address `addr` (a virtio queue notification),
    /// without an exit to teravm.
    pub fn register_mmio_ioevent(
        &self,
        fd: &EventFd,
        addr: u64,
        datamatch: u32,
    ) -> Result<(), VmError> {
        self.fd
            .register_ioevent(fd, &kvm_ioctls::IoEventAddress::Mmio(addr), datamatch)
            .map_err(|source| VmError::Ioeventfd { addr, source })
    }

    /// A handle that adds and removes memslots while the VM runs (a
    /// duplicate of the VM fd).
    pub fn memslots(&self) -> Result<Memslots, VmError> {
        // SAFETY: fcntl(F_DUPFD_CLOEXEC) on our own open fd; the new fd is
        // owned by the VmFd made from it below, and by nothing else.
        let dup = unsafe { libc::fcntl(self.fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 0) };
        if dup < 0 {
            return Err(VmError::DupVm(std::io::Error::last_os_error()));
        }
        // SAFETY: `dup` is a fresh fd of this VM that nothing else owns.
        unsafe { self.kvm.create_vmfd_from_rawfd(dup) }
            .map(|fd| Memslots { fd })
            .map_err(|e| {
                // SAFETY: no VmFd took it: ours to close.
                unsafe { libc::close(dup) };
                VmError::DupVm(std::io::Error::from_raw_os_error(e.errno()))
            })
    }

    /// How many memslots KVM takes in all.
    pub fn max_memslots(&self) -> usize {
        self.kvm.get_nr_memslots()
    }

    /// Whether the in-kernel irqchip was set up (irqfds need it).
    pub fn has_irqchip(&self) -> bool {
        self.irqchip
    }

    /// The `Kvm` the VM was made with (the snapshot's MSR list).
    pub(super) fn kvm_handle(&self) -> &Kvm {
        &self.kvm
    }

    /// The VM fd (the snapshot state's ioctls).
    pub(super) fn vm_fd(&self) -> &VmFd {
        &self.fd
    }

    /// Creates vCPU `index`.
    pub fn create_vcpu(&self, index: u8) -> Result<VcpuFd, VmError> {
        self.fd
            .create_vcpu(u64::from(index))
            .map_err(|source| VmError::CreateVcpu { index, source })
    }
}

/// Turns the PIT's lost-tick reinjection off on the VM `fd`
/// ([`Vm::setup_irqchip`] says why); a kernel that refuses it keeps it on.
fn pit_reinject_off(fd: std::os::fd::RawFd) {
    let control = kvm_bindings::kvm_reinject_control::default();
    // SAFETY: `fd` is the VM fd of the `Vm` that spawned this thread and
    // joins it in its `Drop`, before the fd closes; KVM_REINJECT_CONTROL
    // reads one `kvm_reinject_control`, which lives on this stack for the
    // call (all zeros: `pit_reinject` 0).
    let ret = unsafe { libc::ioctl(fd, KVM_REINJECT_CONTROL as _, &control) };
    if ret != 0 {
        log::debug!(
            "KVM_REINJECT_CONTROL: {} (the PIT keeps reinjecting)",
            std::io::Error::last_os_error()
        );
    }
}

impl GuestMemfdSource for Vm {
    /// `KVM_CREATE_GUEST_MEMFD` on the VM with [`GUEST_MEMFD_FLAGS`].
    fn create_guest_memfd(&self, len: u64) -> std::io::Result<std::fs::File> {
        let fd = self
            .fd
            .create_guest_memfd(kvm_create_guest_memfd {
                size: len,
                flags: GUEST_MEMFD_FLAGS,
                ..Default::default()
            })
            .map_err(|e| std::io::Error::from_raw_os_error(e.errno()))?;
        // SAFETY: `fd` was just returned by KVM for us and nothing else owns it.
        Ok(unsafe { std::fs::File::from_raw_fd(fd) })
    }
}

/// Registers memslot `slot` as `s` on `fd`.
///
/// # Safety
///
/// As [`Vm::register_memory`]: the host range must stay a live mapping for
/// as long as KVM may use it.
unsafe fn set_region(fd: &VmFd, slot: u32, s: &MemorySlot) -> Result<(), VmError> {
    let log = if s.dirty_log {
        KVM_MEM_LOG_DIRTY_PAGES
    } else {
        0
    };
    let (done, flags) = match s.guest_memfd {
        Some(file) => {
            let region = kvm_userspace_memory_region2 {
                slot,
                flags: KVM_MEM_GUEST_MEMFD | log,
                guest_phys_addr: s.guest_addr,
                memory_size: s.size,
                userspace_addr: s.host_addr,
                guest_memfd_offset: file.offset,
                guest_memfd: file.fd.as_raw_fd() as u32,
                ..Default::default()
            };
            // SAFETY: as below; the guest_memfd is borrowed from the
            // memory that owns it, and KVM takes the file's pages by
            // offset (the file pins the VM, not the other way round).
            (unsafe { fd.set_user_memory_region2(region) }, region.flags)
        }
        None => {
            let region = kvm_userspace_memory_region {
                slot,
                flags: log,
                guest_phys_addr: s.guest_addr,
                memory_size: s.size,
                userspace_addr: s.host_addr,
            };
            // SAFETY: the caller guarantees the host range is a live
            // mapping of `size` bytes for as long as KVM may use it.
            (unsafe { fd.set_user_memory_region(region) }, region.flags)
        }
    };
    done.map_err(|source| VmError::SetUserMemoryRegion {
        slot,
        guest_addr: s.guest_addr,
        size: s.size,
        source,
    })?;
    // What KVM took, from the flags it was given (the metrics' `memslots`).
    if s.size > 0 {
        MEMSLOTS_ADDED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if flags & KVM_MEM_LOG_DIRTY_PAGES != 0 {
            MEMSLOTS_DIRTY_LOG.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
    Ok(())
}

/// The VM's memslots for memory attached while it runs (the hotplug
/// region's, on a virtio-mem device's thread): a duplicate of the VM fd,
/// so dropping it is all a device needs to let go of the VM. Removing a
/// slot is safe (KVM stops using the range); adding one is not
/// ([`Memslots::add`]).
#[derive(Debug)]
pub struct Memslots {
    fd: VmFd,
}

impl Memslots {
    /// Registers memslot `slot` as `s` (`KVM_SET_USER_MEMORY_REGION`, or
    /// `..._REGION2` for guest_memfd).
    ///
    /// # Safety
    ///
    /// As [`Vm::register_memory`]: the host range must stay a live mapping
    /// until the slot is removed, the VM is dropped or the range unmapped.
    pub unsafe fn add(&self, slot: u32, s: &MemorySlot) -> Result<(), VmError> {
        // SAFETY: the caller's guarantee.
        unsafe { set_region(&self.fd, slot, s) }
    }

    /// Removes memslot `slot` (registered at `guest_addr`): afterwards a
    /// guest access there is an MMIO exit.
    pub fn remove(&self, slot: u32, guest_addr: u64) -> Result<(), VmError> {
        let region = kvm_userspace_memory_region {
            slot,
            flags: 0,
            guest_phys_addr: guest_addr,
            memory_size: 0,
            userspace_addr: 0,
        };
        // SAFETY: a size of 0 deletes the slot: KVM stops using its host
        // range and touches no memory of ours.
        unsafe { self.fd.set_user_memory_region(region) }.map_err(|source| {
            VmError::SetUserMemoryRegion {
                slot,
                guest_addr,
                size: 0,
                source,
            }
        })
    }
}
