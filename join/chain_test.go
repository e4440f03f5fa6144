package join_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"

	"github.com/fkmat/fkmat/join"
	"github.com/fkmat/fkmat/join/jointest"
)

// tree is a random join of more than two tables: entry i references
// parent[i] (-1: the left table), joined with typ[i]. Every table has a key
// column and two value columns, then one foreign-key column per entry that
// references it, in entry order.
type tree struct {
	parent []int
	typ    []join.JoinType
	// children[t+1] are the entries referencing table t (-1: the left one).
	children [][]int
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
	return t
}

func (t tree) String() string {
	s := ""
	for i, p := range t.parent {
		s += fmt.Sprintf("[%d %s from %d]", i, t.typ[i], p)
	}
	return s
}

// width is the number of values of table tab (-1: left): two, then the
// foreign keys of the entries referencing it.
func (t tree) width(tab int) int { return 2 + len(t.children[tab+1]) }

// offset is where table tab's values start in a step row's values (past
// the key): the left table's first, then each entry's in order.
func (t tree) offset(tab int) int {
	off := 0
	for k := -1; k < tab; k++ {
		off += t.width(k)
	}
	return off
}

// fkPos is the position, among table parent[i]'s values, of entry i's
// foreign key.
func (t tree) fkPos(i int) int {
	return 2 + slices.Index(t.children[t.parent[i]+1], i)
}

// chain builds the Chain of t with one in-memory store per step; hide
// leaves the foreign-key columns out of the target.
func (t tree) chain(hide bool) (*join.Chain, []*jointest.Store, []int, error) {
	var stores []*jointest.Store
	for range t.parent {
		stores = append(stores, jointest.NewStore())
	}
	out := []int{0}
	for tab := -1; tab < len(t.parent); tab++ {
		n := t.width(tab)
		if hide {
			n = 2
		}
		for k := range n {
			out = append(out, 1+t.offset(tab)+k)
		}
	}
	return t.chainOn(stores, out)
}

// chainOn builds the Chain of t over existing stores (a new process).
func (t tree) chainOn(stores []*jointest.Store, out []int) (*join.Chain, []*jointest.Store, []int, error) {
	var steps []join.ChainStep
	var readers []join.StateReader
	for i := range t.parent {
		steps = append(steps, join.ChainStep{
			Spec: join.Spec{Name: "chain", Type: t.typ[i], PK: ints(1), FK: ints(1), RightKey: ints(1),
				LeftValues: t.offset(i), RightValues: t.width(i), PageSize: 3},
			FK: []int{t.offset(t.parent[i]) + t.fkPos(i)},
		})
		readers = append(readers, stores[i])
	}
	c, err := join.NewChain(steps, readers, out)
	return c, stores, out, err
}

func fanoutOf(c *join.Chain) (n uint64) {
	for _, e := range c.Engines() {
		n += e.Stats().FanoutRows
	}
	return n
}

func cloneChange(c join.Change) join.Change {
	c.Left = join.LeftRow{PK: slices.Clone(c.Left.PK), FK: slices.Clone(c.Left.FK), Values: slices.Clone(c.Left.Values)}
	c.Right = join.RightRow{Key: slices.Clone(c.Right.Key), Values: slices.Clone(c.Right.Values)}
	c.OldKey = slices.Clone(c.OldKey)
	return c
}

// source is the tables of a tree: rows by key.
type source struct {
	t      tree
	tables []map[string][]join.Value // index tab+1
}

// oracle evaluates the SQL of the list form (entries joined in order, each
// ON its parent's foreign key) and projects it with out.
func (s *source) oracle(out []int) map[string][]join.Value {
	res := map[string][]join.Value{}
	for pk, vals := range s.tables[0] {
		row := append([]join.Value{join.TextValue(pk)}, vals...)
		present := map[int]bool{-1: true}
		keep := true
		for i, p := range s.t.parent {
			var match []join.Value
			if present[p] {
				fk := row[1+s.t.offset(p)+s.t.fkPos(i)]
				if !fk.Null {
					match = s.tables[i+1][fk.Text]
				}
			}
			if match == nil {
				if s.t.typ[i] == join.Inner {
					keep = false
					break
				}
				for range s.t.width(i) {
					row = append(row, join.NullValue())
				}
				continue
			}
			present[i] = true
			row = append(row, match...)
		}
		if !keep {
			continue
		}
		proj := make([]join.Value, len(out))
		for k, p := range out {
			proj[k] = row[p]
		}
		res[pk] = proj
	}
	return res
}

