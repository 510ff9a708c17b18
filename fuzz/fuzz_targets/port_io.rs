//! The port I/O bus a guest reaches (`teravm::devices::microvm_bus`: COM1,
//! the i8042, the firmware ports) driven by an arbitrary sequence of `in`
//! and `out` of 1, 2 or 4 bytes at arbitrary ports, as vCPUs would: never
//! panics, a read fills exactly the bytes asked for and no more, and a port
//! just past a device's range (claimed by no device) reads all ones.
//!
//! Each access takes 4 input bytes: `op` (bit 0: write; bits 1-2: size
//! 1/2/4/1; bits 3-4: port near COM1, the i8042, the firmware ports, or
//! anywhere), two bytes of port (an offset within the device's range, or a
//! whole port number), and one byte of data, repeated to the size.
#![no_main]

use std::sync::{Arc, Mutex};
use std::time::Instant;

use libfuzzer_sys::fuzz_target;
use teravm::devices::{firmware_ports, i8042, microvm_bus, serial, BusEvent, SerialConsole, I8042};

fuzz_target!(|data: &[u8]| {
    let console = Arc::new(Mutex::new(SerialConsole::new(Vec::<u8>::new())));
    let i8042 = Arc::new(Mutex::new(I8042::new()));
    let bus = microvm_bus(console, i8042, Instant::now()).expect("the microVM bus builds");
    for access in data.chunks_exact(4) {
        let (op, raw_port, byte) = (
            access[0],
            u16::from_le_bytes([access[1], access[2]]),
            access[3],
        );
        let size = [1usize, 2, 4, 1][usize::from((op >> 1) & 3)];
        let (port, claimed) = match (op >> 3) & 3 {
            0 => (
                serial::COM1_BASE + raw_port % (serial::COM1_LEN + 2),
                raw_port % (serial::COM1_LEN + 2) < serial::COM1_LEN,
            ),
            1 => (
                i8042::I8042_BASE + raw_port % (i8042::I8042_LEN + 2),
                raw_port % (i8042::I8042_LEN + 2) < i8042::I8042_LEN,
            ),
            2 => (
                firmware_ports::FW_PORTS_BASE + raw_port % (firmware_ports::FW_PORTS_LEN + 2),
                raw_port % (firmware_ports::FW_PORTS_LEN + 2) < firmware_ports::FW_PORTS_LEN,
            ),
            _ => (raw_port, true), // anywhere: claimed or not, unknown here
        };
        if op & 1 == 1 {
            let bytes = [byte; 4];
            // Any event (reset, park, firmware error) is the vCPU loop's to act on.
            let _: Option<BusEvent> = bus.write(port, &bytes[..size]);
        } else {
            let mut buf = [0x5au8; 5];
            bus.read(port, &mut buf[..size]);
            assert_eq!(
                buf[size..],
                [0x5au8; 5][size..],
                "a read of {size} at {port:#x} wrote past its bytes"
            );
            if !claimed {
                assert!(
                    buf[..size].iter().all(|&b| b == 0xff),
                    "unclaimed {port:#x} read {:?}",
                    &buf[..size]
                );
            }
        }
    }
});
