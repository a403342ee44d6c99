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

/// A chunk of an earlier version of a file, with a fingerprint of its bytes
/// that is cheaper to compute than their SHA-256 and as collision
/// resistant (the caller's choice, e.g. BLAKE3): equal fingerprints stand
/// for equal bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KnownChunk<F> {
    pub chunk: ChunkRef,
    pub fingerprint: F,
}

/// How much input [`rechunk_reader_with`] looks at from a chunk's start:
/// a chunk of the previous version and the one after it (the cutter's
/// decision at a chunk's end reads the byte after it).
const LOOK_AHEAD: usize = 2 * MAX_CHUNK + 1;

/// A read window over `reader` that keeps at least what is asked for ahead
/// of its position, refilling in [`READ_WINDOW`]s.
struct Window<'b, R> {
    reader: R,
    buf: &'b mut Vec<u8>,
    start: usize,
    end: usize,
    eof: bool,
}

impl<R: Read> Window<'_, R> {
    /// The input from the position on: at least `want` bytes unless it
    /// ends sooner.
    fn ahead(&mut self, want: usize) -> Result<&[u8], SyncError> {
        if self.end - self.start < want && !self.eof {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
            let size = READ_WINDOW.max(want);
            if self.buf.len() < size {
                self.buf.resize(size, 0);
            }
            while !self.eof && self.end < self.buf.len() {
                match self.reader.read(&mut self.buf[self.end..]) {
                    Ok(0) => self.eof = true,
                    Ok(n) => self.end += n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(SyncError::io("reading input to chunk", e)),
                }
            }
        }
        Ok(&self.buf[self.start..self.end])
    }

    fn advance(&mut self, n: usize) {
        self.start += n;
    }
}