// generator makes random batches over every table of a tree: inserts,
// updates (with unchanged-TOAST values), deletes, key changes, NULL and
// dangling foreign keys, several changes of one row, and TRUNCATE.
type generator struct {
	r   *rand.Rand
	src *source
	n   int // values written so far, for fresh values
}

func (g *generator) keys(tab int) int {
	if tab < 0 {
		return 30
	}
	return 8
}

func (g *generator) fresh() join.Value {
	g.n++
	if g.r.IntN(8) == 0 {
		return join.NullValue()
	}
	return join.TextValue("v" + strconv.Itoa(g.n%7)) // repeats: equal values happen
}

func (g *generator) fk(child int) join.Value {
	switch g.r.IntN(10) {
	case 0:
		return join.NullValue()
	case 1:
		return join.TextValue("99") // dangling
	}
	return join.TextValue(strconv.Itoa(g.r.IntN(g.keys(child))))
}

// values returns a row's values for table tab; old is the row's current
// values (nil: a new row), whose value columns may be left unchanged
// (TOAST).
func (g *generator) values(tab int, old []join.Value) []join.Value {
	v := []join.Value{g.fresh(), g.fresh()}
	if old != nil && g.r.IntN(3) == 0 {
		v[1] = join.ToastValue()
	}
	for _, c := range g.src.t.children[tab+1] {
		if old != nil && g.r.IntN(2) == 0 {
			v = append(v, old[2+slices.Index(g.src.t.children[tab+1], c)])
		} else {
			v = append(v, g.fk(c))
		}
	}
	return v
}

func fill(v, old []join.Value) []join.Value {
	out := slices.Clone(v)
	for k := range out {
		if out[k].Toast {
			out[k] = old[k]
		}
	}
	return out
}

// batch returns n random changes and applies them to the source.
func (g *generator) batch(n int, truncatable func(tab int) bool) []join.Change {
	var out []join.Change
	for range n {
		tab := g.r.IntN(len(g.src.tables)) - 1
		rows := g.src.tables[tab+1]
		key := strconv.Itoa(g.r.IntN(g.keys(tab)))
		old := rows[key]
		left := tab < 0
		var c join.Change
		switch x := g.r.IntN(100); {
		case x < 2 && truncatable(tab):
			c.Kind = join.RightTruncate
			if left {
				c.Kind = join.LeftTruncate
			}
			clear(rows)
		case x < 20 && old != nil:
			c.Kind = join.RightDelete
			c.Right.Key = []join.Value{join.TextValue(key)}
			if left {
				c.Kind = join.LeftDelete
				c.Left.PK = c.Right.Key
			}
			delete(rows, key)
		case x < 30 && old != nil:
			to := strconv.Itoa(g.r.IntN(g.keys(tab)))
			if _, taken := rows[to]; taken {
				continue
			}
			vals := g.values(tab, old)
			c.OldKey = []join.Value{join.TextValue(key)}
			c.Kind = join.RightKeyChange
			c.Right = join.RightRow{Key: []join.Value{join.TextValue(to)}, Values: vals}
			if left {
				c.Kind = join.LeftKeyChange
				c.Left = join.LeftRow{PK: c.Right.Key, Values: vals}
			}
			delete(rows, key)
			rows[to] = fill(vals, old)
		default:
			vals := g.values(tab, old)
			c.Kind, c.Insert = join.RightUpsert, old == nil
			c.Right = join.RightRow{Key: []join.Value{join.TextValue(key)}, Values: vals}
			if left {
				c.Kind = join.LeftUpsert
				c.Left = join.LeftRow{PK: c.Right.Key, Values: vals}
			}
			rows[key] = fill(vals, old)
		}
		c.Table = tab + 1
		out = append(out, c)
	}
	return out
}

