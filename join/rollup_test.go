package join_test

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/fkmat/fkmat/internal/agg"
	"github.com/fkmat/fkmat/join"
	"github.com/fkmat/fkmat/join/jointest"
)

// The children of the property test: key id, parent, and the inputs
// amount (numeric), qty (integer), ok (boolean), created (bigint), elem
// (a jsonb's text), and id (its key, as an input).
var rollupInputs = []string{"numeric", "integer", "boolean", "bigint", "jsonb", "integer"}

const (
	inAmount = iota
	inQty
	inOK
	inCreated
	inElem
	inID
)

var rollupAggs = []join.RollupAggregate{
	{Func: "count", Input: -1},
	{Func: "count", Input: inAmount},
	{Func: "sum", Input: inAmount},
	{Func: "avg", Input: inAmount},
	{Func: "sum", Input: inQty},
	{Func: "avg", Input: inQty},
	{Func: "bool_and", Input: inOK},
	{Func: "bool_or", Input: inOK},
	{Func: "min", Input: inAmount},
	{Func: "max", Input: inCreated},
	{Func: "max", Input: inAmount},
	{Func: "jsonb_agg", Input: inElem, OrderBy: []int{inCreated}, Desc: []bool{true}, Limit: 3},
	{Func: "jsonb_agg", Input: inElem, OrderBy: []int{inCreated}, Desc: []bool{false}},
	// Ordered by the key: no ties, and max(id) shares the set.
	{Func: "max", Input: inID},
	{Func: "jsonb_agg", Input: inElem, OrderBy: []int{inID}, Desc: []bool{true}, Limit: 2},
}

// modelChild is a child row of the source table.
type modelChild struct {
	parent *int
	vals   []join.Value
	// in says it passes the roll-up's filter.
	in bool
}

// expected computes parent's aggregates from the model's children, by
// their definitions (NULL when none, count 0: a nil slice).
func expected(t *testing.T, children map[int]*modelChild, parent int) []join.Value {
	var rows []int
	for id, c := range children {
		if c.in && c.parent != nil && *c.parent == parent {
			rows = append(rows, id)
		}
	}
	if len(rows) == 0 {
		return nil
	}
	slices.Sort(rows)
	out := make([]join.Value, len(rollupAggs))
	for i, a := range rollupAggs {
		switch a.Func {
		case "min", "max", "jsonb_agg":
			var picked []int
			for _, id := range rows {
				if a.Func != "jsonb_agg" && children[id].vals[a.Input].Null {
					continue
				}
				picked = append(picked, id)
			}
			col, desc := a.Input, a.Func == "max"
			if a.Func == "jsonb_agg" {
				col, desc = a.OrderBy[0], a.Desc[0]
			}
			key := func(id int) []byte {
				v := children[id].vals[col]
				b, err := agg.AppendOrderKey(nil, rollupInputs[col], v.Text, v.Null, desc)
				if err != nil {
					t.Fatal(err)
				}
				return b
			}
			// Ties in child key order.
			slices.SortStableFunc(picked, func(x, y int) int { return bytes.Compare(key(x), key(y)) })
			if len(picked) == 0 {
				out[i] = join.NullValue()
				continue
			}
			if a.Func != "jsonb_agg" {
				out[i] = children[picked[0]].vals[a.Input]
				continue
			}
			if a.Limit > 0 && len(picked) > a.Limit {
				picked = picked[:a.Limit]
			}
			var elems []string
			for _, id := range picked {
				e := children[id].vals[a.Input]
				if e.Null {
					elems = append(elems, "null")
				} else {
					elems = append(elems, e.Text)
				}
			}
			out[i] = join.TextValue("[" + strings.Join(elems, ", ") + "]")
		default:
			typ := ""
			if a.Input >= 0 {
				typ = rollupInputs[a.Input]
			}
			fn, _, err := agg.Of(a.Func, typ, a.Input < 0)
			if err != nil {
				t.Fatal(err)
			}
			s := agg.New(fn)
			for _, id := range rows {
				var v join.Value
				if a.Input >= 0 {
					v = children[id].vals[a.Input]
				}
				if err := s.Add(v.Text, a.Input >= 0 && v.Null); err != nil {
					t.Fatal(err)
				}
			}
			text, null := s.Result()
			out[i] = join.Value{Text: text, Null: null}
		}
	}
	return out
}

