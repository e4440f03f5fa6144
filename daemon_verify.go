package fkmat

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/fkmat/fkmat/internal/pipeline"
	"github.com/fkmat/fkmat/internal/plan"
	"github.com/fkmat/fkmat/internal/wal"

	"github.com/jackc/pgx/v5/pgxpool"
)

// verifyChunkRows is how many left keys one comparison of the background
// verifier covers.
const verifyChunkRows = 1000

// verifyRecheckTries is how often a differing key is read again while the
// source keeps changing it, before the verifier lets it go unconfirmed.
const verifyRecheckTries = 3

// verifyLoop compares every target with its SQL join in the background,
// once per Options.VerifyInterval (counted from the end of a round), until
// ctx is done. A round walks each join's left table by key range, a chunk
// of verifyChunkRows keys at a time, and pauses between chunks for three
// times as long as a chunk took, so it uses at most a quarter of a
// connection's time; it reads in short read-only snapshots and takes no
// lock a writer or the pipeline waits for.
//
// The target lags the source (and may have applied changes committed after
// a snapshot the verifier read), so a key that differs is only a suspect:
// see confirm.
func (d *daemon) verifyLoop(ctx context.Context, p *pipeline.Pipeline, v *verifyCounters) error {
	if d.opts.VerifyInterval <= 0 {
		return nil
	}
	warned := rateLimit{}
	t := time.NewTimer(d.opts.VerifyInterval)
	defer t.Stop()
	for ticked(ctx, t.C) {
		start, checked := time.Now(), v.checked()
		complete := true
		for _, j := range d.joins {
			jv := v.join(j.Plan().Name)
			jv.current.Store(0)
			if err := d.verifyJoin(ctx, p, j.Plan(), jv); err != nil {
				if ctx.Err() != nil {
					return nil
				}
				complete = false
				if warned.allow("verify "+j.Plan().Name, time.Now()) {
					d.log.Warn("background verification failed; trying again next round", "join", j.Plan().Name, "err", err)
				}
			} else {
				jv.last.Store(jv.current.Load())
				jv.current.Store(0)
			}
		}
		if complete {
			v.rounds.Add(1)
		}
		d.log.Info("background verification round done", "complete", complete, "rows_checked", v.checked()-checked,
			"differences", v.differences(), "seconds", time.Since(start).Seconds())
		t.Reset(d.opts.VerifyInterval)
	}
	return nil
}

// verifyMaxSuspects bounds the suspects a round holds before it confirms
// them.
const verifyMaxSuspects = 20_000

// verifyJoin runs one round over one join. Suspects are collected over the
// chunks and confirmed together (at the end, or when verifyMaxSuspects
// have gathered), so that a round waits for the daemon's lag once, not
// once per chunk.
func (d *daemon) verifyJoin(ctx context.Context, p *pipeline.Pipeline, jp *plan.JoinPlan, v *joinVerify) error {
	q := newVerifyQueries(jp)
	var lo []*string
	var suspects []suspect
	settle := func() error {
		if len(suspects) == 0 {
			return nil
		}
		confirmed, err := d.confirm(ctx, p, q, suspects)
		if err != nil {
			return err
		}
		for _, s := range confirmed {
			attrs := []any{"join", jp.Name, "target", jp.Target.Ident(), "kind", s.kind, "key", keyText(s.key)}
			if len(s.columns) > 0 {
				attrs = append(attrs, "columns", strings.Join(s.columns, ","))
			}
			d.log.Error("the target differs from the SQL join", attrs...)
		}
		v.current.Add(int64(len(confirmed)))
		suspects = nil
		return nil
	}
	for {
		start := time.Now()
		c, err := q.chunk(ctx, d.source, d.target, lo)
		if err != nil {
			return err
		}
		v.checked.Add(c.rows)
		suspects = append(suspects, c.suspects...)
		if c.hi == nil || len(suspects) >= verifyMaxSuspects {
			if err := settle(); err != nil {
				return err
			}
		}
		if c.hi == nil {
			return nil
		}
		lo = c.hi
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(max(3*time.Since(start), 10*time.Millisecond)):
		}
	}
}