// target is the target table as the Outputs leave it. Strict, it fails on a
// write that changes nothing; otherwise it counts them.
type target struct {
	rows      map[string][]join.Value
	rightFrom int
	strict    bool
	redundant int
}

func (t *target) apply(o join.Output) error {
	if o.Truncate {
		clear(t.rows)
	}
	if o.NullRight {
		for k, row := range t.rows {
			row = slices.Clone(row)
			for i := t.rightFrom; i < len(row); i++ {
				row[i] = join.NullValue()
			}
			t.rows[k] = row
		}
	}
	set := func(k string, row []join.Value) error {
		if old, ok := t.rows[k]; ok && join.ValuesEqual(old, row) {
			if t.strict {
				return fmt.Errorf("redundant write of unchanged row %v", row)
			}
			t.redundant++
		}
		t.rows[k] = row
		return nil
	}
	for _, pk := range o.Deletes {
		if _, ok := t.rows[pk[0].Text]; !ok {
			return fmt.Errorf("delete of absent row %v", pk)
		}
		delete(t.rows, pk[0].Text)
	}
	for _, row := range o.Upserts {
		if err := set(row[0].Text, row); err != nil {
			return err
		}
	}
	for _, u := range o.RightUpdates {
		for _, pk := range u.Keys {
			old, ok := t.rows[pk[0].Text]
			if !ok {
				return fmt.Errorf("right update of absent row %v", pk)
			}
			if err := set(pk[0].Text, append(slices.Clone(old[:t.rightFrom]), u.Right...)); err != nil {
				return err
			}
		}
	}
	return nil
}

func diff(got, want map[string][]join.Value) error {
	for k, w := range want {
		if g, ok := got[k]; !ok || !join.ValuesEqual(g, w) {
			return fmt.Errorf("row %s: got %v, want %v", k, g, w)
		}
	}
	for k, g := range got {
		if _, ok := want[k]; !ok {
			return fmt.Errorf("extra row %s: %v", k, g)
		}
	}
	return nil
}

// TestChainRandomTrees checks, over random trees (2 to 5 tables, depth up
// to 3, inner and left entries mixed) under random batches of every change
// kind on every table, that the target maintained from a Chain's outputs
// equals the SQL of the list form after every batch. With every column in
// the target no write may be redundant; with the foreign keys hidden, a
// write that changes only hidden columns is counted, not failed (the sink's
// IS DISTINCT FROM skips it).
func TestChainRandomTrees(t *testing.T) {
	t.Parallel()
	seeds := 60
	if testing.Short() {
		seeds = 10
	}
	for seed := range seeds {
		for _, mode := range []struct{ hide, paged bool }{{false, false}, {true, false}, {false, true}} {
			t.Run(fmt.Sprintf("seed%d/hide=%v/paged=%v", seed, mode.hide, mode.paged), func(t *testing.T) {
				t.Parallel()
				runChain(t, uint64(seed), mode.hide, mode.paged)
			})
		}
	}
}

