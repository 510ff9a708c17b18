//! Port I/O (allowed at CPL3: IOPL is 3), the serial console and the clock.

use core::arch::asm;
use core::fmt::{self, Write};
use core::sync::atomic::{AtomicU64, Ordering};

/// The first serial port (an 8250/16550 on every VMM here).
const COM1: u16 = 0x3f8;
/// i8042 command/status port: writing 0xfe pulses the reset line.
pub const I8042_CMD: u16 = 0x64;
/// teravm's park port (`out` blocks this vCPU until the VMM wakes it);
/// nothing is there on other VMMs, so the write returns at once.
pub const PORT_PARK: u16 = 0xf04;

/// teravm's wait port (`out` of slot | timeout ms << 16: the vCPU sleeps
/// until that virtio-mmio device interrupts); see [`wait_for`].
pub const PORT_WAIT: u16 = 0xf0c;
/// The first virtio-mmio window on teravm (and Firecracker): slot 0.
const MMIO_FIRST: u64 = 0xC000_1000;
/// The wait port's timeout in the guest's waits, ms.
pub const WAIT_MS: u16 = 100;
/// The timeout when a loop serves more than one device (the port names one).
pub const WAIT_SHARED_MS: u16 = 1;

/// Writes a u32 to `port`.
pub fn outl(port: u16, value: u32) {
    // SAFETY: as for `outb`.
    unsafe {
        asm!("out dx, eax", in("dx") port, in("eax") value, options(nomem, nostack, preserves_flags))
    }
}

/// Nothing to do until the virtio-mmio device at `base` signals: the
/// stand-in for `sti; hlt` of a Linux vCPU, which CPL3 cannot execute.
/// On teravm the `out` to [`PORT_WAIT`] puts the vCPU thread to sleep
/// until the device's InterruptStatus is non-zero, `ms` pass, or the VMM
/// stops, pauses or wakes the vCPU; then the status is acknowledged
/// (InterruptACK), as a Linux interrupt handler does, and the caller looks
/// at its rings again. On QEMU and the real Firecracker port 0xf0c is
/// unclaimed: the `out` does nothing and the caller's loop degrades to the
/// polling it always did (a window outside teravm's slots just spins).
pub fn wait_for(base: u64, ms: u16) {
    let slot = base.wrapping_sub(MMIO_FIRST) / 0x1000;
    if base < MMIO_FIRST || slot > 0xffff || !base.is_multiple_of(0x1000) {
        core::hint::spin_loop();
        return;
    }
    outl(PORT_WAIT, slot as u32 | u32::from(ms) << 16);
    let status = (base + 0x60) as *const u32;
    let ack = (base + 0x64) as *mut u32;
    // SAFETY: `base` is a virtio-mmio window the VMM named on the command
    // line, identity-mapped and uncached; InterruptStatus and InterruptACK
    // are plain 32-bit registers the drivers' transports never cache, so
    // acknowledging here does what `Transport::ack_interrupt` would.
    unsafe {
        let bits = core::ptr::read_volatile(status);
        if bits != 0 {
            core::ptr::write_volatile(ack, bits);
        }
        if bits & INT_CONFIG != 0 && slot < 64 {
            CONFIG_CHANGED.fetch_or(1 << slot, Ordering::SeqCst);
        }
    }
}

/// InterruptStatus: the device's configuration changed.
const INT_CONFIG: u32 = 1 << 1;

/// The slots (below 64) whose configuration change [`wait_for`]
/// acknowledged and no driver has taken yet ([`take_config_change`]), as
/// Linux's `vm_interrupt` hands a config change to the driver.
static CONFIG_CHANGED: AtomicU64 = AtomicU64::new(0);

/// Whether [`wait_for`] acknowledged a configuration change of the device
/// at `base` since the last call; forgets it.
pub fn take_config_change(base: u64) -> bool {
    let slot = base.wrapping_sub(MMIO_FIRST) / 0x1000;
    if base < MMIO_FIRST || slot >= 64 {
        return false;
    }
    CONFIG_CHANGED.fetch_and(!(1 << slot), Ordering::SeqCst) & 1 << slot != 0
}

