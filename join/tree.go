package join

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
)

// A Tree maintains a foreign-key join of several tables with each table's
// rows stored once and one subscription per child row and edge (README,
// "Joins of more than two tables"; docs/nway.md argues the design).
//
// The tables form a tree rooted at the left table (table 0): every other
// table (an entry) is referenced by the foreign key of one earlier table,
// its From. The target has one row per root row: the root's key, then the
// values of every table in order, NULL for a table its path does not reach;
// the row exists when every inner entry is reached. This is the SQL of the
// entries joined in list order.
//
// State, through TreeStateReader: each table's rows by key (their output
// values and the foreign keys of the entries referencing them), and for
// each entry its edge: the keys of the From rows referencing each of its
// keys, a range read.
//
// A batch computes everything from one state: the store as of the batch's
// start plus the batch's own changes. The values of a subtree (a table and
// every entry below it) in a target row depend only on the row of the
// subtree's table that the target row reaches. So a changed row x of entry
// X changes, in every target row that reaches x, exactly the columns of
// X's subtree, to one set of values; the engine evaluates x's subtree before
// and after the batch and, when they differ, walks the edges from x down to
// the root keys (in pages, batched per level) and writes:
//
//   - the subtree's columns of those rows (ColumnUpdate), when the rows
//     exist before and after;
//   - deletes, when an inner entry of the subtree stops being reached;
//   - whole rows, read along their path, when one starts being reached.
//
// A walk stops at rows the batch changed: their own walk covers what lies
// below them. Root rows the batch changed are evaluated whole. TRUNCATE of
// any table is followed: the root's empties the target, an entry's sets its
// subtree's columns to NULL or, when the subtree has an inner entry,
// empties the target.
type Tree struct {
	spec     TreeSpec
	children [][]int // children[t]: the entries whose From is t, in order
	cols     [][]int // cols[t]: the target columns of t's values
	subCols  [][]int // subCols[t]: the target columns of t's subtree, ascending
	hasInner []bool  // hasInner[t]: t's subtree (t included) has an inner entry
	absent   []Value // absent[c]: target column c when its entry has no row
	width    int     // target columns
	stats    TreeStats
}

// TreeSpec describes a Tree.
type TreeSpec struct {
	// Name identifies the join in errors.
	Name string
	// Tables are the root (index 0) and the entries, each entry after its
	// From.
	Tables []TreeTable
	// PageSize bounds the keys held per level of a walk and per output;
	// 0 means DefaultPageSize.
	PageSize int
}

// TreeTable is one table of a Tree.
type TreeTable struct {
	// Key are the families of the table's key columns.
	Key []Family
	// Values counts the table's output columns (TreeRow.Values); the
	// root's key columns come before them in the target.
	Values int
	// From is the table holding the entry's foreign key; -1 for the root.
	From int
	// Type is the entry's join type (the root's is ignored).
	Type JoinType
	// Partitioned: see Spec.LeftPartitioned.
	Partitioned bool
	// Absent are an entry's values when no row matches (a left join):
	// NULL when nil (a roll-up's count is 0).
	Absent []Value
	// OwnKey says the root references the entry by the root's own key (a
	// roll-up's results, keyed by parent): the entry's row of key k is
	// reached from the root row of key k alone, if there is one, so a walk
	// from it reads no references. It needs a left entry of the root, of
	// the root's key families, with no entries of its own.
	OwnKey bool
}

// TreeRow is a row of one table of a Tree: its key, its output values and,
// for each entry referencing the table (in entry order), that entry's
// foreign key (NULL values: no reference). A change's Values and FKs may
// hold Toast markers, filled from the stored row.
type TreeRow struct {
	Key    []Value
	Values []Value
	FKs    [][]Value
}

// TreeChangeKind is the kind of a TreeChange.
type TreeChangeKind uint8

// The kinds of a TreeChange.
const (
	TreeUpsert TreeChangeKind = iota + 1
	TreeDelete
	// TreeKeyChange moves the row at OldKey to Row.Key, with its
	// unchanged-TOAST values. Rows referencing the old key keep
	// referencing it (SQL does not move them).
	TreeKeyChange
	TreeTruncate
)

// TreeChange is one change of one table of a Tree.
type TreeChange struct {
	Table int
	Kind  TreeChangeKind
	// Row is the new row (TreeDelete: its Key only).
	Row TreeRow
	// OldKey is the key before a TreeKeyChange.
	OldKey []Value
	// Insert marks a row that did not exist just before (a pgoutput
	// INSERT): when it is its key's first change in the batch, the key's
	// stored state is not read.
	Insert bool
	// IfPresent: see Change.IfPresent.
	IfPresent bool
	// Known marks a change that carries its row as it was at the batch
	// start (Before; nil: absent): when it is its key's first change in the
	// batch and no earlier segment changed the key, the stored row is not
	// read.
	Known  bool
	Before *TreeRow
}

