//! Finding devices as Linux does: from the `virtio_mmio.device=` entries of
//! the command line, each probed through `virtio-drivers`' MMIO transport.

use core::ptr::NonNull;

use virtio_drivers::transport::mmio::{MmioTransport, VirtIOHeader};
use virtio_drivers::transport::{DeviceStatus, DeviceType, InterruptStatus, Transport};
use virtio_drivers::{PhysAddr, Result};
use zerocopy::{FromBytes, Immutable, IntoBytes};

use crate::cmdline::Options;

/// The transport every driver here gets.
pub type GuestTransport = Stepwise<MmioTransport<'static>>;

/// A found device: its transport and where it sits.
pub struct Found {
    /// The transport, ready for a driver's `new`.
    pub transport: GuestTransport,
    /// Its register window's guest address.
    pub base: u64,
}

/// The `n`-th (from 0) device of type `kind` on the command line.
pub fn find(options: &Options, kind: DeviceType, n: usize) -> Option<Found> {
    let mut seen = 0;
    for d in options.devices.iter().flatten() {
        let Some(header) = NonNull::new(d.addr as *mut VirtIOHeader) else {
            continue;
        };
        // SAFETY: the VMM said a virtio-mmio window of d.size bytes is at
        // d.addr; it is identity-mapped, uncached, and a probe that is not
        // kept is gone before the next (forgotten below: it only reads).
        let Ok(transport) = (unsafe { MmioTransport::new(header, d.size as usize) }) else {
            continue;
        };
        if transport.device_type() != kind {
            // Not dropped: the crate's `Drop` resets the device, which may
            // be one another driver here still drives (a `blk-watch`
            // drive, found before the vsock is looked for). Linux's probe
            // of one driver leaves the other devices alone too.
            core::mem::forget(transport);
            continue;
        }
        if seen == n {
            return Some(Found {
                transport: Stepwise(transport),
                base: d.addr,
            });
        }
        seen += 1;
    }
    None
}

/// The words the firmware prints for a driver's error.
pub fn status(e: virtio_drivers::Error) -> &'static str {
    match e {
        virtio_drivers::Error::IoError => "ioerr",
        virtio_drivers::Error::Unsupported => "unsupp",
        virtio_drivers::Error::NotReady => "not ready",
        virtio_drivers::Error::QueueFull => "queue full",
        virtio_drivers::Error::AlreadyUsed => "queue in use",
        virtio_drivers::Error::DmaError => "out of DMA memory",
        virtio_drivers::Error::ConfigSpaceTooSmall | virtio_drivers::Error::ConfigSpaceMissing => {
            "config space too small"
        }
        _ => "driver error",
    }
}

/// What a device left serving does each round of the serve loop.
pub trait Serve {
    /// Handles what is pending; returns false once the device is given up.
    fn poll(&mut self) -> bool;
    /// The device's MMIO window, which the serve loop waits on
    /// ([`crate::io::wait_for`]) between rounds.
    fn base(&self) -> u64;
}

static mut ACCEPTED: u64 = 0;

/// The features the last driver set up accepted (what it wrote to
/// DriverFeatures), for the `<name> device at 0x<base> features 0x<accepted>`
/// line the firmware prints too: the crate's drivers keep theirs private.
pub fn accepted_features() -> u64 {
    // SAFETY: the guest runs on one vCPU; written only by the transport.
    unsafe { ACCEPTED }
}

/// A transport that sets the device status one bit at a time, in the
/// spec's order (virtio 1.2, 3.1.1: ACKNOWLEDGE, then DRIVER, then
/// FEATURES_OK, then DRIVER_OK), as Linux does.
///
/// `virtio-drivers` 0.13 writes ACKNOWLEDGE | DRIVER in one write after the
/// reset. QEMU and teravm take it; Firecracker refuses the transition
/// 0 -> 3 ("invalid virtio driver status transition"), and then every
/// later step, so the device never starts. The spec orders the driver's
/// steps and does not say how many writes they take, so neither side is
/// plainly wrong; this shim is the one place the guest changes what the
/// crate does, and only in how the same bits reach the register.
pub struct Stepwise<T>(pub T);

impl<T: Transport> Transport for Stepwise<T> {
    fn device_type(&self) -> DeviceType {
        self.0.device_type()
    }
    fn read_device_features(&mut self) -> u64 {
        self.0.read_device_features()
    }
    fn write_driver_features(&mut self, driver_features: u64) {
        // SAFETY: one vCPU; see `accepted_features`.
        unsafe { ACCEPTED = driver_features };
        self.0.write_driver_features(driver_features)
    }
    fn max_queue_size(&mut self, queue: u16) -> u32 {
        self.0.max_queue_size(queue)
    }
    fn notify(&mut self, queue: u16) {
        self.0.notify(queue)
    }
    fn get_status(&self) -> DeviceStatus {
        self.0.get_status()
    }
    fn set_status(&mut self, status: DeviceStatus) {
        if status.is_empty() {
            return self.0.set_status(status);
        }
        let mut now = self.0.get_status() & status;
        for bit in [
            DeviceStatus::ACKNOWLEDGE,
            DeviceStatus::DRIVER,
            DeviceStatus::FEATURES_OK,
            DeviceStatus::DRIVER_OK,
        ] {
            if status.contains(bit) && !now.contains(bit) {
                now |= bit;
                self.0.set_status(now);
            }
        }
        if now != status {
            self.0.set_status(status);
        }
    }
    fn set_guest_page_size(&mut self, guest_page_size: u32) {
        self.0.set_guest_page_size(guest_page_size)
    }
    fn requires_legacy_layout(&self) -> bool {
        self.0.requires_legacy_layout()
    }
    fn queue_set(
        &mut self,
        queue: u16,
        size: u32,
        descriptors: PhysAddr,
        driver_area: PhysAddr,
        device_area: PhysAddr,
    ) {
        self.0
            .queue_set(queue, size, descriptors, driver_area, device_area)
    }
    /// The crate calls this only from its drivers' `Drop`, to give the
    /// device up: it writes QueueReady 0 and spins until it reads 0 back
    /// (virtio 1.2, 4.2.2.2). Firecracker ignores queue registers once
    /// DRIVER_OK is set, so QueueReady stays 1 and the spin never ends. A
    /// driver giving a device up resets it (as Linux's `virtio_dev_remove`
    /// does); after a reset QueueReady reads 0 everywhere.
    fn queue_unset(&mut self, queue: u16) {
        self.0.set_status(DeviceStatus::empty());
        self.0.queue_unset(queue)
    }
    fn queue_used(&mut self, queue: u16) -> bool {
        self.0.queue_used(queue)
    }
    fn ack_interrupt(&mut self) -> InterruptStatus {
        self.0.ack_interrupt()
    }
    fn read_config_generation(&self) -> u32 {
        self.0.read_config_generation()
    }
    fn read_config_space<V: FromBytes + IntoBytes>(&self, offset: usize) -> Result<V> {
        self.0.read_config_space(offset)
    }
    fn write_config_space<V: IntoBytes + Immutable>(
        &mut self,
        offset: usize,
        value: V,
    ) -> Result<()> {
        self.0.write_config_space(offset, value)
    }
}
