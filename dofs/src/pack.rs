//! Packs: many chunks in one object of an object store, so that a batch
//! of small chunks costs the server one object instead of one each (a
//! SeaweedFS spends ~0.6 ms of CPU per object, which capped a sync at
//! ~30 MB/s with an object per chunk; `bench/RESULTS.md`, issue 29).
//!
//! A pack is self-describing, so it can be read with no local state (a
//! recovery, a sweep):
//!
//! ```text
//! "dofspack" | version u32 LE | count u32 LE        (16-byte header)
//! count × ( hash [32] | offset u64 LE | len u32 LE ) (the index)
//! the chunks' bytes, back to back, in index order
//! ```
//!
//! Offsets are from the start of the pack object, so a chunk is one ranged
//! read. A pack's id is the SHA-256 of its bytes: writing the same pack
//! twice is idempotent, and a pack whose bytes were swapped is told by the
//! chunks' own hashes, which every read verifies.

use wsd_sync::Hash;

use crate::error::DofsError;

const MAGIC: &[u8; 8] = b"dofspack";

/// The format this build writes and reads; another is refused by name.
pub(crate) const VERSION: u32 = 1;

/// Bytes before the index.
pub(crate) const HEADER_LEN: u64 = 16;

/// Bytes per index entry.
const ENTRY_LEN: u64 = 32 + 8 + 4;

/// Where a chunk lives when it is not an object of its own: a byte range
/// of pack `pack` (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PackSlot {
    pub pack: Hash,
    pub offset: u64,
    pub len: u32,
}

/// The chunks a pack lists, in order, each with its range.
pub(crate) type PackIndex = Vec<(Hash, PackSlot)>;

/// A pack ready to store: its id, its bytes, and where each chunk is in it.
pub(crate) struct Pack {
    pub id: Hash,
    pub bytes: Vec<u8>,
    pub slots: PackIndex,
}

/// Packs `chunks` (distinct hashes, each at most `u32::MAX` bytes) in
/// order.
pub(crate) fn encode(chunks: &[(Hash, &[u8])]) -> Pack {
    encode_with_gap(chunks, 0)
}

/// [`encode`] with `gap` zero bytes between the index and the chunks:
/// the same chunks under another id (offsets are explicit, so readers
/// need nothing else), for a writer that must not produce the id of a
/// pack a collection is deleting.
pub(crate) fn encode_with_gap(chunks: &[(Hash, &[u8])], gap: usize) -> Pack {
    let count = chunks.len() as u64;
    let data_start = HEADER_LEN + count * ENTRY_LEN + gap as u64;
    let total = data_start + chunks.iter().map(|(_, b)| b.len() as u64).sum::<u64>();
    let mut bytes = Vec::with_capacity(total as usize);
    bytes.extend_from_slice(MAGIC);
    bytes.extend_from_slice(&VERSION.to_le_bytes());
    bytes.extend_from_slice(&(count as u32).to_le_bytes());
    let mut offset = data_start;
    let mut placed = Vec::with_capacity(chunks.len());
    for (hash, chunk) in chunks {
        let len = chunk.len() as u32;
        bytes.extend_from_slice(hash.as_bytes());
        bytes.extend_from_slice(&offset.to_le_bytes());
        bytes.extend_from_slice(&len.to_le_bytes());
        placed.push((*hash, offset, len));
        offset += u64::from(len);
    }
    bytes.resize(bytes.len() + gap, 0);
    for (_, chunk) in chunks {
        bytes.extend_from_slice(chunk);
    }
    let id = Hash::of(&bytes);
    let slots = placed
        .into_iter()
        .map(|(hash, offset, len)| {
            (
                hash,
                PackSlot {
                    pack: id,
                    offset,
                    len,
                },
            )
        })
        .collect();
    Pack { id, bytes, slots }
}

fn corrupt(pack: &Hash, reason: String) -> DofsError {
    DofsError::CorruptPack {
        pack: *pack,
        reason,
    }
}

/// The byte length of the index of pack `pack`, from its header.
pub(crate) fn index_len(pack: &Hash, header: &[u8]) -> Result<u64, DofsError> {
    if header.len() != HEADER_LEN as usize || &header[..8] != MAGIC {
        return Err(corrupt(pack, "no pack header".into()));
    }
    let version = u32::from_le_bytes(header[8..12].try_into().expect("4 bytes"));
    if version != VERSION {
        return Err(corrupt(
            pack,
            format!("pack format {version}, this build reads {VERSION}"),
        ));
    }
    let count = u32::from_le_bytes(header[12..16].try_into().expect("4 bytes"));
    Ok(u64::from(count) * ENTRY_LEN)
}

