/*
 * `mmds=<path>` (issue 26's contract word), included by firmware.S: fetch
 * <path> from the MMDS over the first virtio-net (set up by net_init, as
 * `net=echo` does) with a minimal ARP, IPv4 and TCP client, and print
 *   mmds <http-status> <first 200 bytes of the body>
 * on one line, \r and \n in the body printed as spaces.
 *
 * Words: mmds=<path> (1 to MM_PATH_MAX bytes, sent as written);
 * mmds-addr=<a.b.c.d> the MMDS address (default 169.254.169.254, port 80);
 * mmds-ip=<a.b.c.d> the guest's (default 169.254.0.2). A bad address or
 * path is a bad command line.
 *
 * Steps, all within MM_DEADLINE_MS of the start:
 *   ARP: a broadcast request for the MMDS address, again every MM_RETX_MS,
 *   until a reply (or any ARP) from that address gives its MAC. ARP
 *   requests for our address are answered all along (Linux asks before it
 *   answers a SYN from an address it has no entry for).
 *   Two HTTP/1.1 exchanges, each on a TCP connection of its own (local port
 *   49152 + the clock's low bits, one more each time; ISS from the clock):
 *     PUT /latest/api/token with X-metadata-token-ttl-seconds: 60; if it
 *     answers 200, its body (trailing \r, \n and spaces dropped, at most
 *     MM_TOKEN_MAX bytes) is sent as X-metadata-token on
 *     GET <path>, whose status and body are printed. Both carry Host: <the
 *     MMDS address> and Connection: close.
 *   A connection: SYN (no options: the peer sends at most 536 bytes a
 *   segment; window 4 KiB), again every MM_RETX_MS until the SYN-ACK; an
 *   ACK; the request in one PSH|ACK segment, again every MM_RETX_MS until
 *   it is acknowledged; every segment that carries the next byte (or the
 *   FIN) is taken and acknowledged, any other is answered with an ACK of
 *   what we have (in order only, nothing out of order is kept); the
 *   response is complete at the peer's FIN or once Content-Length body
 *   bytes are in; then our FIN, and up to MM_RETX_MS for the peer's FIN
 *   and the ACK of ours. An RST ends it. The first MM_RESP bytes of the
 *   response are kept (headers and the start of the body).
 *   IPv4 header and TCP checksums are computed on what is sent; those of
 *   what is received are not checked (the device delivers whole frames
 *   from the tap; no offloads are negotiated). Fragments are dropped.
 * Lines ("teravm firmware: mmds ..."):
 *   <status> <body>
 *   error no network interface (the net line says why) |
 *   error no ARP reply from the MMDS address | error no answer to the SYN |
 *   error connection refused (RST) | error connection reset (RST) |
 *   error no whole response in time | error not an HTTP response |
 *   error the network interface was given up
 */

        .set MM_PORT_BE,      0x5000    /* port 80, in network order */
        .set MM_RETX_MS,      1000
        .set MM_DEADLINE_MS,  20000
        .set MM_PATH_MAX,     512
        .set MM_TOKEN_MAX,    256
        .set MM_REQ,          1024      /* bytes of a request, at most */
        .set MM_RESP,         4096      /* bytes of a response kept */
        .set MM_WIN_BE,       0x0010    /* window 4096, network order */
        .set MM_BODY_SHOWN,   200
        .set TCP_FIN,         1
        .set TCP_SYN,         2
        .set TCP_RST,         4
        .set TCP_PSH,         8
        .set TCP_ACK,         0x10
        .set MM_SYN_SENT,     1         /* mm_state */
        .set MM_EST,          2

        .text
/* Parse one word at rsi (< r8) if it is mmds=, mmds-addr= or mmds-ip=:
 * eax = 0 not one of them (rsi kept), 1 taken (rsi past it), 2 bad.
 * Clobbers rcx, rdx, rdi, r9, r10. */
