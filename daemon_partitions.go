package fkmat

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/fkmat/fkmat/internal/config"
	"github.com/fkmat/fkmat/internal/pipeline"
	"github.com/fkmat/fkmat/internal/plan"
	"github.com/fkmat/fkmat/internal/wal"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fkmat/fkmat/cdc"
)

// leaf is one leaf partition of a joined partitioned table.
type leaf struct {
	oid    uint32
	name   string // regclass text
	parent string
	// relfilenode is its storage; nil in a record of an older fkmat.
	relfilenode *uint32
	// xmin is the transaction that last rewrote its pg_class row (current
	// leaves only).
	xmin uint32
	// attached identifies its attachment: the xmin of each pg_inherits row
	// from it up to the joined table, which ATTACH PARTITION writes anew;
	// nil in a record of an older fkmat.
	attached *string
	// bound is its partition constraint (pg_get_partition_constraintdef),
	// as SQL on the joined table's columns; nil in a record of an older
	// fkmat.
	bound *string
	// truncatedXid is the source transaction whose streamed TRUNCATE of
	// the parent was applied last, if any (known leaves only).
	truncatedXid *int64
	lost         bool // it lost rows without row changes in the WAL (known leaves only)
}

// leavesQuery lists the leaf partitions of the tables named in $1 (text[],
// sanitized identifiers): the table's position in $1 (from 1), and each
// leaf's OID, name, storage, pg_class xmin and attachment. A table that is
// not partitioned (or no longer exists) has none.
const leavesQuery = `
	WITH RECURSIVE roots AS (
		SELECT r.n, c.oid FROM unnest($1::text[]) WITH ORDINALITY AS r (name, n)
		JOIN pg_class c ON c.oid = to_regclass(r.name) WHERE c.relkind = 'p'),
	tree AS (
		SELECT roots.n, i.inhrelid, i.xmin::text AS attached FROM roots JOIN pg_inherits i ON i.inhparent = roots.oid
		UNION ALL
		SELECT tree.n, i.inhrelid, tree.attached || '/' || i.xmin::text FROM pg_inherits i JOIN tree ON i.inhparent = tree.inhrelid)
	SELECT tree.n, c.oid, c.oid::regclass::text, c.relfilenode, c.xmin::text::bigint, tree.attached,
		pg_get_partition_constraintdef(c.oid)
	FROM tree JOIN pg_class c ON c.oid = tree.inhrelid WHERE c.relkind <> 'p'`

// readLeaves returns the leaf partitions of the tables, by OID; a table
// that is not partitioned has none.
func readLeaves(ctx context.Context, db querier, tables []config.TableName) (map[uint32]leaf, error) {
	rows, err := db.Query(ctx, leavesQuery, tableIdents(tables))
	if err != nil {
		return nil, fmt.Errorf("list partitions of the joined tables: %w", err)
	}
	return scanLeaves(rows, tables)
}

func tableIdents(tables []config.TableName) []string {
	out := make([]string, len(tables))
	for i, t := range tables {
		out[i] = pgx.Identifier{t.Schema, t.Name}.Sanitize()
	}
	return out
}

// scanLeaves reads the rows of leavesQuery.
func scanLeaves(rows pgx.Rows, tables []config.TableName) (map[uint32]leaf, error) {
	defer rows.Close()
	out := map[uint32]leaf{}
	for rows.Next() {
		var l leaf
		var n int
		var node uint32
		var xmin int64
		if err := rows.Scan(&n, &l.oid, &l.name, &node, &xmin, &l.attached, &l.bound); err != nil {
			return nil, fmt.Errorf("list partitions of the joined tables: %w", err)
		}
		l.parent, l.relfilenode, l.xmin = tables[n-1].String(), &node, uint32(xmin)
		out[l.oid] = l
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list partitions of the joined tables: %w", err)
	}
	return out, nil
}