// TreeStateReader reads a Tree's state as of the last committed batch.
type TreeStateReader interface {
	// GetRows returns the stored rows of table with the given keys;
	// absent keys are missing from the map, which is the caller's.
	GetRows(ctx context.Context, table int, keys []Key) (map[Key]TreeRow, error)
	// Referencing returns, for each parents[i], up to limit keys of the
	// rows of entry's From whose foreign key to entry is parents[i], in
	// key order, strictly after afters[i] ("" = from the start). A result
	// shorter than limit is the last.
	Referencing(ctx context.Context, entry int, parents, afters []Key, limit int) ([][]Key, error)
}

// TreeMutations is the net state change of a batch of a Tree. Applying
// it is idempotent. Order: the clears, then the deletes and puts of rows
// and references (they concern distinct keys and members).
type TreeMutations struct {
	// ClearRows[t] drops every row of table t, ClearRefs[e] every
	// reference of entry e's edge.
	ClearRows []bool
	ClearRefs []bool
	// Rows[t] are the rows of table t to put (nil: delete), by key.
	Rows []map[Key]*TreeRow
	// Refs[e] are the references of entry e's edge to add (true) or
	// remove (false); FK is the entry's key, PK the From row's.
	Refs []map[Subscription]bool
}

// Empty reports whether m changes nothing.
func (m *TreeMutations) Empty() bool {
	for t := range m.Rows {
		if m.ClearRows[t] || m.ClearRefs[t] || len(m.Rows[t]) > 0 || len(m.Refs[t]) > 0 {
			return false
		}
	}
	return true
}

// TreeStats are a Tree's cumulative counters.
type TreeStats struct {
	// Walked counts the root keys reached by walks.
	Walked uint64
}

// ErrTreeSpec is a TreeSpec that does not describe a tree.
var ErrTreeSpec = errors.New("invalid join tree")

// NewTree returns the Tree of spec.
func NewTree(spec TreeSpec) (*Tree, error) {
	if spec.PageSize == 0 {
		spec.PageSize = DefaultPageSize
	}
	n := len(spec.Tables)
	switch {
	case n < 2:
		return nil, fmt.Errorf("%w %q: %d tables, want at least 2", ErrTreeSpec, spec.Name, n)
	case spec.PageSize < 0:
		return nil, fmt.Errorf("%w %q: negative page size", ErrTreeSpec, spec.Name)
	case spec.Tables[0].From != -1:
		return nil, fmt.Errorf("%w %q: the root has a From", ErrTreeSpec, spec.Name)
	}
	tr := &Tree{spec: spec, children: make([][]int, n), cols: make([][]int, n), subCols: make([][]int, n), hasInner: make([]bool, n)}
	col := len(spec.Tables[0].Key)
	for t, tab := range spec.Tables {
		if len(tab.Key) == 0 || tab.Values < 0 {
			return nil, fmt.Errorf("%w %q: table %d has no key columns or a negative value count", ErrTreeSpec, spec.Name, t)
		}
		if t > 0 {
			if tab.From < 0 || tab.From >= t {
				return nil, fmt.Errorf("%w %q: entry %d references table %d, which is not an earlier table", ErrTreeSpec, spec.Name, t, tab.From)
			}
			if tab.Type != Inner && tab.Type != Left {
				return nil, fmt.Errorf("%w %q: entry %d: type %s is neither inner nor left", ErrTreeSpec, spec.Name, t, tab.Type)
			}
			tr.children[tab.From] = append(tr.children[tab.From], t)
		}
		for range tab.Values {
			tr.cols[t] = append(tr.cols[t], col)
			col++
		}
	}
	tr.width = col
	tr.absent = make([]Value, col)
	for c := range tr.absent {
		tr.absent[c] = NullValue()
	}
	for t, tab := range spec.Tables {
		if tab.Absent == nil {
			continue
		}
		if len(tab.Absent) != tab.Values {
			return nil, fmt.Errorf("%w %q: table %d has %d values when absent, want %d", ErrTreeSpec, spec.Name, t, len(tab.Absent), tab.Values)
		}
		for j, c := range tr.cols[t] {
			tr.absent[c] = tab.Absent[j]
		}
	}
	for t := n - 1; t >= 0; t-- {
		tr.subCols[t] = slices.Clone(tr.cols[t])
		tr.hasInner[t] = t > 0 && spec.Tables[t].Type == Inner
		for _, c := range tr.children[t] {
			tr.subCols[t] = append(tr.subCols[t], tr.subCols[c]...)
			tr.hasInner[t] = tr.hasInner[t] || tr.hasInner[c]
		}
		slices.Sort(tr.subCols[t])
	}
	for t, tab := range spec.Tables {
		if tab.OwnKey && (t == 0 || tab.From != 0 || tab.Type != Left || len(tr.children[t]) > 0 || !slices.Equal(tab.Key, spec.Tables[0].Key)) {
			return nil, fmt.Errorf("%w %q: entry %d is keyed by the root's key, but is not a left entry of the root of its key's families without entries", ErrTreeSpec, spec.Name, t)
		}
	}
	return tr, nil
}

// Spec returns the tree's spec, defaults filled.
func (tr *Tree) Spec() TreeSpec { return tr.spec }

// Stats returns the cumulative counters. Not safe during Apply.
func (tr *Tree) Stats() TreeStats { return tr.stats }

