package pipeline

import (
	"context"
	"fmt"
	"slices"

	"github.com/fkmat/fkmat/cdc"
	"github.com/fkmat/fkmat/internal/config"
	"github.com/fkmat/fkmat/internal/plan"
)

// Generator computes the values of stored generated columns, which logical
// replication before PostgreSQL 18 leaves out of its messages, from the
// other columns of each row.
type Generator interface {
	// Generate evaluates cols of table over rows: row i holds the values of
	// inputs in text form (nil for NULL). It returns, per row, each
	// column's value in text form (nil for NULL).
	Generate(ctx context.Context, table config.TableName, cols []plan.GeneratedColumn, inputs []plan.GeneratedInput,
		rows [][]*string) ([][]*string, error)
	// Fetch reads the current values of cols of table's rows with the
	// given keys (key: the key's columns; keys[i] its values in text
	// form): per key, each column's value in text form, all nil when no
	// row has the key.
	Fetch(ctx context.Context, table config.TableName, key []plan.SourceColumn, keys [][]*string, cols []string) ([][]*string, error)
	// TypeName returns the SQL name of a type and modifier (format_type):
	// an input's type as the stream's relation says it is at that point,
	// which a schema change (ALTER COLUMN … TYPE) may have made other than
	// the plan's.
	TypeName(ctx context.Context, oid uint32, mod int32) (string, error)
}

// generated fills the generated columns the joins output into the changes
// of the stream: each relation that lacks them gets an extended copy
// (their columns appended), and each row their values, computed by a
// Generator in one call per table and transaction.
type generated struct {
	gen    Generator
	tables map[config.TableName]*genTable
	rels   map[*cdc.Relation]*genRelation
}

// genTable is what a table's generated columns need: the columns, and the
// union of their inputs.
type genTable struct {
	name   config.TableName
	cols   []plan.GeneratedColumn
	inputs []plan.GeneratedInput
	// uses[i] are the positions in inputs of cols[i]'s inputs.
	uses [][]int
	// filtered says a join filters the table (plan.TablePlan.Where); key
	// is a unique key of it (a join's).
	filtered bool
	key      []plan.SourceColumn
}

// genRelation is a relation of the stream with generated columns to fill.
type genRelation struct {
	t *genTable
	// ext is the relation with the missing columns appended; nil when the
	// stream carries them all (PostgreSQL 18's publish_generated_columns).
	ext *cdc.Relation
	// missing are the columns of t to fill, in ext's order; inputs the
	// positions of t.inputs in the relation (-1: not in it).
	missing []int
	inputs  []int
	// rel is the relation; typed are t.inputs with the types the relation
	// gives them (typedInputs), once resolved.
	rel   *cdc.Relation
	typed []plan.GeneratedInput
}

func newGenerated(gen Generator, joins []Join) *generated {
	g := &generated{gen: gen, tables: map[config.TableName]*genTable{}, rels: map[*cdc.Relation]*genRelation{}}
	for _, j := range joins {
		p := j.Plan()
		tables := p.TablePlans()
		for name, cols := range p.Generated {
			t := g.tables[name]
			if t == nil {
				t = &genTable{name: name}
				g.tables[name] = t
			}
			for _, tp := range tables {
				if tp.Table == name {
					t.filtered = t.filtered || tp.Where != ""
					if t.key == nil {
						t.key = tp.Key
					}
				}
			}
			for _, c := range cols {
				if slices.ContainsFunc(t.cols, func(h plan.GeneratedColumn) bool { return h.Name == c.Name }) {
					continue
				}
				var uses []int
				for _, in := range c.Inputs {
					i := slices.IndexFunc(t.inputs, func(h plan.GeneratedInput) bool { return h.Name == in.Name })
					if i < 0 {
						i = len(t.inputs)
						t.inputs = append(t.inputs, in)
					}
					uses = append(uses, i)
				}
				t.cols, t.uses = append(t.cols, c), append(t.uses, uses)
			}
		}
	}
	if len(g.tables) == 0 {
		return nil
	}
	return g
}

