package fkmat

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fkmat/fkmat/cdc"
	"github.com/fkmat/fkmat/internal/config"
	"github.com/fkmat/fkmat/internal/plan"
	"github.com/fkmat/fkmat/internal/wal"
	"github.com/fkmat/fkmat/join"
	"github.com/fkmat/fkmat/redisstore"
)

// Partition DDL moves rows in or out of a partitioned table without row
// changes in the WAL: ATTACH of a filled table brings its rows, DETACH and
// DROP of a partition with rows take them, and so does a TRUNCATE of one
// partition. The daemon follows such a move by writing the row changes into
// the WAL itself (cdc.Embedded), in one source transaction that holds a
// SHARE lock on the partitioned table: no write to the table commits while
// it runs, so what it reads of the table is the table at its commit, and its
// changes make the join's state and target equal to the table there. The
// pipeline applies them in that transaction's place in the stream, so they
// are checkpointed and acknowledged with it, exactly once; a crash before
// they are applied replays them from the WAL.
//
// The rows that left are the rows of the state no longer in the table: the
// daemon lists the table's keys in each join's state once it has applied
// everything committed before the change was seen, keeps those the table no
// longer holds, and checks them again under the lock (a key may have come
// back meanwhile). The rows that came are the rows of the attached
// partitions, read under the lock.

// moveLockTimeout bounds each wait for the lock on the partitioned table:
// while the move waits, writers queue behind it. maxMovePause is the
// longest pause between two attempts.
const (
	moveLockTimeout = "2s"
	maxMovePause    = 30 * time.Second
)

// moveMessageBytes is the size of the messages a move writes.
const moveMessageBytes = 1 << 20

// moveProbeRows is how many keys one probe of the table checks.
const moveProbeRows = 5000

// pendingMove is a change of a partitioned table's partitions that moved
// rows and is not followed yet.
type pendingMove struct {
	// entered are the partitions that came with rows.
	entered []leaf
	// bounds are the partition constraints of the partitions that may
	// have lost rows (detached, dropped or truncated): the rows that left
	// satisfy one; unbounded says one of them has none recorded.
	bounds    []string
	unbounded bool
}

// left says that rows may have gone.
func (m *pendingMove) left() bool { return m.unbounded || len(m.bounds) > 0 }

// lost notes that partition l (as recorded) may have lost rows.
func (m *pendingMove) lost(l leaf) {
	if l.bound == nil {
		m.unbounded = true
		return
	}
	m.bounds = append(m.bounds, *l.bound)
}

// sourceRelation is a table as pgoutput describes it, read from the catalog.
type sourceRelation struct {
	table config.TableName
	rel   *cdc.Relation
	// types are the types not built in that its columns use.
	types []sourceType
	// casts are the columns' format_type.
	casts []string
}

type sourceType struct {
	oid             uint32
	namespace, name string
}

// readRelation reads table's published columns in the order pgoutput sends
// them (every column that is not dropped or generated).
func readRelation(ctx context.Context, q querier, t config.TableName) (*sourceRelation, error) {
	ident := pgx.Identifier{t.Schema, t.Name}.Sanitize()
	rows, err := q.Query(ctx, `
		SELECT c.oid, c.relreplident::text, a.attname, a.atttypid, a.atttypmod, format_type(a.atttypid, a.atttypmod),
			tn.nspname, ty.typname,
			CASE c.relreplident
				WHEN 'f' THEN true
				WHEN 'd' THEN EXISTS (SELECT FROM pg_index i WHERE i.indrelid = c.oid AND i.indisprimary AND a.attnum = ANY (i.indkey::int2[]))
				WHEN 'i' THEN EXISTS (SELECT FROM pg_index i WHERE i.indrelid = c.oid AND i.indisreplident AND a.attnum = ANY (i.indkey::int2[]))
				ELSE false END
		FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid
		JOIN pg_type ty ON ty.oid = a.atttypid JOIN pg_namespace tn ON tn.oid = ty.typnamespace
		WHERE c.oid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = ''
		ORDER BY a.attnum`, ident)
	if err != nil {
		return nil, fmt.Errorf("describe %s: %w", ident, err)
	}
	defer rows.Close()
	sr := &sourceRelation{table: t, rel: &cdc.Relation{Namespace: t.Schema, Name: t.Name}}
	seen := map[uint32]bool{}
	for rows.Next() {
		var c cdc.Column
		var ident, cast, typNS, typName string
		if err := rows.Scan(&sr.rel.ID, &ident, &c.Name, &c.Type, &c.TypeMod, &cast, &typNS, &typName, &c.Key); err != nil {
			return nil, fmt.Errorf("describe %s: %w", t, err)
		}
		sr.rel.ReplicaIdentity = cdc.ReplicaIdentity(ident[0])
		if c.Type >= cdc.FirstGenbkiObjectID && !seen[c.Type] {
			seen[c.Type] = true
			sr.types = append(sr.types, sourceType{oid: c.Type, namespace: typNS, name: typName})
		}
		sr.rel.Columns = append(sr.rel.Columns, c)
		sr.casts = append(sr.casts, cast)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("describe %s: %w", t, err)
	}
	if len(sr.rel.Columns) == 0 {
		return nil, fmt.Errorf("describe %s: the table does not exist", ident)
	}
	return sr, nil
}

