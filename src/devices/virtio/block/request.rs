//! Parsing one virtio-blk request from its descriptor chain: a pure
//! function over the chain, guest memory and the drive's size, run before
//! any host I/O.
//!
//! Framing (as Linux sends it and Firecracker expects it): the first
//! descriptor holds the 16-byte header (type, reserved, sector) and is
//! device-readable; the last is the status byte, device-writable; those in
//! between are the data, all device-writable for IN and GET_ID, all
//! device-readable for OUT (FLUSH ignores them). Unlike Firecracker, any
//! number of data descriptors is taken (Linux sends one per segment).
//!
//! What is refused, and how:
//! - no usable status descriptor (not writable, length 0, outside RAM), or a
//!   chain that virtio-queue cut short (a loop, a descriptor table outside
//!   RAM) or longer than [`MAX_DESCRIPTORS_PER_REQUEST`]: the chain is
//!   dropped (returned with length 0), since there is nowhere safe to answer;
//! - anything else wrong (header, directions, data outside RAM, lengths,
//!   sectors beyond the end, OUT on a read-only drive): status IOERR; an
//!   unknown type: UNSUPP. Nothing is read from or written to the file.

use virtio_queue::DescriptorChain;
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend};

use super::{status, ID_BYTES, MAX_DESCRIPTORS_PER_REQUEST, MAX_REQUEST_DATA_BYTES, SECTOR_BYTES};

/// Bytes of the request header.
pub const HEADER_BYTES: u32 = 16;

/// A request's type (`VIRTIO_BLK_T_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestType {
    /// Read sectors into the guest.
    In,
    /// Write the guest's data to sectors.
    Out,
    /// Make written data durable.
    Flush,
    /// The 20-byte device id.
    GetId,
    /// Anything else (answered UNSUPP).
    Unsupported(u32),
}

impl From<u32> for RequestType {
    fn from(t: u32) -> RequestType {
        use virtio_bindings::virtio_blk as b;
        match t {
            b::VIRTIO_BLK_T_IN => RequestType::In,
            b::VIRTIO_BLK_T_OUT => RequestType::Out,
            b::VIRTIO_BLK_T_FLUSH => RequestType::Flush,
            b::VIRTIO_BLK_T_GET_ID => RequestType::GetId,
            t => RequestType::Unsupported(t),
        }
    }
}

/// One data descriptor (after [`parse`]: checked to lie inside RAM, in
/// the request's direction).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    /// Guest physical address.
    pub addr: GuestAddress,
    /// Bytes.
    pub len: u32,
    /// Device-writable.
    pub writable: bool,
}

/// A request that passed every check; its data segments are in the vector
/// given to [`parse`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    /// The chain's head (for the used ring).
    pub head: u16,
    /// What it asks.
    pub kind: RequestType,
    /// The first sector (IN and OUT).
    pub sector: u64,
    /// Sum of the data segments' lengths (at most
    /// [`MAX_REQUEST_DATA_BYTES`]; for IN and OUT a multiple of 512 with
    /// `sector * 512 + data_len` within the drive).
    pub data_len: u64,
    /// Where the status byte goes (checked inside RAM).
    pub status: GuestAddress,
}

impl Request {
    /// The byte offset in the file (IN and OUT).
    pub fn offset(&self) -> u64 {
        // Cannot overflow: checked at parse.
        self.sector * SECTOR_BYTES
    }
}

