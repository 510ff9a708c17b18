//! The PVH entry on the real binary and real /dev/kvm, default flags: a
//! tiny ELF assembled here (binutils, as build.rs assembles the firmware)
//! with two entries. Its ELF entry is 64-bit code that prints `linux64
//! entry`; its PVH note (`XEN_ELFNOTE_PHYS32_ENTRY`) names 32-bit code that
//! checks what the PVH ABI promises (EBX = an `hvm_start_info` with the
//! magic and version 1, CR0 with PE and without PG, an RSDP at
//! `rsdp_paddr`, a memory map whose first entry is RAM from 0), prints
//! `pvh ok cmdline=<the command line at cmdline_paddr>` and, with an
//! initrd, ` module=<the bytes at module 0's paddr>`, or `pvh bad <the
//! check that failed>`, then resets through the i8042 (teravm exits 0).
//! So each line says which entry ran and what the start info held.
//!
//! The code is a few dozen instructions: guest CPL0 is emulated on this
//! project's PVM hosts.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{config_file, kvm_or_skip, run, summary, temp_dir};

const T: Duration = Duration::from_secs(60);
const CMDLINE: &str = "pvh-test marker=42";
const INITRD: &[u8] = b"teravm-initrd\0";

const GUEST_S: &str = r#"
    .set COM1, 0x3f8
    .set START_INFO_MAGIC, 0x336ec578

.ifdef PVH_NOTE
    .section .note.pvh, "a"
    .p2align 2
    .long 4, 8, 18          /* namesz, descsz, XEN_ELFNOTE_PHYS32_ENTRY */
    .asciz "Xen"
    .quad pvh_start
.endif

    .text
    .code64
    .globl entry64
entry64:                    /* the ELF entry (Linux 64-bit protocol) */
    lea linux64(%rip), %rsi
    mov $COM1, %dx
1:  lodsb
    test %al, %al
    jz reset64
    out %al, %dx
    jmp 1b
reset64:
    mov $0xfe, %al
    out %al, $0x64
2:  hlt
    jmp 2b

    .code32
    .globl pvh_start
pvh_start:                  /* the PVH entry: EBX = hvm_start_info, no stack */
    mov $'1', %cl
    cmpl $START_INFO_MAGIC, (%ebx)
    jne bad
    mov $'2', %cl
    cmpl $1, 4(%ebx)        /* version */
    jne bad
    mov $'3', %cl
    mov %cr0, %eax
    and $0x80000001, %eax   /* PE set, PG clear */
    cmp $1, %eax
    jne bad
    mov $'4', %cl
    mov 32(%ebx), %esi      /* rsdp_paddr */
    cmpl $0x20445352, (%esi) /* "RSD " */
    jne bad
    mov $'5', %cl
    cmpl $0, 48(%ebx)       /* memmap_entries */
    je bad
    mov 40(%ebx), %esi      /* memmap_paddr: entry 0 is RAM from 0 */
    cmpl $0, (%esi)
    jne bad
    cmpl $1, 16(%esi)
    jne bad
    mov $COM1, %dx
    mov $ok_msg, %esi
    mov $3f, %edi
    jmp puts
3:  mov 24(%ebx), %esi      /* cmdline_paddr */
    mov $4f, %edi
    jmp puts
4:  cmpl $1, 12(%ebx)       /* nr_modules */
    jne 5f
    mov $module_msg, %esi
    mov $6f, %edi
    jmp puts
6:  mov 16(%ebx), %esi      /* modlist_paddr */
    mov (%esi), %esi        /* module 0's paddr: the initrd's bytes */
    mov $5f, %edi
    jmp puts
5:  mov $'\n', %al
    out %al, %dx
    jmp reset32
bad:
    mov $COM1, %dx
    mov $bad_msg, %esi
    mov $7f, %edi
    jmp puts
7:  mov %cl, %al
    out %al, %dx
    mov $'\n', %al
    out %al, %dx
reset32:
    mov $0xfe, %al
    out %al, $0x64
8:  hlt
    jmp 8b

/* Writes the NUL-terminated string at ESI to port DX, then jumps to EDI. */
puts:
    lodsb
    test %al, %al
    jz 9f
    out %al, %dx
    jmp puts
9:  jmp *%edi

    .section .rodata
linux64:    .asciz "linux64 entry\n"
ok_msg:     .asciz "pvh ok cmdline="
module_msg: .asciz " module="
bad_msg:    .asciz "pvh bad "
"#;

