-- The leaf partitions of the joined partitioned tables as fkmat last knew
-- them: attaching, detaching or dropping a partition changes what the table
-- holds without row changes in the WAL, so the daemon compares.

-- +goose Up
CREATE TABLE fkmat.partitions (
    slot        text NOT NULL,
    parent      text NOT NULL,
    leaf_oid    oid  NOT NULL,
    leaf        text NOT NULL,
    -- Set when the partition left the table with rows in it: the join is
    -- wrong until fkmat backfill --force rebuilds it (which rewrites these
    -- rows), whatever happens to the partition since.
    lost        boolean NOT NULL DEFAULT false,
    PRIMARY KEY (slot, leaf_oid)
);

-- +goose Down
DROP TABLE fkmat.partitions;