mm_parse_word:
        lea     rdi, [rip + key_mmds]
        call    match_key
        jnc     1f
        mov     [rip + mm_path_ptr], rsi
        mov     rax, rsi
2:      cmp     rsi, r8
        jae     3f
        cmp     byte ptr [rsi], ' '
        je      3f
        inc     rsi
        jmp     2b
3:      mov     rcx, rsi
        sub     rcx, rax
        jz      .Lmm_bad
        cmp     rcx, MM_PATH_MAX
        ja      .Lmm_bad
        mov     [rip + mm_path_len], rcx
        mov     eax, 1
        ret
1:      lea     rdi, [rip + key_mmds_addr]
        call    match_key
        jnc     4f
        mov     [rip + mm_host_ptr], rsi
        call    parse_ip
        jc      .Lmm_bad
        mov     [rip + mm_dst], eax
        mov     rcx, rsi
        sub     rcx, [rip + mm_host_ptr]
        mov     [rip + mm_host_len], rcx
        mov     eax, 1
        ret
4:      lea     rdi, [rip + key_mmds_ip]
        call    match_key
        jnc     5f
        call    parse_ip
        jc      .Lmm_bad
        mov     [rip + mm_ip], eax
        mov     eax, 1
        ret
5:      xor     eax, eax
        ret
.Lmm_bad:
        mov     eax, 2
        ret

/* Parse the dotted IPv4 address at rsi (< r8) up to a space or the end:
 * eax = its 4 bytes as they sit in a packet, CF clear; CF set if it is
 * not 4 decimal numbers up to 255. Clobbers rcx, rdx, r9, r10. */
parse_ip:
        xor     r9d, r9d                /* the address */
        xor     r10d, r10d              /* bytes done */
1:      xor     eax, eax
        xor     edx, edx                /* digits */
2:      cmp     rsi, r8
        jae     3f
        movzx   ecx, byte ptr [rsi]
        sub     ecx, '0'
        cmp     ecx, 9
        ja      3f
        imul    eax, eax, 10
        add     eax, ecx
        inc     edx
        cmp     edx, 3
        ja      9f
        inc     rsi
        jmp     2b
3:      test    edx, edx
        jz      9f
        cmp     eax, 255
        ja      9f
        mov     ecx, r10d
        shl     ecx, 3
        shl     eax, cl
        or      r9d, eax
        inc     r10d
        cmp     r10d, 4
        je      4f
        cmp     rsi, r8
        jae     9f
        cmp     byte ptr [rsi], '.'
        jne     9f
        inc     rsi
        jmp     1b
4:      cmp     rsi, r8
        jae     5f
        cmp     byte ptr [rsi], ' '
        jne     9f
5:      mov     eax, r9d
        clc
        ret
9:      stc
        ret

/* The word: ARP, the token, the GET, the line. */
mmds_run:
        push    rbx
        push    r12
        push    r13
        call    net_init
        jc      .Lmm_nonet
        mov     dx, PORT_CLOCK
        in      eax, dx
        mov     [rip + mm_t0], eax
        mov     [rip + mm_now], eax
        and     eax, 0x3fff
        add     eax, 49152
        mov     [rip + mm_lport], ax
.Lmm_arp:
        mov     ax, 0x0100              /* request */
        lea     rsi, [rip + mm_bcast]
        mov     edx, [rip + mm_dst]
        call    mm_arp
        call    mm_tx_now
1:      call    mm_turn
        lea     rsi, [rip + msg_mm_noarp]
        jc      .Lmm_fail
        cmp     byte ptr [rip + mm_have_mac], 0
        jne     2f
        call    mm_retx_due
        jc      .Lmm_arp
        jmp     1b

2:      call    mm_req_put
        call    mm_http
        jc      .Lmm_out
        mov     dword ptr [rip + mm_token_len], 0
        cmp     dword ptr [rip + mm_status], 200
        jne     3f
        mov     rsi, [rip + mm_body]
        mov     ecx, [rip + mm_blen]
