//! `cpuid=<leaf>[.<subleaf>][,<leaf>[.<subleaf>]...]`: runs CPUID (which
//! works at CPL3) on vCPU 0 for each and prints
//! `cpuid <leaf>.<subleaf> eax=<hex> ebx=<hex> ecx=<hex> edx=<hex>`, the
//! numbers in hex without `0x`, 8 digits. Also `tick=<ms>`: print
//! `tick <n>` every `<ms>` ms by the guest's clock, forever (a guest whose
//! output visibly stops while the VM is paused).

use core::arch::x86_64::__cpuid_count;

use crate::say;

/// Most leaves one `cpuid=` word asks for.
pub const MAX_LEAVES: usize = 16;

/// The leaves asked for, in order.
pub type Leaves = [Option<(u32, u32)>; MAX_LEAVES];

fn number(s: &str) -> Option<u32> {
    match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u32::from_str_radix(hex, 16).ok(),
        None => s.parse().ok(),
    }
}

/// Parses the value of `cpuid=`; None when any part is not a number.
pub fn parse(value: &str) -> Option<Leaves> {
    let mut leaves: Leaves = [None; MAX_LEAVES];
    for (i, part) in value.split(',').enumerate() {
        let (leaf, sub) = part.split_once('.').unwrap_or((part, "0"));
        *leaves.get_mut(i)? = Some((number(leaf)?, number(sub)?));
    }
    Some(leaves)
}

/// Prints each leaf.
pub fn run(leaves: &Leaves) {
    for &(leaf, sub) in leaves.iter().flatten() {
        // CPUID is safe to call on x86_64 (no side effects).
        let r = __cpuid_count(leaf, sub);
        say!(
            "cpuid {:#x}.{:#x} eax={:08x} ebx={:08x} ecx={:08x} edx={:08x}",
            leaf,
            sub,
            r.eax,
            r.ebx,
            r.ecx,
            r.edx
        );
    }
}

/// Prints `tick <n>` every `ms` milliseconds, forever, calling `between`
/// while it waits (`verify-every=`'s poll).
pub fn tick(ms: u64, mut between: impl FnMut()) -> ! {
    let mut n = 0u64;
    let mut next = crate::io::now_ms();
    loop {
        while crate::io::now_ms() < next {
            between();
            core::hint::spin_loop();
        }
        say!("tick {}", n);
        n += 1;
        next += ms.max(1);
    }
}
