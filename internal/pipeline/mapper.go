package pipeline

import (
	"fmt"
	"strings"

	"github.com/fkmat/fkmat/internal/plan"
	"github.com/fkmat/fkmat/internal/wal"

	"github.com/fkmat/fkmat/internal/config"

	"github.com/fkmat/fkmat/cdc"
	"github.com/fkmat/fkmat/join"
)

// side says which table of a join a relation is.
type side uint8

const (
	sideLeft side = iota + 1
	sideRight
)

// mapper turns cdc changes into join changes for one join. It maps columns
// by name against each relation it sees, so column order and added columns
// do not matter; a dropped or retyped join column is an error. A table that
// is both the left and the right table of the join (a self-referencing join)
// yields a left and a right change for each of its row changes.
type mapper struct {
	plan *plan.JoinPlan
	// layouts caches the column positions per relation and side (a schema
	// change yields a new *cdc.Relation); sides the sides of each relation.
	layouts map[layoutKey]*layout
	sides   map[*cdc.Relation][]side
}

type layoutKey struct {
	rel  *cdc.Relation
	side side
}

// layout holds column positions in a relation's tuples.
type layout struct {
	side side
	// inserts says an insert proves the row absent from the state (not so
	// for a partitioned table: see plan.TablePlan.Partitioned).
	inserts bool
	key     []int // left PK / right key
	fk      []int // left only
	values  []int
	// filter is the position of the table's filter column (plan.TablePlan.Where),
	// -1 when it has none.
	filter int
}

func newMapper(p *plan.JoinPlan) *mapper {
	return &mapper{plan: p, layouts: map[layoutKey]*layout{}, sides: map[*cdc.Relation][]side{}}
}

// sidesOf says which tables of this join rel is: left, right, both or none.
func (m *mapper) sidesOf(rel *cdc.Relation) []side { return cachedOf(m.sides, rel, m.findSides) }

// cachedOf returns what find says of rel, found once per relation (a
// mapper asks for every change).
func cachedOf[V any](cache map[*cdc.Relation]V, rel *cdc.Relation, find func(*cdc.Relation) V) V {
	v, ok := cache[rel]
	if !ok {
		v = find(rel)
		cache[rel] = v
	}
	return v
}

func (m *mapper) findSides(rel *cdc.Relation) []side {
	t := config.TableName{Schema: rel.Namespace, Name: rel.Name}
	var out []side
	if t == m.plan.Left.Table {
		out = append(out, sideLeft)
	}
	if t == m.plan.Right.Table {
		out = append(out, sideRight)
	}
	return out
}

// uses reports whether rel is a table of this join.
func (m *mapper) uses(rel *cdc.Relation) bool { return len(m.sidesOf(rel)) > 0 }

// layoutOf is the layout of side s in rel, for a change at position at.
func (m *mapper) layoutOf(rel *cdc.Relation, s side, at wal.LSN) (*layout, error) {
	if l, ok := m.layouts[layoutKey{rel, s}]; ok {
		return l, nil
	}
	l, err := m.newLayout(rel, s, uint64(at) < m.plan.WidenedBefore)
	if err != nil {
		return nil, err
	}
	m.layouts[layoutKey{rel, s}] = l
	return l, nil
}

// newLayout is newLayout of side s's table.
func (m *mapper) newLayout(rel *cdc.Relation, s side, narrower bool) (*layout, error) {
	tp := &m.plan.Left
	if s == sideRight {
		tp = &m.plan.Right
	}
	return newLayout(rel, tp, s, narrower)
}

