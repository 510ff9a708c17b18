//! teravm's test guest: one ELF that teravm, QEMU (`-M microvm`) and
//! Firecracker boot through the PVH entry, which drives their virtio-mmio
//! devices with drivers nobody here wrote (the `virtio-drivers` crate; the
//! balloon, which the crate lacks, with a driver of its own written from
//! the virtio spec) and prints the same result words as teravm's built-in
//! firmware, with the prefix `teravm guest: `.
//!
//! It leaves CPL0 at once ([`boot`]) and works at CPL3 on vCPU 0, polling
//! (no interrupts), as the firmware does. Command line words (unknown words
//! are ignored, as the firmware ignores them):
//!   touch=<MiB>|all      dirty that much RAM, one write per 4 KiB page
//!   then=idle|reset      afterwards: serve/park, or reset (i8042, else a
//!                        triple fault)
//!   balloon, report=<MiB> the virtio-balloon (see `balloon.rs`)
//!   blk                  drive the first virtio-blk once (see `blk.rs`)
//!   blk-read=<MiB>       read that much from it in 64 KiB requests, timed
//!   blk-dev=<n>          the blk words drive the n-th virtio-blk (from 0)
//!   blk-watch            read sector 0, then again on each config change
//!                        (a replaced backing file; see `blk.rs`)
//!   vsock=echo:<port> | vsock=connect:<port>   the first virtio-vsock
//!   net=echo             send a frame on the first virtio-net, echo frames
//!   mmds=<path> [mmds-addr=<a.b.c.d>] [mmds-ip=<a.b.c.d>]   fetch <path>
//!                        from the MMDS over the first virtio-net (mmds.rs);
//!                        mmds-no-token: no PUT /latest/api/token first;
//!                        mmds-watch: then GET it again until it changes
//!   cpuid=<leaf>[.<sub>],...   print those CPUID leaves (see `cpuid.rs`)
//!   tick=<ms>            print `tick <n>` every <ms> ms, forever
//!   net-send=<N>x<bytes> after the hello, N frames of that size
//!   rng=<bytes>          read that many bytes from the first virtio-rng;
//!                        rng-dump: then print them all (rng.rs)
//!   vmem-hostile         hostile requests to the first virtio-mem (vmem.rs)
//!   bcheck-linux-reset   balloon: reset as Linux does, reuse at once
//!   balloon-no-tell      balloon without MUST_TELL_HOST: deflate, reuse
//!   vmem-touch-unplugged plug what the host asks, unplug it when asked
//!                        for 0, and touch it at once after the answer
//!   touch-check          at the end, re-read what `touch=` wrote: prints
//!                        `touch check <bad> bad of <pages> pages`
//!   verify-every=<ms>    after `touch=`, every <ms> ms (1 or more),
//!                        forever, re-read every page `touch=` wrote and
//!                        print `verify <N> MiB ok` or `verify <N> MiB bad
//!                        at 0x<guest address>` (the first bad page; N the
//!                        MiB read), between ticks and device polls
//!                        (verify.rs)
//!   mem-blk              plug 2 MiB of the first virtio-mem, read the first
//!                        drive's sector 0 into it (vmem.rs)
//!   virtio_mmio.device=<size>@<addr>:<irq>     where the devices are
//! Devices are driven in the order balloon, blk, vsock, net, as the
//! firmware drives them.

#![no_std]
#![no_main]

extern crate alloc;

mod alloc_heap;
mod balloon;
mod blk;
mod boot;
mod cmdline;
mod cpuid;
mod devices;
mod hal;
mod io;
mod libc;
mod mem;
mod mmds;
mod net;
mod rng;
mod verify;
mod vmem;
mod vsock;

use alloc::boxed::Box;
use alloc::vec::Vec;

use cmdline::{Options, Touch};
use devices::Serve;

#[panic_handler]
fn panic(info: &core::panic::PanicInfo) -> ! {
    say!("panic: {}", info);
    io::reset()
}

/// core is built with unwinding tables that name this symbol; with
/// `panic = "abort"` nothing ever calls it.
#[no_mangle]
pub extern "C" fn rust_eh_personality() {}

