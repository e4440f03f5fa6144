package fkmat

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fkmat/fkmat/internal/config"
	"github.com/fkmat/fkmat/internal/human"
	"github.com/fkmat/fkmat/internal/pipeline"
	"github.com/fkmat/fkmat/internal/plan"
	"github.com/fkmat/fkmat/join"
	"github.com/fkmat/fkmat/redisstore"
	"github.com/fkmat/fkmat/sink"
)

// RunPlan is what `fkmat run` will create for a configuration and what it
// will cost: `fkmat check --plan`. It changes nothing to compute it.
type RunPlan struct {
	Slot        PlanStep   `json:"slot"`
	Publication PlanStep   `json:"publication"`
	Metadata    PlanStep   `json:"metadata"`
	Joins       []JoinCost `json:"joins"`
	// RedisBytes and BackfillSeconds are the joins' sums.
	RedisBytes      int64   `json:"redis_bytes_estimate"`
	BackfillSeconds float64 `json:"backfill_seconds_estimate"`
	// BackfillDiskBytes is the temporary disk the backfill's spools use at
	// most: the state of the loadsAtOnce largest tables.
	BackfillDiskBytes int64 `json:"backfill_temp_disk_bytes_estimate"`
	// Basis says which figures the estimates come from.
	Basis string `json:"estimate_basis"`
}

// PlanStep is one object run creates, or finds already there.
type PlanStep struct {
	Name      string `json:"name"`
	Exists    bool   `json:"exists"`
	Statement string `json:"statement,omitempty"` // what run executes when it does not exist
}

// JoinCost is one join's part of the plan.
type JoinCost struct {
	Name   string   `json:"name"`
	Target PlanStep `json:"target"`
	// RedisPrefix starts every Redis key of the join's state.
	RedisPrefix     string      `json:"redis_prefix"`
	Tables          []TableCost `json:"tables"`
	RedisBytes      int64       `json:"redis_bytes_estimate"`
	BackfillRows    int64       `json:"backfill_rows"`
	BackfillSeconds float64     `json:"backfill_seconds_estimate"`
	// Rebuild, when set, says that run builds the join anew beside the
	// running one (its definition changed since it was built), and what
	// that needs while it runs.
	Rebuild string `json:"rebuild,omitempty"`
}

// TableCost is one table of a join in the estimate: its rows, the bytes
// of state per row, and the references its rows hold (one per row and
// foreign key the join follows).
type TableCost struct {
	Table       string `json:"table"`
	Rows        int64  `json:"rows"`
	RowBytes    int64  `json:"state_bytes_per_row"`
	References  int64  `json:"references"`
	RefBytes    int64  `json:"state_bytes_per_reference"`
	StateBytes  int64  `json:"state_bytes"`
	WidthSource string `json:"width_source"` // pg_stats (analyzed) or types (not analyzed)
	// Where is the table's filter; Kept the rows it keeps (its share of a
	// sample of the table's pages; the planner's selectivity where the
	// sample holds no row), which the state holds; SavedBytes the state the
	// rows it leaves out do not take.
	Where      string `json:"where,omitempty"`
	Kept       int64  `json:"kept_rows,omitempty"`
	SavedBytes int64  `json:"state_bytes_saved,omitempty"`
}

// The estimate's figures, from `make bench` on the 2-core development
// machine (docs/performance.md): a row in the state costs its encoded
// columns plus rowOverhead (listpack entry, field and bucket share: W4's
// left rows took 65 B for 52 B of values), a reference its parent key and
// foreign key plus refOverhead (W4: 18 B per subscription of two bigints);
// a backfill writes backfillEntriesPerSecond rows and references of all
// its tables together (W4: 2.05M in 1.8 s; W7 at scale factor 0.1: 4.6M in
// 4.3-5.9 s, at 1: 46M in 73.5 s, where Postgres's own join weighs more),
// plus backfillSetup per join for the slot, the snapshot and the swap.
const (
	rowOverhead              = 14
	refOverhead              = 4
	backfillEntriesPerSecond = 900_000
	backfillSetup            = 0.5
)

