//! Documented limits of the protocol. Every one is enforced by the receiving
//! side with [`crate::SyncError::Limit`] (`ELIMIT`), naming the limit.

/// Longest canonical path, in bytes of UTF-8.
pub const MAX_PATH_BYTES: usize = 4096;
/// Longest single path segment, in bytes (the common `NAME_MAX`).
pub const MAX_SEGMENT_BYTES: usize = 255;
/// Deepest path, in segments.
pub const MAX_PATH_DEPTH: usize = 256;
/// Longest symlink target, in bytes.
pub const MAX_SYMLINK_TARGET_BYTES: usize = 4096;
/// Entries the driver puts in one batch (push or pull).
pub const BATCH_ENTRIES: usize = 256;
/// Bytes of missing chunk data the driver moves per batch of objects.
pub const BATCH_OBJECT_BYTES: usize = 4 * 1024 * 1024;
/// Most entries one `push` call may carry.
pub const MAX_PUSH_ENTRIES: usize = 4096;
/// Most hashes one `hasObjects` or `fetchObjects` call may carry.
pub const MAX_HASHES_PER_CALL: usize = 16_384;
/// Most chunks one file entry may list (1 TiB at the maximum chunk size).
pub const MAX_CHUNKS_PER_FILE: usize = 4 * 1024 * 1024;
/// Most ignore patterns one `fetchChanges` call may carry.
pub const MAX_IGNORE_PATTERNS: usize = 1024;
/// Longest single ignore pattern, in bytes (a pattern is a path glob).
pub const MAX_IGNORE_PATTERN_BYTES: usize = MAX_PATH_BYTES;
/// Most bytes all ignore patterns of one set may take together: every
/// entry point compiles them (once per push batch on the daemon).
pub const MAX_IGNORE_TOTAL_BYTES: usize = 64 * 1024;
