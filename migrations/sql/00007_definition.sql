-- The definition each join's target was built for (its tables, keys,
-- columns and their types), whose hash is join_state.fingerprint: with it,
-- run tells a widened column type (int to bigint, varchar(10) to text),
-- which it follows by widening the target column, from any other change of
-- the definition. NULL for a join built before this column existed until
-- run records it. widened_lsn is the source WAL position (read when run
-- followed the last widening) before which changes may still carry the
-- narrower type.

-- +goose Up
ALTER TABLE fkmat.join_state ADD COLUMN definition jsonb, ADD COLUMN widened_lsn pg_lsn;

-- +goose Down
ALTER TABLE fkmat.join_state DROP COLUMN definition, DROP COLUMN widened_lsn;
