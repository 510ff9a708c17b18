//! The block device's queue work and host I/O, run only on the device
//! thread ([`BlockWorker`]): one bounded pass per event
//! ([`BlockWorker::process_queue`]), each request parsed
//! ([`super::request::parse`]) before any host I/O, data moved in chunks of
//! at most [`BOUNCE_BYTES`] through the thread's bounce buffer.
//!
//! Locking: the ring slot (`Shared::ring` in `device.rs`) is taken for
//! each guest-memory step (pop and parse, one chunk's copy, the status byte
//! and used ring) and let go before each `pread`/`pwrite`/`fdatasync`. Each
//! step first checks that the activation it began under still runs; if a
//! reset came in between, the request is abandoned: nothing more is written
//! to the guest and the chain is not returned (the guest reset the queue).

use std::fs::File;
use std::io::{Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering;
use std::sync::PoisonError;

use virtio_queue::QueueT;
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend};

use super::device::CacheType;
use super::metrics::BlockMetrics;
use super::request::{parse, Refusal, Request, RequestType, Segment};
use super::{status, BlockWorker, BOUNCE_BYTES, ID_BYTES, MAX_CHAINS_PER_PASS, SECTOR_BYTES};
use crate::devices::virtio::{DeviceMemory, VirtioInterruptType};

/// The drive's backing store, as the device thread uses it. Every call may
/// block (a hung NFS mount): only the device thread makes them.
pub trait Disk: Send {
    /// The size in bytes (for a file: `lseek(SEEK_END)`, which also works
    /// for a host block device, where `fstat` says 0).
    fn size_bytes(&self) -> std::io::Result<u64>;
    /// Fills `buf` from `offset` (`pread64`, retried on short reads and
    /// `EINTR`); end of file before `buf` is full is an error.
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()>;
    /// Writes all of `buf` at `offset` (`pwrite64`, retried).
    fn write_all_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()>;
    /// Makes written data durable (`fdatasync`).
    fn sync_data(&self) -> std::io::Result<()>;
}

impl Disk for File {
    fn size_bytes(&self) -> std::io::Result<u64> {
        let mut f: &File = self;
        f.seek(SeekFrom::End(0))
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        FileExt::read_exact_at(self, buf, offset)
    }

    fn write_all_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        FileExt::write_all_at(self, buf, offset)
    }

    fn sync_data(&self) -> std::io::Result<()> {
        File::sync_data(self)
    }
}

/// The size of `disk` in bytes.
pub(super) fn disk_size(disk: &dyn Disk) -> std::io::Result<u64> {
    disk.size_bytes()
}

/// Copies `buf` into the segments' bytes from `start` on (a linear offset
/// into the request's data).
fn scatter<G: GuestMemoryBackend>(
    mem: &G,
    segments: &[Segment],
    start: u64,
    buf: &[u8],
) -> Result<(), vm_memory::GuestMemoryError> {
    let mut skip = start;
    let mut done = 0usize;
    for s in segments {
        if done == buf.len() {
            break;
        }
        let len = u64::from(s.len);
        if skip >= len {
            skip -= len;
            continue;
        }
        let n = ((len - skip) as usize).min(buf.len() - done);
        mem.write_slice(&buf[done..done + n], GuestAddress(s.addr.0 + skip))?;
        done += n;
        skip = 0;
    }
    Ok(())
}

/// Copies the segments' bytes from `start` on into `buf`.
fn gather<G: GuestMemoryBackend>(
    mem: &G,
    segments: &[Segment],
    start: u64,
    buf: &mut [u8],
) -> Result<(), vm_memory::GuestMemoryError> {
    let mut skip = start;
    let mut done = 0usize;
    for s in segments {
        if done == buf.len() {
            break;
        }
        let len = u64::from(s.len);
        if skip >= len {
            skip -= len;
            continue;
        }
        let n = ((len - skip) as usize).min(buf.len() - done);
        mem.read_slice(&mut buf[done..done + n], GuestAddress(s.addr.0 + skip))?;
        done += n;
        skip = 0;
    }
    Ok(())
}

