-- dofs schema, migration 3: snapshots. A snapshot is the live tree's rows
-- copied at one rev (`snapshot_entries`), referencing the same manifests
-- and chunks as the tree: no bytes are copied, and those manifests and
-- chunks stay held while the snapshot exists (garbage collection roots).

CREATE TABLE snapshots (
    id         TEXT PRIMARY KEY,
    rev        INTEGER NOT NULL CHECK (rev >= 0),
    created_at INTEGER NOT NULL
) WITHOUT ROWID;

CREATE TABLE snapshot_entries (
    snapshot TEXT NOT NULL REFERENCES snapshots (id) ON DELETE CASCADE,
    path     TEXT NOT NULL COLLATE BINARY,
    parent   TEXT NOT NULL COLLATE BINARY,
    kind     TEXT NOT NULL CHECK (kind IN ('file', 'dir', 'symlink')),
    mode     INTEGER NOT NULL CHECK (mode BETWEEN 0 AND 4095),
    mtime    INTEGER NOT NULL,
    size     INTEGER CHECK (size >= 0),
    target   TEXT,
    manifest BLOB CHECK (manifest IS NULL OR length(manifest) = 32),
    chunk    BLOB CHECK (chunk IS NULL OR length(chunk) = 32),
    CHECK ((kind = 'file') = (manifest IS NOT NULL)),
    CHECK ((kind = 'file') = (size IS NOT NULL)),
    CHECK ((kind = 'symlink') = (target IS NOT NULL)),
    PRIMARY KEY (snapshot, path)
) WITHOUT ROWID;
