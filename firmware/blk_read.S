/*
 * `blk-read=<MiB>` (issue 26's contract word), included by firmware.S: read
 * that many MiB from the first virtio-blk (set up by blk_init, as `blk`
 * does), from sector 0 on, one 64 KiB IN request after another (the last
 * one shorter where the drive ends inside it), into one 64 KiB buffer.
 * A drive smaller than asked for is read whole. Then, timed from before the
 * first request to after the last one used by the firmware clock
 * (PORT_CLOCK, milliseconds):
 *   blk read <MiB> MiB in <ms> ms     (<MiB>: what was read, rounded down)
 *   blk read error <status> at sector <n>   (the first request not ok)
 *   blk error queue 0 timed out; device given up   (vq_wait_any's)
 */

        .set BR_SECTORS,      128       /* 64 KiB a request */

        .text
blk_read_run:
        push    rbx
        push    r12
        push    r13
        call    blk_init
        jc      .Lbr_done
        mov     rax, [rip + opt_blk_read]
        shr     rax, 9                  /* sectors asked for */
        mov     rcx, [rip + blk_sectors]
        cmp     rax, rcx
        cmova   rax, rcx
        mov     [rip + br_left], rax
        lea     rax, [rip + br_buf]
        mov     [rip + blk_buf], rax
        xor     r13d, r13d              /* r13 = the next sector */
        mov     dx, PORT_CLOCK
        in      eax, dx
        mov     [rip + br_t0], eax
1:      mov     rax, [rip + br_left]
        test    rax, rax
        jz      2f
        mov     ecx, BR_SECTORS
        cmp     rax, rcx
        cmova   rax, rcx
        mov     [rip + br_n], eax
        shl     eax, 9
        mov     [rip + blk_len], eax
        mov     eax, BLK_T_IN
        mov     rdx, r13
        call    blk_request
        jc      .Lbr_restore            /* timed out (said) */
        test    eax, eax
        jnz     3f
        mov     eax, [rip + br_n]
        add     r13, rax
        sub     [rip + br_left], rax
        jmp     1b

2:      mov     dx, PORT_CLOCK
        in      eax, dx
        sub     eax, [rip + br_t0]
        mov     [rip + br_t0], eax
        call    say_tag
        lea     rsi, [rip + msg_br_read]
        call    puts
        mov     rax, r13
        shr     rax, 11                 /* sectors to MiB */
        call    put_u64
        lea     rsi, [rip + msg_in]
        call    puts
        mov     eax, [rip + br_t0]
        call    put_u64
        lea     rsi, [rip + msg_ms]
        call    puts
        jmp     .Lbr_restore

3:      push    rax                     /* the drive said no */
        call    say_tag
        lea     rsi, [rip + msg_br_error]
        call    puts
        pop     rax
        call    blk_say_status
        lea     rsi, [rip + msg_br_at]
        call    puts
        mov     rax, r13
        call    put_u64
        mov     al, 10
        call    putc
.Lbr_restore:
        lea     rax, [rip + blk_data]
        mov     [rip + blk_buf], rax
        mov     dword ptr [rip + blk_len], BLK_SECTOR
.Lbr_done:
        pop     r13
        pop     r12
        pop     rbx
        ret

        .section .rodata
msg_br_read:     .asciz "read "
msg_br_error:    .asciz "read error "
msg_br_at:       .asciz " at sector "

        .data
        .balign 8
br_left:        .quad 0                 /* sectors still to read */
br_t0:          .long 0                 /* clock at the first request; then ms */
br_n:           .long 0                 /* sectors in this request */

        .bss
        .balign 4096
br_buf:         .skip BR_SECTORS * BLK_SECTOR