// stateKeys are keys of one table's rows in the joins' states.
type stateKeys struct {
	// columns are the key's columns.
	columns []string
	// keys are the keys' values in text form, one slice per key.
	keys [][]string
}

// stateKeysChunk is about how many keys tableStateKeys hands over at once.
const stateKeysChunk = 20000

// tableStateKeys lists the keys of table's rows in the state of every join
// that has it, handing them to each a chunk at a time (a key in several
// joins' states comes once per state). All joins must key the table by the
// same columns.
func (w *partitionWatcher) tableStateKeys(ctx context.Context, table config.TableName, each func(stateKeys) error) error {
	var columns []string
	for _, j := range w.joins {
		jp, stores := j.Plan(), j.Stores()
		for i, t := range jp.Tables() {
			if t != table {
				continue
			}
			store, right, key := stateOfTable(jp, stores, i)
			names := columnNames(key)
			if columns == nil {
				columns = names
			} else if !slices.Equal(columns, names) {
				return fmt.Errorf("%w: the joins key %s by different columns (%s and %s), so fkmat cannot tell which rows a partition took with it: "+
					"run fkmat backfill --force", ErrPartitionsChanged, table, strings.Join(columns, ", "), strings.Join(names, ", "))
			}
			chunk := stateKeys{columns: names}
			err := scanRowKeys(ctx, store, right, func(keys []string) error {
				for _, k := range keys {
					vals, err := join.KeyValues(k)
					if err != nil || len(vals) != len(names) {
						return fmt.Errorf("join %q: a key of %s in its state does not decode (%v)", jp.Name, table, err)
					}
					texts := make([]string, len(vals))
					for n, v := range vals {
						texts[n] = v.Text
					}
					chunk.keys = append(chunk.keys, texts)
				}
				if len(chunk.keys) < stateKeysChunk {
					return nil
				}
				err := each(chunk)
				chunk.keys = nil
				return err
			})
			if err == nil && len(chunk.keys) > 0 {
				err = each(chunk)
			}
			if err != nil {
				return err
			}
		}
	}
	return nil
}

// scanRowKeys is Store.RowKeys, read again when a resize moved the state
// meanwhile.
func scanRowKeys(ctx context.Context, store *redisstore.Store, right bool, fn func([]string) error) error {
	for attempt := 1; ; attempt++ {
		err := store.RowKeys(ctx, right, fn)
		if !errors.Is(err, redisstore.ErrMovedDuringScan) || attempt == 5 {
			return err
		}
	}
}

// stateOfTable returns the store, side and key columns of table i of jp
// (as in jp.Tables()).
func stateOfTable(jp *plan.JoinPlan, stores []*redisstore.Store, i int) (*redisstore.Store, bool, []plan.SourceColumn) {
	if jp.Edges == nil {
		if i == 0 {
			return stores[0], false, jp.Left.Key
		}
		return stores[0], true, jp.Right.Key
	}
	if i == 0 {
		return stores[0], false, jp.Left.Key
	}
	if i > len(jp.Edges) {
		// A roll-up's children: their state follows the tree's tables.
		k := i - len(jp.Edges) - 1
		return stores[len(jp.Edges)+1+len(jp.Rollups)+k], false, jp.Rollups[k].Table.Key
	}
	return stores[i], false, jp.Edges[i-1].Table.Key
}

