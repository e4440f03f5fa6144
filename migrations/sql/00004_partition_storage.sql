-- The storage (relfilenode) of each known leaf partition, and the source
-- transaction whose streamed TRUNCATE of the partitioned table last gave it
-- new storage. Postgres does not publish a TRUNCATE of a single partition
-- (the publication publishes via the root), so a leaf whose storage changed
-- otherwise was truncated on its own, or rewritten (VACUUM FULL, CLUSTER).

-- +goose Up
ALTER TABLE fkmat.partitions
    ADD COLUMN relfilenode   oid,
    ADD COLUMN truncated_xid bigint;

-- +goose Down
ALTER TABLE fkmat.partitions
    DROP COLUMN relfilenode,
    DROP COLUMN truncated_xid;
