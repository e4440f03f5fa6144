package plan

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
)

// Stored rebuilds the plan of join name from the definition it was built
// with (Definition, kept in fkmat.join_state): while a changed definition
// is built beside it, the daemon keeps maintaining the target the old way.
// The tables' replica identities and partitioning are read from the
// catalog again. stale names the first column of the old definition the
// source no longer has with the same type (renamed, dropped or retyped):
// the old definition cannot be followed then, and p is nil.
func Stored(ctx context.Context, db Querier, name string, def []byte) (p *JoinPlan, stale string, err error) {
	var d definition
	if err := json.Unmarshal(def, &d); err != nil {
		return nil, "", fmt.Errorf("read the stored definition of join %q: %w", name, err)
	}
	p = &JoinPlan{Name: name, Type: d.Type, Left: d.Left, Right: d.Right, Target: d.Target, Edges: d.Edges, Rollups: d.Rollups}
	if p.Edges == nil && p.Rollups != nil {
		p.Edges = []EdgePlan{} // a tree of the left table and roll-ups
	}
	// Each table's columns, and the foreign key of each entry of the list
	// form in its parent's table (the left one's own in the two-table form).
	type check struct {
		t    *TablePlan
		cols []SourceColumn
	}
	own := func(t *TablePlan) []SourceColumn {
		cols := slices.Clone(t.Key)
		for _, v := range t.Values {
			if v.Source.Expr == "" {
				cols = append(cols, v.Source)
			}
		}
		return cols
	}
	checks := []check{{&p.Left, own(&p.Left)}}
	if p.Edges == nil {
		checks[0].cols = append(checks[0].cols, p.Left.ForeignKey...)
		checks = append(checks, check{&p.Right, own(&p.Right)})
	}
	for i := range p.Edges {
		checks = append(checks, check{&p.Edges[i].Table, own(&p.Edges[i].Table)})
	}
	for i, e := range p.Edges {
		checks[e.Parent+1].cols = append(checks[e.Parent+1].cols, p.Edges[i].Table.ForeignKey...)
	}
	for _, c := range checks {
		ct, err := describeTable(ctx, db, c.t.Table)
		if err != nil {
			return nil, "", err
		}
		if !ct.exists {
			return nil, fmt.Sprintf("table %s", c.t.Table), nil
		}
		c.t.Replica, c.t.Partitioned = ct.replica, ct.partitioned
		for _, col := range c.cols {
			now, ok := ct.byName[col.Name]
			if !ok || now.TypeOID != col.TypeOID || now.TypeMod != col.TypeMod {
				return nil, fmt.Sprintf("column %s of %s", col.Name, c.t.Table), nil
			}
		}
		for _, g := range c.t.Computed {
			for _, in := range g.Inputs {
				if now, ok := ct.byName[in.Name]; !ok || now.Type != in.Type {
					return nil, fmt.Sprintf("column %s of %s", in.Name, c.t.Table), nil
				}
			}
		}
	}
	computedInto(p)
	if p.Edges == nil {
		p.Spec = SpecOf(p) // the two-table form's engine; a tree has its own layout
	}
	p.Fingerprint = Fingerprint(p)
	return p, "", nil
}
