//! The two guest programs teravm's device tests drive (issue 25): the
//! built-in firmware (firmware/firmware.S, teravm's own drivers) and the
//! test guest (guest/, a PVH ELF driving the devices with `virtio-drivers`,
//! drivers nobody here wrote). Both print the same result words; the
//! firmware's lines begin `teravm firmware: `, the test guest's `teravm
//! guest: `, and where the firmware puts its name in data (the net hello
//! frame, the vsock greeting) the test guest puts its own.

/// Which guest a test boots.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Guest {
    /// teravm's built-in firmware (no kernel image).
    Firmware,
    /// The test guest, `target/<profile>/teravm-guest`, booted as a kernel
    /// (`boot-source.kernel_image_path`) through its PVH entry.
    TestGuest,
}

impl Guest {
    /// The name in its lines and data: `firmware` or `guest`.
    pub fn name(self) -> &'static str {
        match self {
            Guest::Firmware => "firmware",
            Guest::TestGuest => "guest",
        }
    }

    /// Its result line for `words` (`blk write ok` ...).
    pub fn line(self, words: &str) -> String {
        format!("teravm {}: {words}", self.name())
    }

    /// The `PUT /boot-source` body that boots it with `args`.
    pub fn boot_source(self, args: &str) -> String {
        match self {
            Guest::Firmware => format!(r#"{{"boot_args": "{args}"}}"#),
            Guest::TestGuest => format!(
                r#"{{"kernel_image_path": "{}", "boot_args": "{args}"}}"#,
                super::guest().display()
            ),
        }
    }

    /// The payload of its net hello frame.
    pub fn net_hello(self) -> String {
        format!("teravm {} net", self.name())
    }

    /// What `vsock=connect:<port>` sends.
    pub fn greeting(self) -> String {
        format!("hello from teravm {}\n", self.name())
    }
}

/// Declares `mod <test> { fn firmware; fn guest }`: the test function
/// `<test>(Guest)` run once with each guest.
#[macro_export]
macro_rules! both_guests {
    ($($test:ident),* $(,)?) => {$(
        mod $test {
            #[test]
            fn firmware() {
                super::$test($crate::common::guests::Guest::Firmware)
            }
            #[test]
            fn guest() {
                super::$test($crate::common::guests::Guest::TestGuest)
            }
        }
    )*};
}