/// Writes a byte to `port`.
pub fn outb(port: u16, value: u8) {
    // SAFETY: port I/O has no memory effects the compiler must know of;
    // IOPL 3 lets CPL3 do it.
    unsafe {
        asm!("out dx, al", in("dx") port, in("al") value, options(nomem, nostack, preserves_flags))
    }
}

/// Reads a byte from `port`.
pub fn inb(port: u16) -> u8 {
    let value: u8;
    // SAFETY: as for `outb`.
    unsafe {
        asm!("in al, dx", in("dx") port, out("al") value, options(nomem, nostack, preserves_flags))
    }
    value
}

/// A line being built, written to the console in one go when dropped, so
/// lines are whole whatever the formatting does.
pub struct Line {
    buf: [u8; 512],
    len: usize,
}

impl Line {
    /// An empty line.
    pub const fn new() -> Line {
        Line {
            buf: [0; 512],
            len: 0,
        }
    }

    /// What has been written so far.
    pub fn as_str(&self) -> &str {
        core::str::from_utf8(&self.buf[..self.len]).unwrap_or("?")
    }

    /// Writes the line and a newline to COM1.
    pub fn flush(&mut self) {
        for &b in &self.buf[..self.len] {
            outb(COM1, b);
        }
        outb(COM1, b'\n');
        self.len = 0;
    }
}

impl Default for Line {
    fn default() -> Line {
        Line::new()
    }
}

impl Write for Line {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        for &b in s.as_bytes() {
            if self.len < self.buf.len() {
                self.buf[self.len] = b;
                self.len += 1;
            }
        }
        Ok(())
    }
}

/// The prefix of every line the guest prints; the firmware's is
/// `teravm firmware: `, and the words after it are the same.
pub const PREFIX: &str = "teravm guest: ";

/// Prints one result line: the prefix, then the formatted words.
#[macro_export]
macro_rules! say {
    ($($arg:tt)*) => {{
        let mut line = $crate::io::Line::new();
        let _ = core::fmt::Write::write_str(&mut line, $crate::io::PREFIX);
        let _ = core::fmt::Write::write_fmt(&mut line, format_args!($($arg)*));
        line.flush();
    }};
}

/// The time-stamp counter.
pub fn rdtsc() -> u64 {
    let lo: u32;
    let hi: u32;
    // SAFETY: rdtsc only reads the counter (CR4.TSD is clear, so CPL3 may).
    unsafe { asm!("rdtsc", out("eax") lo, out("edx") hi, options(nomem, nostack, preserves_flags)) }
    (u64::from(hi) << 32) | u64::from(lo)
}

fn cpuid(leaf: u32) -> (u32, u32, u32, u32) {
    let r = core::arch::x86_64::__cpuid(leaf);
    (r.eax, r.ebx, r.ecx, r.edx)
}

static mut TSC_KHZ: u64 = 0;

/// The PIT's input clock, Hz.
const PIT_HZ: u64 = 1_193_182;
/// Channel 2's count: about 50 ms.
const PIT_COUNT: u64 = 59_659;

/// The TSC's kHz counted against the PIT's channel 2 (mode 0, gate on,
/// speaker off) until its output (port 0x61 bit 5) goes high; `None` when
/// it never does within about 4 G cycles (no PIT) or the count is absurd.
fn pit_tsc_khz() -> Option<u64> {
    let gate = inb(0x61);
    outb(0x61, (gate & !0x02) | 0x01);
    outb(0x43, 0xb0); // channel 2, low then high byte, mode 0, binary
    outb(0x42, PIT_COUNT as u8);
    outb(0x42, (PIT_COUNT >> 8) as u8);
    let t0 = rdtsc();
    let mut t1 = t0;
    while inb(0x61) & 0x20 == 0 {
        t1 = rdtsc();
        if t1.wrapping_sub(t0) > 1 << 32 {
            outb(0x61, gate);
            return None;
        }
    }
    outb(0x61, gate);
    let khz = t1.wrapping_sub(t0) * PIT_HZ / PIT_COUNT / 1000;
    // 100 MHz to 10 GHz, or it was no PIT.
    (100_000..=10_000_000).contains(&khz).then_some(khz)
}

