//! Canonical manifest encoding: the byte form of a file's chunk list, whose
//! SHA-256 is the file's content identity.
//!
//! Layout (version 1): one byte `0x01`, then for each chunk in file order its
//! 32-byte SHA-256 followed by its size as a little-endian `u32`. An empty
//! file is the single byte `0x01`. There is exactly one encoding of a chunk
//! list, so equal lists give equal manifest hashes.

use crate::{ChunkRef, Hash, SyncError, chunk};

pub const VERSION: u8 = 1;
const RECORD: usize = Hash::LEN + 4;

pub fn encode(chunks: &[ChunkRef]) -> Vec<u8> {
    let mut out = Vec::with_capacity(1 + chunks.len() * RECORD);
    out.push(VERSION);
    for c in chunks {
        out.extend_from_slice(c.hash.as_bytes());
        out.extend_from_slice(&c.size.to_le_bytes());
    }
    out
}

/// The manifest hash of a chunk list.
pub fn hash(chunks: &[ChunkRef]) -> Hash {
    Hash::of(&encode(chunks))
}

/// Decodes untrusted bytes; rejects an unknown version, a truncated record
/// and chunk sizes outside `1..=MAX_CHUNK`.
pub fn decode(bytes: &[u8]) -> Result<Vec<ChunkRef>, SyncError> {
    let Some((&version, body)) = bytes.split_first() else {
        return Err(SyncError::Invalid("manifest is empty".into()));
    };
    if version != VERSION {
        return Err(SyncError::Invalid(format!(
            "manifest version {version} is not supported"
        )));
    }
    if body.len() % RECORD != 0 {
        return Err(SyncError::Invalid(format!(
            "manifest body of {} bytes is not a whole number of {RECORD}-byte records",
            body.len()
        )));
    }
    body.chunks_exact(RECORD)
        .map(|rec| {
            let hash = Hash::from_slice(&rec[..Hash::LEN])?;
            let size = u32::from_le_bytes(rec[Hash::LEN..].try_into().expect("4 bytes"));
            if size == 0 || size as usize > chunk::MAX_CHUNK {
                return Err(SyncError::Invalid(format!(
                    "manifest chunk {hash} has size {size}"
                )));
            }
            Ok(ChunkRef { hash, size })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn decode_inverts_encode(sizes in proptest::collection::vec(1u32..=chunk::MAX_CHUNK as u32, 0..20)) {
            let chunks: Vec<ChunkRef> = sizes.iter().enumerate()
                .map(|(i, &size)| ChunkRef { hash: Hash::of(&i.to_le_bytes()), size })
                .collect();
            prop_assert_eq!(decode(&encode(&chunks)).unwrap(), chunks);
        }

        #[test]
        fn decode_never_panics_on_garbage(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = decode(&bytes);
        }
    }

    #[test]
    fn malformed_manifests_are_einval() {
        assert!(decode(&[]).is_err());
        assert!(decode(&[2]).is_err());
        assert!(decode(&[1, 0, 0]).is_err());
        let mut zero = encode(&[ChunkRef {
            hash: Hash::of(b"a"),
            size: 1,
        }]);
        zero[33..37].copy_from_slice(&0u32.to_le_bytes());
        assert!(decode(&zero).is_err());
    }
}
