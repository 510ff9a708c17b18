/*
 * The frames under `mmds=` (firmware/mmds.S, whose state they use),
 * included by firmware.S: Ethernet, ARP, IPv4 and TCP to and from the
 * MMDS on the first virtio-net. net_txbuf is built and sent with net_tx
 * (one frame at a time); the rx queue is polled by mm_rx.
 */

        .text
/* Begin a frame in net_txbuf: the virtio header (zeros), Ethernet to the
 * MAC at rsi from ours, EtherType ax (in network order). rdi = past the
 * Ethernet header. Clobbers rcx. */
mm_eth:
        lea     rdi, [rip + net_txbuf]
        xor     ecx, ecx
        mov     [rdi], rcx
        mov     [rdi + 8], ecx
        mov     ecx, [rsi]
        mov     [rdi + NET_HDR], ecx
        mov     cx, [rsi + 4]
        mov     [rdi + NET_HDR + 4], cx
        mov     ecx, [rip + net_mac]
        mov     [rdi + NET_HDR + 6], ecx
        mov     cx, [rip + net_mac + 4]
        mov     [rdi + NET_HDR + 10], cx
        mov     [rdi + NET_HDR + 12], ax
        add     rdi, NET_HDR + 14
        ret

/* Send an ARP packet: ax = the op (network order), rsi = the MAC it goes
 * to (Ethernet and target hardware address), edx = the target IP. */
mm_arp:
        push    rdx
        push    rsi
        push    rax
        mov     ax, 0x0608              /* ARP */
        call    mm_eth
        pop     rax
        mov     dword ptr [rdi], 0x00080100     /* Ethernet, IPv4 */
        mov     word ptr [rdi + 4], 0x0406      /* 6-byte MAC, 4-byte IP */
        mov     [rdi + 6], ax
        mov     ecx, [rip + net_mac]
        mov     [rdi + 8], ecx
        mov     cx, [rip + net_mac + 4]
        mov     [rdi + 12], cx
        mov     ecx, [rip + mm_ip]
        mov     [rdi + 14], ecx
        pop     rsi
        mov     ecx, [rsi]
        mov     [rdi + 18], ecx
        mov     cx, [rsi + 4]
        mov     [rdi + 22], cx
        pop     rdx
        mov     [rdi + 24], edx
        mov     ecx, NET_HDR + 14 + 28
        jmp     net_tx

/* Send a TCP segment to the MMDS: al = flags, edx = its sequence number,
 * rsi = the payload, ecx = its length; the ACK field is mm_rcv_nxt when
 * al has ACK. */
mm_tcp:
        push    rcx
        push    rsi
        push    rdx
        push    rax
        lea     rsi, [rip + mm_dmac]
        mov     ax, 0x0008              /* IPv4 */
        call    mm_eth
        pop     rax
        pop     rdx
        pop     rsi
        pop     rcx
        mov     r10, rdi                /* the IP header */
        lea     r11d, [rcx + 40]        /* its total length */
        mov     word ptr [rdi], 0x0045  /* v4, 20 bytes; TOS 0 */
        mov     r9d, r11d
        rol     r9w, 8
        mov     [rdi + 2], r9w
        mov     word ptr [rdi + 4], 0   /* id */
        mov     word ptr [rdi + 6], 0x0040      /* DF */
        mov     word ptr [rdi + 8], 0x0640      /* TTL 64, TCP */
        mov     word ptr [rdi + 10], 0
        mov     r9d, [rip + mm_ip]
        mov     [rdi + 12], r9d
        mov     r9d, [rip + mm_dst]
        mov     [rdi + 16], r9d
        mov     r9w, [rip + mm_lport]
        rol     r9w, 8
        mov     [rdi + 20], r9w
        mov     word ptr [rdi + 22], MM_PORT_BE
        bswap   edx
        mov     [rdi + 24], edx
        xor     r9d, r9d
        test    al, TCP_ACK
        jz      1f
        mov     r9d, [rip + mm_rcv_nxt]
        bswap   r9d
