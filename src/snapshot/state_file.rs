//! The state file's envelope: what makes a file teravm's, of a version this
//! build reads, whole, and not too big to read, before anything in it is
//! believed.
//!
//! ```text
//! offset  size  field
//! 0       8     magic "TERAVMSS"
//! 8       4     format version, little endian (FORMAT_VERSION)
//! 12      4     zero (reserved)
//! 16      8     payload length in bytes, little endian
//! 24      n     payload: the state as JSON
//! 24+n    8     CRC-64/XZ of bytes 0..24+n, little endian
//! ```
//!
//! The load reads at most [`MAX_STATE_FILE_BYTES`] (a longer file is
//! refused before it is read), checks the magic, the version, that the
//! length the header gives is the length there is, and the CRC, and only
//! then parses the payload. Nothing is allocated from a number in the file:
//! the buffer is the file's bytes, bounded first, and the JSON parser makes
//! values from bytes that are there. The CRC is written here (a table and
//! a loop) rather than taken from a crate: it is twenty lines, and the
//! rust-vmm set has none.

use std::io::Read;

use serde::de::DeserializeOwned;
use serde::Serialize;

/// The first bytes of every teravm state file.
pub const MAGIC: &[u8; 8] = b"TERAVMSS";
/// The format this build writes and reads.
pub const FORMAT_VERSION: u32 = 1;
/// The largest state file a load reads (the state of 32 vCPUs and every
/// device is well under 1 MiB).
pub const MAX_STATE_FILE_BYTES: u64 = 16 << 20;
const HEADER_BYTES: usize = 24;
const CRC_BYTES: usize = 8;

/// Why a state file could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum StateFileError {
    /// Reading or writing failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The file is longer than any state file.
    #[error(
        "the state file is {0} bytes, more than the {MAX_STATE_FILE_BYTES} a state file may be"
    )]
    TooBig(u64),
    /// The file is shorter than its header and CRC, or than the length its
    /// header gives.
    #[error("the state file is truncated: {have} bytes, {need} expected")]
    Truncated {
        /// Bytes in the file.
        have: u64,
        /// Bytes its header asks for.
        need: u64,
    },
    /// The file does not start with [`MAGIC`].
    #[error("not a teravm snapshot state file (no TERAVMSS magic)")]
    NotAStateFile,
    /// Another format version.
    #[error(
        "the state file has format version {found}; this teravm reads version {FORMAT_VERSION}"
    )]
    Version {
        /// The file's version.
        found: u32,
    },
    /// Bytes after the CRC.
    #[error("the state file has {0} bytes after its end")]
    TrailingBytes(u64),
    /// The CRC does not match the bytes.
    #[error(
        "the state file is corrupt: its CRC is {stored:#018x}, its bytes give {computed:#018x}"
    )]
    Crc {
        /// The CRC in the file.
        stored: u64,
        /// The CRC of the bytes.
        computed: u64,
    },
    /// The payload is not a state this build understands.
    #[error("the state file's contents are invalid: {0}")]
    Payload(serde_json::Error),
}

/// `state` in the envelope, as bytes.
pub fn encode<T: Serialize>(state: &T) -> Result<Vec<u8>, StateFileError> {
    let payload = serde_json::to_vec(state).map_err(StateFileError::Payload)?;
    let mut bytes = Vec::with_capacity(HEADER_BYTES + payload.len() + CRC_BYTES);
    bytes.extend_from_slice(MAGIC);
    bytes.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    bytes.extend_from_slice(&0u32.to_le_bytes());
    bytes.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    bytes.extend_from_slice(&payload);
    let crc = crc64(&bytes);
    bytes.extend_from_slice(&crc.to_le_bytes());
    Ok(bytes)
}

/// Reads a state from `input`, of at most `len` bytes as its metadata
/// says (checked against [`MAX_STATE_FILE_BYTES`] first; the read stops
/// there whatever the file does meanwhile).
pub fn read_state<T: DeserializeOwned, R: Read>(input: R, len: u64) -> Result<T, StateFileError> {
    if len > MAX_STATE_FILE_BYTES {
        return Err(StateFileError::TooBig(len));
    }
    let mut bytes = Vec::with_capacity(len as usize);
    input
        .take(MAX_STATE_FILE_BYTES + 1)
        .read_to_end(&mut bytes)?;
    decode(&bytes)
}

