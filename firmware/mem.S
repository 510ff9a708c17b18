/*
 * `mem` and `mem=unplug-all` (issue 27's contract words), included by
 * firmware.S: a virtio-mem driver (virtio 1.2, 5.15), vCPU 0 only, run last
 * (after the balloon and the other devices) and for ever: it follows each
 * device's requested_size until the VMM stops the guest (a Ctrl-Alt-Del
 * still resets).
 *
 * Devices: every virtio-mmio slot (32, as vdev_probe tries them) whose
 * DeviceID is 24, one per guest node, MEM_MAX at most (the rest ignored).
 * Each is reset and negotiated by vdev_begin: VERSION_1 (required),
 * UNPLUGGED_INACCESSIBLE (1) and ACPI_PXM (0) where offered; its one queue
 * (guestq, 0) in queue slot SLOT_MEM0 + i, with interrupts on (no
 * AVAIL_F_NO_INTERRUPT); DRIVER_OK. Config (le64 unless said): block_size
 * @0x100, le16 node_id @0x108, addr @0x110, region_size @0x118,
 * usable_region_size @0x120, plugged_size @0x128, requested_size @0x130,
 * each read with one 8-byte access. A block size that is not a power of
 * two of at least 4 KiB, or an addr not aligned to it, gives the device up.
 * A device that reports plugged_size != 0 at start gets UNPLUG_ALL, as
 * Linux sends it at probe.
 *
 * What is plugged is kept as a prefix [addr, addr + plugged) of the region,
 * as Linux's driver plugs and unplugs (Big Block Mode): target =
 * min(requested_size, usable_region_size, region_size), rounded down to the
 * block size. While plugged < target: PLUG of [cur, cur + n) with cur =
 * addr + plugged and n up to the next MEM_CHUNK boundary (128 MiB, Linux's
 * memory block; the block size if larger) and not past target; then every
 * 4 KiB page of it has its first qword exchanged for its own address (the
 * old value must be 0: else "mem dirty" and the driver stops changing) and
 * read back.
 * While plugged > target: UNPLUG of the top down to the MEM_CHUNK boundary
 * below the top, and not below target; with mem=unplug-all and a target of
 * 0, one UNPLUG_ALL instead. One request at a time, devices in index order,
 * requested_size of every device read again after each.
 *
 * A request is descriptor 0 (24 bytes, device-readable: le16 type, 6 bytes
 * of padding, le64 addr, le16 nb_blocks, 6 bytes of padding) chained to
 * descriptor 1 (10 bytes, device-writable: le16 type preset to 0xffff,
 * 6 bytes of padding, le16 state). ACK goes on; BUSY sends the same request
 * again after a wait of MEM_BUSY_MS; NACK, ERROR (or a response never
 * written, 65535) print "mem error <type>" and the driver stops changing.
 *
 * Waiting (a Linux guest halts until the interrupt): out PORT_WAIT, eax =
 * the device's slot index | timeout ms << 16; the VMM's vCPU thread sleeps
 * until that device's InterruptStatus is non-zero (or the timeout), then
 * InterruptStatus is read and written to InterruptACK. Without the port the
 * out returns at once, so every wait that finds nothing pending spins
 * MEM_SPIN pauses (polling the used ring in memory while a request is out):
 * the loop stays correct as a poll. While idle the driver waits on one
 * device at a time (MEM_IDLE_MS, all devices' InterruptStatus acked after
 * each wake; 1 s when there is one device) and reads every device's
 * requested_size and usable_region_size after each wake. A response waited
 * for VQ_TIMEOUT_MS in all gives the device up ("queue 0 timed out").
 *
 * Page tables: the region lies above RAM, where the VMM's identity map
 * (src/vstate/boot.rs: PML4 at PAGE_TABLES_ADDR, 2 MiB pages) has nothing.
 * Before a PLUG the driver maps the gigabytes it covers, identity, user,
 * writable: a page directory of 2 MiB pages per GiB; a PML4 entry with
 * no PDPT gets one. Never 1 GiB pages: on a PVM host CPUID at CPL3 may run
 * on the host CPU and say it has them while the KVM the guest runs on
 * does not (the PS bit is then reserved: a fault, a triple fault here).
 * The tables come from mem_pt (MEM_PT_PAGES pages, one per GiB). Only
 * not-present entries are written, so no TLB entry is ever stale (CPL3
 * cannot invalidate) and the existing mapping of RAM is not touched.
 *
 * Lines ("teravm firmware: mem ..."):
 *   device at 0x<base> features 0x<accepted> node <n> addr 0x<addr> size
 *     <MiB> MiB block <KiB> KiB
 *   plugged <N> MiB (<T> MiB plugged) | unplugged <N> MiB (<T> MiB plugged)
 *     (when every device is at its target again after a change: N what the
 *     round plugged, resp. unplugged, T all plugged now)
 *   dirty | error <type> | error readback at 0x<addr> |
 *   error no room for page tables at 0x<addr> | error bad block size <n> |
 *   error no device | error queue 0 timed out; device given up | the
 *   vdev_begin and vq_setup errors
 */

        .set VIRTIO_ID_MEM,   24
        .set MEM_F_ACPI_PXM,  1 << 0
        .set MEM_F_UNPLUGGED_INACCESSIBLE, 1 << 1
        .set MC_BLOCK,        0x100
        .set MC_NODE,         0x108
        .set MC_ADDR,         0x110
        .set MC_REGION,       0x118
        .set MC_USABLE,       0x120
        .set MC_PLUGGED,      0x128
        .set MC_REQUESTED,    0x130
        .set MEM_INT_STATUS,  0x060
        .set MEM_INT_ACK,     0x064
        .set MEM_PORT_WAIT,   0xf0c     /* out: wait for a device's interrupt */
        .set MEM_T_PLUG,      0
        .set MEM_T_UNPLUG,    1
        .set MEM_T_UNPLUG_ALL, 2
        .set MEM_R_BUSY,      2
        .set MEM_CHUNK,       128 << 20
        .set MEM_WAIT_MS,     1000      /* one wait for a response */
        .set MEM_IDLE_MS,     20        /* one idle wait, several devices */
        .set MEM_IDLE1_MS,    1000      /* one idle wait, one device */
        .set MEM_BUSY_MS,     1
        .set MEM_SPIN,        16384
        .set MEM_PT_PAGES,    96
        .set MEM_PML4,        0x200000  /* PAGE_TABLES_ADDR (src/vstate/boot.rs) */
        .set MEM_PTE_TABLE,   0x7       /* present, writable, user */
        .set MEM_PTE_LARGE,   0x87      /* and a 1 GiB or 2 MiB page */