// runChain runs a random tree under a random workload. Paged, the steps
// pass rows on in pages of 1 to 3 (a large transaction's fan-out through an
// entry before the last): each page goes through the later steps and its
// mutations are written at once (the flush), and the target must still
// equal the SQL with no redundant write.
func runChain(t *testing.T, seed uint64, hide, paged bool) {
	ctx := context.Background()
	r := rand.New(rand.NewPCG(seed, 11))
	tr := randomTree(r)
	c, stores, out, err := tr.chain(hide)
	if err != nil {
		t.Fatalf("%s: %v", tr, err)
	}
	src := &source{t: tr, tables: make([]map[string][]join.Value, len(tr.parent)+1)}
	for i := range src.tables {
		src.tables[i] = map[string][]join.Value{}
	}
	g := &generator{r: r, src: src}
	tgt := &target{rows: map[string][]join.Value{}, rightFrom: c.TargetRightFrom(), strict: !hide}
	// A TRUNCATE of a left entry's table before the last one is not
	// maintained by the chain (ErrChainNullRight); it is tested apart.
	truncatable := func(tab int) bool {
		return tab < 0 || tr.typ[tab] == join.Inner || tab == len(tr.parent)-1
	}
	nonEmpty, crashes, pages := 0, 0, 0
	var fanout uint64
	for b := range 120 {
		changes := g.batch(1+r.IntN(25), truncatable)
		// Keep a copy: the engines take ownership of the changes' values.
		replay := slices.Clone(changes)
		for k := range replay {
			replay[k] = cloneChange(replay[k])
		}
		var flush func(context.Context, []join.Mutations) error
		if paged {
			c.SetPageRows(1 + r.IntN(3))
			flush = func(ctx context.Context, muts []join.Mutations) error {
				pages++
				for i, m := range muts {
					if err := stores[i].Apply(ctx, m); err != nil {
						return fmt.Errorf("page of step %d: %w", i, err)
					}
				}
				return nil
			}
		}
		muts, err := c.ApplyPrefix(ctx, changes, len(stores), func(_ context.Context, o join.Output) error { return tgt.apply(o) }, flush)
		if err != nil {
			t.Fatalf("%s seed %d batch %d: %v", tr, seed, b, err)
		}
		// The target has the batch; the states are committed from the last
		// step to the first. One batch in five crashes before step `from`
		// commits, and a new process replays the batch on the steps behind.
		// (A paged batch is a large transaction: a crash in it is undone
		// whole, by the store.)
		from := 0
		if !paged && r.IntN(5) == 0 {
			from = 1 + r.IntN(len(muts))
		}
		for i := len(muts) - 1; i >= from; i-- {
			if err := stores[i].Apply(ctx, muts[i]); err != nil {
				t.Fatalf("%s seed %d batch %d: step %d state: %v", tr, seed, b, i, err)
			}
		}
		if from > 0 {
			crashes++
			fanout += fanoutOf(c)
			if c, _, _, err = tr.chainOn(stores, out); err != nil {
				t.Fatal(err)
			}
			muts, err := c.ApplyPrefix(ctx, replay, from, func(context.Context, join.Output) error {
				if from == len(muts) {
					return nil // every step replays: the caller drops what the target has
				}
				return errors.New("a replay on a prefix of the steps emitted output")
			}, nil)
			if err != nil {
				t.Fatalf("%s seed %d batch %d: replay on %d steps: %v", tr, seed, b, from, err)
			}
			for i := from - 1; i >= 0; i-- {
				if err := stores[i].Apply(ctx, muts[i]); err != nil {
					t.Fatalf("%s seed %d batch %d: replay: step %d state: %v", tr, seed, b, i, err)
				}
			}
		}
		if err := diff(tgt.rows, src.oracle(out)); err != nil {
			t.Fatalf("%s seed %d batch %d: target differs from the SQL: %v", tr, seed, b, err)
		}
		if len(tgt.rows) > 0 {
			nonEmpty++
		}
	}
	fanout += fanoutOf(c)
	t.Logf("%s: %d of 120 batches with target rows (%d at the end), %d fan-out rows, %d redundant writes (hidden columns), %d crashes replayed, %d pages flushed",
		tr, nonEmpty, len(tgt.rows), fanout, tgt.redundant, crashes, pages)
	if nonEmpty < 60 || fanout == 0 {
		t.Errorf("the workload exercised too little: %d batches with rows, %d fan-out rows", nonEmpty, fanout)
	}
	if paged && len(tr.parent) > 1 && pages == 0 {
		t.Errorf("paged, but no page was flushed")
	}
	if !hide && tgt.redundant != 0 {
		t.Errorf("%d redundant writes", tgt.redundant)
	}
}