/// What is wrong with a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// The chain has no descriptor at all (its head is outside the table).
    #[error("empty descriptor chain")]
    Empty,
    /// virtio-queue stopped the chain before its end: a loop, a descriptor
    /// outside RAM, an indirect table that is invalid.
    #[error("descriptor chain cut short (a loop or a descriptor outside guest RAM)")]
    Cut,
    /// More than [`MAX_DESCRIPTORS_PER_REQUEST`] descriptors.
    #[error("more than {MAX_DESCRIPTORS_PER_REQUEST} descriptors")]
    TooManyDescriptors,
    /// The last descriptor is not device-writable.
    #[error("the status descriptor is not device-writable")]
    StatusNotWritable,
    /// The last descriptor has length 0.
    #[error("the status descriptor is empty")]
    StatusEmpty,
    /// The status byte lies outside guest RAM.
    #[error("the status descriptor lies outside guest RAM")]
    StatusOutsideRam,
    /// No header before the status.
    #[error("no request header")]
    NoHeader,
    /// The header descriptor is device-writable.
    #[error("the header descriptor is device-writable")]
    HeaderWritable,
    /// The header descriptor is shorter than 16 bytes.
    #[error("the header descriptor is shorter than {HEADER_BYTES} bytes")]
    HeaderShort,
    /// The header could not be read from guest memory.
    #[error("the header lies outside guest RAM")]
    HeaderOutsideRam,
    /// A data descriptor the device must write is device-readable, or the
    /// other way round.
    #[error("a data descriptor has the wrong direction for the request")]
    WrongDirection,
    /// A data descriptor lies (in part) outside guest RAM.
    #[error("a data descriptor lies outside guest RAM")]
    DataOutsideRam,
    /// IN or OUT without data.
    #[error("a read or write without data")]
    NoData,
    /// A data length that is not a multiple of 512.
    #[error("data length {0} is not a multiple of {SECTOR_BYTES}")]
    NotSectorMultiple(u64),
    /// More data than [`MAX_REQUEST_DATA_BYTES`].
    #[error("data length {0} is above {MAX_REQUEST_DATA_BYTES}")]
    TooLong(u64),
    /// Sectors beyond the end of the drive.
    #[error("sectors {sector}+{bytes} bytes are beyond the drive's {capacity} sectors")]
    BeyondEnd {
        /// The first sector asked.
        sector: u64,
        /// Bytes asked.
        bytes: u64,
        /// The drive's sectors.
        capacity: u64,
    },
    /// OUT on a read-only drive.
    #[error("write to a read-only drive")]
    ReadOnly,
    /// GET_ID with less than 20 bytes of buffer.
    #[error("GET_ID buffer shorter than {ID_BYTES} bytes")]
    IdBufferShort,
    /// An unknown request type.
    #[error("unsupported request type {0}")]
    Unsupported(u32),
}

/// How a refused request is answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Returned with length 0, nothing written (no safe status byte).
    Drop {
        /// The chain's head.
        head: u16,
        /// Why.
        why: RequestError,
    },
    /// The status byte gets `code` (IOERR or UNSUPP); the used length is 1.
    Answer {
        /// The chain's head.
        head: u16,
        /// Where the status byte goes.
        status: GuestAddress,
        /// IOERR or UNSUPP.
        code: u8,
        /// Why.
        why: RequestError,
    },
}