4:      test    ecx, ecx                /* drop trailing \r, \n, spaces */
        jz      5f
        mov     al, [rsi + rcx - 1]
        cmp     al, ' '
        ja      5f
        dec     ecx
        jmp     4b
5:      mov     eax, MM_TOKEN_MAX
        cmp     ecx, eax
        cmova   ecx, eax
        mov     [rip + mm_token_len], ecx
        lea     rdi, [rip + mm_token]
        rep movsb

3:      call    mm_req_get
        call    mm_http
        jc      .Lmm_out
        call    mm_tag
        mov     eax, [rip + mm_status]
        call    put_u64
        mov     al, ' '
        call    putc
        mov     rsi, [rip + mm_body]
        mov     ecx, [rip + mm_blen]
        mov     eax, MM_BODY_SHOWN
        cmp     ecx, eax
        cmova   ecx, eax
        test    ecx, ecx
        jz      8f
6:      lodsb
        cmp     al, 13
        je      7f
        cmp     al, 10
        jne     9f
7:      mov     al, ' '
9:      call    putc
        dec     ecx
        jnz     6b
8:      mov     al, 10
        call    putc
        jmp     .Lmm_out
.Lmm_nonet:
        lea     rsi, [rip + msg_mm_nonet]
.Lmm_fail:
        call    mm_say
.Lmm_out:
        pop     r13
        pop     r12
        pop     rbx
        ret

/* Print "teravm firmware: mmds " (and the string at rsi: mm_say). */
mm_tag:
        lea     rax, [rip + tag_mmds]
        mov     [rip + dev_tag], rax
        jmp     say_tag
mm_say:
        lea     rax, [rip + tag_mmds]
        mov     [rip + dev_tag], rax
        jmp     say_err

/* Append the NUL-terminated string at rsi at rdi. */
mm_cat:
1:      lodsb
        test    al, al
        jz      2f
        stosb
        jmp     1b
2:      ret

/* Append the MMDS address as written ("Host: ..."). */
mm_host:
        mov     rsi, [rip + mm_host_ptr]
        mov     rcx, [rip + mm_host_len]
        rep movsb
        ret

/* mm_req = the token's PUT, or the GET (with the token if there is one).
 * Both fit MM_REQ: the path and the token are bounded. */
mm_req_put:
        lea     rdi, [rip + mm_req]
        lea     rsi, [rip + msg_mm_put]
        call    mm_cat
        call    mm_host
        lea     rsi, [rip + msg_mm_put_tail]
        call    mm_cat
        jmp     mm_req_end
mm_req_get:
        lea     rdi, [rip + mm_req]
        lea     rsi, [rip + msg_mm_get]
        call    mm_cat
        mov     rsi, [rip + mm_path_ptr]
        mov     rcx, [rip + mm_path_len]
        rep movsb
        lea     rsi, [rip + msg_mm_http_host]
        call    mm_cat
        call    mm_host
        lea     rsi, [rip + msg_mm_crlf]
        call    mm_cat
        mov     ecx, [rip + mm_token_len]
        test    ecx, ecx
        jz      1f
        lea     rsi, [rip + msg_mm_token]
        call    mm_cat
        lea     rsi, [rip + mm_token]
        mov     ecx, [rip + mm_token_len]
        rep movsb
        lea     rsi, [rip + msg_mm_crlf]
        call    mm_cat
1:      lea     rsi, [rip + msg_mm_close]
        call    mm_cat
mm_req_end:
        lea     rax, [rip + mm_req]
        sub     rdi, rax
        mov     [rip + mm_req_len], edi
        ret

/* One HTTP exchange on a new connection: mm_req sent, the response kept
 * in mm_resp. CF clear: mm_status, mm_body and mm_blen set; CF set: said. */