// Apply applies changes (whole source transactions in commit order) to the
// state read through store, emits the target's changes in order, and
// returns the batch's net mutations. On error nothing of the batch may be
// persisted.
func (tr *Tree) Apply(ctx context.Context, store TreeStateReader, changes []TreeChange, emit func(context.Context, Output) error) (TreeMutations, error) {
	n := len(tr.spec.Tables)
	a := &treeApply{tr: tr, emit: emit, ov: newTreeOverlay(tr, store, n)}
	for start := 0; start < len(changes); {
		end := start
		for end < len(changes) && changes[end].Kind != TreeTruncate {
			end++
		}
		if err := a.segment(ctx, changes[start:end]); err != nil {
			return TreeMutations{}, err
		}
		if end < len(changes) {
			if err := a.truncate(ctx, changes[end].Table); err != nil {
				return TreeMutations{}, err
			}
			end++
		}
		start = end
	}
	return a.ov.mutations()
}

// treeApply is one Apply.
type treeApply struct {
	tr   *Tree
	emit func(context.Context, Output) error
	ov   *treeOverlay
	// changed[t] are the rows of table t the current segment changed;
	// acts[t] what those of an entry do to the target rows reaching them.
	changed []map[Key]*treeChanged
	acts    []map[Key]treeAction
}

// treeChanged is a row changed by a segment: before and after it (nil:
// absent).
type treeChanged struct {
	old, new *TreeRow
}

// truncate applies a TRUNCATE of table t.
func (a *treeApply) truncate(ctx context.Context, t int) error {
	tr := a.tr
	if t < 0 || t >= len(tr.spec.Tables) {
		return fmt.Errorf("join %q: a truncate of table %d, which the join does not have", tr.spec.Name, t)
	}
	out := Output{Truncate: t == 0 || tr.hasInner[t]}
	if !out.Truncate {
		out.NullColumns = tr.subCols[t]
		for _, c := range out.NullColumns {
			if !tr.absent[c].Null {
				out.NullValues = make([]Value, len(out.NullColumns))
				for i, c := range out.NullColumns {
					out.NullValues[i] = tr.absent[c]
				}
				break
			}
		}
	}
	a.ov.clearRows(t)
	for _, c := range tr.children[t] {
		a.ov.clearRefs(c)
	}
	return a.emit(ctx, out)
}

// segment applies changes without a TRUNCATE.
func (a *treeApply) segment(ctx context.Context, changes []TreeChange) error {
	if len(changes) == 0 {
		return nil
	}
	if err := a.fold(ctx, changes); err != nil {
		return err
	}
	a.record()
	if err := a.roots(ctx); err != nil {
		return err
	}
	for t := 1; t < len(a.tr.spec.Tables); t++ {
		if err := a.entry(ctx, t); err != nil {
			return err
		}
	}
	return nil
}

// fold computes each changed row's state before and after the segment.
func (a *treeApply) fold(ctx context.Context, changes []TreeChange) error {
	tr := a.tr
	n := len(tr.spec.Tables)
	a.changed = make([]map[Key]*treeChanged, n)
	a.acts = make([]map[Key]treeAction, n)
	for t := range a.changed {
		a.changed[t], a.acts[t] = map[Key]*treeChanged{}, map[Key]treeAction{}
	}
	// Read the state of every key the segment touches, per table, once.
	keys := make([][]Key, n)
	known := make([]map[Key]bool, n) // keys whose state is known (absent) or queued
	for t := range known {
		known[t] = map[Key]bool{}
	}
	encoded := make([][2]Key, len(changes))
	for i, c := range changes {
		if c.Table < 0 || c.Table >= n {
			return fmt.Errorf("join %q: a change of table %d, which the join does not have", tr.spec.Name, c.Table)
		}
		fams := tr.spec.Tables[c.Table].Key
		k, err := EncodeKey(fams, c.Row.Key)
		if err != nil {
			return fmt.Errorf("join %q: table %d: encode key: %w", tr.spec.Name, c.Table, err)
		}
		encoded[i][0] = k
		if !known[c.Table][k] {
			known[c.Table][k] = true
			switch {
			case c.Insert && c.Kind == TreeUpsert:
				a.changed[c.Table][k] = &treeChanged{}
			case c.Known && c.Kind != TreeKeyChange && a.ov.unchanged(c.Table, k):
				a.changed[c.Table][k] = &treeChanged{old: c.Before, new: c.Before}
				if c.Before != nil {
					a.ov.noteBase(c.Table, k, c.Before)
				}
			default:
				keys[c.Table] = append(keys[c.Table], k)
			}
		}
		if c.Kind == TreeKeyChange {
			ok, err := EncodeKey(fams, c.OldKey)
			if err != nil {
				return fmt.Errorf("join %q: table %d: encode old key: %w", tr.spec.Name, c.Table, err)
			}
			encoded[i][1] = ok
			if !known[c.Table][ok] {
				known[c.Table][ok] = true
				keys[c.Table] = append(keys[c.Table], ok)
			}
		}
	}
	for t := range n {
		got, err := a.ov.rows(ctx, t, keys[t])
		if err != nil {
			return err
		}
		for _, k := range keys[t] {
			row := got[k]
			a.changed[t][k] = &treeChanged{old: row, new: row}
			a.ov.noteBase(t, k, row)
		}
		for k, ch := range a.changed[t] {
			if ch.old == nil {
				a.ov.noteBase(t, k, nil) // an insert: absent before
			}
		}
	}
	for i, c := range changes {
		k := encoded[i][0]
		ch := a.changed[c.Table][k]
		switch c.Kind {
		case TreeUpsert:
			if c.IfPresent && ch.new == nil {
				continue // a filtered row that stays out
			}
			row, err := tr.fill(c.Table, c.Row, ch.new)
			if ch.new == nil && tr.spec.Tables[c.Table].Partitioned && errors.Is(err, ErrNoToastState) {
				continue // its partition's move writes it whole
			}
			if err != nil {
				return err
			}
			ch.new = row
		case TreeDelete:
			ch.new = nil
		case TreeKeyChange:
			from := a.changed[c.Table][encoded[i][1]]
			if c.IfPresent && from.new == nil {
				continue // a filtered row that stays out
			}
			row, err := tr.fill(c.Table, c.Row, from.new)
			if from.new == nil && tr.spec.Tables[c.Table].Partitioned && errors.Is(err, ErrNoToastState) {
				continue // its partition's move writes it whole
			}
			if err != nil {
				return err
			}
			from.new, ch.new = nil, row
		default:
			return fmt.Errorf("join %q: change kind %d", tr.spec.Name, c.Kind)
		}
	}
	for t := range n {
		for k, ch := range a.changed[t] {
			if sameRow(ch.old, ch.new) {
				delete(a.changed[t], k)
			}
		}
	}
	return nil
}