/// Parses `chain` against guest memory `mem` and a drive of
/// `capacity_sectors`; the data segments go to `segments` (cleared first,
/// reused so the device thread does not allocate per request).
pub fn parse<G: GuestMemoryBackend>(
    mem: &G,
    chain: DescriptorChain<&G>,
    capacity_sectors: u64,
    read_only: bool,
    segments: &mut Vec<Segment>,
) -> Result<Request, Refusal> {
    segments.clear();
    let head = chain.head_index();
    let drop = |why| Refusal::Drop { head, why };
    let mut last_has_next = false;
    for d in chain {
        if segments.len() == MAX_DESCRIPTORS_PER_REQUEST {
            return Err(drop(RequestError::TooManyDescriptors));
        }
        segments.push(Segment {
            addr: d.addr(),
            len: d.len(),
            writable: d.is_write_only(),
        });
        last_has_next = d.has_next();
    }
    let Some(last) = segments.pop() else {
        return Err(drop(RequestError::Empty));
    };
    if last_has_next {
        return Err(drop(RequestError::Cut));
    }
    if !last.writable {
        return Err(drop(RequestError::StatusNotWritable));
    }
    if last.len == 0 {
        return Err(drop(RequestError::StatusEmpty));
    }
    if !GuestMemoryBackend::check_range(mem, last.addr, 1) {
        return Err(drop(RequestError::StatusOutsideRam));
    }
    let status = last.addr;
    let answer = |code, why| Refusal::Answer {
        head,
        status,
        code,
        why,
    };
    let ioerr = |why| answer(status::IOERR, why);
    if segments.is_empty() {
        return Err(ioerr(RequestError::NoHeader));
    }
    let header = segments.remove(0);
    if header.writable {
        return Err(ioerr(RequestError::HeaderWritable));
    }
    if header.len < HEADER_BYTES {
        return Err(ioerr(RequestError::HeaderShort));
    }
    let mut raw = [0u8; HEADER_BYTES as usize];
    if mem.read_slice(&mut raw, header.addr).is_err() {
        return Err(ioerr(RequestError::HeaderOutsideRam));
    }
    let kind = RequestType::from(u32::from_le_bytes([raw[0], raw[1], raw[2], raw[3]]));
    let mut sector_le = [0u8; 8];
    sector_le.copy_from_slice(&raw[8..16]);
    let sector = u64::from_le_bytes(sector_le);
    if let RequestType::Unsupported(t) = kind {
        return Err(answer(status::UNSUPP, RequestError::Unsupported(t)));
    }
    if kind == RequestType::Flush {
        // Data descriptors, if any, are ignored.
        segments.clear();
        return Ok(Request {
            head,
            kind,
            sector: 0,
            data_len: 0,
            status,
        });
    }
    let device_writes = matches!(kind, RequestType::In | RequestType::GetId);
    if segments.iter().any(|s| s.writable != device_writes) {
        return Err(ioerr(RequestError::WrongDirection));
    }
    if segments
        .iter()
        .any(|s| s.len > 0 && !GuestMemoryBackend::check_range(mem, s.addr, s.len as usize))
    {
        return Err(ioerr(RequestError::DataOutsideRam));
    }
    let data_len: u64 = segments.iter().map(|s| u64::from(s.len)).sum();
    if data_len > MAX_REQUEST_DATA_BYTES {
        return Err(ioerr(RequestError::TooLong(data_len)));
    }
    match kind {
        RequestType::In | RequestType::Out => {
            if data_len == 0 {
                return Err(ioerr(RequestError::NoData));
            }
            if data_len % SECTOR_BYTES != 0 {
                return Err(ioerr(RequestError::NotSectorMultiple(data_len)));
            }
            let end = sector
                .checked_mul(SECTOR_BYTES)
                .and_then(|o| o.checked_add(data_len));
            let cap_bytes = capacity_sectors.saturating_mul(SECTOR_BYTES);
            if end.is_none_or(|e| e > cap_bytes) {
                return Err(ioerr(RequestError::BeyondEnd {
                    sector,
                    bytes: data_len,
                    capacity: capacity_sectors,
                }));
            }
            if kind == RequestType::Out && read_only {
                return Err(ioerr(RequestError::ReadOnly));
            }
        }
        RequestType::GetId if data_len < ID_BYTES as u64 => {
            return Err(ioerr(RequestError::IdBufferShort));
        }
        _ => {}
    }
    Ok(Request {
        head,
        kind,
        sector,
        data_len,
        status,
    })
}

/// Calls `f` with each piece of the segments' bytes from `start` on,
/// `len` bytes in all: its guest address and its range in the buffer.
fn pieces<E>(
    segments: &[Segment],
    start: u64,
    len: usize,
    mut f: impl FnMut(GuestAddress, std::ops::Range<usize>) -> Result<(), E>,
) -> Result<(), E> {
    let mut skip = start;
    let mut done = 0usize;
    for s in segments {
        if done == len {
            break;
        }
        let seg = u64::from(s.len);
        if skip >= seg {
            skip -= seg;
            continue;
        }
        let n = ((seg - skip) as usize).min(len - done);
        f(GuestAddress(s.addr.0 + skip), done..done + n)?;
        done += n;
        skip = 0;
    }
    Ok(())
}

/// Copies `buf` into the segments' bytes from `start` on (a linear offset
/// into the request's data).
pub(super) fn scatter<G: GuestMemoryBackend>(
    mem: &G,
    segments: &[Segment],
    start: u64,
    buf: &[u8],
) -> Result<(), vm_memory::GuestMemoryError> {
    pieces(segments, start, buf.len(), |at, r| {
        mem.write_slice(&buf[r], at)
    })
}

/// Copies the segments' bytes from `start` on into `buf`.
pub(super) fn gather<G: GuestMemoryBackend>(
    mem: &G,
    segments: &[Segment],
    start: u64,
    buf: &mut [u8],
) -> Result<(), vm_memory::GuestMemoryError> {
    let len = buf.len();
    pieces(segments, start, len, |at, r| {
        mem.read_slice(&mut buf[r], at)
    })
}
