package join_test

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/fkmat/fkmat/join"
)

// treeStore is an in-memory join.TreeStateReader. Its apply is strict: it
// rejects a put of an unchanged row, a delete of an absent one, and a
// reference added twice or removed when absent, so that tests catch
// mutations that are not net.
type treeStore struct {
	rows  []map[join.Key]join.TreeRow
	refs  []map[join.Key]map[join.Key]bool // refs[e][parent][child]
	reads int
	// rowReads counts the GetRows calls by table, refReads the
	// Referencing calls by entry.
	rowReads, refReads map[int]int
}

func newTreeStore(n int) *treeStore {
	s := &treeStore{rows: make([]map[join.Key]join.TreeRow, n), refs: make([]map[join.Key]map[join.Key]bool, n)}
	for t := range n {
		s.rows[t], s.refs[t] = map[join.Key]join.TreeRow{}, map[join.Key]map[join.Key]bool{}
	}
	return s
}

func (s *treeStore) GetRows(_ context.Context, t int, keys []join.Key) (map[join.Key]join.TreeRow, error) {
	s.reads++
	if s.rowReads == nil {
		s.rowReads = map[int]int{}
	}
	s.rowReads[t]++
	out := map[join.Key]join.TreeRow{}
	for _, k := range keys {
		if r, ok := s.rows[t][k]; ok {
			out[k] = r
		}
	}
	return out, nil
}

func (s *treeStore) Referencing(_ context.Context, e int, parents, afters []join.Key, limit int) ([][]join.Key, error) {
	s.reads++
	if s.refReads == nil {
		s.refReads = map[int]int{}
	}
	s.refReads[e]++
	out := make([][]join.Key, len(parents))
	for i, p := range parents {
		var ks []join.Key
		for k := range s.refs[e][p] {
			if k > afters[i] {
				ks = append(ks, k)
			}
		}
		slices.Sort(ks)
		if len(ks) > limit {
			ks = ks[:limit]
		}
		out[i] = ks
	}
	return out, nil
}

// applyTables applies the mutations of the tables keep says, as the
// daemon's per-table states do: a table's rows and clear, and the
// references of the entries it references.
func (s *treeStore) applyTables(m join.TreeMutations, spec join.TreeSpec, keep func(t int) bool) error {
	n := len(spec.Tables)
	part := join.TreeMutations{ClearRows: make([]bool, n), ClearRefs: make([]bool, n), Rows: make([]map[join.Key]*join.TreeRow, n),
		Refs: make([]map[join.Subscription]bool, n)}
	for t := range n {
		part.Rows[t], part.Refs[t] = map[join.Key]*join.TreeRow{}, map[join.Subscription]bool{}
		if keep(t) {
			part.ClearRows[t], part.Rows[t] = m.ClearRows[t], m.Rows[t]
		}
		if t > 0 && keep(spec.Tables[t].From) {
			part.ClearRefs[t], part.Refs[t] = m.ClearRefs[t], m.Refs[t]
		}
	}
	return s.apply(part)
}

func (s *treeStore) apply(m join.TreeMutations) error {
	for t := range s.rows {
		if m.ClearRows[t] {
			s.rows[t] = map[join.Key]join.TreeRow{}
		}
		if m.ClearRefs[t] {
			s.refs[t] = map[join.Key]map[join.Key]bool{}
		}
	}
	for t, rows := range m.Rows {
		for k, r := range rows {
			old, had := s.rows[t][k]
			switch {
			case r == nil && !had:
				return fmt.Errorf("table %d: delete of absent row %q", t, k)
			case r == nil:
				delete(s.rows[t], k)
			case had && sameTreeRow(old, *r):
				return fmt.Errorf("table %d: put of unchanged row %q", t, k)
			default:
				s.rows[t][k] = *r
			}
		}
	}
	for e, refs := range m.Refs {
		for sub, add := range refs {
			set := s.refs[e][sub.FK]
			switch {
			case add && set[sub.PK]:
				return fmt.Errorf("edge %d: reference %q -> %q added twice", e, sub.FK, sub.PK)
			case !add && !set[sub.PK]:
				return fmt.Errorf("edge %d: absent reference %q -> %q removed", e, sub.FK, sub.PK)
			case add:
				if set == nil {
					set = map[join.Key]bool{}
					s.refs[e][sub.FK] = set
				}
				set[sub.PK] = true
			default:
				delete(set, sub.PK)
				if len(set) == 0 {
					delete(s.refs[e], sub.FK)
				}
			}
		}
	}
	return nil
}