/// The chunks pack `pack` lists, from its index (the bytes after the
/// header), with their slots. `size` is the object's size: an entry
/// pointing past it is refused.
pub(crate) fn decode_index(pack: &Hash, index: &[u8], size: u64) -> Result<PackIndex, DofsError> {
    if !(index.len() as u64).is_multiple_of(ENTRY_LEN) {
        return Err(corrupt(pack, "index cut short".into()));
    }
    let data_start = HEADER_LEN + index.len() as u64;
    index
        .chunks_exact(ENTRY_LEN as usize)
        .map(|e| {
            let hash = Hash(e[..32].try_into().expect("32 bytes"));
            let offset = u64::from_le_bytes(e[32..40].try_into().expect("8 bytes"));
            let len = u32::from_le_bytes(e[40..44].try_into().expect("4 bytes"));
            if offset < data_start || offset.saturating_add(u64::from(len)) > size {
                return Err(corrupt(
                    pack,
                    format!("chunk {hash} at {offset}+{len} is outside the pack's {size} bytes"),
                ));
            }
            Ok((
                hash,
                PackSlot {
                    pack: *pack,
                    offset,
                    len,
                },
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pack_lists_its_chunks_and_each_slot_holds_its_bytes() {
        let (a, b) = (b"first chunk".to_vec(), vec![7u8; 5000]);
        let chunks = [(Hash::of(&a), &a[..]), (Hash::of(&b), &b[..])];
        let pack = encode(&chunks);
        assert_eq!(pack.id, Hash::of(&pack.bytes), "content-addressed");
        for ((hash, bytes), (slot_hash, slot)) in chunks.iter().zip(&pack.slots) {
            assert_eq!(hash, slot_hash);
            let range = slot.offset as usize..(slot.offset + u64::from(slot.len)) as usize;
            assert_eq!(&pack.bytes[range], *bytes);
        }
        let header = &pack.bytes[..HEADER_LEN as usize];
        let len = index_len(&pack.id, header).unwrap();
        let index = &pack.bytes[HEADER_LEN as usize..(HEADER_LEN + len) as usize];
        let size = pack.bytes.len() as u64;
        assert_eq!(decode_index(&pack.id, index, size).unwrap(), pack.slots);
        assert_eq!(encode(&chunks).id, pack.id, "same chunks, same pack");
        let gapped = encode_with_gap(&chunks, 3);
        assert_ne!(gapped.id, pack.id, "another id");
        let len = index_len(&gapped.id, &gapped.bytes[..HEADER_LEN as usize]).unwrap();
        let index = &gapped.bytes[HEADER_LEN as usize..(HEADER_LEN + len) as usize];
        let size = gapped.bytes.len() as u64;
        assert_eq!(decode_index(&gapped.id, index, size).unwrap(), gapped.slots);
        for (hash, slot) in &gapped.slots {
            let range = slot.offset as usize..(slot.offset + u64::from(slot.len)) as usize;
            assert_eq!(Hash::of(&gapped.bytes[range]), *hash);
        }
    }

    #[test]
    fn a_damaged_or_foreign_pack_is_refused_naming_it() {
        let a = b"chunk".to_vec();
        let pack = encode(&[(Hash::of(&a), &a[..])]);
        let mut header = pack.bytes[..HEADER_LEN as usize].to_vec();
        header[8] = 9;
        let err = index_len(&pack.id, &header).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains(&pack.id.to_string()) && text.contains("format 9"),
            "{text}"
        );
        let err = index_len(&pack.id, b"not a pack at all").unwrap_err();
        assert!(err.to_string().contains("no pack header"), "{err}");
        let index = &pack.bytes[HEADER_LEN as usize..(HEADER_LEN + ENTRY_LEN) as usize];
        let err = decode_index(&pack.id, index, pack.bytes.len() as u64 - 1).unwrap_err();
        assert!(err.to_string().contains("outside the pack"), "{err}");
        let err = decode_index(&pack.id, &index[..10], 1000).unwrap_err();
        assert!(err.to_string().contains("cut short"), "{err}");
    }
}
