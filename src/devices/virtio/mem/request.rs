//! Parsing one virtio-mem request from its descriptor chain: a pure
//! function over the chain and guest memory.
//!
//! Framing (virtio 1.2, 5.15.6): the head descriptor is device-readable and
//! holds the 24-byte `virtio_mem_req` (`le16 type, le16 padding[3], le64
//! addr, le16 nb_blocks, u8 padding[6]`; the padding is ignored); the next
//! is device-writable and takes the 10-byte `virtio_mem_resp` (`le16 type,
//! le16 padding[3], le16 state`). Descriptors after those two are ignored,
//! as Linux sends none. A chain that is not so is refused
//! ([`RequestError`]): the device answers it with 0 bytes written, since
//! there is nowhere safe to write a response.

use virtio_queue::DescriptorChain;
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend};

use super::{
    REQUEST_BYTES, RESPONSE_BYTES, VIRTIO_MEM_REQ_PLUG, VIRTIO_MEM_REQ_STATE,
    VIRTIO_MEM_REQ_UNPLUG, VIRTIO_MEM_REQ_UNPLUG_ALL,
};

/// What a request asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestKind {
    /// Plug `nb_blocks` blocks from `addr`.
    Plug {
        /// Guest address of the first block.
        addr: u64,
        /// Blocks.
        nb_blocks: u16,
    },
    /// Unplug `nb_blocks` blocks from `addr`.
    Unplug {
        /// Guest address of the first block.
        addr: u64,
        /// Blocks.
        nb_blocks: u16,
    },
    /// Unplug every block.
    UnplugAll,
    /// Report the state of `nb_blocks` blocks from `addr`.
    State {
        /// Guest address of the first block.
        addr: u64,
        /// Blocks.
        nb_blocks: u16,
    },
    /// A type this device does not know (answered ERROR).
    Unknown(u16),
}

/// A parsed request: what it asks and where its response goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    /// The chain's head index (for the used ring).
    pub head: u16,
    /// What it asks.
    pub kind: RequestKind,
    /// Where the response is written (checked: [`RESPONSE_BYTES`] of guest
    /// memory).
    pub resp_addr: GuestAddress,
}

/// Why a chain was refused (it is answered with 0 bytes written).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// The chain had no descriptor (virtio-queue cut it: a loop, a table
    /// outside RAM).
    #[error("empty chain")]
    Empty,
    /// The head descriptor is device-writable.
    #[error("the request descriptor is write-only")]
    RequestWriteOnly,
    /// The head descriptor is shorter than a request.
    #[error("the request descriptor has {0} bytes, fewer than 24")]
    RequestShort(u32),
    /// The request could not be read from guest memory.
    #[error("the request lies outside guest memory")]
    RequestOutsideRam,
    /// No second descriptor.
    #[error("no response descriptor")]
    NoResponse,
    /// The second descriptor is device-readable.
    #[error("the response descriptor is read-only")]
    ResponseReadOnly,
    /// The second descriptor is shorter than a response.
    #[error("the response descriptor has {0} bytes, fewer than 10")]
    ResponseShort(u32),
    /// The response does not lie in guest memory.
    #[error("the response lies outside guest memory")]
    ResponseOutsideRam,
}

/// Decodes the 24 request bytes.
pub fn decode(bytes: &[u8; REQUEST_BYTES]) -> RequestKind {
    let kind = u16::from_le_bytes([bytes[0], bytes[1]]);
    let mut a = [0u8; 8];
    a.copy_from_slice(&bytes[8..16]);
    let addr = u64::from_le_bytes(a);
    let nb_blocks = u16::from_le_bytes([bytes[16], bytes[17]]);
    match kind {
        VIRTIO_MEM_REQ_PLUG => RequestKind::Plug { addr, nb_blocks },
        VIRTIO_MEM_REQ_UNPLUG => RequestKind::Unplug { addr, nb_blocks },
        VIRTIO_MEM_REQ_UNPLUG_ALL => RequestKind::UnplugAll,
        VIRTIO_MEM_REQ_STATE => RequestKind::State { addr, nb_blocks },
        t => RequestKind::Unknown(t),
    }
}

/// The 10 response bytes (`state` is 0 but for an acknowledged STATE).
pub fn encode_response(resp_type: u16, state: u16) -> [u8; RESPONSE_BYTES] {
    let mut b = [0u8; RESPONSE_BYTES];
    b[0..2].copy_from_slice(&resp_type.to_le_bytes());
    b[8..10].copy_from_slice(&state.to_le_bytes());
    b
}

/// Parses `chain` against guest memory `mem`. On a refusal, the head index
/// comes back with the reason, for the used ring.
pub fn parse<G: GuestMemoryBackend>(
    mem: &G,
    mut chain: DescriptorChain<&G>,
) -> Result<Request, (u16, RequestError)> {
    let head = chain.head_index();
    let refuse = |why| Err((head, why));
    let Some(req) = chain.next() else {
        return refuse(RequestError::Empty);
    };
    if req.is_write_only() {
        return refuse(RequestError::RequestWriteOnly);
    }
    if (req.len() as usize) < REQUEST_BYTES {
        return refuse(RequestError::RequestShort(req.len()));
    }
    let mut bytes = [0u8; REQUEST_BYTES];
    if mem.read_slice(&mut bytes, req.addr()).is_err() {
        return refuse(RequestError::RequestOutsideRam);
    }
    let Some(resp) = chain.next() else {
        return refuse(RequestError::NoResponse);
    };
    if !resp.is_write_only() {
        return refuse(RequestError::ResponseReadOnly);
    }
    if (resp.len() as usize) < RESPONSE_BYTES {
        return refuse(RequestError::ResponseShort(resp.len()));
    }
    if !GuestMemoryBackend::check_range(mem, resp.addr(), RESPONSE_BYTES) {
        return refuse(RequestError::ResponseOutsideRam);
    }
    Ok(Request {
        head,
        kind: decode(&bytes),
        resp_addr: resp.addr(),
    })
}
