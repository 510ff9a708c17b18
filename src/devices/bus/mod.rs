//! The two buses a vCPU's exits reach ([`Buses`]): port I/O ([`pio`]: COM1,
//! the i8042, the firmware's ports) and MMIO ([`mmio`]: the virtio-mmio
//! devices, one 4 KiB window and one GSI each). vCPU threads call them from
//! their exits; the devices answer in place, under their own locks.

pub mod mmio;
pub mod pio;

pub use mmio::{MmioBus, MmioBusError, MmioDevice, MmioSlot};
pub use pio::{BusError, BusEvent, PioBus, PioDevice};

/// The buses a vCPU's exits reach: port I/O and MMIO.
#[derive(Default)]
pub struct Buses {
    /// Port I/O: the serial port, the i8042, the firmware's ports.
    pub pio: PioBus,
    /// MMIO: the virtio-mmio devices.
    pub mmio: MmioBus,
}
