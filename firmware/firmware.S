/*
 * teravm built-in firmware.
 *
 * Entered by the VMM directly in 64-bit long mode at CPL3 on every vCPU, with
 * identity-mapped memory (2 MiB pages, user bit set), IOPL 3, and:
 *   rdi = this vCPU's index
 *   rsi = guest address of the boot-info block (layout below)
 *   rsp = top of this vCPU's stack
 *
 * It talks to the VMM only through port I/O (`hlt` faults at CPL3, and CPL0
 * code is emulated on PVM hosts). vCPU 0 parses the command line and prints;
 * every vCPU dirties its share of RAM; then vCPU 0 reports and either parks
 * or asks for a reset through the i8042, as Linux does with reboot=k.
 *
 * Command line (space separated, unknown words ignored):
 *   touch=<MiB>|all     dirty that much RAM, one write per 4 KiB page
 *   then=idle|reset     what to do afterwards (default idle)
 *   fault=triple        after the first line, fault with no IDT (a crash)
 *   fault=ports         after touching, write an unknown port forever
 *   keep=writing        after touching, vCPUs other than 0 keep rewriting
 *   say=<text>          print the rest of the command line as a line after
 *                       the first (tests: a guest imitating teravm's output)
 *                       their share until the VMM stops them
 */

        .intel_syntax noprefix
        .code64

/* Boot-info block: must match src/vstate/boot.rs. */
        .set BI_MAGIC,        0
        .set BI_VCPUS,        4
        .set BI_MEM_MIB,      8
        .set BI_CMDLINE,      16
        .set BI_CMDLINE_LEN,  24
        .set BI_FW_END,       32
        .set BI_NREGIONS,     40
        .set BI_REGIONS,      48        /* 8 x { u64 addr, u64 len } */
        .set BI_MAX_REGIONS,  8

/* Ports: must match src/devices/. */
        .set COM1,            0x3f8
        .set I8042_DATA,      0x60
        .set I8042_CMD,       0x64
        .set PORT_CLOCK,      0xf00     /* in: u32 milliseconds since boot */
        .set PORT_PARK,       0xf04     /* out: block this vCPU until woken */
        .set PORT_ERROR,      0xf08     /* out: firmware error code */
        .set PORT_UNKNOWN,    0xf70     /* nothing there; for fault=ports */

        .set PAGE,            4096

        .text
        .globl _start
_start:
        mov     r14, rdi                /* r14 = vCPU index */
        mov     r15, rsi                /* r15 = boot info */
        test    r14, r14
        jnz     .Lwait_go

        /* vCPU 0: parse, print the first line, release the others. */
        call    parse_cmdline
        lea     rsi, [rip + msg_hello_vcpus]
        call    puts
        mov     eax, [r15 + BI_VCPUS]
        call    put_u64
        lea     rsi, [rip + msg_hello_mem]
        call    puts
        mov     rax, [r15 + BI_MEM_MIB]
        call    put_u64
        mov     al, 10
        call    putc
        mov     rcx, [rip + say_len]
        test    rcx, rcx
        jz      1f
        mov     rsi, [rip + say_ptr]
        mov     dx, COM1
        rep outsb
        mov     al, 10
        call    putc
1:
        cmp     byte ptr [rip + opt_fault], 1
        jne     1f
        ud2                             /* no IDT: a triple fault */
1:
        call    touch_total
        mov     [rip + touch_bytes], rax
        mov     dx, PORT_CLOCK
        in      eax, dx
        mov     [rip + t0_ms], eax
        mov     dword ptr [rip + go], 1
        jmp     .Ltouch

.Lwait_go:
        pause
        cmp     dword ptr [rip + go], 0
        je      .Lwait_go

.Ltouch:
        call    touch_share
        lock inc dword ptr [rip + done_count]
        test    r14, r14
        jnz     .Lother_done

        /* vCPU 0: wait for everyone, then report. */
        mov     ecx, [r15 + BI_VCPUS]
2:      cmp     [rip + done_count], ecx
        je      3f
        pause
        jmp     2b
3:      mov     dx, PORT_CLOCK
        in      eax, dx
        sub     eax, [rip + t0_ms]
        mov     ebx, eax
        lea     rsi, [rip + msg_touched]
        call    puts
        mov     rax, [rip + touch_bytes]
        shr     rax, 20
        call    put_u64
        lea     rsi, [rip + msg_in]
        call    puts
        mov     eax, ebx
        call    put_u64
        lea     rsi, [rip + msg_ms]
        call    puts

        cmp     byte ptr [rip + opt_fault], 2
        jne     4f
        mov     dx, PORT_UNKNOWN
5:      out     dx, al
        jmp     5b
4:      cmp     byte ptr [rip + opt_reset], 0
        jne     reset
        lea     rsi, [rip + msg_idle]
        call    puts
        jmp     idle

.Lother_done:
        cmp     byte ptr [rip + opt_keep], 0
        je      idle
6:      call    touch_share
        jmp     6b