func sameTreeRow(a, b join.TreeRow) bool {
	if !join.ValuesEqual(a.Values, b.Values) || len(a.FKs) != len(b.FKs) {
		return false
	}
	for j := range a.FKs {
		if !join.ValuesEqual(a.FKs[j], b.FKs[j]) {
			return false
		}
	}
	return true
}

// treeTarget is an in-memory target of a Tree. An upsert equal to the row
// it replaces is an error (a redundant write); a column update or delete of
// an absent row, or a column update that changes nothing, is a statement
// that writes nothing, and is counted.
type treeTarget struct {
	rows   map[join.Key]join.Row
	writes int
	noops  int
}

func (g *treeTarget) apply(o join.Output, keyFams []join.Family) error {
	key := func(vals []join.Value) join.Key {
		k, err := join.EncodeKey(keyFams, vals)
		if err != nil {
			panic(err)
		}
		return k
	}
	if o.Truncate {
		g.rows = map[join.Key]join.Row{}
	}
	for _, c := range o.NullColumns {
		for _, r := range g.rows {
			r[c] = join.NullValue()
		}
	}
	for _, d := range o.Deletes {
		k := key(d)
		if _, ok := g.rows[k]; !ok {
			g.noops++
			continue
		}
		g.writes++
		delete(g.rows, k)
	}
	for _, u := range o.Upserts {
		k := key(u[:len(keyFams)])
		if old, ok := g.rows[k]; ok && join.ValuesEqual(old, u) {
			return fmt.Errorf("redundant upsert of %v", u)
		}
		g.writes++
		g.rows[k] = slices.Clone(u)
	}
	for _, cu := range o.ColumnUpdates {
		if len(cu.Columns) != len(cu.Values) {
			return fmt.Errorf("column update of %d columns with %d values", len(cu.Columns), len(cu.Values))
		}
		for _, kv := range cu.Keys {
			r, ok := g.rows[key(kv)]
			if !ok {
				g.noops++
				continue
			}
			changed := false
			for i, c := range cu.Columns {
				changed = changed || !r[c].Equal(cu.Values[i])
				r[c] = cu.Values[i]
			}
			if changed {
				g.writes++
			} else {
				g.noops++
			}
		}
	}
	return nil
}

// treeModel is the source tables of a random tree: each table has an int
// key, two text values and one int foreign key per entry referencing it.
// Entry i of the tree is table i+1; the left table is table 0.
type treeModel struct {
	tr     tree
	rows   []map[int64]modelRow
	inline bool // the foreign keys are also output columns
}

type modelRow struct {
	vals [2]join.Value
	fks  []join.Value
}

func (m *treeModel) spec(page int) join.TreeSpec {
	s := join.TreeSpec{Name: "tree", PageSize: page}
	for t := 0; t <= len(m.tr.parent); t++ {
		tab := join.TreeTable{Key: []join.Family{join.FamilyInt}, Values: 2, From: -1}
		if m.inline {
			tab.Values += len(m.tr.children[t])
		}
		if t > 0 {
			tab.From, tab.Type, tab.OwnKey = m.tr.parent[t-1]+1, m.tr.typ[t-1], m.tr.own[t-1]
		}
		s.Tables = append(s.Tables, tab)
	}
	return s
}

func (m *treeModel) treeRow(k int64, r modelRow) join.TreeRow {
	row := join.TreeRow{Key: []join.Value{join.TextValue(strconv.FormatInt(k, 10))}, Values: []join.Value{r.vals[0], r.vals[1]}}
	for _, fk := range r.fks {
		row.FKs = append(row.FKs, []join.Value{fk})
		if m.inline {
			row.Values = append(row.Values, fk)
		}
	}
	return row
}

