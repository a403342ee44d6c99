//! Content-defined chunking (FastCDC, 2020 variant) and SHA-256 naming.
//!
//! Size parameters were chosen by measurement on the 2-core reference machine
//! (`shared/reference/peers-and-limits.md` §C.2, 1 GiB of random data): with
//! 16/64/256 KiB the cutter runs at 2.9 GB/s and the cut+hash pipeline at
//! 1.1 GB/s per core, the same as 64/256/1024 KiB, while 4/16/64 KiB gives
//! four times the chunks (more index rows and probe traffic) for no speed
//! gain. A 100-byte insert in a large file rewrites about two chunks
//! (≈ 2 × 78 KiB mean on random data). `bench/` re-measures these figures.

use std::io::Read;

use fastcdc::v2020::FastCDC;

use crate::{ChunkRef, Hash, SyncError};

/// Smallest chunk the cutter emits (except a file's last chunk).
pub const MIN_CHUNK: usize = 16 * 1024;
/// Target mean chunk size.
pub const AVG_CHUNK: usize = 64 * 1024;
/// Largest chunk; also the largest object accepted over the wire.
pub const MAX_CHUNK: usize = 256 * 1024;
/// Read window of the streaming chunker: large enough that the per-window
/// carry-over copy of at most one chunk is noise.
const READ_WINDOW: usize = 4 * 1024 * 1024;

fn cutter(data: &[u8]) -> FastCDC<'_> {
    FastCDC::new(data, MIN_CHUNK, AVG_CHUNK, MAX_CHUNK)
}

/// Cuts `data` and returns each chunk's `(offset, ChunkRef)`.
pub fn chunk_slice(data: &[u8]) -> Vec<(usize, ChunkRef)> {
    cutter(data)
        .map(|c| {
            let bytes = &data[c.offset..c.offset + c.length];
            (
                c.offset,
                ChunkRef {
                    hash: Hash::of(bytes),
                    size: c.length as u32,
                },
            )
        })
        .collect()
}

/// Cuts everything `reader` yields, calling `on_chunk` with each chunk's
/// reference and bytes in order, and returns the chunk list. Memory stays at
/// one read window whatever the input size. Cut points are identical to
/// [`chunk_slice`] over the same bytes.
pub fn chunk_reader<R: Read>(
    reader: R,
    on_chunk: impl FnMut(&ChunkRef, &[u8]) -> Result<(), SyncError>,
) -> Result<Vec<ChunkRef>, SyncError> {
    chunk_reader_with(reader, &mut Vec::new(), None, on_chunk)
}

