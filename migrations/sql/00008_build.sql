-- A rebuild in progress, per join: why it runs, how far it is. The process
-- that builds updates it every second; status shows it (with an ETA), and
-- shows a record that stopped moving as an interrupted rebuild. The
-- backfill's final transaction deletes it.

-- +goose Up
CREATE TABLE fkmat.build (
    slot        text        NOT NULL,
    join_name   text        NOT NULL,
    reason      text        NOT NULL,
    phase       text        NOT NULL,
    rows_done   bigint      NOT NULL DEFAULT 0,
    rows_total  bigint      NOT NULL DEFAULT 0,
    host        text        NOT NULL,
    pid         integer     NOT NULL,
    started_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (slot, join_name)
);

-- +goose Down
DROP TABLE fkmat.build;
