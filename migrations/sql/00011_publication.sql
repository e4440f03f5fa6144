-- The publication each join's slot streams from: with the slot and the
-- target, what a configuration file owns. check, backfill and run refuse a
-- file whose slot, publication or target belongs to joins it does not
-- define (owners.go). NULL for a join recorded before this column, until
-- run records it.

-- +goose Up
ALTER TABLE fkmat.join_state ADD COLUMN publication text;

-- +goose Down
ALTER TABLE fkmat.join_state DROP COLUMN publication;
