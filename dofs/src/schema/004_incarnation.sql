-- dofs schema, migration 4: a random `incarnation` in `meta`, drawn once
-- when the database is created (or first migrated). A change cursor names
-- the incarnation it was read from, so a cursor from a re-created or
-- replaced store is told apart from one of this store.

INSERT INTO meta (key, value) VALUES ('incarnation', random() & 9223372036854775807);