// fill checks row's shape and fills its Toast markers from prev.
func (tr *Tree) fill(t int, row TreeRow, prev *TreeRow) (*TreeRow, error) {
	tab := tr.spec.Tables[t]
	if len(row.Values) != tab.Values || len(row.FKs) != len(tr.children[t]) {
		return nil, fmt.Errorf("join %q: table %d: a row of %d values and %d foreign keys, want %d and %d",
			tr.spec.Name, t, len(row.Values), len(row.FKs), tab.Values, len(tr.children[t]))
	}
	out := &TreeRow{Key: row.Key, FKs: make([][]Value, len(row.FKs))}
	var err error
	if out.Values, err = fillToast(row.Values, prev, func(r *TreeRow) []Value { return r.Values }); err != nil {
		return nil, fmt.Errorf("join %q: table %d: %w", tr.spec.Name, t, err)
	}
	for j, fk := range row.FKs {
		if len(fk) != len(tr.spec.Tables[tr.children[t][j]].Key) {
			return nil, fmt.Errorf("join %q: table %d: foreign key %d has %d columns, want %d",
				tr.spec.Name, t, j, len(fk), len(tr.spec.Tables[tr.children[t][j]].Key))
		}
		if out.FKs[j], err = fillToast(fk, prev, func(r *TreeRow) []Value { return r.FKs[j] }); err != nil {
			return nil, fmt.Errorf("join %q: table %d: %w", tr.spec.Name, t, err)
		}
	}
	return out, nil
}

func sameRow(a, b *TreeRow) bool {
	if a == nil || b == nil {
		return a == b
	}
	if !ValuesEqual(a.Values, b.Values) || len(a.FKs) != len(b.FKs) {
		return false
	}
	for j := range a.FKs {
		if !ValuesEqual(a.FKs[j], b.FKs[j]) {
			return false
		}
	}
	return true
}

// fkKey returns the encoded foreign key j of row of table t ("" when the
// row is absent or the key has a NULL).
func (tr *Tree) fkKey(t int, row *TreeRow, j int) (Key, error) {
	if row == nil || hasNull(row.FKs[j]) {
		return "", nil
	}
	k, err := EncodeKey(tr.spec.Tables[tr.children[t][j]].Key, row.FKs[j])
	if err != nil {
		return "", fmt.Errorf("join %q: table %d: encode foreign key %d: %w", tr.spec.Name, t, j, err)
	}
	return k, nil
}

// record writes the segment's row changes and the references they move
// into the overlay: from here on it is the state after the segment, and
// changed keeps the rows before it.
func (a *treeApply) record() {
	tr := a.tr
	for t, rows := range a.changed {
		for k, ch := range rows {
			a.ov.putRow(t, k, ch.new)
			for j, c := range tr.children[t] {
				// The keys were encoded once already (fold and the
				// stored state), so this cannot fail; errors are
				// checked where rows enter (fill) and leave the store.
				before, _ := tr.fkKey(t, ch.old, j)
				after, _ := tr.fkKey(t, ch.new, j)
				if before == after {
					continue
				}
				if before != "" {
					a.ov.putRef(c, Subscription{FK: before, PK: k}, false)
				}
				if after != "" {
					a.ov.putRef(c, Subscription{FK: after, PK: k}, true)
				}
			}
		}
	}
}

// view says which state a read sees.
type view uint8

