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
 *                       their share until the VMM stops them
 *   say=<text>          print the rest of the command line as a line after
 *                       the first (tests: a guest imitating teravm's output)
 *   balloon             after touching, drive a virtio-balloon: follow its
 *                       num_pages, answer its statistics queue; with
 *                       then=idle vCPU 0 keeps serving it instead of parking
 *                       (with then=reset it follows num_pages once, then resets)
 *   report=<MiB>        after touching, report that much of the touched RAM
 *                       as free on the balloon's reporting queue, then read
 *                       it back and say whether it reads as zero
 *
 * The balloon driver (vCPU 0 only, polling: no interrupts at CPL3).
 *   Discovery: virtio-mmio version 2 devices of 4 KiB from 0xC000_1000
 *   (slot i at 0xC000_1000 + i * 0x1000, 32 slots tried); the first with
 *   MagicValue "virt", Version 2 and DeviceID 5 is the balloon. The VMM maps
 *   the window uncached and user-accessible (src/vstate/boot.rs); every
 *   access to it exits to the VMM, so registers are read only when needed.
 *   Initialisation (virtio 1.2, 3.1.1 and 4.2.3): reset (Status 0, read back
 *   until 0), ACKNOWLEDGE, DRIVER, DeviceFeatures (Sel 0 and 1), accept
 *   VERSION_1 (bit 32, required), MUST_TELL_HOST (0), STATS_VQ (1) and
 *   REPORTING (5) where offered (never FREE_PAGE_HINT (3), DEFLATE_ON_OOM
 *   (2) nor PAGE_POISON (4)), FEATURES_OK and check it stuck, set up the
 *   queues, DRIVER_OK. On failure Status gets FAILED.
 *   Queues: inflateq 0, deflateq 1, statsq 2 if STATS_VQ, then reportingq
 *   (2 or 3) if REPORTING. Each is given min(QueueNumMax, 64) entries,
 *   rounded down to a power of two. The driver keeps one buffer in flight
 *   per queue, always heads it with descriptor 0, notifies every time
 *   (QueueNotify = the queue's index), sets VIRTQ_AVAIL_F_NO_INTERRUPT and
 *   polls the used ring's idx in memory (a pause loop; the clock port only
 *   every 4096 rounds, for a 20 s timeout).
 *   Balloon pages: balloon page j is touched page T-1-j, T = the touched
 *   pages (touch=), counted across the RAM regions above BI_FW_END as the
 *   touch loop counts them: the balloon takes the top of the touched RAM
 *   downwards. Inflating and deflating go in batches of up to 256 PFNs (u32,
 *   guest address >> 12) in one device-readable descriptor; after each
 *   batch is used, config `actual` (0x104) is written. A target above T is
 *   held at T (and said once). After each change settles:
 *   "balloon actual <n> pages".
 *   Statistics: with STATS_VQ one device-readable buffer of three 10-byte
 *   {u16 tag, u64 val} entries is kept on the statsq: MEMTOT (5) = all RAM,
 *   MEMFREE (4) and AVAIL (6) = RAM above the firmware not touched, plus
 *   reported pages not in the balloon; refilled and re-queued each time the
 *   device uses it.
 *   Reporting (as Linux's page reporting sends it): chains of up to 32
 *   (or the queue's size) device-writable descriptors, each at most 4 MiB
 *   and split at 4 MiB-aligned addresses and region ends, from the top of
 *   the touched RAM downwards; one chain in flight, waited for until used.
 *   "balloon report took <ms> ms": from the first chain built to the last
 *   used (PORT_CLOCK). Then every reported page is read (all of it) and
 *   must be zero.
 *   Serving (balloon, then=idle): vCPU 0 spins (pause) and every ~65536
 *   rounds checks the statsq's used idx (memory), num_pages (one MMIO
 *   exit) and the i8042 for a Ctrl-Alt-Del (one port exit); the other
 *   vCPUs park as usual (with keep=writing they would rewrite balloon pages
 *   of their share: do not combine the two). A device given up (timeout)
 *   ends in the usual idle.
 *   Lines, all "teravm firmware: balloon ...":
 *     device at 0x<base> features 0x<accepted>
 *     actual <pages> pages
 *     report took <ms> ms
 *     reported <MiB> MiB, read back zero: yes|no
 *     error no device | error device reset did not complete |
 *     error device does not offer VERSION_1 | error device refused the
 *     features (FEATURES_OK) | error queue <i> unusable (in use or
 *     QueueNumMax 0) | error queue <i> timed out; device given up |
 *     error target <n> pages is more than the <m> pages touched |
 *     error device does not offer REPORTING
 *
 * Memory the firmware uses (all below BI_FW_END, so never in the touched
 * RAM the balloon takes pages from):
 *   0x7000 boot info, 0x8000 command line (the VMM's), 0x10000 this image
 *   (.text, .rodata, .data), then page aligned, not part of the image
 *   (.bss, firmware.ld keeps it below the stacks at 0x100000):
 *     ring_area   4 pages, one per queue slot (inflate, deflate, stats,
 *                 reporting): descriptors at +0 (16-byte aligned, 64 x 16
 *                 bytes), available ring at +0x400 (2-aligned, 4 + 2 x 64),
 *                 used ring at +0x800 (4-aligned, 4 + 8 x 64)
 *     pfn_buf     1 KiB, 256 PFNs of one inflate or deflate batch
 *     stats_buf   30 bytes, the statistics buffer
 *   0x100000 stacks (4 KiB per vCPU), 0x200000 page tables, BI_FW_END.
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

/* virtio-mmio (virtio 1.2, 4.2.2), version 2 register offsets. */
        .set VIRTIO_MMIO_FIRST, 0xc0001000
        .set VIRTIO_MMIO_SLOTS, 32
        .set VIRTIO_MAGIC,    0x74726976        /* "virt" */
        .set VIRTIO_ID_BALLOON, 5
        .set VM_MAGIC,        0x000
        .set VM_VERSION,      0x004
        .set VM_DEVICE_ID,    0x008
        .set VM_DEV_FEAT,     0x010
        .set VM_DEV_FEAT_SEL, 0x014
        .set VM_DRV_FEAT,     0x020
        .set VM_DRV_FEAT_SEL, 0x024
        .set VM_QUEUE_SEL,    0x030
        .set VM_QUEUE_NUM_MAX, 0x034
        .set VM_QUEUE_NUM,    0x038
        .set VM_QUEUE_READY,  0x044
        .set VM_QUEUE_NOTIFY, 0x050
        .set VM_STATUS,       0x070
        .set VM_DESC_LO,      0x080
        .set VM_DESC_HI,      0x084
        .set VM_DRIVER_LO,    0x090
        .set VM_DRIVER_HI,    0x094
        .set VM_DEVICE_LO,    0x0a0
        .set VM_DEVICE_HI,    0x0a4
        .set BL_NUM_PAGES,    0x100     /* config: u32 num_pages */
        .set BL_ACTUAL,       0x104     /* config: u32 actual */
/* Device status bits. */
        .set ST_ACK,          1
        .set ST_DRIVER,       2
        .set ST_DRIVER_OK,    4
        .set ST_FEATURES_OK,  8
        .set ST_FAILED,       0x80
/* Balloon features (virtio 1.2, 5.5.3) and the ones this driver accepts. */
        .set F_MUST_TELL_HOST, 1 << 0
        .set F_STATS_VQ,      1 << 1
        .set F_REPORTING,     1 << 5
        .set F_VERSION_1_HI,  1         /* bit 32: bit 0 of the high word */
        .set F_WANTED_LO,     F_MUST_TELL_HOST | F_STATS_VQ | F_REPORTING
/* Split virtqueues (virtio 1.2, 2.7). */
        .set VQ_MAX,          64        /* entries per queue, at most */
        .set VQ_AVAIL,        0x400     /* offsets in a queue's ring page */
        .set VQ_USED,         0x800
        .set DESC_F_NEXT,     1
        .set DESC_F_WRITE,    2
        .set AVAIL_F_NO_INTERRUPT, 1
/* vq_state: 16 bytes per queue slot. */
        .set VQS_INDEX,       0         /* u32 the device's queue index */
        .set VQS_SIZE,        4         /* u16 entries */
        .set VQS_AVAIL,       6         /* u16 next available idx */
        .set VQS_USED,        8         /* u16 used idx seen */
        .set VQS_PRESENT,     10        /* u8 set up */
        .set SLOT_INFLATE,    0
        .set SLOT_DEFLATE,    1
        .set SLOT_STATS,      2
        .set SLOT_REPORT,     3
        .set PFNS_MAX,        256       /* PFNs per inflate/deflate batch */
        .set REPORT_DESCS,    32        /* descriptors per report, at most */
        .set REPORT_CHUNK,    4 << 20   /* bytes per report descriptor, at most */
        .set VQ_TIMEOUT_MS,   20000
        .set SERVE_SPIN,      65536     /* pause rounds between device checks */
/* Statistics tags (virtio 1.2, 5.5.6.3). */
        .set S_MEMFREE,       4
        .set S_MEMTOT,        5
        .set S_AVAIL,         6

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
        cmp     byte ptr [rip + opt_balloon], 0
        jne     7f
        cmp     qword ptr [rip + opt_report], 0
        je      8f
7:      call    balloon_start

8:      cmp     byte ptr [rip + opt_fault], 2
        jne     4f
        mov     dx, PORT_UNKNOWN
5:      out     dx, al
        jmp     5b
4:      cmp     byte ptr [rip + opt_reset], 0
        jne     9f
        lea     rsi, [rip + msg_idle]
        call    puts
        cmp     byte ptr [rip + opt_balloon], 0
        je      idle
        jmp     balloon_serve
9:      cmp     byte ptr [rip + opt_balloon], 0
        je      reset
        call    bl_sync                 /* follow num_pages once */
        jmp     reset

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
        call    ram_above_fw
        mov     rdx, [rip + opt_touch]
        cmp     rdx, rax
        cmovb   rax, rdx
        and     rax, -PAGE
        ret

/* rax = bytes of RAM above the firmware (BI_FW_END). */
ram_above_fw:
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
3:      ret

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
        lea     rdi, [rip + key_report]
        call    match_key
        jc      .Lreport_val
        lea     rdi, [rip + key_balloon]
        call    match_value
        jnc     .Lskip
        mov     byte ptr [rip + opt_balloon], 1
        jmp     .Lword
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
2:      call    parse_mib
        jc      .Lbad
        mov     [rip + opt_touch], rax
        jmp     .Lword
.Lreport_val:
        call    parse_mib
        jc      .Lbad
        mov     [rip + opt_report], rax
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

/* Parse the decimal MiB at rsi (< r8) up to a space or the end: rax = bytes,
 * CF clear; CF set when there are no digits, a non-digit, or too many MiB. */
parse_mib:
        xor     eax, eax
        xor     edx, edx                /* digits seen */
1:      cmp     rsi, r8
        jae     2f
        movzx   ecx, byte ptr [rsi]
        cmp     cl, ' '
        je      2f
        sub     ecx, '0'
        cmp     ecx, 9
        ja      3f
        imul    rax, rax, 10
        add     rax, rcx
        mov     rcx, rax
        shr     rcx, 43                 /* above 2^43 MiB is nonsense */
        jnz     3f
        inc     edx
        inc     rsi
        jmp     1b
2:      test    edx, edx
        jz      3f
        shl     rax, 20
        clc
        ret
3:      stc
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

/* ------------------------------------------------------------------------
 * The balloon driver. vCPU 0 only. Registers: rbx = the device's MMIO base
 * inside the driver, r12 = a queue slot for vq_*; r14/r15 as everywhere.
 */

/* Find, initialise and (report=) report. Prints its own errors. */
balloon_start:
        push    rbx
        call    ram_above_fw
        sub     rax, [rip + touch_bytes]
        mov     [rip + bl_untouched], rax
        call    ram_total
        mov     [rip + bl_total], rax
        call    bl_probe
        jc      1f
        call    bl_init
        jc      1f
        call    bl_report
1:      pop     rbx
        ret

/* vCPU 0 with `balloon` and then=idle: serve the device until it fails,
 * the VMM stops us, or a Ctrl-Alt-Del asks for a reset. */
balloon_serve:
        cmp     qword ptr [rip + bl_base], 0
        je      idle
        call    bl_stats_poll
        call    bl_sync
        mov     dx, I8042_CMD
        in      al, dx
        test    al, 1
        jz      1f
        mov     dx, I8042_DATA
        in      al, dx
        jmp     reset
1:      mov     ecx, SERVE_SPIN
2:      pause
        dec     ecx
        jnz     2b
        jmp     balloon_serve

/* rax = bytes of all RAM regions. */
ram_total:
        xor     eax, eax
        xor     ecx, ecx
1:      cmp     ecx, [r15 + BI_NREGIONS]
        jae     2f
        mov     rdx, rcx
        shl     rdx, 4
        add     rax, [r15 + BI_REGIONS + rdx + 8]
        inc     ecx
        jmp     1b
2:      ret

/* Look for the balloon: rbx = its base and CF clear, or CF set (said). */
bl_probe:
        mov     ebx, VIRTIO_MMIO_FIRST
        mov     ecx, VIRTIO_MMIO_SLOTS
1:      mov     eax, dword ptr [rbx + VM_MAGIC]
        cmp     eax, VIRTIO_MAGIC
        jne     2f
        mov     eax, dword ptr [rbx + VM_VERSION]
        cmp     eax, 2
        jne     2f
        mov     eax, dword ptr [rbx + VM_DEVICE_ID]
        cmp     eax, VIRTIO_ID_BALLOON
        jne     2f
        clc
        ret
2:      add     ebx, 0x1000
        dec     ecx
        jnz     1b
        lea     rsi, [rip + msg_bl_nodev]
        call    puts
        stc
        ret

/* Initialise the device at rbx; on success bl_base = rbx, CF clear. */
bl_init:
        push    r12
        push    r13
        mov     dword ptr [rbx + VM_STATUS], 0      /* reset */
        mov     ecx, 1000
1:      mov     eax, dword ptr [rbx + VM_STATUS]
        test    eax, eax
        jz      2f
        pause
        dec     ecx
        jnz     1b
        lea     rsi, [rip + msg_bl_noreset]
        jmp     .Linit_fail
2:      mov     dword ptr [rbx + VM_STATUS], ST_ACK
        mov     dword ptr [rbx + VM_STATUS], ST_ACK | ST_DRIVER
        mov     dword ptr [rbx + VM_DEV_FEAT_SEL], 1
        mov     eax, dword ptr [rbx + VM_DEV_FEAT]
        and     eax, F_VERSION_1_HI
        jz      .Lno_v1
        mov     r12d, eax
        shl     r12, 32
        mov     dword ptr [rbx + VM_DEV_FEAT_SEL], 0
        mov     eax, dword ptr [rbx + VM_DEV_FEAT]
        and     eax, F_WANTED_LO
        or      r12, rax                /* the features accepted */
        mov     [rip + bl_feat], r12
        mov     dword ptr [rbx + VM_DRV_FEAT_SEL], 0
        mov     dword ptr [rbx + VM_DRV_FEAT], eax
        mov     dword ptr [rbx + VM_DRV_FEAT_SEL], 1
        mov     dword ptr [rbx + VM_DRV_FEAT], F_VERSION_1_HI
        mov     dword ptr [rbx + VM_STATUS], ST_ACK | ST_DRIVER | ST_FEATURES_OK
        mov     eax, dword ptr [rbx + VM_STATUS]
        test    eax, ST_FEATURES_OK
        jz      .Lfeat_refused
        /* Queues: inflateq 0, deflateq 1, statsq 2 if STATS_VQ, then
         * reportingq if REPORTING (no free_page_vq: FREE_PAGE_HINT refused). */
        mov     r12d, SLOT_INFLATE
        xor     r13d, r13d
        call    vq_setup
        jc      .Linit_failed
        mov     r12d, SLOT_DEFLATE
        mov     r13d, 1
        call    vq_setup
        jc      .Linit_failed
        mov     r13d, 2
        test    byte ptr [rip + bl_feat], F_STATS_VQ
        jz      3f
        mov     r12d, SLOT_STATS
        call    vq_setup
        jc      .Linit_failed
        inc     r13d
3:      test    byte ptr [rip + bl_feat], F_REPORTING
        jz      4f
        mov     r12d, SLOT_REPORT
        call    vq_setup
        jc      .Linit_failed
4:      mov     dword ptr [rbx + VM_STATUS], ST_ACK | ST_DRIVER | ST_FEATURES_OK | ST_DRIVER_OK
        mov     [rip + bl_base], rbx
        lea     rsi, [rip + msg_bl_dev]
        call    puts
        mov     rax, rbx
        call    put_hex
        lea     rsi, [rip + msg_bl_features]
        call    puts
        mov     rax, [rip + bl_feat]
        call    put_hex
        mov     al, 10
        call    putc
        /* Prime the statistics queue: the device returns the buffer when
         * it wants fresh numbers. */
        test    byte ptr [rip + bl_feat], F_STATS_VQ
        jz      5f
        call    bl_stats_post
5:      pop     r13
        pop     r12
        clc
        ret
.Lno_v1:
        lea     rsi, [rip + msg_bl_nov1]
        jmp     .Linit_fail
.Lfeat_refused:
        lea     rsi, [rip + msg_bl_featrefused]
.Linit_fail:
        call    puts
.Linit_failed:                          /* vq_setup said why */
        mov     eax, dword ptr [rbx + VM_STATUS]
        or      eax, ST_FAILED
        mov     dword ptr [rbx + VM_STATUS], eax
        pop     r13
        pop     r12
        stc
        ret

/* Set up queue slot r12 as the device's queue r13d: CF set on error (said). */
vq_setup:
        call    vq_ptrs
        push    rdi
        mov     ecx, PAGE / 8
        xor     eax, eax
        rep stosq                       /* a clean ring page */
        pop     rdi
        mov     word ptr [rdi + VQ_AVAIL], AVAIL_F_NO_INTERRUPT
        mov     dword ptr [rbx + VM_QUEUE_SEL], r13d
        mov     eax, dword ptr [rbx + VM_QUEUE_READY]
        test    eax, eax
        jnz     1f
        mov     eax, dword ptr [rbx + VM_QUEUE_NUM_MAX]
        test    eax, eax
        jz      1f
        mov     ecx, VQ_MAX
        cmp     eax, ecx
        cmova   eax, ecx
        bsr     ecx, eax                /* round down to a power of two */
        mov     eax, 1
        shl     eax, cl
        mov     dword ptr [rbx + VM_QUEUE_NUM], eax
        mov     [rsi + VQS_SIZE], ax
        mov     [rsi + VQS_INDEX], r13d
        mov     rax, rdi
        mov     dword ptr [rbx + VM_DESC_LO], eax
        shr     rax, 32
        mov     dword ptr [rbx + VM_DESC_HI], eax
        lea     rax, [rdi + VQ_AVAIL]
        mov     dword ptr [rbx + VM_DRIVER_LO], eax
        shr     rax, 32
        mov     dword ptr [rbx + VM_DRIVER_HI], eax
        lea     rax, [rdi + VQ_USED]
        mov     dword ptr [rbx + VM_DEVICE_LO], eax
        shr     rax, 32
        mov     dword ptr [rbx + VM_DEVICE_HI], eax
        mov     dword ptr [rbx + VM_QUEUE_READY], 1
        mov     byte ptr [rsi + VQS_PRESENT], 1
        clc
        ret
1:      lea     rsi, [rip + msg_bl_queue]
        call    puts
        mov     eax, r13d
        call    put_u64
        lea     rsi, [rip + msg_bl_unusable]
        call    puts
        stc
        ret

/* rdi = slot r12's ring page, rsi = its vq_state entry. */
vq_ptrs:
        mov     rax, r12
        shl     rax, 12
        lea     rdi, [rip + ring_area]
        add     rdi, rax
        mov     rax, r12
        shl     rax, 4
        lea     rsi, [rip + vq_state]
        add     rsi, rax
        ret

/* Make the chain headed by descriptor 0 of slot r12 available and notify
 * the device at rbx. */
vq_post:
        call    vq_ptrs
        movzx   eax, word ptr [rsi + VQS_AVAIL]
        movzx   ecx, word ptr [rsi + VQS_SIZE]
        dec     ecx
        and     ecx, eax
        mov     word ptr [rdi + VQ_AVAIL + 4 + rcx * 2], 0  /* head: descriptor 0 */
        inc     eax
        mov     [rsi + VQS_AVAIL], ax
        /* x86 keeps stores in order: the ring entry is seen before idx. */
        mov     [rdi + VQ_AVAIL + 2], ax
        mfence                          /* idx before the notification */
        mov     eax, [rsi + VQS_INDEX]
        mov     dword ptr [rbx + VM_QUEUE_NOTIFY], eax
        ret

/* Wait until the device has used slot r12's buffer: CF clear; or, after
 * VQ_TIMEOUT_MS, say so, give the device up (bl_base = 0) and set CF. */
vq_wait:
        call    vq_ptrs
        mov     dx, PORT_CLOCK
        in      eax, dx
        mov     r8d, eax
        xor     r9d, r9d
1:      movzx   eax, word ptr [rdi + VQ_USED + 2]   /* the device writes it */
        cmp     ax, [rsi + VQS_USED]
        jne     2f
        pause
        inc     r9d
        test    r9d, 0xfff
        jnz     1b
        mov     dx, PORT_CLOCK
        in      eax, dx
        sub     eax, r8d
        cmp     eax, VQ_TIMEOUT_MS
        jb      1b
        lea     rsi, [rip + msg_bl_queue]
        call    puts
        call    vq_ptrs
        mov     eax, [rsi + VQS_INDEX]
        call    put_u64
        lea     rsi, [rip + msg_bl_timeout]
        call    puts
        mov     qword ptr [rip + bl_base], 0
        mov     eax, dword ptr [rbx + VM_STATUS]
        or      eax, ST_FAILED
        mov     dword ptr [rbx + VM_STATUS], eax
        stc
        ret
2:      inc     word ptr [rsi + VQS_USED]
        clc
        ret

/* Linear touched page rax (0 = the first page above BI_FW_END, counted
 * across regions as touch_share counts them): rax = its guest address,
 * rdx = pages of its region from the region's first touchable page up to
 * and including it. Clobbers rcx, r8-r11. */
lin_addr:
        mov     r11, rax
        xor     ecx, ecx
        mov     r8, [r15 + BI_FW_END]
1:      cmp     ecx, [r15 + BI_NREGIONS]
        jae     3f
        mov     rdx, rcx
        shl     rdx, 4
        mov     r9, [r15 + BI_REGIONS + rdx]
        mov     r10, [r15 + BI_REGIONS + rdx + 8]
        add     r10, r9
        cmp     r9, r8
        cmovb   r9, r8
        inc     ecx
        cmp     r10, r9
        jbe     1b
        sub     r10, r9
        shr     r10, 12                 /* pages in this region */
        cmp     r11, r10
        jb      2f
        sub     r11, r10
        jmp     1b
2:      lea     rdx, [r11 + 1]
        mov     rax, r11
        shl     rax, 12
        add     rax, r9
        ret
3:      xor     eax, eax                /* past the RAM: callers never ask */
        mov     edx, 1
        ret

/* Fill pfn_buf with the PFNs of balloon pages rdi .. rdi + esi - 1 (balloon
 * page j = touched page T - 1 - j). */
bl_pfns:
        push    r12
        push    r13
        push    rbx
        mov     r12, rdi
        mov     r13d, esi
        lea     rbx, [rip + pfn_buf]
1:      mov     rax, [rip + touch_bytes]
        shr     rax, 12
        sub     rax, r12
        dec     rax
        call    lin_addr
        shr     rax, 12
        mov     [rbx], eax
        add     rbx, 4
        inc     r12
        dec     r13d
        jnz     1b
        pop     rbx
        pop     r13
        pop     r12
        ret

/* Bring `actual` to num_pages (held at the touched pages), a batch at a
 * time, re-reading num_pages after each; say "actual" if it moved. */
bl_sync:
        push    rbx
        push    r12
        push    r13
        mov     rbx, [rip + bl_base]
        test    rbx, rbx
        jz      .Lsync_done
        xor     r13d, r13d              /* moved? */
.Lsync_again:
        mov     eax, dword ptr [rbx + BL_NUM_PAGES]
        mov     rdx, [rip + touch_bytes]
        shr     rdx, 12
        cmp     rax, rdx
        jbe     2f
        cmp     eax, [rip + bl_warned]
        je      1f
        mov     [rip + bl_warned], eax
        push    rdx
        push    rax
        lea     rsi, [rip + msg_bl_target]
        call    puts
        mov     rax, [rsp]
        call    put_u64
        lea     rsi, [rip + msg_bl_morethan]
        call    puts
        mov     rax, [rsp + 8]
        call    put_u64
        lea     rsi, [rip + msg_bl_touched]
        call    puts
        pop     rax
        pop     rdx
1:      mov     rax, rdx
2:      mov     ecx, [rip + bl_actual]
        cmp     rax, rcx
        je      .Lsync_settled
        ja      .Linflate
        /* deflate: the last min(actual - want, 256) pages inflated */
        sub     rcx, rax
        mov     eax, PFNS_MAX
        cmp     rcx, rax
        cmova   rcx, rax
        mov     [rip + bl_batch], ecx
        mov     edi, [rip + bl_actual]
        sub     rdi, rcx
        mov     esi, ecx
        call    bl_pfns
        mov     r12d, SLOT_DEFLATE
        call    bl_tell
        jc      .Lsync_done
        mov     eax, [rip + bl_batch]
        sub     [rip + bl_actual], eax
        jmp     .Lsync_moved
.Linflate:
        sub     rax, rcx
        mov     ecx, PFNS_MAX
        cmp     rax, rcx
        cmova   rax, rcx
        mov     [rip + bl_batch], eax
        mov     edi, [rip + bl_actual]
        mov     esi, eax
        call    bl_pfns
        mov     r12d, SLOT_INFLATE
        call    bl_tell
        jc      .Lsync_done
        mov     eax, [rip + bl_batch]
        add     [rip + bl_actual], eax
.Lsync_moved:
        mov     eax, [rip + bl_actual]
        mov     dword ptr [rbx + BL_ACTUAL], eax
        mov     r13d, 1
        jmp     .Lsync_again
.Lsync_settled:
        test    r13d, r13d
        jz      .Lsync_done
        lea     rsi, [rip + msg_bl_actual]
        call    puts
        mov     eax, [rip + bl_actual]
        call    put_u64
        lea     rsi, [rip + msg_bl_pages]
        call    puts
.Lsync_done:
        pop     r13
        pop     r12
        pop     rbx
        ret

/* Send bl_batch PFNs of pfn_buf on slot r12 (one device-readable
 * descriptor) and wait for it to be used: CF set if it never is. */
bl_tell:
        call    vq_ptrs
        lea     rax, [rip + pfn_buf]
        mov     [rdi], rax
        mov     eax, [rip + bl_batch]
        shl     eax, 2
        mov     [rdi + 8], eax
        mov     dword ptr [rdi + 12], 0         /* flags 0, next 0 */
        call    vq_post
        jmp     vq_wait

/* Fill stats_buf and make it available on the statsq. rbx = the device. */
bl_stats_post:
        push    r12
        lea     rdi, [rip + stats_buf]
        mov     rax, [rip + bl_reported]
        mov     ecx, [rip + bl_actual]
        cmp     rax, rcx
        cmovb   rax, rcx
        sub     rax, rcx                /* reported pages not in the balloon */
        shl     rax, 12
        add     rax, [rip + bl_untouched]
        mov     word ptr [rdi], S_MEMTOT
        mov     rcx, [rip + bl_total]
        mov     [rdi + 2], rcx
        mov     word ptr [rdi + 10], S_MEMFREE
        mov     [rdi + 12], rax
        mov     word ptr [rdi + 20], S_AVAIL
        mov     [rdi + 22], rax
        mov     r12d, SLOT_STATS
        call    vq_ptrs
        lea     rax, [rip + stats_buf]
        mov     [rdi], rax
        mov     dword ptr [rdi + 8], 30
        mov     dword ptr [rdi + 12], 0         /* device-readable, no next */
        call    vq_post
        pop     r12
        ret

/* If the device has used the statistics buffer, refill and repost it. */
bl_stats_poll:
        cmp     byte ptr [rip + vq_state + SLOT_STATS * 16 + VQS_PRESENT], 0
        je      1f
        movzx   eax, word ptr [rip + ring_area + SLOT_STATS * PAGE + VQ_USED + 2]
        cmp     ax, [rip + vq_state + SLOT_STATS * 16 + VQS_USED]
        je      1f
        mov     [rip + vq_state + SLOT_STATS * 16 + VQS_USED], ax
        push    rbx
        mov     rbx, [rip + bl_base]
        call    bl_stats_post
        pop     rbx
1:      ret

/* report=: report the top of the touched RAM as free, then read it back. */
bl_report:
        push    r12
        push    r13
        mov     rax, [rip + opt_report]
        test    rax, rax
        jz      .Lrep_done
        test    byte ptr [rip + bl_feat], F_REPORTING
        jnz     1f
        lea     rsi, [rip + msg_bl_norep]
        call    puts
        jmp     .Lrep_done
1:      shr     rax, 12
        mov     r13, [rip + touch_bytes]
        shr     r13, 12                 /* r13 = top (exclusive), linear */
        cmp     rax, r13
        cmova   rax, r13
        mov     [rip + bl_reported], rax
        mov     rcx, r13
        sub     rcx, rax
        mov     [rip + rep_bottom], rcx
        mov     r12d, SLOT_REPORT
        movzx   eax, word ptr [rip + vq_state + SLOT_REPORT * 16 + VQS_SIZE]
        mov     ecx, REPORT_DESCS
        cmp     eax, ecx
        cmova   eax, ecx
        mov     [rip + rep_max], eax
        mov     dx, PORT_CLOCK
        in      eax, dx
        mov     [rip + rep_t0], eax
.Lrep_batch:
        cmp     r13, [rip + rep_bottom]
        jbe     .Lrep_check
        mov     dword ptr [rip + rep_count], 0
.Lrep_desc:
        lea     rax, [r13 - 1]
        call    lin_addr                /* rax = top page's address, rdx = run */
        mov     rcx, r13
        sub     rcx, [rip + rep_bottom]
        cmp     rdx, rcx
        cmova   rdx, rcx                /* pages to report below the top */
        lea     r8, [rax + PAGE]        /* end */
        shl     rdx, 12
        mov     r10, r8
        sub     r10, rdx                /* lowest start */
        lea     r11, [r8 - 1]
        and     r11, -REPORT_CHUNK      /* the 4 MiB block the end is in */
        cmp     r11, r10
        cmovb   r11, r10                /* start */
        sub     r8, r11                 /* length */
        mov     r9, r8
        shr     r9, 12
        sub     r13, r9
        call    vq_ptrs
        mov     eax, [rip + rep_count]
        mov     ecx, eax
        shl     ecx, 4
        add     rdi, rcx
        mov     [rdi], r11
        mov     [rdi + 8], r8d
        mov     word ptr [rdi + 12], DESC_F_WRITE | DESC_F_NEXT
        inc     eax
        mov     [rdi + 14], ax
        mov     [rip + rep_count], eax
        cmp     eax, [rip + rep_max]
        jae     2f
        cmp     r13, [rip + rep_bottom]
        ja      .Lrep_desc
2:      mov     word ptr [rdi + 12], DESC_F_WRITE           /* the chain's end */
        mov     word ptr [rdi + 14], 0
        push    rbx
        mov     rbx, [rip + bl_base]
        call    vq_post
        call    vq_wait
        pop     rbx
        jc      .Lrep_done
        jmp     .Lrep_batch
.Lrep_check:
        mov     dx, PORT_CLOCK
        in      eax, dx
        sub     eax, [rip + rep_t0]
        push    rax
        lea     rsi, [rip + msg_bl_took]
        call    puts
        pop     rax
        call    put_u64
        lea     rsi, [rip + msg_ms]
        call    puts
        /* Read back every reported page. */
        mov     r13, [rip + touch_bytes]
        shr     r13, 12
        mov     byte ptr [rip + rep_nonzero], 0
3:      cmp     r13, [rip + rep_bottom]
        jbe     4f
        lea     rax, [r13 - 1]
        call    lin_addr
        mov     rcx, r13
        sub     rcx, [rip + rep_bottom]
        cmp     rdx, rcx
        cmova   rdx, rcx
        sub     r13, rdx
        lea     rdi, [rax + PAGE]
        shl     rdx, 12
        sub     rdi, rdx
        mov     rcx, rdx
        shr     rcx, 3
        xor     eax, eax
        repe scasq
        je      3b
        mov     byte ptr [rip + rep_nonzero], 1
        jmp     3b
4:      lea     rsi, [rip + msg_bl_reported]
        call    puts
        mov     rax, [rip + bl_reported]
        shr     rax, 8                  /* pages to MiB */
        call    put_u64
        lea     rsi, [rip + msg_bl_zero_yes]
        cmp     byte ptr [rip + rep_nonzero], 0
        je      5f
        lea     rsi, [rip + msg_bl_zero_no]
5:      call    puts
.Lrep_done:
        pop     r13
        pop     r12
        ret

/* Print rax in hexadecimal, with 0x. */
put_hex:
        sub     rsp, 32
        lea     rdi, [rsp + 31]
        mov     byte ptr [rdi], 0
        lea     rcx, [rip + hex_digits]
1:      mov     edx, eax
        and     edx, 15
        mov     dl, [rcx + rdx]
        dec     rdi
        mov     [rdi], dl
        shr     rax, 4
        jnz     1b
        dec     rdi
        mov     byte ptr [rdi], 'x'
        dec     rdi
        mov     byte ptr [rdi], '0'
        mov     rsi, rdi
        call    puts
        add     rsp, 32
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
key_report:      .asciz "report="
key_balloon:     .asciz "balloon"
val_all:         .asciz "all"
val_reset:       .asciz "reset"
val_idle:        .asciz "idle"
val_triple:      .asciz "triple"
val_ports:       .asciz "ports"
val_writing:     .asciz "writing"
hex_digits:      .ascii "0123456789abcdef"
msg_bl_nodev:    .asciz "teravm firmware: balloon error no device\n"
msg_bl_noreset:  .asciz "teravm firmware: balloon error device reset did not complete\n"
msg_bl_nov1:     .asciz "teravm firmware: balloon error device does not offer VERSION_1\n"
msg_bl_featrefused: .asciz "teravm firmware: balloon error device refused the features (FEATURES_OK)\n"
msg_bl_queue:    .asciz "teravm firmware: balloon error queue "
msg_bl_unusable: .asciz " unusable (in use or QueueNumMax 0)\n"
msg_bl_timeout:  .asciz " timed out; device given up\n"
msg_bl_dev:      .asciz "teravm firmware: balloon device at "
msg_bl_features: .asciz " features "
msg_bl_target:   .asciz "teravm firmware: balloon error target "
msg_bl_morethan: .asciz " pages is more than the "
msg_bl_touched:  .asciz " pages touched\n"
msg_bl_actual:   .asciz "teravm firmware: balloon actual "
msg_bl_pages:    .asciz " pages\n"
msg_bl_norep:    .asciz "teravm firmware: balloon error device does not offer REPORTING\n"
msg_bl_reported: .asciz "teravm firmware: balloon reported "
msg_bl_took:     .asciz "teravm firmware: balloon report took "
msg_bl_zero_yes: .asciz " MiB, read back zero: yes\n"
msg_bl_zero_no:  .asciz " MiB, read back zero: no\n"

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
opt_report:     .quad 0
t0_ms:          .long 0
opt_reset:      .byte 0
opt_fault:      .byte 0
opt_keep:       .byte 0
opt_balloon:    .byte 0
rep_nonzero:    .byte 0
        .balign 8
bl_base:        .quad 0                 /* the balloon's MMIO base; 0: none */
bl_feat:        .quad 0                 /* features accepted */
bl_total:       .quad 0                 /* bytes of RAM */
bl_untouched:   .quad 0                 /* bytes above the firmware not touched */
bl_reported:    .quad 0                 /* pages reported (report=) */
rep_bottom:     .quad 0                 /* linear page where reporting stops */
bl_actual:      .long 0                 /* pages in the balloon */
bl_warned:      .long 0                 /* last target said to be too big */
bl_batch:       .long 0
rep_count:      .long 0
rep_max:        .long 0
rep_t0:         .long 0                 /* clock when reporting began, ms */
        .balign 16
vq_state:       .skip 4 * 16

/* Not part of the image (firmware.ld): zeroed by the driver before use. */
        .bss
        .balign 4096
ring_area:      .skip 4 * PAGE
pfn_buf:        .skip PFNS_MAX * 4
stats_buf:      .skip 32