// catalogRead is one read of the joined tables' partitions, between two
// reads of the source's WAL position: every transaction that committed
// before before is in it (when settled), and every change it shows
// committed before after.
type catalogRead struct {
	before, after wal.LSN
	leaves        map[uint32]leaf
	// partitioned says some joined table is partitioned.
	partitioned bool
	// settled says no transaction was committed in the WAL and yet
	// invisible to the read (a commit waiting for a synchronous standby
	// shows so for as long as it waits).
	settled bool
}

// catalogRaced reports whether err is a read of the partitions that met a
// partition being attached or detached at that moment: the leaves are read
// in the query's snapshot, but their partition constraints
// (pg_get_partition_constraintdef) from the catalog as it is now, which
// fails with an internal error ("could not find tuple for parent of
// relation …") for a leaf detached in between. Read again, it is fine.
func catalogRaced(err error) bool {
	pgErr, ok := errors.AsType[*pgconn.PgError](err)
	return ok && pgErr.Code == "XX000"
}

// readCatalog reads the partitions of the joined tables in one round trip,
// again when it raced with partition DDL (catalogRaced).
func (w *partitionWatcher) readCatalog(ctx context.Context) (catalogRead, error) {
	for attempt := 1; ; attempt++ {
		r, err := w.readCatalogOnce(ctx)
		if !catalogRaced(err) || attempt == 5 {
			return r, err
		}
		w.log.Debug("reading the partitions raced with partition DDL; reading them again", "err", err)
		if !sleepCtx(ctx, 100*time.Millisecond) {
			return r, ctx.Err()
		}
	}
}

// readCatalogOnce is one attempt of readCatalog.
func (w *partitionWatcher) readCatalogOnce(ctx context.Context) (catalogRead, error) {
	tables := w.joinedTables()
	batch := &pgx.Batch{}
	batch.Queue(`SELECT (pg_current_wal_lsn() - '0/0')::bigint`)
	batch.Queue(`SELECT NOT EXISTS (SELECT FROM pg_snapshot_xip(pg_current_snapshot()) x WHERE pg_xact_status(x) = 'committed'),
		EXISTS (SELECT FROM unnest($1::text[]) t JOIN pg_class c ON c.oid = to_regclass(t) WHERE c.relkind = 'p')`, tableIdents(tables))
	batch.Queue(leavesQuery, tableIdents(tables))
	batch.Queue(`SELECT (pg_current_wal_lsn() - '0/0')::bigint`)
	res := w.source.SendBatch(ctx, batch)
	defer res.Close()
	var r catalogRead
	var before, after int64
	if err := res.QueryRow().Scan(&before); err != nil {
		return r, fmt.Errorf("read the source's WAL position: %w", err)
	}
	if err := res.QueryRow().Scan(&r.settled, &r.partitioned); err != nil {
		return r, fmt.Errorf("read the source's snapshot: %w", err)
	}
	rows, err := res.Query()
	if err != nil {
		return r, fmt.Errorf("list partitions of the joined tables: %w", err)
	}
	if r.leaves, err = scanLeaves(rows, tables); err != nil {
		return r, err
	}
	if err := res.QueryRow().Scan(&after); err != nil {
		return r, fmt.Errorf("read the source's WAL position: %w", err)
	}
	r.before, r.after = wal.LSN(before), wal.LSN(after)
	return r, res.Close()
}

// execer runs one statement in a transaction.
type execer interface {
	Exec(ctx context.Context, sql string, args ...any) error
}

// recordLeaves replaces the known partitions of the slot with leaves.
func recordLeaves(ctx context.Context, tx execer, slot string, leaves map[uint32]leaf) error {
	if err := tx.Exec(ctx, `DELETE FROM fkmat.partitions WHERE slot = $1`, slot); err != nil {
		return fmt.Errorf("record partitions: %w", err)
	}
	for _, l := range leaves {
		if err := tx.Exec(ctx, `INSERT INTO fkmat.partitions (slot, parent, leaf_oid, leaf, relfilenode, truncated_xid, lost, attached, bound)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)`,
			slot, l.parent, l.oid, l.name, l.relfilenode, l.truncatedXid, l.lost, l.attached, l.bound); err != nil {
			return fmt.Errorf("record partitions: %w", err)
		}
	}
	return nil
}