// oracle evaluates the join with SQL's semantics, by key.
func (m *treeModel) oracle(spec join.TreeSpec) map[join.Key]join.Row {
	out := map[join.Key]join.Row{}
	for k, r := range m.rows[0] {
		row := join.Row{join.TextValue(strconv.FormatInt(k, 10))}
		ok := true
		visit := func(t int, r *modelRow) {
			if r == nil {
				for range spec.Tables[t].Values {
					row = append(row, join.NullValue())
				}
				if t > 0 && spec.Tables[t].Type == join.Inner {
					ok = false
				}
			} else {
				row = append(row, m.treeRow(0, *r).Values...)
			}
		}
		// Values in table order; reachability along each table's From.
		reached := make([]*modelRow, len(spec.Tables))
		reached[0] = &r
		for t := 1; t < len(spec.Tables); t++ {
			from := reached[spec.Tables[t].From]
			if from == nil {
				continue
			}
			fk := from.fks[slices.Index(m.tr.children[spec.Tables[t].From], t-1)]
			if fk.Null {
				continue
			}
			n, _ := strconv.ParseInt(fk.Text, 10, 64)
			if c, found := m.rows[t][n]; found {
				reached[t] = &c
			}
		}
		for t := range spec.Tables {
			visit(t, reached[t])
		}
		if ok {
			kk, _ := join.EncodeKey([]join.Family{join.FamilyInt}, row[:1])
			out[kk] = row
		}
	}
	return out
}

// change makes a random change of table t and applies it to the model.
func (m *treeModel) change(r *rand.Rand, t int) join.TreeChange {
	rows := m.rows[t]
	key := int64(1 + r.IntN(6))
	val := func() join.Value {
		if r.IntN(8) == 0 {
			return join.NullValue()
		}
		return join.TextValue(fmt.Sprintf("v%d", r.IntN(4)))
	}
	fk := func() join.Value {
		if r.IntN(6) == 0 {
			return join.NullValue()
		}
		return join.TextValue(strconv.Itoa(1 + r.IntN(7))) // 7 dangles
	}
	// A root row's foreign key to an entry keyed by the root's key is
	// its key.
	own := func(k int64, nr *modelRow) {
		for j, e := range m.tr.children[t] {
			if t == 0 && m.tr.own[e] {
				nr.fks[j] = join.TextValue(strconv.FormatInt(k, 10))
			}
		}
	}
	old, exists := rows[key]
	switch p := r.IntN(100); {
	case p >= 3 && p < 6 && !exists:
		// A filtered table's update that left the filter's inputs
		// unchanged, of a row out of the join: nothing.
		nr := modelRow{vals: [2]join.Value{val(), join.ToastValue()}}
		for range m.tr.children[t] {
			nr.fks = append(nr.fks, fk())
		}
		own(key, &nr)
		c := join.TreeChange{Table: t, Kind: join.TreeUpsert, Row: m.treeRow(key, nr), IfPresent: true}
		if to := int64(1 + r.IntN(8)); r.IntN(2) == 0 && to != key {
			if _, taken := rows[to]; !taken {
				own(to, &nr)
				c.Kind, c.OldKey, c.Row = join.TreeKeyChange, c.Row.Key, m.treeRow(to, nr)
			}
		}
		return c
	case p < 3:
		m.rows[t] = map[int64]modelRow{}
		return join.TreeChange{Table: t, Kind: join.TreeTruncate}
	case p < 18 && exists:
		delete(rows, key)
		return join.TreeChange{Table: t, Kind: join.TreeDelete, Row: join.TreeRow{Key: []join.Value{join.TextValue(strconv.FormatInt(key, 10))}}}
	case p < 28 && exists:
		to := int64(1 + r.IntN(8))
		if _, taken := rows[to]; taken {
			break
		}
		nr := modelRow{vals: old.vals, fks: slices.Clone(old.fks)}
		if r.IntN(2) == 0 {
			nr.vals[0] = val()
		}
		own(to, &nr)
		delete(rows, key)
		rows[to] = nr
		c := join.TreeChange{Table: t, Kind: join.TreeKeyChange, Row: m.treeRow(to, nr), OldKey: []join.Value{join.TextValue(strconv.FormatInt(key, 10))},
			IfPresent: r.IntN(4) == 0} // present: applied as any
		if r.IntN(2) == 0 {
			c.Row.Values[1] = join.ToastValue() // unchanged TOAST, carried from the old key
		}
		return c
	}
	nr := modelRow{vals: [2]join.Value{val(), val()}}
	for range m.tr.children[t] {
		nr.fks = append(nr.fks, fk())
	}
	toast := false
	if exists && r.IntN(3) == 0 {
		nr.vals[1], toast = old.vals[1], true
	}
	if exists && r.IntN(3) == 0 {
		nr.fks = slices.Clone(old.fks) // only values change
	}
	own(key, &nr)
	rows[key] = nr
	c := join.TreeChange{Table: t, Kind: join.TreeUpsert, Row: m.treeRow(key, nr), Insert: !exists, IfPresent: exists && r.IntN(4) == 0}
	if toast {
		c.Row.Values[1] = join.ToastValue()
	}
	return c
}

