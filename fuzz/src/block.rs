//! What the fuzz target `block_queues` runs (a thin wrapper over
//! [`block_queues`]), over a recording disk.
//!
//! Guest memory is two small regions with a hole between them; the disk is
//! in memory and asserts that every access lies inside the drive's
//! addressable sectors (whole sectors only, never the trailing bytes of a
//! size that is not a sector multiple), sector-aligned, and that a
//! read-only drive is never written. On the guest side the device reaches
//! memory only through vm-memory (which refuses any access outside the
//! regions, and the parser checks every data and status range inside RAM
//! before any host I/O); the harness checks that each pass returns at most
//! a queue's worth of chains, each with a head inside the table.

use std::sync::{Arc, Mutex, PoisonError};

use virtio_queue::{Queue, QueueT};
use vm_memory::{Address, Bytes, GuestAddress, GuestMemoryMmap};

use teravm::devices::virtio::block::{
    Block, BlockMetrics, BlockOptions, BlockWorker, CacheType, Disk, SECTOR_BYTES,
};
use teravm::devices::virtio::ActiveState;
use teravm::devices::virtio::{VirtioDevice, VirtioInterrupt, VirtioInterruptType};

type Mem = Arc<GuestMemoryMmap<()>>;

/// Every access a [`RecordingDisk`] saw, and its bytes.
#[derive(Debug)]
pub struct DiskLog {
    data: Mutex<Vec<u8>>,
    accesses: Mutex<Vec<(bool, u64, u64)>>,
    read_only: bool,
}