// suspect is a key whose target row differed from the SQL join once.
type suspect struct {
	kind string // missing, extra, different
	key  []*string
	// columns are, for a confirmed "different", the target columns that
	// differ (names only: values are never logged).
	columns []string
}

// differing names the target columns whose values differ between rows
// e and a.
func (q *verifyQueries) differing(e, a []*string) []string {
	var out []string
	for i := range e {
		if (e[i] == nil) != (a[i] == nil) || deref(e[i]) != deref(a[i]) {
			out = append(out, q.plan.Target.Columns[i].Name)
		}
	}
	return out
}

// confirm reads the suspects again until each is settled: it reads their
// SQL join rows in a snapshot of the source (at WAL position lsn), waits
// until the daemon has applied everything committed before lsn, reads
// their target rows, and reads the source again. A key whose source rows
// did not change between the two reads and whose target row differs from
// them is a confirmed difference; a key the source changed meanwhile is
// read again, up to verifyRecheckTries times, and then let go.
func (d *daemon) confirm(ctx context.Context, p *pipeline.Pipeline, q *verifyQueries, suspects []suspect) ([]suspect, error) {
	var confirmed []suspect
	for try := 0; try < verifyRecheckTries && len(suspects) > 0; try++ {
		keys := make([][]*string, len(suspects))
		for i, s := range suspects {
			keys[i] = s.key
		}
		before, lsn, err := q.expectedRows(ctx, d.source, keys)
		if err != nil {
			return nil, err
		}
		if err := waitApplied(ctx, p, lsn); err != nil {
			return nil, err
		}
		actual, err := q.targetRows(ctx, d.target, keys)
		if err != nil {
			return nil, err
		}
		after, _, err := q.expectedRows(ctx, d.source, keys)
		if err != nil {
			return nil, err
		}
		var again []suspect
		for _, s := range suspects {
			k := keyText(s.key)
			e, a := before[k], actual[k]
			switch {
			case !sameRow(e, after[k]):
				again = append(again, s) // changed on the source meanwhile
			case e == nil && a != nil:
				confirmed = append(confirmed, suspect{kind: "extra", key: s.key})
			case e != nil && a == nil:
				confirmed = append(confirmed, suspect{kind: "missing", key: s.key})
			case e != nil && !rowsEqual(e, a, q.approx):
				confirmed = append(confirmed, suspect{kind: "different", key: s.key, columns: q.differing(e, a)})
			}
		}
		suspects = again
	}
	return confirmed, nil
}

func sameRow(a, b []*string) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	return rowsEqual(a, b, nil)
}