// TestTreeRandomTrees runs random trees (2 to 5 tables, depth up to 3,
// inner and left entries mixed) through random batches of every change
// kind on every table (inserts, updates with unchanged TOAST values,
// deletes, key changes, NULL and dangling foreign keys, several changes of
// one row per batch, TRUNCATE), with pages of 1 to 3 keys and of 5000,
// with the foreign keys hidden or output, and with left entries of the
// root keyed by the root's key (a roll-up's results), whose walks read no
// references: after every batch the target equals the SQL join of the
// model, no upsert rewrites an equal row, and the state's mutations are
// net (the strict store refuses the others).
func TestTreeRandomTrees(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	trees, batches := 150, 80
	if testing.Short() {
		trees = 40
	}
	var walked, noops, writes, replays, owned, known uint64
	for seed := range trees {
		r := rand.New(rand.NewPCG(uint64(seed), 7))
		shape := randomTree(r)
		for _, variant := range []struct {
			page   int
			inline bool
		}{{5000, true}, {5000, false}, {1 + r.IntN(3), seed%2 == 0}} {
			m := &treeModel{tr: shape, inline: variant.inline, rows: make([]map[int64]modelRow, len(shape.parent)+1)}
			for i := range m.rows {
				m.rows[i] = map[int64]modelRow{}
			}
			spec := m.spec(variant.page)
			tree, err := join.NewTree(spec)
			if err != nil {
				t.Fatal(err)
			}
			store := newTreeStore(len(spec.Tables))
			target := &treeTarget{rows: map[join.Key]join.Row{}}
			br := rand.New(rand.NewPCG(uint64(seed), 11))
			for b := range batches {
				var changes []join.TreeChange
				start := make([]map[int64]modelRow, len(m.rows))
				for tab := range m.rows {
					start[tab] = maps.Clone(m.rows[tab])
				}
				for range 1 + br.IntN(8) {
					tab := br.IntN(len(spec.Tables))
					c := m.change(br, tab)
					if (c.Kind == join.TreeUpsert || c.Kind == join.TreeDelete) && br.IntN(3) == 0 {
						// The change carries the row as it was at the
						// batch start (a roll-up's results): the tree
						// takes it where no earlier change of the batch
						// is in between.
						key, _ := strconv.ParseInt(c.Row.Key[0].Text, 10, 64)
						c.Known = true
						if row, ok := start[tab][key]; ok {
							before := m.treeRow(key, row)
							c.Before = &before
						}
						known++
					}
					changes = append(changes, c)
				}
				what := fmt.Sprintf("seed %d %s page %d inline %v batch %d", seed, shape, variant.page, variant.inline, b)
				muts, err := tree.Apply(ctx, store, changes, func(_ context.Context, o join.Output) error {
					return target.apply(o, spec.Tables[0].Key)
				})
				if err != nil {
					t.Fatalf("%s: %v\nchanges: %s", what, err, describeTreeChanges(changes))
				}
				if br.IntN(5) == 0 {
					// A crash after the tables from k on committed (the
					// daemon commits them from the last to the first):
					// the replay leaves out their changes, commits the
					// tables before k, and discards the output (the
					// target, committed first, has the batch).
					k := br.IntN(len(spec.Tables) + 1)
					if err := store.applyTables(muts, spec, func(t int) bool { return t >= k }); err != nil {
						t.Fatalf("%s: mutations: %v\nchanges: %s", what, err, describeTreeChanges(changes))
					}
					var behind []join.TreeChange
					for _, c := range changes {
						if c.Table < k {
							behind = append(behind, c)
						}
					}
					muts, err = tree.Apply(ctx, store, behind, func(context.Context, join.Output) error { return nil })
					if err != nil {
						t.Fatalf("%s: replay after a crash with tables %d.. committed: %v\nchanges: %s", what, k, err, describeTreeChanges(changes))
					}
					if err := store.applyTables(muts, spec, func(t int) bool { return t < k }); err != nil {
						t.Fatalf("%s: replay's mutations: %v\nchanges: %s", what, err, describeTreeChanges(changes))
					}
					replays++
				} else if err := store.apply(muts); err != nil {
					t.Fatalf("%s: mutations: %v\nchanges: %s", what, err, describeTreeChanges(changes))
				}
				if err := diffTreeTarget(target.rows, m.oracle(spec)); err != nil {
					t.Fatalf("%s: %v\nchanges: %s", what, err, describeTreeChanges(changes))
				}
			}
			for e, own := range shape.own {
				if own {
					owned++
					if n := store.refReads[e+1]; n > 0 {
						t.Errorf("seed %d %s page %d: %d reads of the references of entry %d, which the root references by its own key",
							seed, shape, variant.page, n, e)
					}
				}
			}
			walked += tree.Stats().Walked
			writes += uint64(target.writes)
			noops += uint64(target.noops)
		}
	}
	if walked == 0 {
		t.Fatal("no walk reached a root row: the scenarios do not exercise fan-outs")
	}
	if replays == 0 {
		t.Fatal("no batch was replayed after a crash")
	}
	if owned == 0 {
		t.Fatal("no tree has an entry keyed by the root's key")
	}
	if known == 0 {
		t.Fatal("no change carried its row's state")
	}
	t.Logf("%d root rows reached by walks; %d target writes, %d statements that wrote nothing; %d replays after a crash between the tables' commits; %d changes carried their row's state",
		walked, writes, noops, replays, known)
}

