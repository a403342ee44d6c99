-- dofs schema, migration 2: a file of exactly one chunk names that chunk in
-- its `entries` row (`chunk`) instead of through a `manifests` row and a
-- `manifest_chunks` row. Those two tables and their indexes are keyed by
-- random hashes, so every small file written dirtied a random leaf in each
-- (see dofs/DESIGN.md, "Why single-chunk files skip the manifest tables").
-- `entries.manifest` stays the file's manifest hash (its content identity)
-- but no longer references `manifests`, and `entries_by_manifest`, which
-- existed for that foreign key, goes: garbage collection is set-based.

CREATE TABLE entries_v2 (
    path         TEXT NOT NULL PRIMARY KEY COLLATE BINARY,
    parent       TEXT NOT NULL COLLATE BINARY,
    rev          INTEGER NOT NULL CHECK (rev > 0),
    kind         TEXT NOT NULL CHECK (kind IN ('file', 'dir', 'symlink', 'delete')),
    mode         INTEGER CHECK (mode BETWEEN 0 AND 4095),
    mtime        INTEGER,
    size         INTEGER CHECK (size >= 0),
    target       TEXT,
    manifest     BLOB CHECK (manifest IS NULL OR length(manifest) = 32),
    applied_from TEXT REFERENCES remotes (name) ON DELETE SET NULL,
    chunk        BLOB CHECK (chunk IS NULL OR (kind = 'file' AND length(chunk) = 32)),
    CHECK ((kind = 'delete') = (mode IS NULL)),
    CHECK ((kind = 'delete') = (mtime IS NULL)),
    CHECK ((kind = 'file') = (manifest IS NOT NULL)),
    CHECK ((kind = 'file') = (size IS NOT NULL)),
    CHECK ((kind = 'symlink') = (target IS NOT NULL))
) WITHOUT ROWID;

INSERT INTO entries_v2
    (path, parent, rev, kind, mode, mtime, size, target, manifest, applied_from, chunk)
SELECT e.path, e.parent, e.rev, e.kind, e.mode, e.mtime, e.size, e.target, e.manifest,
       e.applied_from,
       (SELECT mc.chunk FROM manifests m JOIN manifest_chunks mc ON mc.manifest = m.hash
         WHERE m.hash = e.manifest AND m.chunk_count = 1 AND mc.idx = 0)
FROM entries e;

DROP TABLE entries;
ALTER TABLE entries_v2 RENAME TO entries;
CREATE INDEX entries_by_rev ON entries (rev, path);
CREATE INDEX entries_by_parent ON entries (parent, path) WHERE kind <> 'delete';
CREATE INDEX entries_by_applied_from ON entries (applied_from) WHERE applied_from IS NOT NULL;

-- One-chunk lists are now never stored as manifests (their chunks stay:
-- the entries rows name them). Cascades to their `manifest_chunks` rows.
DELETE FROM manifests WHERE chunk_count = 1;