// randomChildValues returns the random inputs of child id; created is
// never NULL when notNull says so.
func randomChildValues(r *rand.Rand, id int, notNull []bool) []join.Value {
	vals := []join.Value{
		join.TextValue(strconv.Itoa(r.IntN(200)-50) + "." + strconv.Itoa(r.IntN(100))),
		join.TextValue(strconv.Itoa(r.IntN(1000))),
		join.TextValue([]string{"t", "f"}[r.IntN(2)]),
		join.TextValue(strconv.Itoa(r.IntN(40))), // ties on created
		join.TextValue(fmt.Sprintf(`{"n": %d}`, r.IntN(1000))),
	}
	for i := range vals {
		if r.IntN(8) == 0 && (notNull == nil || !notNull[i]) {
			vals[i] = join.NullValue()
		}
	}
	return append(vals, join.TextValue(strconv.Itoa(id)))
}

// TestRollupRandom runs random batches of child changes (inserts,
// updates, moves between parents, NULL and dangling parents, rows entering
// and leaving the filter, key changes, unchanged TOASTed values, deletes,
// truncates, several changes of one child in a batch) through a Rollup
// against a strict store (no write that changes nothing), and checks every
// parent's aggregates with a model after each batch. Batches are read
// through the previous one's uncommitted mutations, as the pipeline does,
// and a crash before a commit is replayed.
func TestRollupRandom(t *testing.T) {
	for seed := range uint64(rollupSeeds) {
		t.Run(strconv.FormatUint(seed, 10), func(t *testing.T) { rollupRandom(t, seed) })
	}
}

// rollupSeeds is how many seeds TestRollupRandom runs.
var rollupSeeds = 80