const (
	before view = iota // the state before the segment
	after              // the state after it
)

// rowsIn reads rows of table t in view v.
func (a *treeApply) rowsIn(ctx context.Context, t int, keys []Key, v view) (map[Key]*TreeRow, error) {
	if v == after {
		return a.ov.rows(ctx, t, keys)
	}
	var rest []Key
	out := map[Key]*TreeRow{}
	for _, k := range keys {
		if ch, ok := a.changed[t][k]; ok {
			if ch.old != nil {
				out[k] = ch.old
			}
		} else {
			rest = append(rest, k)
		}
	}
	got, err := a.ov.rows(ctx, t, rest)
	if err != nil {
		return nil, err
	}
	for k, r := range got {
		out[k] = r
	}
	return out, nil
}

// eval evaluates the subtree of table t for rows (nil: absent) in view v:
// it writes the subtree's columns into outs[i] (target width) and, when
// paths is not nil, the key of the row reached at each table of the
// subtree into paths[i] (by table; "" for none), and returns whether every
// inner entry of the subtree is reached.
func (a *treeApply) eval(ctx context.Context, t int, rows []*TreeRow, v view, outs [][]Value, paths [][]Key) ([]bool, error) {
	tr := a.tr
	sat := make([]bool, len(rows))
	for i, r := range rows {
		if r == nil {
			for _, c := range tr.subCols[t] {
				outs[i][c] = tr.absent[c]
			}
			sat[i] = !tr.hasInner[t]
			continue
		}
		for j, c := range tr.cols[t] {
			outs[i][c] = r.Values[j]
		}
		sat[i] = true
	}
	for j, c := range tr.children[t] {
		var keys []Key
		fks := make([]Key, len(rows))
		seen := map[Key]bool{}
		for i, r := range rows {
			k, err := tr.fkKey(t, r, j)
			if err != nil {
				return nil, err
			}
			fks[i] = k
			if k != "" && !seen[k] {
				seen[k] = true
				keys = append(keys, k)
			}
		}
		got, err := a.rowsIn(ctx, c, keys, v)
		if err != nil {
			return nil, err
		}
		var idx []int
		var sub []*TreeRow
		var subOuts [][]Value
		var subPaths [][]Key
		for i, r := range rows {
			if r == nil {
				continue // the whole subtree is NULL already
			}
			idx = append(idx, i)
			row := got[fks[i]] // nil for "" and absent keys
			sub = append(sub, row)
			subOuts = append(subOuts, outs[i])
			if paths != nil {
				if row != nil {
					paths[i][c] = fks[i]
				}
				subPaths = append(subPaths, paths[i])
			}
		}
		subSat, err := a.eval(ctx, c, sub, v, subOuts, subPaths)
		if err != nil {
			return nil, err
		}
		for n, i := range idx {
			sat[i] = sat[i] && subSat[n]
		}
	}
	return sat, nil
}

// roots emits the target rows of the root rows the segment changed.
func (a *treeApply) roots(ctx context.Context) error {
	changed := a.changed[0]
	if len(changed) == 0 {
		return nil
	}
	keys := slices.Sorted(mapKeys(changed))
	page := a.tr.spec.PageSize
	for start := 0; start < len(keys); start += page {
		part := keys[start:min(start+page, len(keys))]
		// The target row of a root row that is gone is deleted without
		// evaluating what it was: deleting a key the target does not hold
		// changes nothing, and the evaluation would read every entry's
		// rows. The old row is evaluated where a new one may equal it.
		olds := make([]*TreeRow, len(part))
		news := make([]*TreeRow, len(part))
		var out Output
		for i, k := range part {
			ch := changed[k]
			news[i] = ch.new
			if ch.new != nil {
				olds[i] = ch.old
			} else if ch.old != nil {
				out.Deletes = append(out.Deletes, ch.old.Key)
			}
		}
		oldOut, oldSat, _, err := a.rootRows(ctx, olds, before, false)
		if err != nil {
			return err
		}
		newOut, newSat, _, err := a.rootRows(ctx, news, after, false)
		if err != nil {
			return err
		}
		for i := range part {
			had := olds[i] != nil && oldSat[i]
			has := news[i] != nil && newSat[i]
			switch {
			case has && (!had || !ValuesEqual(oldOut[i], newOut[i])):
				out.Upserts = append(out.Upserts, Row(newOut[i]))
			case had && !has:
				out.Deletes = append(out.Deletes, olds[i].Key)
			}
		}
		if err := a.emitNonEmpty(ctx, out); err != nil {
			return err
		}
	}
	return nil
}

// rootRows evaluates whole target rows for root rows in view v, and with
// paths the key of the row each reaches at every table.
func (a *treeApply) rootRows(ctx context.Context, rows []*TreeRow, v view, withPaths bool) ([][]Value, []bool, [][]Key, error) {
	outs := make([][]Value, len(rows))
	var paths [][]Key
	if withPaths {
		paths = make([][]Key, len(rows))
	}
	for i, r := range rows {
		outs[i] = make([]Value, a.tr.width)
		if r != nil {
			copy(outs[i], r.Key)
		}
		if withPaths {
			paths[i] = make([]Key, len(a.tr.spec.Tables))
		}
	}
	sat, err := a.eval(ctx, 0, rows, v, outs, paths)
	return outs, sat, paths, err
}

