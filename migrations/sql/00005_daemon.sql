-- The daemon streaming from each slot, as it last reported itself (every
-- 10 s while streaming): which fkmat, where, and how far behind. fkmat
-- status reads it to tell a slot nobody streams from, and how long.

-- +goose Up
CREATE TABLE fkmat.daemon (
    slot             text PRIMARY KEY,
    host             text NOT NULL,
    pid              integer NOT NULL,
    version          text NOT NULL,
    started_at       timestamptz NOT NULL,
    heartbeat_at     timestamptz NOT NULL,
    -- Seconds behind the source (0 without a backlog), and the source
    -- commit time of the last applied transaction.
    lag_seconds      double precision NOT NULL DEFAULT 0,
    last_commit_time timestamptz
);

-- +goose Down
DROP TABLE fkmat.daemon;