// relation returns what to fill in rel's rows (nil: nothing).
func (g *generated) relation(rel *cdc.Relation) *genRelation {
	if r, ok := g.rels[rel]; ok {
		return r
	}
	var r *genRelation
	if t := g.tables[config.TableName{Schema: rel.Namespace, Name: rel.Name}]; t != nil {
		r = &genRelation{t: t, rel: rel}
		for i, c := range t.cols {
			if rel.ColumnIndex(c.Name) < 0 {
				r.missing = append(r.missing, i)
			}
		}
		if len(r.missing) > 0 {
			ext := *rel
			ext.Columns = slices.Clone(rel.Columns)
			for _, i := range r.missing {
				ext.Columns = append(ext.Columns, cdc.Column{Name: t.cols[i].Name, Type: t.cols[i].TypeOID, TypeMod: -1})
			}
			r.ext = &ext
			for _, in := range t.inputs {
				r.inputs = append(r.inputs, rel.ColumnIndex(in.Name))
			}
		}
	}
	g.rels[rel] = r
	return r
}

// extend returns rel extended, or rel.
func (g *generated) extend(rel *cdc.Relation) *cdc.Relation {
	if rel == nil {
		return nil
	}
	if r := g.relation(rel); r != nil && r.ext != nil {
		return r.ext
	}
	return rel
}

// pendingRow is a row whose generated values are computed.
type pendingRow struct {
	vals []cdc.Value // the extended tuple
	r    *genRelation
	// compute[k] says r.missing[k] is computed (else set already).
	compute []bool
	inputs  []*string
}

// fill fills the generated columns of the transactions' changes, with one
// Generate call per table.
func (g *generated) fill(ctx context.Context, txns []*cdc.Txn) error {
	if err := g.fillUnchanged(ctx, txns); err != nil {
		return err
	}
	var pending map[*genTable][]pendingRow
	n := 0
	for _, t := range txns {
		n += len(t.Changes)
	}
	for _, t := range txns {
		if err := g.scan(t, &pending, n); err != nil {
			return err
		}
	}
	return g.compute(ctx, pending)
}

// scan extends t's changes on tables with generated columns, and adds the
// rows whose values are computed to pending, room made for n rows of a
// table at its first.
func (g *generated) scan(t *cdc.Txn, pending *map[*genTable][]pendingRow, n int) error {
	for i := range t.Changes {
		c := &t.Changes[i]
		switch c.Kind {
		case cdc.ChangeSchema:
			sc := *c.Schema
			sc.Old, sc.New = g.extend(sc.Old), g.extend(sc.New)
			c.Schema, c.Relation = &sc, g.extend(c.Relation)
			continue
		case cdc.ChangeTruncate:
			continue
		}
		r := g.relation(c.Relation)
		if r == nil || r.ext == nil {
			continue
		}
		c.Relation = r.ext
		if c.Old != nil {
			c.Old = withValues(c.Old, len(r.missing), cdc.Value{Kind: cdc.ValueNull})
		}
		if c.New == nil {
			continue
		}
		row, err := g.row(c, r)
		if err != nil {
			return err
		}
		c.New = row.vals
		if slices.Contains(row.compute, true) {
			if *pending == nil {
				*pending = map[*genTable][]pendingRow{}
			}
			rows, ok := (*pending)[r.t]
			if !ok {
				rows = make([]pendingRow, 0, n)
			}
			(*pending)[r.t] = append(rows, row)
		}
	}
	return nil
}

// typedInputs returns r's table's inputs with the types r's relation gives
// them: after an ALTER COLUMN … TYPE, the stream's rows carry values of
// the new type, which the plan's may not hold.
func (g *generated) typedInputs(ctx context.Context, r *genRelation) ([]plan.GeneratedInput, error) {
	if r.typed != nil {
		return r.typed, nil
	}
	typed := slices.Clone(r.t.inputs)
	for i, pos := range r.inputs {
		if pos < 0 {
			continue
		}
		c := r.rel.Columns[pos]
		name, err := g.gen.TypeName(ctx, c.Type, c.TypeMod)
		if err != nil {
			return nil, fmt.Errorf("the type of %s.%s: %w", r.t.name, c.Name, err)
		}
		typed[i].Type = name
	}
	r.typed = typed
	return typed, nil
}

