//! The 44-byte packet header (`struct virtio_vsock_hdr`, little endian,
//! packed) and its checks: pure functions over bytes.

use super::{HOST_CID, MAX_PKT_PAYLOAD};

/// Bytes of a header.
pub const HEADER_BYTES: usize = 44;

/// `type`: a stream socket (the only type offered).
pub const TYPE_STREAM: u16 = 1;

/// Operations (`op`).
pub mod op {
    /// Connection request.
    pub const REQUEST: u16 = 1;
    /// Connection accepted.
    pub const RESPONSE: u16 = 2;
    /// Connection reset (refused or torn down).
    pub const RST: u16 = 3;
    /// One or both directions closed (`flags`).
    pub const SHUTDOWN: u16 = 4;
    /// Data.
    pub const RW: u16 = 5;
    /// The sender's buffer space and what it consumed.
    pub const CREDIT_UPDATE: u16 = 6;
    /// Asks for a credit update.
    pub const CREDIT_REQUEST: u16 = 7;
}

/// `SHUTDOWN` flags.
pub mod shutdown {
    /// The sender will receive no more.
    pub const RCV: u32 = 1;
    /// The sender will send no more.
    pub const SEND: u32 = 2;
    /// Both.
    pub const BOTH: u32 = RCV | SEND;
}

/// A packet header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct VsockHeader {
    /// Source CID.
    pub src_cid: u64,
    /// Destination CID.
    pub dst_cid: u64,
    /// Source port.
    pub src_port: u32,
    /// Destination port.
    pub dst_port: u32,
    /// Payload bytes after the header.
    pub len: u32,
    /// Socket type.
    pub type_: u16,
    /// Operation.
    pub op: u16,
    /// Operation flags.
    pub flags: u32,
    /// The sender's receive buffer, bytes.
    pub buf_alloc: u32,
    /// Bytes the sender consumed of what it received (wrapping).
    pub fwd_cnt: u32,
}

/// Why a guest packet is dropped without an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeaderFault {
    /// Fewer than 44 readable bytes.
    Short,
    /// `src_cid` is not the guest's.
    SrcCid,
    /// `dst_cid` is not the host.
    DstCid,
    /// `len` above [`MAX_PKT_PAYLOAD`] or above what the chain holds.
    Len,
}

impl VsockHeader {
    /// Parses a header from the start of `b`.
    pub fn parse(b: &[u8]) -> Option<VsockHeader> {
        let b: &[u8; HEADER_BYTES] = b.get(..HEADER_BYTES)?.try_into().ok()?;
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap_or([0; 8]));
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap_or([0; 4]));
        let u16_at = |o: usize| u16::from_le_bytes([b[o], b[o + 1]]);
        Some(VsockHeader {
            src_cid: u64_at(0),
            dst_cid: u64_at(8),
            src_port: u32_at(16),
            dst_port: u32_at(20),
            len: u32_at(24),
            type_: u16_at(28),
            op: u16_at(30),
            flags: u32_at(32),
            buf_alloc: u32_at(36),
            fwd_cnt: u32_at(40),
        })
    }

    /// The header's bytes.
    pub fn to_bytes(&self) -> [u8; HEADER_BYTES] {
        let mut b = [0u8; HEADER_BYTES];
        b[0..8].copy_from_slice(&self.src_cid.to_le_bytes());
        b[8..16].copy_from_slice(&self.dst_cid.to_le_bytes());
        b[16..20].copy_from_slice(&self.src_port.to_le_bytes());
        b[20..24].copy_from_slice(&self.dst_port.to_le_bytes());
        b[24..28].copy_from_slice(&self.len.to_le_bytes());
        b[28..30].copy_from_slice(&self.type_.to_le_bytes());
        b[30..32].copy_from_slice(&self.op.to_le_bytes());
        b[32..36].copy_from_slice(&self.flags.to_le_bytes());
        b[36..40].copy_from_slice(&self.buf_alloc.to_le_bytes());
        b[40..44].copy_from_slice(&self.fwd_cnt.to_le_bytes());
        b
    }

    /// Checks a guest packet of `readable` bytes (header included) from a
    /// guest of `guest_cid`: the addresses and the length. The type and the
    /// operation are the muxer's to answer (with a reset).
    pub fn check_from_guest(&self, guest_cid: u64, readable: usize) -> Result<(), HeaderFault> {
        if self.src_cid != guest_cid {
            return Err(HeaderFault::SrcCid);
        }
        if self.dst_cid != HOST_CID {
            return Err(HeaderFault::DstCid);
        }
        let payload = readable.saturating_sub(HEADER_BYTES);
        if self.len > MAX_PKT_PAYLOAD || self.len as usize > payload {
            return Err(HeaderFault::Len);
        }
        Ok(())
    }

    /// A header from the host (`local_port`) to the guest (`peer_port`).
    pub fn to_guest(guest_cid: u64, local_port: u32, peer_port: u32, op: u16) -> VsockHeader {
        VsockHeader {
            src_cid: HOST_CID,
            dst_cid: guest_cid,
            src_port: local_port,
            dst_port: peer_port,
            type_: TYPE_STREAM,
            op,
            ..VsockHeader::default()
        }
    }
}
