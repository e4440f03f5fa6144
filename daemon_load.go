package fkmat

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/fkmat/fkmat/internal/pipeline"
	"github.com/fkmat/fkmat/internal/plan"
	"github.com/fkmat/fkmat/internal/wal"

	"github.com/fkmat/fkmat/internal/config"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fkmat/fkmat/join"
	"github.com/fkmat/fkmat/redisstore"
	"github.com/fkmat/fkmat/sink"
)

// loadPage is the number of rows per page read from the source.
const loadPage = 10_000

// loader builds joins' targets and Redis states from an exported snapshot
// of the source: the backfill's joins, and a rebuild's new generation
// beside the running joins. Both run the same sequence (run).
type loader struct {
	cfg            *config.Config
	log            *slog.Logger
	bars           io.Writer // Options.ProgressBars
	source, target *pgxpool.Pool
	obs            *observer // nil without --metrics-addr
	joins          []pipeline.Join
	// streaming says the joins' slot streams while this loads (a rebuild
	// beside them): the load spares it (chunkTarget).
	streaming bool
	// chunkBytes is Options.TargetChunkBytes (insertTarget).
	chunkBytes int64
}

// loaderOf is the daemon's loader of joins.
func (d *daemon) loaderOf(joins []pipeline.Join, log *slog.Logger, streaming bool) *loader {
	return &loader{cfg: d.cfg, log: log, bars: d.opts.ProgressBars, source: d.source, target: d.target, obs: d.obs,
		joins: joins, streaming: streaming, chunkBytes: cmp.Or(d.opts.TargetChunkBytes, DefaultTargetChunkBytes)}
}

// run is the load sequence. Each join's states are initialised under
// epoch, sized for the tables as the catalog counts them; the targets'
// shadows and the states are filled from the snapshot (load); the
// snapshot is checked against truncations and partition changes that raced
// the loads (checkRaced); then each state's checkpoint is set to the
// snapshot's consistent point. It returns the rows loaded into the targets
// and the leaf partitions the snapshot saw. The caller swaps the shadows
// in.
func (l *loader) run(ctx context.Context, epoch, snapshot string, consistent wal.LSN) (int64, map[uint32]leaf, error) {
	for _, j := range l.joins {
		sizes := stateSizes(ctx, l.source, j.Plan())
		for i, s := range j.Stores() {
			if err := s.Init(ctx, epoch, j.Plan().Fingerprint, sizes[i]); err != nil {
				return 0, nil, fmt.Errorf("join %q: %w", j.Plan().Name, err)
			}
		}
	}
	rows, err := l.load(ctx, snapshot)
	if err != nil {
		return 0, nil, err
	}
	leaves, err := l.checkRaced(ctx, snapshot)
	if err != nil {
		return 0, nil, err
	}
	for _, j := range l.joins {
		// The tables of a join of more than two tables commit from the
		// last to the first, as while streaming.
		stores := j.Stores()
		for i := len(stores) - 1; i >= 0; i-- {
			if err := stores[i].Commit(ctx, join.Mutations{}, consistent); err != nil {
				return 0, nil, fmt.Errorf("join %q: %w", j.Plan().Name, err)
			}
		}
	}
	return rows, leaves, nil
}

