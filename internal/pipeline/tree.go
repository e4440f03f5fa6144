package pipeline

import (
	"context"
	"fmt"
	"slices"

	"github.com/fkmat/fkmat/internal/config"
	"github.com/fkmat/fkmat/internal/plan"
	"github.com/fkmat/fkmat/internal/wal"
	"github.com/fkmat/fkmat/join"
	"github.com/fkmat/fkmat/redisstore"
)

// Tree is a join of more than two tables with each table's rows stored
// once (join.Tree, docs/nway.md): one Redis state per table, holding the
// table's rows and the references of the entries whose foreign key the
// table holds.
type Tree struct {
	joinBase
	tree   *join.Tree
	layout *TreeLayout
	// tables are the tree's tables' states, then each roll-up's children's.
	tables []*tableState
	// rollups are the roll-ups' engines; their children's changes and
	// states are numbered after the tree's tables (rollupAt).
	rollups []*join.Rollup
	// holding says the batches are chunks of a large transaction before
	// its last; held are the roll-ups' results they hold, by roll-up.
	holding bool
	held    map[int]*heldResults
}

var _ Join = (*Tree)(nil)

// NewTree returns the join p of more than two tables over one Redis state
// per table (stores: the left table, then each entry's), walking pageSize
// keys at a time.
func NewTree(p *plan.JoinPlan, stores []*redisstore.Store, pageSize int) (*Tree, error) {
	states := make([]State, len(stores))
	for i, s := range stores {
		states[i] = s
	}
	return newTree(p, states, pageSize)
}

// newTree returns the tree over any States (the unit tests' fakes).
func newTree(p *plan.JoinPlan, stores []State, pageSize int) (*Tree, error) {
	if len(p.Edges) > config.MaxEntries {
		return nil, fmt.Errorf("join %q: %d entries, at most %d are supported", p.Name, len(p.Edges), config.MaxEntries)
	}
	l := TreeLayoutOf(p)
	if len(stores) != p.States() {
		return nil, fmt.Errorf("join %q: %d states for %d", p.Name, len(stores), p.States())
	}
	spec := l.Spec
	spec.PageSize = pageSize
	jt, err := join.NewTree(spec)
	if err != nil {
		return nil, fmt.Errorf("join %q: %w", p.Name, err)
	}
	t := &Tree{tree: jt, layout: l, held: map[int]*heldResults{}}
	for k := range p.Rollups {
		r, err := join.NewRollup(RollupSpecOf(p, k))
		if err != nil {
			return nil, fmt.Errorf("join %q: %w", p.Name, err)
		}
		t.rollups = append(t.rollups, r)
	}
	for _, store := range stores {
		older := join.NewPending(store)
		t.tables = append(t.tables, &tableState{store: store, pending: join.NewPending(older), older: older})
	}
	t.joinBase = joinBase{plan: p, st: newTreeState(t.tables, len(l.Spec.Tables)), mapper: newTableMapper(p, l.carried)}
	return t, nil
}

func (t *Tree) Stores() []*redisstore.Store {
	out := make([]*redisstore.Store, len(t.tables))
	for i, s := range t.tables {
		rs, ok := s.store.(*redisstore.Store)
		if !ok {
			return nil // the unit tests' fakes
		}
		out[i] = rs
	}
	return out
}

// Stats reports the tree's walks as fan-out rows.
func (t *Tree) Stats() join.Stats {
	s := t.tree.Stats()
	out := join.Stats{FanoutRows: s.Walked}
	if len(t.rollups) > 0 {
		out.Rollups = make(map[string]join.RollupStats, len(t.rollups))
		for _, r := range t.rollups {
			out.Rollups[r.Spec().Name] = r.Stats()
		}
	}
	return out
}

// Resume reads every table's state; the tables ahead of the lowest
// checkpoint (a crash between their commits) are Ahead.
func (t *Tree) Resume(ctx context.Context) (Resumed, error) {
	r, err := t.resume(ctx)
	if err != nil {
		return r, err
	}
	for i, s := range t.tables {
		if cp := s.store.Checkpoint(); cp > r.Checkpoint {
			if r.Ahead == nil {
				r.Ahead = map[int]wal.LSN{}
			}
			r.Ahead[i] = cp
		}
	}
	return r, nil
}