/// A state from the envelope's bytes.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, StateFileError> {
    let have = bytes.len() as u64;
    if have > MAX_STATE_FILE_BYTES {
        return Err(StateFileError::TooBig(have));
    }
    if bytes.len() < MAGIC.len() || &bytes[..MAGIC.len()] != MAGIC {
        return Err(StateFileError::NotAStateFile);
    }
    let truncated = |need: u64| StateFileError::Truncated { have, need };
    if bytes.len() < HEADER_BYTES + CRC_BYTES {
        return Err(truncated((HEADER_BYTES + CRC_BYTES) as u64));
    }
    let word =
        |at: usize| u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]);
    let found = word(8);
    if found != FORMAT_VERSION {
        return Err(StateFileError::Version { found });
    }
    let mut len = [0u8; 8];
    len.copy_from_slice(&bytes[16..24]);
    let payload_len = u64::from_le_bytes(len);
    let need = payload_len
        .checked_add((HEADER_BYTES + CRC_BYTES) as u64)
        .ok_or_else(|| truncated(u64::MAX))?;
    if have < need {
        return Err(truncated(need));
    }
    if have > need {
        return Err(StateFileError::TrailingBytes(have - need));
    }
    // `need` == `have`, so these fit in usize.
    let end = HEADER_BYTES + payload_len as usize;
    let mut stored = [0u8; 8];
    stored.copy_from_slice(&bytes[end..end + CRC_BYTES]);
    let stored = u64::from_le_bytes(stored);
    let computed = crc64(&bytes[..end]);
    if stored != computed {
        return Err(StateFileError::Crc { stored, computed });
    }
    serde_json::from_slice(&bytes[HEADER_BYTES..end]).map_err(StateFileError::Payload)
}

/// CRC-64/XZ (ECMA-182 polynomial, reflected, all ones in and out).
pub fn crc64(bytes: &[u8]) -> u64 {
    const POLY: u64 = 0xC96C_5795_D787_0F42;
    const TABLE: [u64; 256] = {
        let mut table = [0u64; 256];
        let mut i = 0;
        while i < 256 {
            let mut c = i as u64;
            let mut k = 0;
            while k < 8 {
                c = if c & 1 != 0 { (c >> 1) ^ POLY } else { c >> 1 };
                k += 1;
            }
            table[i] = c;
            i += 1;
        }
        table
    };
    let mut crc = u64::MAX;
    for &b in bytes {
        crc = TABLE[((crc ^ u64::from(b)) & 0xff) as usize] ^ (crc >> 8);
    }
    !crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct S {
        a: u64,
        b: Vec<u8>,
    }

    fn sample() -> Vec<u8> {
        encode(&S {
            a: 7,
            b: vec![1, 2, 3],
        })
        .unwrap()
    }

    #[test]
    fn crc64_is_crc64_xz() {
        // The check value of CRC-64/XZ.
        assert_eq!(crc64(b"123456789"), 0x995D_C9BB_DF19_39FA);
        assert_eq!(crc64(b""), 0);
    }

    #[test]
    fn round_trip() {
        let s: S = decode(&sample()).unwrap();
        assert_eq!(
            s,
            S {
                a: 7,
                b: vec![1, 2, 3]
            }
        );
        let bytes = sample();
        let s: S = read_state(&bytes[..], bytes.len() as u64).unwrap();
        assert_eq!(s.a, 7);
    }

    #[test]
    fn every_flipped_byte_is_refused() {
        let good = sample();
        for i in 0..good.len() {
            let mut bad = good.clone();
            bad[i] ^= 0x01;
            assert!(decode::<S>(&bad).is_err(), "byte {i} flipped was taken");
        }
    }

    #[test]
    fn every_truncation_is_refused() {
        let good = sample();
        for n in 0..good.len() {
            let e = decode::<S>(&good[..n]).unwrap_err();
            assert!(
                matches!(
                    e,
                    StateFileError::NotAStateFile | StateFileError::Truncated { .. }
                ),
                "{n}: {e}"
            );
        }
        let mut long = good.clone();
        long.push(0);
        assert!(matches!(
            decode::<S>(&long),
            Err(StateFileError::TrailingBytes(1))
        ));
    }

    #[test]
    fn other_version_and_magic_and_huge_lengths_are_refused() {
        let mut v2 = sample();
        v2[8] = 2;
        assert!(matches!(
            decode::<S>(&v2),
            Err(StateFileError::Version { found: 2 })
        ));
        let mut other = sample();
        other[0] = b'X';
        assert!(matches!(
            decode::<S>(&other),
            Err(StateFileError::NotAStateFile)
        ));
        // A length field of 2^64-1 allocates nothing and is refused.
        let mut huge = sample();
        huge[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(matches!(
            decode::<S>(&huge),
            Err(StateFileError::Truncated { .. })
        ));
        assert!(matches!(
            read_state::<S, _>(&[][..], MAX_STATE_FILE_BYTES + 1),
            Err(StateFileError::TooBig(_))
        ));
    }

    #[test]
    fn a_payload_of_another_shape_is_refused_after_the_crc() {
        #[derive(serde::Serialize)]
        struct Other {
            z: u8,
        }
        let bytes = encode(&Other { z: 1 }).unwrap();
        assert!(matches!(
            decode::<S>(&bytes),
            Err(StateFileError::Payload(_))
        ));
    }
}