// joinedTables lists the tables of the daemon's joins, each once.
func (w *partitionWatcher) joinedTables() []config.TableName {
	var out []config.TableName
	for _, t := range publishedTables(w.plans) {
		out = append(out, config.TableName{Schema: t.Schema, Name: t.Name})
	}
	return out
}

// knownLeaves reads the partitions recorded for the slot.
func knownLeaves(ctx context.Context, db *pgxpool.Pool, slot string) (map[uint32]leaf, error) {
	rows, err := db.Query(ctx, `SELECT leaf_oid, leaf, parent, lost, relfilenode, truncated_xid, attached, bound FROM fkmat.partitions WHERE slot = $1`, slot)
	if err != nil {
		return nil, fmt.Errorf("read known partitions: %w", err)
	}
	out := map[uint32]leaf{}
	for rows.Next() {
		var l leaf
		if err := rows.Scan(&l.oid, &l.name, &l.parent, &l.lost, &l.relfilenode, &l.truncatedXid, &l.attached, &l.bound); err != nil {
			rows.Close()
			return nil, fmt.Errorf("read known partitions: %w", err)
		}
		out[l.oid] = l
	}
	return out, rows.Err()
}

// partitionWatcher follows the partitions of the joined partitioned
// tables, which the WAL does not carry: a check at start (check), then one
// every Options.PartitionCheckInterval beside the stream (run). A partition
// attached or detached with its rows, or truncated alone, is followed by
// moving the rows into or out of the joins (moveRows). Until the pipeline
// has applied every move, the slot is not confirmed past it (clear).
//
// Between checks it holds the leaves as last recorded, the leaves whose
// storage changed with the source WAL position at which the change was
// seen, and the partition changes that moved rows and are not followed
// yet; the stream's last acknowledgement shares them.
type partitionWatcher struct {
	cfg            *config.Config
	log            *slog.Logger
	interval       time.Duration // Options.PartitionCheckInterval
	source, target *pgxpool.Pool
	plans          []*plan.JoinPlan
	joins          []pipeline.Join
	obs            *observer // nil without --metrics-addr
	// switching is the daemon's: no move commits across a rebuild's
	// switch marker.
	switching *sync.Mutex

	mu      sync.Mutex
	known   map[uint32]leaf // nil until a check recorded them
	pending map[uint32]pendingStorage
	// moves are the partitioned tables whose partitions moved rows and
	// are not followed yet, by name.
	moves map[string]moveSeen
	// awaiting is the source WAL position the pipeline must have applied
	// before the slot is cleared again: past the last move written.
	awaiting wal.LSN
	// applied is the position up to which the pipeline has applied
	// every transaction.
	applied func() wal.LSN
}

// partitionWatcher returns the daemon's partition watcher; applied is the
// position up to which the pipeline has applied every transaction.
func (d *daemon) partitionWatcher(applied func() wal.LSN) *partitionWatcher {
	return &partitionWatcher{cfg: d.cfg, log: d.log, interval: d.opts.PartitionCheckInterval, source: d.source, target: d.target,
		plans: d.plans, joins: d.joins, obs: d.obs, switching: &d.switching, applied: applied}
}

// moveSeen is when a partitioned table's unfollowed partition changes were
// seen as they are: at is a source WAL position after the last of them
// committed, leaves its partitions then (leavesOf).
type moveSeen struct {
	at     wal.LSN
	leaves string
}

// leavesOf describes the leaves of parent in leaves: which relations, on
// which storage, attached by which transactions, within which bounds. Every
// partition change that moves rows changes it.
func leavesOf(leaves map[uint32]leaf, parent string) string {
	var b strings.Builder
	for _, oid := range slices.Sorted(maps.Keys(leaves)) {
		if l := leaves[oid]; l.parent == parent {
			fmt.Fprintf(&b, "%d %s %s %s;", oid, fmtPtr(l.relfilenode), fmtPtr(l.attached), fmtPtr(l.bound))
		}
	}
	return b.String()
}