// apply runs the tree on a batch. A table's mutations depend only on its
// own state and the batch's changes of it, so after a crash between the
// tables' commits the tables behind get exactly what they lack, and the
// tables ahead skip the batch (their commit is a no-op at a checkpoint
// they have); the target has it already. A fan-out writes no state, so a
// large transaction needs no pages of partial state.
func (t *Tree) apply(ctx context.Context, changes []join.Change, bound wal.LSN, emit func(context.Context, join.Output) error) (join.Mutations, error) {
	ahead := t.ahead(bound)
	if ahead {
		kept := make([]join.Change, 0, len(changes))
		for _, c := range changes {
			if t.tables[c.Table].store == nil || t.tables[c.Table].store.Checkpoint() < bound {
				kept = append(kept, c)
			}
		}
		changes = kept
	}
	changes, rolled, err := t.rollUp(ctx, changes, !ahead)
	if err != nil {
		return join.Mutations{}, t.errorf(err)
	}
	tcs, err := t.layout.changes(changes)
	if err != nil {
		return join.Mutations{}, t.errorf(err)
	}
	m, err := t.tree.Apply(ctx, treeReader{t}, tcs, emit)
	if err != nil {
		return join.Mutations{}, err
	}
	out, err := t.layout.Mutations(m)
	if err != nil || len(t.rollups) == 0 {
		return out, err
	}
	out.Tables = append(out.Tables, rolled...)
	return out, nil
}

func (t *Tree) located(_ []txnSpan, err error) error { return err }

// ahead reports whether some table has what a batch ending at bound
// brings.
func (t *Tree) ahead(bound wal.LSN) bool {
	for _, s := range t.tables {
		if s.store != nil && s.store.Checkpoint() >= bound {
			return true
		}
	}
	return false
}

// recycle keeps nothing: a tree's mutations are its own (join.Tree).
func (t *Tree) recycle(*join.Mutations, []join.Output) {}

// overlay sets each table's in-flight mutations, as Pair.overlay does
// for its one state.
func (t *Tree) overlay(older, newer *join.Mutations) error {
	table := func(m *join.Mutations, i int) *join.Mutations {
		if m == nil || i >= len(m.Tables) {
			return nil
		}
		return &m.Tables[i]
	}
	var first error
	for i, s := range t.tables {
		err := s.older.Set(table(older, i))
		if err2 := s.pending.Set(table(newer, i)); err == nil {
			err = err2
		}
		if first == nil {
			first = err
		}
	}
	return first
}

// treeReader is the tree's join.TreeStateReader: each table's state
// through its overlays.
type treeReader struct{ t *Tree }

func (r treeReader) GetRows(ctx context.Context, table int, keys []join.Key) (map[join.Key]join.TreeRow, error) {
	got, err := r.t.tables[table].pending.GetLeft(ctx, keys)
	if err != nil {
		return nil, err
	}
	out := make(map[join.Key]join.TreeRow, len(got))
	for k, st := range got {
		row, err := r.t.layout.rowOfState(table, st)
		if err != nil {
			return nil, err
		}
		out[k] = row
	}
	return out, nil
}

func (r treeReader) Referencing(ctx context.Context, entry int, parents, afters []join.Key, limit int) ([][]join.Key, error) {
	fks := make([]join.Key, len(parents))
	for i, p := range parents {
		fks[i] = EdgeKey(entry, p)
	}
	from := r.t.layout.Spec.Tables[entry].From
	return r.t.tables[from].pending.DependentsAfter(ctx, fks, afters, limit)
}

// EdgeKey is the foreign key under which the state of a table records that
// a row references key parent of entry (a table of a tree): the entry's
// number in a byte, then the key. A table's state holds the references of
// every entry it references, each under its own prefix.
func EdgeKey(entry int, parent join.Key) join.Key {
	return join.Key(string([]byte{byte(entry)}) + string(parent))
}