// load is the initial load inside the exported snapshot: for every join, in
// parallel, the target is filled by streaming the SQL join out of the source
// with COPY into the target with COPY, and the Redis state is built from the
// left and the right table, each streamed in its own snapshot transaction.
// Memory is bounded by a few pages per stream, whatever the table sizes.
func (l *loader) load(ctx context.Context, snapshot string) (int64, error) {
	prog := newProgress(l.log.With("component", "backfill"), l.bars)
	defer prog.close()
	pctx, stop := context.WithCancel(ctx)
	defer stop()
	go prog.run(pctx)
	recorded := make(chan struct{})
	go func() {
		defer close(recorded)
		l.recordBuild(pctx, prog)
	}()
	defer func() {
		stop()
		<-recorded
	}()

	// The loads, longest first (so that a large table does not start last
	// and finish alone), four at a time: the server's joins and scans, and
	// fkmat's encoding and Redis writes, keep both cores busy.
	type load struct {
		t  *task
		fn func(context.Context) error
	}
	var loads []load
	add := func(t *task, fn func(context.Context) error) { loads = append(loads, load{t, fn}) }
	var targets []*task
	for _, j := range l.joins {
		p := j.Plan()
		target := prog.add(p.Name, "target", rowsOrZero(ctx, l.source, p.Left.Table))
		targets = append(targets, target)
		add(target, func(ctx context.Context) error { return l.loadTarget(ctx, snapshot, p, target) })
		if p.Edges != nil {
			// Each table once, into its own state: its rows and its
			// references to the entries it references.
			layout := pipeline.TreeLayoutOf(p)
			for tab := range len(p.Edges) + 1 {
				name, table := p.Left.Table.String(), &p.Left
				if tab > 0 {
					name, table = p.Edges[tab-1].Alias, &p.Edges[tab-1].Table
				}
				task := prog.add(p.Name, "table "+name, rowsOrZero(ctx, l.source, table.Table))
				add(task, func(ctx context.Context) error {
					return l.loadRows(ctx, snapshot, table, layout.Columns(p, tab), j.Stores()[tab], task,
						func(rows [][]join.Value) (join.Mutations, error) { return layout.Load(tab, rows) },
						fmt.Sprintf("load the rows of %s of join %q", name, p.Name))
				})
			}
			for k := range p.Rollups {
				l.addRollupLoads(ctx, prog, snapshot, j, layout, k, add)
			}
			continue
		}
		right := prog.add(p.Name, "right "+p.Right.Table.String(), rowsOrZero(ctx, l.source, p.Right.Table))
		left := prog.add(p.Name, "left "+p.Left.Table.String(), rowsOrZero(ctx, l.source, p.Left.Table))
		add(right, func(ctx context.Context) error { return l.loadRight(ctx, snapshot, j, right) })
		add(left, func(ctx context.Context) error { return l.loadLeft(ctx, snapshot, j, left) })
	}
	slices.SortStableFunc(loads, func(a, b load) int { return cmp.Compare(b.t.total.Load(), a.t.total.Load()) })
	g, gctx := newGroup(ctx)
	g.SetLimit(loadsAtOnce)
	for _, ld := range loads {
		g.Go(func() error { return ld.fn(gctx) })
	}
	if err := g.Wait(); err != nil {
		return 0, fmt.Errorf("backfill: %w", err)
	}
	if prog.bars == nil {
		prog.report()
	}
	var total int64
	for _, t := range targets {
		total += t.done.Load()
	}
	return total, nil
}

// addRollupLoads adds the loads of roll-up k of tree j: its children, with
// each parent's accumulators, into its own state, and its results by
// parent into the tree's entry of them. The results come from the
// children's load when it computes them (join.Rollup.LoadsResults: every
// ordered aggregate has a LIMIT, or is min or max), else from the
// children grouped by the SQL of RollupResultsSQL: a second grouping of
// every child in the source, which took as much of its CPU as the
// target's own.
func (l *loader) addRollupLoads(ctx context.Context, prog *progress, snapshot string, j pipeline.Join, layout *pipeline.TreeLayout, k int,
	add func(*task, func(context.Context) error)) {
	p := j.Plan()
	r := &p.Rollups[k]
	results := len(p.Edges) + 1 + k
	children := results + len(p.Rollups)
	name := r.Table.Table.String()
	rows := rowsOrZero(ctx, l.source, r.Table.Table)
	spec := pipeline.RollupSpecOf(p, k)
	ro, roErr := join.NewRollup(spec)
	fromLoad := roErr == nil && ro.LoadsResults()
	if !fromLoad {
		res := prog.add(p.Name, "roll-up results "+name, rowsOrZero(ctx, l.source, p.Left.Table))
		add(res, func(ctx context.Context) error {
			return l.loadQuery(ctx, snapshot, RollupResultsSQL(p, k), j.Stores()[results], res,
				func(rows [][]join.Value) (join.Mutations, error) { return layout.Load(results, rows) }, nil,
				fmt.Sprintf("load the results of the roll-up of %s of join %q", name, p.Name))
		})
	}
	kids := prog.add(p.Name, "roll-up "+name, rows)
	add(kids, func(ctx context.Context) error {
		if roErr != nil {
			return roErr
		}
		ld := ro.Load()
		cols := append(append(slices.Clone(r.Table.Key), r.Table.ForeignKey...), r.Inputs...)
		query := selectColumns(&r.Table, cols) + " ORDER BY " + parentOrder(r.Table.ForeignKey, spec.Parent)
		what := fmt.Sprintf("load the roll-up of %s of join %q", name, p.Name)
		if !fromLoad {
			return l.loadQuery(ctx, snapshot, query, j.Stores()[children], kids,
				func(rows [][]join.Value) (join.Mutations, error) {
					m, _, err := ld.Page(rows)
					return m, err
				},
				func() join.Mutations {
					m, _ := ld.Finish()
					return m
				}, what)
		}
		// The results' rows: the parent key, then the aggregates, as
		// RollupResultsSQL gives them.
		resultRows := func(outs []join.RollupOutput) (join.Mutations, error) {
			rows := make([][]join.Value, len(outs))
			for i, o := range outs {
				rows[i] = append(slices.Clip(o.Parent), o.Values...)
			}
			return layout.Load(results, rows)
		}
		stores := []loadTarget{{j.Stores()[children], kids.name}, {j.Stores()[results], kids.name + " results"}}
		return l.loadQueryInto(ctx, snapshot, query, stores, kids,
			func(rows [][]join.Value) ([]join.Mutations, error) {
				m, outs, err := ld.Page(rows)
				if err != nil {
					return nil, err
				}
				rm, err := resultRows(outs)
				return []join.Mutations{m, rm}, err
			},
			func() ([]join.Mutations, error) {
				m, outs := ld.Finish()
				rm, err := resultRows(outs)
				return []join.Mutations{m, rm}, err
			}, what)
	})
}