/// How a request ended: its status and the bytes written into the guest's
/// data buffers, or `None` when its activation is gone.
type Outcome = Option<(u8, u32)>;

impl<M: DeviceMemory> BlockWorker<M> {
    /// One bounded pass: swaps in a pending file, then serves up to
    /// [`MAX_CHAINS_PER_PASS`] chains one by one (wakes itself if more may
    /// be left). `queue_event`: a queue notification woke it (an empty
    /// queue is then counted as `no_avail_buffer`).
    pub fn process_queue(&mut self, queue_event: bool) {
        let metrics = self.shared.metrics.clone();
        for i in 0..MAX_CHAINS_PER_PASS {
            self.swap_pending_disk();
            let Some((epoch, parsed)) = self.pop() else {
                if i == 0 && queue_event {
                    BlockMetrics::add(&metrics.no_avail_buffer, 1);
                }
                return;
            };
            match parsed {
                Ok(req) => {
                    if let Some((code, written)) = self.execute(epoch, &req) {
                        self.finish(epoch, req.head, Some((req.status, code)), written);
                    }
                }
                Err(Refusal::Drop { head, .. }) => {
                    BlockMetrics::add(&metrics.invalid_reqs_count, 1);
                    BlockMetrics::add(&metrics.dropped_reqs_count, 1);
                    self.finish(epoch, head, None, 0);
                }
                Err(Refusal::Answer {
                    head, status, code, ..
                }) => {
                    BlockMetrics::add(&metrics.invalid_reqs_count, 1);
                    self.finish(epoch, head, Some((status, code)), 0);
                }
            }
        }
        if self.shared.wake.write(1).is_err() {
            BlockMetrics::add(&metrics.event_fails, 1);
        }
    }

    /// Takes the next chain and parses it, under the ring lock.
    fn pop(&mut self) -> Option<(u64, Result<Request, Refusal>)> {
        let mut ring = self.shared.ring();
        let a = ring.as_mut()?;
        let chain = a.queue.pop_descriptor_chain(&*a.mem)?;
        let parsed = parse(
            &*a.mem,
            chain,
            self.capacity_sectors,
            self.read_only,
            &mut self.segments,
        );
        Some((a.epoch, parsed))
    }

    fn execute(&mut self, epoch: u64, req: &Request) -> Outcome {
        let m = self.shared.metrics.clone();
        let ioerr = |done: u64| {
            BlockMetrics::add(&m.execute_fails, 1);
            Some((status::IOERR, done as u32))
        };
        match req.kind {
            RequestType::In => {
                let mut done = 0u64;
                while done < req.data_len {
                    let n = (req.data_len - done).min(BOUNCE_BYTES as u64) as usize;
                    let off = req.offset() + done;
                    debug_assert!(off + n as u64 <= self.capacity_sectors * SECTOR_BYTES);
                    // Host I/O, no lock held.
                    if self.disk.read_exact_at(&mut self.bounce[..n], off).is_err() {
                        return ioerr(done);
                    }
                    let ring = self.shared.ring();
                    let a = self.current(&ring, epoch)?;
                    if scatter(&*a.mem, &self.segments, done, &self.bounce[..n]).is_err() {
                        return ioerr(done);
                    }
                    done += n as u64;
                }
                BlockMetrics::add(&m.read_bytes, req.data_len);
                BlockMetrics::add(&m.read_count, 1);
                Some((status::OK, req.data_len as u32))
            }
            RequestType::Out => {
                let mut done = 0u64;
                while done < req.data_len {
                    let n = (req.data_len - done).min(BOUNCE_BYTES as u64) as usize;
                    let off = req.offset() + done;
                    debug_assert!(off + n as u64 <= self.capacity_sectors * SECTOR_BYTES);
                    {
                        let ring = self.shared.ring();
                        let a = self.current(&ring, epoch)?;
                        if gather(&*a.mem, &self.segments, done, &mut self.bounce[..n]).is_err() {
                            return ioerr(0);
                        }
                    }
                    // Host I/O, no lock held.
                    if self.disk.write_all_at(&self.bounce[..n], off).is_err() {
                        return ioerr(0);
                    }
                    done += n as u64;
                }
                BlockMetrics::add(&m.write_bytes, req.data_len);
                BlockMetrics::add(&m.write_count, 1);
                Some((status::OK, 0))
            }
            RequestType::Flush => {
                if self.cache_type == CacheType::Writeback && self.disk.sync_data().is_err() {
                    return ioerr(0);
                }
                BlockMetrics::add(&m.flush_count, 1);
                Some((status::OK, 0))
            }
            RequestType::GetId => {
                let ring = self.shared.ring();
                let a = self.current(&ring, epoch)?;
                if scatter(&*a.mem, &self.segments, 0, &self.id).is_err() {
                    return ioerr(0);
                }
                BlockMetrics::add(&m.get_id_count, 1);
                Some((status::OK, ID_BYTES as u32))
            }
            // Refused at parse; kept total.
            RequestType::Unsupported(_) => Some((status::UNSUPP, 0)),
        }
    }

