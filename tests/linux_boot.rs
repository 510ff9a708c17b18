//! Boots the stock Debian cloud kernel that `scripts/fetch-kernel.sh` caches
//! (ELF vmlinux and bzImage) on the real binary and real /dev/kvm, and checks
//! what it prints on teravm's console: `Linux version`, the command line it
//! received, the e820 map (which must be teravm's guest map) and the initrd
//! placement; then SIGTERM ends it cleanly (exit 0, memory reclaimed). The
//! vmlinux has a PVH note, so teravm enters it there (`tests/pvh_boot.rs`);
//! the bzImage through the Linux 64-bit protocol.
//!
//! On this project's PVM hosts guest CPL0 is emulated, so the kernel gets no
//! further than its early setup within a test's bound; each test waits only
//! for lines the kernel prints in its first seconds. Skipped, with the
//! reason, when the kernel was not fetched or /dev/kvm is missing.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{config_file, kvm_or_skip, skip, temp_dir, Vmm};

/// Bound of each wait for the kernel's early lines.
const EARLY: Duration = Duration::from_secs(60);
/// Bound of the wait for the first line: before it the kernel clears its
/// BSS and sets up paging, all emulated on PVM; measured 13 s on an idle
/// host and 75 s on a shared one with another guest running.
const FIRST_LINE: Duration = Duration::from_secs(180);
const MEM_MIB: u64 = 256;

/// The e820 map a 256 MiB guest must get, as Linux prints it, written out
/// here rather than computed with teravm's own functions: low RAM up to the
/// EBDA, the EBDA and BIOS area reserved, RAM from 1 MiB to 256 MiB, and the
/// MMIO hole from 3 GiB to 4 GiB reserved.
const E820_256_MIB: [&str; 4] = [
    "BIOS-e820: [mem 0x0000000000000000-0x000000000009fbff] usable",
    "BIOS-e820: [mem 0x000000000009fc00-0x00000000000fffff] reserved",
    "BIOS-e820: [mem 0x0000000000100000-0x000000000fffffff] usable",
    "BIOS-e820: [mem 0x00000000c0000000-0x00000000ffffffff] reserved",
];

/// Firecracker's default kernel command line as teravm adapts it
/// (docs/linux.md), written out.
const DEFAULT_CMDLINE: &str = "console=ttyS0 reboot=k panic=1 pci=off nomodule \
    i8042.noaux i8042.nomux i8042.nopnp i8042.dumbkbd";

/// The cached kernel file `name` (`vmlinux` or `vmlinuz`), or a printed skip.
fn kernel_or_skip(test: &str, name: &str) -> Option<PathBuf> {
    if !kvm_or_skip(test) {
        return None;
    }
    let dir = std::env::var_os("TERAVM_KERNEL_DIR")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("XDG_CACHE_HOME").map(|d| PathBuf::from(d).join("teravm-kernel"))
        })
        .or_else(|| {
            std::env::var_os("HOME").map(|d| PathBuf::from(d).join(".cache/teravm-kernel"))
        });
    let Some(dir) = dir else {
        // Not a silent pass: said, and a failure in CI.
        skip(
            test,
            "no kernel cache directory (TERAVM_KERNEL_DIR, XDG_CACHE_HOME and HOME are unset)",
        );
        return None;
    };
    let path = dir.join(name);
    if path.is_file() {
        Some(path)
    } else {
        skip(
            test,
            format!(
                "no kernel at {} (run scripts/fetch-kernel.sh)",
                path.display()
            ),
        );
        None
    }
}

fn config(kernel: &Path, initrd: Option<&Path>, args: &str) -> String {
    let initrd = initrd.map_or(String::new(), |p| {
        format!(r#""initrd_path": "{}","#, p.display())
    });
    format!(
        r#"{{"machine-config": {{"vcpu_count": 1, "mem_size_mib": {MEM_MIB}}},
            "boot-source": {{"kernel_image_path": "{}", {initrd} "boot_args": "{args}"}}}}"#,
        kernel.display()
    )
}