func rollupRandom(t *testing.T, seed uint64) {
	ctx := context.Background()
	r := rand.New(rand.NewPCG(seed, 99))
	// Odd seeds say created is never NULL: max(created) shares its sorted
	// set (and window) with the newest children's jsonb_agg.
	var notNull []bool
	if seed%2 == 1 {
		notNull = make([]bool, len(rollupInputs))
		notNull[inCreated] = true
	}
	ro, err := join.NewRollup(join.RollupSpec{Name: "stats", Parent: []join.Family{join.FamilyInt}, Child: []join.Family{join.FamilyInt},
		ChildTypes: []string{"integer"}, Inputs: rollupInputs, NotNull: notNull, KeyInputs: []int{inID}, Aggregates: rollupAggs})
	if err != nil {
		t.Fatal(err)
	}
	// A load computes the parents' aggregates too when every ordered one
	// reads a window: the aggregates but the jsonb_agg of all children.
	var windowed []int
	var wAggs []join.RollupAggregate
	for i, a := range rollupAggs {
		if a.Func != "jsonb_agg" || a.Limit > 0 {
			windowed, wAggs = append(windowed, i), append(wAggs, a)
		}
	}
	rw, err := join.NewRollup(join.RollupSpec{Name: "windowed", Parent: []join.Family{join.FamilyInt}, Child: []join.Family{join.FamilyInt},
		ChildTypes: []string{"integer"}, Inputs: rollupInputs, NotNull: notNull, KeyInputs: []int{inID}, Aggregates: wAggs})
	if err != nil {
		t.Fatal(err)
	}
	// A third of the seeds stream through the roll-up without the
	// jsonb_agg of all children: it computes every aggregate from its state
	// and tells each parent's aggregates before the batch (Known).
	stream, proj := ro, []int(nil)
	if seed%3 == 2 {
		stream, proj = rw, windowed
	}
	store := jointest.NewStore()
	children := map[int]*modelChild{}
	expectedOf := func(p int) []join.Value {
		all := expected(t, children, p)
		if all == nil || proj == nil {
			return all
		}
		var out []join.Value
		for _, i := range proj {
			out = append(out, all[i])
		}
		return out
	}
	// got are the parents' aggregates as the outputs wrote them.
	got := map[int][]join.Value{}
	nParents := 1 + r.IntN(6)
	var pending *join.Mutations // the last batch, not yet committed
	for batch := range 60 {
		var changes []join.RollupChange
		before := map[int][]join.Value{}
		for p := range nParents + 1 {
			before[p] = expectedOf(p)
		}
		for range 1 + r.IntN(12) {
			id := r.IntN(25)
			c, exists := children[id]
			switch op := r.IntN(20); {
			case op == 0 && r.IntN(4) == 0:
				changes = append(changes, join.RollupChange{Kind: join.LeftTruncate})
				clear(children)
			case op < 3 && exists:
				changes = append(changes, join.RollupChange{Kind: join.LeftDelete, Key: []join.Value{join.TextValue(strconv.Itoa(id))}})
				delete(children, id)
			case op < 5 && exists:
				// A key change: the row moves to a free key.
				to := 100 + r.IntN(50)
				if _, taken := children[to]; taken {
					continue
				}
				vals := slices.Clone(c.vals)
				vals[inID] = join.TextValue(strconv.Itoa(to))
				sent := slices.Clone(vals)
				if c.in && r.IntN(2) == 0 {
					sent[inElem] = join.ToastValue()
				}
				changes = append(changes, join.RollupChange{Kind: join.LeftKeyChange, Key: []join.Value{join.TextValue(strconv.Itoa(to))},
					OldKey: []join.Value{join.TextValue(strconv.Itoa(id))}, Parent: parentValues(c.parent), Values: sent, Absent: !c.in})
				delete(children, id)
				children[to] = &modelChild{parent: c.parent, vals: vals, in: c.in}
			default:
				next := &modelChild{vals: randomChildValues(r, id, notNull), in: r.IntN(5) != 0}
				if p := r.IntN(nParents + 2); p < nParents+1 {
					next.parent = &p // nParents itself is a parent that never exists: dangling
				}
				ch := join.RollupChange{Kind: join.LeftUpsert, Key: []join.Value{join.TextValue(strconv.Itoa(id))},
					Parent: parentValues(next.parent), Values: slices.Clone(next.vals), Absent: !next.in}
				if exists && c.in && r.IntN(3) == 0 {
					// An update leaving elem unchanged and TOASTed; the
					// filter's inputs unchanged too: presence kept.
					next.vals[inElem] = c.vals[inElem]
					ch.Values[inElem] = join.ToastValue()
					if r.IntN(2) == 0 {
						ch.IfPresent, ch.Absent, next.in = true, false, c.in
					}
				}
				if exists && !c.in && r.IntN(4) == 0 {
					// Its filter's inputs unchanged: it stays out.
					ch.IfPresent, next = true, c
				}
				changes = append(changes, ch)
				children[id] = next
			}
		}
		reader := join.StateReader(store)
		if pending != nil {
			p := join.NewPending(store)
			if err := p.Set(pending); err == nil {
				reader = p
			} else if err := store.Apply(ctx, *pending); err != nil { // a clear: wait for its commit
				t.Fatalf("batch %d: commit: %v", batch-1, err)
			} else {
				pending = nil
			}
		}
		m, outs, err := stream.Apply(ctx, reader, changes)
		if err != nil {
			t.Fatalf("batch %d: %v", batch, err)
		}
		if r.IntN(5) == 0 {
			// A crash before the commit: the same batch again gives the
			// same result.
			m2, outs2, err := stream.Apply(ctx, reader, changes)
			if err != nil || m2.String() != m.String() || fmt.Sprint(outs2) != fmt.Sprint(outs) {
				t.Fatalf("batch %d replayed: %v\n%v\n%v", batch, err, outs, outs2)
			}
		}
		if pending != nil {
			if err := store.Apply(ctx, *pending); err != nil {
				t.Fatalf("batch %d: commit: %v", batch-1, err)
			}
		}
		pending = &m
		truncated := slices.ContainsFunc(changes, func(c join.RollupChange) bool { return c.Kind == join.LeftTruncate })
		if truncated {
			clear(got)
		}
		seen := map[int]bool{}
		for _, o := range outs {
			p, err := strconv.Atoi(o.Parent[0].Text)
			if err != nil {
				t.Fatal(err)
			}
			if seen[p] {
				t.Fatalf("batch %d: parent %d written twice", batch, p)
			}
			seen[p] = true
			got[p] = o.Values
			if o.Known != (stream == rw && !truncated) {
				t.Fatalf("batch %d: parent %d: Known %v from roll-up %s (truncated %v)", batch, p, o.Known, stream.Spec().Name, truncated)
			}
			if o.Known && ((o.Before == nil) != (before[p] == nil) || !slices.EqualFunc(o.Before, before[p], join.Value.Equal)) {
				t.Fatalf("batch %d: parent %d: before the batch %v, want %v", batch, p, o.Before, before[p])
			}
		}
		for p := range nParents + 1 {
			want := expectedOf(p)
			if !slices.EqualFunc(got[p], want, join.Value.Equal) {
				t.Fatalf("batch %d (%d changes, truncated %v): parent %d\n got  %v\n want %v\n before %v", batch, len(changes), truncated, p, got[p], want, before[p])
			}
		}
	}
	if pending != nil {
		if err := store.Apply(ctx, *pending); err != nil {
			t.Fatal(err)
		}
	}
	// A backfill of the children as they are gives the same state: a batch
	// touching every parent (an update changing nothing) yields the same
	// aggregates from both, the model's. The backfill reads the children
	// ordered by parent (children without one last), in pages of random
	// sizes, handed to the load in a random order.
	loaded := jointest.NewStore()
	ld := stream.Load()
	if ro.LoadsResults() || !rw.LoadsResults() {
		t.Fatalf("LoadsResults: %v with a jsonb_agg of all children, %v without", ro.LoadsResults(), rw.LoadsResults())
	}
	wld := rw.Load()
	loadedOuts := map[int][]join.Value{}
	keep := func(outs []join.RollupOutput) {
		for _, o := range outs {
			p, err := strconv.Atoi(o.Parent[0].Text)
			if err != nil {
				t.Fatal(err)
			}
			if _, dup := loadedOuts[p]; dup {
				t.Fatalf("the load gave parent %d's aggregates twice", p)
			}
			loadedOuts[p] = slices.Clone(o.Values)
		}
	}
	var rows [][]join.Value
	var touch []join.RollupChange
	for _, id := range slices.SortedFunc(maps.Keys(children), func(a, b int) int {
		pa, pb := children[a].parent, children[b].parent
		switch {
		case pa == nil || pb == nil:
			return cmp.Compare(b2i(pa == nil), b2i(pb == nil))
		default:
			return cmp.Compare(*pa, *pb)
		}
	}) {
		c := children[id]
		if !c.in {
			continue
		}
		key := []join.Value{join.TextValue(strconv.Itoa(id))}
		rows = append(rows, append(append(slices.Clone(key), parentValues(c.parent)...), c.vals...))
		toast := make([]join.Value, len(c.vals))
		for i := range toast {
			toast[i] = join.ToastValue()
		}
		touch = append(touch, join.RollupChange{Kind: join.LeftUpsert, Key: key, Parent: parentValues(c.parent), Values: toast, IfPresent: true})
	}
	var pages [][][]join.Value
	for len(rows) > 0 {
		n := min(len(rows), 1+r.IntN(6))
		pages, rows = append(pages, rows[:n]), rows[n:]
	}
	r.Shuffle(len(pages), func(i, j int) { pages[i], pages[j] = pages[j], pages[i] })
	for _, page := range pages {
		m, _, err := ld.Page(page)
		if err != nil {
			t.Fatal(err)
		}
		if err := loaded.Apply(ctx, cloneMutations(m)); err != nil {
			t.Fatal(err)
		}
		_, outs, err := wld.Page(page)
		if err != nil {
			t.Fatal(err)
		}
		keep(outs)
		// The load keeps nothing of a page once it has returned (the
		// backfill drops its pages): what it keeps would show the
		// scribbles.
		for _, row := range page {
			for i := range row {
				row[i] = join.TextValue("scribbled")
			}
		}
	}
	fin, _ := ld.Finish()
	for k, st := range fin.PutRight {
		if enc, err := join.EncodeKey([]join.Family{join.FamilyInt}, st.Key); err != nil || enc != k {
			t.Fatalf("a parent kept past its page has key %v: it was kept as a part of the page", st.Key)
		}
	}
	if err := loaded.Apply(ctx, fin); err != nil {
		t.Fatal(err)
	}
	_, outs := wld.Finish()
	keep(outs)
	for p := range nParents + 1 {
		var want []join.Value
		if all := expected(t, children, p); all != nil {
			for _, i := range windowed {
				want = append(want, all[i])
			}
		}
		if got := loadedOuts[p]; !slices.EqualFunc(got, want, join.Value.Equal) {
			t.Fatalf("parent %d: the load computed %v, want %v", p, got, want)
		}
	}
	// Both hold the same parents' states, byte for byte: accumulators and
	// windows.
	if len(store.Right) != len(loaded.Right) {
		t.Fatalf("%d parents' states streamed, %d loaded", len(store.Right), len(loaded.Right))
	}
	for k, st := range store.Right {
		if l, ok := loaded.Right[k]; !ok || l.Values[0].Text != st.Values[0].Text {
			t.Fatalf("parent %q: streamed state %q, loaded %q", k, st.Values[0].Text, l.Values)
		}
	}
	_, want, err := stream.Apply(ctx, store, touch)
	if err != nil {
		t.Fatal(err)
	}
	_, got2, err := stream.Apply(ctx, loaded, touch)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(want) != fmt.Sprint(got2) {
		t.Fatalf("the loaded state's aggregates differ:\n incremental %v\n loaded      %v", want, got2)
	}
	for _, o := range want {
		p, _ := strconv.Atoi(o.Parent[0].Text)
		if !slices.EqualFunc(o.Values, expectedOf(p), join.Value.Equal) {
			t.Fatalf("parent %d after the run: %v, want %v", p, o.Values, expectedOf(p))
		}
	}
}

