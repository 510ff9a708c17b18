//! The microVM's devices and the buses that reach them ([`bus`]). On the
//! port I/O bus: COM1 (vm-superio, [`serial`]), the i8042 reset line
//! ([`i8042`]), and teravm's own firmware ports ([`firmware_ports`]: clock,
//! park, error, wait for a device: [`wake`]). vCPU threads call the bus;
//! devices answer in place and may return a [`BusEvent`] for the vCPU loop
//! to act on (a reset request, a park, a firmware error). On the MMIO bus:
//! the [`virtio`] devices. The guest console's bytes leave through
//! [`console`]: a bounded buffer drained by the `console` thread, so no
//! device ever waits on the host.

pub mod bus;
pub mod console;
pub mod firmware_ports;
pub mod i8042;
pub mod serial;
pub mod virtio;
pub mod wake;

use std::sync::{Arc, Mutex};
use std::time::Instant;

pub use bus::{BusError, BusEvent, Buses, MmioBus, MmioDevice, MmioSlot, PioBus, PioDevice};
pub use console::{ConsoleBuffer, ConsoleOut, ConsoleSink, ConsoleStats, ConsoleWriter};
pub use firmware_ports::FirmwarePorts;
pub use i8042::I8042;
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
        firmware_ports::FW_PORTS_BASE,
        firmware_ports::FW_PORTS_LEN,
        Arc::new(Mutex::new(FirmwarePorts::new(boot))),
    )?;
    Ok(bus)
}
