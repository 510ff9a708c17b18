//! Finding devices as Linux does: from the `virtio_mmio.device=` entries of
//! the command line, each probed through `virtio-drivers`' MMIO transport.

use core::ptr::NonNull;

use virtio_drivers::transport::mmio::{MmioTransport, VirtIOHeader};
use virtio_drivers::transport::{DeviceStatus, DeviceType, InterruptStatus, Transport};
use virtio_drivers::PhysAddr;
use zerocopy::{FromBytes, Immutable, IntoBytes};

use crate::cmdline::Options;

/// A found device: its transport and where it sits.
pub struct Found {
    /// The transport, ready for a driver's `new`.
    pub transport: MmioTransport<'static>,
    /// Its register window's guest address.
    pub base: u64,
    /// Its interrupt line, as the command line gave it.
    pub irq: u32,
}

/// The `n`-th (from 0) device of type `kind` on the command line.
pub fn find(options: &Options, kind: DeviceType, n: usize) -> Option<Found> {
    let mut seen = 0;
    for d in options.devices.iter().flatten() {
        let Some(header) = NonNull::new(d.addr as *mut VirtIOHeader) else {
            continue;
        };
        // SAFETY: the VMM said a virtio-mmio window of d.size bytes is at
        // d.addr; it is identity-mapped, uncached, and no other transport
        // for it is alive (each driver takes the one it was given, and a
        // probe that is not kept is dropped before the next).
        let Ok(transport) = (unsafe { MmioTransport::new(header, d.size as usize) }) else {
            continue;
        };
        if transport.device_type() != kind {
            continue;
        }
        if seen == n {
            return Some(Found {
                transport,
                base: d.addr,
                irq: d.irq,
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
}

/// A transport that sets the status bits one step at a time, as virtio
/// 1.2 3.1.1 orders them: `virtio-drivers`' `begin_init` writes
/// ACKNOWLEDGE | DRIVER in one go after the reset, and Firecracker takes
/// only the spec's steps (0 -> ACKNOWLEDGE -> | DRIVER -> | FEATURES_OK ->
/// | DRIVER_OK), ignoring that write ("invalid virtio driver status
/// transition: 0x0 -> 0x3"), so the device never came up there. QEMU and
/// teravm take either. Everything else is passed through.
pub struct Stepwise<T: Transport>(pub T);

impl<T: Transport> Transport for Stepwise<T> {
    fn device_type(&self) -> DeviceType {
        self.0.device_type()
    }
    fn read_device_features(&mut self) -> u64 {
        self.0.read_device_features()
    }
    fn write_driver_features(&mut self, driver_features: u64) {
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
        if status.contains(DeviceStatus::DRIVER)
            && !self.0.get_status().contains(DeviceStatus::ACKNOWLEDGE)
        {
            self.0.set_status(DeviceStatus::ACKNOWLEDGE);
        }
        self.0.set_status(status)
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
    fn queue_unset(&mut self, queue: u16) {
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
    fn read_config_space<V: FromBytes + IntoBytes>(
        &self,
        offset: usize,
    ) -> virtio_drivers::Result<V> {
        self.0.read_config_space(offset)
    }
    fn write_config_space<V: IntoBytes + Immutable>(
        &mut self,
        offset: usize,
        value: V,
    ) -> virtio_drivers::Result<()> {
        self.0.write_config_space(offset, value)
    }
}

/// What the drivers here are given: the MMIO transport, stepwise.
pub type Mmio = Stepwise<MmioTransport<'static>>;
