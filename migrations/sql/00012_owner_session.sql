-- The application_name of the owning run's sessions ("fkmat <session>"):
-- a run that takes the slot over ends the sessions of the one it fenced
-- (a frozen process may hold locks its successor's writes wait for).

-- +goose Up
ALTER TABLE fkmat.owner ADD COLUMN session text;

-- +goose Down
ALTER TABLE fkmat.owner DROP COLUMN session;