/// Finds the TSC frequency: KVM's leaf 0x4000_0010 (EAX = kHz) where the
/// VMM gives it, then CPUID 0x15 (crystal ratio), then a count of the PIT's
/// channel 2 (as Linux's `pit_calibrate_tsc`: teravm, Firecracker and QEMU
/// all have KVM's PIT with its port 0x61), then 0x16 (base MHz), else 2 GHz
/// is assumed. Where CPUID at CPL3 runs on the host CPU (a PVM host without
/// CPUID faulting), the leaves are the host's: an AMD host has no 0x15, so
/// the PIT gives the rate that `blk-read=` and `rng=` times are read by.
pub fn init_clock() {
    let khz = (|| {
        let (max_hv, ..) = cpuid(0x4000_0000);
        if max_hv >= 0x4000_0010 {
            let (k, ..) = cpuid(0x4000_0010);
            if k != 0 {
                return u64::from(k);
            }
        }
        let (max, ..) = cpuid(0);
        if max >= 0x15 {
            let (den, num, crystal, _) = cpuid(0x15);
            if den != 0 && num != 0 && crystal != 0 {
                return u64::from(crystal) * u64::from(num) / u64::from(den) / 1000;
            }
        }
        if let Some(k) = pit_tsc_khz() {
            return k;
        }
        if max >= 0x16 {
            let (mhz, ..) = cpuid(0x16);
            if mhz != 0 {
                return u64::from(mhz) * 1000;
            }
        }
        2_000_000
    })();
    // SAFETY: written once, before anything reads it; the guest runs on
    // one vCPU.
    unsafe { TSC_KHZ = khz }
}

/// Milliseconds since an arbitrary point (the TSC's zero).
pub fn now_ms() -> u64 {
    // SAFETY: read after `init_clock` on the one vCPU that runs.
    let khz = unsafe { TSC_KHZ }.max(1);
    rdtsc() / khz
}

/// A deadline `ms` from now.
pub struct Deadline(u64);

impl Deadline {
    /// `ms` milliseconds from now.
    pub fn after_ms(ms: u64) -> Deadline {
        Deadline(now_ms() + ms)
    }

    /// Whether it has passed.
    pub fn passed(&self) -> bool {
        now_ms() >= self.0
    }
}

/// Whether the i8042 holds a byte (a Ctrl-Alt-Del from the VMM). Where
/// there is no i8042 (QEMU microvm) the port reads 0xff, which is not a
/// byte waiting: without this check the serve loop reset the guest within
/// its first 4096 rounds there.
pub fn ctrl_alt_del() -> bool {
    let s = inb(I8042_CMD);
    s != 0xff && s & 1 != 0
}

/// Asks for a reset the way Linux's `reboot=k` does (the i8042 reset line),
/// then, where nothing stopped the vCPU within a second (no i8042: QEMU
/// microvm without one), triple-faults: there is no IDT. Faulting at once
/// raced the VMM's handling of the reset: Firecracker then sometimes saw
/// the triple fault first and exited 1.
pub fn reset() -> ! {
    outb(I8042_CMD, 0xfe);
    let give_up = Deadline::after_ms(1000);
    while !give_up.passed() {
        core::hint::spin_loop();
    }
    // SAFETY: ud2 raises #UD; with no IDT that is a triple fault, which is
    // what is wanted: the VM stops.
    unsafe { asm!("ud2", options(noreturn)) }
}