/* Park until woken; a Ctrl-Alt-Del from the VMM (the i8042 holds a byte)
 * turns into a reset request. */
idle:
        mov     dx, PORT_PARK
        out     dx, al
        mov     dx, I8042_CMD
        in      al, dx
        test    al, 1
        jz      idle
        mov     dx, I8042_DATA
        in      al, dx
        test    r14, r14
        jnz     idle                    /* only vCPU 0 answers */
reset:
        lea     rsi, [rip + msg_reset]
        call    puts
        mov     dx, I8042_CMD
        mov     al, 0xfe
        out     dx, al
        jmp     idle                    /* the VMM stops us */

/* rax = bytes to touch: min(touch, RAM above the firmware), page aligned. */
touch_total:
        xor     eax, eax
        xor     ecx, ecx
        mov     r8, [r15 + BI_FW_END]
1:      cmp     ecx, [r15 + BI_NREGIONS]
        jae     3f
        mov     rdx, rcx
        shl     rdx, 4
        mov     r9, [r15 + BI_REGIONS + rdx]        /* start */
        mov     r10, [r15 + BI_REGIONS + rdx + 8]
        add     r10, r9                              /* end */
        cmp     r9, r8
        cmovb   r9, r8
        cmp     r10, r9
        jbe     2f
        sub     r10, r9
        add     rax, r10
2:      inc     ecx
        jmp     1b
3:      mov     rdx, [rip + opt_touch]
        cmp     rdx, rax
        cmovb   rax, rdx
        and     rax, -PAGE
        ret

/* Dirty this vCPU's share: pages [n*i/N, n*(i+1)/N) of the touchable RAM,
 * counted across regions in order. */
touch_share:
        push    rbx
        push    r12
        push    r13
        mov     rax, [rip + touch_bytes]
        shr     rax, 12                 /* n pages */
        mov     r11, rax
        mul     r14
        mov     ecx, [r15 + BI_VCPUS]
        div     rcx
        mov     r12, rax                /* r12 = first page (linear) */
        mov     rax, r11
        lea     rbx, [r14 + 1]
        mul     rbx
        mov     ecx, [r15 + BI_VCPUS]
        div     rcx
        mov     r13, rax                /* r13 = end page (linear) */
        xor     ecx, ecx                /* region index */
        xor     r11, r11                /* linear page where this region starts */
        mov     r8, [r15 + BI_FW_END]
1:      cmp     r12, r13
        jae     9f
        cmp     ecx, [r15 + BI_NREGIONS]
        jae     9f
        mov     rdx, rcx
        shl     rdx, 4
        mov     r9, [r15 + BI_REGIONS + rdx]
        mov     r10, [r15 + BI_REGIONS + rdx + 8]
        add     r10, r9
        cmp     r9, r8
        cmovb   r9, r8
        cmp     r10, r9
        jbe     8f
        sub     r10, r9
        shr     r10, 12                 /* pages in this region */
        lea     rbx, [r11 + r10]        /* linear end of this region */
        cmp     r12, rbx
        jae     7f
        /* write pages r12 .. min(r13, rbx) of this region */
        mov     rax, r13
        cmp     rax, rbx
        cmova   rax, rbx
        mov     rdi, r12
        sub     rdi, r11
        shl     rdi, 12
        add     rdi, r9                 /* guest address of page r12 */
        mov     rsi, rax
        sub     rsi, r12                /* count */
        mov     r12, rax
2:      mov     [rdi], rdi
        add     rdi, PAGE
        dec     rsi
        jnz     2b
7:      mov     r11, rbx
8:      inc     ecx
        jmp     1b
9:      pop     r13
        pop     r12
        pop     rbx
        ret

/* Parse "key=value" words of the command line into opt_*. */
parse_cmdline:
        mov     rsi, [r15 + BI_CMDLINE]
        mov     rcx, [r15 + BI_CMDLINE_LEN]
        lea     r8, [rsi + rcx]         /* end */
.Lword:
        cmp     rsi, r8
        jae     .Lparsed
        cmp     byte ptr [rsi], ' '
        jne     1f
        inc     rsi
        jmp     .Lword
1:      lea     rdi, [rip + key_touch]
        call    match_key
        jc      .Ltouch_val
        lea     rdi, [rip + key_then]
        call    match_key
        jc      .Lthen_val
        lea     rdi, [rip + key_fault]
        call    match_key
        jc      .Lfault_val
        lea     rdi, [rip + key_keep]
        call    match_key
        jc      .Lkeep_val
        lea     rdi, [rip + key_say]
        call    match_key
        jc      .Lsay_val
.Lskip:                                 /* unknown word: skip it */
        cmp     rsi, r8
        jae     .Lparsed
        cmp     byte ptr [rsi], ' '
        je      .Lword
        inc     rsi
        jmp     .Lskip
.Ltouch_val:
        lea     rdi, [rip + val_all]
        call    match_value
        jnc     2f
        mov     qword ptr [rip + opt_touch], -1
        jmp     .Lword