func fmtPtr[T any](p *T) string {
	if p == nil {
		return "-"
	}
	return fmt.Sprint(*p)
}

type pendingStorage struct {
	relfilenode uint32
	seenAt      wal.LSN
}

// check compares the joined tables' partitions with the known
// ones. A partition that came or went empty is recorded (its rows, if any,
// came through the WAL). One that brought or took rows with it is followed
// by moveRows once the pipeline has applied everything committed before the
// change was first seen; until then nothing is recorded, and the check is
// made again.
//
// "Empty" is judged by the rows' xmin: a row older than the partition's
// pg_class row (which ATTACH and DETACH rewrite) was in the table before it
// became, or after it stopped being, a partition. A dropped partition
// cannot be inspected and counts as having held rows.
//
// A leaf whose storage (relfilenode) changed was truncated or rewritten.
// Postgres publishes a TRUNCATE of the partitioned table (via the root) but
// not a TRUNCATE of one partition, so once the daemon has applied
// everything committed before the change was seen: a change made by a
// streamed TRUNCATE of the parent is fine; a rewrite that kept the rows
// (VACUUM FULL, CLUSTER, a rewriting ALTER TABLE) is fine; anything else
// took the partition's rows without row changes in the WAL, and is
// followed as a move.
func (w *partitionWatcher) check(ctx context.Context, at catalogRead) error {
	known, err := knownLeaves(ctx, w.target, w.cfg.Slot)
	if err != nil {
		return err
	}
	for _, oid := range slices.Sorted(maps.Keys(known)) {
		if l := known[oid]; l.lost {
			return lostPartition(l)
		}
	}
	if len(known) == 0 {
		for _, l := range at.leaves {
			return fmt.Errorf("%w: fkmat has no record of the partitions of %s: it was backfilled by an older fkmat, whose publication "+
				"did not publish partitioned tables via their root (their streamed changes were lost); run fkmat backfill --force",
				ErrPartitionsChanged, l.parent)
		}
		w.known = map[uint32]leaf{}
		return nil
	}
	next, moves, err := w.compare(ctx, known, at)
	if err != nil {
		return err
	}
	for oid := range w.pending {
		if _, ok := next[oid]; !ok {
			delete(w.pending, oid)
		}
	}
	if len(moves) > 0 {
		done, err := w.followMoves(ctx, moves, at)
		if err != nil || !done {
			return err
		}
	}
	if err := w.saveLeaves(ctx, known, next); err != nil {
		return err
	}
	w.known = next
	return nil
}