func columnNames(cols []plan.SourceColumn) []string {
	out := make([]string, len(cols))
	for i, c := range cols {
		out[i] = c.Name
	}
	return out
}

// absentKeys returns the keys of sk that the table does not hold, as q
// sees it.
func absentKeys(ctx context.Context, q querier, sr *sourceRelation, sk stateKeys) ([][]string, error) {
	pos := make([]int, len(sk.columns))
	for i, name := range sk.columns {
		if pos[i] = sr.rel.ColumnIndex(name); pos[i] < 0 {
			return nil, fmt.Errorf("%w: key column %q of %s is gone", ErrPartitionsChanged, name, sr.table)
		}
	}
	// SELECT n FROM unnest($1::text[], …) WITH ORDINALITY AS k (c1, …, n)
	// WHERE NOT EXISTS (SELECT FROM t WHERE t.a = k.c1::type AND …)
	var cols, conds []string
	for i, p := range pos {
		c := fmt.Sprintf("c%d", i+1)
		cols = append(cols, c)
		conds = append(conds, fmt.Sprintf("t.%s = k.%s::%s", ident(sk.columns[i]), c, sr.casts[p]))
	}
	params := make([]string, len(pos))
	for i := range params {
		params[i] = fmt.Sprintf("$%d::text[]", i+1)
	}
	sql := fmt.Sprintf(`SELECT n FROM unnest(%s) WITH ORDINALITY AS k (%s, n) WHERE NOT EXISTS (SELECT FROM %s t WHERE %s)`,
		strings.Join(params, ", "), strings.Join(cols, ", "), tableIdent(sr.table), strings.Join(conds, " AND "))
	out, err := selectKeys(ctx, q, sql, sk.keys, moveProbeRows)
	if err != nil {
		return nil, fmt.Errorf("look up the keys of %s: %w", sr.table, err)
	}
	return out, nil
}

// keysWithin returns the keys of sk that satisfy one of the partition
// constraints bounds (SQL on the table's columns, from
// pg_get_partition_constraintdef). Every column a partition constraint
// reads is in every unique key of the table.
func keysWithin(ctx context.Context, q querier, sr *sourceRelation, sk stateKeys, bounds []string) ([][]string, error) {
	var cols, params []string
	for i, name := range sk.columns {
		p := sr.rel.ColumnIndex(name)
		if p < 0 {
			return nil, fmt.Errorf("%w: key column %q of %s is gone", ErrPartitionsChanged, name, sr.table)
		}
		cols = append(cols, fmt.Sprintf("c%d::%s AS %s", i+1, sr.casts[p], ident(name)))
		params = append(params, fmt.Sprintf("$%d::text[]", i+1))
	}
	names := make([]string, len(sk.columns))
	for i := range names {
		names[i] = fmt.Sprintf("c%d", i+1)
	}
	sql := fmt.Sprintf(`SELECT n FROM (SELECT %s, n FROM unnest(%s) WITH ORDINALITY AS k (%s, n)) k WHERE (%s)`,
		strings.Join(cols, ", "), strings.Join(params, ", "), strings.Join(names, ", "), strings.Join(bounds, ") OR ("))
	out, err := selectKeys(ctx, q, sql, sk.keys, 50000)
	if err != nil {
		return nil, fmt.Errorf("select the keys of %s in its partitions that lost rows: %w", sr.table, err)
	}
	return out, nil
}

// selectKeys runs sql on keys, size at a time, passed as one text array per
// key column, and returns the keys whose ordinality (from 1) it selects.
func selectKeys(ctx context.Context, q querier, sql string, keys [][]string, size int) ([][]string, error) {
	var out [][]string
	for from := 0; from < len(keys); from += size {
		part := keys[from:min(len(keys), from+size)]
		args := make([]any, len(part[0]))
		for i := range args {
			col := make([]string, len(part))
			for r, k := range part {
				col[r] = k[i]
			}
			args[i] = col
		}
		rows, err := q.Query(ctx, sql, args...)
		if err != nil {
			return nil, err
		}
		ns, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil {
			return nil, err
		}
		for _, n := range ns {
			out = append(out, part[n-1])
		}
	}
	return out, nil
}

