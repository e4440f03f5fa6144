-- The run that owns each slot's target commits: the fence between an old
-- daemon that comes back (a frozen host, a paused VM) and the one that took
-- its slot over. A run writes a new token here once its stream holds the
-- slot; every batch's commit checks it (FOR SHARE, so a takeover waits for
-- a commit in flight and a commit after the takeover is refused).

-- +goose Up
CREATE TABLE fkmat.owner (
    slot  text PRIMARY KEY,
    token text NOT NULL,
    host  text NOT NULL,
    pid   integer NOT NULL,
    since timestamptz NOT NULL DEFAULT now()
);

-- +goose Down
DROP TABLE fkmat.owner;
