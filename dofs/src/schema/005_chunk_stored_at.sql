-- dofs schema, migration 5: `chunks.stored_at`, when a chunk was last
-- stored or found present by a sync probe (ms since the Unix epoch; 0 for
-- chunks stored before this migration). Garbage collection spares every
-- chunk stored after its cutoff (the grace window), so a push that staged
-- or probed a chunk and has not yet applied the entry naming it cannot
-- lose it to a collection in between. Added last in the row, so the
-- in-place touch of a large chunk rewrites only its final page.

ALTER TABLE chunks ADD COLUMN stored_at INTEGER NOT NULL DEFAULT 0;