// parentOrder is the ORDER BY that puts a roll-up's children of one parent
// next to each other (join.RollupLoad): by their foreign key columns fks,
// of key families fams, so that the values one encoded key stands for sort
// together: text by its bytes (COLLATE "C": a nondeterministic collation
// could interleave equal values of other bytes), a type compared as its
// text (join.FamilyExact) by that text, the others (integers, numeric,
// uuid, floats) by their values.
func parentOrder(fks []plan.SourceColumn, fams []join.Family) string {
	items := make([]string, len(fks))
	for i, fk := range fks {
		col := "t." + ident(fk.Name)
		switch fams[i] {
		case join.FamilyText, join.FamilyBpchar:
			col += ` COLLATE "C"`
		case join.FamilyExact:
			col += `::text COLLATE "C"`
		}
		items[i] = col
	}
	return strings.Join(items, ", ")
}

// buildInterval is how often a backfill records its progress in
// fkmat.build (and the metrics of run).
const buildInterval = 500 * time.Millisecond

// recordBuild records the backfill's progress per join in fkmat.build and
// in run's metrics, every buildInterval until ctx is done. A failed write
// is only logged: progress is information, not state.
func (l *loader) recordBuild(ctx context.Context, prog *progress) {
	t := time.NewTicker(buildInterval)
	defer t.Stop()
	for ticked(ctx, t.C) {
		joins := prog.joins()
		batch := &pgx.Batch{}
		for _, name := range slices.Sorted(maps.Keys(joins)) {
			n := joins[name]
			batch.Queue(`UPDATE fkmat.build SET rows_done = $3, rows_total = $4, updated_at = now() WHERE slot = $1 AND join_name = $2`,
				l.cfg.Slot, name, n[0], n[1])
			l.obs.setBuild(name, n[0], n[1])
		}
		if err := l.target.SendBatch(ctx, batch).Close(); err != nil && ctx.Err() == nil {
			l.log.Warn("could not record the backfill's progress in fkmat.build", "err", err)
		}
	}
	l.obs.setBuild("", 0, 0)
}

// rowsOrZero is tableRows of a table, 0 when it cannot be read.
func rowsOrZero(ctx context.Context, source *pgxpool.Pool, t config.TableName) int64 {
	n, err := tableRows(ctx, source, t)
	if err != nil {
		return 0
	}
	return n
}

// inSnapshot runs fn on a source connection whose transaction sees the
// exported snapshot.
func inSnapshot(ctx context.Context, pool *pgxpool.Pool, snapshot string, fn func(*pgx.Conn) error) error {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return fmt.Errorf("begin snapshot transaction: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, "SET TRANSACTION SNAPSHOT "+quoteLiteral(snapshot)); err != nil {
		return fmt.Errorf("import snapshot %s: %w", snapshot, err)
	}
	return fn(conn.Conn())
}

// loadTarget fills the target's shadow (sink.ShadowOf) with the SQL join
// as of the snapshot; finishBackfill swaps it in. When the target is the
// source database, Postgres does it alone: `INSERT INTO shadow SELECT <the
// join>` in transactions that import the snapshot (insertTarget).
// Otherwise it pipes `COPY (<the join>) TO STDOUT` from the snapshot into
// `COPY shadow FROM STDIN` on the target, in a target transaction that
// creates the shadow first (so COPY can FREEZE the rows). A shadow left by
// an interrupted backfill is dropped first.
func (l *loader) loadTarget(ctx context.Context, snapshot string, p *plan.JoinPlan, t *task) error {
	if l.cfg.Target != l.cfg.Source {
		return l.copyTarget(ctx, snapshot, p, t)
	}
	// A join with roll-ups is filled in one statement: each range would
	// group every child again.
	ranged := len(p.Rollups) == 0
	if l.streaming && !ranged {
		return l.chunkTarget(ctx, snapshot, p, t)
	}
	return l.insertTarget(ctx, snapshot, p, t, ranged)
}

// DefaultTargetChunkBytes bounds the rows one transaction of insertTarget
// writes, by the left table's bytes it reads: a quarter of
// logical_decoding_work_mem's default (64 MB) in rows of the left table's
// width, so that a slot decodes the transaction in memory even when the
// target's rows are several times as wide as the left table's.
const DefaultTargetChunkBytes = 16 << 20

