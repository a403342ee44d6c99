//! The pure protocol core shared by both sync peers.
//!
//! It defines what crosses the wire in domain terms ([`ChangeEntry`],
//! [`ChangeCursor`], [`Hash`]), how bytes are cut and named ([`chunk`]),
//! which paths are acceptable ([`SyncPath`]), which are ignored
//! ([`IgnoreRules`]), the [`Store`] trait a peer implements, the [`Remote`]
//! trait the driver talks to, and the push/pull [`driver`].
//!
//! It deliberately knows nothing of SQLite, sockets or Cap'n Proto: stores
//! live in `wsd-dofs` and `wsd`, the wire lives in `wsd-schema` and `wsd`.
//! CI checks that this crate never depends on `rusqlite` or `capnp`.
//!
//! The `testkit` feature (for dev-dependencies) adds [`testkit`]: the
//! `Store` contract as a conformance suite and a reference-model property
//! test that every store implementation runs, and the in-memory `MemStore`.

pub mod chunk;
mod cursor;
pub mod driver;
mod entry;
mod error;
mod hash;
mod ignore_rules;
pub mod limits;
pub mod manifest;
mod path;
pub mod plan;
mod remote;
mod store;
#[cfg(feature = "testkit")]
pub mod testkit;

pub use cursor::ChangeCursor;
pub use entry::{ChangeEntry, ChunkRef, EntryState, Kind, MODE_MASK};
pub use error::{ErrorCode, SyncError};
pub use hash::Hash;
pub use ignore_rules::{CONFLICT_COPY_MARKER, CONFLICT_COPY_PATTERN, IgnoreRules};
pub use path::SyncPath;
pub use remote::{
    ChangeStream, FetchOpened, Object, PendingProbe, PendingPush, PendingUpload, PushOutcome,
    Remote,
};
pub use store::{
    ApplyBatch, ApplyOutcome, Baseline, ChangesQuery, ChangesWindow, ObjectReader, Store,
    Watermarks,
};
