use crate::limits::{MAX_CHUNKS_PER_FILE, MAX_SYMLINK_TARGET_BYTES};
use crate::{Hash, SyncError, SyncPath, chunk};

/// Permission bits carried on the wire: rwx for all three classes plus
/// setuid, setgid and sticky.
pub const MODE_MASK: u32 = 0o7777;

/// One chunk of a file: its SHA-256 and its length in bytes.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct ChunkRef {
    pub hash: Hash,
    pub size: u32,
}

/// The kind of a live node.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Kind {
    File,
    Dir,
    Symlink,
}

/// The final state of one path. `mtime` is milliseconds since the Unix epoch.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum EntryState {
    File {
        mode: u32,
        mtime: i64,
        size: u64,
        chunks: Vec<ChunkRef>,
    },
    Dir {
        mode: u32,
        mtime: i64,
    },
    Symlink {
        target: String,
        mode: u32,
        mtime: i64,
    },
    /// A tombstone: the path does not exist (any more).
    Delete,
}

/// One coalesced change: `path`'s state now, stamped with the sender's `rev`.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct ChangeEntry {
    pub rev: u64,
    pub path: SyncPath,
    pub state: EntryState,
}

impl EntryState {
    pub fn kind(&self) -> Option<Kind> {
        match self {
            EntryState::File { .. } => Some(Kind::File),
            EntryState::Dir { .. } => Some(Kind::Dir),
            EntryState::Symlink { .. } => Some(Kind::Symlink),
            EntryState::Delete => None,
        }
    }

    pub fn mode(&self) -> Option<u32> {
        match self {
            EntryState::File { mode, .. }
            | EntryState::Dir { mode, .. }
            | EntryState::Symlink { mode, .. } => Some(*mode),
            EntryState::Delete => None,
        }
    }

    /// The idempotence comparison of rule 4: same kind, same mode, same
    /// content (chunk list) and same symlink target. mtime never counts.
    pub fn same_content(&self, other: &EntryState) -> bool {
        match (self, other) {
            (
                EntryState::File {
                    mode: m1,
                    chunks: c1,
                    ..
                },
                EntryState::File {
                    mode: m2,
                    chunks: c2,
                    ..
                },
            ) => m1 == m2 && c1 == c2,
            (EntryState::Dir { mode: m1, .. }, EntryState::Dir { mode: m2, .. }) => m1 == m2,
            (
                EntryState::Symlink {
                    target: t1,
                    mode: m1,
                    ..
                },
                EntryState::Symlink {
                    target: t2,
                    mode: m2,
                    ..
                },
            ) => t1 == t2 && m1 == m2,
            (EntryState::Delete, EntryState::Delete) => true,
            _ => false,
        }
    }
}

impl ChangeEntry {
    /// Checks everything a receiver must check before trusting an entry from
    /// the wire: canonical path (already guaranteed by [`SyncPath`]), mode
    /// within [`MODE_MASK`], chunk sizes within the chunker's bounds, `size`
    /// equal to the sum of chunk sizes, a non-empty NUL-free symlink target.
    pub fn validate(&self) -> Result<(), SyncError> {
        let path = self.path.as_str();
        if let Some(mode) = self.state.mode()
            && mode & !MODE_MASK != 0
        {
            return Err(SyncError::Invalid(format!(
                "{path}: mode {mode:o} has bits outside 7777"
            )));
        }
        match &self.state {
            EntryState::File { size, chunks, .. } => {
                SyncError::check_limit("chunks per file", MAX_CHUNKS_PER_FILE, chunks.len())?;
                let mut total = 0u64;
                for c in chunks {
                    if c.size == 0 || c.size as usize > chunk::MAX_CHUNK {
                        return Err(SyncError::Invalid(format!(
                            "{path}: chunk {} has size {} (allowed 1..={})",
                            c.hash,
                            c.size,
                            chunk::MAX_CHUNK
                        )));
                    }
                    total += u64::from(c.size);
                }
                if total != *size {
                    return Err(SyncError::Invalid(format!(
                        "{path}: size {size} does not equal the sum of its chunks ({total})"
                    )));
                }
            }
            EntryState::Symlink { target, .. } => {
                if target.is_empty() || target.contains('\0') {
                    return Err(SyncError::Invalid(format!(
                        "{path}: symlink target is empty or contains NUL"
                    )));
                }
                SyncError::check_limit(
                    "symlink target length (bytes)",
                    MAX_SYMLINK_TARGET_BYTES,
                    target.len(),
                )?;
            }
            EntryState::Dir { .. } | EntryState::Delete => {}
        }
        Ok(())
    }

    /// The chunk list of a file entry; empty for every other kind.
    pub fn chunks(&self) -> &[ChunkRef] {
        match &self.state {
            EntryState::File { chunks, .. } => chunks,
            _ => &[],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(mode: u32, chunks: Vec<ChunkRef>) -> EntryState {
        let size = chunks.iter().map(|c| u64::from(c.size)).sum();
        EntryState::File {
            mode,
            mtime: 1,
            size,
            chunks,
        }
    }

    #[test]
    fn a_mode_only_change_is_not_the_same_content() {
        let c = vec![ChunkRef {
            hash: Hash::of(b"x"),
            size: 1,
        }];
        assert!(!file(0o644, c.clone()).same_content(&file(0o755, c.clone())));
        assert!(file(0o644, c.clone()).same_content(&file(0o644, c)));
    }

    #[test]
    fn mtime_alone_does_not_make_a_directory_differ() {
        let a = EntryState::Dir {
            mode: 0o755,
            mtime: 1,
        };
        let b = EntryState::Dir {
            mode: 0o755,
            mtime: 999,
        };
        assert!(a.same_content(&b));
    }

    #[test]
    fn validate_rejects_a_size_that_disagrees_with_the_chunks() {
        let e = ChangeEntry {
            rev: 1,
            path: SyncPath::new("f").unwrap(),
            state: EntryState::File {
                mode: 0o644,
                mtime: 0,
                size: 5,
                chunks: vec![ChunkRef {
                    hash: Hash::of(b"x"),
                    size: 1,
                }],
            },
        };
        assert_eq!(e.validate().unwrap_err().code(), crate::ErrorCode::Invalid);
    }

    #[test]
    fn validate_rejects_oversized_chunks_and_bad_modes() {
        let big = ChunkRef {
            hash: Hash::of(b"x"),
            size: chunk::MAX_CHUNK as u32 + 1,
        };
        let e = ChangeEntry {
            rev: 1,
            path: SyncPath::new("f").unwrap(),
            state: file(0o644, vec![big]),
        };
        assert!(e.validate().is_err());
        let e = ChangeEntry {
            rev: 1,
            path: SyncPath::new("d").unwrap(),
            state: EntryState::Dir {
                mode: 0o40755,
                mtime: 0,
            },
        };
        assert!(e.validate().is_err());
    }
}