// insertTarget is loadTarget within one database. Every logical slot of
// the database decodes the rows written into the shadow: the stream that
// starts at the backfill's consistent point, and, in a rebuild beside
// running joins, their slot. A slot decodes a transaction at its commit,
// whole, and one larger than logical_decoding_work_mem is spilled to disk
// and read back: W7's two shadows, one transaction each, took a new
// join's stream 2.1-2.5 s to decode after the backfill, 1.1-1.3 s in
// transactions of DefaultTargetChunkBytes. So the shadow is filled a range
// of the left table's pages at a time (targetChunks), each range in its
// own transaction that imports the snapshot and commits (ranged; each
// plans with the partitions of its own moment, which checkRaced compares
// with the snapshot's). A join with roll-ups takes one transaction (or
// chunkTarget's, beside running joins).
func (l *loader) insertTarget(ctx context.Context, snapshot string, p *plan.JoinPlan, t *task, ranged bool) error {
	shadow := sink.ShadowOf(&p.Target)
	chunks := []string{""}
	if ranged {
		var err error
		if chunks, err = targetChunks(ctx, l.source, p.Left.Table, l.chunkBytes); err != nil {
			return err
		}
	}
	if _, err := l.source.Exec(ctx, "DROP TABLE IF EXISTS "+shadow.Ident()); err != nil {
		return fmt.Errorf("drop the leftover %s: %w", shadow.Ident(), err)
	}
	if _, err := l.source.Exec(ctx, sink.CreateSQL(shadow)); err != nil {
		return fmt.Errorf("create %s: %w", shadow.Ident(), err)
	}
	conn, err := l.source.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	for _, cond := range chunks {
		n, err := insertChunk(ctx, conn.Conn(), snapshot, shadow, oracleSQLWhere(p, cond))
		if err != nil {
			return fmt.Errorf("fill %s with join %q: %w", shadow.Ident(), p.Name, err)
		}
		t.advance(int(n))
	}
	t.finish()
	return nil
}

// insertChunk inserts the rows of query, run in the snapshot, into shadow,
// in a transaction of its own, and returns how many.
func insertChunk(ctx context.Context, conn *pgx.Conn, snapshot string, shadow *sink.Table, query string) (int64, error) {
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		return 0, fmt.Errorf("begin snapshot transaction: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, "SET TRANSACTION SNAPSHOT "+quoteLiteral(snapshot)); err != nil {
		return 0, fmt.Errorf("import snapshot %s: %w", snapshot, err)
	}
	tag, err := tx.Exec(ctx, "INSERT INTO "+shadow.Ident()+" "+query)
	if err != nil {
		return 0, err
	}
	return tag.RowsAffected(), tx.Commit(ctx)
}

// targetChunks splits table's rows into ranges of pages of about
// chunkBytes each, as conditions on ctid (plan.FromSQLWhere); the last
// range has no end. A partitioned table's ranges apply to each of its leaf
// partitions, sized by the largest. The pages are counted after the
// snapshot was taken: a row the snapshot sees was written before it, in a
// page that existed then, and the open last range covers any other.
func targetChunks(ctx context.Context, source *pgxpool.Pool, table config.TableName, chunkBytes int64) ([]string, error) {
	var pages, perChunk int64
	err := source.QueryRow(ctx, `SELECT coalesce(max(pg_relation_size(c.oid)), 0) / current_setting('block_size')::int8,
			$2::int8 / current_setting('block_size')::int8
		FROM pg_class c
		WHERE (c.oid = to_regclass($1) AND c.relkind <> 'p')
		   OR c.oid IN (SELECT relid FROM pg_partition_tree(to_regclass($1)) WHERE isleaf)`, tableIdent(table), chunkBytes).Scan(&pages, &perChunk)
	if err != nil {
		return nil, fmt.Errorf("count the pages of %s: %w", table, err)
	}
	perChunk = max(perChunk, 1)
	var chunks []string
	for lo := int64(0); ; lo += perChunk {
		from := fmt.Sprintf("ctid >= '(%d,0)'", lo)
		if lo+perChunk >= pages {
			if lo == 0 {
				return []string{""}, nil
			}
			return append(chunks, from), nil
		}
		chunks = append(chunks, fmt.Sprintf("%s AND ctid < '(%d,0)'", from, lo+perChunk))
	}
}

// copyTarget is loadTarget across databases.
func (l *loader) copyTarget(ctx context.Context, snapshot string, p *plan.JoinPlan, t *task) error {
	shadow := sink.ShadowOf(&p.Target)
	return l.copyJoin(ctx, snapshot, p, shadow, &rowCounter{t: t}, func(pr io.Reader) error {
		conn, err := l.target.Acquire(ctx)
		if err != nil {
			return err
		}
		defer conn.Release()
		tx, err := conn.Begin(ctx)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
		// Created in this transaction, so COPY can FREEZE its rows.
		if _, err := tx.Exec(ctx, "DROP TABLE IF EXISTS "+shadow.Ident()); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, sink.CreateSQL(shadow)); err != nil {
			return err
		}
		if _, err := conn.Conn().PgConn().CopyFrom(ctx, pr, "COPY "+shadow.Ident()+" ("+targetColumns(p)+") FROM STDIN WITH (FREEZE)"); err != nil {
			return err
		}
		if err := tx.Commit(ctx); err != nil {
			return err
		}
		t.finish()
		return nil
	})
}