// compare compares the leaves the catalog read at shows with the known
// ones. It returns the leaves to record, and the moves of rows into and
// out of the joins that the changes call for, by partitioned table.
func (w *partitionWatcher) compare(ctx context.Context, known map[uint32]leaf, at catalogRead) (map[uint32]leaf, map[string]*pendingMove, error) {
	cur, seenAt := at.leaves, at.after // a change seen was committed before at.after
	next := map[uint32]leaf{}
	moves := map[string]*pendingMove{}
	move := func(parent string) *pendingMove {
		if moves[parent] == nil {
			moves[parent] = &pendingMove{}
		}
		return moves[parent]
	}
	for _, oid := range slices.Sorted(maps.Keys(cur)) {
		l := cur[oid]
		k, ok := known[oid]
		// Detached and attached back since the last check: what was done
		// to it meanwhile is not in the WAL.
		reattached := ok && k.parent == l.parent && k.attached != nil && !equalPtr(k.attached, l.attached)
		if reattached {
			// Every row may have changed meanwhile, even in the
			// transaction of the ATTACH: read them all.
			w.log.Info("a partition of a joined table was detached and attached back", "table", l.parent, "partition", l.name)
			m := move(l.parent)
			m.entered = append(m.entered, l)
			m.lost(k)
			m.lost(l) // a default partition's constraint changes with its siblings
			next[oid] = l
			continue
		}
		if !ok || k.parent != l.parent {
			old, err := hasOldRows(ctx, w.source, l, true)
			if err != nil {
				return nil, nil, err
			}
			if old {
				w.log.Info("a partition was attached to a joined table with rows in it", "table", l.parent, "partition", l.name)
				m := move(l.parent)
				m.entered = append(m.entered, l)
			} else {
				w.log.Info("a partition was added to a joined table", "table", l.parent, "partition", l.name)
			}
			next[oid] = l
			continue
		}
		adopt, lost, err := w.checkStorage(ctx, k, l, seenAt)
		if err != nil {
			return nil, nil, err
		}
		if lost {
			move(l.parent).lost(k)
			move(l.parent).lost(l) // a default partition's constraint changes with its siblings
		}
		n := k
		if adopt {
			n = l
		}
		if n.attached == nil { // recorded by an older fkmat
			n.attached = l.attached
		}
		// A default partition's constraint changes with its siblings.
		n.bound = l.bound
		next[oid] = n
	}
	for _, oid := range slices.Sorted(maps.Keys(known)) {
		if l, ok := cur[oid]; ok && l.parent == known[oid].parent {
			continue
		}
		l := known[oid]
		old, err := hasOldRows(ctx, w.source, l, true)
		if err != nil {
			return nil, nil, err
		}
		if old {
			w.log.Info("a partition with rows left a joined table (detached or dropped)", "table", l.parent, "partition", l.name)
			move(l.parent).lost(l)
		} else {
			w.log.Info("an empty partition left a joined table", "table", l.parent, "partition", l.name)
		}
	}
	return next, moves, nil
}

// followMoves follows the moves of rows, once the pipeline has applied
// everything committed before each table's partition changes were seen in
// the catalog read at; it reports whether it did.
//
// The wait is for the last change, not the first: a table's changes are
// followed together, by the state's keys and the table's rows, and a
// transaction committed between two of them that the state does not hold
// yet would be applied after the move, bringing back rows the second change
// took (a partition detached, emptied, and attached back).
func (w *partitionWatcher) followMoves(ctx context.Context, moves map[string]*pendingMove, at catalogRead) (bool, error) {
	if w.moves == nil {
		w.moves = map[string]moveSeen{}
	}
	ready := true
	for parent := range moves {
		// A change seen was committed before at.after. A table kept from
		// an earlier read keeps its position while its leaves are the
		// same, also across reads that did not call for its move (a
		// partition truncated on its own is judged anew every other
		// read: checkStorage).
		now := leavesOf(at.leaves, parent)
		seen, ok := w.moves[parent]
		if !ok || seen.leaves != now {
			seen = moveSeen{at: at.after, leaves: now}
			w.moves[parent] = seen
		}
		if w.applied() < seen.at {
			ready = false
		}
	}
	if !ready {
		return false, nil
	}
	if !w.switching.TryLock() {
		return false, nil // a rebuild switches: after it, the next run follows the change
	}
	defer w.switching.Unlock()
	for _, parent := range slices.Sorted(maps.Keys(moves)) {
		m := moves[parent]
		table := w.joinedTable(parent)
		start := time.Now()
		res, err := w.moveRows(ctx, table, *m)
		if err != nil {
			return false, err
		}
		w.log.Info("followed a partition change of a joined table", "table", parent, "rows_left", res.deleted, "rows_entered", res.upserted,
			"took", time.Since(start).Round(time.Millisecond).String(), "lsn", res.after.String(),
			"state_keys", res.listed, "keys_in_partitions", res.within, "lookup_took", res.lookTook.Round(time.Millisecond).String(),
			"lock_held", res.lockTook.Round(time.Millisecond).String())
		w.obs.moved(parent, res.deleted, res.upserted, time.Since(start))
		w.awaiting = max(w.awaiting, res.after)
	}
	clear(w.moves)
	return true, nil
}