// estimateBasis is RunPlan.Basis.
const estimateBasis = "rows: max(pg_class.reltuples, n_live_tup); widths: pg_stats.avg_width (the type's length where a column was never analyzed), " +
	"a computed column's and a where's share from a sample of about 10k rows; " +
	"Redis: 14 B per row plus its columns, 4 B per reference plus its keys (make bench W4: 65 B per order row, 18 B per subscription); " +
	"a roll-up's results, accumulators and sorted sets per parent from its aggregates' widths, 96 B per sorted set plus its key (make bench W9); " +
	"backfill: 900k rows and references per second, a roll-up's children counted twice more when grouped again for the target and the results, once when the load computes the results, plus 0.5 s per join (make bench W4 1.1M/s, W7 0.6-1.1M/s, on 2 cores). " +
	"Expect the Redis estimate within 2x of the real state; the time varies with the machine"

// Plan computes the RunPlan of cfg: which slot, publication, metadata
// schema and targets exist, the statements that create the others, and
// the estimates. Run Check first: Plan reports connection and catalog
// errors as they come, not every problem at once.
func Plan(ctx context.Context, cfg *config.Config, opts Options) (*RunPlan, error) {
	opts.setDefaults()
	source, err := connectPostgres(ctx, cfg.Source, "source", cfg.TimeZone)
	if err != nil {
		return nil, err
	}
	defer source.Close()
	plans, err := plan.Resolve(ctx, source, cfg)
	if err != nil {
		return nil, err
	}
	target := source
	if cfg.Target != cfg.Source {
		if target, err = connectPostgres(ctx, cfg.Target, "target", cfg.TimeZone); err != nil {
			return nil, err
		}
		defer target.Close()
	}
	rp := &RunPlan{Basis: estimateBasis}
	rp.Slot = PlanStep{Name: cfg.Slot, Statement: "CREATE_REPLICATION_SLOT " + pgx.Identifier{cfg.Slot}.Sanitize() + " LOGICAL pgoutput EXPORT_SNAPSHOT"}
	if err := source.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_replication_slots WHERE slot_name = $1)`, cfg.Slot).Scan(&rp.Slot.Exists); err != nil {
		return nil, fmt.Errorf("look up slot %q: %w", cfg.Slot, err)
	}
	var tables []string
	for _, t := range publishedTables(plans) {
		tables = append(tables, t.Sanitize())
	}
	rp.Publication = PlanStep{Name: cfg.Publication, Statement: "CREATE PUBLICATION " + pgx.Identifier{cfg.Publication}.Sanitize() +
		" FOR TABLE " + strings.Join(tables, ", ") + " WITH (publish_via_partition_root = true)"}
	if err := source.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_publication WHERE pubname = $1)`, cfg.Publication).Scan(&rp.Publication.Exists); err != nil {
		return nil, fmt.Errorf("look up publication %q: %w", cfg.Publication, err)
	}
	rp.Metadata = PlanStep{Name: "fkmat", Statement: "CREATE SCHEMA fkmat (checkpoints, join states, the daemon's heartbeat; fkmat migrate)"}
	if err := target.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_namespace WHERE nspname = 'fkmat')`).Scan(&rp.Metadata.Exists); err != nil {
		return nil, fmt.Errorf("look up fkmat's metadata schema: %w", err)
	}
	for _, p := range plans {
		jc, err := joinCost(ctx, source, target, cfg.Slot, p)
		if err != nil {
			return nil, fmt.Errorf("join %q: %w", p.Name, err)
		}
		if jc.Rebuild, err = rebuildNeeds(ctx, source, target, cfg.Slot, p, jc); err != nil {
			return nil, fmt.Errorf("join %q: %w", p.Name, err)
		}
		rp.Joins = append(rp.Joins, jc)
		rp.RedisBytes += jc.RedisBytes
		rp.BackfillSeconds += jc.BackfillSeconds
	}
	var states []int64
	for _, j := range rp.Joins {
		for _, t := range j.Tables {
			states = append(states, t.StateBytes)
		}
	}
	slices.SortFunc(states, func(a, b int64) int { return cmp.Compare(b, a) })
	for _, b := range states[:min(len(states), loadsAtOnce)] {
		rp.BackfillDiskBytes += b
	}
	return rp, nil
}

// rebuildNeeds is JoinCost.Rebuild: what a rebuild beside the running join
// needs, when the join's definition changed since it was built ("" when it
// did not, or was never built).
func rebuildNeeds(ctx context.Context, source, target *pgxpool.Pool, slot string, p *plan.JoinPlan, jc JoinCost) (string, error) {
	st, err := readJoinState(ctx, target, slot, p.Name)
	if pgErr, ok := errors.AsType[*pgconn.PgError](err); ok && (pgErr.Code == "42P01" || pgErr.Code == "42703" || pgErr.Code == "3F000") {
		return "", nil // no metadata yet: nothing was built
	}
	if err != nil || !st.exists || st.phase != "streaming" || st.fingerprint == p.Fingerprint || st.definition == nil {
		return "", err
	}
	if _, ok, err := plan.Widenings(st.definition, plan.Definition(p)); err != nil || ok {
		return "", err // run widens the target's columns in place
	}
	var targetBytes int64
	if jc.Target.Exists {
		if err := target.QueryRow(ctx, `SELECT pg_total_relation_size($1::regclass)`, p.Target.Ident()).Scan(&targetBytes); err != nil {
			return "", fmt.Errorf("size of %s: %w", p.Target.Ident(), err)
		}
	}
	meanwhile := "the target keeps streaming the old definition meanwhile"
	if _, stale, err := plan.Stored(ctx, source, p.Name, st.definition); err != nil {
		return "", err
	} else if stale != "" {
		meanwhile = "the source no longer has the " + stale + " the old definition reads, so the target keeps its rows, not maintained, meanwhile"
	}
	return fmt.Sprintf("the definition changed since the join was built: fkmat run builds the new one beside the running join "+
		"(about %s: %s) and switches it in when it has caught up; "+
		"until then Redis holds both states (the new one about %s more), the target database a shadow of the target "+
		"(the old one takes %s), the spools about %s of temporary disk, and the source keeps the WAL from the build's start for a second slot",
		estimateSeconds(jc.BackfillSeconds), meanwhile, human.Bytes(jc.RedisBytes), human.Bytes(targetBytes), human.Bytes(spoolBytes(jc))), nil
}

// spoolBytes is the temporary disk the backfill of one join uses at most.
func spoolBytes(jc JoinCost) int64 {
	var states []int64
	for _, t := range jc.Tables {
		states = append(states, t.StateBytes)
	}
	slices.SortFunc(states, func(a, b int64) int { return cmp.Compare(b, a) })
	var n int64
	for _, b := range states[:min(len(states), loadsAtOnce)] {
		n += b
	}
	return n
}

// estimateSeconds says an estimated duration.
func estimateSeconds(s float64) string {
	return human.Duration(time.Duration(s * float64(time.Second)))
}

// joinCost is the plan of one join.
func joinCost(ctx context.Context, source, target *pgxpool.Pool, slot string, p *plan.JoinPlan) (JoinCost, error) {
	jc := JoinCost{Name: p.Name, RedisPrefix: redisstore.Prefix(slot, p.Name),
		Target: PlanStep{Name: p.Target.Ident(), Statement: sink.CreateSQL(&p.Target)}}
	if err := target.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, p.Target.Ident()).Scan(&jc.Target.Exists); err != nil {
		return jc, fmt.Errorf("look up target %s: %w", p.Target.Ident(), err)
	}
	// Each table's state row: its key and the columns it keeps; each
	// reference: the referencing row's key and its foreign key.
	type stateTable struct {
		name  string
		table config.TableName
		cols  [][]plan.SourceColumn
		refs  []stateRef
		key   []plan.SourceColumn
		tp    *plan.TablePlan
		// rollup, when set, is the roll-up whose results and accumulators
		// per parent the table's rows are (rowBytes, rollupParentBytes);
		// regroup is how many times more the backfill groups the table's
		// rows: the target's SQL, and the results' when the children's
		// load does not compute them (join.Rollup.LoadsResults).
		rollup   *plan.RollupPlan
		sets     int // the roll-up's sorted sets, one per parent each
		rowBytes int64
		regroup  int64
	}
	var st []stateTable
	if p.Edges == nil {
		cols := slices.Concat(p.Left.Key, p.Left.ForeignKey, sourcesOf(p.Left.Values))
		st = append(st,
			stateTable{name: p.Left.Table.String(), table: p.Left.Table, cols: [][]plan.SourceColumn{cols}, key: p.Left.Key,
				refs: []stateRef{{cols: p.Left.ForeignKey}}, tp: &p.Left},
			stateTable{name: p.Right.Table.String(), table: p.Right.Table,
				cols: [][]plan.SourceColumn{slices.Concat(p.Right.Key, sourcesOf(p.Right.Values))}, key: p.Right.Key, tp: &p.Right})
	} else {
		layout := pipeline.TreeLayoutOf(p)
		for t := range len(p.Edges) + 1 {
			s := stateTable{name: p.Left.Table.String(), table: p.Left.Table, key: p.Left.Key,
				cols: [][]plan.SourceColumn{layout.Columns(p, t)}, tp: &p.Left}
			if t > 0 {
				e := &p.Edges[t-1]
				s.name, s.table, s.key, s.tp = e.Alias, e.Table.Table, e.Table.Key, &e.Table
			}
			for _, e := range p.Edges {
				if e.Parent+1 == t {
					s.refs = append(s.refs, stateRef{cols: e.Table.ForeignKey})
				}
			}
			for range p.Rollups {
				if t == 0 {
					// The reference to the roll-up's results, by the
					// row's own key: a sorted set of its own per row.
					s.refs = append(s.refs, stateRef{cols: p.Left.Key, ownKey: true})
				}
			}
			st = append(st, s)
		}
		// A roll-up: its children's rows (key, parent key, inputs), a
		// member per child in each of its sorted sets, and the results.
		for k := range p.Rollups {
			r := &p.Rollups[k]
			s := stateTable{name: "roll-up " + r.Table.Table.String(), table: r.Table.Table, key: r.Table.Key,
				cols: [][]plan.SourceColumn{slices.Concat(r.Table.Key, r.Table.ForeignKey, r.Inputs)}, tp: &r.Table}
			// Its sorted sets, as the roll-up shares them.
			ro, err := join.NewRollup(pipeline.RollupSpecOf(p, k))
			if err != nil {
				return jc, err
			}
			for _, order := range ro.SetOrders() {
				ref := stateRef{order: true}
				for _, in := range order {
					ref.cols = append(ref.cols, r.Inputs[in])
				}
				s.refs = append(s.refs, ref)
			}
			results := stateTable{name: "roll-up " + r.Table.Table.String() + " (results)", table: p.Left.Table, key: p.Left.Key,
				cols: [][]plan.SourceColumn{slices.Concat(p.Left.Key, p.Left.Key)}, tp: &plan.TablePlan{}}
			results.rollup, results.sets, s.regroup = r, ro.Sets(), 2
			if ro.LoadsResults() {
				s.regroup = 1
			}
			st = append(st, s, results)
		}
	}
	// Each table's rows and column widths, read once.
	type tableStats struct {
		rows     int64
		widths   map[string]int64
		analyzed bool
	}
	stats := map[config.TableName]*tableStats{}
	statsOf := func(t config.TableName) (*tableStats, error) {
		if ts := stats[t]; ts != nil {
			return ts, nil
		}
		rows, err := tableRows(ctx, source, t)
		if err != nil {
			return nil, err
		}
		widths, analyzed, err := columnWidths(ctx, source, t)
		if err != nil {
			return nil, err
		}
		stats[t] = &tableStats{rows: rows, widths: widths, analyzed: analyzed}
		return stats[t], nil
	}
	// The widths of a table plan's computed columns, sampled once (a
	// roll-up's children are costed as rows and as their parents').
	sampled := map[*plan.TablePlan]map[string]int64{}
	computedWidths := func(tp *plan.TablePlan, widths map[string]int64) (map[string]int64, error) {
		if len(tp.Computed) == 0 {
			return widths, nil
		}
		if w, ok := sampled[tp]; ok {
			return w, nil
		}
		w, err := withComputedWidths(ctx, source, tp, widths)
		sampled[tp] = w
		return w, err
	}
	var regrouped int64 // rows a roll-up's backfill groups again
	for _, s := range st {
		ts, err := statsOf(s.table)
		if err != nil {
			return jc, err
		}
		rows, widths, analyzed := ts.rows, ts.widths, ts.analyzed
		if widths, err = computedWidths(s.tp, widths); err != nil {
			return jc, err
		}
		if r := s.rollup; r != nil {
			children, err := statsOf(r.Table.Table)
			if err != nil {
				return jc, err
			}
			cw, err := computedWidths(&r.Table, children.widths)
			if err != nil {
				return jc, err
			}
			// Besides the results and accumulators, a sorted set per
			// parent and order of the children.
			s.rowBytes = rowOverhead + 2*width(cw, r.Table.ForeignKey) +
				rollupParentBytes(r, cw, float64(children.rows)/float64(max(rows, 1))) +
				int64(s.sets)*(setKeyOverhead+int64(len(jc.RedisPrefix))+width(cw, r.Table.ForeignKey))
		}
		tc := TableCost{Table: s.name, Rows: rows, RowBytes: rowOverhead + width(widths, s.cols[0]), WidthSource: "pg_stats"}
		if s.rowBytes > 0 {
			tc.RowBytes = s.rowBytes
		}
		if !analyzed {
			tc.WidthSource = "types"
		}
		kept := rows
		if s.tp.Where != "" {
			if kept, err = filteredRows(ctx, source, s.tp, rows); err != nil {
				return jc, err
			}
			tc.Where, tc.Kept = s.tp.Where, kept
		}
		for _, ref := range s.refs {
			tc.References += kept
			tc.RefBytes = refOverhead + width(widths, s.key) + width(widths, ref.cols)
			switch {
			case ref.order:
				tc.RefBytes += int64(len(ref.cols)) // each order column's tag
			case ref.ownKey:
				tc.RefBytes += setKeyOverhead + int64(len(jc.RedisPrefix))
			}
			tc.StateBytes += kept * tc.RefBytes
		}
		tc.StateBytes += kept * tc.RowBytes
		if kept < rows {
			tc.SavedBytes = (rows - kept) * (tc.RowBytes + int64(len(s.refs))*tc.RefBytes)
		}
		jc.Tables = append(jc.Tables, tc)
		jc.RedisBytes += tc.StateBytes
		jc.BackfillRows += kept
		regrouped += s.regroup * kept
	}
	var refs int64
	for _, t := range jc.Tables {
		refs += t.References
	}
	jc.BackfillSeconds = backfillSetup + float64(jc.BackfillRows+refs+regrouped)/backfillEntriesPerSecond
	return jc, nil
}

// stateRef is a kind of reference a table's state keeps per row: a member
// of a sorted set per referenced key, holding the row's key and cols (the
// foreign key of a join's reference; the order columns of a roll-up's
// sorted set, each tagged, when order). ownKey: a reference by the row's
// own key, whose sorted set is the row's alone (a roll-up's results).
type stateRef struct {
	cols          []plan.SourceColumn
	order, ownKey bool
}

// withComputedWidths returns widths with the average widths of the
// columns fkmat computes for tp (their text, as the state keeps it),
// sampled from its first sampleRows rows that pass its where; a computed
// column of no sampled row keeps computedWidth.
func withComputedWidths(ctx context.Context, db *pgxpool.Pool, tp *plan.TablePlan, widths map[string]int64) (map[string]int64, error) {
	var cols []string
	var names []string
	for _, c := range tp.Computed {
		if c.Name == tp.FilterColumn() {
			continue
		}
		names = append(names, c.Name)
		cols = append(cols, "avg(octet_length(("+pgx.Identifier{"t", c.Name}.Sanitize()+")::text))::float8")
	}
	if len(cols) == 0 {
		return widths, nil
	}
	avgs := make([]*float64, len(cols))
	dest := make([]any, len(cols))
	for i := range avgs {
		dest[i] = &avgs[i]
	}
	q := "SELECT " + strings.Join(cols, ", ") + " FROM (SELECT * FROM " + plan.FromSQL(tp) + " s LIMIT " + fmt.Sprint(sampleRows) + ") t"
	if err := db.QueryRow(ctx, q).Scan(dest...); err != nil {
		return nil, fmt.Errorf("sample the computed columns of %s: %w", tp.Table, err)
	}
	out := maps.Clone(widths)
	for i, name := range names {
		if avgs[i] != nil {
			out[name] = int64(math.Ceil(*avgs[i]))
		}
	}
	return out, nil
}

// filteredRows is how many of a table's rows its filter keeps: the share
// of a sample of its pages (sampleRows rows or so) that passes, or, when
// the sample holds no row, the planner's estimate from the table's
// statistics (the selectivity of the where applied to rows).
func filteredRows(ctx context.Context, db *pgxpool.Pool, tp *plan.TablePlan, rows int64) (int64, error) {
	if rows > 0 {
		pct := min(100, 100*float64(sampleRows)/float64(rows))
		var passed, sampled int64
		q := "SELECT count(*) FILTER (WHERE (" + tp.Where + ")), count(*) FROM " +
			tableIdent(tp.Table) + " AS " + pgx.Identifier{tp.Table.Name}.Sanitize() + fmt.Sprintf(" TABLESAMPLE SYSTEM (%g)", pct)
		if err := db.QueryRow(ctx, q).Scan(&passed, &sampled); err != nil {
			return 0, fmt.Errorf("sample the rows the where of %s keeps: %w", tp.Table, err)
		}
		if sampled > 0 {
			return int64(float64(rows) * float64(passed) / float64(sampled)), nil
		}
	}
	var all, kept float64
	explain := func(q string) (float64, error) {
		var out []map[string]map[string]any
		if err := db.QueryRow(ctx, "EXPLAIN (FORMAT JSON) "+q).Scan(&out); err != nil {
			return 0, fmt.Errorf("estimate the rows the where of %s keeps: %w", tp.Table, err)
		}
		if len(out) == 0 {
			return 0, nil
		}
		n, _ := out[0]["Plan"]["Plan Rows"].(float64)
		return n, nil
	}
	var err error
	if all, err = explain("SELECT 1 FROM " + tableIdent(tp.Table)); err != nil {
		return 0, err
	}
	if kept, err = explain("SELECT 1 FROM " + plan.FromSQL(&plan.TablePlan{Table: tp.Table, Where: tp.Where}) + " t"); err != nil {
		return 0, err
	}
	if all <= 0 {
		return rows, nil
	}
	return int64(float64(rows) * min(kept/all, 1)), nil
}

func sourcesOf(vals []plan.OutputColumn) []plan.SourceColumn {
	out := make([]plan.SourceColumn, len(vals))
	for i, v := range vals {
		out[i] = v.Source
	}
	return out
}

// width sums the average widths of cols (a column twice counts once: the
// state keeps a foreign key that is also an output column once).
func width(widths map[string]int64, cols []plan.SourceColumn) int64 {
	var n int64
	seen := map[string]bool{}
	for _, c := range cols {
		switch {
		case seen[c.Name]:
		case c.Expr != "":
			if w, ok := widths[c.Name]; ok {
				n += w // sampled (withComputedWidths)
			} else {
				n += computedWidth // a computed column has no statistics
			}
		default:
			n += widths[c.Name]
		}
		seen[c.Name] = true
	}
	return n
}

// rollupParentBytes estimates what roll-up r keeps per parent in Redis
// besides its children, at perParent children per parent: its results as
// a row of the tree's entry (each aggregate's value) and, in the parent's
// state, its accumulators and the windows of its first children (min, max,
// jsonb_agg … LIMIT n). widths are the child table's columns'. A
// jsonb_agg element is its input's width plus jsonElementOverhead (a
// computed input: to_jsonb of an expression, twice computedWidth).
// Calibrated on make bench W9 (340 B of accumulators and windows, 260 B of
// results per customer, for count, sum, max and the 5 latest as JSON).
func rollupParentBytes(r *plan.RollupPlan, widths map[string]int64, perParent float64) int64 {
	input := func(i int) int64 {
		if _, sampled := widths[r.Inputs[i].Name]; r.Inputs[i].Expr != "" && !sampled {
			return 2 * computedWidth
		}
		return width(widths, r.Inputs[i:i+1])
	}
	var results, state int64
	for _, a := range r.Aggregates {
		switch a.Func {
		case "count", "bool_and", "bool_or":
			results, state = results+8, state+accumulatorBytes
		case "sum", "avg":
			results, state = results+input(a.Input)+4, state+2*accumulatorBytes
		case "min", "max":
			results, state = results+input(a.Input), state+input(a.Input)+memberBytes
		case "jsonb_agg":
			n := perParent
			if a.Limit > 0 {
				n = min(n, float64(a.Limit))
				state += int64(n * float64(input(a.Input)+memberBytes))
			}
			results += int64(n * float64(input(a.Input)+jsonElementOverhead))
		}
	}
	return results + state
}

// The pieces of rollupParentBytes: an accumulator's encoding, a window
// member's order key and child key, and a JSON array element's separator
// and the jsonb text's spaces.
const (
	accumulatorBytes    = 8
	memberBytes         = 20
	jsonElementOverhead = 4
)

// computedWidth is the width a computed column is estimated at when no row
// was sampled.
const computedWidth = 16

// sampleRows is about how many rows check --plan samples from a table to
// estimate what its where keeps and how wide its computed columns are.
const sampleRows = 10_000

// setKeyOverhead is what a sorted set's key costs besides its members and
// the state's prefix (W9: 144 B per customer's set of one member, with a
// prefix of 48 B).
const setKeyOverhead = 96

// columnWidths is each column's average width in bytes: pg_stats.avg_width
// where the table was analyzed, else the type's length (16 for a type of
// variable length); analyzed reports whether every column had statistics.
func columnWidths(ctx context.Context, db *pgxpool.Pool, t config.TableName) (map[string]int64, bool, error) {
	rows, err := db.Query(ctx, `SELECT a.attname, s.avg_width, t.typlen
		FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid
		LEFT JOIN pg_stats s ON s.schemaname = $2 AND s.tablename = $3 AND s.attname = a.attname
		WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped`, tableIdent(t), t.Schema, t.Name)
	if err != nil {
		return nil, false, fmt.Errorf("read the column widths of %s: %w", t, err)
	}
	out := map[string]int64{}
	analyzed := true
	var name string
	var avg *int32
	var typlen int16
	_, err = pgx.ForEachRow(rows, []any{&name, &avg, &typlen}, func() error {
		switch {
		case avg != nil:
			out[name] = max(int64(*avg), out[name])
		case typlen > 0:
			out[name], analyzed = max(int64(typlen), out[name]), false
		default:
			out[name], analyzed = max(16, out[name]), false
		}
		return nil
	})
	if err != nil {
		return nil, false, fmt.Errorf("read the column widths of %s: %w", t, err)
	}
	if len(out) == 0 {
		return nil, false, errors.New("no columns found for " + t.String())
	}
	return out, analyzed, nil
}