1:      mov     [rdi + 28], r9d
        mov     byte ptr [rdi + 32], 0x50       /* 20 bytes, no options */
        mov     [rdi + 33], al
        mov     word ptr [rdi + 34], MM_WIN_BE
        mov     dword ptr [rdi + 36], 0         /* checksum, urgent */
        add     rdi, 40
        rep movsb
        mov     rsi, r10                /* the IP header's checksum */
        mov     ecx, 20
        xor     eax, eax
        call    mm_sum
        not     ax
        mov     [r10 + 10], ax
        lea     rsi, [r10 + 12]         /* the pseudo-header: addresses, */
        mov     ecx, 8
        xor     eax, eax
        call    mm_sum
        add     eax, 0x0600             /* protocol 6, */
        lea     edx, [r11 - 20]
        rol     dx, 8
        movzx   edx, dx
        add     eax, edx                /* TCP length */
        lea     rsi, [r10 + 20]
        lea     ecx, [r11 - 20]
        call    mm_sum
        not     ax
        mov     [r10 + 36], ax
        lea     ecx, [r11 + NET_HDR + 14]
        jmp     net_tx

/* eax += the 16-bit words at rsi (ecx bytes, an odd last one padded with
 * zero), folded to 16 bits: the Internet checksum before its complement,
 * in memory order (RFC 1071: the sum does not care). Clobbers rcx, rdx,
 * rsi. */
mm_sum:
1:      cmp     ecx, 2
        jb      2f
        movzx   edx, word ptr [rsi]
        add     eax, edx
        add     rsi, 2
        sub     ecx, 2
        jmp     1b
2:      test    ecx, ecx
        jz      3f
        movzx   edx, byte ptr [rsi]
        add     eax, edx
3:      mov     edx, eax
        shr     edx, 16
        and     eax, 0xffff
        add     eax, edx
        cmp     eax, 0xffff
        ja      3b
        ret

/* Handle every frame on the net rx queue, each buffer posted again after:
 * ARP, and the connection's segments; anything else is dropped. */
mm_rx:
1:      cmp     byte ptr [rip + net_live], 0
        je      9f
        mov     rbx, [rip + net_base]
        mov     r12d, SLOT_NET_RX
        call    vq_pop
        jc      9f
        cmp     eax, [rip + net_nrx]
        jae     1b                      /* not a buffer we posted */
        mov     r13d, eax
        cmp     edx, NET_BUF
        jbe     2f
        mov     edx, NET_BUF
2:      sub     edx, NET_HDR
        jb      3f
        mov     ecx, edx
        mov     eax, r13d
        shl     eax, 11
        lea     rsi, [rip + net_rxbuf + NET_HDR]
        add     rsi, rax
        call    mm_frame
3:      mov     rbx, [rip + net_base]
        mov     r12d, SLOT_NET_RX
        call    net_rx_post
        jmp     1b
9:      ret

/* One frame at rsi, ecx bytes (Ethernet header on). Keeps r13. */
mm_frame:
        cmp     ecx, 14
        jb      9f
        movzx   eax, word ptr [rsi + 12]
        cmp     eax, 0x0608
        je      mm_arp_in
        cmp     eax, 0x0008
        je      mm_ip_in
9:      ret

mm_arp_in:
        cmp     ecx, 14 + 28
        jb      9f
        lea     rdi, [rsi + 14]
        cmp     dword ptr [rdi], 0x00080100
        jne     9f
        cmp     word ptr [rdi + 4], 0x0406
        jne     9f
        mov     eax, [rdi + 14]         /* from the MMDS address: its MAC */
        cmp     eax, [rip + mm_dst]
        jne     1f
        mov     eax, [rdi + 8]
        mov     [rip + mm_dmac], eax
        mov     ax, [rdi + 12]
        mov     [rip + mm_dmac + 4], ax
        mov     byte ptr [rip + mm_have_mac], 1
1:      cmp     word ptr [rdi + 6], 0x0100      /* a request for us: reply */
        jne     9f
        mov     eax, [rdi + 24]
        cmp     eax, [rip + mm_ip]
        jne     9f
        mov     edx, [rdi + 14]
        lea     rsi, [rdi + 8]
        mov     ax, 0x0200
        jmp     mm_arp
9:      ret

