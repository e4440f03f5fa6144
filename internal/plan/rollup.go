package plan

import (
	"fmt"
	"slices"
	"strings"

	"github.com/fkmat/fkmat/internal/agg"
	"github.com/fkmat/fkmat/internal/config"
	"github.com/fkmat/fkmat/join"
)

// RollupPlan is a roll-up resolved: its child table and its aggregates.
// In Table, Key is the child's key, ForeignKey its columns referencing the
// left table's key (in the key's order), Where and Computed its filter and
// the expressions fkmat computes; Inputs are the values each child
// carries: the aggregates' arguments and order columns.
type RollupPlan struct {
	Table      TablePlan
	Inputs     []SourceColumn
	Aggregates []AggregatePlan
}

// AggregatePlan is one aggregate of a roll-up.
type AggregatePlan struct {
	// Func is count, sum, avg, bool_and, bool_or, min, max or jsonb_agg.
	Func string
	// Arg is the argument as written ("*" for count(*)); Input its index
	// among the roll-up's Inputs (-1 for count(*)). jsonb_agg's input is
	// the element as jsonb (to_jsonb of the argument).
	Arg   string
	Input int
	// OrderBy and Desc order jsonb_agg (indexes among the Inputs); Limit
	// keeps the first n (0: all).
	OrderBy []int  `json:",omitempty"`
	Desc    []bool `json:",omitempty"`
	Limit   int    `json:",omitempty"`
	// Name is the target column, Type its type: the aggregate's result type
	// in Postgres.
	Name string
	Type string
}

// resolveRollups resolves jc's roll-ups into p, whose left table is
// resolved.
func resolveRollups(jc config.JoinConfig, p *JoinPlan, lookup func(config.TableName) (*catalogTable, error), add func(string, ...any)) error {
	for i, r := range jc.Rollups {
		where := fmt.Sprintf("rollups[%d] (%s)", i, r.Table)
		ct, err := lookup(r.Table)
		if err != nil {
			return err
		}
		if !ct.exists {
			add("%s: %s; check its table", where, ct.notFound())
			continue
		}
		if r.Table == p.Left.Table || slices.ContainsFunc(p.Edges, func(e EdgePlan) bool { return e.Table.Table == r.Table }) {
			add("%s: the table is also joined in this join; roll up a table the join does not join otherwise", where)
			continue
		}
		rp := RollupPlan{}
		tp := &rp.Table
		tp.Table, tp.Replica, tp.Partitioned = r.Table, ct.replica, ct.partitioned
		tp.Key = resolveKey(ct, nil, where, add)
		tp.ForeignKey = resolveColumns(ct, r.ForeignKey, where+".foreign_key", add)
		if len(tp.ForeignKey) > 0 && len(tp.ForeignKey) != len(p.Left.Key) {
			add("%s: foreign_key has %d columns but the left table's key has %d; they must match in number and order",
				where, len(tp.ForeignKey), len(p.Left.Key))
		}
		for k, c := range tp.ForeignKey {
			if k < len(p.Left.Key) {
				if err := join.CheckKeyTypes(c.Type, p.Left.Key[k].Type); err != nil {
					add("%s: foreign_key %q -> left key %q: %v", where, c.Name, p.Left.Key[k].Name, err)
				}
			}
		}
		resolveWhere(ct, tp, r.Where, where+".where", add)
		checkReplicaIdentity(ct, tp.Key, where, add)
		checkUnique(ct, tp.Key, where, add)
		ordered := false
		for _, a := range r.Aggregates {
			if ap, ok := rp.aggregate(ct, a, fmt.Sprintf("%s aggregate %s", where, a.Alias), add); ok {
				rp.Aggregates = append(rp.Aggregates, ap)
			}
			ordered = ordered || a.Func == config.AggMin || a.Func == config.AggMax || a.Func == config.AggJSONB
		}
		if ordered {
			// Ties of an order are broken by the child's key, byte by byte.
			for _, k := range tp.Key {
				if err := agg.CheckOrder(k.Type, "C"); err != nil {
					add("%s: min, max and jsonb_agg break ties by the child's key, and its column %q cannot be ordered: %v", where, k.Name, err)
				}
			}
		}
		p.Rollups = append(p.Rollups, rp)
	}
	return nil
}