impl DiskLog {
    /// (write, offset, length) of each access, in order.
    pub fn accesses(&self) -> Vec<(bool, u64, u64)> {
        self.accesses
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The disk's bytes now.
    pub fn bytes(&self) -> Vec<u8> {
        self.data
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn check(&self, write: bool, offset: u64, len: usize) -> usize {
        let size = self
            .data
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len() as u64;
        let addressable = size / SECTOR_BYTES * SECTOR_BYTES;
        let end = offset.checked_add(len as u64);
        assert!(
            end.is_some_and(|e| e <= addressable),
            "disk access {offset:#x}+{len:#x} outside the drive's {addressable:#x} bytes"
        );
        assert_eq!(offset % SECTOR_BYTES, 0, "unaligned disk access");
        assert!(!(write && self.read_only), "a read-only drive was written");
        let mut a = self.accesses.lock().unwrap_or_else(PoisonError::into_inner);
        if a.len() < 1 << 16 {
            a.push((write, offset, len as u64));
        }
        offset as usize
    }
}

/// An in-memory [`Disk`] that records and checks every access.
#[derive(Debug)]
pub struct RecordingDisk(Arc<DiskLog>);

impl RecordingDisk {
    /// A writable disk holding `bytes`, and its log.
    pub fn new(bytes: Vec<u8>) -> (RecordingDisk, Arc<DiskLog>) {
        Self::with(bytes, false)
    }

    /// A disk holding `bytes` that fails the test if written when
    /// `read_only`.
    pub fn with(bytes: Vec<u8>, read_only: bool) -> (RecordingDisk, Arc<DiskLog>) {
        let log = Arc::new(DiskLog {
            data: Mutex::new(bytes),
            accesses: Mutex::new(Vec::new()),
            read_only,
        });
        (RecordingDisk(log.clone()), log)
    }
}

impl Disk for RecordingDisk {
    fn size_bytes(&self) -> std::io::Result<u64> {
        Ok(self
            .0
            .data
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len() as u64)
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        let o = self.0.check(false, offset, buf.len());
        let d = self.0.data.lock().unwrap_or_else(PoisonError::into_inner);
        buf.copy_from_slice(&d[o..o + buf.len()]);
        Ok(())
    }

    fn write_all_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        let o = self.0.check(true, offset, buf.len());
        let mut d = self.0.data.lock().unwrap_or_else(PoisonError::into_inner);
        d[o..o + buf.len()].copy_from_slice(buf);
        Ok(())
    }

    fn sync_data(&self) -> std::io::Result<()> {
        Ok(())
    }
}

const KIB: u64 = 1 << 10;
/// Low RAM: [0, 256 KiB); the hole: [256 KiB, 512 KiB); high RAM:
/// [512 KiB, 768 KiB).
const LOW_LEN: u64 = 256 * KIB;
const HIGH: u64 = 512 * KIB;
const HIGH_LEN: u64 = 256 * KIB;
/// The queue's rings: descriptors, then avail at +4 KiB, used at +8 KiB.
const RING: u64 = 64 * KIB;
/// Where op 3 writes the driver's bytes.
const DATA_BASE: u64 = 96 * KIB;

struct NoIrq;

impl VirtioInterrupt for NoIrq {
    fn trigger(&self, _: VirtioInterruptType) -> std::io::Result<()> {
        Ok(())
    }
}

fn addr(sel: u8, raw: u32) -> u64 {
    match sel % 4 {
        0 => u64::from(raw) % LOW_LEN,
        1 => HIGH + u64::from(raw) % HIGH_LEN,
        2 => LOW_LEN + u64::from(raw) % (HIGH - LOW_LEN),
        _ => u64::from(raw) << 9,
    }
}

fn fresh_queue(mem: &Mem, size: u16) -> Queue {
    let _ = mem.write_slice(&[0u8; 4], GuestAddress(RING + 0x1000));
    let _ = mem.write_slice(&[0u8; 4], GuestAddress(RING + 0x2000));
    let mut q = Queue::new(256).expect("256 is a valid queue size");
    let _ = q.try_set_size(size);
    let _ = q.try_set_desc_table_address(GuestAddress(RING));
    let _ = q.try_set_avail_ring_address(GuestAddress(RING + 0x1000));
    let _ = q.try_set_used_ring_address(GuestAddress(RING + 0x2000));
    q.set_ready(true);
    q
}

/// `block_queues`: a running block device whose descriptor table,
/// available ring, headers and buffers come from the input. Header: flags
/// (bit 0 read-only, bit 1 Writeback, bit 2 a 100-byte tail past the last
/// sector), disk sectors (`b % 64`), queue size (`1 << (b % 9)`). Then ops,
/// by `byte % 8`: 0 descriptor `[index, sel, addr u32, len u32, flags,
/// next]`; 1 available entry `[head]`; 2 notify; 3 data `[off u16, 8
/// bytes]`; 4 header `[sel, addr u16, type, sector u16]`; 5 reset and start
/// again; 6 swap the file `[sectors]`; 7 available index `[u16]`. Returns
/// the device's counters.
pub fn block_queues(data: &[u8]) -> BlockMetrics {
    if data.len() < 3 {
        return BlockMetrics::default();
    }
    let (flags, sectors, size) = (data[0], u64::from(data[1] % 64), 1u16 << (data[2] % 9));
    let read_only = flags & 1 != 0;
    let disk_bytes = |sectors: u64| {
        let tail = if flags & 4 != 0 { 100 } else { 0 };
        vec![0x5au8; (sectors * SECTOR_BYTES + tail) as usize]
    };
    let mut rest = &data[3..];
    let mem: Mem = Arc::new(
        GuestMemoryMmap::from_ranges(&[
            (GuestAddress(0), LOW_LEN as usize),
            (GuestAddress(HIGH), HIGH_LEN as usize),
        ])
        .expect("fuzz guest memory"),
    );
    let (disk, log) = RecordingDisk::with(disk_bytes(sectors), read_only);
    let before = log.bytes();
    let opts = BlockOptions {
        drive_id: "fuzz".into(),
        read_only,
        cache_type: if flags & 2 != 0 {
            CacheType::Writeback
        } else {
            CacheType::Unsafe
        },
        ..BlockOptions::default()
    };
    let block = Arc::new(Mutex::new(
        Block::with_disk(opts, Box::new(disk)).expect("in-memory disk"),
    ));
    let mut worker = BlockWorker::new(&block).expect("worker");
    let lock = || block.lock().unwrap_or_else(PoisonError::into_inner);
    let start = || {
        let acked = lock().avail_features();
        let _ = lock().activate(ActiveState::new(
            mem.clone(),
            acked,
            vec![fresh_queue(&mem, size)],
            Arc::new(NoIrq),
        ));
    };
    start();
    let mut logs = vec![log];
    let take = |n: usize, rest: &mut &[u8]| -> Option<Vec<u8>> {
        (rest.len() >= n).then(|| {
            let (h, t) = rest.split_at(n);
            *rest = t;
            h.to_vec()
        })
    };
    while let Some(op) = take(1, &mut rest) {
        match op[0] % 8 {
            0 => {
                let Some(d) = take(12, &mut rest) else { break };
                let a = addr(d[1], u32::from_le_bytes([d[2], d[3], d[4], d[5]]));
                let mut raw = [0u8; 16];
                raw[0..8].copy_from_slice(&a.to_le_bytes());
                raw[8..12].copy_from_slice(&d[6..10]);
                raw[12..14].copy_from_slice(&u16::from(d[10] & 7).to_le_bytes());
                raw[14..16].copy_from_slice(&u16::from(d[11]).to_le_bytes());
                let at = RING + u64::from(u16::from(d[0]) % size) * 16;
                let _ = mem.write_slice(&raw, GuestAddress(at));
            }
            1 => {
                let Some(d) = take(1, &mut rest) else { break };
                let avail = GuestAddress(RING + 0x1000);
                let idx: u16 = mem.read_obj(avail.unchecked_add(2)).unwrap_or(0);
                let slot = avail.unchecked_add(4 + u64::from(idx % size) * 2);
                let _ = mem.write_obj(u16::from(d[0]), slot);
                let _ = mem.write_obj(idx.wrapping_add(1), avail.unchecked_add(2));
            }
            2 => {
                let used_before: u16 = mem.read_obj(GuestAddress(RING + 0x2002)).unwrap_or(0);
                worker.process_queue(true);
                let used_after: u16 = mem.read_obj(GuestAddress(RING + 0x2002)).unwrap_or(0);
                let n = used_after.wrapping_sub(used_before);
                assert!(
                    n <= size.max(64),
                    "{n} chains returned from a queue of {size}"
                );
                for i in 0..n {
                    let slot = u64::from(used_before.wrapping_add(i) % size) * 8;
                    let id: u32 = mem
                        .read_obj(GuestAddress(RING + 0x2004 + slot))
                        .unwrap_or(0);
                    assert!(id < u32::from(size), "used head {id} outside the table");
                }
            }
            3 => {
                let Some(d) = take(10, &mut rest) else { break };
                let off = u64::from(u16::from_le_bytes([d[0], d[1]])) * 8;
                let _ = mem.write_slice(&d[2..10], GuestAddress(DATA_BASE + off));
            }
            4 => {
                let Some(d) = take(6, &mut rest) else { break };
                let a = addr(d[0], u32::from(u16::from_le_bytes([d[1], d[2]])) << 4);
                let kind = [0u32, 1, 4, 8, 11][usize::from(d[3]) % 5];
                let sector = u64::from(u16::from_le_bytes([d[4], d[5]])) % 80;
                let mut h = [0u8; 16];
                h[0..4].copy_from_slice(&kind.to_le_bytes());
                h[8..16].copy_from_slice(&sector.to_le_bytes());
                let _ = mem.write_slice(&h, GuestAddress(a));
            }
            5 => {
                lock().reset();
                start();
            }
            6 => {
                let Some(d) = take(1, &mut rest) else { break };
                let (disk, l) = RecordingDisk::with(disk_bytes(u64::from(d[0] % 64)), read_only);
                let _ = lock().update_disk(Box::new(disk));
                logs.push(l);
                worker.process_queue(false);
            }
            _ => {
                let Some(d) = take(2, &mut rest) else { break };
                let idx = u16::from_le_bytes([d[0], d[1]]);
                let _ = mem.write_obj(idx, GuestAddress(RING + 0x1002));
            }
        }
    }
    if read_only {
        assert_eq!(logs[0].bytes(), before, "a read-only drive changed");
    }
    lock().reset();
    let snapshot = lock().metrics().snapshot();
    snapshot
}