/// Cuts what `reader` yields exactly as [`chunk_reader_with`] does (the
/// same cut points and references), knowing `previous`, the chunk list of
/// an earlier version of the same input: a stretch that still holds the
/// earlier version's chunks in order is taken chunk by chunk after
/// checking only each one's fingerprint, so neither the cutter nor SHA-256
/// runs over bytes that did not change; a chunk the cutter finds elsewhere
/// whose fingerprint is known takes its reference without SHA-256. Returns
/// each chunk with its fingerprint (`fingerprint` of its bytes).
///
/// `previous` must be what this module cut from the earlier version (and
/// fingerprinted from those bytes): a chunk is then a function of the bytes
/// from its start, so an earlier chunk found at the same place with the
/// same bytes is the cut the cutter would make. It is taken without the
/// cutter only when the chunk after it follows too (the cut reads the byte
/// after a chunk) and both versions go on for more than [`MAX_CHUNK`]
/// beyond its start (near the end the cutter's rules depend on how much is
/// left); anywhere else the cutter runs. A list that does not fit the input
/// (another file's, sizes off) only costs fingerprints.
pub fn rechunk_reader_with<R: Read, F: Copy + Eq + std::hash::Hash>(
    reader: R,
    buf: &mut Vec<u8>,
    previous: &[KnownChunk<F>],
    fingerprint: impl Fn(&[u8]) -> F,
) -> Result<Vec<(ChunkRef, F)>, SyncError> {
    // Where each earlier chunk started, and how much of that version
    // followed it.
    let mut starts = Vec::with_capacity(previous.len());
    let mut total = 0u64;
    for k in previous {
        starts.push(total);
        total += u64::from(k.chunk.size);
    }
    let by_fingerprint: std::collections::HashMap<F, usize> = previous
        .iter()
        .enumerate()
        .map(|(i, k)| (k.fingerprint, i))
        .collect();
    let mut window = Window {
        reader,
        buf,
        start: 0,
        end: 0,
        eof: false,
    };
    let mut out = Vec::new();
    // The earlier chunk expected at the position, and whether its
    // fingerprint was already checked there (as the one after the last).
    let mut expected: Option<usize> = (!previous.is_empty()).then_some(0);
    let mut checked: Option<usize> = None;
    loop {
        let ahead = window.ahead(LOOK_AHEAD)?;
        if ahead.is_empty() {
            return Ok(out);
        }
        if let Some(j) = expected
            && let Some(next) = previous.get(j + 1)
            && ahead.len() > MAX_CHUNK
            && total - starts[j] > MAX_CHUNK as u64
        {
            let len = previous[j].chunk.size as usize;
            let next_len = next.chunk.size as usize;
            if ahead.len() >= len + next_len
                && (checked == Some(j) || fingerprint(&ahead[..len]) == previous[j].fingerprint)
                && fingerprint(&ahead[len..len + next_len]) == next.fingerprint
            {
                out.push((previous[j].chunk, previous[j].fingerprint));
                window.advance(len);
                expected = Some(j + 1);
                checked = Some(j + 1);
                continue;
            }
        }
        let cut = cutter(ahead).next().map_or(ahead.len(), |c| c.length);
        let bytes = &ahead[..cut];
        let print = fingerprint(bytes);
        let known = by_fingerprint
            .get(&print)
            .copied()
            .filter(|&k| previous[k].chunk.size as usize == cut);
        let chunk = match known {
            Some(k) => previous[k].chunk,
            None => ChunkRef {
                hash: Hash::of(bytes),
                size: cut as u32,
            },
        };
        expected = known.map(|k| k + 1);
        checked = None;
        out.push((chunk, print));
        window.advance(cut);
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

    /// The earlier version's chunks as [`rechunk_reader_with`] takes them,
    /// fingerprinted by SHA-256 itself (any collision-resistant hash does).
    fn known(data: &[u8]) -> Vec<KnownChunk<Hash>> {
        chunk_slice(data)
            .into_iter()
            .map(|(_, c)| KnownChunk {
                chunk: c,
                fingerprint: c.hash,
            })
            .collect()
    }

    #[test]
    fn rechunking_with_an_earlier_version_cuts_as_chunking_from_scratch() {
        let base = pseudo_random(3 * 1024 * 1024 + 333, 21);
        let mut buf = Vec::new();
        let mut edits: Vec<(&str, Vec<u8>)> = vec![("unchanged", base.clone())];
        let mut insert = base.clone();
        insert.splice(1_500_000..1_500_000, pseudo_random(100, 1));
        edits.push(("100 bytes inserted", insert));
        let mut overwrite = base.clone();
        overwrite[2_000_000..2_000_050].copy_from_slice(&pseudo_random(50, 2));
        edits.push(("50 bytes overwritten", overwrite));
        let mut head = base.clone();
        head.drain(..10);
        edits.push(("10 bytes cut from the head", head));
        let mut tail = base.clone();
        tail.truncate(base.len() - 300_000);
        edits.push(("truncated", tail));
        let mut appended = base.clone();
        appended.extend(pseudo_random(700_000, 3));
        edits.push(("appended", appended));
        edits.push(("rewritten", pseudo_random(base.len(), 4)));
        edits.push(("emptied", Vec::new()));
        edits.push(("a tail only", base[base.len() - 1000..].to_vec()));
        for (what, data) in &edits {
            let want = chunk_slice(data);
            let got = rechunk_reader_with(&data[..], &mut buf, &known(&base), Hash::of).unwrap();
            let cuts: Vec<ChunkRef> = got.iter().map(|(c, _)| *c).collect();
            let want_cuts: Vec<ChunkRef> = want.iter().map(|(_, c)| *c).collect();
            assert_eq!(cuts, want_cuts, "{what}");
            assert!(
                got.iter().all(|(c, f)| c.hash == *f),
                "{what}: fingerprints"
            );
        }
    }

    #[test]
    fn rechunking_with_a_wrong_or_foreign_previous_list_still_cuts_right() {
        let data = pseudo_random(2 * 1024 * 1024 + 5, 31);
        let other = pseudo_random(2 * 1024 * 1024, 32);
        let mut lying = known(&data);
        // A list whose sizes are off by one everywhere, and another file's.
        for k in &mut lying {
            k.chunk.size += 1;
        }
        let want: Vec<ChunkRef> = chunk_slice(&data).into_iter().map(|(_, c)| c).collect();
        for previous in [lying, known(&other), Vec::new()] {
            let got = rechunk_reader_with(&data[..], &mut Vec::new(), &previous, Hash::of).unwrap();
            let got: Vec<ChunkRef> = got.into_iter().map(|(c, _)| c).collect();
            assert_eq!(got, want);
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(16))]
        #[test]
        fn rechunking_any_edit_matches_chunking_from_scratch(
            len in 0usize..1_100_000,
            seed in 1u64..1000,
            at in 0.0f64..1.0,
            remove in 0usize..5000,
            insert in 0usize..5000,
        ) {
            let base = pseudo_random(len, seed);
            let at = (len as f64 * at) as usize;
            let mut edited = base.clone();
            let end = (at + remove).min(len);
            edited.splice(at..end, pseudo_random(insert, seed + 7));
            let want: Vec<ChunkRef> = chunk_slice(&edited).into_iter().map(|(_, c)| c).collect();
            let got = rechunk_reader_with(&edited[..], &mut Vec::new(), &known(&base), Hash::of).unwrap();
            let got: Vec<ChunkRef> = got.into_iter().map(|(c, _)| c).collect();
            proptest::prop_assert_eq!(got, want);
        }
    }

    #[test]
    fn empty_input_has_no_chunks() {
        assert!(chunk_slice(&[]).is_empty());
        assert!(chunk_reader(&[][..], |_, _| Ok(())).unwrap().is_empty());
    }
}
