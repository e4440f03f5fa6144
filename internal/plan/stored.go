package plan

import (
	"context"
	"encoding/json"
	"fmt"
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
	p = &JoinPlan{Name: name, Type: d.Type, Left: d.Left, Right: d.Right, Target: d.Target, Edges: d.Edges}
	tables := []*TablePlan{&p.Left}
	if p.Edges == nil {
		tables = append(tables, &p.Right)
	}
	for i := range p.Edges {
		tables = append(tables, &p.Edges[i].Table)
	}
	for _, t := range tables {
		ct, err := describeTable(ctx, db, t.Table)
		if err != nil {
			return nil, "", err
		}
		if !ct.exists {
			return nil, fmt.Sprintf("table %s", t.Table), nil
		}
		t.Replica, t.Partitioned = ct.replica, ct.partitioned
		var cols []SourceColumn
		cols = append(append(cols, t.Key...), t.ForeignKey...)
		for _, v := range t.Values {
			cols = append(cols, v.Source)
		}
		for _, c := range cols {
			now, ok := ct.byName[c.Name]
			if !ok || now.TypeOID != c.TypeOID || now.TypeMod != c.TypeMod {
				return nil, fmt.Sprintf("column %s of %s", c.Name, t.Table), nil
			}
		}
	}
	p.Spec = SpecOf(p)
	p.Fingerprint = Fingerprint(p)
	return p, "", nil
}