/* A device entry (mem_devs). */
        .set D_BASE,          0
        .set D_BLOCK,         8
        .set D_ADDR,          16
        .set D_REGION,        24
        .set D_USABLE,        32
        .set D_PLUGGED,       40
        .set D_TARGET,        48
        .set D_REQ,           56
        .set D_QSLOT,         64        /* u32 its queue slot */
        .set D_NODE,          68        /* u16 */
        .set D_SIZE,          128

        .text
/* Parse one word at rsi (< r8) if it is `mem` or `mem=unplug-all`: eax = 0
 * not one of them (rsi kept), 1 taken (rsi past it), 2 bad. */
mem_parse_word:
        lea     rdi, [rip + key_mem]
        call    match_value
        jnc     1f
        mov     byte ptr [rip + opt_mem], 1
        mov     eax, 1
        ret
1:      lea     rdi, [rip + key_mem_eq]
        call    match_key
        jnc     2f
        lea     rdi, [rip + val_unplug_all]
        call    match_value
        jnc     3f
        mov     byte ptr [rip + opt_mem], 1
        mov     byte ptr [rip + opt_mem_all], 1
        mov     eax, 1
        ret
2:      xor     eax, eax
        ret
3:      mov     eax, 2
        ret

/* vCPU 0 with `mem`: find the devices, then follow them for ever. */
mem_main:
        lea     rax, [rip + tag_mem]
        mov     [rip + dev_tag], rax
        call    mem_probe_all
        cmp     dword ptr [rip + mem_n], 0
        jne     2f
        lea     rsi, [rip + msg_e_nodev]
        call    say_err
        jmp     idle
2:      lea     rsi, [rip + msg_idle]
        call    puts

mem_serve:
        mov     dx, I8042_CMD           /* a Ctrl-Alt-Del: reset */
        in      al, dx
        test    al, 1
        jz      1f
        mov     dx, I8042_DATA
        in      al, dx
        jmp     reset
1:      cmp     byte ptr [rip + mem_stopped], 0
        jne     .Lms_wait
        call    mem_step
        jc      mem_serve               /* a request went out: look again */
        call    mem_round_end