// joinedTable returns the joined table whose name (regclass text) is name.
func (w *partitionWatcher) joinedTable(name string) config.TableName {
	for _, t := range w.joinedTables() {
		if t.String() == name {
			return t
		}
	}
	return config.TableName{}
}

// saveLeaves writes the differences between the known leaves and next. It
// never writes truncated_xid, which the pipeline sets concurrently.
func (w *partitionWatcher) saveLeaves(ctx context.Context, known, next map[uint32]leaf) error {
	batch := &pgx.Batch{}
	for _, oid := range slices.Sorted(maps.Keys(next)) {
		l := next[oid]
		if k, ok := known[oid]; ok && k.parent == l.parent && k.name == l.name && equalPtr(k.relfilenode, l.relfilenode) &&
			equalPtr(k.attached, l.attached) && equalPtr(k.bound, l.bound) {
			continue
		}
		batch.Queue(`INSERT INTO fkmat.partitions (slot, parent, leaf_oid, leaf, relfilenode, attached, bound) VALUES ($1, $2, $3, $4, $5, $6, $7)
			ON CONFLICT (slot, leaf_oid) DO UPDATE SET parent = EXCLUDED.parent, leaf = EXCLUDED.leaf, relfilenode = EXCLUDED.relfilenode,
				attached = EXCLUDED.attached, bound = EXCLUDED.bound`,
			w.cfg.Slot, l.parent, l.oid, l.name, l.relfilenode, l.attached, l.bound)
	}
	for _, oid := range slices.Sorted(maps.Keys(known)) {
		if _, ok := next[oid]; !ok {
			batch.Queue(`DELETE FROM fkmat.partitions WHERE slot = $1 AND leaf_oid = $2`, w.cfg.Slot, oid)
		}
	}
	if batch.Len() == 0 {
		return nil
	}
	if err := w.target.SendBatch(ctx, batch).Close(); err != nil {
		return fmt.Errorf("record partitions: %w", err)
	}
	return nil
}

// checkStorage compares a known leaf k with its current state l and reports
// whether l's storage is to be recorded, and whether it lost rows without
// row changes in the WAL.
func (w *partitionWatcher) checkStorage(ctx context.Context, k, l leaf, seenAt wal.LSN) (adopt, lost bool, err error) {
	switch {
	case k.relfilenode == nil: // recorded by an older fkmat
		return true, false, nil
	case *k.relfilenode == *l.relfilenode:
		delete(w.pending, l.oid)
		return false, false, nil
	case k.truncatedXid != nil && uint32(*k.truncatedXid) == l.xmin:
		// The streamed TRUNCATE of the parent, applied, gave it this storage.
		delete(w.pending, l.oid)
		return true, false, nil
	}
	if w.pending == nil {
		w.pending = map[uint32]pendingStorage{}
	}
	p, ok := w.pending[l.oid]
	if !ok || p.relfilenode != *l.relfilenode {
		w.pending[l.oid] = pendingStorage{relfilenode: *l.relfilenode, seenAt: seenAt}
		return false, false, nil
	}
	// Wait until the pipeline has applied everything committed before the
	// change was seen: a TRUNCATE of the parent in it is applied by then.
	if w.applied() < p.seenAt {
		return false, false, nil
	}
	delete(w.pending, l.oid)
	old, err := hasOldRows(ctx, w.source, l, false)
	if err != nil {
		return false, false, err
	}
	if old {
		w.log.Info("a partition of a joined table was rewritten with its rows (VACUUM FULL, CLUSTER or a rewriting ALTER TABLE)",
			"table", l.parent, "partition", l.name)
		return true, false, nil
	}
	// Truncated on its own (Postgres does not publish a TRUNCATE of a
	// single partition when the publication publishes via the partitioned
	// table), or emptied and then rewritten.
	w.log.Info("a partition of a joined table was truncated on its own", "table", l.parent, "partition", l.name)
	return true, true, nil
}

