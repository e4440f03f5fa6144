package fkmat

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ErrPartitionsChanged means a partition of a joined table was detached or
// dropped while it held rows, or attached with rows in it: the table's
// contents changed without row changes in the WAL, so the join cannot
// follow. A rebuild (fkmat backfill --force) can.
var ErrPartitionsChanged = errors.New("partitions of a joined table changed")

// partitionCheckInterval is how often the daemon compares the partitions of
// the joined partitioned tables with the ones it knows.
const partitionCheckInterval = 10 * time.Second

// leaf is one leaf partition of a joined partitioned table.
type leaf struct {
	oid    uint32
	name   string // regclass text
	parent string
	lost   bool // it left the table with rows (known leaves only)
}

// readLeaves returns the leaf partitions of the tables, by OID; a table
// that is not partitioned has none.
func readLeaves(ctx context.Context, db *pgxpool.Pool, tables []TableName) (map[uint32]leaf, error) {
	out := map[uint32]leaf{}
	for _, t := range tables {
		rows, err := db.Query(ctx, `
			WITH RECURSIVE tree AS (
				SELECT i.inhrelid FROM pg_inherits i WHERE i.inhparent = $1::regclass
				UNION ALL
				SELECT i.inhrelid FROM pg_inherits i JOIN tree ON i.inhparent = tree.inhrelid)
			SELECT c.oid, c.oid::regclass::text FROM tree JOIN pg_class c ON c.oid = tree.inhrelid
			WHERE c.relkind <> 'p' AND (SELECT relkind FROM pg_class WHERE oid = $1::regclass) = 'p'`, pgx.Identifier{t.Schema, t.Name}.Sanitize())
		if err != nil {
			return nil, fmt.Errorf("list partitions of %s: %w", t, err)
		}
		for rows.Next() {
			l := leaf{parent: t.String()}
			if err := rows.Scan(&l.oid, &l.name); err != nil {
				rows.Close()
				return nil, fmt.Errorf("list partitions of %s: %w", t, err)
			}
			out[l.oid] = l
		}
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("list partitions of %s: %w", t, err)
		}
	}
	return out, nil
}

// execer runs one statement in a transaction.
type execer interface {
	Exec(ctx context.Context, sql string, args ...any) error
}

// pgxExecer adapts a pgx.Tx to execer.
type pgxExecer struct{ tx pgx.Tx }

func (e pgxExecer) Exec(ctx context.Context, sql string, args ...any) error {
	_, err := e.tx.Exec(ctx, sql, args...)
	return err
}

// recordLeaves replaces the known partitions of the slot with leaves.
func recordLeaves(ctx context.Context, tx execer, slot string, leaves map[uint32]leaf) error {
	if err := tx.Exec(ctx, `DELETE FROM fkmat.partitions WHERE slot = $1`, slot); err != nil {
		return fmt.Errorf("record partitions: %w", err)
	}
	for _, l := range leaves {
		if err := tx.Exec(ctx, `INSERT INTO fkmat.partitions (slot, parent, leaf_oid, leaf) VALUES ($1, $2, $3, $4)`,
			slot, l.parent, l.oid, l.name); err != nil {
			return fmt.Errorf("record partitions: %w", err)
		}
	}
	return nil
}

// joinedTables lists the tables of the daemon's joins, each once.
func (d *daemon) joinedTables() []TableName {
	var out []TableName
	for _, t := range publishedTables(d.plans) {
		out = append(out, TableName{Schema: t.Schema, Name: t.Name})
	}
	return out
}

// knownLeaves reads the partitions recorded for the slot.
func knownLeaves(ctx context.Context, db *pgxpool.Pool, slot string) (map[uint32]leaf, error) {
	rows, err := db.Query(ctx, `SELECT leaf_oid, leaf, parent, lost FROM fkmat.partitions WHERE slot = $1`, slot)
	if err != nil {
		return nil, fmt.Errorf("read known partitions: %w", err)
	}
	out := map[uint32]leaf{}
	for rows.Next() {
		var l leaf
		if err := rows.Scan(&l.oid, &l.name, &l.parent, &l.lost); err != nil {
			rows.Close()
			return nil, fmt.Errorf("read known partitions: %w", err)
		}
		out[l.oid] = l
	}
	return out, rows.Err()
}

