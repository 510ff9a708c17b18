//! Hostile guests (bad status descriptors, loops, addresses outside RAM,
//! overlong chains), a reset while the file stalls, the backing-file swap,
//! and the worker on its own thread.

use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use virtio_bindings::virtio_blk as b;
use virtio_bindings::virtio_ring::VRING_DESC_F_INDIRECT;
use vm_memory::{Bytes, GuestAddress};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::test_disk::{DiskLog, RecordingDisk};
use super::tests::*;
use super::*;
use crate::devices::virtio::ActiveState;
use crate::devices::virtio::Worker;
use crate::devices::virtio::{VirtioDevice, VirtioInterruptType};

fn recording(sectors: u64) -> (Rig, Arc<DiskLog>) {
    let (disk, log) = RecordingDisk::new(pattern(sectors));
    (
        Rig::new(opts(false, CacheType::Writeback), Box::new(disk)),
        log,
    )
}

#[test]
fn a_bad_status_descriptor_drops_the_chain_and_writes_nothing() {
    let (mut r, log) = recording(8);
    let m = r.mem.clone();
    let q = r.start(&m, 64);
    let bad_status = [
        desc(STATUS, 1, R, 0),   // not writable
        desc(STATUS, 0, W, 0),   // empty
        desc(HOLE, 1, W, 0),     // outside RAM
        desc(8 * MIB, 16, W, 0), // just past low RAM
    ];
    for (i, st) in bad_status.iter().enumerate() {
        let at = 3 * i as u16;
        header(&m, HDR, b::VIRTIO_BLK_T_IN, 0);
        m.write_slice(&[0x11; 512], GuestAddress(DATA)).unwrap();
        m.write_obj(0xffu8, GuestAddress(STATUS)).unwrap();
        q.add_desc_chains(
            &[
                desc(HDR, 16, R | N, at + 1),
                desc(DATA, 512, W | N, at + 2),
                *st,
            ],
            at,
        )
        .unwrap();
        r.worker.process_queue(true);
        assert_eq!(used(&q, i as u16), (u32::from(at), 0), "case {i}");
        let mut d = [0u8; 512];
        m.read_slice(&mut d, GuestAddress(DATA)).unwrap();
        assert_eq!(d, [0x11; 512], "case {i}: data written");
        assert_eq!(status_byte(&m), 0xff, "case {i}: status written");
    }
    assert!(log.accesses().is_empty(), "host I/O for a dropped chain");
    assert_eq!(
        r.metrics().dropped_reqs_count.get(),
        bad_status.len() as u64
    );
}

#[test]
fn descriptor_loops_and_overlong_chains_are_dropped() {
    let (mut r, log) = recording(8);
    let m = r.mem.clone();
    let q = r.start(&m, 16);
    header(&m, HDR, b::VIRTIO_BLK_T_IN, 0);
    // 0 -> 1 -> 0 -> ...
    q.add_desc_chains(&[desc(HDR, 16, R | N, 1), desc(DATA, 512, W | N, 0)], 0)
        .unwrap();
    // An indirect table of 300 data descriptors, then a status.
    let table = 6 * MIB;
    for i in 0..301u64 {
        let last = i == 300;
        let d = if last {
            desc(STATUS, 1, W, 0)
        } else {
            desc(DATA, 512, W | N, (i + 1) as u16)
        };
        let raw: [u8; 16] = raw_bytes(d);
        m.write_slice(&raw, GuestAddress(table + i * 16)).unwrap();
    }
    q.add_desc_chains(&[desc(table, 301 * 16, VRING_DESC_F_INDIRECT, 0)], 2)
        .unwrap();
    // A well-formed read after them is served.
    request(&m, &q, 3, b::VIRTIO_BLK_T_IN, 1, 512, W);
    r.worker.process_queue(true);
    assert_eq!(used_idx(&q), 3);
    assert_eq!(used(&q, 0), (0, 0));
    assert_eq!(used(&q, 1), (2, 0));
    assert_eq!(used(&q, 2), (3, 513));
    assert_eq!(log.accesses(), vec![(false, 512, 512)]);
    // The loop is dropped by the parser (counted invalid and dropped); the
    // indirect table is refused before it (INDIRECT_DESC is never offered),
    // answered with nothing and counted invalid only.
    assert_eq!(r.metrics().dropped_reqs_count.get(), 1);
    assert_eq!(r.metrics().invalid_reqs_count.get(), 2);
}

/// The 16 bytes of a descriptor as it lies in guest memory.
fn raw_bytes(d: virtio_queue::desc::RawDescriptor) -> [u8; 16] {
    let d = virtio_queue::desc::split::Descriptor::from(d);
    let mut raw = [0u8; 16];
    raw[0..8].copy_from_slice(&d.addr().0.to_le_bytes());
    raw[8..12].copy_from_slice(&d.len().to_le_bytes());
    raw[12..14].copy_from_slice(&d.flags().to_le_bytes());
    raw[14..16].copy_from_slice(&d.next().to_le_bytes());
    raw
}

