-- The stall a daemon reports: the same error recurring at the same source
-- position after restarts. fkmat status shows it; the row is deleted when
-- the pipeline moves again.

-- +goose Up
CREATE TABLE fkmat.stall (
    slot         text        PRIMARY KEY,
    -- Where the pipeline restarts from (the older checkpoint).
    restart_lsn  pg_lsn      NOT NULL,
    -- Commit LSN of the failing source transaction, when known.
    lsn          pg_lsn,
    join_name    text        NOT NULL,
    table_name   text        NOT NULL,
    key_columns  text        NOT NULL,
    -- The error; never row values.
    error        text        NOT NULL,
    recurrences  integer     NOT NULL,
    since        timestamptz NOT NULL,
    updated_at   timestamptz NOT NULL DEFAULT now()
);

-- +goose Down
DROP TABLE fkmat.stall;