/// Entered at CPL3 from [`boot`] with the `hvm_start_info` address.
#[no_mangle]
pub extern "C" fn guest_main(start_info: u32) -> ! {
    io::init_clock();
    let Some(info) = mem::boot_info(u64::from(start_info)) else {
        say!("error no hvm_start_info at {:#x}", start_info);
        io::reset()
    };
    let options = Options::parse(info.cmdline);
    say!("mem_mib={} pvh", info.ram_mib());
    if let Some(word) = options.bad {
        say!("bad command line ({})", word);
    }
    // HOOK cpuid: `cpuid=` (cpuid.rs).
    if let Some(leaves) = &options.cpuid {
        cpuid::run(leaves);
    }
    let mapped = mem::map_high(&info);
    let mut touched_bytes = 0;
    if let Some(touch) = options.touch {
        let want = match touch {
            Touch::All => u64::MAX,
            Touch::Mib(m) => m << 20,
        };
        let t0 = io::now_ms();
        touched_bytes = mem::touch(&info, mapped, want);
        say!(
            "touched {} MiB in {} ms",
            touched_bytes >> 20,
            io::now_ms() - t0
        );
    }
    // HOOK verify: `verify-every=<ms>`, its period from here (verify.rs);
    // polled between ticks and in the serve loop.
    let mut verify = options
        .verify_every_ms
        .map(|ms| verify::Verify::new(&info, mapped, touched_bytes, ms));
    // HOOK tick: `tick=<ms>`, after `touch=`, forever (cpuid.rs).
    if let Some(ms) = options.tick_ms {
        cpuid::tick(ms, || verify::poll(&mut verify));
    }
    let touched = touched_bytes;
    let mut serving: Vec<Box<dyn Serve>> = Vec::new();
    // HOOK balloon: `balloon` / `report=` (balloon.rs); with then=reset it
    // follows num_pages once; else it is pushed onto `serving`.
    balloon::hook(&options, &info, mapped, touched, &mut serving);
    // HOOK blk: `blk` / `blk-read=<MiB>` / `blk-watch` (blk.rs); the
    // watch is served.
    if options.blk || options.blk_read_mib.is_some() || options.blk_watch {
        serving.extend(blk::run(&options));
    }
    // HOOK vsock: `vsock=echo:<port>` / `vsock=connect:<port>` (vsock.rs).
    if options.vsock.is_some() {
        serving.extend(vsock::start(&options));
    }
    // HOOK mmds: `mmds=<path>` (mmds.rs), before `net=echo` (one device).
    if let Some(path) = &options.mmds {
        mmds::run(&options, path);
    } else if options.net_echo || options.net_send.is_some() {
        // HOOK net: `net=echo` (net.rs).
        serving.extend(net::start(&options));
    }
    // HOOK rng: `rng=<bytes>` (rng.rs).
    if let Some(n) = options.rng {
        rng::run(&options, n);
    }
    // HOOK vmem: `vmem-hostile` (vmem.rs).
    if options.vmem_hostile {
        vmem::run(&options);
    }
    if options.mem_blk {
        vmem::mem_blk(&options);
    }
    if options.vmem_touch_unplugged {
        vmem::touch_unplugged(&options);
    }
    // `touch-check`: what `touch=` wrote is all still there.
    if options.touch_check {
        let check = mem::check_touched(&info, mapped, touched_bytes);
        say!("touch check {} bad of {} pages", check.bad, check.pages);
    }
    if options.reset {
        say!("reset");
        io::reset();
    }
    say!("idle");
    serve(serving.as_mut_slice(), &mut verify)
}

/// Serves what is left (echoes, the balloon) until each is given up, and
/// watches for a Ctrl-Alt-Del; then parks. With `verify-every=` it
/// verifies when due, waits on a device no longer than that, and spins
/// where it would park.
fn serve(devices: &mut [Box<dyn Serve>], verify: &mut Option<verify::Verify<'_>>) -> ! {
    let mut live: Vec<bool> = devices.iter().map(|_| true).collect();
    loop {
        verify::poll(verify);
        for (d, alive) in devices.iter_mut().zip(live.iter_mut()) {
            if *alive {
                *alive = d.poll();
            }
        }
        if io::ctrl_alt_del() {
            say!("reset");
            io::reset();
        }
        // Asleep until the device signals (teravm; a spin elsewhere): with
        // one device left the whole wait, with more a short one on the
        // first (the port names one device).
        let mut left = devices.iter().zip(&live).filter(|(_, &a)| a);
        if let Some((first, _)) = left.next() {
            let mut ms = if left.next().is_some() {
                io::WAIT_SHARED_MS
            } else {
                io::WAIT_MS
            };
            if let Some(v) = verify {
                ms = ms.min(u16::try_from(v.due_in_ms()).unwrap_or(u16::MAX));
            }
            // 0 would be the port's default: a verify is due, no wait.
            if ms > 0 {
                io::wait_for(first.base(), ms);
            }
        }
        if !live.iter().any(|&a| a) {
            if let Some(v) = verify {
                // Parked, no verify would come: spin to it instead,
                // looking for a Ctrl-Alt-Del every 10 ms.
                let until = io::Deadline::after_ms(v.due_in_ms().min(10));
                while !until.passed() {
                    core::hint::spin_loop();
                }
                continue;
            }
            // teravm blocks the vCPU here until it has something for it
            // (a Ctrl-Alt-Del); elsewhere the write returns at once.
            io::outb(io::PORT_PARK, 0);
            if io::ctrl_alt_del() {
                say!("reset");
                io::reset();
            }
            core::hint::spin_loop();
        }
    }
}