2:      xor     eax, eax
        xor     edx, edx                /* digits seen */
3:      cmp     rsi, r8
        jae     4f
        movzx   ecx, byte ptr [rsi]
        cmp     cl, ' '
        je      4f
        sub     ecx, '0'
        cmp     ecx, 9
        ja      .Lbad
        imul    rax, rax, 10
        add     rax, rcx
        mov     rcx, rax
        shr     rcx, 43                 /* above 2^43 MiB is nonsense */
        jnz     .Lbad
        inc     edx
        inc     rsi
        jmp     3b
4:      test    edx, edx
        jz      .Lbad
        shl     rax, 20
        mov     [rip + opt_touch], rax
        jmp     .Lword
.Lthen_val:
        lea     rdi, [rip + val_reset]
        call    match_value
        jnc     5f
        mov     byte ptr [rip + opt_reset], 1
        jmp     .Lword
5:      lea     rdi, [rip + val_idle]
        call    match_value
        jnc     .Lbad
        mov     byte ptr [rip + opt_reset], 0
        jmp     .Lword
.Lfault_val:
        lea     rdi, [rip + val_triple]
        call    match_value
        jnc     6f
        mov     byte ptr [rip + opt_fault], 1
        jmp     .Lword
6:      lea     rdi, [rip + val_ports]
        call    match_value
        jnc     .Lbad
        mov     byte ptr [rip + opt_fault], 2
        jmp     .Lword
.Lkeep_val:
        lea     rdi, [rip + val_writing]
        call    match_value
        jnc     .Lbad
        mov     byte ptr [rip + opt_keep], 1
        jmp     .Lword
.Lsay_val:                              /* the rest of the line is the text */
        mov     [rip + say_ptr], rsi
        mov     rax, r8
        sub     rax, rsi
        mov     [rip + say_len], rax
        ret
.Lbad:
        lea     rsi, [rip + msg_bad]
        call    puts
        mov     dx, PORT_ERROR
        mov     eax, 1
        out     dx, eax
        jmp     idle
.Lparsed:
        ret

/* If the NUL-terminated key at rdi prefixes the text at rsi (< r8), advance
 * rsi past it and set CF; else leave rsi and clear CF. */
match_key:
        push    rsi
1:      mov     al, [rdi]
        test    al, al
        jz      2f
        cmp     rsi, r8
        jae     3f
        cmp     al, [rsi]
        jne     3f
        inc     rdi
        inc     rsi
        jmp     1b
2:      add     rsp, 8
        stc
        ret
3:      pop     rsi
        clc
        ret

/* Like match_key, but the value must end at a space or the end of text. */
match_value:
        push    rsi
        call    match_key
        jnc     1f
        cmp     rsi, r8
        jae     2f
        cmp     byte ptr [rsi], ' '
        je      2f
1:      pop     rsi
        clc
        ret
2:      add     rsp, 8
        stc
        ret

/* Print the NUL-terminated string at rsi on COM1. */
puts:
        mov     dx, COM1
1:      lodsb
        test    al, al
        jz      2f
        out     dx, al
        jmp     1b
2:      ret

putc:
        mov     dx, COM1
        out     dx, al
        ret

/* Print rax in decimal. */
put_u64:
        push    rbx
        sub     rsp, 32
        lea     rdi, [rsp + 31]
        mov     byte ptr [rdi], 0
        mov     rbx, 10
1:      xor     edx, edx
        div     rbx
        add     dl, '0'
        dec     rdi
        mov     [rdi], dl
        test    rax, rax
        jnz     1b
        mov     rsi, rdi
        call    puts
        add     rsp, 32
        pop     rbx
        ret

        .section .rodata
msg_hello_vcpus: .asciz "teravm firmware: vcpus="
msg_hello_mem:   .asciz " mem_mib="
msg_touched:     .asciz "teravm firmware: touched "
msg_in:          .asciz " MiB in "
msg_ms:          .asciz " ms\n"
msg_idle:        .asciz "teravm firmware: idle\n"
msg_reset:       .asciz "teravm firmware: reset\n"
msg_bad:         .asciz "teravm firmware: bad command line\n"
key_touch:       .asciz "touch="
key_then:        .asciz "then="
key_fault:       .asciz "fault="
key_keep:        .asciz "keep="
key_say:         .asciz "say="
val_all:         .asciz "all"
val_reset:       .asciz "reset"
val_idle:        .asciz "idle"
val_triple:      .asciz "triple"
val_ports:       .asciz "ports"
val_writing:     .asciz "writing"

        .data
        .balign 64
go:             .long 0
        .balign 64
done_count:     .long 0
        .balign 8
opt_touch:      .quad 0
say_ptr:        .quad 0
say_len:        .quad 0
touch_bytes:    .quad 0
t0_ms:          .long 0
opt_reset:      .byte 0
opt_fault:      .byte 0
opt_keep:       .byte 0