.Lms_wait:
        call    mem_idle_wait
        jmp     mem_serve

/* Every device of ID 24 in slot order: set up (mem_init_dev), counted in
 * mem_n. */
mem_probe_all:
        push    rbx
        mov     dword ptr [rip + mem_scan], 0
1:      mov     eax, [rip + mem_scan]
        cmp     eax, VIRTIO_MMIO_SLOTS
        jae     3f
        cmp     dword ptr [rip + mem_n], MEM_MAX
        jae     3f
        shl     eax, 12
        add     eax, VIRTIO_MMIO_FIRST
        mov     ebx, eax
        cmp     dword ptr [rbx + VM_MAGIC], VIRTIO_MAGIC
        jne     2f
        cmp     dword ptr [rbx + VM_VERSION], 2
        jne     2f
        cmp     dword ptr [rbx + VM_DEVICE_ID], VIRTIO_ID_MEM
        jne     2f
        call    mem_init_dev
2:      inc     dword ptr [rip + mem_scan]
        jmp     1b
3:      pop     rbx
        ret

/* Set up the device at rbx (slot mem_scan) as entry mem_n; on success say
 * its line, count it and empty it if it says something is plugged. */
mem_init_dev:
        push    rbp
        push    r12
        push    r13
        mov     eax, [rip + mem_n]
        lea     r12d, [eax + SLOT_MEM0]
        shl     eax, 7                  /* D_SIZE */
        lea     rbp, [rip + mem_devs]
        add     rbp, rax
        mov     esi, MEM_F_ACPI_PXM | MEM_F_UNPLUGGED_INACCESSIBLE
        call    vdev_begin              /* said, FAILED, on failure */
        jc      .Lmi_out
        mov     [rip + mem_feat], rax
        xor     r13d, r13d
        call    vq_setup
        jc      .Lmi_fail
        call    vq_ptrs
        mov     word ptr [rdi + VQ_AVAIL], 0    /* interrupts wanted */
        call    vdev_ok
        jc      .Lmi_out
        mov     [rbp + D_BASE], rbx
        mov     [rbp + D_QSLOT], r12d
        mov     rax, [rbx + MC_BLOCK]
        mov     [rbp + D_BLOCK], rax
        movzx   eax, word ptr [rbx + MC_NODE]
        mov     [rbp + D_NODE], ax
        mov     rax, [rbx + MC_ADDR]
        mov     [rbp + D_ADDR], rax
        mov     rax, [rbx + MC_REGION]
        mov     [rbp + D_REGION], rax
        mov     rax, [rbx + MC_USABLE]
        mov     [rbp + D_USABLE], rax
        xor     eax, eax
        mov     [rbp + D_PLUGGED], rax
        mov     [rbp + D_TARGET], rax
        mov     [rbp + D_REQ], rax
        mov     rax, [rbp + D_BLOCK]
        cmp     rax, PAGE
        jb      .Lmi_bad
        lea     rcx, [rax - 1]
        test    rax, rcx
        jnz     .Lmi_bad
        test    [rbp + D_ADDR], rcx
        jnz     .Lmi_bad
        mov     rax, [rip + mem_feat]
        call    vdev_line               /* "... mem device at 0x.. features 0x.." */
        lea     rsi, [rip + msg_mem_node]
        call    puts
        movzx   eax, word ptr [rbp + D_NODE]
        call    put_u64
        lea     rsi, [rip + msg_mem_addr]
        call    puts
        mov     rax, [rbp + D_ADDR]
        call    put_hex
        lea     rsi, [rip + msg_mem_size]
        call    puts
        mov     rax, [rbp + D_REGION]
        shr     rax, 20
        call    put_u64
        lea     rsi, [rip + msg_mem_block]
        call    puts
        mov     rax, [rbp + D_BLOCK]
        shr     rax, 10
        call    put_u64
        lea     rsi, [rip + msg_mem_kib]
        call    puts
        inc     dword ptr [rip + mem_n]
        mov     rax, [rbx + MC_PLUGGED]
        test    rax, rax
        jz      .Lmi_out
        mov     eax, MEM_T_UNPLUG_ALL
        xor     edx, edx
        xor     ecx, ecx
        call    mem_request             /* a failure stops the driver (said) */
        jmp     .Lmi_out
.Lmi_bad:
        lea     rsi, [rip + msg_mem_bs]
        call    say_err
        mov     rax, [rbp + D_BLOCK]
        call    put_u64
        mov     al, 10
        call    putc
