-- dofs schema, migration 6: where an object store keeps a stub's chunk
-- when it is not an object of its own but a byte range of a pack (many
-- chunks in one object; `src/pack.rs`): the pack's id and the chunk's
-- offset in it (its length is `size`). NULL for chunks held here and for
-- stubs stored as objects of their own (before packs, or alone).

ALTER TABLE chunks ADD COLUMN pack BLOB CHECK (pack IS NULL OR length(pack) = 32);
ALTER TABLE chunks ADD COLUMN pack_offset INTEGER CHECK (pack_offset IS NULL OR pack_offset >= 0);