/// Loaded at 1 MiB; the note is a PT_NOTE segment of its own (inside the
/// PT_LOAD, as in a vmlinux) only when the guest has one.
fn linker_script(note: bool) -> String {
    let (phdrs, note_out) = if note {
        (
            "PHDRS { text PT_LOAD FLAGS(5); note PT_NOTE FLAGS(4); }",
            ".note.pvh : { *(.note.pvh) } :text :note",
        )
    } else {
        ("PHDRS { text PT_LOAD FLAGS(5); }", "")
    };
    format!(
        "ENTRY(entry64)\n{phdrs}\nSECTIONS {{\n  . = 0x100000;\n  \
         .text : {{ *(.text) *(.rodata) }} :text\n  {note_out}\n  \
         /DISCARD/ : {{ *(.note.gnu*) *(.comment) }}\n}}\n"
    )
}

fn tool(cmd: &mut Command) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?} (is binutils installed?): {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Assembles and links the guest in `dir`, with or without the PVH note.
fn guest(dir: &Path, note: bool) -> PathBuf {
    let src = dir.join("guest.S");
    let ld = dir.join("guest.ld");
    let obj = dir.join("guest.o");
    let elf = dir.join("guest.elf");
    std::fs::write(&src, GUEST_S).unwrap();
    std::fs::write(&ld, linker_script(note)).unwrap();
    let mut as_ = Command::new("as");
    as_.arg("--64");
    if note {
        as_.args(["--defsym", "PVH_NOTE=1"]);
    }
    tool(as_.arg("-o").arg(&obj).arg(&src));
    tool(
        Command::new("ld")
            .args(["-nostdlib", "-static", "-T"])
            .arg(&ld)
            .arg("-o")
            .arg(&elf)
            .arg(&obj),
    );
    elf
}

/// Boots `kernel` (2 vCPUs, 64 MiB, `--log-level info`) to its reset;
/// returns the guest's lines and teravm's stderr after checking a clean
/// exit.
fn boot(dir: &Path, kernel: &Path, initrd: Option<&Path>) -> (Vec<String>, String) {
    let initrd = initrd.map_or(String::new(), |p| {
        format!(r#""initrd_path": "{}","#, p.display())
    });
    let cfg = config_file(
        dir,
        &format!(
            r#"{{"machine-config": {{"vcpu_count": 2, "mem_size_mib": 64}},
                "boot-source": {{"kernel_image_path": "{}", {initrd} "boot_args": "{CMDLINE}"}}}}"#,
            kernel.display()
        ),
    );
    let (code, stdout, stderr) = run(
        &[
            "--no-api",
            "--log-level",
            "info",
            "--config-file",
            cfg.to_str().unwrap(),
        ],
        T,
    );
    assert_eq!(code, 0, "stdout: {stdout:?}\nstderr: {stderr}");
    assert!(
        stderr.contains("the guest asked for a reset"),
        "not a guest reset: {stderr}"
    );
    // The normal shutdown path: memory reclaimed, the summary printed.
    summary(&stderr);
    (stdout, stderr)
}

/// The guest's result lines (what it printed, nothing of teravm's).
fn guest_lines(stdout: &[String]) -> Vec<&str> {
    stdout
        .iter()
        .map(String::as_str)
        .filter(|l| l.starts_with("pvh ") || l.starts_with("linux64"))
        .collect()
}

#[test]
fn the_pvh_entry_gets_ebx_at_a_valid_start_info_with_cmdline_and_initrd() {
    if !kvm_or_skip("pvh_entry") {
        return;
    }
    let dir = temp_dir("pvh-entry");
    let kernel = guest(&dir, true);
    let initrd = dir.join("initrd");
    std::fs::write(&initrd, INITRD).unwrap();
    let (stdout, stderr) = boot(&dir, &kernel, Some(&initrd));
    // One line: only vCPU 0 ran the entry (vCPU 1 waits for a SIPI).
    assert_eq!(
        guest_lines(&stdout),
        [format!("pvh ok cmdline={CMDLINE} module=teravm-initrd")],
        "{stdout:?}"
    );
    assert!(stderr.contains("through the PVH entry"), "{stderr}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn without_an_initrd_the_start_info_has_no_module() {
    if !kvm_or_skip("pvh_no_initrd") {
        return;
    }
    let dir = temp_dir("pvh-noinitrd");
    let kernel = guest(&dir, true);
    let (stdout, _) = boot(&dir, &kernel, None);
    assert_eq!(
        guest_lines(&stdout),
        [format!("pvh ok cmdline={CMDLINE}")],
        "{stdout:?}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_same_elf_without_the_note_is_entered_at_its_64_bit_entry() {
    if !kvm_or_skip("pvh_no_note") {
        return;
    }
    let dir = temp_dir("pvh-nonote");
    let kernel = guest(&dir, false);
    let (stdout, stderr) = boot(&dir, &kernel, None);
    assert_eq!(guest_lines(&stdout), ["linux64 entry"], "{stdout:?}");
    assert!(
        stderr.contains("through the Linux 64-bit boot protocol"),
        "{stderr}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