/// SIGTERM, then exit 0 with the summary (on stdout or stderr).
fn sigterm_ends_cleanly(vmm: Vmm) -> (Vec<String>, String) {
    vmm.signal(libc::SIGTERM);
    let (code, stdout, stderr) = vmm.wait(Duration::from_secs(30));
    assert_eq!(code, 0, "stderr: {stderr}");
    let all = stdout.join("\n") + &stderr;
    assert!(all.contains("teravm: reclaimed "), "no summary: {all}");
    (stdout, stderr)
}

#[test]
fn elf_vmlinux_prints_its_version_cmdline_e820_and_initrd() {
    let Some(kernel) = kernel_or_skip("elf_vmlinux", "vmlinux") else {
        return;
    };
    let _one_kernel_at_a_time = common::big_memory();
    let dir = temp_dir("linux-elf");
    let initrd = dir.join("initrd");
    std::fs::write(&initrd, vec![0u8; 1 << 20]).unwrap();
    let args = "console=ttyS0 earlyprintk=serial reboot=k panic=1 pci=off nomodule";
    let cfg = config_file(&dir, &config(&kernel, Some(initrd.as_path()), args));
    let mut vmm = Vmm::spawn(&[
        "--no-api",
        "--log-level",
        "info",
        "--config-file",
        cfg.to_str().unwrap(),
    ]);

    let version = vmm.wait_line("Linux version", FIRST_LINE);
    assert!(version.contains("Linux version 6."), "{version}");
    let cmdline = vmm.wait_line("Command line:", EARLY);
    assert!(
        cmdline.ends_with(&format!("Command line: {args}")),
        "{cmdline}"
    );

    // The e820 map the kernel received is the guest map, entry by entry.
    for entry in E820_256_MIB {
        let line = vmm.wait_line("BIOS-e820:", EARLY);
        assert!(line.ends_with(entry), "{line} != {entry}");
    }
    // The initrd is placed as high as the first RAM region allows.
    let top = MEM_MIB << 20;
    let ramdisk = vmm.wait_line("RAMDISK:", EARLY);
    assert!(
        ramdisk.ends_with(&format!(
            "RAMDISK: [mem {:#010x}-{:#010x}]",
            top - (1 << 20),
            top - 1
        )),
        "{ramdisk}"
    );
    let (_, stderr) = sigterm_ends_cleanly(vmm);
    // The stock vmlinux has a PVH note: all of the above came through the
    // PVH start info, not the zero page.
    assert!(stderr.contains("through the PVH entry"), "{stderr}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn default_cmdline_reaches_the_kernel() {
    let Some(kernel) = kernel_or_skip("default_cmdline", "vmlinux") else {
        return;
    };
    let _one_kernel_at_a_time = common::big_memory();
    let dir = temp_dir("linux-default");
    let cfg = config_file(&dir, &config(&kernel, None, ""));
    // Without earlyprintk the kernel prints nothing until its console
    // driver starts, far past what emulated CPL0 reaches here: read what the
    // kernel reads instead, in guest memory: the PVH start info and the
    // string its `cmdline_paddr` points at.
    let vmm = Vmm::spawn(&["--no-api", "--config-file", cfg.to_str().unwrap()]);
    wait_loaded(&vmm);
    let cmdline = guest_cmdline(vmm.child.id(), MEM_MIB << 20);
    assert_eq!(cmdline, DEFAULT_CMDLINE);
    sigterm_ends_cleanly(vmm);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// teravm `pid`'s memory (`/proc/pid/mem`) and the host address of its
/// lowest guest RAM: the largest read-write mapping of at most `ram_bytes`,
/// waited for (within [`EARLY`]) when teravm has not mapped it yet.
fn guest_ram(pid: u32, ram_bytes: u64) -> (std::fs::File, u64) {
    let deadline = std::time::Instant::now() + EARLY;
    loop {
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
        match lowest_ram(&maps, ram_bytes) {
            Some(base) => {
                let mem = std::fs::File::open(format!("/proc/{pid}/mem")).unwrap();
                return (mem, base);
            }
            None if std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            None => panic!("no guest RAM mapping in {maps}"),
        }
    }
}

/// The guest's low RAM in `maps`: the largest rw mapping of at least 64 MiB
/// and no bigger than the guest.
fn lowest_ram(maps: &str, ram_bytes: u64) -> Option<u64> {
    maps.lines()
        .filter_map(|l| {
            let (range, rest) = l.split_once(' ')?;
            let (a, b) = range.split_once('-')?;
            let (a, b) = (
                u64::from_str_radix(a, 16).ok()?,
                u64::from_str_radix(b, 16).ok()?,
            );
            (rest.starts_with("rw") && b - a <= ram_bytes && b - a >= 64 << 20)
                .then_some((b - a, a))
        })
        .max()
        .map(|(_, a)| a)
}

/// The kernel command line in the guest memory of teravm `pid` (whose
/// lowest guest RAM is the largest read-write mapping of at most
/// `ram_bytes`), found as the kernel finds it: the stock vmlinux has a PVH
/// note, so teravm enters it with an `hvm_start_info` (magic 0x336ec578,
/// version 1) whose memory map (`memmap_paddr` at 0x28, `memmap_entries`
/// at 0x30) is the 256 MiB guest's ([`E820_256_MIB`]: 0..0x9fc00 usable,
/// 0x9fc00..1 MiB reserved, ...); its `cmdline_paddr` (0x18) is the guest
/// address of the string.
fn guest_cmdline(pid: u32, ram_bytes: u64) -> String {
    use std::os::unix::fs::FileExt;
    let (mem, base) = guest_ram(pid, ram_bytes);
    let mut low = vec![0u8; 1 << 20];
    // The first two entries, as `struct hvm_memmap_table_entry` {u64 addr,
    // u64 size, u32 type, u32 reserved}: 1 is usable RAM, 2 reserved.
    let mut memmap = Vec::new();
    for (addr, size, kind) in [(0u64, 0x9fc00u64, 1u32), (0x9fc00, 0x60400, 2)] {
        memmap.extend_from_slice(&addr.to_le_bytes());
        memmap.extend_from_slice(&size.to_le_bytes());
        memmap.extend_from_slice(&kind.to_le_bytes());
        memmap.extend_from_slice(&0u32.to_le_bytes());
    }
    let u32_at = |b: &[u8], at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap());
    let u64_at = |b: &[u8], at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
    // teravm writes the start info after the kernel image: poll for it.
    let deadline = std::time::Instant::now() + EARLY;
    let info = loop {
        mem.read_exact_at(&mut low, base).unwrap();
        let found = (0..low.len() - 56).step_by(8).find(|&p| {
            let map_at = u64_at(&low, p + 0x28) as usize;
            u32_at(&low, p) == 0x336e_c578
                && u32_at(&low, p + 4) == 1
                && u32_at(&low, p + 0x30) == 4
                && map_at + memmap.len() <= low.len()
                && low[map_at..map_at + memmap.len()] == memmap[..]
        });
        if let Some(p) = found {
            break p;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no PVH start info with the guest's memory map in the first MiB of guest RAM"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let ptr = u64_at(&low, info + 0x18);
    let mut cmdline = vec![0u8; 4096];
    mem.read_exact_at(&mut cmdline, base + ptr).unwrap();
    let end = cmdline
        .iter()
        .position(|&b| b == 0)
        .expect("a NUL-terminated command line");
    String::from_utf8(cmdline[..end].to_vec()).unwrap()
}

/// Waits until the kernel image is in guest memory (teravm's resident size
/// grows past it: the image is loaded before the vCPUs start).
fn wait_loaded(vmm: &Vmm) {
    let pid = vmm.child.id();
    let deadline = std::time::Instant::now() + EARLY;
    while vmm.rss_bytes() < 16 << 20 {
        assert!(
            std::time::Instant::now() < deadline,
            "teravm {pid} never loaded the kernel"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn bzimage_is_loaded_and_entered_at_its_64_bit_entry() {
    let Some(kernel) = kernel_or_skip("bzimage", "vmlinuz") else {
        return;
    };
    let _one_kernel_at_a_time = common::big_memory();
    let dir = temp_dir("linux-bz");
    let args = "console=ttyS0 earlyprintk=serial reboot=k panic=1 pci=off nomodule";
    let cfg = config_file(&dir, &config(&kernel, None, args));
    let vmm = Vmm::spawn(&[
        "--no-api",
        "--log-level",
        "info",
        "--config-file",
        cfg.to_str().unwrap(),
    ]);
    // What the guest got, read from its memory, against the file as the
    // boot protocol lays it out: the protected-mode code (after the
    // `setup_sects + 1` sectors of real-mode setup) at 1 MiB. The kernel's
    // own lines do not come within a test's bound here: its decompressor
    // runs on emulated CPL0 (none in 180 s on this project's hosts).
    let image = std::fs::read(&kernel).unwrap();
    assert_eq!(&image[0x202..0x206], b"HdrS");
    let setup_sects = match image[0x1f1] {
        0 => 4,
        n => usize::from(n),
    };
    let code = &image[(setup_sects + 1) * 512..];
    let want = &code[..code.len().min(64 << 10)];
    let pid = vmm.child.id();
    let (mem, base) = guest_ram(pid, MEM_MIB << 20);
    let mut got = vec![0u8; want.len()];
    let deadline = std::time::Instant::now() + EARLY;
    loop {
        std::os::unix::fs::FileExt::read_exact_at(&mem, &mut got, base + 0x10_0000).unwrap();
        if got == want {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "guest RAM at 1 MiB is not the bzImage's protected-mode code"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let (_, stderr) = sigterm_ends_cleanly(vmm);
    // And where teravm entered it: the 64-bit entry, 0x200 past the
    // protected-mode code loaded at 1 MiB.
    assert!(stderr.contains("(BzImage) entered at 0x100200"), "{stderr}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_images_are_one_line_errors_and_nothing_starts() {
    let dir = temp_dir("linux-bad");
    let text = dir.join("not-a-kernel");
    std::fs::write(&text, b"hello").unwrap();
    let empty = dir.join("empty");
    std::fs::write(&empty, b"").unwrap();
    let cases = [
        (
            format!(
                r#""kernel_image_path": "{}""#,
                dir.join("missing").display()
            ),
            "kernel_image_path",
        ),
        (
            format!(r#""kernel_image_path": "{}""#, text.display()),
            "neither an ELF",
        ),
        (
            format!(r#""kernel_image_path": "{}""#, empty.display()),
            "0 bytes",
        ),
        (
            format!(r#""kernel_image_path": "{}""#, dir.display()),
            "not a regular file",
        ),
        (
            format!(
                r#""kernel_image_path": "{}", "initrd_path": "{}""#,
                text.display(),
                empty.display()
            ),
            "kernel_image_path",
        ),
        (
            format!(r#""initrd_path": "{}""#, text.display()),
            "needs a kernel_image_path",
        ),
    ];
    for (fields, needle) in cases {
        let cfg = config_file(
            &dir,
            &format!(
                r#"{{"machine-config": {{"vcpu_count": 1, "mem_size_mib": 64}}, "boot-source": {{{fields}}}}}"#
            ),
        );
        let (code, stdout, stderr) = common::run(
            &["--no-api", "--config-file", cfg.to_str().unwrap()],
            Duration::from_secs(20),
        );
        assert_eq!(code, 1, "{fields}: {stderr}");
        assert!(stdout.is_empty(), "{fields}: something started: {stdout:?}");
        let lines: Vec<&str> = stderr.lines().collect();
        assert_eq!(lines.len(), 1, "{fields}: {stderr}");
        assert!(lines[0].contains(needle), "{fields}: {stderr}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn stdin_pipe_reaches_the_uart_and_the_guest_still_shuts_down_cleanly() {
    let Some(kernel) = kernel_or_skip("stdin_pipe", "vmlinux") else {
        return;
    };
    let _one_kernel_at_a_time = common::big_memory();
    let dir = temp_dir("linux-stdin");
    let args = "console=ttyS0 earlyprintk=serial reboot=k panic=1 pci=off nomodule";
    let cfg = config_file(&dir, &config(&kernel, None, args));
    // stdin is a FIFO: `sh` opens it (waiting for this test to open the
    // other end), then becomes teravm.
    let fifo = dir.join("stdin");
    let c_fifo = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c_fifo.as_ptr(), 0o600) }, 0);
    let mut cmd = std::process::Command::new("sh");
    cmd.arg("-c").arg(format!(
        "exec {} --no-api --log-level info --config-file {} < {}",
        common::teravm(),
        cfg.display(),
        fifo.display()
    ));
    let mut vmm = Vmm::spawn_command(cmd);
    {
        use std::io::Write;
        let mut w = std::fs::OpenOptions::new().write(true).open(&fifo).unwrap();
        w.write_all(&[b'x'; 100]).unwrap();
        // Closing it is the end of stdin.
    }
    // teravm read all of it, then the end: the guest's FIFO took 64 bytes
    // (the guest does not read this early), the rest waits.
    vmm.wait_err_line("console input: stdin (Pipe)", EARLY);
    vmm.wait_err_line("console input: stdin ended", EARLY);
    // The guest runs on, with stdin gone.
    let version = vmm.wait_line("Linux version", FIRST_LINE);
    assert!(version.contains("Linux version 6."), "{version}");
    let (_, stderr) = sigterm_ends_cleanly(vmm);
    assert!(
        stderr.contains(
            "console input: 100 bytes read from stdin, 64 given to the guest, 36 waiting, 0 dropped"
        ),
        "{stderr}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn two_host_nodes_are_two_guest_nodes_in_srat_and_get_memory() {
    let Some(kernel) = kernel_or_skip("guest_numa", "vmlinux") else {
        return;
    };
    let _one_kernel_at_a_time = common::big_memory();
    let dir = temp_dir("linux-numa");
    let sys = common::fake_sysfs(&dir, 2);
    let sock = dir.join("api.sock");
    let args = "console=ttyS0 earlyprintk=serial reboot=k panic=1 pci=off nomodule";
    // 512 MiB over 2 (fake) host nodes: 256 MiB each, not bound.
    let cfg = config_file(
        &dir,
        &format!(
            r#"{{"machine-config": {{"vcpu_count": 2, "mem_size_mib": 512}},
                "memory": {{"numa_policy": "none"}},
                "boot-source": {{"kernel_image_path": "{}", "boot_args": "{args}"}}}}"#,
            kernel.display()
        ),
    );
    let mut vmm = Vmm::spawn(&[
        "--api-sock",
        sock.to_str().unwrap(),
        "--sysfs-root",
        sys.to_str().unwrap(),
        "--config-file",
        cfg.to_str().unwrap(),
    ]);
    vmm.wait_line("Linux version", FIRST_LINE);
    // The kernel's own reading of the SRAT and MADT.
    for needle in [
        "ACPI: RSDP 0x00000000000E0000",
        "SRAT: PXM 0 -> APIC 0x00 -> Node 0",
        "SRAT: PXM 1 -> APIC 0x01 -> Node 1",
        "ACPI: SRAT: Node 0 PXM 0 [mem 0x00000000-0x0fffffff]",
        "ACPI: SRAT: Node 1 PXM 1 [mem 0x10000000-0x1fffffff]",
        "Initmem setup node 1 [mem 0x0000000010000000-0x000000001fffffff]",
        "ACPI: Using ACPI (MADT) for SMP configuration information",
        "smpboot: Allowing 2 CPUs",
    ] {
        vmm.wait_line(needle, EARLY);
    }
    // GET /memory: which guest node is which host node.
    let (status, body) = common::client::request(&sock, "GET", "/memory", None).unwrap();
    assert_eq!(status, 200, "{body}");
    let memory: serde_json::Value = serde_json::from_str(&body).unwrap();
    let slices = memory["slices"].as_array().unwrap();
    assert_eq!(slices.len(), 2, "{body}");
    for (i, s) in slices.iter().enumerate() {
        assert_eq!(s["host_node"], i, "{body}");
        assert_eq!(s["guest_node"], i, "{body}");
        assert_eq!(s["guest_addr"], (i as u64) << 28, "{body}");
    }
    sigterm_ends_cleanly(vmm);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The first step of every Firecracker client, with the default flags: the
/// kernel sent over the API (`PUT /boot-source`), then `InstanceStart`. The
/// stock kernel stops on PVM after `Memory:` on an instruction the
/// emulator lacks; teravm must then report the guest's crash with its RIP
/// (vCPU 0 reads the registers under its filter), reclaim in parallel and
/// exit 3, never 148.
#[test]
fn a_kernel_over_the_api_runs_until_the_guest_crashes_and_exits_3() {
    let Some(kernel) = kernel_or_skip("linux_crash", "vmlinux") else {
        return;
    };
    let _one_kernel_at_a_time = common::big_memory();
    let dir = temp_dir("linux-crash");
    let sock = dir.join("api.sock");
    let mut vmm = Vmm::spawn(&["--api-sock", sock.to_str().unwrap()]);
    common::wait_for_api(&sock, Duration::from_secs(30));
    let put = |path: &str, body: String| {
        let (status, reply) =
            common::client::request(&sock, "PUT", path, Some(&body)).expect("the API answers");
        assert_eq!(status, 204, "PUT {path} {body}: {reply}");
    };
    put(
        "/machine-config",
        format!(r#"{{"vcpu_count": 1, "mem_size_mib": {MEM_MIB}}}"#),
    );
    put(
        "/boot-source",
        format!(
            r#"{{"kernel_image_path": "{}", "boot_args": "console=ttyS0 earlyprintk=serial reboot=k panic=1 pci=off"}}"#,
            kernel.display()
        ),
    );
    put(
        "/actions",
        r#"{"action_type": "InstanceStart"}"#.to_string(),
    );
    vmm.wait_line("Linux version", FIRST_LINE);
    let crash = vmm.wait_err_line("guest crashed", Duration::from_secs(300));
    assert!(
        crash.contains("vcpu0") && crash.contains("guest rip 0x"),
        "{crash}"
    );
    let (code, _stdout, stderr) = vmm.wait(Duration::from_secs(60));
    assert_eq!(code, 3, "{stderr}");
    assert!(!stderr.contains("seccomp"), "{stderr}");
    assert!(
        stderr.contains("teravm: reclaimed "),
        "no summary: {stderr}"
    );
}

/// A Linux kernel on guest_memfd memory (issue 19): loaded into KVM's own
/// files through teravm's mapping of them, it runs exactly as far as on
/// anonymous memory on this PVM host (its own e820 map, then the `Memory:`
/// line, where PVM's emulator stops every stock kernel) and SIGTERM ends it
/// cleanly, its files freed.
#[test]
fn a_kernel_on_guest_memfd_runs_as_far_as_on_anonymous_memory() {
    let Some(kernel) = kernel_or_skip("linux_gmem", "vmlinux") else {
        return;
    };
    if !common::gmem_or_not_possible("linux_gmem") {
        return;
    }
    let _one_kernel_at_a_time = common::big_memory();
    let dir = temp_dir("linux-gmem");
    let args = "console=ttyS0 earlyprintk=serial reboot=k panic=1 pci=off nomodule";
    let cfg = config_file(
        &dir,
        &format!(
            r#"{{"machine-config": {{"vcpu_count": 1, "mem_size_mib": {MEM_MIB}, "huge_pages": "None"}},
                "memory": {{"backing": "guest_memfd"}},
                "boot-source": {{"kernel_image_path": "{}", "boot_args": "{args}"}}}}"#,
            kernel.display()
        ),
    );
    let mut vmm = Vmm::spawn(&["--no-api", "--config-file", cfg.to_str().unwrap()]);
    let version = vmm.wait_line("Linux version", FIRST_LINE);
    assert!(version.contains("Linux version 6."), "{version}");
    for entry in E820_256_MIB {
        let line = vmm.wait_line("BIOS-e820:", EARLY);
        assert!(line.ends_with(entry), "{line} != {entry}");
    }
    let memory = vmm.wait_line("Memory: ", EARLY);
    assert!(memory.contains("K available"), "{memory}");
    let pid = vmm.child.id();
    assert!(
        !common::gmem::gmem_fds(pid).is_empty(),
        "the kernel runs on guest_memfd"
    );
    let (_, stderr) = sigterm_ends_cleanly(vmm);
    let (mib, _, _) = common::summary(&stderr);
    assert!(mib > 0, "the kernel's pages were freed: {stderr}");
    std::fs::remove_dir_all(&dir).unwrap();
}
