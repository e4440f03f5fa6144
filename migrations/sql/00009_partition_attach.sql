-- Each known leaf partition's attachment: the xmin of the pg_inherits rows
-- from the leaf up to the joined table, which ATTACH PARTITION writes
-- anew. A leaf detached, changed and attached back between two partition
-- checks keeps its OID, parent and storage; its attachment tells it. NULL
-- for a leaf recorded before this column existed.

-- +goose Up
ALTER TABLE fkmat.partitions ADD COLUMN attached text;

-- +goose Down
ALTER TABLE fkmat.partitions DROP COLUMN attached;
