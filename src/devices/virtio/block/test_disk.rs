//! The block tests' in-memory disk: records every access and every
//! `sync_data` (the production disk's `fdatasync`), and fails the test on an
//! access outside the drive's whole sectors, unaligned, or a write to a
//! read-only drive. (The fuzz target has its own, in fuzz/src/block.rs.)

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use super::{Disk, SECTOR_BYTES};

/// What a [`RecordingDisk`] holds and saw.
#[derive(Debug, Default)]
pub(super) struct DiskLog {
    data: Mutex<Vec<u8>>,
    /// (write, offset, length) of each access, in order.
    accesses: Mutex<Vec<(bool, u64, u64)>>,
    read_only: bool,
    syncs: AtomicUsize,
}

impl DiskLog {
    pub fn accesses(&self) -> Vec<(bool, u64, u64)> {
        self.accesses
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub fn bytes(&self) -> Vec<u8> {
        self.data
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// `sync_data` calls so far.
    pub fn syncs(&self) -> usize {
        self.syncs.load(Ordering::SeqCst)
    }

    /// Checks and records an access; the bytes under the lock.
    fn access(&self, write: bool, offset: u64, len: usize) -> std::sync::MutexGuard<'_, Vec<u8>> {
        let d = self.data.lock().unwrap_or_else(PoisonError::into_inner);
        let addressable = d.len() as u64 / SECTOR_BYTES * SECTOR_BYTES;
        assert!(
            offset
                .checked_add(len as u64)
                .is_some_and(|e| e <= addressable),
            "disk access {offset:#x}+{len:#x} outside the drive's {addressable:#x} bytes"
        );
        assert_eq!(offset % SECTOR_BYTES, 0, "unaligned disk access");
        assert!(!(write && self.read_only), "a read-only drive was written");
        self.accesses
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((write, offset, len as u64));
        d
    }
}

/// An in-memory [`Disk`] over a [`DiskLog`].
#[derive(Debug)]
pub(super) struct RecordingDisk(Arc<DiskLog>);

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
            read_only,
            ..DiskLog::default()
        });
        (RecordingDisk(log.clone()), log)
    }
}

impl Disk for RecordingDisk {
    fn size_bytes(&self) -> std::io::Result<u64> {
        Ok(self.0.bytes().len() as u64)
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        let d = self.0.access(false, offset, buf.len());
        let o = offset as usize;
        buf.copy_from_slice(&d[o..o + buf.len()]);
        Ok(())
    }

    fn write_all_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        let mut d = self.0.access(true, offset, buf.len());
        let o = offset as usize;
        d[o..o + buf.len()].copy_from_slice(buf);
        Ok(())
    }

    fn sync_data(&self) -> std::io::Result<()> {
        self.0.syncs.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}