// TestChainLeftTruncateMidway: a TRUNCATE of the table of a left entry that
// is not the last fails with ErrChainNullRight (the caller rebuilds).
func TestChainLeftTruncateMidway(t *testing.T) {
	t.Parallel()
	tr := tree{parent: []int{-1, 0}, typ: []join.JoinType{join.Left, join.Left}, children: [][]int{{0}, {1}, nil}}
	c, _, _, err := tr.chain(false)
	if err != nil {
		t.Fatal(err)
	}
	row := func(pk string, vals ...join.Value) join.Change {
		return join.Change{Kind: join.LeftUpsert, Insert: true, Left: join.LeftRow{PK: []join.Value{join.TextValue(pk)}, Values: vals}}
	}
	changes := []join.Change{
		row("1", join.TextValue("a"), join.TextValue("b"), join.TextValue("1")),
		{Table: 1, Kind: join.RightUpsert, Right: join.RightRow{Key: []join.Value{join.TextValue("1")},
			Values: []join.Value{join.TextValue("c"), join.TextValue("d"), join.TextValue("5")}}},
		{Table: 1, Kind: join.RightTruncate},
	}
	_, err = c.Apply(context.Background(), changes, func(context.Context, join.Output) error { return nil })
	if !errors.Is(err, join.ErrChainNullRight) {
		t.Fatalf("Apply = %v, want ErrChainNullRight", err)
	}
}

// TestChainFanOutWithoutFlush: a fan-out through an entry before the last
// that passes on more rows than a page fails with ErrChainFanOut when the
// caller gives no flush (a batch the pipeline then applies as large
// transactions), and is paged through the later steps with one.
func TestChainFanOutWithoutFlush(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tr := tree{parent: []int{-1, 0}, typ: []join.JoinType{join.Left, join.Left}, children: [][]int{{0}, {1}, nil}}
	c, stores, _, err := tr.chain(false)
	if err != nil {
		t.Fatal(err)
	}
	c.SetPageRows(2)
	v := join.TextValue
	customer := func(name string) join.Change {
		return join.Change{Table: 1, Kind: join.RightUpsert, Right: join.RightRow{Key: []join.Value{v("1")},
			Values: []join.Value{v(name), v("d"), v("9")}}}
	}
	load := []join.Change{customer("first")}
	for i := range 5 {
		load = append(load, join.Change{Kind: join.LeftUpsert, Insert: true,
			Left: join.LeftRow{PK: []join.Value{v(strconv.Itoa(i))}, Values: []join.Value{v("a"), v("b"), v("1")}}})
	}
	tgt := &target{rows: map[string][]join.Value{}, rightFrom: c.TargetRightFrom(), strict: true}
	emit := func(_ context.Context, o join.Output) error { return tgt.apply(o) }
	commit := func(muts []join.Mutations) {
		t.Helper()
		for i := len(muts) - 1; i >= 0; i-- {
			if err := stores[i].Apply(ctx, muts[i]); err != nil {
				t.Fatal(err)
			}
		}
	}
	muts, err := c.Apply(ctx, load, emit)
	if err != nil {
		t.Fatal(err)
	}
	commit(muts)
	if _, err := c.Apply(ctx, []join.Change{customer("renamed")}, func(context.Context, join.Output) error { return nil }); !errors.Is(err, join.ErrChainFanOut) {
		t.Fatalf("a rename reaching 5 rows with pages of 2, without flush: %v, want ErrChainFanOut", err)
	}
	pages := 0
	muts, err = c.ApplyPrefix(ctx, []join.Change{customer("renamed")}, 2, emit, func(ctx context.Context, muts []join.Mutations) error {
		pages++
		if !muts[0].Empty() {
			t.Errorf("a page flushed step 0's mutations: %+v", muts[0])
		}
		return stores[1].Apply(ctx, muts[1])
	})
	if err != nil {
		t.Fatal(err)
	}
	commit(muts)
	if pages != 2 {
		t.Errorf("%d pages flushed, want 2 (5 rows in pages of 2: the last row goes with the rest)", pages)
	}
	for pk, row := range tgt.rows {
		if row[4].Text != "renamed" {
			t.Errorf("row %s = %v, want the customer renamed", pk, row)
		}
	}
	if len(tgt.rows) != 5 {
		t.Errorf("%d target rows, want 5", len(tgt.rows))
	}
}