// newLayout finds the columns of tp in rel: its key, its foreign key (left
// side), its values. narrower accepts columns of rel narrower than tp's
// (positions).
func newLayout(rel *cdc.Relation, tp *plan.TablePlan, s side, narrower bool) (*layout, error) {
	l := &layout{side: s, inserts: !tp.Partitioned, filter: -1}
	if name := tp.FilterColumn(); name != "" {
		if l.filter = rel.ColumnIndex(name); l.filter < 0 {
			return nil, fmt.Errorf("the rows of %s.%s lack the value of its where (%s): no generator computes it", rel.Namespace, rel.Name, tp.Where)
		}
	}
	// The left key and the projected columns are target columns; the
	// foreign key (unless projected) and the right key live only in the
	// join state.
	inTarget := map[string]bool{}
	if s == sideLeft {
		for _, k := range tp.Key {
			inTarget[k.Name] = true
		}
	}
	vals := make([]plan.SourceColumn, len(tp.Values))
	for i, v := range tp.Values {
		vals[i] = v.Source
		inTarget[v.Source.Name] = true
	}
	var err error
	if l.key, err = positions(rel, tp.Key, true, narrower, inTarget); err != nil {
		return nil, err
	}
	if s == sideLeft {
		if l.fk, err = positions(rel, tp.ForeignKey, true, narrower, inTarget); err != nil {
			return nil, err
		}
	}
	if l.values, err = positions(rel, vals, false, narrower, inTarget); err != nil {
		return nil, err
	}
	return l, nil
}

// tableMapper turns cdc changes into the table changes of a list-form
// join (pipeline.TreeLayout turns them into a join.Tree's): table 0 is the
// left table (left changes, its values the columns it carries: plan.Carried),
// table i+1 is entry i (right changes). A table joined several times (`as`)
// yields a change for each entry it is.
type tableMapper struct {
	plan *plan.JoinPlan
	// tables[t] is table t as the tree sees it: key, and the carried
	// columns as values.
	tables  []plan.TablePlan
	layouts map[tableLayoutKey]*layout
	// of caches tablesOf per relation.
	of map[*cdc.Relation][]int
	// children is the first roll-up's children's table (len(tables): none).
	children int
}

type tableLayoutKey struct {
	rel   *cdc.Relation
	table int
}

func newTableMapper(p *plan.JoinPlan, l plan.Carried) *tableMapper {
	carried := func(cols []plan.SourceColumn) []plan.OutputColumn {
		out := make([]plan.OutputColumn, len(cols))
		for i, c := range cols {
			out[i] = plan.OutputColumn{Source: c, Name: c.Name}
		}
		return out
	}
	m := &tableMapper{plan: p, layouts: map[tableLayoutKey]*layout{}, of: map[*cdc.Relation][]int{}}
	m.tables = append(m.tables, plan.TablePlan{Table: p.Left.Table, Key: p.Left.Key, Values: carried(l.Columns[0]),
		Partitioned: p.Left.Partitioned, Where: p.Left.Where})
	for i, e := range p.Edges {
		m.tables = append(m.tables, plan.TablePlan{Table: e.Table.Table, Key: e.Table.Key, Values: carried(l.Columns[i+1]),
			Partitioned: e.Table.Partitioned, Where: e.Table.Where})
	}
	// A roll-up's results are no source table (a zero plan matches no
	// relation); its children follow the tree's tables, each a left side:
	// its key, its parent key as foreign key, its inputs.
	m.children = len(m.tables) + len(p.Rollups)
	m.tables = append(m.tables, make([]plan.TablePlan, len(p.Rollups))...)
	for _, r := range p.Rollups {
		m.tables = append(m.tables, plan.TablePlan{Table: r.Table.Table, Key: r.Table.Key, ForeignKey: r.Table.ForeignKey,
			Values: carried(r.Inputs), Partitioned: r.Table.Partitioned, Where: r.Table.Where})
	}
	return m
}

// tablesOf returns the join's tables that rel is.
func (m *tableMapper) tablesOf(rel *cdc.Relation) []int { return cachedOf(m.of, rel, m.findTables) }

