//! Devices on the port I/O bus: COM1 (vm-superio), the i8042 reset line, and
//! teravm's own firmware ports (clock, park, error, wait for a device:
//! [`wake`]). vCPU threads call the bus; devices answer in place and may return a [`BusEvent`] for the vCPU
//! loop to act on (a reset request, a park, a firmware error). The guest
//! console's bytes leave through [`console`]: a bounded buffer drained by the
//! `console` thread, so no device ever waits on the host.

pub mod bus;
pub mod console;
pub mod i8042;
pub mod mmio;
pub mod ports;
pub mod serial;
pub mod virtio;
pub mod wake;

use std::sync::{Arc, Mutex};
use std::time::Instant;

pub use bus::{BusError, BusEvent, PioBus, PioDevice};
pub use console::{ConsoleBuffer, ConsoleOut, ConsoleSink, ConsoleStats, ConsoleWriter};
pub use i8042::I8042;
pub use mmio::{MmioBus, MmioDevice, MmioSlot};
pub use ports::FirmwarePorts;
pub use serial::{SerialConsole, SerialIrq};
pub use wake::{WaitEnd, WakeHub};

/// The microVM's port I/O bus: COM1, the i8042 and the firmware's ports
/// (clock counting from `boot`). The callers keep handles to the devices
/// they talk to (the i8042 for Ctrl-Alt-Del, the serial console in tests).
pub fn microvm_bus<W: std::io::Write + Send + 'static>(
    serial: Arc<Mutex<SerialConsole<W>>>,
    i8042: Arc<Mutex<I8042>>,
    boot: Instant,
) -> Result<PioBus, BusError> {
    let mut bus = PioBus::new();
    bus.insert(serial::COM1_BASE, serial::COM1_LEN, serial)?;
    bus.insert(i8042::I8042_BASE, i8042::I8042_LEN, i8042)?;
    bus.insert(
        ports::FW_PORTS_BASE,
        ports::FW_PORTS_LEN,
        Arc::new(Mutex::new(FirmwarePorts::new(boot))),
    )?;
    Ok(bus)
}

/// The buses a vCPU's exits reach: port I/O and MMIO.
#[derive(Default)]
pub struct Buses {
    /// Port I/O: the serial port, the i8042, the firmware's ports.
    pub pio: PioBus,
    /// MMIO: the virtio-mmio devices.
    pub mmio: MmioBus,
}