// MemberFK returns, for Redis state t of join p (0 for the one state of a
// two-table join; plan.JoinPlan.States), the length of the foreign key
// that a subscription's member (FK ++ PK) starts with: for a table of a
// tree the entry's byte and its table's key (EdgeKey), for a roll-up's
// children the parent key and the sorted set's byte (join.Rollup), for a
// two-table join the left table's foreign key. redisstore.Store.Resize
// needs it to find a member's lane.
func MemberFK(p *plan.JoinPlan, t int) func(member string) (int, error) {
	if p.Edges == nil {
		n := len(p.Right.Key)
		return func(m string) (int, error) { return join.KeyLen(m, n) }
	}
	tables := len(p.Edges) + 1 + len(p.Rollups)
	if t >= tables {
		n := len(p.Left.Key)
		return func(m string) (int, error) {
			k, err := join.KeyLen(m, n)
			return k + 1, err
		}
	}
	arity := make([]int, tables)
	for i, e := range p.Edges {
		arity[i+1] = len(e.Table.Key)
	}
	for k := range p.Rollups {
		arity[len(p.Edges)+1+k] = len(p.Left.Key)
	}
	return func(m string) (int, error) {
		if m == "" || m[0] == 0 || int(m[0]) >= len(arity) {
			return 0, fmt.Errorf("join %q: a reference %x of no entry", p.Name, m)
		}
		n, err := join.KeyLen(m[1:], arity[m[0]])
		return 1 + n, err
	}
}

// TreeLayout maps a join of more than two tables onto a join.Tree: the
// carried columns of each table (plan.Carried: its output
// columns, then the foreign-key columns of the entries referencing it
// that are not output) become the tree's rows, and those rows become each
// table's Redis state.
type TreeLayout struct {
	Spec    join.TreeSpec
	carried plan.Carried
	// fks[t][j] are the positions, in table t's carried columns, of the
	// foreign key of the j-th entry referencing t.
	fks [][][]int
	// children[t] are the entries referencing table t, in order.
	children [][]int
}

// TreeLayoutOf lays out p's tree. Table 0 is the left table, table i+1
// entry i.
func TreeLayoutOf(p *plan.JoinPlan) *TreeLayout {
	l := &TreeLayout{carried: plan.CarriedOf(p), Spec: join.TreeSpec{Name: p.Name}}
	n := len(p.Edges) + 1 + len(p.Rollups)
	l.fks, l.children = make([][][]int, n), make([][]int, n)
	l.Spec.Tables = append(l.Spec.Tables, join.TreeTable{Key: plan.Families(p.Left.Key), Values: l.carried.Shown[0], From: -1,
		Partitioned: p.Left.Partitioned})
	for i, e := range p.Edges {
		typ := join.Left
		if e.Type == config.JoinInner {
			typ = join.Inner
		}
		l.Spec.Tables = append(l.Spec.Tables, join.TreeTable{Key: plan.Families(e.Table.Key), Values: l.carried.Shown[i+1],
			From: e.Parent + 1, Type: typ, Partitioned: e.Table.Partitioned})
		from := e.Parent + 1
		l.children[from] = append(l.children[from], i+1)
		var pos []int
		for _, fk := range e.Table.ForeignKey {
			pos = append(pos, slices.IndexFunc(l.carried.Columns[from], func(s plan.SourceColumn) bool { return s.Name == fk.Name }))
		}
		l.fks[from] = append(l.fks[from], pos)
	}
	// A roll-up is an entry whose rows are its results, keyed by parent:
	// the left table references it by its own key (positions -1-k: key
	// column k, not stored with the row).
	for k, r := range p.Rollups {
		t := len(p.Edges) + 1 + k
		absent := make([]join.Value, len(r.Aggregates))
		for i, a := range r.Aggregates {
			absent[i] = join.NullValue()
			if a.Func == config.AggCount {
				absent[i] = join.TextValue("0")
			}
		}
		l.Spec.Tables = append(l.Spec.Tables, join.TreeTable{Key: plan.Families(p.Left.Key), Values: l.carried.Shown[t],
			From: 0, Type: join.Left, Absent: absent, OwnKey: true})
		l.children[0] = append(l.children[0], t)
		pos := make([]int, len(p.Left.Key))
		for i := range pos {
			pos[i] = -1 - i
		}
		l.fks[0] = append(l.fks[0], pos)
	}
	return l
}