.Lmi_fail:
        call    vdev_fail
.Lmi_out:
        pop     r13
        pop     r12
        pop     rbp
        ret

/* Read every device's targets; for the first one not at its target send
 * one request (and touch what it plugged): CF set. CF clear: all at their
 * targets. */
mem_step:
        push    rbx
        push    rbp
        push    r12
        lea     rbp, [rip + mem_devs]
        xor     r12d, r12d
        xor     r8d, r8d                /* work: the first entry with some */
1:      cmp     r12d, [rip + mem_n]
        jae     2f
        mov     rbx, [rbp + D_BASE]
        mov     rax, [rbx + MC_REQUESTED]
        mov     [rbp + D_REQ], rax
        mov     rcx, [rbx + MC_USABLE]
        mov     [rbp + D_USABLE], rcx
        cmp     rax, rcx
        cmova   rax, rcx
        mov     rcx, [rbp + D_REGION]
        cmp     rax, rcx
        cmova   rax, rcx
        mov     rcx, [rbp + D_BLOCK]
        neg     rcx
        and     rax, rcx                /* whole blocks */
        mov     [rbp + D_TARGET], rax
        test    r8, r8
        jnz     3f
        cmp     rax, [rbp + D_PLUGGED]
        je      3f
        mov     r8, rbp
3:      add     rbp, D_SIZE
        inc     r12d
        jmp     1b
2:      test    r8, r8
        jz      .Lst_none               /* CF clear */
        mov     rbp, r8
        mov     rbx, [rbp + D_BASE]
        mov     rax, [rbp + D_TARGET]
        mov     rcx, [rbp + D_PLUGGED]
        cmp     rcx, rax
        jb      .Lst_plug
        /* unplug: the top down to the chunk boundary, not below target */
        test    rax, rax
        jnz     4f
        cmp     byte ptr [rip + opt_mem_all], 0
        je      4f
        mov     eax, MEM_T_UNPLUG_ALL
        xor     edx, edx
        xor     ecx, ecx
        call    mem_request
        jc      .Lst_done
        mov     rax, [rbp + D_PLUGGED]
        add     [rip + mem_round_unplug], rax
        mov     qword ptr [rbp + D_PLUGGED], 0
        jmp     .Lst_done
4:      call    mem_chunk_mask          /* rdx = -chunk */
        mov     rsi, [rbp + D_ADDR]
        lea     rdi, [rsi + rcx]        /* top */
        lea     r9, [rdi - 1]
        and     r9, rdx                 /* the boundary below the top */
        add     rax, rsi                /* addr + target */
        cmp     r9, rax
        cmovb   r9, rax
        sub     rdi, r9                 /* bytes */
        push    rdi
        mov     rax, rdi
        xor     edx, edx
        div     qword ptr [rbp + D_BLOCK]
        mov     ecx, eax                /* nb_blocks */
        mov     rdx, r9
        mov     eax, MEM_T_UNPLUG
        call    mem_request
        pop     rdi
        jc      .Lst_done
        sub     [rbp + D_PLUGGED], rdi
        add     [rip + mem_round_unplug], rdi
        jmp     .Lst_done
.Lst_plug:
        call    mem_chunk_mask
        mov     rsi, [rbp + D_ADDR]
        lea     rdi, [rsi + rcx]        /* cur */
        mov     r9, rdi
        sub     r9, rdx                 /* cur + chunk */
        and     r9, rdx                 /* the boundary above cur */
        add     rax, rsi                /* addr + target */
        cmp     r9, rax
        cmova   r9, rax
        sub     r9, rdi                 /* bytes */
        mov     [rip + mem_cur], rdi
        mov     [rip + mem_len], r9
        mov     rsi, r9
        call    mem_map                 /* said, stopped, on failure */
        jc      .Lst_done
        mov     rax, [rip + mem_len]
        xor     edx, edx
        div     qword ptr [rbp + D_BLOCK]
        mov     ecx, eax
        mov     rdx, [rip + mem_cur]
        mov     eax, MEM_T_PLUG
        call    mem_request
        jc      .Lst_done
        mov     rax, [rip + mem_len]
        add     [rbp + D_PLUGGED], rax
        add     [rip + mem_round_plug], rax
        mov     rdi, [rip + mem_cur]
        mov     rsi, [rip + mem_len]
        call    mem_touch               /* said, stopped, on failure */
