//! The block device's flows over plain guest memory, with virtio-queue's
//! `MockSplitQueue` as the driver and a temporary file (or an in-memory
//! disk) behind it. No KVM. Hostile guests and concurrency are in
//! `tests_hostile`.

use std::fs::File;
use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use virtio_bindings::virtio_blk as b;
use virtio_bindings::virtio_ring::{VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
use virtio_queue::desc::{split::Descriptor, RawDescriptor};
use virtio_queue::mock::MockSplitQueue;
use virtio_queue::Queue;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::*;
use crate::devices::virtio::test_utils::guest_memory;
use crate::devices::virtio::ActiveState;
use crate::devices::virtio::{
    VirtioDevice, VirtioInterrupt, VirtioInterruptType, VIRTIO_F_VERSION_1,
};

pub(super) use crate::devices::virtio::test_utils::Mem;
pub(super) const MIB: u64 = 1 << 20;
/// RAM: [0, 8 MiB) and [HIGH, HIGH + 1 MiB); the hole between is not RAM.
pub(super) const HIGH: u64 = 64 * MIB;
/// Where requests' headers, data and statuses go.
pub(super) const HDR: u64 = 2 * MIB;
pub(super) const DATA: u64 = 3 * MIB;
pub(super) const STATUS: u64 = 4 * MIB;
pub(super) const HOLE: u64 = 32 * MIB;
pub(super) const R: u32 = 0;
pub(super) const W: u32 = VRING_DESC_F_WRITE;
pub(super) const N: u32 = VRING_DESC_F_NEXT;

thread_local! {
    /// The engine [`Rig::file`] gives its drive ([`both_engines!`] sets it).
    pub(super) static ENGINE: std::cell::Cell<IoEngine> = const { std::cell::Cell::new(IoEngine::Sync) };
}

/// Runs `body` with [`Rig::file`]'s drives on `engine`.
pub(super) fn with_engine(engine: IoEngine, body: fn()) {
    ENGINE.with(|e| e.set(engine));
    body();
    ENGINE.with(|e| e.set(IoEngine::Sync));
}

/// Each test twice, in a module of its name: `sync` (the Sync engine) and
/// `uring` (`io_engine: "Async"`), over the same body.
macro_rules! both_engines {
    ($(fn $name:ident() $body:block)*) => {$(
        mod $name {
            #[allow(unused_imports)]
            use super::*;
            fn body() $body
            #[test]
            fn sync() {
                with_engine(IoEngine::Sync, body)
            }
            #[test]
            fn uring() {
                with_engine(IoEngine::Async, body)
            }
        }
    )*};
}

pub(super) fn mem() -> Mem {
    guest_memory(&[(0, 8 * MIB), (HIGH, MIB)])
}

/// A file in the temporary directory with `bytes` (removed when dropped).
pub(super) struct TempFile(pub PathBuf);

impl TempFile {
    pub fn new(name: &str, bytes: &[u8]) -> TempFile {
        // The engine in the name: `both_engines!`'s two runs of a test run
        // at once.
        let engine = ENGINE.with(|e| e.get());
        let p = std::env::temp_dir().join(format!(
            "teravm-blk-{}-{name}-{engine:?}",
            std::process::id()
        ));
        File::create(&p).unwrap().write_all(bytes).unwrap();
        TempFile(p)
    }
    pub fn open(&self, read_only: bool) -> File {
        std::fs::OpenOptions::new()
            .read(true)
            .write(!read_only)
            .open(&self.0)
            .unwrap()
    }
    pub fn bytes(&self) -> Vec<u8> {
        std::fs::read(&self.0).unwrap()
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// `sectors` sectors, sector `s` filled with byte `s + 1`.
pub(super) fn pattern(sectors: u64) -> Vec<u8> {
    (0..sectors)
        .flat_map(|s| [(s + 1) as u8; SECTOR_BYTES as usize])
        .collect()
}

pub(super) use crate::devices::virtio::test_utils::Irq;

pub(super) type Mock<'a> = MockSplitQueue<'a, GuestMemoryMmap<()>>;

pub(super) struct Rig {
    pub mem: Mem,
    pub block: Arc<Mutex<Block<Mem>>>,
    pub worker: BlockWorker<Mem>,
    pub irq: Arc<Irq>,
}

impl Rig {
    pub fn new(opts: BlockOptions, disk: Box<dyn Disk>) -> Rig {
        let block = Arc::new(Mutex::new(Block::with_disk(opts, disk).unwrap()));
        let worker = BlockWorker::new(&block).unwrap();
        Rig {
            mem: mem(),
            block,
            worker,
            irq: Arc::new(Irq::default()),
        }
    }

    /// A rig over the file `f`; Async when the test runs under
    /// [`both_engines!`]'s `uring` (else as `opts` says).
    pub fn file(mut opts: BlockOptions, f: &TempFile) -> Rig {
        let ro = opts.read_only;
        if ENGINE.with(|e| e.get()) == IoEngine::Async {
            opts.io_engine = IoEngine::Async;
        }
        Self::new(opts, Box::new(f.open(ro)))
    }

    /// One pass of the queue, then waits for the requests it put in flight
    /// (Async) and answers them.
    pub fn run(&mut self) {
        self.worker.process_queue(true);
        assert!(
            self.worker.settle(std::time::Duration::from_secs(10)),
            "io_uring requests still in flight after 10 s"
        );
    }

    /// Activates with a queue of `size` at 1 MiB; returns the driver's side.
    pub fn start<'a>(&mut self, mem: &'a GuestMemoryMmap<()>, size: u16) -> Mock<'a> {
        let q = MockSplitQueue::create(mem, GuestAddress(MIB), size);
        let queue: Queue = q.create_queue().unwrap();
        let irq: Arc<dyn VirtioInterrupt> = self.irq.clone();
        let acked = self.block.lock().unwrap().avail_features();
        self.block
            .lock()
            .unwrap()
            .activate(ActiveState::new(self.mem.clone(), acked, vec![queue], irq))
            .unwrap();
        let _ = self.block.lock().unwrap().wake_evt().read();
        q
    }

    pub fn metrics(&self) -> BlockMetrics {
        self.block.lock().unwrap().metrics().snapshot()
    }

    pub fn capacity(&self) -> u64 {
        let mut c = [0u8; 8];
        self.block.lock().unwrap().read_config(0, &mut c);
        u64::from_le_bytes(c)
    }
}

pub(super) fn desc(addr: u64, len: u32, flags: u32, next: u16) -> RawDescriptor {
    RawDescriptor::from(Descriptor::new(addr, len, flags as u16, next))
}

pub(super) fn header(mem: &GuestMemoryMmap<()>, at: u64, kind: u32, sector: u64) {
    let mut h = [0u8; 16];
    h[0..4].copy_from_slice(&kind.to_le_bytes());
    h[8..16].copy_from_slice(&sector.to_le_bytes());
    mem.write_slice(&h, GuestAddress(at)).unwrap();
}

/// Adds header + one data descriptor of `len` at DATA (`dflags`) + status,
/// at table index `at`; the status byte is preset to 0xff.
pub(super) fn request(
    mem: &GuestMemoryMmap<()>,
    q: &Mock<'_>,
    at: u16,
    kind: u32,
    sector: u64,
    len: u32,
    dflags: u32,
) {
    header(mem, HDR, kind, sector);
    mem.write_obj(0xffu8, GuestAddress(STATUS)).unwrap();
    q.add_desc_chains(
        &[
            desc(HDR, 16, R | N, at + 1),
            desc(DATA, len, dflags | N, at + 2),
            desc(STATUS, 1, W, 0),
        ],
        at,
    )
    .unwrap();
}

pub(super) fn status_byte(mem: &GuestMemoryMmap<()>) -> u8 {
    mem.read_obj(GuestAddress(STATUS)).unwrap()
}

/// The used ring's entry `i`: (head, len).
pub(super) fn used(q: &Mock<'_>, i: u16) -> (u32, u32) {
    let e = q.used().ring().ref_at(i as usize).unwrap().load();
    (e.id(), e.len())
}

pub(super) fn used_idx(q: &Mock<'_>) -> u16 {
    q.used().idx().load()
}

pub(super) fn opts(read_only: bool, cache_type: CacheType) -> BlockOptions {
    BlockOptions {
        drive_id: "rootfs".into(),
        read_only,
        cache_type,
        ..BlockOptions::default()
    }
}

both_engines! {
fn features_and_config_follow_options() {
    let f = TempFile::new("features", &pattern(8));
    let r = Rig::file(opts(false, CacheType::Unsafe), &f);
    assert_eq!(r.block.lock().unwrap().avail_features(), VIRTIO_F_VERSION_1);
    assert_eq!(r.block.lock().unwrap().device_type(), 2);
    assert_eq!(r.block.lock().unwrap().queue_max_sizes(), &[256]);
    assert_eq!(r.capacity(), 8);
    let r = Rig::file(opts(false, CacheType::Writeback), &f);
    assert_eq!(
        r.block.lock().unwrap().avail_features(),
        VIRTIO_F_VERSION_1 | features::FLUSH
    );
    let r = Rig::file(opts(true, CacheType::Unsafe), &f);
    assert_eq!(
        r.block.lock().unwrap().avail_features(),
        VIRTIO_F_VERSION_1 | features::RO
    );
    // Bytes past `capacity` read 0 and are counted; writes change nothing.
    let mut c = [0xffu8; 4];
    r.block.lock().unwrap().read_config(6, &mut c);
    assert_eq!(c, [0, 0, 0, 0]);
    r.block.lock().unwrap().write_config(0, &[1, 2, 3, 4]);
    assert_eq!(r.capacity(), 8);
    assert_eq!(r.metrics().cfg_fails.get(), 2);
}
}

both_engines! {
fn trailing_bytes_are_not_addressable() {
    let mut bytes = pattern(8);
    bytes.extend_from_slice(&[0xee; 100]);
    let f = TempFile::new("trailing", &bytes);
    let mut r = Rig::file(opts(false, CacheType::Unsafe), &f);
    assert_eq!(r.capacity(), 8);
    let m = r.mem.clone();
    let q = r.start(&m, 16);
    request(&m, &q, 0, b::VIRTIO_BLK_T_IN, 7, 1024, W); // sector 7 + the tail
    r.run();
    assert_eq!(status_byte(&m), status::IOERR);
    request(&m, &q, 3, b::VIRTIO_BLK_T_IN, 7, 512, W);
    r.run();
    assert_eq!(status_byte(&m), status::OK);
}
}

both_engines! {
fn read_returns_the_sectors() {
    let f = TempFile::new("read", &pattern(8));
    let mut r = Rig::file(opts(false, CacheType::Unsafe), &f);
    let m = r.mem.clone();
    let q = r.start(&m, 16);
    request(&m, &q, 0, b::VIRTIO_BLK_T_IN, 2, 1024, W);
    r.run();
    let mut got = vec![0u8; 1024];
    m.read_slice(&mut got, GuestAddress(DATA)).unwrap();
    assert_eq!(got, pattern(8)[1024..2048]);
    assert_eq!(status_byte(&m), status::OK);
    assert_eq!(used_idx(&q), 1);
    assert_eq!(used(&q, 0), (0, 1025));
    assert_eq!(
        *r.irq.0.lock().unwrap(),
        vec![VirtioInterruptType::Queue(0)]
    );
    let s = r.metrics();
    assert_eq!(
        (
            s.read_count.get(),
            s.read_bytes.get(),
            s.invalid_reqs_count.get()
        ),
        (1, 1024, 0)
    );
}
}

both_engines! {
fn read_over_many_segments_and_chunks() {
    // 3 MiB over four descriptors (one in high RAM, one empty): more than
    // one bounce buffer's worth, segments of unequal length.
    let sectors = 8 * 1024;
    let f = TempFile::new("chunks", &pattern(sectors));
    let mut r = Rig::file(opts(false, CacheType::Unsafe), &f);
    let m = r.mem.clone();
    let q = r.start(&m, 16);
    header(&m, HDR, b::VIRTIO_BLK_T_IN, 10);
    let (a, b_, c) = (1536 * 1024u32, 512 * 1024u32, 1024 * 1024u32);
    q.add_desc_chains(
        &[
            desc(HDR, 16, R | N, 1),
            desc(5 * MIB, a, W | N, 2),
            desc(HIGH, b_, W | N, 3),
            desc(HIGH, 0, W | N, 4),
            desc(DATA - MIB, c, W | N, 5),
            desc(STATUS, 1, W, 0),
        ],
        0,
    )
    .unwrap();
    r.run();
    assert_eq!(status_byte(&m), status::OK);
    let want = &pattern(sectors)[10 * 512..10 * 512 + (a + b_ + c) as usize];
    let mut got = vec![0u8; (a + b_ + c) as usize];
    m.read_slice(&mut got[..a as usize], GuestAddress(5 * MIB))
        .unwrap();
    m.read_slice(&mut got[a as usize..(a + b_) as usize], GuestAddress(HIGH))
        .unwrap();
    m.read_slice(&mut got[(a + b_) as usize..], GuestAddress(DATA - MIB))
        .unwrap();
    assert!(got == want, "scattered data differs");
    assert_eq!(used(&q, 0).1, a + b_ + c + 1);
}
}

both_engines! {
fn write_changes_exactly_its_sectors() {
    let f = TempFile::new("write", &pattern(8));
    let mut r = Rig::file(opts(false, CacheType::Unsafe), &f);
    let m = r.mem.clone();
    let q = r.start(&m, 16);
    m.write_slice(&[0xa5; 1024], GuestAddress(DATA)).unwrap();
    request(&m, &q, 0, b::VIRTIO_BLK_T_OUT, 3, 1024, R);
    r.run();
    assert_eq!(status_byte(&m), status::OK);
    assert_eq!(used(&q, 0), (0, 1));
    let mut want = pattern(8);
    want[1536..2560].fill(0xa5);
    assert_eq!(f.bytes(), want);
    let s = r.metrics();
    assert_eq!((s.write_count.get(), s.write_bytes.get()), (1, 1024));
}
}

#[test]
fn flush_syncs_with_writeback_and_answers_ok_without() {
    for (cache, syncs) in [(CacheType::Writeback, 1), (CacheType::Unsafe, 0)] {
        let (disk, log) = test_disk::RecordingDisk::new(pattern(8));
        let mut r = Rig::new(opts(false, cache), Box::new(disk));
        let m = r.mem.clone();
        let q = r.start(&m, 16);
        // Without a data descriptor, as Linux sends it.
        header(&m, HDR, b::VIRTIO_BLK_T_FLUSH, 0);
        q.add_desc_chains(&[desc(HDR, 16, R | N, 1), desc(STATUS, 1, W, 0)], 0)
            .unwrap();
        r.run();
        assert_eq!(status_byte(&m), status::OK, "{cache:?}");
        assert_eq!(used(&q, 0), (0, 1));
        assert_eq!(r.metrics().flush_count.get(), 1);
        // Writeback: one fdatasync; Unsafe: none.
        assert_eq!(log.syncs(), syncs, "{cache:?}");
    }
}

both_engines! {
fn get_id_answers_the_drive_id_zero_padded() {
    let f = TempFile::new("getid", &pattern(8));
    let mut r = Rig::file(opts(true, CacheType::Unsafe), &f);
    let m = r.mem.clone();
    let q = r.start(&m, 16);
    m.write_slice(&[0xff; 32], GuestAddress(DATA)).unwrap();
    request(&m, &q, 0, b::VIRTIO_BLK_T_GET_ID, 0, 20, W);
    r.run();
    assert_eq!(status_byte(&m), status::OK);
    let mut got = [0u8; 32];
    m.read_slice(&mut got, GuestAddress(DATA)).unwrap();
    assert_eq!(&got[..6], b"rootfs");
    assert_eq!(got[6..20], [0u8; 14]);
    assert_eq!(got[20..], [0xffu8; 12], "wrote past the id");
    assert_eq!(used(&q, 0), (0, 21));
    // A buffer shorter than 20 bytes: IOERR, nothing written.
    m.write_slice(&[0xff; 32], GuestAddress(DATA)).unwrap();
    request(&m, &q, 3, b::VIRTIO_BLK_T_GET_ID, 0, 19, W);
    r.run();
    assert_eq!(status_byte(&m), status::IOERR);
    m.read_slice(&mut got, GuestAddress(DATA)).unwrap();
    assert_eq!(got, [0xffu8; 32]);
    // A long drive id is cut to 20 bytes.
    let o = BlockOptions {
        drive_id: "a_very_long_drive_identifier".into(),
        ..BlockOptions::default()
    };
    assert_eq!(&o.disk_id(), b"a_very_long_drive_id");
}
}

both_engines! {
fn read_only_drive_refuses_writes_and_keeps_its_file() {
    let f = TempFile::new("ro", &pattern(8));
    let mut r = Rig::file(opts(true, CacheType::Unsafe), &f);
    let m = r.mem.clone();
    let q = r.start(&m, 16);
    m.write_slice(&[0xa5; 512], GuestAddress(DATA)).unwrap();
    request(&m, &q, 0, b::VIRTIO_BLK_T_OUT, 1, 512, R);
    r.run();
    assert_eq!(status_byte(&m), status::IOERR);
    assert_eq!(used(&q, 0), (0, 1));
    assert_eq!(f.bytes(), pattern(8));
    let s = r.metrics();
    assert_eq!((s.write_count.get(), s.invalid_reqs_count.get()), (0, 1));
    // Reads still work.
    request(&m, &q, 3, b::VIRTIO_BLK_T_IN, 1, 512, W);
    r.run();
    assert_eq!(status_byte(&m), status::OK);
}
}

both_engines! {
fn sectors_beyond_the_end_are_refused() {
    let f = TempFile::new("beyond", &pattern(8));
    let mut r = Rig::file(opts(false, CacheType::Unsafe), &f);
    let m = r.mem.clone();
    let q = r.start(&m, 64);
    let cases = [
        (b::VIRTIO_BLK_T_IN, 8, 512, W),
        (b::VIRTIO_BLK_T_IN, 7, 1024, W),
        (b::VIRTIO_BLK_T_OUT, 8, 512, R),
        (b::VIRTIO_BLK_T_OUT, u64::MAX / 512, 512, R),
        (b::VIRTIO_BLK_T_IN, u64::MAX, 512, W),
        (b::VIRTIO_BLK_T_IN, (u64::MAX - 511) / 512, 512, W),
    ];
    for (i, &(kind, sector, len, fl)) in cases.iter().enumerate() {
        request(&m, &q, 3 * i as u16, kind, sector, len, fl);
        r.run();
        assert_eq!(status_byte(&m), status::IOERR, "case {i}");
    }
    assert_eq!(f.bytes(), pattern(8));
    // The last sector itself is fine.
    request(&m, &q, 30, b::VIRTIO_BLK_T_OUT, 7, 512, R);
    r.run();
    assert_eq!(status_byte(&m), status::OK);
    assert_eq!(r.metrics().invalid_reqs_count.get(), cases.len() as u64);
}
}

both_engines! {
fn lengths_not_a_sector_multiple_are_refused() {
    let f = TempFile::new("lengths", &pattern(8));
    let mut r = Rig::file(opts(false, CacheType::Unsafe), &f);
    let m = r.mem.clone();
    let q = r.start(&m, 64);
    for (i, &(kind, len, fl)) in [
        (b::VIRTIO_BLK_T_IN, 513, W),
        (b::VIRTIO_BLK_T_IN, 100, W),
        (b::VIRTIO_BLK_T_OUT, 1000, R),
        (b::VIRTIO_BLK_T_OUT, 0, R),
    ]
    .iter()
    .enumerate()
    {
        request(&m, &q, 3 * i as u16, kind, 0, len, fl);
        r.run();
        assert_eq!(status_byte(&m), status::IOERR, "case {i}");
    }
    assert_eq!(f.bytes(), pattern(8));
    assert_eq!(
        r.metrics().read_count.get() + r.metrics().write_count.get(),
        0
    );
}
}

both_engines! {
fn unsupported_types_answer_unsupp() {
    let f = TempFile::new("unsupp", &pattern(8));
    let mut r = Rig::file(opts(false, CacheType::Unsafe), &f);
    let m = r.mem.clone();
    let q = r.start(&m, 16);
    request(&m, &q, 0, b::VIRTIO_BLK_T_DISCARD, 0, 512, R);
    r.run();
    assert_eq!(status_byte(&m), status::UNSUPP);
    assert_eq!(used(&q, 0), (0, 1));
}
}

/// Reads GET_ID's 20 bytes through the worker.
fn get_id(r: &mut Rig, q: &Mock<'_>, at: u16) -> [u8; ID_BYTES] {
    let m = r.mem.clone();
    request(&m, q, at, b::VIRTIO_BLK_T_GET_ID, 0, 20, W);
    r.run();
    assert_eq!(status_byte(&m), status::OK);
    let mut got = [0u8; ID_BYTES];
    m.read_slice(&mut got, GuestAddress(DATA)).unwrap();
    got
}

#[test]
fn get_id_of_a_file_is_firecrackers_dev_rdev_inode() {
    use std::os::unix::fs::MetadataExt;
    let want = |f: &TempFile| {
        let md = std::fs::metadata(&f.0).unwrap();
        let mut s = format!("{}{}{}", md.dev(), md.rdev(), md.ino()).into_bytes();
        s.resize(ID_BYTES, 0);
        s
    };
    let f = TempFile::new("getid-fc", &pattern(8));
    let block = Arc::new(Mutex::new(
        Block::<Mem>::new(opts(false, CacheType::Unsafe), f.open(false)).unwrap(),
    ));
    let worker = BlockWorker::new(&block).unwrap();
    let mut r = Rig {
        mem: mem(),
        block,
        worker,
        irq: Arc::new(Irq::default()),
    };
    let m = r.mem.clone();
    let q = r.start(&m, 16);
    assert_eq!(get_id(&mut r, &q, 0).to_vec(), want(&f));
    // A new file (PATCH /drives): its own id, once swapped in.
    let g = TempFile::new("getid-fc2", &pattern(8));
    r.block.lock().unwrap().update_file(g.open(false)).unwrap();
    assert_eq!(get_id(&mut r, &q, 3).to_vec(), want(&g));
    assert_ne!(want(&f), want(&g));
}