// ownKey says a foreign key's positions are the row's own key (a roll-up's
// reference).
func ownKey(pos []int) bool { return len(pos) > 0 && pos[0] < 0 }

// Columns returns the source columns of table t a row of it is read from:
// its key, then its carried columns.
func (l *TreeLayout) Columns(p *plan.JoinPlan, t int) []plan.SourceColumn {
	key := p.Left.Key // the left table's, and a roll-up's results'
	if t > 0 && t <= len(p.Edges) {
		key = p.Edges[t-1].Table.Key
	}
	return append(slices.Clone(key), l.carried.Columns[t]...)
}

// row returns table t's row of key and carried values.
func (l *TreeLayout) row(t int, key, carried []join.Value) (join.TreeRow, error) {
	if len(carried) != len(l.carried.Columns[t]) {
		return join.TreeRow{}, fmt.Errorf("table %d: %d carried values, want %d", t, len(carried), len(l.carried.Columns[t]))
	}
	r := join.TreeRow{Key: key, Values: carried[:l.carried.Shown[t]], FKs: make([][]join.Value, len(l.fks[t]))}
	for j, pos := range l.fks[t] {
		if ownKey(pos) {
			r.FKs[j] = key
			continue
		}
		fk := make([]join.Value, len(pos))
		for k, p := range pos {
			fk[k] = carried[p]
		}
		r.FKs[j] = fk
	}
	return r, nil
}

// rowOfState returns the row a table's stored state holds: its values,
// then its foreign keys one after the other.
func (l *TreeLayout) rowOfState(t int, st join.LeftState) (join.TreeRow, error) {
	r := join.TreeRow{Key: st.PK, Values: st.Values, FKs: make([][]join.Value, len(l.fks[t]))}
	rest := st.FK
	for j, pos := range l.fks[t] {
		if ownKey(pos) {
			r.FKs[j] = st.PK
			continue
		}
		if len(rest) < len(pos) {
			return join.TreeRow{}, fmt.Errorf("table %d: a stored row with %d foreign-key values, want more", t, len(st.FK))
		}
		r.FKs[j], rest = rest[:len(pos)], rest[len(pos):]
	}
	if len(rest) != 0 || len(st.Values) != l.Spec.Tables[t].Values {
		return join.TreeRow{}, fmt.Errorf("table %d: a stored row of another shape (%d values, %d foreign-key values)", t, len(st.Values), len(st.FK))
	}
	return r, nil
}

// stateOf returns the stored state of row of table t (its own key is not
// stored again as a foreign key).
func (l *TreeLayout) stateOf(t int, row *join.TreeRow) join.LeftState {
	var fk []join.Value
	for j, f := range row.FKs {
		if !ownKey(l.fks[t][j]) {
			fk = append(fk, f...)
		}
	}
	return join.LeftState{PK: row.Key, FK: fk, Values: row.Values}
}

// changes turns the table changes of the mapper (tableMapper) into the
// tree's.
func (l *TreeLayout) changes(in []join.Change) ([]join.TreeChange, error) {
	out := make([]join.TreeChange, 0, len(in))
	for _, c := range in {
		tc := join.TreeChange{Table: c.Table, Insert: c.Insert, OldKey: c.OldKey, IfPresent: c.IfPresent, Known: c.Known}
		var err error
		if c.Known && c.Before != nil {
			before, err := l.row(c.Table, c.Right.Key, c.Before)
			if err != nil {
				return nil, err
			}
			tc.Before = &before
		}
		switch c.Kind {
		case join.LeftUpsert, join.RightUpsert, join.LeftKeyChange, join.RightKeyChange:
			tc.Kind = join.TreeUpsert
			if c.Kind == join.LeftKeyChange || c.Kind == join.RightKeyChange {
				tc.Kind = join.TreeKeyChange
			}
			key, vals := c.Left.PK, c.Left.Values
			if c.Table > 0 {
				key, vals = c.Right.Key, c.Right.Values
			}
			if tc.Row, err = l.row(c.Table, key, vals); err != nil {
				return nil, err
			}
		case join.LeftDelete:
			tc.Kind, tc.Row.Key = join.TreeDelete, c.Left.PK
		case join.RightDelete:
			tc.Kind, tc.Row.Key = join.TreeDelete, c.Right.Key
		case join.LeftTruncate, join.RightTruncate:
			tc.Kind = join.TreeTruncate
		default:
			return nil, fmt.Errorf("table %d: change kind %s", c.Table, c.Kind)
		}
		out = append(out, tc)
	}
	return out, nil
}

