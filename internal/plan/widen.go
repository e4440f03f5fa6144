package plan

import (
	"encoding/json"
	"fmt"
	"slices"

	"github.com/fkmat/fkmat/sink"
)

// Type OIDs of the types whose widening a join follows.
const (
	oidInt2        = 21
	oidInt4        = 23
	oidInt8        = 20
	oidText        = 25
	oidVarchar     = 1043
	oidNumeric     = 1700
	oidTimestamp   = 1114
	oidTimestampTZ = 1184
)

// Widens reports whether a column of type from can become one of type to
// with every value kept as it is: integer widths up, varchar(n) to a
// larger n, to varchar or to text, numeric's precision or scale up (or
// unconstrained), timestamp(tz)'s precision up. For a key or a foreign key
// (key), the values' text must stay the same too, since the state's keys
// are built from it: numeric's scale may not change (Postgres writes
// 12.50 as 12.5000 at scale 4).
func Widens(from, to SourceColumn, key bool) bool {
	if from.TypeOID == to.TypeOID && from.TypeMod == to.TypeMod {
		return true
	}
	switch from.TypeOID {
	case oidInt2:
		return to.TypeOID == oidInt4 || to.TypeOID == oidInt8
	case oidInt4:
		return to.TypeOID == oidInt8
	case oidVarchar:
		switch to.TypeOID {
		case oidText:
			return true
		case oidVarchar:
			return to.TypeMod < 0 || (from.TypeMod >= 0 && to.TypeMod > from.TypeMod)
		}
	case oidNumeric:
		if to.TypeOID != oidNumeric || from.TypeMod < 0 {
			return false
		}
		if to.TypeMod < 0 {
			return true // unconstrained: the values keep their scale
		}
		p, s := numericTypmod(from.TypeMod)
		p2, s2 := numericTypmod(to.TypeMod)
		if key && s2 != s {
			return false
		}
		return s2 >= s && p2-s2 >= p-s
	case oidTimestamp, oidTimestampTZ:
		if to.TypeOID != from.TypeOID || from.TypeMod < 0 {
			return false // unconstrained is the highest precision
		}
		return to.TypeMod < 0 || to.TypeMod > from.TypeMod
	}
	return false
}

// numericTypmod returns the precision and scale of a numeric typmod
// (Postgres 15: the scale may be negative, in 11 bits).
func numericTypmod(typmod int32) (precision, scale int32) {
	t := typmod - 4
	return (t >> 16) & 0xffff, ((t & 0x7ff) ^ 1024) - 1024
}

// definition is what a join's fingerprint is the hash of.
type definition struct {
	Type        string
	Left, Right TablePlan
	Target      sink.Table
	Edges       []EdgePlan   `json:",omitempty"`
	Rollups     []RollupPlan `json:",omitempty"`
}

// Definition returns the JSON of what defines p: its tables, keys, columns
// and their types, and its target. Its hash is p's fingerprint; the daemon
// keeps it with the join's checkpoint to tell a widened type from any
// other change.
func Definition(p *JoinPlan) []byte {
	b, _ := json.Marshal(definition{p.Type, p.Left, p.Right, p.Target, p.Edges, p.Rollups})
	return b
}

// A Widening is a target column whose type a widened source column widens.
type Widening struct {
	Column   string
	From, To string // format_type of the target column before and after
}

// Widenings compares the definition a join was built with (old) with its
// definition now (Definition of its plan): when they differ only in the
// types of source columns, each a widening (Widens), it returns the target
// columns to widen (none when only columns outside the target widened) and
// true; otherwise false.
func Widenings(old, now []byte) ([]Widening, bool, error) {
	var o, n definition
	if err := json.Unmarshal(old, &o); err != nil {
		return nil, false, fmt.Errorf("read the join's stored definition: %w", err)
	}
	if err := json.Unmarshal(now, &n); err != nil {
		return nil, false, fmt.Errorf("read the join's definition: %w", err)
	}
	oc, nc := o.columns(), n.columns()
	if len(oc) != len(nc) || len(o.Target.Columns) != len(n.Target.Columns) {
		return nil, false, nil
	}
	for i := range oc {
		if !Widens(*oc[i].c, *nc[i].c, oc[i].key) {
			return nil, false, nil
		}
	}
	var ws []Widening
	for i, c := range o.Target.Columns {
		if to := n.Target.Columns[i].Type; to != c.Type {
			ws = append(ws, Widening{Column: c.Name, From: c.Type, To: to})
		}
	}
	// Nothing else may differ.
	o.untyped()
	n.untyped()
	a, _ := json.Marshal(o)
	b, _ := json.Marshal(n)
	if string(a) != string(b) {
		return nil, false, nil
	}
	return ws, true, nil
}

// typedColumn is a source column of a definition, and whether it is a
// key or a foreign key.
type typedColumn struct {
	c   *SourceColumn
	key bool
}

// tables returns d's tables: the left, the right, the entries', the
// roll-ups' child tables.
func (d *definition) tables() []*TablePlan {
	out := []*TablePlan{&d.Left, &d.Right}
	for i := range d.Edges {
		out = append(out, &d.Edges[i].Table)
	}
	for i := range d.Rollups {
		out = append(out, &d.Rollups[i].Table)
	}
	return out
}

// columns returns every source column of d, in a fixed order: each table's
// key, foreign key and values, then the roll-ups' inputs (their
// aggregates' result types follow them: a sum of an integer widened to
// bigint is numeric, and the target's column widens with it).
func (d *definition) columns() []typedColumn {
	var out []typedColumn
	for _, t := range d.tables() {
		for i := range t.Key {
			out = append(out, typedColumn{&t.Key[i], true})
		}
		for i := range t.ForeignKey {
			out = append(out, typedColumn{&t.ForeignKey[i], true})
		}
		for i := range t.Values {
			out = append(out, typedColumn{&t.Values[i].Source, false})
		}
	}
	for i := range d.Rollups {
		r := &d.Rollups[i]
		for j := range r.Inputs {
			out = append(out, typedColumn{&r.Inputs[j], false})
		}
	}
	return out
}

// untyped clears the types of d's columns, of its target columns and
// aggregates, and of its computed columns and their inputs (the stream
// checks the inputs it reads, and an output's type is one of d's columns).
func (d *definition) untyped() {
	for _, tc := range d.columns() {
		tc.c.Type, tc.c.TypeOID, tc.c.TypeMod, tc.c.HasTypeMod = "", 0, 0, false
	}
	d.Target.Columns = slices.Clone(d.Target.Columns)
	for i := range d.Target.Columns {
		d.Target.Columns[i].Type = ""
	}
	for i := range d.Rollups {
		for j := range d.Rollups[i].Aggregates {
			d.Rollups[i].Aggregates[j].Type = ""
		}
	}
	for _, t := range d.tables() {
		for i := range t.Computed {
			c := &t.Computed[i]
			c.Type, c.TypeOID = "", 0
			for j := range c.Inputs {
				c.Inputs[j].Type = ""
			}
		}
	}
}

// DefinitionTarget returns the target table of a stored definition: the
// shape the join's target was built with.
func DefinitionTarget(def []byte) (sink.Table, error) {
	var d definition
	if err := json.Unmarshal(def, &d); err != nil {
		return sink.Table{}, fmt.Errorf("read the join's stored definition: %w", err)
	}
	return d.Target, nil
}