mm_http:
        inc     word ptr [rip + mm_lport]
        mov     dx, PORT_CLOCK
        in      eax, dx
        imul    eax, eax, 250000
        mov     [rip + mm_iss], eax
        mov     [rip + mm_snd_una], eax
        inc     eax
        mov     [rip + mm_snd_nxt], eax
        xor     eax, eax
        mov     [rip + mm_rcv_nxt], eax
        mov     [rip + mm_rlen], eax
        mov     [rip + mm_rtotal], eax
        mov     [rip + mm_rst], al
        mov     [rip + mm_fin], al
        mov     [rip + mm_data], al
        mov     byte ptr [rip + mm_state], MM_SYN_SENT
.Lmm_syn:
        mov     al, TCP_SYN
        mov     edx, [rip + mm_iss]
        xor     ecx, ecx
        call    mm_tcp
        call    mm_tx_now
1:      call    mm_turn
        lea     rsi, [rip + msg_mm_nosyn]
        jc      .Lmm_http_fail
        cmp     byte ptr [rip + mm_rst], 0
        lea     rsi, [rip + msg_mm_refused]
        jne     .Lmm_http_fail
        cmp     byte ptr [rip + mm_state], MM_EST
        je      2f
        call    mm_retx_due
        jc      .Lmm_syn
        jmp     1b
2:      mov     al, TCP_ACK
        mov     edx, [rip + mm_snd_nxt]
        xor     ecx, ecx
        call    mm_tcp
.Lmm_send:
        mov     al, TCP_ACK | TCP_PSH
        mov     edx, [rip + mm_iss]
        inc     edx
        lea     rsi, [rip + mm_req]
        mov     ecx, [rip + mm_req_len]
        call    mm_tcp
        mov     eax, [rip + mm_iss]
        inc     eax
        add     eax, [rip + mm_req_len]
        mov     [rip + mm_snd_nxt], eax
        call    mm_tx_now
3:      call    mm_turn
        lea     rsi, [rip + msg_mm_slow]
        jc      .Lmm_http_fail
        cmp     byte ptr [rip + mm_rst], 0
        lea     rsi, [rip + msg_mm_reset]
        jne     .Lmm_http_fail
        call    mm_complete
        jc      4f
        mov     eax, [rip + mm_snd_una]
        cmp     eax, [rip + mm_snd_nxt]
        je      3b                      /* the request is in: wait */
        call    mm_retx_due
        jc      .Lmm_send
        jmp     3b
4:      mov     al, TCP_FIN | TCP_ACK
        mov     edx, [rip + mm_snd_nxt]
        xor     ecx, ecx
        call    mm_tcp
        inc     dword ptr [rip + mm_snd_nxt]
        call    mm_tx_now
5:      call    mm_turn                 /* a while for the close, no more */
        jc      6f
        cmp     byte ptr [rip + mm_rst], 0
        jne     6f
        cmp     byte ptr [rip + mm_fin], 0
        je      7f
        mov     eax, [rip + mm_snd_una]
        cmp     eax, [rip + mm_snd_nxt]
        je      6f
7:      call    mm_retx_due
        jnc     5b
6:      mov     byte ptr [rip + mm_state], 0
        call    mm_parse_head
        lea     rsi, [rip + msg_mm_nothttp]
        jc      .Lmm_http_fail
        cmp     dword ptr [rip + mm_rlen], 12
        jb      .Lmm_http_fail
        cmp     dword ptr [rip + mm_resp], 0x50545448   /* "HTTP" */
        jne     .Lmm_http_fail
        xor     eax, eax
        mov     ecx, 9