func (m *tableMapper) findTables(rel *cdc.Relation) []int {
	t := config.TableName{Schema: rel.Namespace, Name: rel.Name}
	var out []int
	for i, tp := range m.tables {
		if tp.Table == t {
			out = append(out, i)
		}
	}
	return out
}

// layoutOf is the layout of table t in rel, for a change at position at.
func (m *tableMapper) layoutOf(rel *cdc.Relation, t int, at wal.LSN) (*layout, error) {
	if l, ok := m.layouts[tableLayoutKey{rel, t}]; ok {
		return l, nil
	}
	l, err := m.newLayout(rel, t, uint64(at) < m.plan.WidenedBefore)
	if err != nil {
		return nil, err
	}
	m.layouts[tableLayoutKey{rel, t}] = l
	return l, nil
}

// newLayout is newLayout of table t.
func (m *tableMapper) newLayout(rel *cdc.Relation, t int, narrower bool) (*layout, error) {
	s := sideRight
	if t == 0 || t >= m.children {
		s = sideLeft
	}
	return newLayout(rel, &m.tables[t], s, narrower)
}

// appendChanges maps one cdc change to the join's table changes.
func (m *tableMapper) appendChanges(dst []join.Change, c *cdc.Change) ([]join.Change, error) {
	switch c.Kind {
	case cdc.ChangeTruncate:
		for _, rel := range c.Truncate.Relations {
			for _, t := range m.tablesOf(rel) {
				kind := join.RightTruncate
				if t == 0 || t >= m.children {
					kind = join.LeftTruncate
				}
				dst = append(dst, join.Change{Table: t, Kind: kind})
			}
		}
		return dst, nil
	case cdc.ChangeSchema:
		if len(m.tablesOf(c.Schema.New)) == 0 && len(m.tablesOf(c.Schema.Old)) > 0 {
			return nil, fmt.Errorf("%w: table %s.%s, used by join %q, was renamed to %s.%s; rename it back or update the configuration",
				ErrSchemaChanged, c.Schema.Old.Namespace, c.Schema.Old.Name, m.plan.Name, c.Schema.New.Namespace, c.Schema.New.Name)
		}
		// Fail now, before any row laid out the new way. A relation
		// message has no WAL position: a narrower column is checked at
		// the first row (positions), which has one.
		for _, t := range m.tablesOf(c.Schema.New) {
			if _, err := m.newLayout(c.Schema.New, t, true); err != nil {
				return nil, err
			}
		}
		return dst, nil
	}
	var one []join.Change
	for _, t := range m.tablesOf(c.Relation) {
		l, err := m.layoutOf(c.Relation, t, c.LSN)
		if err != nil {
			return nil, err
		}
		if one, err = l.appendChange(one[:0], c); err != nil {
			return nil, err
		}
		for _, ch := range one {
			ch.Table = t
			dst = append(dst, ch)
		}
	}
	return dst, nil
}