// treeAction is what a changed row of an entry does to the target rows
// that reach it.
type treeAction uint8

const (
	actUpdate    treeAction = iota + 1 // set the subtree's columns
	actDelete                          // the rows stop existing
	actRecompute                       // the rows may start existing: evaluate them whole
)

// entry emits the target changes of the rows of entry t the segment
// changed.
func (a *treeApply) entry(ctx context.Context, t int) error {
	tr := a.tr
	if len(a.changed[t]) == 0 {
		return nil
	}
	keys := slices.Sorted(mapKeys(a.changed[t]))
	page := tr.spec.PageSize
	for start := 0; start < len(keys); start += page {
		part := keys[start:min(start+page, len(keys))]
		olds := make([]*TreeRow, len(part))
		news := make([]*TreeRow, len(part))
		oldOuts := make([][]Value, len(part))
		newOuts := make([][]Value, len(part))
		slab := make([]Value, 2*len(part)*tr.width) // one allocation for the page's outputs
		for i, k := range part {
			olds[i], news[i] = a.changed[t][k].old, a.changed[t][k].new
			oldOuts[i], slab = slab[:tr.width:tr.width], slab[tr.width:]
			newOuts[i], slab = slab[:tr.width:tr.width], slab[tr.width:]
		}
		oldSat, err := a.eval(ctx, t, olds, before, oldOuts, nil)
		if err != nil {
			return err
		}
		newSat, err := a.eval(ctx, t, news, after, newOuts, nil)
		if err != nil {
			return err
		}
		var origins []Key
		var acts []treeAction
		var vals [][]Value
		for i, k := range part {
			var act treeAction
			switch {
			case oldSat[i] && newSat[i]:
				if !valuesEqualAt(oldOuts[i], newOuts[i], tr.subCols[t]) {
					act = actUpdate
				}
			case oldSat[i]:
				act = actDelete
			case newSat[i]:
				act = actRecompute
			}
			if act == 0 {
				continue
			}
			a.acts[t][k] = act
			origins = append(origins, k)
			acts = append(acts, act)
			vals = append(vals, pick(newOuts[i], tr.subCols[t]))
		}
		if len(origins) == 0 {
			continue
		}
		idx := make([]int32, len(origins))
		for i := range idx {
			idx[i] = int32(i)
		}
		err = a.walk(ctx, t, origins, idx, func(ctx context.Context, roots []Key, from []int32) error {
			return a.reached(ctx, t, roots, from, acts, vals)
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// reached emits the changes of the root rows roots, reached from the
// changed rows of entry t with the actions acts (by from[i]).
func (a *treeApply) reached(ctx context.Context, t int, roots []Key, from []int32, acts []treeAction, vals [][]Value) error {
	tr := a.tr
	tr.stats.Walked += uint64(len(roots))
	var out Output
	byOrigin := map[int32]int{} // origin -> index in out.ColumnUpdates
	var recompute []Key
	for i, r := range roots {
		o := from[i]
		switch acts[o] {
		case actUpdate:
			key, _, err := DecodeKey(tr.spec.Tables[0].Key, string(r))
			if err != nil {
				return fmt.Errorf("join %q: decode root key: %w", tr.spec.Name, err)
			}
			u, ok := byOrigin[o]
			if !ok {
				u = len(out.ColumnUpdates)
				byOrigin[o] = u
				out.ColumnUpdates = append(out.ColumnUpdates, ColumnUpdate{Columns: tr.subCols[t], Values: vals[o]})
			}
			out.ColumnUpdates[u].Keys = append(out.ColumnUpdates[u].Keys, key)
		case actDelete:
			key, _, err := DecodeKey(tr.spec.Tables[0].Key, string(r))
			if err != nil {
				return fmt.Errorf("join %q: decode root key: %w", tr.spec.Name, err)
			}
			out.Deletes = append(out.Deletes, key)
		case actRecompute:
			recompute = append(recompute, r)
		}
	}
	if len(recompute) > 0 {
		got, err := a.ov.rows(ctx, 0, recompute)
		if err != nil {
			return err
		}
		rows := make([]*TreeRow, 0, len(recompute))
		for _, k := range recompute {
			if r := got[k]; r != nil {
				rows = append(rows, r)
			}
		}
		outs, sat, paths, err := a.rootRows(ctx, rows, after, true)
		if err != nil {
			return err
		}
		for i := range rows {
			if sat[i] && a.recomputes(t, paths[i]) {
				out.Upserts = append(out.Upserts, Row(outs[i]))
			}
		}
	}
	return a.emitNonEmpty(ctx, out)
}

// recomputes reports whether entry t is the one to write a root row whose
// path is path, when several changed rows on the path may make it appear:
// of the changed rows on the path with no changed row between them and the
// root (the ones whose walks reach it), the first by table whose action is
// to recompute.
func (a *treeApply) recomputes(t int, path []Key) bool {
	for u := 1; u < t; u++ {
		if path[u] == "" || a.acts[u][path[u]] != actRecompute {
			continue
		}
		topmost := true
		for p := a.tr.spec.Tables[u].From; p > 0; p = a.tr.spec.Tables[p].From {
			if _, changed := a.changed[p][path[p]]; changed {
				topmost = false
				break
			}
		}
		if topmost {
			return false
		}
	}
	return true
}

// walkMinRefs is the fewest references a walk asks of each key per round.
const walkMinRefs = 64

// walk calls fn with pages of the root keys whose path reaches keys of
// table t in the state after the segment, each with the index (from) it
// came from. It stops at rows the segment changed, and skips root rows the
// segment changed: those are evaluated on their own. Memory: a page per
// level.
func (a *treeApply) walk(ctx context.Context, t int, keys []Key, from []int32,
	fn func(ctx context.Context, roots []Key, from []int32) error) error {
	if t == 0 {
		var roots []Key
		var rfrom []int32
		for i, k := range keys {
			if _, changed := a.changed[0][k]; !changed {
				roots, rfrom = append(roots, k), append(rfrom, from[i])
			}
		}
		if len(roots) == 0 {
			return nil
		}
		return fn(ctx, roots, rfrom)
	}
	child := a.tr.spec.Tables[t].From
	page := a.tr.spec.PageSize
	if a.tr.spec.Tables[t].OwnKey {
		// Key k is referenced by the root row of key k, if any. One that
		// does not exist has no target row: the column update the left
		// entry's change makes of it writes nothing.
		for start := 0; start < len(keys); start += page {
			end := min(start+page, len(keys))
			if err := a.walk(ctx, child, keys[start:end], from[start:end], fn); err != nil {
				return err
			}
		}
		return nil
	}
	var buf []Key
	var bufFrom []int32
	flush := func() error {
		if len(buf) == 0 {
			return nil
		}
		k, f := buf, bufFrom
		buf, bufFrom = nil, nil
		return a.walk(ctx, child, k, f, fn)
	}
	active, activeFrom := keys, from
	afters := make([]Key, len(keys))
	for len(active) > 0 {
		// A round asks each key for its share of a page, and at least
		// walkMinRefs: most parents then take one round trip in all,
		// and a round holds at most walkMinRefs pages.
		limit := max(page/len(active), min(walkMinRefs, page))
		got, err := a.ov.referencing(ctx, t, active, afters, limit)
		if err != nil {
			return err
		}
		var next, nextAfters []Key
		var nextFrom []int32
		for i, refs := range got {
			for _, r := range refs {
				if _, changed := a.changed[child][r]; changed && child != 0 {
					continue // its own walk covers what lies below it
				}
				buf, bufFrom = append(buf, r), append(bufFrom, activeFrom[i])
				if len(buf) >= page {
					if err := flush(); err != nil {
						return err
					}
				}
			}
			if len(refs) == limit {
				next, nextFrom, nextAfters = append(next, active[i]), append(nextFrom, activeFrom[i]), append(nextAfters, refs[len(refs)-1])
			}
		}
		active, activeFrom, afters = next, nextFrom, nextAfters
	}
	return flush()
}

func (a *treeApply) emitNonEmpty(ctx context.Context, out Output) error {
	if out.empty() {
		return nil
	}
	return a.emit(ctx, out)
}

func valuesEqualAt(a, b []Value, at []int) bool {
	for _, i := range at {
		if !a[i].Equal(b[i]) {
			return false
		}
	}
	return true
}

func pick(vals []Value, at []int) []Value {
	out := make([]Value, len(at))
	for i, c := range at {
		out[i] = vals[c]
	}
	return out
}

func mapKeys[V any](m map[Key]V) func(func(Key) bool) {
	return func(yield func(Key) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// treeOverlay is the state as the batch sees it: the store plus the
// batch's net changes so far.
type treeOverlay struct {
	tr    *Tree
	store TreeStateReader
	// base[t][k] is the row the batch first saw at key k of table t (nil:
	// absent), before any change of the batch.
	base        []map[Key]*TreeRow
	rowsCleared []bool
	refsCleared []bool
	rowChanges  []map[Key]*TreeRow // nil: deleted
	// added[e][fk] are the keys added under fk, sorted; removed[e][fk]
	// the keys removed.
	added   []map[Key][]Key
	removed []map[Key]map[Key]bool
}

func newTreeOverlay(tr *Tree, store TreeStateReader, n int) *treeOverlay {
	o := &treeOverlay{tr: tr, store: store, base: make([]map[Key]*TreeRow, n), rowsCleared: make([]bool, n), refsCleared: make([]bool, n),
		rowChanges: make([]map[Key]*TreeRow, n),
		added:      make([]map[Key][]Key, n), removed: make([]map[Key]map[Key]bool, n)}
	for t := range n {
		o.base[t] = map[Key]*TreeRow{}
		o.rowChanges[t] = map[Key]*TreeRow{}
		o.added[t] = map[Key][]Key{}
		o.removed[t] = map[Key]map[Key]bool{}
	}
	return o
}

func (o *treeOverlay) clearRows(t int) {
	o.rowsCleared[t] = true
	o.rowChanges[t] = map[Key]*TreeRow{}
}

func (o *treeOverlay) clearRefs(e int) {
	o.refsCleared[e] = true
	o.added[e] = map[Key][]Key{}
	o.removed[e] = map[Key]map[Key]bool{}
}

func (o *treeOverlay) putRow(t int, k Key, row *TreeRow) { o.rowChanges[t][k] = row }

// noteBase records the state of key k of table t before the batch changed
// it, the first time the batch reads it.
func (o *treeOverlay) noteBase(t int, k Key, row *TreeRow) {
	if _, changed := o.rowChanges[t][k]; changed {
		return
	}
	if _, ok := o.base[t][k]; !ok {
		o.base[t][k] = row
	}
}

func (o *treeOverlay) putRef(e int, s Subscription, add bool) {
	keys := o.added[e][s.FK]
	i, found := slices.BinarySearch(keys, s.PK)
	if add {
		if !found {
			o.added[e][s.FK] = slices.Insert(keys, i, s.PK)
		}
		if rm := o.removed[e][s.FK]; rm != nil {
			delete(rm, s.PK)
		}
		return
	}
	if found {
		o.added[e][s.FK] = slices.Delete(keys, i, i+1)
	}
	if o.removed[e][s.FK] == nil {
		o.removed[e][s.FK] = map[Key]bool{}
	}
	o.removed[e][s.FK][s.PK] = true
}

// unchanged reports whether the batch's earlier segments left row k of
// table t as the batch started.
func (o *treeOverlay) unchanged(t int, k Key) bool {
	_, changed := o.rowChanges[t][k]
	return !changed && !o.rowsCleared[t]
}

// rows reads rows of table t.
func (o *treeOverlay) rows(ctx context.Context, t int, keys []Key) (map[Key]*TreeRow, error) {
	out := make(map[Key]*TreeRow, len(keys))
	var rest []Key
	for _, k := range keys {
		if r, ok := o.rowChanges[t][k]; ok {
			if r != nil {
				out[k] = r
			}
		} else if !o.rowsCleared[t] {
			rest = append(rest, k)
		}
	}
	if len(rest) == 0 {
		return out, nil
	}
	got, err := o.store.GetRows(ctx, t, rest)
	if err != nil {
		return nil, err
	}
	for k, r := range got {
		out[k] = &r
	}
	return out, nil
}

// referencing is TreeStateReader.Referencing through the overlay.
func (o *treeOverlay) referencing(ctx context.Context, e int, parents, afters []Key, limit int) ([][]Key, error) {
	ask := limit
	for _, p := range parents {
		ask = max(ask, limit+len(o.removed[e][p]))
	}
	var stored [][]Key
	if !o.refsCleared[e] {
		var err error
		if stored, err = o.store.Referencing(ctx, e, parents, afters, ask); err != nil {
			return nil, err
		}
	}
	out := make([][]Key, len(parents))
	for i, p := range parents {
		var s []Key
		if stored != nil {
			s = stored[i]
		}
		rm := o.removed[e][p]
		var merged []Key
		for _, k := range s {
			if !rm[k] {
				merged = append(merged, k)
			}
		}
		for _, k := range o.added[e][p] {
			// Kept to the limit below, the result holds the smallest
			// keys: every added key kept is below the store's unseen
			// ones (the store was asked for limit plus the removed).
			if k > afters[i] {
				merged = append(merged, k)
			}
		}
		slices.SortFunc(merged, func(x, y Key) int { return cmp.Compare(x, y) })
		merged = slices.Compact(merged)
		if len(merged) > limit {
			merged = merged[:limit]
		}
		out[i] = merged
	}
	return out, nil
}

// mutations returns the batch's net mutations: the rows that differ from
// the batch's start, and the references they move.
func (o *treeOverlay) mutations() (TreeMutations, error) {
	n := len(o.rowChanges)
	m := TreeMutations{ClearRows: o.rowsCleared, ClearRefs: o.refsCleared, Rows: make([]map[Key]*TreeRow, n),
		Refs: make([]map[Subscription]bool, n)}
	for t := range n {
		m.Rows[t], m.Refs[t] = map[Key]*TreeRow{}, map[Subscription]bool{}
	}
	for t := range n {
		for k, row := range o.rowChanges[t] {
			base := o.base[t][k]
			if o.rowsCleared[t] {
				base = nil
			}
			if sameRow(base, row) {
				continue
			}
			m.Rows[t][k] = row
			for j, c := range o.tr.children[t] {
				before, err := o.tr.fkKey(t, base, j)
				if err != nil {
					return TreeMutations{}, err
				}
				after, err := o.tr.fkKey(t, row, j)
				if err != nil {
					return TreeMutations{}, err
				}
				if before == after {
					continue
				}
				if before != "" { // base is nil when the edge was cleared
					m.Refs[c][Subscription{FK: before, PK: k}] = false
				}
				if after != "" {
					m.Refs[c][Subscription{FK: after, PK: k}] = true
				}
			}
		}
	}
	return m, nil
}