// Mutations turns the tree's mutations into each table's state's: its rows
// (left rows), and the references of the entries it references (a
// subscription under EdgeKey per row). A cleared table's state clears its
// rows and those references together, as the tree does.
func (l *TreeLayout) Mutations(m join.TreeMutations) (join.Mutations, error) {
	steps := make([]join.Mutations, len(l.Spec.Tables))
	for t := range steps {
		s := &steps[t]
		s.ClearLeft = m.ClearRows[t]
		for _, c := range l.children[t] {
			if m.ClearRefs[c] != m.ClearRows[t] {
				return join.Mutations{}, fmt.Errorf("table %d: the references of entry %d are cleared without its rows", t, c)
			}
		}
		for k, row := range m.Rows[t] {
			if row == nil {
				s.DelLeft = append(s.DelLeft, k)
				continue
			}
			if s.PutLeft == nil {
				s.PutLeft = make(map[join.Key]join.LeftState, len(m.Rows[t]))
			}
			s.PutLeft[k] = l.stateOf(t, row)
		}
		for _, c := range l.children[t] {
			for sub, add := range m.Refs[c] {
				ref := join.Subscription{FK: EdgeKey(c, sub.FK), PK: sub.PK}
				if add {
					s.AddSubs = append(s.AddSubs, ref)
				} else {
					s.DelSubs = append(s.DelSubs, ref)
				}
			}
		}
	}
	return join.PerTable(steps), nil
}

// Load returns the state of rows of table t read from the source (its
// Columns): each row, and a reference per non-NULL foreign key.
func (l *TreeLayout) Load(t int, rows [][]join.Value) (join.Mutations, error) {
	nk := len(l.Spec.Tables[t].Key)
	m := join.Mutations{PutLeft: make(map[join.Key]join.LeftState, len(rows))}
	// The foreign keys of every row, one after the other: a row's state
	// holds them so (stateOf), and its references read them from there.
	width := 0
	for _, pos := range l.fks[t] {
		if !ownKey(pos) {
			width += len(pos)
		}
	}
	fks := make([]join.Value, 0, width*len(rows))
	for _, r := range rows {
		key, carried := r[:nk], r[nk:]
		if len(carried) != len(l.carried.Columns[t]) {
			return m, fmt.Errorf("table %d: %d carried values, want %d", t, len(carried), len(l.carried.Columns[t]))
		}
		k, err := join.EncodeKey(l.Spec.Tables[t].Key, key)
		if err != nil {
			return m, fmt.Errorf("table %d: key: %w", t, err)
		}
		start := len(fks)
		for _, pos := range l.fks[t] {
			if ownKey(pos) {
				continue
			}
			for _, p := range pos {
				fks = append(fks, carried[p])
			}
		}
		st := join.LeftState{PK: key, Values: carried[:l.carried.Shown[t]]}
		if width > 0 {
			st.FK = fks[start:len(fks):len(fks)]
		}
		m.PutLeft[k] = st
		fk := st.FK
		for j, c := range l.children[t] {
			ref := key
			if !ownKey(l.fks[t][j]) {
				ref = fk[:len(l.fks[t][j])]
				fk = fk[len(ref):]
			}
			if hasNullValue(ref) {
				continue
			}
			f, err := join.EncodeKey(l.Spec.Tables[c].Key, ref)
			if err != nil {
				return m, fmt.Errorf("table %d: foreign key of entry %d: %w", t, c-1, err)
			}
			m.AddSubs = append(m.AddSubs, join.Subscription{FK: EdgeKey(c, f), PK: k})
		}
	}
	return m, nil
}

func hasNullValue(vs []join.Value) bool {
	return slices.ContainsFunc(vs, func(v join.Value) bool { return v.Null })
}