    /// The activation `epoch` if it still runs; counts an abandoned request
    /// if not.
    fn current<'a>(
        &self,
        ring: &'a Option<super::device::Active<M>>,
        epoch: u64,
    ) -> Option<&'a super::device::Active<M>> {
        let a = ring.as_ref().filter(|a| a.epoch == epoch);
        if a.is_none() {
            BlockMetrics::add(&self.shared.metrics.abandoned_reqs_count, 1);
        }
        a
    }

    /// Writes the status byte (if any) and returns the chain: used length
    /// `written + 1`, or 0 without a status or if it cannot be written.
    fn finish(&mut self, epoch: u64, head: u16, status: Option<(GuestAddress, u8)>, written: u32) {
        let mut ring = self.shared.ring();
        if self.current(&ring, epoch).is_none() {
            return;
        }
        let Some(a) = ring.as_mut() else { return };
        let len = match status {
            Some((addr, code)) if a.mem.write_obj(code, addr).is_ok() => written + 1,
            _ => 0,
        };
        let mut ok = a.queue.add_used(&*a.mem, head, len).is_ok();
        if a.queue.needs_notification(&*a.mem).unwrap_or(true) {
            ok &= a.interrupt.trigger(VirtioInterruptType::Queue(0)).is_ok();
        }
        if !ok {
            BlockMetrics::add(&self.shared.metrics.event_fails, 1);
        }
    }

    /// Swaps in the file [`super::Block::update_file`] handed over, if any:
    /// reads its size, closes the old file, tells the guest.
    pub(super) fn swap_pending_disk(&mut self) {
        let new = self
            .shared
            .pending_disk
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        let Some(new) = new else { return };
        let m = &self.shared.metrics;
        let size = match disk_size(&*new) {
            Ok(s) => s,
            Err(e) => {
                BlockMetrics::add(&m.update_fails, 1);
                log::warn!(
                    "block: the new backing file's size cannot be read ({e}); kept the old file"
                );
                return;
            }
        };
        let old = std::mem::replace(&mut self.disk, new);
        self.capacity_sectors = size / SECTOR_BYTES;
        self.shared
            .capacity_sectors
            .store(self.capacity_sectors, Ordering::SeqCst);
        self.shared.config_generation.fetch_add(1, Ordering::SeqCst);
        BlockMetrics::add(&m.update_count, 1);
        if let Some(a) = self.shared.ring().as_ref() {
            if a.interrupt.trigger(VirtioInterruptType::Config).is_err() {
                BlockMetrics::add(&m.event_fails, 1);
            }
        }
        // The old file is closed here, on the device thread (a close may
        // wait on the file system too).
        drop(old);
    }
}