.Lst_done:
        stc
.Lst_none:
        pop     r12
        pop     rbp
        pop     rbx
        ret

/* rdx = -max(MEM_CHUNK, the block size of rbp), a mask. */
mem_chunk_mask:
        mov     rdx, [rbp + D_BLOCK]
        mov     r10d, MEM_CHUNK
        cmp     rdx, r10
        cmovb   rdx, r10
        neg     rdx
        ret

/* Send one request on rbp's device: eax = type, rdx = addr, ecx =
 * nb_blocks; again while the answer is BUSY. ACK: CF clear. Otherwise said
 * and mem_stopped set, CF set. */
mem_request:
        push    rbx
        push    r12
        mov     rbx, [rbp + D_BASE]
        mov     r12d, [rbp + D_QSLOT]
        lea     rdi, [rip + mem_req]
        mov     qword ptr [rdi], 0
        mov     qword ptr [rdi + 16], 0
        mov     [rdi], ax
        mov     [rdi + 8], rdx
        mov     [rdi + 16], cx
.Lrq_again:
        lea     rdi, [rip + mem_resp]
        mov     qword ptr [rdi], 0xffff
        mov     qword ptr [rdi + 8], 0
        lea     rax, [rip + mem_req]
        mov     edx, 24
        mov     r8d, DESC_F_NEXT | (1 << 16)
        xor     ecx, ecx
        call    vq_desc
        lea     rax, [rip + mem_resp]
        mov     edx, 10
        mov     r8d, DESC_F_WRITE
        mov     ecx, 1
        call    vq_desc
        xor     eax, eax
        call    vq_post_head
        call    mem_wait_used
        jc      .Lrq_stop
        call    vq_pop
        movzx   eax, word ptr [rip + mem_resp]
        test    eax, eax
        jz      .Lrq_out                /* ACK, CF clear */
        cmp     eax, MEM_R_BUSY
        jne     1f
        mov     eax, MEM_BUSY_MS
        call    mem_wait_port
        jmp     .Lrq_again
1:      push    rax
        lea     rsi, [rip + msg_mem_err]
        call    say_err
        pop     rax
        call    put_u64
        mov     al, 10
        call    putc
.Lrq_stop:
        mov     byte ptr [rip + mem_stopped], 1
        stc
.Lrq_out:
        pop     r12
        pop     rbx
        ret

/* Wait until slot r12 of the device at rbx has a used element: CF clear;
 * after VQ_TIMEOUT_MS said, FAILED, CF set. */
mem_wait_used:
        mov     dx, PORT_CLOCK
        in      eax, dx
        mov     [rip + mem_t0], eax
1:      call    vq_ptrs
        movzx   eax, word ptr [rdi + VQ_USED + 2]
        cmp     ax, [rsi + VQS_USED]
        jne     3f
        mov     eax, MEM_WAIT_MS
        call    mem_wait_port
        jnz     2f                      /* an interrupt: look again */
        call    vq_ptrs                 /* nothing: poll the ring a while */
        mov     ecx, MEM_SPIN
4:      movzx   eax, word ptr [rdi + VQ_USED + 2]
        cmp     ax, [rsi + VQS_USED]
        jne     3f
        pause
        dec     ecx
        jnz     4b
2:      mov     dx, PORT_CLOCK
        in      eax, dx
        sub     eax, [rip + mem_t0]
        cmp     eax, VQ_TIMEOUT_MS
        jb      1b
        lea     rsi, [rip + msg_e_queue]
        call    say_err
        mov     al, '0'
        call    putc
        lea     rsi, [rip + msg_bl_timeout]
        call    puts
        jmp     vdev_fail               /* CF set */
3:      clc
        ret

/* Wait (PORT_WAIT) up to eax ms for the interrupt of the device at rbx,
 * then read its InterruptStatus and acknowledge it: eax = the status, ZF
 * set if none. Clobbers rcx, rdx. */
mem_wait_port:
        shl     eax, 16
        mov     ecx, ebx
        sub     ecx, VIRTIO_MMIO_FIRST
        shr     ecx, 12
        or      eax, ecx
        mov     dx, MEM_PORT_WAIT
        out     dx, eax
        mov     eax, dword ptr [rbx + MEM_INT_STATUS]
        test    eax, eax
        jz      1f
        mov     dword ptr [rbx + MEM_INT_ACK], eax
1:      ret