// checkPartitions compares the joined tables' partitions with the known
// ones. A partition that came or went empty is fine (its rows, if any, came
// through the WAL) and is recorded; one that brought or took rows with it
// is ErrPartitionsChanged.
//
// "Empty" is judged by the rows' xmin: a row older than the partition's
// pg_class row (which ATTACH and DETACH rewrite) was in the table before it
// became, or after it stopped being, a partition. A dropped partition
// cannot be inspected and counts as having held rows.
func (d *daemon) checkPartitions(ctx context.Context) error {
	cur, err := readLeaves(ctx, d.source, d.joinedTables())
	if err != nil {
		return err
	}
	known, err := knownLeaves(ctx, d.target, d.cfg.Slot)
	if err != nil {
		return err
	}
	for _, oid := range slices.Sorted(maps.Keys(known)) {
		if l := known[oid]; l.lost {
			return lostPartition(l)
		}
	}
	if maps.EqualFunc(cur, known, func(a, b leaf) bool { return a.parent == b.parent }) {
		return nil
	}
	if len(known) == 0 {
		for _, l := range cur {
			return fmt.Errorf("%w: fkmat has no record of the partitions of %s: it was backfilled by an older fkmat, whose publication "+
				"did not publish partitioned tables via their root (their streamed changes were lost); run fkmat backfill --force",
				ErrPartitionsChanged, l.parent)
		}
	}
	for _, oid := range slices.Sorted(maps.Keys(cur)) {
		if _, ok := known[oid]; ok {
			continue
		}
		l := cur[oid]
		old, err := hasOldRows(ctx, d.source, l)
		if err != nil {
			return err
		}
		if old {
			return fmt.Errorf("%w: partition %s was attached to %s with rows in it; they joined the table without row changes in the WAL: "+
				"run fkmat backfill --force (attach partitions empty and then fill them, to keep the join streaming)",
				ErrPartitionsChanged, l.name, l.parent)
		}
		d.log.Info("a partition was added to a joined table", "table", l.parent, "partition", l.name)
	}
	for _, oid := range slices.Sorted(maps.Keys(known)) {
		if _, ok := cur[oid]; ok {
			continue
		}
		l := known[oid]
		old, err := hasOldRows(ctx, d.source, l)
		if err != nil {
			return err
		}
		if old {
			// Sticky: attaching it back later would not bring back what
			// was done to it meanwhile.
			if _, err := d.target.Exec(ctx, `UPDATE fkmat.partitions SET lost = true WHERE slot = $1 AND leaf_oid = $2`,
				d.cfg.Slot, l.oid); err != nil {
				return fmt.Errorf("record partition %s as lost: %w", l.name, err)
			}
			return lostPartition(l)
		}
		d.log.Info("an empty partition left a joined table", "table", l.parent, "partition", l.name)
	}
	tx, err := d.target.Begin(ctx)
	if err != nil {
		return fmt.Errorf("record partitions: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if err := recordLeaves(ctx, pgxExecer{tx}, d.cfg.Slot, cur); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

func lostPartition(l leaf) error {
	return fmt.Errorf("%w: partition %s left %s (detached or dropped) while it may have held rows; "+
		"they left the table without row changes in the WAL, and the target still holds their joined rows: run fkmat backfill --force",
		ErrPartitionsChanged, l.name, l.parent)
}

// hasOldRows reports whether relation l (by OID) holds a row older than its
// pg_class row; a relation that no longer exists counts as true.
func hasOldRows(ctx context.Context, db *pgxpool.Pool, l leaf) (bool, error) {
	var schema, name string
	var age int64
	err := db.QueryRow(ctx, `SELECT n.nspname, c.relname, age(c.xmin) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE c.oid = $1`, l.oid).Scan(&schema, &name, &age)
	if errors.Is(err, pgx.ErrNoRows) {
		return true, nil // dropped
	}
	if err != nil {
		return false, fmt.Errorf("look up partition %s: %w", l.name, err)
	}
	ident := pgx.Identifier{schema, name}.Sanitize()
	var old bool
	err = db.QueryRow(ctx, `SELECT EXISTS (SELECT FROM ONLY `+ident+` WHERE age(xmin) > $1)`, age).Scan(&old)
	if pgErr, ok := errors.AsType[*pgconn.PgError](err); ok && pgErr.Code == "42501" {
		return false, fmt.Errorf("%w: partition %s of %s changed and fkmat may not read it to tell whether rows came or went with it; "+
			"GRANT SELECT ON %s to fkmat's role and start again, or run fkmat backfill --force",
			ErrPartitionsChanged, ident, l.parent, ident)
	}
	if err != nil {
		return false, fmt.Errorf("inspect partition %s: %w", ident, err)
	}
	return old, nil
}

// watchPartitions checks the partitions every partitionCheckInterval until
// ctx is done or a check finds a change the join cannot follow.
func (d *daemon) watchPartitions(ctx context.Context) error {
	t := time.NewTicker(partitionCheckInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if err := d.checkPartitions(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, ErrPartitionsChanged) {
				return err
			}
			d.log.Warn("checking the partitions of the joined tables failed", "err", err)
		}
	}
}
