package fkmat

import (
	"context"
	"math"
	"strconv"
	"strings"

	"github.com/fkmat/fkmat/internal/config"
	"github.com/fkmat/fkmat/internal/plan"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// OracleSQL returns the SQL join a plan maintains, with the target's column
// names, in the target's column order.
func OracleSQL(p *plan.JoinPlan) string { return oracleSQLWhere(p, "") }

// oracleSQLWhere is OracleSQL of the left table's rows that meet leftCond
// (plan.FromSQLWhere): the target's rows of those rows.
func oracleSQLWhere(p *plan.JoinPlan, leftCond string) string {
	if p.Edges != nil {
		return oracleListSQL(p, leftCond)
	}
	var sel []string
	for i, k := range p.Left.Key {
		sel = append(sel, "l."+ident(k.Name)+" AS "+ident(p.Left.KeyNames[i]))
	}
	for _, v := range p.Left.Values {
		sel = append(sel, "l."+ident(v.Source.Name)+" AS "+ident(v.Name))
	}
	for _, v := range p.Right.Values {
		sel = append(sel, "r."+ident(v.Source.Name)+" AS "+ident(v.Name))
	}
	var on []string
	for i, fk := range p.Left.ForeignKey {
		on = append(on, "l."+ident(fk.Name)+" = r."+ident(p.Right.Key[i].Name))
	}
	kind := "LEFT JOIN"
	if p.Type == config.JoinInner {
		kind = "JOIN"
	}
	return "SELECT " + strings.Join(sel, ", ") + " FROM " + plan.FromSQLWhere(&p.Left, leftCond) + " l " + kind + " " +
		plan.FromSQL(&p.Right) + " r ON " + strings.Join(on, " AND ")
}

// listFrom is the FROM clause of a list-form join's SQL with its first n
// entries, over the left table's rows that meet leftCond.
func listFrom(p *plan.JoinPlan, n int, leftCond string) string {
	from := plan.FromSQLWhere(&p.Left, leftCond) + " l"
	for i, e := range p.Edges[:n] {
		var on []string
		for k, fk := range e.Table.ForeignKey {
			on = append(on, entryAlias(e.Parent)+"."+ident(fk.Name)+" = "+entryAlias(i)+"."+ident(e.Table.Key[k].Name))
		}
		kind := "LEFT JOIN"
		if e.Type == config.JoinInner {
			kind = "JOIN"
		}
		from += " " + kind + " " + plan.FromSQL(&e.Table) + " " + entryAlias(i) + " ON " + strings.Join(on, " AND ")
	}
	return from
}

// entryAlias is the SQL alias of the left table (t < 0) or of entry t in
// the queries of a list-form join.
func entryAlias(t int) string {
	if t < 0 {
		return "l"
	}
	return "e" + strconv.Itoa(t)
}

// oracleListSQL is OracleSQL of a list-form join: the join's SQL, the
// entries joined in list order (alias l for the left table, e0, e1, ... for
// the entries).
func oracleListSQL(p *plan.JoinPlan, leftCond string) string {
	var sel []string
	for i, k := range p.Left.Key {
		sel = append(sel, "l."+ident(k.Name)+" AS "+ident(p.Left.KeyNames[i]))
	}
	for _, v := range p.Left.Values {
		sel = append(sel, "l."+ident(v.Source.Name)+" AS "+ident(v.Name))
	}
	for i, e := range p.Edges {
		for _, v := range e.Table.Values {
			sel = append(sel, entryAlias(i)+"."+ident(v.Source.Name)+" AS "+ident(v.Name))
		}
	}
	from := listFrom(p, len(p.Edges), leftCond)
	for k := range p.Rollups {
		s, f, _ := rollupSQL(p, k)
		sel, from = append(sel, s...), from+f
	}
	return "SELECT " + strings.Join(sel, ", ") + " FROM " + from
}

// rollupSQL is what roll-up k adds to its join's SQL: its aggregates'
// select items, and the join of the children grouped by parent (alias
// r<k>), whose query it returns too. Each aggregate means the correlated subquery over the parent's
// children that pass the roll-up's filter: count 0 and the others NULL
// over none. Ties of an order are broken by the child's key, and text is
// ordered byte by byte, as fkmat orders them.
func rollupSQL(p *plan.JoinPlan, k int) (sel []string, from, grouped string) {
	r := &p.Rollups[k]
	alias := "r" + strconv.Itoa(k)
	col := func(i int) string {
		c := "c." + ident(r.Inputs[i].Name)
		if isText(r.Inputs[i].Type) {
			c += ` COLLATE "C"`
		}
		return c
	}
	var tie []string
	for _, key := range r.Table.Key {
		c := "c." + ident(key.Name)
		if isText(key.Type) {
			c += ` COLLATE "C"`
		}
		tie = append(tie, c)
	}
	order := func(a *plan.AggregatePlan) string {
		var items []string
		for j, in := range a.OrderBy {
			item := col(in)
			if a.Desc[j] {
				item += " DESC"
			}
			items = append(items, item)
		}
		return strings.Join(append(items, tie...), ", ")
	}
	var fks, groups, windows []string
	for i, fk := range r.Table.ForeignKey {
		fks = append(fks, "c."+ident(fk.Name)+" AS "+ident("fk"+strconv.Itoa(i)))
		groups = append(groups, ident("fk"+strconv.Itoa(i)))
	}
	var aggs []string
	for j := range r.Aggregates {
		a := &r.Aggregates[j]
		out := ident("a" + strconv.Itoa(j))
		var expr string
		switch {
		case a.Input < 0:
			expr = "count(*)"
		case a.Func == "jsonb_agg" && a.Limit > 0:
			rn := ident("rn" + strconv.Itoa(j))
			windows = append(windows, "row_number() OVER (PARTITION BY "+strings.Join(fkCols(r), ", ")+" ORDER BY "+order(a)+") AS "+rn)
			expr = "jsonb_agg(c." + ident(r.Inputs[a.Input].Name) + " ORDER BY " + order(a) + ") FILTER (WHERE c." + rn + " <= " + strconv.Itoa(a.Limit) + ")"
		case a.Func == "jsonb_agg":
			expr = "jsonb_agg(c." + ident(r.Inputs[a.Input].Name) + " ORDER BY " + order(a) + ")"
		default:
			expr = a.Func + "(" + col(a.Input) + ")"
		}
		aggs = append(aggs, expr+" AS "+out)
		item := alias + "." + out
		if a.Func == "count" {
			item = "coalesce(" + item + ", 0)"
		}
		sel = append(sel, item+" AS "+ident(a.Name))
	}
	children := plan.FromSQL(&r.Table) + " c"
	if len(windows) > 0 {
		children = "(SELECT c.*, " + strings.Join(windows, ", ") + " FROM " + children + ") c"
	}
	var on []string
	for i, key := range p.Left.Key {
		on = append(on, alias+"."+ident("fk"+strconv.Itoa(i))+" = l."+ident(key.Name))
	}
	grouped = "SELECT " + strings.Join(append(fks, aggs...), ", ") + " FROM " + children + " GROUP BY " + strings.Join(groups, ", ")
	from = " LEFT JOIN (" + grouped + ") " + alias + " ON " + strings.Join(on, " AND ")
	return sel, from, grouped
}

// RollupResultsSQL is the results of roll-up k of p by parent key: a row
// per parent key its children reference (dangling ones included), its key
// then its aggregates, as the roll-up's entry of the tree holds them.
func RollupResultsSQL(p *plan.JoinPlan, k int) string {
	_, _, grouped := rollupSQL(p, k)
	var notNull []string
	for i := range p.Left.Key {
		notNull = append(notNull, "g."+ident("fk"+strconv.Itoa(i))+" IS NOT NULL")
	}
	return "SELECT g.* FROM (" + grouped + ") g WHERE " + strings.Join(notNull, " AND ")
}

// fkCols are roll-up r's foreign key columns of its children (alias c).
func fkCols(r *plan.RollupPlan) []string {
	var out []string
	for _, fk := range r.Table.ForeignKey {
		out = append(out, "c."+ident(fk.Name))
	}
	return out
}

// isText says typ is ordered by a collation.
func isText(typ string) bool {
	return typ == "text" || strings.HasPrefix(typ, "character")
}

// textRows streams a query's rows in text form.
type textRows struct {
	conn *pgxpool.Conn
	rr   *pgconn.ResultReader
	fail error
}

// textSettingsSQL sets what connectPostgres sets (textSettingsSQL) but
// TimeZone, which the pool's sessions have from the configuration.
const textSettingsSQL = "SET DateStyle = 'ISO, MDY'; SET IntervalStyle = 'postgres'; SET extra_float_digits = 1"

func openRows(ctx context.Context, pool *pgxpool.Pool, sql string) (*textRows, error) {
	return openRowsArgs(ctx, pool, sql, nil)
}

// openRowsArgs is openRows with text parameters.
func openRowsArgs(ctx context.Context, pool *pgxpool.Pool, sql string, args [][]byte) (*textRows, error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	if _, err := conn.Exec(ctx, textSettingsSQL); err != nil {
		conn.Release()
		return nil, err
	}
	return &textRows{conn: conn, rr: conn.Conn().PgConn().ExecParams(ctx, sql, args, nil, nil, nil)}, nil
}

// next returns the next row (copied), or nil at the end or on error.
func (t *textRows) next() []*string {
	if t.fail != nil || !t.rr.NextRow() {
		return nil
	}
	vals := t.rr.Values()
	row := make([]*string, len(vals))
	for i, v := range vals {
		if v != nil {
			s := string(v)
			row[i] = &s
		}
	}
	return row
}

func (t *textRows) err() error {
	if t.fail == nil {
		_, t.fail = t.rr.Close()
	}
	return t.fail
}

func (t *textRows) close() {
	_ = t.err()
	t.conn.Release()
}

func compareKeys(a, b []*string) int {
	for i := range a {
		if c := strings.Compare(deref(a[i]), deref(b[i])); c != 0 {
			return c
		}
	}
	return 0
}

func rowsEqual(a, b []*string, approx []bool) bool {
	for i := range a {
		if (a[i] == nil) != (b[i] == nil) {
			return false
		}
		if deref(a[i]) != deref(b[i]) && (approx == nil || !approx[i] || !closeFloats(*a[i], *b[i])) {
			return false
		}
	}
	return true
}

// floatTolerance is how far apart, relatively, verify lets a roll-up's
// floating-point sum or average be from its SQL's: Postgres adds the
// values in row order, fkmat exactly.
const floatTolerance = 1e-9

// approxColumns says which target columns of p verify compares within
// floatTolerance (nil: none).
func approxColumns(p *plan.JoinPlan) []bool {
	var out []bool
	col := len(p.Target.Columns)
	for k := len(p.Rollups) - 1; k >= 0; k-- {
		aggs := p.Rollups[k].Aggregates
		for j := len(aggs) - 1; j >= 0; j-- {
			col--
			if a := aggs[j]; a.Type == "double precision" && (a.Func == "sum" || a.Func == "avg") {
				if out == nil {
					out = make([]bool, len(p.Target.Columns))
				}
				out[col] = true
			}
		}
	}
	return out
}

// closeFloats says two floating-point texts are within floatTolerance.
func closeFloats(a, b string) bool {
	x, err1 := strconv.ParseFloat(a, 64)
	y, err2 := strconv.ParseFloat(b, 64)
	if err1 != nil || err2 != nil || math.IsNaN(x) || math.IsNaN(y) || math.IsInf(x, 0) || math.IsInf(y, 0) {
		return false
	}
	return math.Abs(x-y) <= floatTolerance*math.Max(math.Abs(x), math.Abs(y))
}

// approxDiffer is the SQL condition that the columns of approx differ
// between rows e and t beyond floatTolerance.
func approxDiffer(p *plan.JoinPlan, approx []bool) []string {
	var out []string
	for i, c := range p.Target.Columns {
		if approx == nil || !approx[i] {
			continue
		}
		e, t := "e."+ident(c.Name), "t."+ident(c.Name)
		out = append(out, "("+e+" IS DISTINCT FROM "+t+" AND NOT coalesce(abs("+e+" - "+t+") <= "+
			strconv.FormatFloat(floatTolerance, 'g', -1, 64)+" * greatest(abs("+e+"), abs("+t+")), false))")
	}
	return out
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func keyText(key []*string) string {
	parts := make([]string, len(key))
	for i, k := range key {
		parts[i] = deref(k)
	}
	return "(" + strings.Join(parts, ",") + ")"
}
