-- The generation of a join's Redis state: its keys start with the join's
-- prefix for generation 0 and with the prefix and "~g<generation>" after.
-- A rebuild beside a running join (a changed definition, backfill --force)
-- builds generation + 1 while generation serves, and switches the join to
-- it in the transaction that swaps the rebuilt target in.
--
-- frozen_lsn, when set, says the join's target and state are not maintained
-- from that position of the slot on, until such a rebuild switches in: the
-- source no longer has what the definition they were built with reads (a
-- column renamed or retyped). The slot is not confirmed past it meanwhile.

-- +goose Up
ALTER TABLE fkmat.join_state ADD COLUMN generation integer NOT NULL DEFAULT 0,
    ADD COLUMN frozen_lsn pg_lsn;

-- +goose Down
ALTER TABLE fkmat.join_state DROP COLUMN generation, DROP COLUMN frozen_lsn;
