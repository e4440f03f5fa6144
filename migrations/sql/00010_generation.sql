-- The generation of a join's Redis state: its keys start with the join's
-- prefix for generation 0 and with the prefix and "~g<generation>" after.
-- A rebuild beside a running join (a changed definition, backfill --force)
-- builds generation + 1 while generation serves, and switches the join to
-- it in the transaction that swaps the rebuilt target in.

-- +goose Up
ALTER TABLE fkmat.join_state ADD COLUMN generation integer NOT NULL DEFAULT 0;

-- +goose Down
ALTER TABLE fkmat.join_state DROP COLUMN generation;
