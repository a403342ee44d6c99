//! Properties of every parser of untrusted input, over arbitrary bytes.
//! Shared by the `cargo fuzz` targets in `fuzz/` and the property-test
//! stand-in `tests/tests/it/parsers.rs` (which runs in CI). Each function
//! panics when a property fails; none may panic otherwise.

use wsd_sync::{ChangeEntry, ChunkRef, EntryState, Hash, IgnoreRules, SyncPath, manifest};

/// Path canonicalisation: `SyncPath::new` accepts only canonical paths and
/// keeps them byte for byte; `canonicalize` yields a canonical path that is
/// its own canonical form.
pub fn check_path(s: &str) {
    if let Ok(p) = SyncPath::new(s) {
        assert_eq!(p.as_str(), s);
        let c = SyncPath::canonicalize(s).expect("a canonical path canonicalizes");
        assert_eq!(c.as_str(), s, "canonicalize changed a canonical path");
        for a in p.ancestors() {
            SyncPath::new(a.as_str()).expect("ancestors are canonical");
        }
    }
    if let Ok(c) = SyncPath::canonicalize(s) {
        let again = SyncPath::new(c.as_str()).expect("canonicalize yields a canonical path");
        assert_eq!(again, c);
        assert_eq!(SyncPath::canonicalize(c.as_str()).unwrap(), c);
    }
}

/// Manifest decoding: whatever decodes re-encodes to the same bytes (the
/// encoding is canonical), and its hash is stable.
pub fn check_manifest(bytes: &[u8]) {
    if let Ok(chunks) = manifest::decode(bytes) {
        assert_eq!(
            manifest::encode(&chunks),
            bytes,
            "manifest encoding is not canonical"
        );
        assert_eq!(manifest::hash(&chunks), manifest::hash(&chunks));
    }
}

/// A small reader that turns fuzz bytes into field values.
struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn u8(&mut self) -> u8 {
        let (b, rest) = self
            .0
            .split_first()
            .map(|(b, r)| (*b, r))
            .unwrap_or((0, &[]));
        self.0 = rest;
        b
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }
    fn u64(&mut self) -> u64 {
        u64::from(self.u32()) | (u64::from(self.u32()) << 32)
    }
    fn text(&mut self) -> String {
        let n = usize::from(self.u8());
        let take = n.min(self.0.len());
        let (t, rest) = self.0.split_at(take);
        self.0 = rest;
        String::from_utf8_lossy(t).into_owned()
    }
}

/// `ChangeEntry::validate` on an entry built from arbitrary bytes (its path
/// taken as canonical only when `SyncPath::new` accepts it): never panics,
/// and an accepted file entry's size is the sum of its chunks.
pub fn check_entry(bytes: &[u8]) {
    let mut b = Bytes(bytes);
    let Ok(path) = SyncPath::new(b.text()) else {
        return;
    };
    let rev = b.u64();
    let state = match b.u8() % 4 {
        0 => {
            let mode = b.u32();
            let mtime = b.u64() as i64;
            let size = if b.u8() % 2 == 0 { None } else { Some(b.u64()) };
            let n = usize::from(b.u8() % 8);
            let chunks: Vec<ChunkRef> = (0..n)
                .map(|_| ChunkRef {
                    hash: Hash::from_slice(&[b.u8(); 32]).unwrap(),
                    size: b.u32() % (512 * 1024),
                })
                .collect();
            let sum = chunks.iter().map(|c| u64::from(c.size)).sum();
            EntryState::File {
                mode,
                mtime,
                size: size.unwrap_or(sum),
                chunks,
            }
        }
        1 => EntryState::Dir {
            mode: b.u32(),
            mtime: b.u64() as i64,
        },
        2 => EntryState::Symlink {
            target: b.text(),
            mode: b.u32(),
            mtime: b.u64() as i64,
        },
        _ => EntryState::Delete,
    };
    let e = ChangeEntry { rev, path, state };
    if e.validate().is_ok()
        && let EntryState::File { size, chunks, .. } = &e.state
    {
        let sum: u64 = chunks.iter().map(|c| u64::from(c.size)).sum();
        assert_eq!(
            *size, sum,
            "a file entry whose size is not its chunks' sum passed"
        );
        assert!(chunks.iter().all(|c| c.size > 0), "an empty chunk passed");
    }
}

/// Ignore rules from arbitrary patterns (one per line): building them never
/// panics, nor does matching canonical paths against them.
pub fn check_ignore(bytes: &[u8]) {
    let text = String::from_utf8_lossy(bytes);
    let patterns: Vec<&str> = text.lines().take(64).collect();
    if let Ok(rules) = IgnoreRules::new(&patterns) {
        for p in [
            "a",
            "a/b",
            "node_modules/x/y.js",
            ".wsd/index.sqlite3",
            "deep/er/path.o",
        ] {
            let p = SyncPath::new(p).unwrap();
            let _ = rules.is_ignored(&p, false);
            let _ = rules.is_ignored(&p, true);
            let _ = rules.is_ignored_any_kind(&p);
        }
    }
}

/// The server's decoding of every call's arguments from an arbitrary
/// Cap'n Proto message: never panics.
pub fn check_capnp_arguments(bytes: &[u8]) {
    let _ = wsd::rpc::fuzzing::decode_call_arguments(bytes);
}