8:      lea     rdx, [rip + mm_resp]
        movzx   edx, byte ptr [rdx + rcx]
        sub     edx, '0'
        cmp     edx, 9
        ja      .Lmm_http_fail
        imul    eax, eax, 10
        add     eax, edx
        inc     ecx
        cmp     ecx, 12
        jb      8b
        mov     [rip + mm_status], eax
        mov     eax, [rip + mm_hend]
        lea     rdx, [rip + mm_resp]
        add     rdx, rax
        mov     [rip + mm_body], rdx
        mov     ecx, [rip + mm_rlen]
        sub     ecx, eax                /* the body bytes kept */
        mov     eax, [rip + mm_clen]
        cmp     ecx, eax
        cmova   ecx, eax                /* no more than Content-Length */
        mov     [rip + mm_blen], ecx
        clc
        ret
.Lmm_http_fail:
        mov     byte ptr [rip + mm_state], 0
        cmp     byte ptr [rip + net_live], 0
        jne     9f
        lea     rsi, [rip + msg_mm_gone]
9:      call    mm_say
        stc
        ret

/* Handle the frames there are, then sleep until the net device signals
 * (dev_wait, WAIT_MS at most, well under MM_RETX_MS): CF set once the
 * deadline has passed or the device is gone. */
mm_turn:
        call    mm_rx
        cmp     byte ptr [rip + net_live], 0
        je      1f
        mov     rax, [rip + net_base]
        mov     ecx, WAIT_MS
        call    dev_wait
        call    mm_clock
        sub     eax, [rip + mm_t0]
        cmp     eax, MM_DEADLINE_MS
        jae     1f
        clc
        ret
1:      stc
        ret

/* eax = the clock, read from the port each call (mm_turn sleeps between
 * calls). */
mm_clock:
        mov     dx, PORT_CLOCK
        in      eax, dx
        mov     [rip + mm_now], eax
        ret

/* Something was just sent: mm_tx_t = now. mm_retx_due: CF set once
 * MM_RETX_MS have passed since. */
mm_tx_now:
        mov     dx, PORT_CLOCK
        in      eax, dx
        mov     [rip + mm_now], eax
        mov     [rip + mm_tx_t], eax
        ret
mm_retx_due:
        call    mm_clock
        sub     eax, [rip + mm_tx_t]
        cmp     eax, MM_RETX_MS
        cmc
        ret

/* CF set when the response is whole: the peer's FIN, or the headers and
 * Content-Length bytes of body. */
mm_complete:
        cmp     byte ptr [rip + mm_fin], 0
        jne     1f
        cmp     byte ptr [rip + mm_data], 0
        je      2f
        mov     byte ptr [rip + mm_data], 0
        call    mm_parse_head
        jc      2f
        cmp     dword ptr [rip + mm_clen], -1
        je      2f
        mov     eax, [rip + mm_rtotal]
        sub     eax, [rip + mm_hend]
        cmp     eax, [rip + mm_clen]
        jb      2f
1:      stc
        ret
2:      clc
        ret

/* Find the end of the headers in mm_resp: mm_hend = the body's offset and
 * mm_clen = Content-Length (-1 if none), CF clear; CF set if they have not
 * all come yet. Clobbers rax, rcx, rdx, rsi, rdi, r8-r10. */
mm_parse_head:
        mov     ecx, [rip + mm_rlen]
        lea     rsi, [rip + mm_resp]
        xor     edx, edx
1:      lea     eax, [rdx + 4]
        cmp     eax, ecx
        ja      9f
        cmp     dword ptr [rsi + rdx], 0x0a0d0a0d       /* \r\n\r\n */
        je      2f
        inc     edx
        jmp     1b
2:      add     edx, 4
        mov     [rip + mm_hend], edx
        mov     dword ptr [rip + mm_clen], -1
        xor     ecx, ecx                /* "\ncontent-length:" at ecx? */
3:      lea     eax, [rcx + 16]
        cmp     eax, edx
        ja      8f
        cmp     byte ptr [rsi + rcx], 10
        jne     5f
        lea     r9, [rsi + rcx + 1]
        lea     rdi, [rip + key_mm_clen]
        xor     r8d, r8d