// waitApplied waits until the pipeline has applied every transaction
// committed before lsn: its acknowledgement, or the position it reported
// to the server (which passes WAL without changes for it), reached lsn.
func waitApplied(ctx context.Context, p *pipeline.Pipeline, lsn wal.LSN) error {
	for {
		st := p.SourceStats()
		if st.AckedLSN >= lsn || st.ReportedLSN >= lsn {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// verifyQueries builds the background verifier's SQL for one join.
type verifyQueries struct {
	plan *plan.JoinPlan
	nk   int
	// approx are the columns compared within floatTolerance (approxColumns).
	approx []bool
	cols   string // the target's columns, quoted, in order
	// order sorts by the key's text forms, as compareKeys does.
	order string
	// keyTypes are the key columns' types, to cast text parameters.
	keyTypes []string
	leftKey  []string // l."k" for each key column
	tgtKey   []string // t."k" for each key column
}

func newVerifyQueries(p *plan.JoinPlan) *verifyQueries {
	q := &verifyQueries{plan: p, nk: p.Target.KeyCount, approx: approxColumns(p)}
	var cols, order []string
	for i, c := range p.Target.Columns {
		cols = append(cols, ident(c.Name))
		if i < q.nk {
			order = append(order, ident(c.Name)+`::text COLLATE "C"`)
			q.tgtKey = append(q.tgtKey, "t."+ident(c.Name))
		}
	}
	for _, k := range p.Left.Key {
		q.leftKey = append(q.leftKey, "l."+ident(k.Name))
		q.keyTypes = append(q.keyTypes, k.Type)
	}
	q.cols, q.order = strings.Join(cols, ", "), " ORDER BY "+strings.Join(order, ", ")
	return q
}

// row returns ROW($n::type, ...) for one key, appending its values to args.
func (q *verifyQueries) row(key []*string, args *[][]byte) string {
	parts := make([]string, len(key))
	for i, k := range key {
		*args = append(*args, []byte(deref(k)))
		parts[i] = "$" + strconv.Itoa(len(*args)) + "::" + q.keyTypes[i]
	}
	return "ROW(" + strings.Join(parts, ", ") + ")"
}

// rangeCond is the condition lo < key <= hi on the key columns cols
// (either bound may be nil: open).
func (q *verifyQueries) rangeCond(cols []string, lo, hi []*string, args *[][]byte) string {
	key := "ROW(" + strings.Join(cols, ", ") + ")"
	conds := []string{"true"}
	if lo != nil {
		conds = append(conds, key+" > "+q.row(lo, args))
	}
	if hi != nil {
		conds = append(conds, key+" <= "+q.row(hi, args))
	}
	return strings.Join(conds, " AND ")
}

// inCond is the condition key IN (the keys) on the key columns cols.
func (q *verifyQueries) inCond(cols []string, keys [][]*string, args *[][]byte) string {
	rows := make([]string, len(keys))
	for i, k := range keys {
		rows[i] = q.row(k, args)
	}
	return "ROW(" + strings.Join(cols, ", ") + ") IN (" + strings.Join(rows, ", ") + ")"
}

// expectedSQL is the SQL join restricted by cond on the left table's key.
func (q *verifyQueries) expectedSQL(cond string) string {
	return "SELECT " + q.cols + " FROM (" + OracleSQL(q.plan) + " WHERE " + cond + ") e" + q.order
}

// chunkResult is one compared chunk.
type chunkResult struct {
	rows     int64
	hi       []*string // the chunk's last key; nil when it was the last chunk
	suspects []suspect
}

// chunk compares the keys after lo (the first chunk when nil): it picks the
// chunk's upper bound and reads the SQL join rows in one source snapshot,
// then the target rows in the same key range, and merges them.
func (q *verifyQueries) chunk(ctx context.Context, source, target *pgxpool.Pool, lo []*string) (chunkResult, error) {
	var c chunkResult
	var expected map[string][]*string
	var order []string
	err := inSnapshotText(ctx, source, func(read func(sql string, args [][]byte) (*textRows, error)) error {
		var args [][]byte
		rs, err := read("SELECT "+strings.Join(q.leftKey, ", ")+" FROM "+plan.FromSQL(&q.plan.Left)+" l WHERE "+
			q.rangeCond(q.leftKey, lo, nil, &args)+" ORDER BY "+strings.Join(q.leftKey, ", ")+
			" LIMIT 1 OFFSET "+strconv.Itoa(verifyChunkRows-1), args)
		if err != nil {
			return err
		}
		c.hi = rs.next()
		if err := rs.err(); err != nil {
			return err
		}
		args = nil
		rs, err = read(q.expectedSQL(q.rangeCond(q.leftKey, lo, c.hi, &args)), args)
		if err != nil {
			return err
		}
		expected, order = collectRows(rs, q.nk)
		return rs.err()
	})
	if err != nil {
		return c, fmt.Errorf("verify join %q on the source: %w", q.plan.Name, err)
	}
	var args [][]byte
	actual, err := readRows(ctx, target, "SELECT "+q.cols+" FROM "+q.plan.Target.Ident()+" t WHERE "+
		q.rangeCond(q.tgtKey, lo, c.hi, &args)+q.order, args, q.nk)
	if err != nil {
		return c, fmt.Errorf("verify join %q on the target: %w", q.plan.Name, err)
	}
	c.rows = int64(len(expected))
	for _, k := range order {
		e := expected[k]
		a, ok := actual[k]
		switch {
		case !ok:
			c.suspects = append(c.suspects, suspect{kind: "missing", key: e[:q.nk]})
		case !rowsEqual(e, a, q.approx):
			c.suspects = append(c.suspects, suspect{kind: "different", key: e[:q.nk]})
		}
		delete(actual, k)
	}
	for _, a := range actual {
		c.suspects = append(c.suspects, suspect{kind: "extra", key: a[:q.nk]})
	}
	return c, nil
}

// verifyKeysPerQuery bounds the keys one query of expectedRows or
// targetRows names.
const verifyKeysPerQuery = 500

// expectedRows reads the SQL join rows of keys in one source snapshot, and
// the source's WAL position at it.
func (q *verifyQueries) expectedRows(ctx context.Context, source *pgxpool.Pool, keys [][]*string) (map[string][]*string, wal.LSN, error) {
	rows := map[string][]*string{}
	var lsn wal.LSN
	err := inSnapshotText(ctx, source, func(read func(sql string, args [][]byte) (*textRows, error)) error {
		rs, err := read("SELECT pg_current_wal_lsn()::text", nil)
		if err != nil {
			return err
		}
		row := rs.next()
		if err := rs.err(); err != nil {
			return err
		}
		if lsn, err = wal.ParseLSN(deref(row[0])); err != nil {
			return err
		}
		for part := range slices.Chunk(keys, verifyKeysPerQuery) {
			var args [][]byte
			rs, err = read(q.expectedSQL(q.inCond(q.leftKey, part, &args)), args)
			if err != nil {
				return err
			}
			got, _ := collectRows(rs, q.nk)
			if err := rs.err(); err != nil {
				return err
			}
			maps.Copy(rows, got)
		}
		return nil
	})
	if err != nil {
		return nil, 0, fmt.Errorf("verify join %q on the source: %w", q.plan.Name, err)
	}
	return rows, lsn, nil
}

// targetRows reads the target rows of keys.
func (q *verifyQueries) targetRows(ctx context.Context, target *pgxpool.Pool, keys [][]*string) (map[string][]*string, error) {
	rows := map[string][]*string{}
	for part := range slices.Chunk(keys, verifyKeysPerQuery) {
		var args [][]byte
		got, err := readRows(ctx, target, "SELECT "+q.cols+" FROM "+q.plan.Target.Ident()+" t WHERE "+q.inCond(q.tgtKey, part, &args), args, q.nk)
		if err != nil {
			return nil, fmt.Errorf("verify join %q on the target: %w", q.plan.Name, err)
		}
		maps.Copy(rows, got)
	}
	return rows, nil
}

// collectRows reads rs into a map by key text, and the keys in order.
func collectRows(rs *textRows, nk int) (map[string][]*string, []string) {
	out := map[string][]*string{}
	var order []string
	for row := rs.next(); row != nil; row = rs.next() {
		k := keyText(row[:nk])
		out[k] = row
		order = append(order, k)
	}
	return out, order
}

// readRows runs one query outside a transaction and collects its rows.
func readRows(ctx context.Context, pool *pgxpool.Pool, sql string, args [][]byte, nk int) (map[string][]*string, error) {
	rs, err := openRowsArgs(ctx, pool, sql, args)
	if err != nil {
		return nil, err
	}
	defer rs.close()
	rows, _ := collectRows(rs, nk)
	return rows, rs.err()
}

// inSnapshotText runs fn in a read-only repeatable-read transaction on one
// source connection, with text forms independent of session settings; read
// runs one query in it (close each result before the next).
func inSnapshotText(ctx context.Context, pool *pgxpool.Pool, fn func(read func(sql string, args [][]byte) (*textRows, error)) error) error {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; "+textSettingsSQL); err != nil {
		return err
	}
	defer func() { _, _ = conn.Exec(context.WithoutCancel(ctx), "ROLLBACK") }()
	var open *textRows
	read := func(sql string, args [][]byte) (*textRows, error) {
		if open != nil {
			_ = open.err()
		}
		open = &textRows{rr: conn.Conn().PgConn().ExecParams(ctx, sql, args, nil, nil, nil)}
		return open, nil
	}
	err = fn(read)
	if open != nil {
		if cerr := open.err(); err == nil {
			err = cerr
		}
	}
	return err
}