// moveResult is what one move wrote into the WAL.
type moveResult struct {
	deleted, upserted int
	// listed are the state's keys of the table; within those in the
	// partitions that lost rows, looked up in the table; lookTook is the
	// time the first look took, lockTook the time the lock was held.
	listed, within     int
	lookTook, lockTook time.Duration
	// after is a source WAL position after the move's commit.
	after wal.LSN
}

// moveRows follows a change of parent's partitions that moved rows (see the
// top of this file). It must run once the pipeline has applied everything
// committed before the change was seen.
func (w *partitionWatcher) moveRows(ctx context.Context, parent config.TableName, m pendingMove) (moveResult, error) {
	var res moveResult
	var gone [][]string
	var keyCols []string
	if m.left() {
		start := time.Now()
		sr, err := readRelation(ctx, w.source, parent)
		if err != nil {
			return res, err
		}
		// A first look without the lock, a chunk of the state at a time:
		// only keys in the partitions that lost rows can have left, and
		// most of those are still there.
		found := map[string][]string{}
		err = w.tableStateKeys(ctx, parent, func(sk stateKeys) error {
			keyCols = sk.columns
			res.listed += len(sk.keys)
			if !m.unbounded {
				var err error
				if sk.keys, err = keysWithin(ctx, w.source, sr, sk, m.bounds); err != nil {
					return err
				}
			}
			res.within += len(sk.keys)
			absent, err := absentKeys(ctx, w.source, sr, sk)
			for _, k := range absent {
				found[strings.Join(k, "\x00")] = k
			}
			return err
		})
		if err != nil {
			return res, err
		}
		for _, k := range slices.Sorted(maps.Keys(found)) {
			gone = append(gone, found[k])
		}
		res.lookTook = time.Since(start)
	}
	// A writer that holds the table for long must not have every other
	// writer queue behind the lock request most of the time: the waits
	// for the lock are short, and the pauses between them grow.
	pause := time.Second
	for attempt := 1; ; attempt++ {
		t, err := w.tryMove(ctx, parent, m, keyCols, gone)
		res.deleted, res.upserted, res.after, res.lockTook = t.deleted, t.upserted, t.after, t.lockTook
		if pgErr, ok := errors.AsType[*pgconn.PgError](err); ok && pgErr.Code == "55P03" {
			w.log.Warn("a transaction holds a partitioned table: following its partition change again shortly",
				"table", parent, "attempt", attempt, "retry_in", pause.String())
			if !sleepCtx(ctx, pause) {
				return res, ctx.Err()
			}
			pause = min(2*pause, maxMovePause)
			continue
		}
		return res, err
	}
}