/* Idle: wait on the next device in turn, acknowledge every device's
 * InterruptStatus; nothing pending at all (no port, or a timeout): spin. */
mem_idle_wait:
        push    rbx
        push    rbp
        push    r12
        mov     r12d, [rip + mem_rot]
        mov     eax, r12d
        inc     eax
        cmp     eax, [rip + mem_n]
        jb      1f
        xor     eax, eax
1:      mov     [rip + mem_rot], eax
        shl     r12d, 7
        lea     rbp, [rip + mem_devs]
        mov     rbx, [rbp + r12 + D_BASE]
        mov     eax, MEM_IDLE1_MS
        cmp     dword ptr [rip + mem_n], 1
        je      2f
        mov     eax, MEM_IDLE_MS
2:      call    mem_wait_port
        mov     r12d, eax               /* what was pending */
        xor     r8d, r8d
3:      cmp     r8d, [rip + mem_n]
        jae     4f
        mov     rbx, [rbp + D_BASE]
        mov     eax, dword ptr [rbx + MEM_INT_STATUS]
        or      r12d, eax
        test    eax, eax
        jz      5f
        mov     dword ptr [rbx + MEM_INT_ACK], eax
5:      add     rbp, D_SIZE
        inc     r8d
        jmp     3b
4:      test    r12d, r12d
        jnz     7f
        mov     ecx, MEM_SPIN
6:      pause
        dec     ecx
        jnz     6b
7:      pop     r12
        pop     rbp
        pop     rbx
        ret

/* Every device at its target: say what the round did, if anything. */
mem_round_end:
        mov     rax, [rip + mem_round_plug]
        test    rax, rax
        jz      1f
        lea     rsi, [rip + msg_mem_plugged]
        call    mem_say_round
1:      mov     rax, [rip + mem_round_unplug]
        test    rax, rax
        jz      2f
        lea     rsi, [rip + msg_mem_unplugged]
        call    mem_say_round
2:      xor     eax, eax
        mov     [rip + mem_round_plug], rax
        mov     [rip + mem_round_unplug], rax
        ret

/* "teravm firmware: mem <rsi> <rax MiB> MiB (<all plugged MiB> MiB plugged)" */
mem_say_round:
        push    rax
        call    say_err
        pop     rax
        shr     rax, 20
        call    put_u64
        lea     rsi, [rip + msg_mem_open]
        call    puts
        xor     eax, eax
        xor     ecx, ecx
        lea     rdi, [rip + mem_devs]
1:      cmp     ecx, [rip + mem_n]
        jae     2f
        add     rax, [rdi + D_PLUGGED]
        add     rdi, D_SIZE
        inc     ecx
        jmp     1b
2:      shr     rax, 20
        call    put_u64
        lea     rsi, [rip + msg_mem_close]
        jmp     puts

/* Identity-map [rdi, rdi + rsi) (rsi > 0) where nothing maps it yet: CF
 * clear; CF set when mem_pt is used up (said, stopped). */
mem_map:
        push    rbx
        push    r12
        mov     r12, rdi
        shr     r12, 30                 /* the first GiB */
        lea     rbx, [rdi + rsi - 1]
        shr     rbx, 30                 /* the last */
1:      cmp     r12, rbx
        ja      .Lmp_ok
        mov     rax, r12
        shr     rax, 9                  /* PML4 index */
        cmp     rax, 256
        jae     .Lmp_fail               /* not a canonical lower-half address */
        mov     edx, MEM_PML4
        lea     rdx, [rdx + rax * 8]
        mov     rax, [rdx]
        test    al, 1
        jnz     2f
        call    mem_pt_alloc            /* a PDPT */
        jc      .Lmp_fail
        or      rax, MEM_PTE_TABLE
        mov     [rdx], rax
2:      movabs  rcx, 0x000ffffffffff000
        and     rax, rcx                /* the PDPT */
        mov     rdx, r12
        and     edx, 511
        lea     rdx, [rax + rdx * 8]
        test    byte ptr [rdx], 1
        jnz     4f                      /* mapped (RAM's, or ours) */
        mov     rax, r12
        shl     rax, 30
        or      rax, MEM_PTE_LARGE
        mov     rcx, rax
        call    mem_pt_alloc            /* a page directory */
        jc      .Lmp_fail
        xor     r8d, r8d