// positions finds cols in rel by name; key says they are keys or foreign
// keys. A column that is missing or changed type is an error naming the
// fix: the transactions laid out the new way stay in the slot and cannot
// be joined, so restoring the column does not help them and only a rebuild
// gets past them. The next start builds the changed definition beside the
// running joins (the target keeps its rows, not maintained, until it
// switches in), from a snapshot that holds those transactions.
//
// Two type changes are followed instead. A column of rel wider than the
// plan's (plan.Widens: int to bigint, varchar(10) to text, ...) is
// ErrWidened: the daemon restarts from its checkpoints with the catalog's
// types and widens the target column first. A column narrower than the
// plan's (narrower) is a change from before such a widening, read again
// after it (plan.JoinPlan.WidenedBefore): its values fit. After that
// position it is a narrowing, refused like any other type change: the
// source rewrote its values (numeric's scale or a timestamp's precision
// down rounds them) without a change in the stream.
func positions(rel *cdc.Relation, cols []plan.SourceColumn, key, narrower bool, inTarget map[string]bool) ([]int, error) {
	pos := make([]int, len(cols))
	for i, c := range cols {
		j := rel.ColumnIndex(c.Name)
		if j < 0 {
			return nil, fmt.Errorf("%w: column %q of %s.%s, used by the join, was dropped or renamed; "+
				"follow its new name in the configuration (or remove it from it) and start fkmat run again: "+
				"it builds the join's new definition beside the running joins and switches the target to it "+
				"(the target keeps its rows, not maintained, until then); if you restore it instead (same name and type), "+
				"run fkmat backfill --force: only a rebuild from a new slot gets past the changes made without it",
				ErrSchemaChanged, c.Name, rel.Namespace, rel.Name)
		}
		pos[i] = j
		got := plan.SourceColumn{TypeOID: rel.Columns[j].Type, TypeMod: rel.Columns[j].TypeMod}
		want := plan.SourceColumn{TypeOID: c.TypeOID, TypeMod: -1}
		if c.HasTypeMod {
			want.TypeMod = c.TypeMod
		} else {
			got.TypeMod = -1 // the plan does not know it: compare the types alone
		}
		switch {
		case got.TypeOID == want.TypeOID && got.TypeMod == want.TypeMod:
			continue
		case narrower && plan.Widens(got, want, key):
			continue // from before a widening the plan follows
		case plan.Widens(want, got, key):
			return nil, fmt.Errorf("%w: column %q of %s.%s (%s) is now of type oid %d, typmod %d",
				ErrWidened, c.Name, rel.Namespace, rel.Name, c.Type, got.TypeOID, got.TypeMod)
		}
		fix := "start fkmat run again: it rebuilds the join with the new type beside the running joins " +
			"and switches to it (the target keeps its rows, not maintained, until then)"
		if inTarget[c.Name] {
			fix = "start fkmat run again: it rebuilds the join and its target with the new type beside the running joins " +
				"and switches the target to it (the target keeps its rows, not maintained, until then)"
		}
		if got.TypeOID == want.TypeOID {
			// The same type with another precision, scale or length
			// that not every value survives (numeric(14,4) to
			// numeric(12,2)): the target column keeps the old one, and
			// would round or refuse the new values.
			return nil, fmt.Errorf("%w: column %q of %s.%s, used by the join, changed its type modifier (was %s, typmod %d now %d), "+
				"which fkmat follows only when it widens the type; %s",
				ErrSchemaChanged, c.Name, rel.Namespace, rel.Name, c.Type, want.TypeMod, got.TypeMod, fix)
		}
		return nil, fmt.Errorf("%w: column %q of %s.%s, used by the join, changed type (was %s, type oid %d now %d), "+
			"which fkmat follows only when it widens the type (integer widths, varchar lengths, numeric and timestamp precision); %s",
			ErrSchemaChanged, c.Name, rel.Namespace, rel.Name, c.Type, want.TypeOID, got.TypeOID, fix)
	}
	return pos, nil
}

// appendChanges maps one cdc change to the join changes it makes: none for
// a table the join does not use, one per side the table is.
func (m *mapper) appendChanges(dst []join.Change, c *cdc.Change) ([]join.Change, error) {
	switch c.Kind {
	case cdc.ChangeTruncate:
		for _, rel := range c.Truncate.Relations {
			for _, s := range m.sidesOf(rel) {
				if s == sideLeft {
					dst = append(dst, join.Change{Kind: join.LeftTruncate})
				} else {
					dst = append(dst, join.Change{Kind: join.RightTruncate})
				}
			}
		}
		return dst, nil
	case cdc.ChangeSchema:
		if !m.uses(c.Schema.New) && m.uses(c.Schema.Old) {
			return nil, fmt.Errorf("%w: table %s.%s, used by join %q, was renamed to %s.%s; rename it back or update the configuration",
				ErrSchemaChanged, c.Schema.Old.Namespace, c.Schema.Old.Name, m.plan.Name, c.Schema.New.Namespace, c.Schema.New.Name)
		}
		// Fail now, before any row laid out the new way. A relation
		// message has no WAL position: a narrower column is checked at
		// the first row (positions), which has one.
		for _, s := range m.sidesOf(c.Schema.New) {
			if _, err := m.newLayout(c.Schema.New, s, true); err != nil {
				return nil, err
			}
		}
		return dst, nil
	}
	for _, s := range m.sidesOf(c.Relation) {
		l, err := m.layoutOf(c.Relation, s, c.LSN)
		if err != nil {
			return nil, err
		}
		if dst, err = l.appendChange(dst, c); err != nil {
			return nil, err
		}
	}
	return dst, nil
}