// copyJoin streams the SQL join of p out of the source, in the snapshot,
// as COPY text into consume (through counter when set), and returns the
// first error of either side.
func (l *loader) copyJoin(ctx context.Context, snapshot string, p *plan.JoinPlan, shadow *sink.Table, counter *rowCounter,
	consume func(io.Reader) error) error {
	pr, pw := io.Pipe()
	var w io.Writer = pw
	if counter != nil {
		counter.w, w = pw, counter
	}
	out := make(chan error, 1)
	go func() {
		err := inSnapshot(ctx, l.source, snapshot, func(conn *pgx.Conn) error {
			_, err := conn.PgConn().CopyTo(ctx, w, "COPY ("+OracleSQL(p)+") TO STDOUT")
			return err
		})
		pw.CloseWithError(err)
		out <- err
	}()
	err := consume(pr)
	pr.CloseWithError(err) // unblock the producer if the consumer failed
	if perr := <-out; perr != nil && !errors.Is(perr, io.ErrClosedPipe) {
		return fmt.Errorf("copy join %q out of the source: %w", p.Name, perr)
	}
	if err != nil {
		return fmt.Errorf("copy join %q into %s: %w", p.Name, shadow.Ident(), err)
	}
	return nil
}

// targetColumns lists the target's columns, quoted, for COPY.
func targetColumns(p *plan.JoinPlan) string {
	cols := make([]string, len(p.Target.Columns))
	for i, c := range p.Target.Columns {
		cols[i] = ident(c.Name)
	}
	return strings.Join(cols, ", ")
}

// chunkRows is how many rows chunkTarget commits at a time.
const chunkRows = 20_000

// chunkTarget is loadTarget within one database while the joins stream (a
// rebuild beside them): the shadow's rows are committed a chunk at a time.
// Every logical slot on the database decodes the rows written into it, and
// decodes a transaction whole at its commit, before any later one: the
// INSERT … SELECT of insertTarget, one transaction of every row, left a
// running 10M-row join's target stale for the time its slot took to decode
// it. In chunks, the decoding goes along with the load.
func (l *loader) chunkTarget(ctx context.Context, snapshot string, p *plan.JoinPlan, t *task) error {
	shadow := sink.ShadowOf(&p.Target)
	if _, err := l.target.Exec(ctx, "DROP TABLE IF EXISTS "+shadow.Ident()); err != nil {
		return fmt.Errorf("drop the leftover %s: %w", shadow.Ident(), err)
	}
	if _, err := l.target.Exec(ctx, sink.CreateSQL(shadow)); err != nil {
		return fmt.Errorf("create %s: %w", shadow.Ident(), err)
	}
	copySQL := "COPY " + shadow.Ident() + " (" + targetColumns(p) + ") FROM STDIN"
	err := l.copyJoin(ctx, snapshot, p, shadow, nil, func(pr io.Reader) error {
		conn, err := l.target.Acquire(ctx)
		if err != nil {
			return err
		}
		defer conn.Release()
		in := bufio.NewReaderSize(pr, 1<<20)
		var chunk bytes.Buffer
		for done := false; !done; {
			chunk.Reset()
			rows := 0
			for rows < chunkRows {
				line, err := in.ReadSlice('\n')
				if errors.Is(err, bufio.ErrBufferFull) {
					// A row longer than the buffer: the rest of it follows.
					chunk.Write(line)
					continue
				}
				if err == io.EOF {
					if len(line) > 0 {
						return errors.New("the COPY output ended inside a row")
					}
					done = true
					break
				}
				if err != nil {
					return err
				}
				chunk.Write(line)
				rows++
			}
			if rows == 0 {
				continue
			}
			if _, err := conn.Conn().PgConn().CopyFrom(ctx, &chunk, copySQL); err != nil {
				return err
			}
			t.advance(rows)
		}
		return nil
	})
	if err != nil {
		return err
	}
	t.finish()
	return nil
}

// rowCounter passes COPY text through, counting rows (one newline each:
// COPY escapes newlines inside values).
type rowCounter struct {
	w io.Writer
	t *task
}

func (r *rowCounter) Write(b []byte) (int, error) {
	r.t.advance(strings.Count(string(b), "\n"))
	return r.w.Write(b)
}

