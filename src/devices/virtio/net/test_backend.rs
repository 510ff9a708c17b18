//! The network tests' tap: records what the device sends and hands it
//! queued frames; its fd is an eventfd written when a frame is queued (the
//! tap's readable edge). (The fuzz target has its own, in fuzz/src/net.rs.)

use std::collections::VecDeque;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::{Arc, Mutex, PoisonError};

use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::{NetBackend, MAX_BUFFER_BYTES, VNET_HDR_BYTES};

/// What a [`RecordingBackend`] saw and holds.
#[derive(Debug, Default)]
pub(super) struct Recorded {
    /// Frames the device wrote, with their headers.
    pub sent: Vec<Vec<u8>>,
    /// Frames waiting for the device to read, with their headers.
    pub to_guest: VecDeque<Vec<u8>>,
    /// Every `set_offload` call's flags.
    pub offloads: Vec<u32>,
    /// Reads the device made that returned a frame.
    pub reads: usize,
    /// Refuse writes (as a tap whose queue is gone).
    pub fail_writes: bool,
}

/// A backend that records what the device sends and hands it queued
/// frames; its fd is an eventfd written when a frame is queued.
#[derive(Debug, Clone)]
pub(super) struct RecordingBackend {
    /// What it saw and holds.
    pub state: Arc<Mutex<Recorded>>,
    evt: Arc<EventFd>,
}

impl RecordingBackend {
    /// An empty backend.
    pub fn new() -> RecordingBackend {
        RecordingBackend {
            state: Arc::default(),
            evt: Arc::new(EventFd::new(EFD_NONBLOCK).expect("eventfd")),
        }
    }

    /// Locks what it saw.
    pub fn lock(&self) -> std::sync::MutexGuard<'_, Recorded> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues a frame (with its header) for the device and signals the fd.
    pub fn push(&self, frame: Vec<u8>) {
        self.lock().to_guest.push_back(frame);
        let _ = self.evt.write(1);
    }
}

impl AsRawFd for RecordingBackend {
    fn as_raw_fd(&self) -> RawFd {
        self.evt.as_raw_fd()
    }
}

impl NetBackend for RecordingBackend {
    fn read_frame(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let mut s = self.lock();
        let Some(f) = s.to_guest.pop_front() else {
            let _ = self.evt.read();
            return Err(std::io::ErrorKind::WouldBlock.into());
        };
        s.reads += 1;
        // A tap truncates what does not fit.
        let n = f.len().min(buf.len());
        buf[..n].copy_from_slice(&f[..n]);
        Ok(n)
    }

    fn write_frame(&mut self, frame: &[u8]) -> std::io::Result<usize> {
        let mut s = self.lock();
        if s.fail_writes {
            return Err(std::io::Error::from_raw_os_error(libc::EIO));
        }
        assert!(
            (VNET_HDR_BYTES..=MAX_BUFFER_BYTES).contains(&frame.len()),
            "frame of {} bytes sent",
            frame.len()
        );
        s.sent.push(frame.to_vec());
        Ok(frame.len())
    }

    fn set_offload(&mut self, tun_flags: u32) -> std::io::Result<()> {
        self.lock().offloads.push(tun_flags);
        Ok(())
    }
}
