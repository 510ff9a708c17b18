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
 *   bcheck-deflate      with balloon: inflate 256 pages, deflate them at
 *                       once and time register reads meanwhile, then write
 *                       a pattern into them and check it 3 s later
 *   bcheck-reset        with balloon: inflate 256 pages, reset the device
 *                       (timed, until Status reads 0), set it up again, then
 *                       write and check the pattern as bcheck-deflate does
 *   report=<MiB>        after touching, report that much of the touched RAM
 *                       as free on the balloon's reporting queue, then read
 *                       it back and say whether it reads as zero
 *   blk                 after touching, drive the first virtio-blk once
 *                       (read sector 0, write sector 1, read it back, GET_ID)
 *   blk-read=<MiB>      after blk, read that many MiB (at most the whole
 *                       drive) of the first virtio-blk in 64 KiB requests
 *                       and say how long it took (firmware/blk_read.S)
 *   mmds=<path>         after net, fetch <path> from the MMDS over the first
 *                       virtio-net (ARP, TCP, HTTP/1.1 with a V2 token when
 *                       the MMDS gives one) and print its status and body;
 *                       mmds-addr=<a.b.c.d> (169.254.169.254) and
 *                       mmds-ip=<a.b.c.d> (ours, 169.254.0.2) (firmware/mmds.S,
 *                       mmds_frames.S)
 *   vsock=echo:<port>   after touching, listen on <port> of the first
 *                       virtio-vsock and echo each connection's bytes
 *   vsock=connect:<port> after touching, connect to the host's <port>, send a
 *                       greeting, shut down
 *   net=echo            after touching, send one frame on the first
 *                       virtio-net, then echo every frame, MACs swapped
 *   mem                 last, drive every virtio-mem device: follow each
 *                       one's requested_size for ever by PLUG and UNPLUG
 *                       requests of 128 MiB at most, touching what is
 *                       plugged; mem=unplug-all: UNPLUG_ALL when the
 *                       request drops to 0 (firmware/mem.S)
 *   Devices are driven in the order balloon, blk, vsock, net, each found by
 *   its DeviceID wherever it sits. With then=idle and an echo (vsock=echo:
 *   or net=echo) set up, vCPU 0 keeps serving (serve_loop) instead of
 *   parking; with then=reset everything one-shot is done, the echoes are set
 *   up, and the reset follows.
 *
 * Waiting (all drivers): code at CPL3 cannot `sti; hlt`, so a driver with
 * nothing to do until its device signals writes the wait port instead
 * (dev_wait: `out` 0xf0c, eax = the device's slot (base - 0xC000_1000) /
 * 0x1000 | WAIT_MS << 16). teravm's vCPU thread sleeps until the device's
 * InterruptStatus is non-zero, the timeout, or a stop/pause/Ctrl-Alt-Del;
 * the driver then acknowledges InterruptStatus (read 0x060, write it to
 * 0x064) and looks at its rings again. Queues are set up with interrupts
 * on (avail flags 0) so the device raises them.
 *
 * The balloon driver (vCPU 0 only, no interrupts at CPL3: dev_wait).
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
 *   (QueueNotify = the queue's index), leaves interrupts on and checks
 *   the used ring's idx in memory, with a dev_wait between checks (and
 *   the clock port after each, for a 20 s timeout).
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
 *   Checks (bcheck-deflate, bcheck-reset; the teravm tests run them with
 *   the slow-discard fault): balloon pages 0..255 are inflated (one
 *   batch). bcheck-deflate posts their deflate, reads num_pages 2000 times
 *   ("balloon register reads took <ms> ms") and waits for the chain
 *   ("balloon deflate took <ms> ms"); bcheck-reset writes Status 0 and reads
 *   it until 0, for 10 s at most ("balloon reset took <ms> ms"), forgets
 *   the balloon's queue state and runs the initialisation again. Then each
 *   of the 256 pages is filled with its own address + 0x5a (every qword),
 *   3 s pass (the clock port) and every qword is checked: "balloon
 *   <deflate|reset> pattern ok" or "... corrupt" (a late discard zeroed a
 *   page the guest had back).
 *   Serving (balloon, then=idle): vCPU 0 waits on the balloon (dev_wait)
 *   and after each wait checks the statsq's used idx (memory), num_pages
 *   (one MMIO exit) and the i8042 for a Ctrl-Alt-Del (one port exit); the other
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
 * The block, vsock and net drivers (vCPU 0 only, polling, after the
 * balloon). Each finds the first device of its ID as bl_probe does (32
 * slots), resets it, accepts VERSION_1 (required) and the few features
 * below where offered, sets its queues up as the balloon's (min(QueueNumMax,
 * 64) entries, a power of two, rings in the queue slot's page,
 * interrupts on), sets DRIVER_OK and checks the device took it (no
 * DEVICE_NEEDS_RESET). Buffers are posted with a notification each; used
 * rings are checked in memory between dev_waits; one request or packet is sent at a time and
 * waited for (VQ_TIMEOUT_MS, then "queue <i> timed out; device given up"
 * and FAILED). Descriptor chains put device-readable before device-
 * writable buffers and assume nothing about how the device splits them.
 *   Block (ID 2), queue 0; accepts RO (5) and FLUSH (9). Requests are
 *   descriptor 0 (16-byte header {u32 type, u32 0, u64 sector}, readable) ->
 *   1 (data: 512 bytes, writable for IN, readable for OUT; 20 bytes
 *   writable for GET_ID; skipped by FLUSH) -> 2 (status byte, writable,
 *   preset to 0xff). In order: IN sector 0; OUT sector 1 (512 x 0xa5),
 *   then FLUSH if FLUSH was negotiated and the write succeeded (a refused
 *   write, e.g. RO, is still tried and shows the device's answer); IN
 *   sector 1, compared with 0xa5; GET_ID. Then done (no serving).
 *   Vsock (ID 19), rx 0, tx 1, event 2; accepts STREAM (0) if offered;
 *   guest_cid (config 0, u64) read at start and after a TRANSPORT_RESET
 *   event (which also drops every connection, silently). Up to 8 rx
 *   buffers (queue size / 2), buffer i = descriptors 2i (the 44-byte
 *   header) -> 2i+1 (4 KiB of payload), both writable, posted again as
 *   soon as their packet is handled; 4 event buffers of 4 bytes. Sending:
 *   descriptor 0 (header) -> 1 (payload, if any), both readable. Every
 *   packet sent carries buf_alloc = 16 KiB and the connection's fwd_cnt;
 *   every packet received updates the host's buf_alloc and fwd_cnt.
 *   Ops as the spec numbers them (REQUEST 1, RESPONSE 2, RST 3, SHUTDOWN
 *   4, RW 5, CREDIT_UPDATE 6, CREDIT_REQUEST 7). A packet for no
 *   connection (not a REQUEST we take, or not STREAM) is answered RST,
 *   except an RST.
 *   echo:<port>: a table of 4 connections (host cid, host port, our
 *   port); a REQUEST to <port> takes a free entry and is answered
 *   RESPONSE (none free: RST). RW payload is kept in the entry's 16 KiB
 *   ring (the credit we gave bounds it) and sent back as RW as the host's
 *   credit, buf_alloc - (tx_cnt - fwd_cnt), allows, at most 4 KiB a packet;
 *   fwd_cnt counts the bytes sent back, so each echo is also the credit
 *   update for what it consumed. With no credit left, one CREDIT_REQUEST
 *   (again after the next packet from the host). CREDIT_REQUEST is
 *   answered CREDIT_UPDATE. SHUTDOWN: what is held is still sent (unless
 *   the host said RCV), then RST, the line, the entry freed; an RST from
 *   the host frees it with the line and no answer.
 *   connect:<port>: REQUEST from (guest_cid, 49152) to (2, <port>), wait
 *   for RESPONSE (RST: refused), wait for 27 bytes of credit (a
 *   CREDIT_REQUEST if short), RW "hello from teravm firmware\n",
 *   SHUTDOWN with RCV|SEND, wait for the host's RST (a SHUTDOWN from the
 *   host is answered RST); bytes the host sends are read and dropped.
 *   Each wait is VQ_TIMEOUT_MS at most.
 *   Net (ID 1), rx 0, tx 1; accepts MAC (5) only (no offloads, no
 *   MRG_RXBUF, no control queue), so every buffer starts with the 12-byte
 *   virtio_net_hdr_v1, sent as zeros. MAC from config 0 (6 byte reads) if
 *   MAC, else 02:00:00:00:00:01. Up to 8 rx buffers of 2 KiB (header and
 *   frame in one writable descriptor, at least the spec's 1526); tx is
 *   descriptor 0, header and frame, readable. First a broadcast frame
 *   (ff:ff:ff:ff:ff:ff, our MAC, EtherType 0x88b5, "teravm firmware net",
 *   33 bytes, not padded); then each frame received of at least 12 bytes
 *   is sent back with the two MACs swapped (the buffer posted again
 *   first); shorter ones are dropped.
 *   Serving (an echo set up, then=idle): vCPU 0 checks the vsock and net
 *   used rings every round (memory reads), then serves the balloon (if
 *   `balloon`: statistics, num_pages) and looks at the i8042 for a
 *   Ctrl-Alt-Del (one port exit), then waits: dev_wait on the one device
 *   served, or WAIT_SHARED_MS on the vsock (else net) when it serves
 *   more than one (the port names one device); once every device is
 *   given up and there is no balloon, it parks.
 *   Lines ("teravm firmware: " then the device's name):
 *     blk device at 0x<base> features 0x<accepted> capacity <n> sectors
 *     blk sector0 <32 lower-case hex digits> | blk sector0 <status>
 *     blk write <status>          (ok | ioerr | unsupp | status <n>)
 *     blk readback match | mismatch | <status other than ok>
 *     blk id <up to 20 bytes, to the first NUL; others than ' '..'~' as ?>
 *       | blk get_id <status other than ok>
 *     vsock device at 0x<base> features 0x<accepted> cid <guest_cid>
 *     vsock listening on <port>
 *     vsock echo <n> bytes        (a connection closed: bytes sent back)
 *     vsock connect refused | vsock connect error timed out |
 *       vsock connect error no RST from the host (then the next line) |
 *       vsock connect sent <n> bytes
 *     net device at 0x<base> features 0x<accepted>
 *     net sent hello from <xx:xx:xx:xx:xx:xx>
 *     net echoed <n> frames       (after each of the first 16, then every 16th)
 *     <name> error no device | error device reset did not complete |
 *       error device does not offer VERSION_1 | error device refused the
 *       features (FEATURES_OK) | error device did not take DRIVER_OK
 *       (DEVICE_NEEDS_RESET) | error queue <i> unusable (in use or
 *       QueueNumMax 0) | error queue <i> timed out; device given up
 *
 * Memory the firmware uses (all below BI_FW_END, so never in the touched
 * RAM the balloon takes pages from):
 *   0x7000 boot info, 0x8000 command line (the VMM's), 0x10000 this image
 *   (.text, .rodata, .data: options, driver state, the vsock connection
 *   table), then page aligned, not part of the image (.bss, firmware.ld
 *   keeps it below the stacks at 0x100000; about 0x14000-0xc0000 today;
 *   every byte is written before it is read):
 *     ring_area   26 pages, one per queue slot: 0-3 the balloon's (inflate,
 *                 deflate, stats, reporting), 4 blk, 5-7 vsock rx, tx,
 *                 event, 8-9 net rx, tx, 10-25 virtio-mem's; descriptors at +0 (16-byte
 *                 aligned, 64 x 16 bytes), available ring at +0x400
 *                 (2-aligned, 4 + 2 x 64), used ring at +0x800 (4-aligned,
 *                 4 + 8 x 64)
 *     pfn_buf     1 KiB, 256 PFNs of one inflate or deflate batch
 *     stats_buf   30 bytes, the statistics buffer
 *     blk_hdr, blk_status, blk_id, blk_data   16, 1, 20 and 512 bytes
 *     vs_rxhdr    8 x 64 bytes, the rx buffers' headers (44 used)
 *     vs_txhdr    64 bytes, the header being sent
 *     vs_evbuf    4 x 8 bytes, the event buffers (4 used)
 *     vs_rxdata   8 x 4 KiB, the rx buffers' payload (page aligned)
 *     vs_txdata   4 KiB, the payload being sent
 *     vs_rings    4 x 16 KiB, each connection's bytes not yet echoed
 *     net_rxbuf   8 x 2 KiB, the rx buffers
 *     net_txbuf   2 KiB, the frame being sent
 *     br_buf      64 KiB, blk-read='s requests (blk_read.S)
 *     mm_req, mm_resp, mm_token  1 KiB, 4 KiB, 256 bytes: mmds= (mmds.S)
 *     mem_devs, mem_req, mem_resp, mem_pt  2 KiB, 24 and 16 bytes, 96
 *                 pages of page tables for the hotplug region: mem (mem.S)
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
        .set PORT_WAIT,       0xf0c     /* out: wait for a device (dev_wait) */
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
        .set VM_INT_STATUS,   0x060
        .set VM_INT_ACK,      0x064
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
        .set BCK_DEFLATE,     1         /* opt_bcheck */
        .set BCK_RESET,       2
        .set BCK_PATTERN,     0x5a      /* added to each page's address */
        .set REPORT_DESCS,    32        /* descriptors per report, at most */
        .set REPORT_CHUNK,    4 << 20   /* bytes per report descriptor, at most */
        .set VQ_TIMEOUT_MS,   20000
        .set WAIT_MS,         100       /* one dev_wait at most */
        .set WAIT_SHARED_MS,  1         /* one dev_wait while serving two */
        .set ST_NEEDS_RESET,  0x40
/* The other devices (virtio 1.2, 5.1, 5.2, 5.10) and their queue slots. */
        .set VIRTIO_ID_NET,   1
        .set VIRTIO_ID_BLOCK, 2
        .set VIRTIO_ID_VSOCK, 19
        .set SLOT_BLK,        4
        .set SLOT_VS_RX,      5
        .set SLOT_VS_TX,      6
        .set SLOT_VS_EV,      7
        .set SLOT_NET_RX,     8
        .set SLOT_NET_TX,     9
        .set SLOT_MEM0,       10        /* virtio-mem: SLOT_MEM0 + i (mem.S) */
        .set MEM_MAX,         16
        .set VQ_SLOTS,        SLOT_MEM0 + MEM_MAX
/* virtio-blk */
        .set BLK_F_RO,        1 << 5
        .set BLK_F_FLUSH,     1 << 9
        .set BLK_CAPACITY,    0x100     /* config: u64 capacity in sectors */
        .set BLK_T_IN,        0
        .set BLK_T_OUT,       1
        .set BLK_T_FLUSH,     4
        .set BLK_T_GET_ID,    8
        .set BLK_SECTOR,      512
        .set BLK_ID_BYTES,    20
/* virtio-vsock */
        .set VS_F_STREAM,     1 << 0
        .set VS_GUEST_CID,    0x100     /* config: u64 guest_cid */
        .set VS_HDR,          44        /* struct virtio_vsock_hdr */
        .set H_SRC_CID,       0
        .set H_DST_CID,       8
        .set H_SRC_PORT,      16
        .set H_DST_PORT,      20
        .set H_LEN,           24
        .set H_TYPE,          28
        .set H_OP,            30
        .set H_FLAGS,         32
        .set H_BUF_ALLOC,     36
        .set H_FWD_CNT,       40
        .set VS_TYPE_STREAM,  1
        .set VS_OP_REQUEST,   1
        .set VS_OP_RESPONSE,  2
        .set VS_OP_RST,       3
        .set VS_OP_SHUTDOWN,  4
        .set VS_OP_RW,        5
        .set VS_OP_CREDIT_UPDATE, 6
        .set VS_OP_CREDIT_REQUEST, 7
        .set VS_SHUT_RCV,     1
        .set VS_SHUT_SEND,    2
        .set VS_EVENT_TRANSPORT_RESET, 0
        .set VS_HOST_CID,     2
        .set VS_LOCAL_PORT,   49152     /* our port for vsock=connect: */
        .set VS_NRX,          8         /* rx buffers */
        .set VS_RXDATA,       4096      /* payload bytes per rx buffer */
        .set VS_TXDATA,       4096      /* payload bytes per packet sent */
        .set VS_NEV,          4         /* event buffers */
        .set VS_CONNS,        4         /* connections at once */
        .set VS_BUF,          16384     /* buf_alloc: bytes held per connection */
        .set VS_HELLO_LEN,    27
        .set VS_ECHO,         1         /* opt_vsock */
        .set VS_CONNECT,      2
/* A connection entry (vs_conns). */
        .set C_STATE,         0         /* u8 */
        .set C_SHUT,          1         /* u8 the host's SHUTDOWN flags */
        .set C_CREQ,          2         /* u8 a CREDIT_REQUEST is out */
        .set C_PEER_PORT,     4
        .set C_PEER_CID,      8
        .set C_LOCAL_PORT,    16
        .set C_RX,            20        /* payload bytes received */
        .set C_FWD,           24        /* of them consumed (echoed) */
        .set C_TX,            28        /* payload bytes sent */
        .set C_PEER_BUF,      32        /* the host's buf_alloc */
        .set C_PEER_FWD,      36        /* the host's fwd_cnt */
        .set C_RING,          40        /* u64 its VS_BUF bytes in vs_rings */
        .set C_SIZE,          64
        .set C_FREE,          0
        .set C_OPEN,          1
        .set C_CLOSING,       2         /* the host shut down: send, then RST */
        .set C_CONNECTING,    3
/* virtio-net */
        .set NET_F_MAC,       1 << 5
        .set NET_CFG_MAC,     0x100     /* config: u8 mac[6] */
        .set NET_HDR,         12        /* struct virtio_net_hdr_v1 */
        .set NET_BUF,         2048      /* bytes per rx buffer, header included */
        .set NET_NRX,         8
        .set NET_ETHERTYPE_BE, 0xb588   /* 0x88b5 in network order */
        .set NET_HELLO_LEN,   19
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

8:      call    devices_start           /* blk, vsock=, net= */
        cmp     byte ptr [rip + opt_fault], 2
        jne     4f
        mov     dx, PORT_UNKNOWN
5:      out     dx, al
        jmp     5b
4:      cmp     byte ptr [rip + opt_mem], 0
        jne     mem_main                /* follows requested_size for ever */
        cmp     byte ptr [rip + opt_reset], 0
        jne     9f
        lea     rsi, [rip + msg_idle]
        call    puts
        cmp     byte ptr [rip + serve_echo], 0
        jne     serve_loop
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
        lea     rdi, [rip + key_vsock]
        call    match_key
        jc      .Lvsock_val
        lea     rdi, [rip + key_net]
        call    match_key
        jc      .Lnet_val
        lea     rdi, [rip + key_blk_read]
        call    match_key
        jc      .Lblk_read_val
        call    mm_parse_word           /* mmds=, mmds-addr=, mmds-ip= */
        cmp     eax, 1
        je      .Lword
        ja      .Lbad
        call    mem_parse_word          /* mem, mem=unplug-all (mem.S) */
        cmp     eax, 1
        je      .Lword
        ja      .Lbad
        lea     rdi, [rip + key_blk]
        call    match_value
        jnc     1f
        mov     byte ptr [rip + opt_blk], 1
        jmp     .Lword
1:      lea     rdi, [rip + key_balloon]
        call    match_value
        jnc     1f
        mov     byte ptr [rip + opt_balloon], 1
        jmp     .Lword
1:      lea     rdi, [rip + key_bck_deflate]
        call    match_value
        jnc     1f
        mov     byte ptr [rip + opt_bcheck], BCK_DEFLATE
        jmp     .Lword
1:      lea     rdi, [rip + key_bck_reset]
        call    match_value
        jnc     .Lskip
        mov     byte ptr [rip + opt_bcheck], BCK_RESET
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
.Lblk_read_val:
        call    parse_mib
        jc      .Lbad
        mov     [rip + opt_blk_read], rax
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
.Lvsock_val:                            /* echo:<port> | connect:<port> */
        lea     rdi, [rip + val_echo_port]
        call    match_key
        jnc     1f
        mov     byte ptr [rip + opt_vsock], VS_ECHO
        jmp     2f
1:      lea     rdi, [rip + val_connect_port]
        call    match_key
        jnc     .Lbad
        mov     byte ptr [rip + opt_vsock], VS_CONNECT
2:      call    parse_u32
        jc      .Lbad
        mov     [rip + vs_port], eax
        jmp     .Lword
.Lnet_val:
        lea     rdi, [rip + val_echo]
        call    match_value
        jnc     .Lbad
        mov     byte ptr [rip + opt_net], 1
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

/* Parse the decimal u32 at rsi (< r8) up to a space or the end: eax, CF
 * clear; CF set when there are no digits, a non-digit or it is too big. */
parse_u32:
        xor     eax, eax
        xor     edx, edx
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
        shr     rcx, 32
        jnz     3f
        inc     edx
        inc     rsi
        jmp     1b
2:      test    edx, edx
        jz      3f
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
        lea     rax, [rip + tag_balloon]
        mov     [rip + dev_tag], rax
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
        call    bl_check
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
1:      mov     rax, [rip + bl_base]
        mov     ecx, WAIT_MS
        call    dev_wait
        jmp     balloon_serve

/* bcheck-deflate / bcheck-reset (see the top): rbx = the device. */
bl_check:
        movzx   eax, byte ptr [rip + opt_bcheck]
        test    eax, eax
        jz      .Lck_ret
        push    r12
        push    r13
        xor     edi, edi
        mov     esi, PFNS_MAX
        mov     [rip + bl_batch], esi
        call    bl_pfns
        mov     r12d, SLOT_INFLATE
        call    bl_tell                 /* acknowledged at once; freed behind */
        jc      .Lck_out
        mov     dx, PORT_CLOCK
        in      eax, dx
        mov     r13d, eax               /* r13d = when the check began */
        cmp     byte ptr [rip + opt_bcheck], BCK_RESET
        je      .Lck_reset
        mov     r12d, SLOT_DEFLATE
        call    vq_ptrs
        lea     rax, [rip + pfn_buf]
        mov     [rdi], rax
        mov     eax, [rip + bl_batch]
        shl     eax, 2
        mov     [rdi + 8], eax
        mov     dword ptr [rdi + 12], 0
        call    vq_post
        mov     ecx, 2000
1:      mov     eax, dword ptr [rbx + BL_NUM_PAGES]
        dec     ecx
        jnz     1b
        lea     rsi, [rip + msg_bck_regs]
        call    bck_took
        call    vq_wait
        jc      .Lck_out
        lea     rsi, [rip + msg_bck_deflate]
        call    bck_took
        jmp     .Lck_pattern
.Lck_reset:
        mov     dword ptr [rbx + VM_STATUS], 0
1:      mov     eax, dword ptr [rbx + VM_STATUS]
        test    eax, eax
        jz      2f
        mov     dx, PORT_CLOCK
        in      eax, dx
        sub     eax, r13d
        cmp     eax, 10000
        jb      1b
        lea     rsi, [rip + msg_bck_noreset]
        call    puts
        jmp     .Lck_out
2:      lea     rsi, [rip + msg_bck_reset]
        call    bck_took
        lea     rdi, [rip + vq_state]   /* the balloon's slots 0-3: fresh */
        mov     ecx, 8
        xor     eax, eax
        rep stosq
        mov     qword ptr [rip + bl_base], 0
        mov     dword ptr [rip + bl_actual], 0
        call    bl_init
        jc      .Lck_out
.Lck_pattern:
        mov     dword ptr [rip + bl_actual], 0
        xor     r12d, r12d              /* fill */
.Lck_fill:
        lea     r8, [rip + pfn_buf]
        mov     eax, [r8 + r12 * 4]
        shl     rax, 12
        mov     rdi, rax
        add     rax, BCK_PATTERN
        mov     ecx, PAGE / 8
        rep stosq
        inc     r12d
        cmp     r12d, PFNS_MAX
        jb      .Lck_fill
        mov     dx, PORT_CLOCK
        in      eax, dx
        mov     r13d, eax
1:      mov     rax, rbx
        mov     ecx, WAIT_MS
        call    dev_wait
        mov     dx, PORT_CLOCK
        in      eax, dx
        sub     eax, r13d
        cmp     eax, 3000
        jb      1b
        xor     r12d, r12d              /* check */
.Lck_check:
        lea     r8, [rip + pfn_buf]
        mov     eax, [r8 + r12 * 4]
        shl     rax, 12
        mov     rdi, rax
        add     rax, BCK_PATTERN
        mov     ecx, PAGE / 8
        repe scasq
        jne     .Lck_corrupt
        inc     r12d
        cmp     r12d, PFNS_MAX
        jb      .Lck_check
        lea     rsi, [rip + msg_bck_ok]
        jmp     1f
.Lck_corrupt:
        lea     rsi, [rip + msg_bck_corrupt]
1:      push    rsi
        lea     rsi, [rip + msg_bck_pat]
        call    puts
        lea     rsi, [rip + msg_bck_what_deflate]
        cmp     byte ptr [rip + opt_bcheck], BCK_RESET
        jne     2f
        lea     rsi, [rip + msg_bck_what_reset]
2:      call    puts
        pop     rsi
        call    puts
.Lck_out:
        pop     r13
        pop     r12
.Lck_ret:
        ret

/* Say rsi (a line's start) + (clock - r13d) + " ms". */
bck_took:
        call    puts
        mov     dx, PORT_CLOCK
        in      eax, dx
        sub     eax, r13d
        call    put_u64
        lea     rsi, [rip + msg_ms]
        jmp     puts

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
        mov     edi, VIRTIO_ID_BALLOON
        jmp     vdev_probe

/* Initialise the device at rbx; on success bl_base = rbx, CF clear. */
bl_init:
        push    r12
        push    r13
        mov     esi, F_WANTED_LO
        call    vdev_begin              /* said, FAILED, on failure */
        jc      .Linit_out
        mov     [rip + bl_feat], rax
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
.Linit_failed:                          /* vq_setup said why */
        call    vdev_fail
.Linit_out:
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
        mov     word ptr [rdi + VQ_AVAIL], 0   /* interrupts on: dev_wait */
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
1:      lea     rsi, [rip + msg_e_queue]
        call    say_err                 /* "<dev_tag> error queue " */
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
        xor     eax, eax
        jmp     vq_post_head

/* Wait until the device has used slot r12's buffer (and take it): CF
 * clear; or, after VQ_TIMEOUT_MS, say so, give the device up (bl_base = 0)
 * and set CF. The balloon's: it may run while serving the others. */
vq_wait:
        lea     rax, [rip + tag_balloon]
        mov     [rip + dev_tag], rax
        call    vq_wait_any
        jc      1f
        call    vq_ptrs
        inc     word ptr [rsi + VQS_USED]
        clc
        ret
1:      mov     qword ptr [rip + bl_base], 0
        stc
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

/* ------------------------------------------------------------------------
 * Helpers shared by the block, vsock and net drivers (and vq_setup's
 * message). rbx = the device's MMIO base, r12 = a queue slot; dev_tag
 * names the device in every line.
 */

/* Print "teravm firmware: <dev_tag> ". */
say_tag:
        lea     rsi, [rip + msg_fw]
        call    puts
        mov     rsi, [rip + dev_tag]
        call    puts
        mov     al, ' '
        jmp     putc

/* Print "teravm firmware: <dev_tag> " and the string at rsi. */
say_err:
        push    rsi
        call    say_tag
        pop     rsi
        jmp     puts

/* edi = a virtio device ID: rbx = the base of the first device with it
 * (slots as bl_probe tries them), CF clear; or CF set (said). */
vdev_probe:
        mov     ebx, VIRTIO_MMIO_FIRST
        mov     ecx, VIRTIO_MMIO_SLOTS
1:      mov     eax, dword ptr [rbx + VM_MAGIC]
        cmp     eax, VIRTIO_MAGIC
        jne     2f
        mov     eax, dword ptr [rbx + VM_VERSION]
        cmp     eax, 2
        jne     2f
        mov     eax, dword ptr [rbx + VM_DEVICE_ID]
        cmp     eax, edi
        jne     2f
        clc
        ret
2:      add     ebx, 0x1000
        dec     ecx
        jnz     1b
        lea     rsi, [rip + msg_e_nodev]
        call    say_err
        stc
        ret

/* Reset the device at rbx and negotiate (virtio 1.2, 3.1.1): esi = the
 * feature bits 0..31 wanted where offered; VERSION_1 (bit 32) is required
 * and nothing else above bit 31 is taken. rax = the features accepted and
 * CF clear (status ACKNOWLEDGE | DRIVER | FEATURES_OK); or said, FAILED
 * set and CF set. */
vdev_begin:
        push    r12
        mov     r12d, esi
        mov     dword ptr [rbx + VM_STATUS], 0
        mov     ecx, 1000
1:      mov     eax, dword ptr [rbx + VM_STATUS]
        test    eax, eax
        jz      2f
        pause
        dec     ecx
        jnz     1b
        lea     rsi, [rip + msg_e_noreset]
        jmp     .Lbegin_fail
2:      mov     dword ptr [rbx + VM_STATUS], ST_ACK
        mov     dword ptr [rbx + VM_STATUS], ST_ACK | ST_DRIVER
        mov     dword ptr [rbx + VM_DEV_FEAT_SEL], 1
        mov     eax, dword ptr [rbx + VM_DEV_FEAT]
        test    eax, F_VERSION_1_HI
        jz      .Lbegin_nov1
        mov     dword ptr [rbx + VM_DEV_FEAT_SEL], 0
        mov     eax, dword ptr [rbx + VM_DEV_FEAT]
        and     r12d, eax
        mov     dword ptr [rbx + VM_DRV_FEAT_SEL], 0
        mov     dword ptr [rbx + VM_DRV_FEAT], r12d
        mov     dword ptr [rbx + VM_DRV_FEAT_SEL], 1
        mov     dword ptr [rbx + VM_DRV_FEAT], F_VERSION_1_HI
        mov     dword ptr [rbx + VM_STATUS], ST_ACK | ST_DRIVER | ST_FEATURES_OK
        mov     eax, dword ptr [rbx + VM_STATUS]
        test    eax, ST_FEATURES_OK
        jz      .Lbegin_refused
        mov     eax, r12d
        bts     rax, 32
        pop     r12
        clc
        ret
.Lbegin_nov1:
        lea     rsi, [rip + msg_e_nov1]
        jmp     .Lbegin_fail
.Lbegin_refused:
        lea     rsi, [rip + msg_e_refused]
.Lbegin_fail:
        call    say_err
        pop     r12
        /* fall through */

/* Set FAILED in the status of the device at rbx; CF set. */
vdev_fail:
        mov     eax, dword ptr [rbx + VM_STATUS]
        or      eax, ST_FAILED
        mov     dword ptr [rbx + VM_STATUS], eax
        stc
        ret

/* DRIVER_OK for the device at rbx (its queues set up): CF clear; or, if
 * the device did not take it (DEVICE_NEEDS_RESET), said, FAILED, CF set. */
vdev_ok:
        mov     dword ptr [rbx + VM_STATUS], ST_ACK | ST_DRIVER | ST_FEATURES_OK | ST_DRIVER_OK
        mov     eax, dword ptr [rbx + VM_STATUS]
        test    eax, ST_NEEDS_RESET
        jnz     1f
        test    eax, ST_DRIVER_OK
        jz      1f
        clc
        ret
1:      lea     rsi, [rip + msg_e_notok]
        call    say_err
        jmp     vdev_fail

/* Print "teravm firmware: <tag> device at 0x<rbx> features 0x<rax>" (no
 * end of line). */
vdev_line:
        push    rax
        call    say_tag
        lea     rsi, [rip + msg_dev_at]
        call    puts
        mov     rax, rbx
        call    put_hex
        lea     rsi, [rip + msg_bl_features]
        call    puts
        pop     rax
        jmp     put_hex

/* Descriptor ecx of slot r12 = { rax address, edx length, r8d: flags in
 * the low 16 bits, next in the high 16 }. Clobbers rdi, rsi, r9. */
vq_desc:
        push    rax
        call    vq_ptrs
        pop     rax
        mov     r9d, ecx
        shl     r9d, 4
        add     rdi, r9
        mov     [rdi], rax
        mov     [rdi + 8], edx
        mov     [rdi + 12], r8d
        ret

/* Make the chain headed by descriptor eax of slot r12 available and
 * notify the device at rbx. Clobbers rax, rcx, rdi, rsi, r8. */
vq_post_head:
        push    rax
        call    vq_ptrs
        pop     r8
        movzx   eax, word ptr [rsi + VQS_AVAIL]
        movzx   ecx, word ptr [rsi + VQS_SIZE]
        dec     ecx
        and     ecx, eax
        mov     [rdi + VQ_AVAIL + 4 + rcx * 2], r8w
        inc     eax
        mov     [rsi + VQS_AVAIL], ax
        mov     [rdi + VQ_AVAIL + 2], ax        /* after the entry (x86 order) */
        mfence                                  /* idx before the notification */
        mov     eax, [rsi + VQS_INDEX]
        mov     dword ptr [rbx + VM_QUEUE_NOTIFY], eax
        ret

/* Take the next used element of slot r12: eax = id, edx = length, CF
 * clear; CF set if there is none. Clobbers rcx, rdi, rsi. */
vq_pop:
        call    vq_ptrs
        movzx   ecx, word ptr [rsi + VQS_USED]
        cmp     cx, word ptr [rdi + VQ_USED + 2]        /* the device writes it */
        je      1f
        movzx   edx, word ptr [rsi + VQS_SIZE]
        dec     edx
        and     edx, ecx
        mov     eax, [rdi + VQ_USED + 4 + rdx * 8]
        mov     edx, [rdi + VQ_USED + 8 + rdx * 8]
        inc     word ptr [rsi + VQS_USED]
        clc
        ret
1:      stc
        ret

/* Wait until slot r12 (of the device at rbx) has a used element not taken
 * yet, dev_wait between looks: CF clear; or, after VQ_TIMEOUT_MS, say
 * "<tag> error queue <i> timed out; device given up", set FAILED and CF.
 * Clobbers rax, rcx, rdx, rdi, rsi, r8, r9. */
vq_wait_any:
        call    vq_ptrs
        mov     dx, PORT_CLOCK
        in      eax, dx
        mov     r8d, eax
1:      movzx   eax, word ptr [rdi + VQ_USED + 2]
        cmp     ax, [rsi + VQS_USED]
        jne     2f
        mov     rax, rbx                /* the device: asleep until it signals */
        mov     ecx, WAIT_MS
        call    dev_wait
        mov     dx, PORT_CLOCK
        in      eax, dx
        sub     eax, r8d
        cmp     eax, VQ_TIMEOUT_MS
        jb      1b
        lea     rsi, [rip + msg_e_queue]
        call    say_err
        call    vq_ptrs
        mov     eax, [rsi + VQS_INDEX]
        call    put_u64
        lea     rsi, [rip + msg_bl_timeout]
        call    puts
        jmp     vdev_fail
2:      clc
        ret

/* Start a deadline of VQ_TIMEOUT_MS; deadline_passed: CF set once it has
 * passed (the clock port read each call: the callers dev_wait between
 * calls). Clobber rax, rdx. */
deadline_start:
        mov     dx, PORT_CLOCK
        in      eax, dx
        mov     [rip + dl_t0], eax
        ret
deadline_passed:
        mov     dx, PORT_CLOCK
        in      eax, dx
        sub     eax, [rip + dl_t0]
        cmp     eax, VQ_TIMEOUT_MS
        jb      1f
        stc
        ret
1:      clc
        ret

/* teravm's stand-in for `sti; hlt` (see the top): sleep until the device
 * at rax (a virtio-mmio base; 0: none, then just `pause`) interrupts or ecx
 * ms pass (1..65535), then acknowledge its InterruptStatus. On a VMM
 * without the wait port the `out` does nothing and the caller polls.
 * Clobbers rax, rcx, rdx. */
dev_wait:
        test    rax, rax
        jz      2f
        push    rbx
        mov     rbx, rax
        mov     eax, ebx
        sub     eax, VIRTIO_MMIO_FIRST
        shr     eax, 12                 /* the slot */
        shl     ecx, 16
        or      eax, ecx                /* the timeout */
        mov     dx, PORT_WAIT
        out     dx, eax
        mov     eax, dword ptr [rbx + VM_INT_STATUS]
        test    eax, eax
        jz      1f
        mov     dword ptr [rbx + VM_INT_ACK], eax
1:      pop     rbx
        ret
2:      pause
        ret

/* Print al as two lower-case hex digits. Clobbers rax, rcx, rdx. */
put_hex8:
        push    rax
        movzx   eax, al
        shr     eax, 4
        lea     rcx, [rip + hex_digits]
        mov     al, [rcx + rax]
        call    putc
        pop     rax
        and     eax, 15
        lea     rcx, [rip + hex_digits]
        mov     al, [rcx + rax]
        jmp     putc

/* The devices the command line names, in order: blk, blk-read=, vsock,
 * net, mmds=. */
devices_start:
        cmp     byte ptr [rip + opt_blk], 0
        je      1f
        call    blk_run
1:      cmp     qword ptr [rip + opt_blk_read], 0
        je      1f
        call    blk_read_run
1:      cmp     byte ptr [rip + opt_vsock], 0
        je      2f
        call    vs_start
2:      cmp     byte ptr [rip + opt_net], 0
        je      3f
        call    net_start
3:      cmp     qword ptr [rip + mm_path_len], 0
        je      4f
        call    mmds_run
4:      ret

/* vCPU 0 serving vsock=echo: and/or net=echo (then=idle): look at their
 * used rings, serve the balloon (if `balloon`) and look at the i8042 for a
 * Ctrl-Alt-Del, as balloon_serve; then dev_wait (see the top). */
serve_loop:
        mov     al, [rip + vs_live]
        or      al, [rip + net_live]
        jnz     4f
        cmp     byte ptr [rip + opt_balloon], 0
        je      idle                    /* every device given up */
4:      cmp     byte ptr [rip + opt_balloon], 0
        je      1f
        cmp     qword ptr [rip + bl_base], 0
        je      1f
        call    bl_stats_poll
        call    bl_sync
1:      mov     dx, I8042_CMD
        in      al, dx
        test    al, 1
        jz      2f
        mov     dx, I8042_DATA
        in      al, dx
        jmp     reset
2:      call    vs_poll
        call    net_poll
        /* Asleep until the device served signals; serving two or more
         * (the port names one), WAIT_SHARED_MS on the vsock, else the net. */
        xor     ecx, ecx
        movzx   eax, byte ptr [rip + vs_live]
        add     ecx, eax
        movzx   eax, byte ptr [rip + net_live]
        add     ecx, eax
        cmp     byte ptr [rip + opt_balloon], 0
        je      5f
        cmp     qword ptr [rip + bl_base], 0
        je      5f
        inc     ecx
5:      mov     edx, WAIT_MS
        cmp     ecx, 1
        mov     ecx, WAIT_SHARED_MS
        cmove   ecx, edx
        mov     rax, [rip + vs_base]
        cmp     byte ptr [rip + vs_live], 0
        jne     6f
        mov     rax, [rip + net_base]
        cmp     byte ptr [rip + net_live], 0
        jne     6f
        mov     rax, [rip + bl_base]
6:      call    dev_wait
        jmp     serve_loop

/* ------------------------------------------------------------------------
 * virtio-blk (virtio 1.2, 5.2), `blk`: one request at a time on queue 0,
 * each a chain of descriptors 0 (header, device-readable), 1 (data) and 2
 * (status, device-writable), headed by descriptor 0.
 */
blk_run:
        push    rbx
        push    r12
        push    r13
        call    blk_init
        jc      .Lblk_done

        /* Sector 0: its first 16 bytes. */
        mov     eax, BLK_T_IN
        xor     edx, edx
        call    blk_request
        jc      .Lblk_done
        push    rax
        call    say_tag
        lea     rsi, [rip + msg_blk_sector0]
        call    puts
        pop     rax
        test    eax, eax
        jz      1f
        call    blk_say_status
        jmp     2f
1:      xor     r13d, r13d
3:      lea     rax, [rip + blk_data]
        movzx   eax, byte ptr [rax + r13]
        call    put_hex8
        inc     r13d
        cmp     r13d, 16
        jb      3b
2:      mov     al, 10
        call    putc

        /* Sector 1: 512 bytes of 0xa5, then a flush if negotiated. */
        lea     rdi, [rip + blk_data]
        mov     ecx, BLK_SECTOR
        mov     al, 0xa5
        rep stosb
        mov     eax, BLK_T_OUT
        mov     edx, 1
        call    blk_request
        jc      .Lblk_done
        test    eax, eax
        jnz     4f
        test    dword ptr [rip + blk_feat], BLK_F_FLUSH
        jz      4f
        mov     eax, BLK_T_FLUSH
        xor     edx, edx
        call    blk_request
        jc      .Lblk_done
4:      push    rax
        call    say_tag
        lea     rsi, [rip + msg_blk_write]
        call    puts
        pop     rax
        call    blk_say_status
        mov     al, 10
        call    putc

        /* Sector 1 back. */
        lea     rdi, [rip + blk_data]
        mov     ecx, BLK_SECTOR
        xor     eax, eax
        rep stosb
        mov     eax, BLK_T_IN
        mov     edx, 1
        call    blk_request
        jc      .Lblk_done
        push    rax
        call    say_tag
        lea     rsi, [rip + msg_blk_readback]
        call    puts
        pop     rax
        test    eax, eax
        jz      5f
        call    blk_say_status
        mov     al, 10
        call    putc
        jmp     6f
5:      lea     rdi, [rip + blk_data]
        mov     ecx, BLK_SECTOR
        mov     al, 0xa5
        repe scasb
        lea     rsi, [rip + msg_blk_match]
        je      7f
        lea     rsi, [rip + msg_blk_mismatch]
7:      call    puts

        /* GET_ID: up to 20 bytes, to the first NUL. */
6:      lea     rdi, [rip + blk_id]
        mov     ecx, BLK_ID_BYTES
        xor     eax, eax
        rep stosb
        mov     eax, BLK_T_GET_ID
        xor     edx, edx
        call    blk_request
        jc      .Lblk_done
        push    rax
        call    say_tag
        pop     rax
        test    eax, eax
        jz      8f
        push    rax
        lea     rsi, [rip + msg_blk_getid]
        call    puts
        pop     rax
        call    blk_say_status
        jmp     9f
8:      lea     rsi, [rip + msg_blk_id]
        call    puts
        xor     r13d, r13d
10:     lea     rax, [rip + blk_id]
        movzx   eax, byte ptr [rax + r13]
        test    al, al
        jz      9f
        cmp     al, 0x20
        jb      11f
        cmp     al, 0x7e
        jbe     12f
11:     mov     al, '?'
12:     call    putc
        inc     r13d
        cmp     r13d, BLK_ID_BYTES
        jb      10b
9:      mov     al, 10
        call    putc
.Lblk_done:
        pop     r13
        pop     r12
        pop     rbx
        ret

/* Find and set up the first virtio-blk once (`blk` and `blk-read=` share
 * it) and say its line: rbx = its base, r12 = SLOT_BLK, blk_sectors = its
 * capacity, CF clear; CF set if it cannot be used (said, and not tried
 * again). Clobbers r13. */
blk_init:
        lea     rax, [rip + tag_blk]
        mov     [rip + dev_tag], rax
        mov     r12d, SLOT_BLK
        mov     rbx, [rip + blk_base]
        test    rbx, rbx
        jz      1f                      /* 0: not tried yet */
        cmp     rbx, 2                  /* 1: failed (CF set), else set up */
        ret
1:      mov     qword ptr [rip + blk_base], 1
        mov     edi, VIRTIO_ID_BLOCK
        call    vdev_probe
        jc      2f
        mov     esi, BLK_F_RO | BLK_F_FLUSH
        call    vdev_begin
        jc      2f
        mov     [rip + blk_feat], rax
        xor     r13d, r13d
        call    vq_setup
        jc      3f
        call    vdev_ok
        jc      2f
        mov     [rip + blk_base], rbx
        mov     rax, [rip + blk_feat]
        call    vdev_line
        lea     rsi, [rip + msg_capacity]
        call    puts
        mov     eax, dword ptr [rbx + BLK_CAPACITY + 4]
        shl     rax, 32
        mov     ecx, dword ptr [rbx + BLK_CAPACITY]
        or      rax, rcx
        mov     [rip + blk_sectors], rax
        call    put_u64
        lea     rsi, [rip + msg_sectors]
        call    puts
        mov     r12d, SLOT_BLK
        clc
        ret
3:      call    vdev_fail
2:      stc
        ret

/* One request on the block queue (r12 = SLOT_BLK, rbx = the device): eax =
 * type, rdx = sector. eax = the status byte, CF clear; CF set on a timeout
 * (said). IN and OUT move blk_len bytes at blk_buf (blk_data, one sector,
 * but for blk-read=), GET_ID fills blk_id. */
blk_request:
        lea     rdi, [rip + blk_hdr]
        mov     [rdi], eax
        mov     dword ptr [rdi + 4], 0
        mov     [rdi + 8], rdx
        mov     byte ptr [rip + blk_status], 0xff     /* a status never written */
        push    rax
        lea     rax, [rip + blk_hdr]
        mov     edx, 16
        mov     r8d, DESC_F_NEXT | (1 << 16)
        cmp     dword ptr [rsp], BLK_T_FLUSH
        jne     1f
        mov     r8d, DESC_F_NEXT | (2 << 16)        /* no data */
1:      xor     ecx, ecx
        call    vq_desc
        mov     rax, [rip + blk_buf]
        mov     edx, [rip + blk_len]
        mov     r8d, DESC_F_NEXT | DESC_F_WRITE | (2 << 16)
        mov     ecx, [rsp]
        cmp     ecx, BLK_T_OUT
        jne     2f
        mov     r8d, DESC_F_NEXT | (2 << 16)        /* device-readable */
2:      cmp     ecx, BLK_T_GET_ID
        jne     3f
        lea     rax, [rip + blk_id]
        mov     edx, BLK_ID_BYTES
3:      mov     ecx, 1
        call    vq_desc
        lea     rax, [rip + blk_status]
        mov     edx, 1
        mov     r8d, DESC_F_WRITE
        mov     ecx, 2
        call    vq_desc
        add     rsp, 8
        xor     eax, eax
        call    vq_post_head
        call    vq_wait_any
        jc      4f
        call    vq_pop
        movzx   eax, byte ptr [rip + blk_status]
        clc
4:      ret

/* Print a block status (eax): ok, ioerr, unsupp or "status <n>". */
blk_say_status:
        lea     rsi, [rip + msg_st_ok]
        test    eax, eax
        jz      1f
        lea     rsi, [rip + msg_st_ioerr]
        cmp     eax, 1
        je      1f
        lea     rsi, [rip + msg_st_unsupp]
        cmp     eax, 2
        je      1f
        push    rax
        lea     rsi, [rip + msg_st_other]
        call    puts
        pop     rax
        jmp     put_u64
1:      jmp     puts

/* ------------------------------------------------------------------------
 * virtio-vsock (virtio 1.2, 5.10), `vsock=echo:<port>` / `connect:<port>`.
 * rx: buffer i is descriptors 2i (its 44-byte header) and 2i+1 (4 KiB of
 * payload), both device-writable, always posted again once read. tx: one
 * packet at a time, descriptor 0 (header) and 1 (payload, if any),
 * waited for until used. event: 4-byte buffers; a TRANSPORT_RESET drops
 * every connection and reads guest_cid again. r13 = a connection entry.
 */
vs_start:
        push    rbx
        push    r12
        push    r13
        lea     rax, [rip + tag_vsock]
        mov     [rip + dev_tag], rax
        mov     edi, VIRTIO_ID_VSOCK
        call    vdev_probe
        jc      .Lvs_done
        mov     esi, VS_F_STREAM
        call    vdev_begin
        jc      .Lvs_done
        mov     [rip + vs_feat], rax
        mov     r12d, SLOT_VS_RX
        xor     r13d, r13d
        call    vq_setup
        jc      .Lvs_fail
        mov     r12d, SLOT_VS_TX
        mov     r13d, 1
        call    vq_setup
        jc      .Lvs_fail
        mov     r12d, SLOT_VS_EV
        mov     r13d, 2
        call    vq_setup
        jc      .Lvs_fail
        call    vdev_ok
        jc      .Lvs_done
        call    vs_read_cid
        mov     rax, [rip + vs_feat]
        call    vdev_line
        lea     rsi, [rip + msg_cid]
        call    puts
        mov     rax, [rip + vs_cid]
        call    put_u64
        mov     al, 10
        call    putc
        /* rx buffers: min(VS_NRX, size / 2) */
        mov     r12d, SLOT_VS_RX
        movzx   eax, word ptr [rip + vq_state + SLOT_VS_RX * 16 + VQS_SIZE]
        shr     eax, 1
        mov     ecx, VS_NRX
        cmp     eax, ecx
        cmova   eax, ecx
        mov     [rip + vs_nrx], eax
        xor     r13d, r13d
1:      cmp     r13d, [rip + vs_nrx]
        jae     2f
        call    vs_rx_post
        inc     r13d
        jmp     1b
2:      /* event buffers: min(VS_NEV, size) */
        mov     r12d, SLOT_VS_EV
        movzx   eax, word ptr [rip + vq_state + SLOT_VS_EV * 16 + VQS_SIZE]
        mov     ecx, VS_NEV
        cmp     eax, ecx
        cmova   eax, ecx
        mov     [rip + vs_nev], eax
        xor     r13d, r13d
3:      cmp     r13d, [rip + vs_nev]
        jae     4f
        lea     rax, [rip + vs_evbuf]
        lea     rax, [rax + r13 * 8]
        mov     edx, 4                  /* struct virtio_vsock_event */
        mov     r8d, DESC_F_WRITE
        mov     ecx, r13d
        call    vq_desc
        mov     eax, r13d
        call    vq_post_head
        inc     r13d
        jmp     3b
4:      mov     [rip + vs_base], rbx
        mov     byte ptr [rip + vs_live], 1
        cmp     byte ptr [rip + opt_vsock], VS_ECHO
        jne     5f
        call    say_tag
        lea     rsi, [rip + msg_vs_listen]
        call    puts
        mov     eax, [rip + vs_port]
        call    put_u64
        mov     al, 10
        call    putc
        mov     byte ptr [rip + serve_echo], 1
        jmp     .Lvs_done
5:      call    vs_connect
        jmp     .Lvs_done
.Lvs_fail:
        call    vdev_fail
.Lvs_done:
        pop     r13
        pop     r12
        pop     rbx
        ret

vs_read_cid:
        mov     eax, dword ptr [rbx + VS_GUEST_CID + 4]
        shl     rax, 32
        mov     ecx, dword ptr [rbx + VS_GUEST_CID]
        or      rax, rcx
        mov     [rip + vs_cid], rax
        ret

/* Post rx buffer r13d (r12 = SLOT_VS_RX, rbx = the device). */
vs_rx_post:
        mov     eax, r13d
        shl     eax, 6
        lea     rdx, [rip + vs_rxhdr]
        add     rax, rdx
        mov     edx, VS_HDR
        lea     ecx, [r13 * 2 + 1]
        mov     r8d, ecx
        shl     r8d, 16
        or      r8d, DESC_F_WRITE | DESC_F_NEXT
        dec     ecx
        call    vq_desc
        mov     eax, r13d
        shl     eax, 12
        lea     rdx, [rip + vs_rxdata]
        add     rax, rdx
        mov     edx, VS_RXDATA
        mov     r8d, DESC_F_WRITE
        lea     ecx, [r13 * 2 + 1]
        call    vq_desc
        lea     eax, [r13 * 2]
        jmp     vq_post_head

/* Serve the vsock device (vsock_live): every packet received, every event,
 * then (echo) what the connections owe the host. */
vs_poll:
        cmp     byte ptr [rip + vs_live], 0
        je      1f
        call    vs_poll_rx
        cmp     byte ptr [rip + opt_vsock], VS_ECHO
        jne     1f
        push    r13
        lea     r13, [rip + vs_conns]
2:      cmp     byte ptr [r13 + C_STATE], C_OPEN
        jb      3f
        call    vs_flush
3:      add     r13, C_SIZE
        lea     rax, [rip + vs_conns + VS_CONNS * C_SIZE]
        cmp     r13, rax
        jb      2b
        pop     r13
1:      ret

/* Take every used rx buffer (handle its packet, post it again) and every
 * used event buffer. */
vs_poll_rx:
        cmp     byte ptr [rip + vs_live], 0
        je      9f
        lea     rax, [rip + tag_vsock]
        mov     [rip + dev_tag], rax
        push    rbx
        push    r12
        push    r13
        mov     rbx, [rip + vs_base]
1:      cmp     byte ptr [rip + vs_live], 0
        je      8f
        mov     r12d, SLOT_VS_RX
        call    vq_pop
        jc      3f
        test    eax, 1
        jnz     1b                      /* not a head we post: drop it */
        shr     eax, 1
        cmp     eax, [rip + vs_nrx]
        jae     1b
        mov     r13d, eax
        push    r13
        call    vs_packet
        pop     r13
        cmp     byte ptr [rip + vs_live], 0
        je      8f
        mov     r12d, SLOT_VS_RX
        call    vs_rx_post
        jmp     1b
3:      mov     r12d, SLOT_VS_EV
        call    vq_pop
        jc      8f
        cmp     eax, [rip + vs_nev]
        jae     3b
        mov     r13d, eax
        lea     rcx, [rip + vs_evbuf]
        cmp     dword ptr [rcx + r13 * 8], VS_EVENT_TRANSPORT_RESET
        jne     4f
        call    vs_read_cid             /* connections are gone; so is the cid */
        lea     rdi, [rip + vs_conns]
        mov     ecx, VS_CONNS * C_SIZE
        xor     eax, eax
        rep stosb
4:      mov     eax, r13d
        call    vq_post_head
        jmp     3b
8:      pop     r13
        pop     r12
        pop     rbx
9:      ret

/* The packet in rx buffer r13d, edx bytes of it written. */
vs_packet:
        mov     eax, r13d
        shl     eax, 6
        lea     r10, [rip + vs_rxhdr]
        add     r10, rax                /* r10 = header */
        mov     eax, r13d
        shl     eax, 12
        lea     r11, [rip + vs_rxdata]
        add     r11, rax                /* r11 = payload */
        sub     edx, VS_HDR
        jb      .Lpkt_drop
        mov     ecx, [r10 + H_LEN]
        cmp     ecx, edx
        cmova   ecx, edx
        mov     ecx, ecx
        cmp     ecx, VS_RXDATA
        jbe     1f
        mov     ecx, VS_RXDATA
1:      mov     [rip + vs_plen], ecx
        movzx   eax, word ptr [r10 + H_OP]
        cmp     word ptr [r10 + H_TYPE], VS_TYPE_STREAM
        jne     .Lpkt_noconn
        /* The connection: the host's cid and port, our port. */
        lea     r13, [rip + vs_conns]
2:      cmp     byte ptr [r13 + C_STATE], C_FREE
        je      3f
        mov     rcx, [r10 + H_SRC_CID]
        cmp     rcx, [r13 + C_PEER_CID]
        jne     3f
        mov     ecx, [r10 + H_SRC_PORT]
        cmp     ecx, [r13 + C_PEER_PORT]
        jne     3f
        mov     ecx, [r10 + H_DST_PORT]
        cmp     ecx, [r13 + C_LOCAL_PORT]
        je      .Lpkt_conn
3:      add     r13, C_SIZE
        lea     rcx, [rip + vs_conns + VS_CONNS * C_SIZE]
        cmp     r13, rcx
        jb      2b
.Lpkt_noconn:
        cmp     eax, VS_OP_RST
        je      .Lpkt_drop              /* never answer a reset */
        cmp     eax, VS_OP_REQUEST
        jne     .Lpkt_rst
        cmp     word ptr [r10 + H_TYPE], VS_TYPE_STREAM
        jne     .Lpkt_rst
        cmp     byte ptr [rip + opt_vsock], VS_ECHO
        jne     .Lpkt_rst
        mov     ecx, [r10 + H_DST_PORT]
        cmp     ecx, [rip + vs_port]
        jne     .Lpkt_rst
        lea     r13, [rip + vs_conns]
        xor     r9d, r9d
4:      cmp     byte ptr [r13 + C_STATE], C_FREE
        je      5f
        add     r13, C_SIZE
        inc     r9d
        cmp     r9d, VS_CONNS
        jb      4b
        jmp     .Lpkt_rst               /* table full */
5:      mov     rdi, r13
        mov     ecx, C_SIZE
        xor     eax, eax
        rep stosb
        mov     byte ptr [r13 + C_STATE], C_OPEN
        mov     rax, [r10 + H_SRC_CID]
        mov     [r13 + C_PEER_CID], rax
        mov     eax, [r10 + H_SRC_PORT]
        mov     [r13 + C_PEER_PORT], eax
        mov     eax, [r10 + H_DST_PORT]
        mov     [r13 + C_LOCAL_PORT], eax
        mov     eax, [r10 + H_BUF_ALLOC]
        mov     [r13 + C_PEER_BUF], eax
        mov     eax, [r10 + H_FWD_CNT]
        mov     [r13 + C_PEER_FWD], eax
        shl     r9, 14                  /* VS_BUF */
        lea     rax, [rip + vs_rings]
        add     rax, r9
        mov     [r13 + C_RING], rax
        mov     eax, VS_OP_RESPONSE
        xor     edx, edx
        jmp     vs_send_op
.Lpkt_rst:                              /* answer RST from the port it was sent to */
        lea     r13, [rip + vs_tmp]
        mov     rax, [r10 + H_SRC_CID]
        mov     [r13 + C_PEER_CID], rax
        mov     eax, [r10 + H_SRC_PORT]
        mov     [r13 + C_PEER_PORT], eax
        mov     eax, [r10 + H_DST_PORT]
        mov     [r13 + C_LOCAL_PORT], eax
        mov     dword ptr [r13 + C_FWD], 0
        mov     eax, VS_OP_RST
        xor     edx, edx
        jmp     vs_send_op
.Lpkt_drop:
        ret
.Lpkt_conn:
        mov     ecx, [r10 + H_BUF_ALLOC]        /* every packet carries credit */
        mov     [r13 + C_PEER_BUF], ecx
        mov     ecx, [r10 + H_FWD_CNT]
        mov     [r13 + C_PEER_FWD], ecx
        mov     byte ptr [r13 + C_CREQ], 0
        cmp     eax, VS_OP_RW
        je      .Lpkt_rw
        cmp     eax, VS_OP_CREDIT_REQUEST
        je      .Lpkt_creq
        cmp     eax, VS_OP_SHUTDOWN
        je      .Lpkt_shut
        cmp     eax, VS_OP_RST
        je      .Lpkt_reset
        cmp     eax, VS_OP_RESPONSE
        jne     .Lpkt_drop              /* CREDIT_UPDATE: taken above */
        cmp     byte ptr [r13 + C_STATE], C_CONNECTING
        jne     .Lpkt_drop
        mov     byte ptr [r13 + C_STATE], C_OPEN
        ret
.Lpkt_creq:
        mov     eax, VS_OP_CREDIT_UPDATE
        xor     edx, edx
        jmp     vs_send_op
.Lpkt_shut:
        mov     eax, [r10 + H_FLAGS]
        or      [r13 + C_SHUT], al
        cmp     byte ptr [r13 + C_STATE], C_CONNECTING
        je      .Lpkt_drop
        mov     byte ptr [r13 + C_STATE], C_CLOSING
        ret
.Lpkt_reset:
        mov     byte ptr [rip + vs_got_rst], 1
        xor     eax, eax                /* no RST back */
        jmp     vs_end
.Lpkt_rw:
        cmp     byte ptr [r13 + C_STATE], C_CONNECTING
        je      .Lpkt_drop
        mov     ecx, [rip + vs_plen]
        cmp     byte ptr [rip + opt_vsock], VS_ECHO
        je      6f
        add     [r13 + C_RX], ecx       /* connect: read and dropped at once */
        add     [r13 + C_FWD], ecx
        ret
6:      mov     eax, [r13 + C_RX]
        sub     eax, [r13 + C_FWD]      /* held */
        mov     edx, VS_BUF
        sub     edx, eax                /* room (more is the host's fault) */
        cmp     ecx, edx
        cmova   ecx, edx
        mov     rdi, [r13 + C_RING]
        mov     edx, [r13 + C_RX]
        add     [r13 + C_RX], ecx
7:      test    ecx, ecx
        jz      .Lpkt_drop
        mov     al, [r11]
        mov     r9d, edx
        and     r9d, VS_BUF - 1
        mov     [rdi + r9], al
        inc     r11
        inc     edx
        dec     ecx
        jmp     7b

/* Send what connection r13 holds, as the host's credit allows (a
 * CREDIT_REQUEST once when it allows nothing); a closing connection with
 * nothing left to send (or a host that receives no more) is reset. */
vs_flush:
        cmp     byte ptr [rip + vs_live], 0
        je      9f
        mov     ecx, [r13 + C_RX]
        sub     ecx, [r13 + C_FWD]      /* held */
        jz      5f
        test    byte ptr [r13 + C_SHUT], VS_SHUT_RCV
        jz      1f
        mov     eax, [r13 + C_RX]       /* the host reads no more: drop it */
        mov     [r13 + C_FWD], eax
        jmp     5f
1:      mov     eax, [r13 + C_TX]
        sub     eax, [r13 + C_PEER_FWD] /* in flight at the host */
        mov     edx, [r13 + C_PEER_BUF]
        sub     edx, eax
        jae     2f
        xor     edx, edx
2:      cmp     ecx, edx
        cmova   ecx, edx
        cmp     ecx, VS_TXDATA
        jbe     3f
        mov     ecx, VS_TXDATA
3:      test    ecx, ecx
        jnz     4f
        cmp     byte ptr [r13 + C_CREQ], 0
        jne     9f
        mov     byte ptr [r13 + C_CREQ], 1
        mov     eax, VS_OP_CREDIT_REQUEST
        xor     edx, edx
        jmp     vs_send_op
4:      mov     rsi, [r13 + C_RING]
        lea     rdi, [rip + vs_txdata]
        mov     edx, [r13 + C_FWD]
        mov     r9d, ecx
6:      mov     r8d, edx
        and     r8d, VS_BUF - 1
        mov     al, [rsi + r8]
        mov     [rdi], al
        inc     rdi
        inc     edx
        dec     r9d
        jnz     6b
        add     [r13 + C_FWD], ecx      /* consumed: the header says so */
        add     [r13 + C_TX], ecx
        push    rcx
        mov     eax, VS_OP_RW
        xor     edx, edx
        call    vs_hdr
        pop     rcx
        call    vs_tx
        jnc     vs_flush
        ret
5:      cmp     byte ptr [r13 + C_STATE], C_CLOSING
        jne     9f
        mov     eax, 1
        jmp     vs_end
9:      ret

/* Close connection r13: send RST if eax != 0, say how much it echoed
 * (echo), free the entry. */
vs_end:
        test    eax, eax
        jz      1f
        mov     eax, VS_OP_RST
        xor     edx, edx
        call    vs_send_op
1:      cmp     byte ptr [rip + opt_vsock], VS_ECHO
        jne     2f
        call    say_tag
        lea     rsi, [rip + msg_vs_echo]
        call    puts
        mov     eax, [r13 + C_TX]
        call    put_u64
        lea     rsi, [rip + msg_bytes]
        call    puts
2:      mov     byte ptr [r13 + C_STATE], C_FREE
        ret

/* Send op eax, flags edx, no payload, on connection r13. */
vs_send_op:
        call    vs_hdr
        xor     ecx, ecx
        jmp     vs_tx

/* vs_txhdr = a header for connection r13: op eax, flags edx, len 0, our
 * buf_alloc and fwd_cnt. */
vs_hdr:
        lea     rdi, [rip + vs_txhdr]
        mov     rcx, [rip + vs_cid]
        mov     [rdi + H_SRC_CID], rcx
        mov     rcx, [r13 + C_PEER_CID]
        mov     [rdi + H_DST_CID], rcx
        mov     ecx, [r13 + C_LOCAL_PORT]
        mov     [rdi + H_SRC_PORT], ecx
        mov     ecx, [r13 + C_PEER_PORT]
        mov     [rdi + H_DST_PORT], ecx
        mov     dword ptr [rdi + H_LEN], 0
        mov     word ptr [rdi + H_TYPE], VS_TYPE_STREAM
        mov     [rdi + H_OP], ax
        mov     [rdi + H_FLAGS], edx
        mov     dword ptr [rdi + H_BUF_ALLOC], VS_BUF
        mov     ecx, [r13 + C_FWD]
        mov     [rdi + H_FWD_CNT], ecx
        ret

/* Send vs_txhdr with ecx bytes of vs_txdata and wait until it is used:
 * CF clear; CF set if the device is gone or times out (then vs_live = 0). */
vs_tx:
        cmp     byte ptr [rip + vs_live], 0
        je      2f
        lea     rax, [rip + tag_vsock]
        mov     [rip + dev_tag], rax
        push    rbx
        push    r12
        mov     rbx, [rip + vs_base]
        mov     r12d, SLOT_VS_TX
        mov     [rip + vs_txhdr + H_LEN], ecx
        push    rcx
        lea     rax, [rip + vs_txhdr]
        mov     edx, VS_HDR
        xor     r8d, r8d
        test    ecx, ecx
        jz      1f
        mov     r8d, DESC_F_NEXT | (1 << 16)
1:      xor     ecx, ecx
        call    vq_desc
        pop     rdx
        test    edx, edx
        jz      3f
        lea     rax, [rip + vs_txdata]
        xor     r8d, r8d
        mov     ecx, 1
        call    vq_desc
3:      xor     eax, eax
        call    vq_post_head
        call    vq_wait_any
        jc      4f
        call    vq_pop
        pop     r12
        pop     rbx
        clc
        ret
4:      mov     byte ptr [rip + vs_live], 0
        pop     r12
        pop     rbx
2:      stc
        ret

/* dev_wait on the vsock, WAIT_MS at most. Clobbers rax, rcx, rdx. */
vs_wait:
        mov     rax, [rip + vs_base]
        mov     ecx, WAIT_MS
        jmp     dev_wait

/* vsock=connect:<port>: connect to the host's port, send the greeting,
 * shut down, wait for the host's RST. Connection entry 0. */
vs_connect:
        push    r13
        lea     r13, [rip + vs_conns]
        mov     rdi, r13
        mov     ecx, C_SIZE
        xor     eax, eax
        rep stosb
        mov     byte ptr [r13 + C_STATE], C_CONNECTING
        mov     qword ptr [r13 + C_PEER_CID], VS_HOST_CID
        mov     eax, [rip + vs_port]
        mov     [r13 + C_PEER_PORT], eax
        mov     dword ptr [r13 + C_LOCAL_PORT], VS_LOCAL_PORT
        lea     rax, [rip + vs_rings]
        mov     [r13 + C_RING], rax
        mov     byte ptr [rip + vs_got_rst], 0
        mov     eax, VS_OP_REQUEST
        xor     edx, edx
        call    vs_send_op
        jc      .Lcon_done
        call    deadline_start
1:      call    vs_poll_rx
        cmp     byte ptr [rip + vs_live], 0
        je      .Lcon_done
        cmp     byte ptr [r13 + C_STATE], C_CONNECTING
        jne     2f
        call    vs_wait
        call    deadline_passed
        jnc     1b
        lea     rsi, [rip + msg_vs_con_timeout]
        call    say_err
        mov     eax, 1
        call    vs_end
        jmp     .Lcon_done
2:      cmp     byte ptr [r13 + C_STATE], C_FREE
        jne     3f
        lea     rsi, [rip + msg_vs_refused]
        call    say_err
        jmp     .Lcon_done
3:      /* Connected: wait for credit for the greeting. */
        call    deadline_start
4:      mov     eax, [r13 + C_TX]
        sub     eax, [r13 + C_PEER_FWD]
        mov     edx, [r13 + C_PEER_BUF]
        sub     edx, eax
        jb      5f
        cmp     edx, VS_HELLO_LEN
        jae     6f
5:      cmp     byte ptr [r13 + C_CREQ], 0
        jne     7f
        mov     byte ptr [r13 + C_CREQ], 1
        mov     eax, VS_OP_CREDIT_REQUEST
        xor     edx, edx
        call    vs_send_op
        jc      .Lcon_done
7:      call    vs_poll_rx
        cmp     byte ptr [rip + vs_live], 0
        je      .Lcon_done
        cmp     byte ptr [r13 + C_STATE], C_OPEN
        jne     8f                      /* the host closed first */
        call    vs_wait
        call    deadline_passed
        jnc     4b
        lea     rsi, [rip + msg_vs_con_timeout]
        call    say_err
        mov     eax, 1
        call    vs_end
        jmp     .Lcon_done
6:      lea     rsi, [rip + vs_hello]
        lea     rdi, [rip + vs_txdata]
        mov     ecx, VS_HELLO_LEN
        rep movsb
        add     dword ptr [r13 + C_TX], VS_HELLO_LEN
        mov     eax, VS_OP_RW
        xor     edx, edx
        call    vs_hdr
        mov     ecx, VS_HELLO_LEN
        call    vs_tx
        jc      .Lcon_done
8:      cmp     byte ptr [r13 + C_STATE], C_FREE
        je      .Lcon_sent              /* reset already */
        mov     eax, VS_OP_SHUTDOWN
        mov     edx, VS_SHUT_RCV | VS_SHUT_SEND
        call    vs_send_op
        jc      .Lcon_done
        call    deadline_start
9:      call    vs_poll_rx
        cmp     byte ptr [rip + vs_live], 0
        je      .Lcon_done
        cmp     byte ptr [r13 + C_STATE], C_FREE
        je      .Lcon_sent
        cmp     byte ptr [r13 + C_STATE], C_CLOSING
        jne     10f
        mov     eax, 1                  /* the host shut down too: reset */
        call    vs_end
        jmp     .Lcon_sent
10:     call    vs_wait
        call    deadline_passed
        jnc     9b
        lea     rsi, [rip + msg_vs_no_rst]
        call    say_err
        mov     eax, 1
        call    vs_end
.Lcon_sent:
        call    say_tag
        lea     rsi, [rip + msg_vs_sent]
        call    puts
        mov     eax, [r13 + C_TX]
        call    put_u64
        lea     rsi, [rip + msg_bytes]
        call    puts
.Lcon_done:
        pop     r13
        ret

/* ------------------------------------------------------------------------
 * virtio-net (virtio 1.2, 5.1), `net=echo`: VERSION_1 and MAC only, so
 * every buffer starts with the 12-byte virtio_net_hdr_v1. rx buffer i is
 * descriptor i (2 KiB, device-writable, header and frame); tx is
 * descriptor 0, header and frame, one frame at a time.
 */
net_start:
        push    rbx
        push    r12
        push    r13
        call    net_init
        jc      .Lnet_done
        /* The greeting: broadcast, from our MAC, EtherType 0x88b5. */
        lea     rdi, [rip + net_txbuf]
        xor     eax, eax
        mov     ecx, NET_HDR
        rep stosb
        mov     eax, -1
        stosd
        stosw
        mov     eax, [rip + net_mac]
        mov     [rdi], eax
        mov     ax, [rip + net_mac + 4]
        mov     [rdi + 4], ax
        add     rdi, 6
        mov     word ptr [rdi], NET_ETHERTYPE_BE
        add     rdi, 2
        lea     rsi, [rip + net_hello]
        mov     ecx, NET_HELLO_LEN
        rep movsb
        mov     ecx, NET_HDR + 14 + NET_HELLO_LEN
        call    net_tx
        jc      .Lnet_done
        call    say_tag
        lea     rsi, [rip + msg_net_hello]
        call    puts
        xor     r13d, r13d
5:      lea     rax, [rip + net_mac]
        movzx   eax, byte ptr [rax + r13]
        call    put_hex8
        inc     r13d
        cmp     r13d, 6
        jae     6f
        mov     al, ':'
        call    putc
        jmp     5b
6:      mov     al, 10
        call    putc
        mov     byte ptr [rip + serve_echo], 1
.Lnet_done:
        pop     r13
        pop     r12
        pop     rbx
        ret

/* Find and set up the first virtio-net once (`net=echo` and `mmds=` share
 * it), say its line and post the rx buffers: net_base, net_live = 1, CF
 * clear; CF set if it cannot be used (said once). Clobbers rbx, r12, r13. */
net_init:
        cmp     byte ptr [rip + net_tried], 0
        je      1f
        cmp     byte ptr [rip + net_live], 1    /* CF set unless live */
        ret
1:      mov     byte ptr [rip + net_tried], 1
        lea     rax, [rip + tag_net]
        mov     [rip + dev_tag], rax
        mov     edi, VIRTIO_ID_NET
        call    vdev_probe
        jc      9f
        mov     esi, NET_F_MAC
        call    vdev_begin
        jc      9f
        mov     [rip + net_feat], rax
        lea     rdi, [rip + net_mac]
        test    eax, NET_F_MAC
        jz      1f
        xor     ecx, ecx
2:      mov     al, byte ptr [rbx + NET_CFG_MAC + rcx]
        mov     [rdi + rcx], al
        inc     ecx
        cmp     ecx, 6
        jb      2b
1:      mov     r12d, SLOT_NET_RX
        xor     r13d, r13d
        call    vq_setup
        jc      8f
        mov     r12d, SLOT_NET_TX
        mov     r13d, 1
        call    vq_setup
        jc      8f
        call    vdev_ok
        jc      9f
        mov     rax, [rip + net_feat]
        call    vdev_line
        mov     al, 10
        call    putc
        mov     r12d, SLOT_NET_RX
        movzx   eax, word ptr [rip + vq_state + SLOT_NET_RX * 16 + VQS_SIZE]
        mov     ecx, NET_NRX
        cmp     eax, ecx
        cmova   eax, ecx
        mov     [rip + net_nrx], eax
        xor     r13d, r13d
3:      cmp     r13d, [rip + net_nrx]
        jae     4f
        call    net_rx_post
        inc     r13d
        jmp     3b
4:      mov     [rip + net_base], rbx
        mov     byte ptr [rip + net_live], 1
        clc
        ret
8:      call    vdev_fail
9:      stc
        ret


/* Post rx buffer r13d (r12 = SLOT_NET_RX, rbx = the device). */
net_rx_post:
        mov     eax, r13d
        shl     eax, 11
        lea     rdx, [rip + net_rxbuf]
        add     rax, rdx
        mov     edx, NET_BUF
        mov     r8d, DESC_F_WRITE
        mov     ecx, r13d
        call    vq_desc
        mov     eax, r13d
        jmp     vq_post_head

/* Send ecx bytes of net_txbuf (header and frame) and wait until used: CF
 * clear; CF set if the device is gone or times out (then net_live = 0). */
net_tx:
        cmp     byte ptr [rip + net_live], 0
        je      2f
        lea     rax, [rip + tag_net]
        mov     [rip + dev_tag], rax
        push    rbx
        push    r12
        mov     rbx, [rip + net_base]
        mov     r12d, SLOT_NET_TX
        lea     rax, [rip + net_txbuf]
        mov     edx, ecx
        xor     r8d, r8d
        xor     ecx, ecx
        call    vq_desc
        xor     eax, eax
        call    vq_post_head
        call    vq_wait_any
        jc      1f
        call    vq_pop
        pop     r12
        pop     rbx
        clc
        ret
1:      mov     byte ptr [rip + net_live], 0
        pop     r12
        pop     rbx
2:      stc
        ret

/* Echo every frame received, MACs swapped; say how many now and then. */
net_poll:
        cmp     byte ptr [rip + net_live], 0
        je      9f
        lea     rax, [rip + tag_net]
        mov     [rip + dev_tag], rax
        push    rbx
        push    r12
        push    r13
        mov     rbx, [rip + net_base]
1:      cmp     byte ptr [rip + net_live], 0
        je      8f
        mov     r12d, SLOT_NET_RX
        call    vq_pop
        jc      8f
        cmp     eax, [rip + net_nrx]
        jae     1b                      /* not a buffer we posted */
        mov     r13d, eax
        mov     ecx, edx
        cmp     ecx, NET_BUF
        jbe     2f
        mov     ecx, NET_BUF
2:      sub     ecx, NET_HDR + 12       /* at least both MACs */
        jb      3f                      /* a runt: just post it again */
        add     ecx, NET_HDR + 12
        mov     [rip + net_len], ecx
        mov     eax, r13d
        shl     eax, 11
        lea     rsi, [rip + net_rxbuf]
        add     rsi, rax
        lea     rdi, [rip + net_txbuf]
        rep movsb
        lea     rdi, [rip + net_txbuf]
        xor     eax, eax                /* a header of zeros: no offloads */
        mov     [rdi], rax
        mov     [rdi + 8], eax
        mov     eax, [rdi + NET_HDR]    /* swap destination and source */
        mov     cx, [rdi + NET_HDR + 4]
        mov     edx, [rdi + NET_HDR + 6]
        mov     r8w, [rdi + NET_HDR + 10]
        mov     [rdi + NET_HDR], edx
        mov     [rdi + NET_HDR + 4], r8w
        mov     [rdi + NET_HDR + 6], eax
        mov     [rdi + NET_HDR + 10], cx
        mov     r12d, SLOT_NET_RX
        call    net_rx_post
        mov     ecx, [rip + net_len]
        call    net_tx
        jc      8f
        inc     dword ptr [rip + net_frames]
        mov     eax, [rip + net_frames]
        cmp     eax, 16
        jbe     4f
        test    eax, 15
        jnz     1b
4:      call    say_tag
        lea     rsi, [rip + msg_net_echoed]
        call    puts
        mov     eax, [rip + net_frames]
        call    put_u64
        lea     rsi, [rip + msg_frames]
        call    puts
        jmp     1b
3:      mov     r12d, SLOT_NET_RX
        call    net_rx_post
        jmp     1b
8:      pop     r13
        pop     r12
        pop     rbx
9:      ret

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
key_bck_deflate: .asciz "bcheck-deflate"
key_bck_reset:   .asciz "bcheck-reset"
msg_bck_regs:    .asciz "teravm firmware: balloon register reads took "
msg_bck_deflate: .asciz "teravm firmware: balloon deflate took "
msg_bck_reset:   .asciz "teravm firmware: balloon reset took "
msg_bck_noreset: .asciz "teravm firmware: balloon error reset did not complete in 10 s\n"
msg_bck_pat:     .asciz "teravm firmware: balloon "
msg_bck_what_deflate: .asciz "deflate pattern "
msg_bck_what_reset: .asciz "reset pattern "
msg_bck_ok:      .asciz "ok\n"
msg_bck_corrupt: .asciz "corrupt\n"
key_blk:         .asciz "blk"
key_vsock:       .asciz "vsock="
key_net:         .asciz "net="
key_blk_read:    .asciz "blk-read="
val_echo_port:   .asciz "echo:"
val_connect_port: .asciz "connect:"
val_echo:        .asciz "echo"
val_all:         .asciz "all"
val_reset:       .asciz "reset"
val_idle:        .asciz "idle"
val_triple:      .asciz "triple"
val_ports:       .asciz "ports"
val_writing:     .asciz "writing"
hex_digits:      .ascii "0123456789abcdef"
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
msg_fw:          .asciz "teravm firmware: "
tag_balloon:     .asciz "balloon"
tag_blk:         .asciz "blk"
tag_vsock:       .asciz "vsock"
tag_net:         .asciz "net"
msg_e_nodev:     .asciz "error no device\n"
msg_e_noreset:   .asciz "error device reset did not complete\n"
msg_e_nov1:      .asciz "error device does not offer VERSION_1\n"
msg_e_refused:   .asciz "error device refused the features (FEATURES_OK)\n"
msg_e_notok:     .asciz "error device did not take DRIVER_OK (DEVICE_NEEDS_RESET)\n"
msg_e_queue:     .asciz "error queue "
msg_dev_at:      .asciz "device at "
msg_capacity:    .asciz " capacity "
msg_sectors:     .asciz " sectors\n"
msg_cid:         .asciz " cid "
msg_blk_sector0: .asciz "sector0 "
msg_blk_write:   .asciz "write "
msg_blk_readback: .asciz "readback "
msg_blk_match:   .asciz "match\n"
msg_blk_mismatch: .asciz "mismatch\n"
msg_blk_id:      .asciz "id "
msg_blk_getid:   .asciz "get_id "
msg_st_ok:       .asciz "ok"
msg_st_ioerr:    .asciz "ioerr"
msg_st_unsupp:   .asciz "unsupp"
msg_st_other:    .asciz "status "
msg_vs_listen:   .asciz "listening on "
msg_vs_echo:     .asciz "echo "
msg_bytes:       .asciz " bytes\n"
msg_vs_refused:  .asciz "connect refused\n"
msg_vs_sent:     .asciz "connect sent "
msg_vs_con_timeout: .asciz "connect error timed out\n"
msg_vs_no_rst:   .asciz "connect error no RST from the host\n"
msg_net_hello:   .asciz "sent hello from "
msg_net_echoed:  .asciz "echoed "
msg_frames:      .asciz " frames\n"
vs_hello:        .ascii "hello from teravm firmware\n"
net_hello:       .ascii "teravm firmware net"

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
opt_blk_read:   .quad 0                 /* blk-read=: bytes */
t0_ms:          .long 0
opt_reset:      .byte 0
opt_fault:      .byte 0
opt_keep:       .byte 0
opt_balloon:    .byte 0
opt_bcheck:     .byte 0                 /* BCK_DEFLATE or BCK_RESET */
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
opt_blk:        .byte 0
opt_vsock:      .byte 0                 /* VS_ECHO or VS_CONNECT */
opt_net:        .byte 0
serve_echo:     .byte 0                 /* vsock or net echo set up */
vs_live:        .byte 0                 /* vsock driven (not given up) */
net_live:       .byte 0
net_tried:      .byte 0                 /* net_init has run */
vs_got_rst:     .byte 0
        .balign 8
dev_tag:        .quad tag_balloon       /* the device the lines name */
blk_feat:       .quad 0
blk_base:       .quad 0                 /* 0 not tried, 1 failed, else set up */
blk_sectors:    .quad 0                 /* its capacity */
blk_buf:        .quad blk_data          /* blk_request's data buffer */
blk_len:        .long BLK_SECTOR        /* and its length */
        .balign 8
vs_base:        .quad 0
vs_feat:        .quad 0
vs_cid:         .quad 0
net_base:       .quad 0
net_feat:       .quad 0
vs_port:        .long 0
vs_nrx:         .long 0
vs_nev:         .long 0
vs_plen:        .long 0
net_nrx:        .long 0
net_len:        .long 0
net_frames:     .long 0
dl_t0:          .long 0
net_mac:        .byte 2, 0, 0, 0, 0, 1, 0, 0  /* without NET_F_MAC */
        .balign 64
vs_conns:       .skip VS_CONNS * C_SIZE
vs_tmp:         .skip C_SIZE            /* the addresses of an RST answer */
        .balign 16
vq_state:       .skip VQ_SLOTS * 16

/* Not part of the image (firmware.ld): zeroed by the driver before use. */
        .bss
        .balign 4096
ring_area:      .skip VQ_SLOTS * PAGE
pfn_buf:        .skip PFNS_MAX * 4
stats_buf:      .skip 32
        .balign 64
blk_hdr:        .skip 16
blk_status:     .skip 16
blk_id:         .skip 32
blk_data:       .skip BLK_SECTOR
vs_rxhdr:       .skip VS_NRX * 64
vs_txhdr:       .skip 64
vs_evbuf:       .skip VS_NEV * 8
        .balign 4096
vs_rxdata:      .skip VS_NRX * VS_RXDATA
vs_txdata:      .skip VS_TXDATA
vs_rings:       .skip VS_CONNS * VS_BUF
net_rxbuf:      .skip NET_NRX * NET_BUF
net_txbuf:      .skip NET_BUF

        .include "firmware/blk_read.S"
        .include "firmware/mmds.S"
        .include "firmware/mmds_frames.S"
        .include "firmware/mem.S"