mm_ip_in:
        cmp     ecx, 14 + 20 + 20
        jb      9f
        lea     r10, [rsi + 14]
        movzx   eax, byte ptr [r10]
        mov     edx, eax
        shr     edx, 4
        cmp     edx, 4
        jne     9f
        and     eax, 15
        shl     eax, 2                  /* the IP header's length */
        cmp     eax, 20
        jb      9f
        mov     r11d, eax
        cmp     byte ptr [r10 + 9], 6
        jne     9f
        mov     eax, [r10 + 12]
        cmp     eax, [rip + mm_dst]
        jne     9f
        mov     eax, [r10 + 16]
        cmp     eax, [rip + mm_ip]
        jne     9f
        test    word ptr [r10 + 6], 0xff3f      /* MF or an offset */
        jnz     9f
        movzx   eax, word ptr [r10 + 2]
        rol     ax, 8                   /* total length */
        sub     ecx, 14
        cmp     eax, ecx
        ja      9f
        mov     ecx, eax
        sub     ecx, r11d               /* TCP bytes */
        jb      9f
        cmp     ecx, 20
        jb      9f
        add     r10, r11                /* r10 = the TCP header */
        movzx   eax, byte ptr [r10 + 12]
        shr     eax, 4
        shl     eax, 2
        cmp     eax, 20
        jb      9f
        cmp     eax, ecx
        ja      9f
        sub     ecx, eax                /* ecx = payload bytes */
        lea     rsi, [r10 + rax]
        cmp     word ptr [r10], MM_PORT_BE
        jne     9f
        movzx   eax, word ptr [r10 + 2]
        rol     ax, 8
        cmp     ax, [rip + mm_lport]
        jne     9f
        cmp     byte ptr [rip + mm_state], 0
        jne     mm_tcp_in
9:      ret

/* A segment of our connection: r10 = its TCP header, rsi = its payload,
 * ecx = the payload's length. */
mm_tcp_in:
        mov     al, [r10 + 13]
        mov     edx, [r10 + 4]
        bswap   edx                     /* seq */
        mov     r8d, [r10 + 8]
        bswap   r8d                     /* ack */
        test    al, TCP_RST
        jz      1f
        mov     byte ptr [rip + mm_rst], 1
        ret
1:      cmp     byte ptr [rip + mm_state], MM_SYN_SENT
        jne     2f
        mov     r9b, al
        and     r9b, TCP_SYN | TCP_ACK
        cmp     r9b, TCP_SYN | TCP_ACK
        jne     9f
        mov     r9d, [rip + mm_iss]
        inc     r9d
        cmp     r8d, r9d
        jne     9f
        inc     edx
        mov     [rip + mm_rcv_nxt], edx
        mov     [rip + mm_snd_una], r8d
        mov     byte ptr [rip + mm_state], MM_EST
        ret
2:      test    al, TCP_ACK
        jz      9f
        mov     r9d, r8d                /* una < ack <= nxt: una = ack */
        sub     r9d, [rip + mm_snd_una]
        mov     r11d, [rip + mm_snd_nxt]
        sub     r11d, [rip + mm_snd_una]
        cmp     r9d, r11d
        ja      3f
        mov     [rip + mm_snd_una], r8d
3:      mov     r9b, al
        and     r9b, TCP_FIN
        test    ecx, ecx
        jnz     4f
        test    r9b, r9b
        jz      9f                      /* a bare ACK */
4:      cmp     edx, [rip + mm_rcv_nxt]
        jne     8f                      /* not the next byte */
        cmp     byte ptr [rip + mm_fin], 0
        jne     8f
        add     [rip + mm_rcv_nxt], ecx
        add     [rip + mm_rtotal], ecx
        mov     edi, [rip + mm_rlen]
        mov     r11d, MM_RESP
        sub     r11d, edi
        cmp     ecx, r11d
        cmova   ecx, r11d
        add     [rip + mm_rlen], ecx
        lea     r11, [rip + mm_resp]
        add     rdi, r11
        rep movsb
        mov     byte ptr [rip + mm_data], 1
        test    r9b, r9b
        jz      8f
        inc     dword ptr [rip + mm_rcv_nxt]
        mov     byte ptr [rip + mm_fin], 1
8:      mov     al, TCP_ACK
        mov     edx, [rip + mm_snd_nxt]
        xor     ecx, ecx
        jmp     mm_tcp
9:      ret