// compute evaluates the pending rows' generated columns and sets them: one
// Generate call per table and shape of its rows (a transaction may change
// a table's shape midway).
func (g *generated) compute(ctx context.Context, pending map[*genTable][]pendingRow) error {
	for tab, all := range pending {
		if !slices.ContainsFunc(all, func(row pendingRow) bool { return row.r != all[0].r }) {
			// One shape, as almost always: no grouping.
			if err := g.computeRows(ctx, tab, all[0].r, all); err != nil {
				return err
			}
			continue
		}
		byRel := map[*genRelation][]pendingRow{}
		var order []*genRelation
		for _, row := range all {
			if _, ok := byRel[row.r]; !ok {
				order = append(order, row.r)
			}
			byRel[row.r] = append(byRel[row.r], row)
		}
		for _, r := range order {
			if err := g.computeRows(ctx, tab, r, byRel[r]); err != nil {
				return err
			}
		}
	}
	return nil
}

// computeRows evaluates the generated columns of rows of relation r.
func (g *generated) computeRows(ctx context.Context, tab *genTable, r *genRelation, rows []pendingRow) error {
	inputs, err := g.typedInputs(ctx, r)
	if err != nil {
		return err
	}
	in := make([][]*string, len(rows))
	for i, row := range rows {
		in[i] = row.inputs
	}
	out, err := g.gen.Generate(ctx, tab.name, tab.cols, inputs, in)
	if err != nil {
		return fmt.Errorf("compute the generated columns of %s: %w", tab.name, err)
	}
	for i, row := range rows {
		base := len(row.vals) - len(row.r.missing)
		for k, ci := range row.r.missing {
			if !row.compute[k] {
				continue
			}
			v := cdc.Value{Kind: cdc.ValueNull, Type: tab.cols[ci].TypeOID}
			if s := out[i][ci]; s != nil {
				v.Kind, v.Data = cdc.ValueText, []byte(*s)
			}
			row.vals[base+k] = v
		}
	}
	return nil
}

// row extends c.New with r's missing columns: unchanged when every input
// of a column is an unchanged TOASTed value (its value is then unchanged
// too), else computed from the inputs, an unchanged one taken from the old
// row when the stream sent it whole.
func (g *generated) row(c *cdc.Change, r *genRelation) (pendingRow, error) {
	row := pendingRow{vals: withValues(c.New, len(r.missing), cdc.Value{Kind: cdc.ValueUnchanged}), r: r,
		compute: make([]bool, len(r.missing)), inputs: make([]*string, len(r.t.inputs))}
	have := make([]bool, len(r.t.inputs))
	for i, pos := range r.inputs {
		if pos < 0 {
			continue
		}
		v := c.New[pos]
		if v.Kind == cdc.ValueUnchanged && c.OldKind == cdc.OldFull && pos < len(c.Old) {
			v = c.Old[pos]
		}
		switch v.Kind {
		case cdc.ValueText, cdc.ValueBinary:
			s := string(v.Data)
			row.inputs[i], have[i] = &s, true
		case cdc.ValueNull:
			have[i] = true
		}
	}
	for k, ci := range r.missing {
		all, none := true, true
		for _, u := range r.t.uses[ci] {
			all, none = all && have[u], none && !have[u]
		}
		switch {
		case all:
			row.compute[k] = true
		case none && len(r.t.uses[ci]) > 0:
			// Every input unchanged: so is the value (left unchanged).
		default:
			return row, fmt.Errorf("%w: %s of %s.%s: an update changed some inputs of generated column %q and left another "+
				"one's out-of-line (TOASTed) value unchanged, which the stream does not send; set REPLICA IDENTITY FULL on the table "+
				"(its old rows then come whole), then run fkmat backfill --force", ErrSchemaChanged, c.Kind, c.Relation.Namespace,
				c.Relation.Name, r.t.cols[ci].Name)
		}
	}
	return row, nil
}

// withValues returns vals with n values v appended, in a new slice.
func withValues(vals []cdc.Value, n int, v cdc.Value) []cdc.Value {
	out := make([]cdc.Value, len(vals), len(vals)+n)
	copy(out, vals)
	for range n {
		out = append(out, v)
	}
	return out
}