func diffTreeTarget(got, want map[join.Key]join.Row) error {
	var diffs []string
	for k, w := range want {
		g, ok := got[k]
		switch {
		case !ok:
			diffs = append(diffs, fmt.Sprintf("missing %v", w))
		case !join.ValuesEqual(g, w):
			diffs = append(diffs, fmt.Sprintf("row %v, want %v", g, w))
		}
	}
	for k, g := range got {
		if _, ok := want[k]; !ok {
			diffs = append(diffs, fmt.Sprintf("extra %v", g))
		}
	}
	if len(diffs) == 0 {
		return nil
	}
	slices.Sort(diffs)
	return fmt.Errorf("target differs from the SQL join:\n  %s", strings.Join(diffs, "\n  "))
}

func describeTreeChanges(cs []join.TreeChange) string {
	var b strings.Builder
	for _, c := range cs {
		fmt.Fprintf(&b, "\n  t%d %d key %v old %v values %v fks %v insert %v known %v", c.Table, c.Kind, c.Row.Key, c.OldKey, c.Row.Values, c.Row.FKs, c.Insert, c.Known)
		if c.Before != nil {
			fmt.Fprintf(&b, " before %v %v", c.Before.Values, c.Before.FKs)
		}
	}
	return b.String()
}

// tree is a random join of more than two tables: entry i references
// parent[i] (-1: the left table), joined with typ[i]. Every table has a key
// column and two value columns, then one foreign-key column per entry that
// references it, in entry order.
type tree struct {
	parent []int
	typ    []join.JoinType
	// children[t+1] are the entries referencing table t (-1: the left one).
	children [][]int
	// own[i] says the left table references entry i by its own key (a
	// roll-up's results): its foreign key to it is its key.
	own []bool
}