// loadRight streams the right table's key and projected columns into the
// join's Redis state.
func (l *loader) loadRight(ctx context.Context, snapshot string, j pipeline.Join, t *task) error {
	p := j.Plan()
	cols := append(append([]plan.SourceColumn{}, p.Right.Key...), outputSources(p.Right.Values)...)
	nk := len(p.Right.Key)
	return l.loadRows(ctx, snapshot, &p.Right, cols, j.Stores()[0], t, func(rows [][]join.Value) (join.Mutations, error) {
		m := join.Mutations{PutRight: make(map[join.Key]join.RightState, len(rows))}
		for _, r := range rows {
			k, err := join.EncodeKey(p.Spec.RightKey, r[:nk])
			if err != nil {
				return m, fmt.Errorf("right key of %s: %w", p.Right.Table, err)
			}
			m.PutRight[k] = join.RightState{Key: r[:nk], Values: r[nk:]}
		}
		return m, nil
	}, fmt.Sprintf("load right rows of join %q", p.Name))
}

// loadLeft streams the left table's key, foreign key and projected columns
// into the join's Redis state: left rows with their value hash, and a
// subscription for every non-NULL foreign key.
func (l *loader) loadLeft(ctx context.Context, snapshot string, j pipeline.Join, t *task) error {
	p := j.Plan()
	cols := append(append(append([]plan.SourceColumn{}, p.Left.Key...), p.Left.ForeignKey...), outputSources(p.Left.Values)...)
	nk, nf := len(p.Left.Key), len(p.Left.ForeignKey)
	return l.loadRows(ctx, snapshot, &p.Left, cols, j.Stores()[0], t, func(rows [][]join.Value) (join.Mutations, error) {
		m := join.Mutations{PutLeft: make(map[join.Key]join.LeftState, len(rows))}
		for _, r := range rows {
			pk, fk, vals := r[:nk], r[nk:nk+nf], r[nk+nf:]
			k, err := join.EncodeKey(p.Spec.PK, pk)
			if err != nil {
				return m, fmt.Errorf("left key of %s: %w", p.Left.Table, err)
			}
			m.PutLeft[k] = join.NewLeftState(pk, fk, vals)
			if anyNull(fk) {
				continue
			}
			f, err := join.EncodeKey(p.Spec.FK, fk)
			if err != nil {
				return m, fmt.Errorf("foreign key of %s: %w", p.Left.Table, err)
			}
			m.AddSubs = append(m.AddSubs, join.Subscription{FK: f, PK: k})
		}
		return m, nil
	}, fmt.Sprintf("load left rows of join %q", p.Name))
}

// loadRows streams cols of table into store: each page of rows becomes the
// mutations muts returns, counted in t. The rows go through a spool
// (redisstore.Spool), written to Redis grouped by key once the table is
// read. what names the load in its error.
func (l *loader) loadRows(ctx context.Context, snapshot string, table *plan.TablePlan, cols []plan.SourceColumn, store *redisstore.Store,
	t *task, muts func(rows [][]join.Value) (join.Mutations, error), what string) error {
	return l.loadQuery(ctx, snapshot, selectColumns(table, cols), store, t, muts, nil, what)
}

// loadQuery is loadRows of the rows of a query; finish, when set, gives
// what the state holds beyond the rows, once they are all read.
func (l *loader) loadQuery(ctx context.Context, snapshot, query string, store *redisstore.Store,
	t *task, muts func(rows [][]join.Value) (join.Mutations, error), finish func() join.Mutations, what string) error {
	var fin func() ([]join.Mutations, error)
	if finish != nil {
		fin = func() ([]join.Mutations, error) { return []join.Mutations{finish()}, nil }
	}
	return l.loadQueryInto(ctx, snapshot, query, []loadTarget{{store, t.name}}, t,
		func(rows [][]join.Value) ([]join.Mutations, error) {
			m, err := muts(rows)
			return []join.Mutations{m}, err
		}, fin, what)
}

// loadTarget is a state a query's rows are loaded into, and its name in
// the log.
type loadTarget struct {
	store *redisstore.Store
	name  string
}

// loadQueryInto is loadQuery into several states at once: muts and finish
// give the mutations of each of stores, in order.
func (l *loader) loadQueryInto(ctx context.Context, snapshot, query string, stores []loadTarget,
	t *task, muts func(rows [][]join.Value) ([]join.Mutations, error), finish func() ([]join.Mutations, error), what string) error {
	err := func() error {
		spools := make([]*redisstore.Spool, len(stores))
		defer func() {
			for _, sp := range spools {
				if sp != nil {
					_ = sp.Close()
				}
			}
		}()
		for i, st := range stores {
			sp, err := st.store.NewSpool(ctx, "", t.total.Load())
			if err != nil {
				return err
			}
			spools[i] = sp
		}
		add := func(ctx context.Context, ms []join.Mutations) error {
			if len(ms) != len(spools) {
				return fmt.Errorf("%d mutations for %d states", len(ms), len(spools))
			}
			for i, m := range ms {
				if err := spools[i].Add(ctx, m); err != nil {
					return err
				}
			}
			return nil
		}
		err := scanQueryParallel(ctx, l.source, snapshot, query, func(ctx context.Context, rows [][]join.Value) error {
			ms, err := muts(rows)
			if err != nil {
				return err
			}
			if err := add(ctx, ms); err != nil {
				return err
			}
			t.advance(len(rows))
			return nil
		})
		if err != nil {
			return err
		}
		if finish != nil {
			ms, err := finish()
			if err != nil {
				return err
			}
			if err := add(ctx, ms); err != nil {
				return err
			}
		}
		for i, sp := range spools {
			if err := sp.Load(ctx); err != nil {
				return err
			}
			commands, entries := sp.Counts()
			l.log.Debug("backfill wrote a table's state", "table", stores[i].name, "temporary_file_bytes", sp.FileBytes(),
				"commands", commands, "rows_and_references", entries)
		}
		return nil
	}()
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	t.finish()
	return nil
}