// b2i is 1 for true.
func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

func parentValues(p *int) []join.Value {
	if p == nil {
		return []join.Value{join.NullValue()}
	}
	return []join.Value{join.TextValue(strconv.Itoa(*p))}
}

// cloneMutations copies m's rows, as a store that encodes them does: the
// rows given may then change.
func cloneMutations(m join.Mutations) join.Mutations {
	c := m
	c.PutLeft = make(map[join.Key]join.LeftState, len(m.PutLeft))
	for k, st := range m.PutLeft {
		c.PutLeft[k] = join.LeftState{PK: slices.Clone(st.PK), FK: slices.Clone(st.FK), Values: slices.Clone(st.Values), Hash: st.Hash}
	}
	c.PutRight = make(map[join.Key]join.RightState, len(m.PutRight))
	for k, st := range m.PutRight {
		c.PutRight[k] = join.RightState{Key: slices.Clone(st.Key), Values: slices.Clone(st.Values)}
	}
	return c
}

// TestRollupSetOrders: aggregates ordered alike share a sorted set
// (max(id) and the newest children by id); min and max of one input, and
// a jsonb_agg without ORDER BY, have sets of their own.
func TestRollupSetOrders(t *testing.T) {
	ro, err := join.NewRollup(join.RollupSpec{Name: "orders", Parent: []join.Family{join.FamilyInt}, Child: []join.Family{join.FamilyInt},
		ChildTypes: []string{"bigint"}, Inputs: []string{"bigint", "numeric", "jsonb"}, NotNull: []bool{true, false, false}, KeyInputs: []int{0},
		Aggregates: []join.RollupAggregate{{Func: "count", Input: -1}, {Func: "max", Input: 0}, {Func: "sum", Input: 1},
			{Func: "jsonb_agg", Input: 2, OrderBy: []int{0}, Desc: []bool{true}, Limit: 5}, {Func: "min", Input: 0},
			{Func: "jsonb_agg", Input: 2}, {Func: "max", Input: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := ro.SetOrders(), [][]int{{0}, {0}, {}, {1}}; ro.Sets() != len(want) || fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("%d sets ordered by %v, want %v", ro.Sets(), got, want)
	}
}