// tryMove is the source transaction of moveRows.
func (w *partitionWatcher) tryMove(ctx context.Context, parent config.TableName, m pendingMove, keyCols []string, gone [][]string) (moveResult, error) {
	var res moveResult
	tx, err := w.source.Begin(ctx)
	if err != nil {
		return res, fmt.Errorf("follow the partitions of %s: %w", parent, err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = '"+moveLockTimeout+"'"); err != nil {
		return res, fmt.Errorf("follow the partitions of %s: %w", parent, err)
	}
	if _, err := tx.Exec(ctx, "LOCK TABLE "+tableIdent(parent)+" IN SHARE MODE"); err != nil {
		return res, fmt.Errorf("lock %s to follow its partitions: %w", parent, err)
	}
	locked := time.Now()
	sr, err := readRelation(ctx, tx, parent)
	if err != nil {
		return res, err
	}
	mw := &moveWriter{ctx: ctx, tx: tx, prefix: cdc.MessagePrefix(w.cfg.Slot), header: func(e *cdc.Embedded) {
		for _, t := range sr.types {
			e.Type(t.oid, t.namespace, t.name)
		}
		e.Relation(sr.rel)
	}}
	if len(gone) > 0 {
		still, err := absentKeys(ctx, tx, sr, stateKeys{columns: keyCols, keys: gone})
		if err != nil {
			return res, err
		}
		tuple := make([]*string, len(sr.rel.Columns))
		for _, k := range still {
			clear(tuple)
			for i, name := range keyCols {
				tuple[sr.rel.ColumnIndex(name)] = &k[i]
			}
			mw.add(func(e *cdc.Embedded) { e.Delete(sr.rel.ID, tuple) })
			if err := mw.flushIfFull(); err != nil {
				return res, err
			}
		}
		res.deleted = len(still)
	}
	for _, l := range m.entered {
		n, err := w.readPartition(ctx, tx, sr, l, mw)
		if err != nil {
			return res, err
		}
		res.upserted += n
	}
	if err := mw.flush(); err != nil {
		return res, err
	}
	if err := tx.Commit(ctx); err != nil {
		return res, fmt.Errorf("follow the partitions of %s: %w", parent, err)
	}
	res.lockTook = time.Since(locked)
	var after int64
	if err := w.source.QueryRow(ctx, `SELECT (pg_current_wal_lsn() - '0/0')::bigint`).Scan(&after); err != nil {
		return res, fmt.Errorf("read the source's WAL position: %w", err)
	}
	res.after = wal.LSN(after)
	return res, nil
}

// readPartition writes an update of every row of partition l (attached to
// sr's table) into mw, and returns how many.
func (w *partitionWatcher) readPartition(ctx context.Context, tx pgx.Tx, sr *sourceRelation, l leaf, mw *moveWriter) (int, error) {
	// Under the lock on the parent, the partition cannot be detached.
	var schema, name string
	if err := tx.QueryRow(ctx, `SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = $1`,
		l.oid).Scan(&schema, &name); err != nil {
		return 0, fmt.Errorf("look up partition %s: %w", l.name, err)
	}
	cols := make([]string, len(sr.rel.Columns))
	for i, c := range sr.rel.Columns {
		cols[i] = ident(c.Name)
	}
	// A cursor, so that the messages are written between its pages.
	if _, err := tx.Exec(ctx, "DECLARE fkmat_move NO SCROLL CURSOR FOR SELECT "+strings.Join(cols, ", ")+
		" FROM ONLY "+pgx.Identifier{schema, name}.Sanitize()); err != nil {
		return 0, fmt.Errorf("read partition %s: %w", l.name, err)
	}
	n := 0
	tuple := make([]*string, len(cols))
	for {
		// The text format: each value as its type's output function
		// writes it, as pgoutput sends it.
		rr := tx.Conn().PgConn().ExecParams(ctx, "FETCH 10000 FROM fkmat_move", nil, nil, nil, nil)
		page := 0
		for rr.NextRow() {
			for i, v := range rr.Values() {
				if v == nil {
					tuple[i] = nil
					continue
				}
				s := string(v)
				tuple[i] = &s
			}
			mw.add(func(e *cdc.Embedded) { e.Update(sr.rel.ID, tuple) })
			page++
		}
		if _, err := rr.Close(); err != nil {
			return 0, fmt.Errorf("read partition %s: %w", l.name, err)
		}
		if err := mw.flushIfFull(); err != nil {
			return 0, err
		}
		n += page
		if page == 0 {
			break
		}
	}
	if _, err := tx.Exec(ctx, "CLOSE fkmat_move"); err != nil {
		return 0, fmt.Errorf("read partition %s: %w", l.name, err)
	}
	return n, nil
}

// moveWriter writes a move's changes as messages of about moveMessageBytes
// or more, each starting with the relation's description.
type moveWriter struct {
	ctx    context.Context
	tx     pgx.Tx
	prefix string
	e      cdc.Embedded
	header func(e *cdc.Embedded)
	rows   int
}

// add adds one change to the message being built.
func (w *moveWriter) add(change func(e *cdc.Embedded)) {
	if w.rows == 0 {
		w.e.Reset()
		w.header(&w.e)
	}
	change(&w.e)
	w.rows++
}

func (w *moveWriter) flushIfFull() error {
	if w.e.Len() < moveMessageBytes {
		return nil
	}
	return w.flush()
}

// flush writes the message built, if it holds changes.
func (w *moveWriter) flush() error {
	if w.rows == 0 {
		return nil
	}
	if _, err := w.tx.Exec(w.ctx, `SELECT pg_logical_emit_message(true, $1, $2::bytea)`, w.prefix, w.e.Bytes()); err != nil {
		return fmt.Errorf("write the rows of a partition change into the WAL: %w", err)
	}
	w.rows = 0
	return nil
}