// fillUnchanged replaces, in updates that need them, the values the stream
// left out (unchanged TOASTed values) with the old row's when the stream
// sent it whole (REPLICA IDENTITY FULL), else with the source's current
// ones, read in one query per table. Updates need them on a filtered
// table (the row may enter the join with them, and fkmat keeps no state
// for a row its filter leaves out), and where a computed column reads
// some unchanged values and some changed ones. A current value may be
// newer than the update: a later change of the column then sends it, so
// the target is exact once caught up.
func (g *generated) fillUnchanged(ctx context.Context, txns []*cdc.Txn) error {
	type fetch struct {
		c    *cdc.Change
		miss []int // the relation's positions to fill
	}
	var need map[*genTable][]fetch
	for _, t := range txns {
		for i := range t.Changes {
			c := &t.Changes[i]
			if c.Kind != cdc.ChangeUpdate || !slices.ContainsFunc(c.New, func(v cdc.Value) bool { return v.Kind == cdc.ValueUnchanged }) {
				continue
			}
			tab := g.tables[config.TableName{Schema: c.Relation.Namespace, Name: c.Relation.Name}]
			// On a filtered table, an update that leaves every input of
			// its filters unchanged keeps the row in the join or out of it
			// (join.Change.IfPresent): the state fills a present row's.
			if tab == nil || (!tab.filtered || tab.filtersUnchanged(c)) && !tab.mixed(c) {
				continue
			}
			vals := slices.Clone(c.New)
			var miss []int
			for p, v := range vals {
				switch {
				case v.Kind != cdc.ValueUnchanged:
				case c.OldKind == cdc.OldFull && p < len(c.Old) && c.Old[p].Kind != cdc.ValueUnchanged:
					vals[p] = c.Old[p]
				default:
					miss = append(miss, p)
				}
			}
			c.New = vals
			if len(miss) > 0 {
				if need == nil {
					need = map[*genTable][]fetch{}
				}
				need[tab] = append(need[tab], fetch{c, miss})
			}
		}
	}
	for tab, fs := range need {
		// One query per table: the union of the columns to fill.
		var cols []string
		for _, f := range fs {
			for _, p := range f.miss {
				if name := f.c.Relation.Columns[p].Name; !slices.Contains(cols, name) {
					cols = append(cols, name)
				}
			}
		}
		keys := make([][]*string, len(fs))
		for i, f := range fs {
			keys[i] = make([]*string, len(tab.key))
			for k, kc := range tab.key {
				p := f.c.Relation.ColumnIndex(kc.Name)
				if p < 0 {
					return fmt.Errorf("%s lacks its key column %q", tab.name, kc.Name)
				}
				v := f.c.New[p]
				if v.Kind == cdc.ValueUnchanged && p < len(f.c.Old) {
					v = f.c.Old[p]
				}
				if v.Kind == cdc.ValueText || v.Kind == cdc.ValueBinary {
					s := string(v.Data)
					keys[i][k] = &s
				}
			}
		}
		got, err := g.gen.Fetch(ctx, tab.name, tab.key, keys, cols)
		if err != nil {
			return fmt.Errorf("read the unchanged values of %s: %w", tab.name, err)
		}
		for i, f := range fs {
			for _, p := range f.miss {
				v := cdc.Value{Kind: cdc.ValueNull, Type: f.c.New[p].Type}
				// A row gone since: its delete follows in the stream.
				if s := got[i][slices.Index(cols, f.c.Relation.Columns[p].Name)]; s != nil {
					v.Kind, v.Data = cdc.ValueText, []byte(*s)
				}
				f.c.New[p] = v
			}
		}
	}
	return nil
}

// filtersUnchanged reports whether c leaves every input of every filter of
// t unchanged (a filter reading no column is never unchanged).
func (t *genTable) filtersUnchanged(c *cdc.Change) bool {
	for ci, col := range t.cols {
		if !plan.IsFilterColumn(col.Name) {
			continue
		}
		if len(t.uses[ci]) == 0 {
			return false
		}
		for _, u := range t.uses[ci] {
			if p := c.Relation.ColumnIndex(t.inputs[u].Name); p < 0 || c.New[p].Kind != cdc.ValueUnchanged {
				return false
			}
		}
	}
	return true
}

// mixed reports whether a computed column of t reads some unchanged values
// of c and some sent ones.
func (t *genTable) mixed(c *cdc.Change) bool {
	for ci := range t.cols {
		unchanged, sent := false, false
		for _, u := range t.uses[ci] {
			switch p := c.Relation.ColumnIndex(t.inputs[u].Name); {
			case p < 0:
			case c.New[p].Kind == cdc.ValueUnchanged:
				unchanged = true
			default:
				sent = true
			}
		}
		if unchanged && sent {
			return true
		}
	}
	return false
}
