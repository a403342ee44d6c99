-- dofs schema, migration 1. See dofs/DESIGN.md for the meaning of every
-- table and the invariants the code keeps between transactions.

-- Singleton counters: `rev` (latest committed rev, 0 before the first
-- mutation) and `prune_horizon` (every tombstone with rev <= it is gone).
CREATE TABLE meta (
    key   TEXT PRIMARY KEY,
    value INTEGER NOT NULL
) WITHOUT ROWID;
INSERT INTO meta (key, value) VALUES ('rev', 0), ('prune_horizon', 0);

-- Chunk store. A rowid table on purpose: rows carry up to 256 KiB of bytes,
-- which SQLite advises against in WITHOUT ROWID tables.
CREATE TABLE chunks (
    hash BLOB PRIMARY KEY CHECK (length(hash) = 32),
    size INTEGER NOT NULL CHECK (size >= 0),
    data BLOB NOT NULL
);

-- One row per distinct chunk list; `hash` is wsd_sync::manifest::hash of it.
CREATE TABLE manifests (
    hash        BLOB PRIMARY KEY CHECK (length(hash) = 32),
    size        INTEGER NOT NULL CHECK (size >= 0),
    chunk_count INTEGER NOT NULL CHECK (chunk_count >= 0)
) WITHOUT ROWID;

CREATE TABLE manifest_chunks (
    manifest BLOB NOT NULL REFERENCES manifests (hash) ON DELETE CASCADE,
    idx      INTEGER NOT NULL,
    chunk    BLOB NOT NULL REFERENCES chunks (hash),
    size     INTEGER NOT NULL CHECK (size > 0),
    PRIMARY KEY (manifest, idx)
) WITHOUT ROWID;
CREATE INDEX manifest_chunks_by_chunk ON manifest_chunks (chunk);

-- Per-remote watermarks. A row's existence registers the remote (it then
-- holds back tombstone pruning until its push cursor passes them).
CREATE TABLE remotes (
    name       TEXT PRIMARY KEY,
    push_rev   INTEGER NOT NULL DEFAULT 0 CHECK (push_rev >= 0),
    push_path  TEXT,
    fetch_rev  INTEGER NOT NULL DEFAULT 0 CHECK (fetch_rev >= 0),
    fetch_path TEXT
) WITHOUT ROWID;

-- The tree and the change index in one: one row per path, live or tombstone.
CREATE TABLE entries (
    path         TEXT NOT NULL PRIMARY KEY COLLATE BINARY,
    parent       TEXT NOT NULL COLLATE BINARY,
    rev          INTEGER NOT NULL CHECK (rev > 0),
    kind         TEXT NOT NULL CHECK (kind IN ('file', 'dir', 'symlink', 'delete')),
    mode         INTEGER CHECK (mode BETWEEN 0 AND 4095),
    mtime        INTEGER,
    size         INTEGER CHECK (size >= 0),
    target       TEXT,
    manifest     BLOB REFERENCES manifests (hash),
    applied_from TEXT REFERENCES remotes (name) ON DELETE SET NULL,
    CHECK ((kind = 'delete') = (mode IS NULL)),
    CHECK ((kind = 'delete') = (mtime IS NULL)),
    CHECK ((kind = 'file') = (manifest IS NOT NULL)),
    CHECK ((kind = 'file') = (size IS NOT NULL)),
    CHECK ((kind = 'symlink') = (target IS NOT NULL))
) WITHOUT ROWID;
CREATE INDEX entries_by_rev ON entries (rev, path);
CREATE INDEX entries_by_parent ON entries (parent, path) WHERE kind <> 'delete';
CREATE INDEX entries_by_manifest ON entries (manifest);
CREATE INDEX entries_by_applied_from ON entries (applied_from) WHERE applied_from IS NOT NULL;

-- Paths listed so far by the baseline a remote is streaming into us, and
-- the (rev, path) of the last entry marked (to notice a restarted baseline).
CREATE TABLE baseline_marks (
    remote TEXT NOT NULL,
    path   TEXT NOT NULL COLLATE BINARY,
    PRIMARY KEY (remote, path)
) WITHOUT ROWID;

CREATE TABLE baseline_progress (
    remote TEXT PRIMARY KEY,
    rev    INTEGER NOT NULL,
    path   TEXT NOT NULL
) WITHOUT ROWID;