// aggregate resolves one aggregate, adding its inputs to rp.
func (rp *RollupPlan) aggregate(ct *catalogTable, a config.Aggregate, what string, add func(string, ...any)) (AggregatePlan, bool) {
	ap := AggregatePlan{Func: a.Func, Arg: a.Arg, Input: -1, Name: a.Alias, Limit: a.Limit}
	if a.Arg != "*" {
		arg := a.Arg
		if a.Func == config.AggJSONB {
			arg = "to_jsonb(" + arg + ")"
		}
		col, coll, ok := rp.input(ct, arg, what, add)
		if !ok {
			return ap, false
		}
		ap.Input = slices.IndexFunc(rp.Inputs, func(c SourceColumn) bool { return c.Name == col.Name })
		switch a.Func {
		case config.AggMin, config.AggMax:
			if err := agg.CheckOrder(col.Type, coll); err != nil {
				add("%s: %v", what, err)
				return ap, false
			}
			ap.Type = baseType(col.Type)
		case config.AggJSONB:
			ap.Type = "jsonb"
		default:
			_, typ, err := agg.Of(a.Func, baseType(col.Type), false)
			if err != nil {
				add("%s: %v", what, err)
				return ap, false
			}
			ap.Type = typ
		}
	} else {
		ap.Type = "bigint"
	}
	for _, o := range a.OrderBy {
		col, coll, ok := rp.input(ct, pgxIdent(o.Column), what+" ORDER BY", add)
		if !ok {
			return ap, false
		}
		if err := agg.CheckOrder(col.Type, coll); err != nil {
			add("%s: ORDER BY %s: %v", what, o.Column, err)
			return ap, false
		}
		ap.OrderBy = append(ap.OrderBy, slices.IndexFunc(rp.Inputs, func(c SourceColumn) bool { return c.Name == col.Name }))
		ap.Desc = append(ap.Desc, o.Desc)
	}
	return ap, true
}

// input resolves an input of the roll-up: a column of the child, or an
// expression fkmat computes. It returns the column and its collation.
func (rp *RollupPlan) input(ct *catalogTable, expr, what string, add func(string, ...any)) (SourceColumn, string, bool) {
	var col SourceColumn
	var coll string
	if name, ok := plainColumn(expr); ok {
		c, found := ct.byName[name]
		if !found {
			add("%s: %s has no column %q%s", what, ct.name, name, suggest(ct, name))
			return col, "", false
		}
		col, coll = c, ct.collations[name]
	} else {
		c, ok := expression(ct, &rp.Table, expr, false, what, add)
		if !ok {
			return col, "", false
		}
		col, coll = c, ct.exprCollation[expr]
	}
	if !slices.ContainsFunc(rp.Inputs, func(c SourceColumn) bool { return c.Name == col.Name }) {
		rp.Inputs = append(rp.Inputs, col)
	}
	return col, coll, true
}

// plainColumn reports whether expr is a column name alone, and which.
func plainColumn(expr string) (string, bool) {
	c, err := config.ParseColumnRef(expr)
	if err != nil || c.Expr != "" {
		return "", false
	}
	return c.Name, true
}

// pgxIdent quotes a column name for an expression.
func pgxIdent(name string) string { return `"` + strings.ReplaceAll(name, `"`, `""`) + `"` }

// baseType drops a type's modifier: an aggregate's result has none
// ("numeric(12,2)" -> "numeric", "timestamp(3) with time zone" ->
// "timestamp with time zone").
func baseType(typ string) string {
	i := strings.IndexByte(typ, '(')
	if i < 0 {
		return typ
	}
	return strings.TrimSpace(typ[:i] + typ[strings.IndexByte(typ, ')')+1:])
}