/// [`chunk_reader`] with a caller-owned buffer, reused across calls (a
/// settle chunks thousands of small files; allocating and faulting in a
/// fresh read window per file cost more than hashing them). `size_hint`
/// (the file's size from `stat`) sizes the buffer for a small input, so a
/// 2 KiB file touches 2 KiB of buffer, not [`READ_WINDOW`]; the input may
/// still be longer or shorter than the hint.
pub fn chunk_reader_with<R: Read>(
    mut reader: R,
    buf: &mut Vec<u8>,
    size_hint: Option<u64>,
    mut on_chunk: impl FnMut(&ChunkRef, &[u8]) -> Result<(), SyncError>,
) -> Result<Vec<ChunkRef>, SyncError> {
    // One byte more than the hint, so a file that is exactly the hinted
    // size is known to be complete when that byte is not filled.
    let want = size_hint
        .map(|h| (h as usize).saturating_add(1).clamp(MIN_CHUNK, READ_WINDOW))
        .unwrap_or(READ_WINDOW);
    if buf.len() < want {
        buf.resize(want, 0);
    }
    let mut window = want;
    let mut filled = 0usize;
    let mut eof = false;
    let mut out = Vec::new();
    loop {
        while !eof && filled < window {
            match reader.read(&mut buf[filled..window]) {
                Ok(0) => eof = true,
                Ok(n) => filled += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(SyncError::io("reading input to chunk", e)),
            }
        }
        if filled == 0 {
            return Ok(out);
        }
        // The last cut of a non-final window may be forced by the window end,
        // so it is carried into the next window instead of emitted.
        let mut consumed = 0usize;
        for c in cutter(&buf[..filled]) {
            let end = c.offset + c.length;
            if !eof && end == filled {
                break;
            }
            let bytes = &buf[c.offset..end];
            let r = ChunkRef {
                hash: Hash::of(bytes),
                size: c.length as u32,
            };
            on_chunk(&r, bytes)?;
            out.push(r);
            consumed = end;
        }
        if eof && consumed == filled {
            return Ok(out);
        }
        buf.copy_within(consumed..filled, 0);
        filled -= consumed;
        // The input outgrew its hint: continue with the full window.
        if window < READ_WINDOW {
            window = READ_WINDOW;
            if buf.len() < window {
                buf.resize(window, 0);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pseudo_random(len: usize, seed: u64) -> Vec<u8> {
        let mut x = seed | 1;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    #[test]
    fn streaming_cuts_match_slice_cuts() {
        let data = pseudo_random(11 * 1024 * 1024 + 123, 7);
        let a: Vec<ChunkRef> = chunk_slice(&data).into_iter().map(|(_, c)| c).collect();
        let mut seen = 0usize;
        let b = chunk_reader(&data[..], |c, bytes| {
            assert_eq!(c.size as usize, bytes.len());
            seen += bytes.len();
            Ok(())
        })
        .unwrap();
        assert_eq!(a, b);
        assert_eq!(seen, data.len());
    }

    #[test]
    fn a_reused_buffer_and_a_wrong_hint_cut_the_same() {
        let mut buf = Vec::new();
        for (len, hint) in [
            (5 * 1024 * 1024 + 7, Some(10)),
            (100, Some(100)),
            (100, Some(5_000_000)),
            (300 * 1024, Some(300 * 1024)),
            (9 * 1024 * 1024, None),
            (0, Some(0)),
        ] {
            let data = pseudo_random(len, len as u64);
            let a: Vec<ChunkRef> = chunk_slice(&data).into_iter().map(|(_, c)| c).collect();
            let b = chunk_reader_with(&data[..], &mut buf, hint, |_, _| Ok(())).unwrap();
            assert_eq!(a, b, "len {len} hint {hint:?}");
        }
    }

    #[test]
    fn chunks_respect_the_size_bounds() {
        let data = pseudo_random(4 * 1024 * 1024, 3);
        let chunks = chunk_slice(&data);
        for (i, (_, c)) in chunks.iter().enumerate() {
            assert!(c.size as usize <= MAX_CHUNK);
            if i + 1 < chunks.len() {
                assert!(c.size as usize >= MIN_CHUNK);
            }
        }
    }

    #[test]
    fn an_insert_mid_file_changes_only_nearby_chunks() {
        let data = pseudo_random(8 * 1024 * 1024, 11);
        let mut edited = data.clone();
        edited.splice(
            4 * 1024 * 1024..4 * 1024 * 1024,
            b"inserted".iter().copied(),
        );
        let before: std::collections::HashSet<_> = chunk_slice(&data)
            .into_iter()
            .map(|(_, c)| c.hash)
            .collect();
        let changed: usize = chunk_slice(&edited)
            .into_iter()
            .filter(|(_, c)| !before.contains(&c.hash))
            .map(|(_, c)| c.size as usize)
            .sum();
        assert!(
            changed <= 2 * MAX_CHUNK,
            "{changed} new bytes after an 8-byte insert"
        );
    }

    #[test]
    fn empty_input_has_no_chunks() {
        assert!(chunk_slice(&[]).is_empty());
        assert!(chunk_reader(&[][..], |_, _| Ok(())).unwrap().is_empty());
    }
}