// appendChange appends the join change of one row change on l's side. On
// a filtered table (layout.filter), a row whose filter is not true is
// absent from the join: an insert of one is nothing (a delete where an
// insert does not prove the row new), an update to one deletes the row,
// and an update that leaves every input of the filter unchanged (TOASTed
// values the stream does not resend) keeps the row present or absent as
// it was (join.Change.IfPresent).
func (l *layout) appendChange(dst []join.Change, c *cdc.Change) ([]join.Change, error) {
	if l.filter < 0 || c.Kind == cdc.ChangeDelete {
		return l.appendRowChange(dst, c)
	}
	switch pass := c.New[l.filter]; {
	case pass.Kind == cdc.ValueUnchanged:
		n := len(dst)
		dst, err := l.appendRowChange(dst, c)
		for i := n; i < len(dst); i++ {
			dst[i].IfPresent = true
		}
		return dst, err
	case pass.Kind == cdc.ValueText && len(pass.Data) > 0 && pass.Data[0] == 't': // t, or true (boolean::text)
		return l.appendRowChange(dst, c)
	}
	// Not true: false or NULL.
	key := pick(c.New, l.key)
	switch {
	case c.Kind == cdc.ChangeInsert && l.inserts:
		return dst, nil
	case c.Kind == cdc.ChangeUpdate && c.OldKind != cdc.OldNone:
		key = pick(c.Old, l.key)
	case toastAt(c.New, l.key):
		return nil, fmt.Errorf("update of %s.%s: a key column is an unchanged TOASTed value and no old key was sent; "+
			"set REPLICA IDENTITY FULL on the table", c.Relation.Namespace, c.Relation.Name)
	}
	return append(dst, l.delete(key)), nil
}

// appendRowChange appends the join change of one row change on l's side,
// its filter aside.
func (l *layout) appendRowChange(dst []join.Change, c *cdc.Change) ([]join.Change, error) {
	switch c.Kind {
	case cdc.ChangeInsert:
		up := l.upsert(c.New)
		up.Insert = l.inserts
		return append(dst, up), nil
	case cdc.ChangeUpdate:
		if c.OldKind == cdc.OldNone {
			if toastAt(c.New, l.key) {
				return nil, fmt.Errorf("update of %s.%s: a key column is an unchanged TOASTed value and no old key was sent; "+
					"set REPLICA IDENTITY FULL on the table", c.Relation.Namespace, c.Relation.Name)
			}
			return append(dst, l.upsert(c.New)), nil
		}
		oldKey := pick(c.Old, l.key)
		newKey := pick(c.New, l.key)
		if hasToast(newKey) {
			// The key column is an unchanged TOASTed value: it is the old key.
			newKey = fillToast(newKey, oldKey)
		}
		up := l.upsert(c.New)
		if join.ValuesEqual(oldKey, newKey) {
			return append(dst, up), nil
		}
		// A key change: one change, so that the engine carries the old
		// row's state (the values pgoutput did not resend) to the new key.
		up.OldKey = oldKey
		if l.side == sideLeft {
			up.Kind, up.Left.PK = join.LeftKeyChange, newKey
		} else {
			up.Kind, up.Right.Key = join.RightKeyChange, newKey
		}
		return append(dst, up), nil
	case cdc.ChangeDelete:
		if c.OldKind == cdc.OldNone {
			return nil, fmt.Errorf("delete on %s.%s carries no key; check its REPLICA IDENTITY", c.Relation.Namespace, c.Relation.Name)
		}
		return append(dst, l.delete(pick(c.Old, l.key))), nil
	}
	return dst, nil
}

