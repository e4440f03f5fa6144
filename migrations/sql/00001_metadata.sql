-- fkmat's metadata in the target database.

-- +goose Up
-- One row per replication slot: the end LSN of the last source transaction
-- whose effect is committed in the target tables, written in the same target
-- transaction as the rows.
CREATE TABLE fkmat.checkpoint (
    slot        text        PRIMARY KEY,
    lsn         pg_lsn      NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- One row per maintained join.
CREATE TABLE fkmat.join_state (
    slot            text        NOT NULL,
    join_name       text        NOT NULL,
    -- Random id of the Redis state this target was built with. Redis holds
    -- the same value; a mismatch means the state was lost or is foreign.
    epoch           text        NOT NULL,
    -- Hash of the join definition the target was built for.
    fingerprint     text        NOT NULL,
    target_schema   text        NOT NULL,
    target_table    text        NOT NULL,
    -- 'backfilling' while an initial load runs, 'streaming' after it.
    phase           text        NOT NULL CHECK (phase IN ('backfilling', 'streaming')),
    -- The slot's consistent point the backfill snapshot corresponds to.
    consistent_lsn  pg_lsn,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (slot, join_name)
);

-- +goose Down
DROP TABLE fkmat.join_state;
DROP TABLE fkmat.checkpoint;
