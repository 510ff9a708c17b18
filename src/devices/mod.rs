//! Devices on the port I/O bus: COM1 (vm-superio), the i8042 reset line, and
//! teravm's own firmware ports (clock, park, error). vCPU threads call the
//! bus; devices answer in place and may return a [`BusEvent`] for the vCPU
//! loop to act on (a reset request, a park, a firmware error).

pub mod bus;
pub mod i8042;
pub mod ports;
pub mod serial;

pub use bus::{BusError, BusEvent, PioBus, PioDevice};
pub use i8042::I8042;
pub use ports::FirmwarePorts;
pub use serial::{SerialConsole, SerialOut};