#[test]
fn addresses_outside_ram_get_ioerr_and_no_host_io() {
    let (mut r, log) = recording(8);
    let m = r.mem.clone();
    let q = r.start(&m, 64);
    let cases: [(u32, u64, u64, u32); 5] = [
        (b::VIRTIO_BLK_T_IN, HDR, HOLE, W),            // data in the hole
        (b::VIRTIO_BLK_T_OUT, HDR, HOLE, R),           // data from the hole
        (b::VIRTIO_BLK_T_IN, HDR, 8 * MIB - 256, W),   // data across RAM's end
        (b::VIRTIO_BLK_T_IN, HOLE, DATA, W),           // header in the hole
        (b::VIRTIO_BLK_T_IN, HIGH + MIB - 8, DATA, W), // header across RAM's end
    ];
    for (i, &(kind, hdr, data, fl)) in cases.iter().enumerate() {
        let at = 3 * i as u16;
        if hdr == HDR {
            header(&m, HDR, kind, 0);
        }
        m.write_obj(0xffu8, GuestAddress(STATUS)).unwrap();
        q.add_desc_chains(
            &[
                desc(hdr, 16, R | N, at + 1),
                desc(data, 512, fl | N, at + 2),
                desc(STATUS, 1, W, 0),
            ],
            at,
        )
        .unwrap();
        r.worker.process_queue(true);
        assert_eq!(status_byte(&m), status::IOERR, "case {i}");
        assert_eq!(used(&q, i as u16), (u32::from(at), 1), "case {i}");
    }
    assert!(log.accesses().is_empty());
    // Rings whose avail index runs ahead are refused by virtio-queue: the
    // device takes nothing (and does not spin).
    q.avail().idx().store(used_idx(&q).wrapping_add(1000));
    r.worker.process_queue(true);
    assert_eq!(used_idx(&q), cases.len() as u16);
}

/// A disk whose reads wait for a release, saying when they started.
struct GateDisk {
    data: Vec<u8>,
    started: Sender<()>,
    release: Mutex<Receiver<()>>,
}

impl Disk for GateDisk {
    fn size_bytes(&self) -> std::io::Result<u64> {
        Ok(self.data.len() as u64)
    }
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        let _ = self.started.send(());
        let _ = self.release.lock().unwrap().recv();
        let o = offset as usize;
        buf.copy_from_slice(&self.data[o..o + buf.len()]);
        Ok(())
    }
    fn write_all_at(&self, _: &[u8], _: u64) -> std::io::Result<()> {
        Err(std::io::Error::other("read-only gate"))
    }
    fn sync_data(&self) -> std::io::Result<()> {
        Ok(())
    }
}

fn gated(sectors: u64) -> (Rig, Receiver<()>, Sender<()>) {
    let (started, started_rx) = channel();
    let (release_tx, release) = channel();
    let disk = GateDisk {
        data: pattern(sectors),
        started,
        release: Mutex::new(release),
    };
    (
        Rig::new(opts(false, CacheType::Unsafe), Box::new(disk)),
        started_rx,
        release_tx,
    )
}

/// Takes the rig apart: its worker processes the queue on a thread of its
/// own; returns once the gated disk (see [`gated`]) holds the request, with
/// the device and the worker's thread (it ends after `release`).
fn stall(r: Rig, started: &Receiver<()>) -> (Arc<Mutex<Block<Mem>>>, JoinHandle<BlockWorker<Mem>>) {
    let Rig {
        block, mut worker, ..
    } = r;
    let h = std::thread::spawn(move || {
        worker.process_queue(true);
        worker
    });
    started.recv_timeout(Duration::from_secs(10)).unwrap();
    (block, h)
}

#[test]
fn a_reset_during_a_stalled_read_returns_at_once_and_nothing_lands() {
    let (mut r, started, release) = gated(8);
    let m = r.mem.clone();
    let q = r.start(&m, 16);
    m.write_slice(&[0x11; 512], GuestAddress(DATA)).unwrap();
    request(&m, &q, 0, b::VIRTIO_BLK_T_IN, 1, 512, W);
    let (block, h) = stall(r, &started);
    // The file stalls: a vCPU's config read and reset still return at once.
    let t0 = Instant::now();
    let mut c = [0u8; 8];
    block.lock().unwrap().read_config(0, &mut c);
    assert_eq!(u64::from_le_bytes(c), 8);
    block.lock().unwrap().reset();
    assert!(!block.lock().unwrap().is_active());
    assert!(t0.elapsed() < Duration::from_secs(2));
    release.send(()).unwrap();
    let _worker = h.join().unwrap();
    let mut d = [0u8; 512];
    m.read_slice(&mut d, GuestAddress(DATA)).unwrap();
    assert_eq!(d, [0x11; 512], "a stale read landed in guest memory");
    assert_eq!(status_byte(&m), 0xff);
    assert_eq!(used_idx(&q), 0);
    let s = block.lock().unwrap().metrics().snapshot();
    assert_eq!((s.abandoned_reqs_count.get(), s.read_count.get()), (1, 0));
}