4:      mov     al, [r9 + r8]
        or      al, 0x20                /* lower case */
        cmp     al, [rdi + r8]
        jne     5f
        inc     r8d
        cmp     r8d, 15
        jb      4b
        add     r9, 15
6:      cmp     byte ptr [r9], ' '      /* the headers end in \r\n: */
        jne     7f                      /* these stop there at last */
        inc     r9
        jmp     6b
7:      xor     eax, eax
10:     movzx   r8d, byte ptr [r9]
        sub     r8d, '0'
        cmp     r8d, 9
        ja      11f
        imul    eax, eax, 10
        add     eax, r8d
        inc     r9
        jmp     10b
11:     mov     [rip + mm_clen], eax
        jmp     8f
5:      inc     ecx
        jmp     3b
8:      clc
        ret
9:      stc
        ret

        .section .rodata
key_mmds:        .asciz "mmds="
key_mmds_addr:   .asciz "mmds-addr="
key_mmds_ip:     .asciz "mmds-ip="
key_mm_clen:     .ascii "content-length:"
tag_mmds:        .asciz "mmds"
mm_default_host: .ascii "169.254.169.254"
mm_bcast:        .byte 0xff, 0xff, 0xff, 0xff, 0xff, 0xff
msg_mm_put:      .asciz "PUT /latest/api/token HTTP/1.1\r\nHost: "
msg_mm_put_tail: .asciz "\r\nX-metadata-token-ttl-seconds: 60\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
msg_mm_get:      .asciz "GET "
msg_mm_http_host: .asciz " HTTP/1.1\r\nHost: "
msg_mm_crlf:     .asciz "\r\n"
msg_mm_token:    .asciz "X-metadata-token: "
msg_mm_close:    .asciz "Connection: close\r\n\r\n"
msg_mm_nonet:    .asciz "error no network interface (the net line says why)\n"
msg_mm_noarp:    .asciz "error no ARP reply from the MMDS address\n"
msg_mm_nosyn:    .asciz "error no answer to the SYN\n"
msg_mm_refused:  .asciz "error connection refused (RST)\n"
msg_mm_reset:    .asciz "error connection reset (RST)\n"
msg_mm_slow:     .asciz "error no whole response in time\n"
msg_mm_nothttp:  .asciz "error not an HTTP response\n"
msg_mm_gone:     .asciz "error the network interface was given up\n"

        .data
        .balign 8
mm_path_ptr:    .quad 0
mm_path_len:    .quad 0                 /* 0: no mmds= */
mm_host_ptr:    .quad mm_default_host   /* the address as written */
mm_host_len:    .quad 15
mm_body:        .quad 0                 /* in mm_resp */
mm_ip:          .byte 169, 254, 0, 2
mm_dst:         .byte 169, 254, 169, 254
mm_dmac:        .skip 8
mm_t0:          .long 0                 /* the word's start, ms */
mm_now:         .long 0                 /* the clock last read */
mm_tx_t:        .long 0                 /* the last (re)transmission */
mm_iss:         .long 0
mm_snd_una:     .long 0
mm_snd_nxt:     .long 0
mm_rcv_nxt:     .long 0
mm_req_len:     .long 0
mm_rlen:        .long 0                 /* response bytes kept */
mm_rtotal:      .long 0                 /* response bytes received */
mm_hend:        .long 0                 /* the body's offset */
mm_clen:        .long 0                 /* Content-Length, -1 none */
mm_status:      .long 0
mm_blen:        .long 0
mm_token_len:   .long 0
mm_lport:       .word 0
mm_state:       .byte 0                 /* 0, MM_SYN_SENT, MM_EST */
mm_have_mac:    .byte 0
mm_rst:         .byte 0
mm_fin:         .byte 0                 /* the peer's FIN is in */
mm_data:        .byte 0                 /* bytes came since mm_complete */

        .bss
        .balign 64
mm_req:         .skip MM_REQ
mm_resp:        .skip MM_RESP
mm_token:       .skip MM_TOKEN_MAX
