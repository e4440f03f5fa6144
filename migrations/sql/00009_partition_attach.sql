-- Each known leaf partition's attachment: the xmin of the pg_inherits rows
-- from the leaf up to the joined table, which ATTACH PARTITION writes
-- anew. A leaf detached, changed and attached back between two partition
-- checks keeps its OID, parent and storage; its attachment tells it. NULL
-- for a leaf recorded before this column existed. bound is the leaf's
-- partition constraint (pg_get_partition_constraintdef) while it was
-- attached: the rows it takes with it when it leaves satisfy it.

-- +goose Up
ALTER TABLE fkmat.partitions ADD COLUMN attached text, ADD COLUMN bound text;

-- +goose Down
ALTER TABLE fkmat.partitions DROP COLUMN attached, DROP COLUMN bound;