#[test]
fn update_file_swaps_between_requests_and_tells_the_guest() {
    let f = TempFile::new("update-old", &pattern(8));
    let g = TempFile::new("update-new", &[0x77; 16 * 512]);
    let mut r = Rig::file(opts(false, CacheType::Unsafe), &f);
    let m = r.mem.clone();
    let q = r.start(&m, 16);
    request(&m, &q, 0, b::VIRTIO_BLK_T_IN, 12, 512, W);
    r.worker.process_queue(true);
    assert_eq!(status_byte(&m), status::IOERR); // beyond the old end
    r.block.lock().unwrap().update_file(g.open(false)).unwrap();
    // Nothing changes until the device thread swaps.
    assert_eq!(r.capacity(), 8);
    let _ = r.block.lock().unwrap().wake_evt().read();
    r.worker.process_queue(false);
    assert_eq!(r.capacity(), 16);
    assert_eq!(r.worker.capacity_sectors(), 16);
    assert_eq!(r.block.lock().unwrap().config_generation(), 1);
    assert!(r
        .irq
        .0
        .lock()
        .unwrap()
        .contains(&VirtioInterruptType::Config));
    request(&m, &q, 3, b::VIRTIO_BLK_T_IN, 12, 512, W);
    r.worker.process_queue(true);
    assert_eq!(status_byte(&m), status::OK);
    let mut d = [0u8; 512];
    m.read_slice(&mut d, GuestAddress(DATA)).unwrap();
    assert_eq!(d, [0x77; 512]);
    assert_eq!(f.bytes(), pattern(8));
    assert_eq!(r.metrics().update_count.get(), 1);
}

#[test]
fn update_file_during_a_stalled_request_waits_for_its_end() {
    let (mut r, started, release) = gated(8);
    let g = TempFile::new("update-mid", &[0x77; 4 * 512]);
    let m = r.mem.clone();
    let q = r.start(&m, 16);
    request(&m, &q, 0, b::VIRTIO_BLK_T_IN, 6, 512, W);
    let (block, h) = stall(r, &started);
    let t0 = Instant::now();
    block.lock().unwrap().update_file(g.open(false)).unwrap();
    assert!(t0.elapsed() < Duration::from_secs(2));
    release.send(()).unwrap();
    let worker = h.join().unwrap();
    // The request in flight finished on the old file (sector 6 of 8)...
    assert_eq!(status_byte(&m), status::OK);
    let mut d = [0u8; 512];
    m.read_slice(&mut d, GuestAddress(DATA)).unwrap();
    assert_eq!(d, [7u8; 512]);
    // ...and the new one (4 sectors) was swapped in after it.
    assert_eq!(worker.capacity_sectors(), 4);
    assert_eq!(block.lock().unwrap().capacity_sectors(), 4);
}

#[test]
fn the_worker_thread_serves_notifications_and_stops_on_exit() {
    let f = TempFile::new("thread", &pattern(8));
    let mem = mem();
    let block = Arc::new(Mutex::new(
        Block::<Mem>::new(opts(false, CacheType::Writeback), f.open(false)).unwrap(),
    ));
    let qevt = EventFd::new(EFD_NONBLOCK).unwrap();
    let exit = EventFd::new(EFD_NONBLOCK).unwrap();
    let worker = Worker::start(
        BlockWorker::new(&block).unwrap(),
        vec![qevt.try_clone().unwrap()],
        exit.try_clone().unwrap(),
    )
    .unwrap();
    assert!(matches!(
        BlockWorker::new(&block),
        Err(BlockError::WorkerExists)
    ));
    let h = std::thread::Builder::new()
        .name("blk-test".into())
        .spawn(move || worker.run())
        .unwrap();
    let q = virtio_queue::mock::MockSplitQueue::create(&*mem, GuestAddress(MIB), 16);
    let irq = Arc::new(Irq::default());
    block
        .lock()
        .unwrap()
        .activate(ActiveState::new(
            mem.clone(),
            0,
            vec![q.create_queue().unwrap()],
            irq,
        ))
        .unwrap();
    request(&mem, &q, 0, b::VIRTIO_BLK_T_IN, 0, 512, W);
    qevt.write(1).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while used_idx(&q) == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(used(&q, 0), (0, 513));
    exit.write(1).unwrap();
    h.join().unwrap().unwrap();
    let s = block.lock().unwrap().metrics().snapshot();
    assert_eq!((s.read_count.get(), s.queue_event_count.get()), (1, 1));
    // Dropping the device lets go of the guest memory.
    drop(block);
    assert_eq!(Arc::strong_count(&mem), 1);
}