func equalPtr[T comparable](a, b *T) bool {
	return a == nil && b == nil || a != nil && b != nil && *a == *b
}

func lostPartition(l leaf) error {
	return fmt.Errorf("%w: an older fkmat recorded that partition %s left %s (detached or dropped) or was truncated on its own while it may have held rows; "+
		"they left the table without row changes in the WAL, and the target still holds their joined rows: run fkmat backfill --force",
		ErrPartitionsChanged, l.name, l.parent)
}

// hasOldRows reports whether relation l (by OID) holds a row not newer than
// its pg_class row; a relation that no longer exists counts as true.
//
// A row written by the transaction that rewrote the pg_class row counts as
// old when ofThatTxn is set: a table filled and attached in one transaction
// brought those rows (their inserts were not published), and rows detached
// in the transaction that wrote them take them along. It does not count
// for a change of storage: rows written into the partition after a
// TRUNCATE in the same transaction are published.
func hasOldRows(ctx context.Context, db *pgxpool.Pool, l leaf, ofThatTxn bool) (bool, error) {
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
	op := ">"
	if ofThatTxn {
		op = ">="
	}
	err = db.QueryRow(ctx, `SELECT EXISTS (SELECT FROM ONLY `+ident+` WHERE age(xmin) `+op+` $1)`, age).Scan(&old)
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

// partitionClearInterval is how often, while the stream has positions to
// confirm, the partition watcher reads the catalog to clear them.
const partitionClearInterval = 200 * time.Millisecond

// clear reads the catalog and, when no partition of a joined
// table changed in a way the join has not followed, clears the stream to
// the WAL position read before it: partition DDL is not in the stream, so
// the slot is never confirmed past a DETACH, DROP, ATTACH or single
// partition TRUNCATE until the catalog has been checked after it. A change
// the join cannot follow is ErrPartitionsChanged, and nothing after it is
// cleared.
func (w *partitionWatcher) clear(ctx context.Context, stream *cdc.Stream) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	at, err := w.readCatalog(ctx)
	if err != nil {
		return err
	}
	if w.known == nil || len(w.pending) > 0 || !sameLeaves(at.leaves, w.known) {
		if err := w.check(ctx, at); err != nil {
			return err
		}
	}
	if at.settled && w.clearable() {
		stream.Clear(at.before)
	}
	return nil
}

// clearable says whether nothing the join has not followed lies behind the
// catalog read just checked: no storage change or move waits, and the last
// move written is applied.
func (w *partitionWatcher) clearable() bool {
	return len(w.pending) == 0 && len(w.moves) == 0 && w.applied() >= w.awaiting
}

// sameLeaves reports whether the leaves read are the ones recorded: the
// same partitions of the same tables, on the same storage.
func sameLeaves(cur, known map[uint32]leaf) bool {
	if len(cur) != len(known) {
		return false
	}
	for oid, l := range cur {
		k, ok := known[oid]
		if !ok || k.parent != l.parent || !equalPtr(k.relfilenode, l.relfilenode) || !equalPtr(k.attached, l.attached) ||
			!equalPtr(k.bound, l.bound) {
			return false
		}
	}
	return true
}

// run clears the held stream while it has positions to
// confirm (every partitionClearInterval), and checks the partitions at
// least every Options.PartitionCheckInterval, until ctx is done or a check
// finds a change the join cannot follow.
func (w *partitionWatcher) run(ctx context.Context, stream *cdc.Stream) error {
	t := time.NewTicker(min(partitionClearInterval, w.interval))
	defer t.Stop()
	last := time.Now()
	for ticked(ctx, t.C) {
		st := stream.Stats()
		waiting := st.Held && st.ConfirmableLSN > st.ClearedLSN
		if !waiting && time.Since(last) < w.interval {
			continue
		}
		last = time.Now()
		if err := w.clear(ctx, stream); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, ErrPartitionsChanged) {
				return err
			}
			w.log.Warn("checking the partitions of the joined tables failed", "err", err)
		}
	}
	return nil
}
