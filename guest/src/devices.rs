//! Finding devices as Linux does: from the `virtio_mmio.device=` entries of
//! the command line, each probed through `virtio-drivers`' MMIO transport.

use core::ptr::NonNull;

use virtio_drivers::transport::mmio::{MmioTransport, VirtIOHeader};
use virtio_drivers::transport::{DeviceType, Transport};

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