// loadWorkers is the number of goroutines turning pages into mutations per
// table: reading goes on meanwhile.
const loadWorkers = 3

// scanParallel streams cols of table (scanQuery) and hands its pages to
// loadWorkers goroutines running fn; the first error stops everything.
func scanParallel(ctx context.Context, pool *pgxpool.Pool, snapshot string, table *plan.TablePlan, cols []plan.SourceColumn,
	fn func(context.Context, [][]join.Value) error) error {
	return scanQueryParallel(ctx, pool, snapshot, selectColumns(table, cols), fn)
}

// scanQueryParallel is scanParallel over the rows of a query.
func scanQueryParallel(ctx context.Context, pool *pgxpool.Pool, snapshot, query string,
	fn func(context.Context, [][]join.Value) error) error {
	g, gctx := newGroup(ctx)
	pages := make(chan [][]join.Value, 1)
	g.Go(func() error {
		defer close(pages)
		return inSnapshot(gctx, pool, snapshot, func(conn *pgx.Conn) error {
			return scanQuery(gctx, conn, query, loadPage, func(rows [][]join.Value) error {
				select {
				case pages <- rows:
					return nil
				case <-gctx.Done():
					return gctx.Err()
				}
			})
		})
	})
	for range loadWorkers {
		g.Go(func() error {
			for rows := range pages {
				if err := fn(gctx, rows); err != nil {
					return err
				}
			}
			return nil
		})
	}
	return g.Wait()
}

func anyNull(vs []join.Value) bool {
	for _, v := range vs {
		if v.Null {
			return true
		}
	}
	return false
}

// selectColumns is the query of cols of table's rows (plan.FromSQL: those
// its filter keeps, with its computed columns).
func selectColumns(table *plan.TablePlan, cols []plan.SourceColumn) string {
	names := make([]string, len(cols))
	for i, c := range cols {
		names[i] = ident(c.Name)
	}
	return "SELECT " + strings.Join(names, ", ") + " FROM " + plan.FromSQL(table) + " t"
}

// scanQuery streams the rows of query in Postgres text form (the same form
// pgoutput sends) and hands them to fn in pages of at most page rows.
func scanQuery(ctx context.Context, conn *pgx.Conn, query string, page int, fn func([][]join.Value) error) error {
	rr := conn.PgConn().ExecParams(ctx, query, nil, nil, nil, nil)
	// A page's rows are cut from one slab of values, and a row's values
	// from one string: two allocations a row rather than one a column.
	var (
		batch [][]join.Value
		slab  []join.Value
		text  []byte
	)
	for rr.NextRow() {
		raw := rr.Values()
		if batch == nil {
			batch, slab = make([][]join.Value, 0, page), make([]join.Value, 0, page*len(raw))
		}
		text = text[:0]
		for _, b := range raw {
			text = append(text, b...)
		}
		all := string(text)
		start := len(slab)
		for _, b := range raw {
			if b == nil {
				slab = append(slab, join.NullValue())
				continue
			}
			slab = append(slab, join.TextValue(all[:len(b)]))
			all = all[len(b):]
		}
		batch = append(batch, slab[start:len(slab):len(slab)])
		if len(batch) == page {
			if err := fn(batch); err != nil {
				_, _ = rr.Close()
				return err
			}
			batch = nil
		}
	}
	if _, err := rr.Close(); err != nil {
		return fmt.Errorf("read %s: %w", query, err)
	}
	if len(batch) == 0 {
		return nil
	}
	return fn(batch)
}

