//! Booting a Linux kernel instead of the built-in firmware: the kernel and
//! initrd files ([`image`]), the zero page and e820 map ([`params`]), the MP
//! table that lists the vCPUs ([`mptable`]), CPUID with the vCPU topology
//! ([`cpuid`]), and each vCPU's CPL0 entry state ([`cpu`]).

pub mod image;
pub mod params;