func randomTree(r *rand.Rand) tree {
	n := 1 + r.IntN(4) // 2 to 5 tables
	t := tree{children: make([][]int, n+1)}
	depth := map[int]int{-1: 0}
	for i := range n {
		var cands []int
		for p := -1; p < i; p++ {
			if depth[p] < 3 {
				cands = append(cands, p)
			}
		}
		p := cands[r.IntN(len(cands))]
		depth[i] = depth[p] + 1
		t.parent = append(t.parent, p)
		t.typ = append(t.typ, []join.JoinType{join.Inner, join.Left}[r.IntN(2)])
		t.children[p+1] = append(t.children[p+1], i)
	}
	t.own = make([]bool, n)
	for i, p := range t.parent {
		t.own[i] = p == -1 && t.typ[i] == join.Left && len(t.children[i+1]) == 0 && r.IntN(2) == 0
	}
	return t
}

func (t tree) String() string {
	s := ""
	for i, p := range t.parent {
		s += fmt.Sprintf("[%d %s from %d]", i, t.typ[i], p)
		if t.own[i] {
			s += "(own key)"
		}
	}
	return s
}

// TestTreeRootDeleteReadsNoEntry: a root row deleted is deleted from the
// target without evaluating the row it was, which would read a row of
// every entry (a TPC-H refresh deletes thousands of lineitems at a time).
func TestTreeRootDeleteReadsNoEntry(t *testing.T) {
	ctx := context.Background()
	spec := join.TreeSpec{Name: "chain", Tables: []join.TreeTable{
		{Key: []join.Family{join.FamilyInt}, Values: 1, From: -1},
		{Key: []join.Family{join.FamilyInt}, Values: 1, From: 0, Type: join.Inner},
		{Key: []join.Family{join.FamilyInt}, Values: 1, From: 1, Type: join.Left},
	}}
	tree, err := join.NewTree(spec)
	if err != nil {
		t.Fatal(err)
	}
	text := func(s string) []join.Value { return []join.Value{join.TextValue(s)} }
	row := func(key, val string, fks ...string) join.TreeRow {
		r := join.TreeRow{Key: text(key), Values: text(val)}
		for _, fk := range fks {
			r.FKs = append(r.FKs, text(fk))
		}
		return r
	}
	store := newTreeStore(len(spec.Tables))
	target := &treeTarget{rows: map[join.Key]join.Row{}}
	apply := func(changes ...join.TreeChange) {
		t.Helper()
		m, err := tree.Apply(ctx, store, changes, func(_ context.Context, o join.Output) error {
			return target.apply(o, spec.Tables[0].Key)
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := store.apply(m); err != nil {
			t.Fatal(err)
		}
	}
	apply(join.TreeChange{Table: 2, Kind: join.TreeUpsert, Row: row("100", "nation")},
		join.TreeChange{Table: 1, Kind: join.TreeUpsert, Row: row("10", "order", "100")},
		join.TreeChange{Table: 0, Kind: join.TreeUpsert, Row: row("1", "lineitem", "10")},
		join.TreeChange{Table: 0, Kind: join.TreeUpsert, Row: row("2", "lineitem", "10")})
	if len(target.rows) != 2 {
		t.Fatalf("target holds %d rows, want 2", len(target.rows))
	}
	clear(store.rowReads)
	apply(join.TreeChange{Table: 0, Kind: join.TreeDelete, Row: join.TreeRow{Key: text("1")}})
	if len(target.rows) != 1 {
		t.Fatalf("target holds %d rows after the delete, want 1", len(target.rows))
	}
	if n := store.rowReads[1] + store.rowReads[2]; n != 0 {
		t.Fatalf("deleting a root row read the entries' rows %d times (%v), want 0", n, store.rowReads)
	}
}
