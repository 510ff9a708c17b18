//! The PVH entry and the step down to CPL3.
//!
//! A PVH loader (teravm, Firecracker, QEMU `-kernel`) enters `pvh_start` in
//! 32-bit protected mode, paging off, with EBX = the guest address of the
//! `hvm_start_info` block (xen/include/public/arch-x86/hvm/start_info.h).
//! CPL0 is emulated on PVM hosts (about 1,000 times slower), so the code
//! here is as short as it can be: the page tables are built by the
//! assembler into the image (an identity map of the first 4 GiB with 2 MiB
//! pages, user-accessible; 3-4 GiB, where every VMM puts its MMIO devices,
//! uncached), then one GDT load, long mode, and an `iretq` to CPL3 with
//! IOPL 3 (port I/O works from there) and interrupts off. The IDT limit is
//! 0, so any exception is a triple fault: the VMM sees a crash.
//!
//! RAM above 4 GiB is mapped later, at CPL3, by [`crate::mem`]: the page
//! tables are in the image's user-writable data, and an entry that was not
//! present is never cached, so adding one needs no TLB flush.

core::arch::global_asm!(
    r#"
    .pushsection .note.Xen, "a", @note
    .balign 4
    .long 4
    .long 8
    .long 18                  /* XEN_ELFNOTE_PHYS32_ENTRY */
    .asciz "Xen"
    .balign 4
    .quad pvh_start
    .balign 4
    .popsection

    .pushsection .text.boot, "ax"
    .code32
    .globl pvh_start
pvh_start:
    movl %ebx, pvh_info
    lgdtl gdt_ptr
    lidtl idt_ptr
    movl $0x620, %eax         /* CR4: PAE | OSFXSR | OSXMMEXCPT */
    movl %eax, %cr4
    movl $pml4, %eax
    movl %eax, %cr3
    movl $0xc0000080, %ecx    /* EFER.LME */
    rdmsr
    orl $0x100, %eax
    wrmsr
    movl $0x80010033, %eax    /* CR0: PG | WP | NE | ET | MP | PE */
    movl %eax, %cr0
    ljmpl $0x08, $1f
    .code64
1:
    movw $0x10, %ax
    movw %ax, %ds
    movw %ax, %es
    movw %ax, %ss
    movw %ax, %fs
    movw %ax, %gs
    leaq stack_top(%rip), %rsp /* the PVH ABI leaves ESP undefined */
    /* The TSS descriptor (0x28), built here: its base is a link-time
     * address the assembler cannot slice. */
    leaq tss(%rip), %rax
    movq %rax, %rcx
    andl $0xffff, %ecx
    shlq $16, %rcx            /* base 15:0 */
    movq %rax, %rdx
    shrq $16, %rdx
    andl $0xff, %edx
    shlq $32, %rdx            /* base 23:16 */
    orq %rdx, %rcx
    movq %rax, %rdx
    shrq $24, %rdx
    andl $0xff, %edx
    shlq $56, %rdx            /* base 31:24 */
    orq %rdx, %rcx
    movabsq $0x0000890000000000 + TSS_LIMIT, %rdx /* present, 64-bit TSS */
    orq %rdx, %rcx
    leaq gdt_tss(%rip), %rdi
    movq %rcx, (%rdi)
    shrq $32, %rax
    movq %rax, 8(%rdi)        /* base 63:32 */
    movw $0x28, %ax
    ltrw %ax
    movl pvh_info(%rip), %edi
    leaq -8(%rsp), %rax       /* CPL3's RSP: as if called, rsp + 8 16-aligned */
    pushq $0x1b               /* SS: user data, RPL 3 */
    pushq %rax                /* RSP */
    pushq $0x3002             /* RFLAGS: IOPL 3, IF 0 */
    pushq $0x23               /* CS: user code, RPL 3 */
    leaq guest_main(%rip), %rax
    pushq %rax
    iretq
    .popsection

    .pushsection .data.pagetables, "aw"
    .balign 4096
    .globl pml4
pml4:
    .quad pdpt + 0x7          /* present, writable, user */
    .fill 511, 8, 0
    .globl pdpt
pdpt:
    .quad pd0 + 0x7
    .quad pd0 + 0x1007
    .quad pd0 + 0x2007
    .quad pd0 + 0x3007
    .fill 508, 8, 0
pd0:
    .set page, 0
    .rept 1536                /* 0-3 GiB: write-back */
    .quad (page << 21) + 0x87 /* present, writable, user, 2 MiB */
    .set page, page + 1
    .endr
    .rept 512                 /* 3-4 GiB: the MMIO window, uncached */
    .quad (page << 21) + 0x9f /* ... and PWT | PCD */
    .set page, page + 1
    .endr

    .balign 16
gdt:
    .quad 0
    .quad 0x00af9a000000ffff  /* 0x08 code, 64-bit, DPL 0 */
    .quad 0x00cf92000000ffff  /* 0x10 data, DPL 0 */
    .quad 0x00cff2000000ffff  /* 0x18 data, DPL 3 */
    .quad 0x00affa000000ffff  /* 0x20 code, 64-bit, DPL 3 */
gdt_tss:
    .quad 0, 0                /* 0x28 the TSS, filled in at boot */
gdt_end:
    .balign 8
gdt_ptr:
    .word gdt_end - gdt - 1
    .long gdt
idt_ptr:
    .word 0
    .long 0
    .balign 8
    .globl pvh_info
pvh_info:
    .long 0

    /* The TSS, with an I/O permission bitmap that allows every port: CPL3
     * port I/O then works whether or not the VMM's CPU honours IOPL 3 after
     * the iretq (PVM hosts lose it; the bitmap is what the CPU checks
     * next). */
    .set TSS_LIMIT, 104 + 8192
    .balign 16
tss:
    .long 0
    .quad stack_top           /* RSP0 (unused: no interrupts, no IDT) */
    .fill 92 - 12, 1, 0
    .word 0                   /* 0x64: trap */
    .word 104                 /* 0x66: I/O map base */
    .fill 8192, 1, 0          /* every port allowed */
    .byte 0xff                /* the bitmap's end */
    .popsection

    .pushsection .bss.stack, "aw", @nobits
    .balign 4096
    .skip 0x40000             /* 256 KiB */
stack_top:
    .popsection
"#,
    options(att_syntax)
);

extern "C" {
    /// The top-level page table (PML4), in the image.
    pub static mut pml4: [u64; 512];
    /// The first byte after the image and its .bss (2 MiB aligned).
    pub static _guest_end: u8;
}