func (l *layout) upsert(tuple []cdc.Value) join.Change {
	cols := pickRow(tuple, [3][]int{l.key, l.fk, l.values})
	if l.side == sideLeft {
		return join.Change{Kind: join.LeftUpsert, Left: join.LeftRow{PK: cols[0], FK: cols[1], Values: cols[2]}}
	}
	return join.Change{Kind: join.RightUpsert, Right: join.RightRow{Key: cols[0], Values: cols[2]}}
}

func (l *layout) delete(key []join.Value) join.Change {
	if l.side == sideLeft {
		return join.Change{Kind: join.LeftDelete, Left: join.LeftRow{PK: key}}
	}
	return join.Change{Kind: join.RightDelete, Right: join.RightRow{Key: key}}
}

func pick(tuple []cdc.Value, pos []int) []join.Value {
	return pickRow(tuple, [3][]int{pos})[0]
}

// pickRow picks the columns at each list of positions of tuple, in two
// allocations whatever the columns: the values' text is copied into one
// string and the values into one slice, which the lists share (each capped
// at its length).
func pickRow(tuple []cdc.Value, lists [3][]int) (out [3][]join.Value) {
	size, n := 0, 0
	for _, pos := range lists {
		n += len(pos)
		for _, p := range pos {
			if k := tuple[p].Kind; k == cdc.ValueText || k == cdc.ValueBinary {
				size += len(tuple[p].Data)
			}
		}
	}
	var b strings.Builder
	b.Grow(size)
	for _, pos := range lists {
		for _, p := range pos {
			if k := tuple[p].Kind; k == cdc.ValueText || k == cdc.ValueBinary {
				b.Write(tuple[p].Data)
			}
		}
	}
	text := b.String()
	vals := make([]join.Value, n)
	i, off := 0, 0
	for l, pos := range lists {
		start := i
		for _, p := range pos {
			switch v := tuple[p]; v.Kind {
			case cdc.ValueNull:
				vals[i] = join.NullValue()
			case cdc.ValueUnchanged:
				vals[i] = join.ToastValue()
			default:
				vals[i] = join.TextValue(text[off : off+len(v.Data)])
				off += len(v.Data)
			}
			i++
		}
		out[l] = vals[start:i:i]
	}
	return out
}

// toastAt reports whether any column of tuple at pos is an unchanged
// TOASTed value.
func toastAt(tuple []cdc.Value, pos []int) bool {
	for _, p := range pos {
		if tuple[p].Kind == cdc.ValueUnchanged {
			return true
		}
	}
	return false
}

func hasToast(vs []join.Value) bool {
	for _, v := range vs {
		if v.Toast {
			return true
		}
	}
	return false
}

func fillToast(vs, from []join.Value) []join.Value {
	out := append([]join.Value(nil), vs...)
	for i := range out {
		if out[i].Toast && i < len(from) {
			out[i] = from[i]
		}
	}
	return out
}

// changeMapper turns cdc changes into a join's changes: the two-table
// mapper, or the tableMapper of a join of more than two tables.
type changeMapper interface {
	appendChanges(dst []join.Change, c *cdc.Change) ([]join.Change, error)
	uses(rel *cdc.Relation) bool
}

var (
	_ changeMapper = (*mapper)(nil)
	_ changeMapper = (*tableMapper)(nil)
)

// uses reports whether rel is a table of the join.
func (m *tableMapper) uses(rel *cdc.Relation) bool { return len(m.tablesOf(rel)) > 0 }