5:      mov     [rax + r8 * 8], rcx
        add     rcx, 2 << 20
        inc     r8d
        cmp     r8d, 512
        jb      5b
        or      rax, MEM_PTE_TABLE
        mov     [rdx], rax
4:      inc     r12
        jmp     1b
.Lmp_ok:
        pop     r12
        pop     rbx
        clc
        ret
.Lmp_fail:
        lea     rsi, [rip + msg_mem_pt]
        call    say_err
        mov     rax, r12
        shl     rax, 30
        call    put_hex
        mov     al, 10
        call    putc
        mov     byte ptr [rip + mem_stopped], 1
        pop     r12
        pop     rbx
        stc
        ret

/* rax = a zeroed page of mem_pt, CF clear; CF set if none is left. Keeps
 * rcx, rdx. */
mem_pt_alloc:
        mov     eax, [rip + mem_pt_used]
        cmp     eax, MEM_PT_PAGES
        jae     1f
        inc     dword ptr [rip + mem_pt_used]
        shl     rax, 12
        push    rdi
        push    rcx
        lea     rdi, [rip + mem_pt]
        add     rdi, rax
        push    rdi
        mov     ecx, PAGE / 8
        xor     eax, eax
        rep stosq
        pop     rax
        pop     rcx
        pop     rdi
        clc
        ret
1:      stc
        ret

/* Check, write and read back every 4 KiB page of [rdi, rdi + rsi): CF
 * clear; CF set at the first page not zero before ("mem dirty") or not
 * reading back what was written (said, stopped). The check and the write
 * are one xchg: a fresh page then takes one write fault in the host, where
 * a read first would map the zero page and fault again on the write. */
mem_touch:
        mov     rcx, rsi
        shr     rcx, 12
        jz      2f
1:      mov     rax, rdi
        xchg    [rdi], rax              /* one write access: one fault, not two */
        test    rax, rax
        jnz     .Lmt_dirty
        cmp     [rdi], rdi
        jne     .Lmt_back
        add     rdi, PAGE
        dec     rcx
        jnz     1b
2:      clc
        ret
.Lmt_dirty:
        lea     rsi, [rip + msg_mem_dirty]
        call    puts
        jmp     1f
.Lmt_back:
        push    rdi
        lea     rsi, [rip + msg_mem_back]
        call    say_err
        pop     rax
        call    put_hex
        mov     al, 10
        call    putc
1:      mov     byte ptr [rip + mem_stopped], 1
        stc
        ret

        .section .rodata
key_mem:         .asciz "mem"
key_mem_eq:      .asciz "mem="
val_unplug_all:  .asciz "unplug-all"
tag_mem:         .asciz "mem"
msg_mem_node:    .asciz " node "
msg_mem_addr:    .asciz " addr "
msg_mem_size:    .asciz " size "
msg_mem_block:   .asciz " MiB block "
msg_mem_kib:     .asciz " KiB\n"
msg_mem_plugged: .asciz "plugged "
msg_mem_unplugged: .asciz "unplugged "
msg_mem_open:    .asciz " MiB ("
msg_mem_close:   .asciz " MiB plugged)\n"
msg_mem_dirty:   .asciz "teravm firmware: mem dirty\n"
msg_mem_err:     .asciz "error "
msg_mem_back:    .asciz "error readback at "
msg_mem_pt:      .asciz "error no room for page tables at "
msg_mem_bs:      .asciz "error bad block size "

        .data
        .balign 8
mem_feat:       .quad 0                 /* features of the device being set up */
mem_round_plug: .quad 0                 /* bytes plugged this round */
mem_round_unplug: .quad 0               /* bytes unplugged this round */
mem_cur:        .quad 0                 /* the PLUG being sent: addr */
mem_len:        .quad 0                 /* and bytes */
mem_n:          .long 0                 /* devices set up */
mem_scan:       .long 0                 /* the slot being probed */
mem_rot:        .long 0                 /* the device the next idle wait is on */
mem_t0:         .long 0                 /* clock when the request went out */
mem_pt_used:    .long 0                 /* pages of mem_pt taken */
opt_mem:        .byte 0
opt_mem_all:    .byte 0                 /* mem=unplug-all */
mem_stopped:    .byte 0                 /* an error: change nothing more */

        .bss
        .balign 64
mem_devs:       .skip MEM_MAX * D_SIZE
mem_req:        .skip 24
        .balign 16
mem_resp:       .skip 16
        .balign 4096
mem_pt:         .skip MEM_PT_PAGES * PAGE