// sizes returns what each of the join's states is sized for at Init.
func stateSizes(ctx context.Context, source *pgxpool.Pool, p *plan.JoinPlan) []redisstore.Size {
	if p.Edges == nil {
		return []redisstore.Size{{LeftRows: rowsOrZero(ctx, source, p.Left.Table), RightRows: rowsOrZero(ctx, source, p.Right.Table)}}
	}
	// A table's state holds its rows and the references of the entries
	// its rows reference: the references to an entry with many rows
	// referencing each of its keys (a supplier's lineitems) are spread
	// over lanes, by its average.
	rows := []int64{rowsOrZero(ctx, source, p.Left.Table)}
	for _, e := range p.Edges {
		rows = append(rows, rowsOrZero(ctx, source, e.Table.Table))
	}
	// A roll-up's results hold a row per parent with children; its
	// children's state a row per child, an accumulator per parent.
	for range p.Rollups {
		rows = append(rows, rows[0])
	}
	out := make([]redisstore.Size, len(rows), p.States())
	for t := range out {
		out[t].LeftRows = rows[t]
	}
	for _, r := range p.Rollups {
		out = append(out, redisstore.Size{LeftRows: rowsOrZero(ctx, source, r.Table.Table), RightRows: rows[0]})
	}
	for i, e := range p.Edges {
		from, entry := e.Parent+1, i+1
		if rows[entry] > 0 && rows[from] > 0 {
			if fan := redisstore.FanFor(float64(rows[from]) / float64(rows[entry])); fan > 1 {
				if out[from].Fans == nil {
					out[from].Fans = map[byte]int{}
				}
				out[from].Fans[pipeline.EdgeKey(entry, "")[0]] = fan
			}
		}
	}
	return out
}

// checkRaced runs after the loads, on the backfill's snapshot: a joined
// table or partition whose catalog row as the snapshot sees it is not its
// current one (catalogVersions) was truncated, rewritten, dropped,
// attached or detached after the snapshot, maybe while the loads read it.
// It takes no lock (a lock held across the loads would queue such DDL
// ahead of the loads' own locks and hang them), so a change that moved no
// rows (VACUUM FULL, a partition detached and attached back) also counts:
// the backfill is simply redone. It returns the leaf partitions as the
// snapshot sees them, the ones the loads read, for the daemon to compare
// later ones with.
func (l *loader) checkRaced(ctx context.Context, snapshot string) (map[uint32]leaf, error) {
	var tables []config.TableName
	for _, t := range publishedTables(plansOf(l.joins)) {
		tables = append(tables, config.TableName{Schema: t.Schema, Name: t.Name})
	}
	names := make([]string, len(tables))
	for i, t := range tables {
		names[i] = pgx.Identifier{t.Schema, t.Name}.Sanitize()
	}
	var leaves map[uint32]leaf
	now, err := catalogVersions(ctx, l.source, names)
	if err != nil {
		return nil, err
	}
	err = inSnapshot(ctx, l.source, snapshot, func(conn *pgx.Conn) error {
		seen, err := catalogVersions(ctx, conn, names)
		if err != nil {
			return err
		}
		for _, oid := range slices.Sorted(maps.Keys(seen)) {
			if v, ok := now[oid]; !ok || v.xmin != seen[oid].xmin {
				return fmt.Errorf("%w: %s was truncated, rewritten, dropped, attached or detached; backfilling again",
					errBackfillRaced, seen[oid].name)
			}
		}
		leaves, err = readLeaves(ctx, conn, tables)
		if catalogRaced(err) {
			return fmt.Errorf("%w: a partition of a joined table was attached or detached (%w); backfilling again", errBackfillRaced, err)
		}
		return err
	})
	return leaves, err
}

// catalogVersion is a relation's name and the version (xmin) of its
// catalog row.
type catalogVersion struct{ name, xmin string }

// catalogVersions returns the catalog rows of the tables names and of
// their partitions, by OID, as q sees them. TRUNCATE, a rewrite, ATTACH
// and DETACH write a new version of a relation's row; ANALYZE and VACUUM
// change it in place. A load plans with the catalog of its own moment, not
// the snapshot's: after such a change since the snapshot, the loads may
// not have read the same rows (a partition detached and attached back
// while one of them ran), or read a truncated table empty. A partition
// created or attached since is not in the snapshot's: it brings no rows,
// or the partition check follows the rows it brought.
func catalogVersions(ctx context.Context, q querier, names []string) (map[uint32]catalogVersion, error) {
	rows, err := q.Query(ctx, `
		WITH RECURSIVE tree AS (
			SELECT c.oid FROM pg_class c WHERE c.oid = ANY ($1::text[]::regclass[])
			UNION ALL
			SELECT i.inhrelid FROM pg_inherits i JOIN tree ON i.inhparent = tree.oid)
		SELECT c.oid, c.oid::regclass::text, c.xmin::text FROM tree JOIN pg_class c ON c.oid = tree.oid`, names)
	if err != nil {
		return nil, fmt.Errorf("check the joined tables after the backfill: %w", err)
	}
	out := map[uint32]catalogVersion{}
	var oid uint32
	var v catalogVersion
	_, err = pgx.ForEachRow(rows, []any{&oid, &v.name, &v.xmin}, func() error {
		out[oid] = v
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("check the joined tables after the backfill: %w", err)
	}
	return out, nil
}

func outputSources(cols []plan.OutputColumn) []plan.SourceColumn {
	out := make([]plan.SourceColumn, len(cols))
	for i, c := range cols {
		out[i] = c.Source
	}
	return out
}
