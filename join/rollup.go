package join

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/fkmat/fkmat/internal/agg"
)

// A Rollup keeps aggregates of a child table per parent key: count, sum,
// avg, bool_and, bool_or (exact accumulators, O(1) per child change),
// min and max (a sorted set per parent, O(log n)), and jsonb_agg of the
// children in an order, optionally the first n. Its state is a join state
// of its own, read through a StateReader and changed by the Mutations a
// batch returns:
//
//   - left rows: each child present (it passes its filter) by its key, with
//     its parent key as the foreign key and its inputs as values;
//   - right rows: each parent with children, its accumulators;
//   - subscriptions: the sorted sets, one per parent and order (aggregates
//     ordered alike share one), foreign key (the parent key, the set's
//     index), each member the child's order key, then its key's order key
//     (the tie-breaker), then its key.
//
// A batch returns, for every parent whose aggregates it changed, their new
// values: the caller writes them into the parent's row. Like the engines,
// it does no I/O of its own.
type Rollup struct {
	spec RollupSpec
	// scalar[i] is the accumulator slot of aggregate i, -1 for an ordered
	// one; slot 0 is the hidden count(*) that says a parent has children.
	scalar []int
	funcs  []agg.Func
	sets   []rollupSet
	// setOf[i] is the sorted set of ordered aggregate i (-1: scalar).
	setOf []int
	// changes, parents and setReads count its work (Stats).
	changes, parents, setReads atomic.Uint64
}

// Stats returns the roll-up's counters.
func (r *Rollup) Stats() RollupStats {
	return RollupStats{Changes: r.changes.Load(), Parents: r.parents.Load(), SetReads: r.setReads.Load()}
}

// RollupSpec describes a Rollup.
type RollupSpec struct {
	// Name identifies the roll-up in errors.
	Name string
	// Parent are the families of the parent key (the child's foreign key
	// columns, in the parent key's order); Child those of the child's key,
	// ChildTypes its columns' Postgres types (ties of an order are broken
	// by the child's key, ascending).
	Parent, Child []Family
	ChildTypes    []string
	// Inputs are the Postgres types of the child's values (RollupChange.
	// Values): the aggregates' arguments and order columns.
	Inputs []string
	// KeyInputs are, per column of the child's key, the input that carries
	// it (-1: none). A sorted set ordered by every key column needs no
	// tie-breaker: its members are its order key and the child's key.
	KeyInputs []int
	// NotNull says which other inputs are never NULL (a key's are not:
	// its NOT NULL cannot be dropped while it is a key, unlike a column's
	// NOT NULL). min and max over such an input share a sorted set with a
	// jsonb_agg ordered alike.
	NotNull    []bool
	Aggregates []RollupAggregate
}

// RollupAggregate is one aggregate of a Rollup.
type RollupAggregate struct {
	// Func is count, sum, avg, bool_and, bool_or, min, max or jsonb_agg.
	Func string
	// Input is the index of its argument among the inputs; -1 for
	// count(*). For jsonb_agg, the element (a jsonb's text).
	Input int
	// OrderBy and Desc order jsonb_agg's elements (indexes among the
	// inputs); Limit keeps the first n (0: all).
	OrderBy []int
	Desc    []bool
	Limit   int
}

// rollupSet is a sorted set kept per parent: its order columns.
type rollupSet struct {
	cols []int
	desc []bool
	// skipNull leaves children with a NULL value out (min and max ignore
	// NULLs; jsonb_agg orders them).
	skipNull bool
	// window is how many first members its aggregates read (0: all, the
	// set is read whole); each parent's state keeps them (a window), with
	// the inputs they read.
	window int
	inputs []int
	// keyed says the order covers the child's key: no two members tie.
	keyed bool
}

// RollupChange is one change of a child row.
type RollupChange struct {
	// Kind is LeftUpsert, LeftDelete, LeftKeyChange or LeftTruncate (of
	// the child table).
	Kind ChangeKind
	// Key is the child's key; OldKey, for LeftKeyChange, the key it had
	// before.
	Key, OldKey []Value
	// Parent is the child's foreign key (a NULL column: no parent); Values
	// its inputs. Toast markers take the stored row's values.
	Parent, Values []Value
	// Absent says an upsert leaves the row out (it fails the filter).
	Absent bool
	// IfPresent applies an upsert only to a row the state holds: its
	// filter's inputs did not change.
	IfPresent bool
}

// RollupOutput is a parent's new aggregates.
type RollupOutput struct {
	// Parent is the parent key.
	Parent []Value
	// Values are the aggregates in the spec's order; nil when the parent
	// has no children (count is 0, the others NULL).
	Values []Value
	// Known says Before are the parent's aggregates at the batch start, as
	// the roll-up's state had them (nil: no children): set when the
	// roll-up computes every aggregate from its accumulators and windows
	// (LoadsResults) and no TRUNCATE cleared its state in the batch.
	Known  bool
	Before []Value
}

// NewRollup returns the Rollup of spec.
func NewRollup(spec RollupSpec) (*Rollup, error) {
	r := &Rollup{spec: spec, funcs: []agg.Func{agg.CountStar}}
	if len(spec.ChildTypes) != len(spec.Child) {
		return nil, fmt.Errorf("roll-up %s: %d child key types for %d columns", spec.Name, len(spec.ChildTypes), len(spec.Child))
	}
	for i, a := range spec.Aggregates {
		switch a.Func {
		case "min", "max", "jsonb_agg":
			set := rollupSet{}
			if a.Func == "jsonb_agg" {
				set.cols, set.desc = a.OrderBy, a.Desc
			} else {
				set.cols, set.desc = []int{a.Input}, []bool{a.Func == "max"}
				set.skipNull = !spec.notNull(a.Input)
			}
			if err := r.checkInputs(i, set.cols...); err != nil {
				return nil, err
			}
			for _, c := range set.cols {
				if err := agg.CheckOrder(spec.Inputs[c], "C"); err != nil {
					return nil, fmt.Errorf("roll-up %s, aggregate %d: %w", spec.Name, i, err)
				}
			}
			// Aggregates ordered alike share a set (max(created) and the
			// newest children by created).
			k := slices.IndexFunc(r.sets, func(s rollupSet) bool {
				return slices.Equal(s.cols, set.cols) && slices.Equal(s.desc, set.desc) && s.skipNull == set.skipNull
			})
			if k < 0 {
				k = len(r.sets)
				r.sets = append(r.sets, set)
			}
			r.scalar, r.setOf = append(r.scalar, -1), append(r.setOf, k)
		default:
			typ := ""
			if a.Input >= 0 {
				if err := r.checkInputs(i, a.Input); err != nil {
					return nil, err
				}
				typ = spec.Inputs[a.Input]
			}
			fn, _, err := agg.Of(a.Func, typ, a.Input < 0)
			if err != nil {
				return nil, fmt.Errorf("roll-up %s, aggregate %d: %w", spec.Name, i, err)
			}
			r.scalar, r.setOf = append(r.scalar, len(r.funcs)), append(r.setOf, -1)
			r.funcs = append(r.funcs, fn)
		}
	}
	r.windows()
	for s := range r.sets {
		set := &r.sets[s]
		set.keyed = len(spec.KeyInputs) == len(spec.Child) && len(spec.Child) > 0 && !slices.ContainsFunc(spec.KeyInputs, func(in int) bool {
			return in < 0 || !slices.Contains(set.cols, in)
		})
	}
	return r, nil
}

// windows sets each sorted set's window: the most first members its
// aggregates read (one for min and max, n for jsonb_agg … LIMIT n, 0 when
// one reads them all), and the inputs they read.
func (r *Rollup) windows() {
	whole := make([]bool, len(r.sets))
	for i, a := range r.spec.Aggregates {
		s := r.setOf[i]
		if s < 0 {
			continue
		}
		set := &r.sets[s]
		n := 1
		if a.Func == "jsonb_agg" {
			n = a.Limit
		}
		whole[s] = whole[s] || n == 0
		set.window = max(set.window, n)
		if !slices.Contains(set.inputs, a.Input) {
			set.inputs = append(set.inputs, a.Input)
		}
	}
	for s := range r.sets {
		if whole[s] {
			r.sets[s].window = 0
		}
	}
}

// notNull says input in is never NULL: a column of the child's key, or
// one NotNull names.
func (spec *RollupSpec) notNull(in int) bool {
	return slices.Contains(spec.KeyInputs, in) || in < len(spec.NotNull) && spec.NotNull[in]
}

func (r *Rollup) checkInputs(agg int, cols ...int) error {
	for _, c := range cols {
		if c < 0 || c >= len(r.spec.Inputs) {
			return fmt.Errorf("roll-up %s, aggregate %d: input %d of %d", r.spec.Name, agg, c, len(r.spec.Inputs))
		}
	}
	return nil
}

// Sets returns how many sorted sets each parent has: one per order of
// its min, max and jsonb_agg aggregates, shared by those ordered alike.
func (r *Rollup) Sets() int { return len(r.sets) }

// SetOrders returns, per sorted set, the inputs its members are ordered by
// (none for a jsonb_agg without ORDER BY: by the child's key alone).
func (r *Rollup) SetOrders() [][]int {
	out := make([][]int, len(r.sets))
	for s := range r.sets {
		out[s] = slices.Clone(r.sets[s].cols)
	}
	return out
}

// Spec returns the roll-up's spec.
func (r *Rollup) Spec() RollupSpec { return r.spec }

// rollupApply is one batch.
type rollupApply struct {
	r     *Rollup
	store StateReader
	// cleared says the child table was truncated in the batch: the store
	// no longer counts.
	cleared bool
	// children are the children's states as the batch leaves them (nil:
	// absent); base their states at the batch start, as read.
	children map[Key]*LeftState
	base     map[Key]*LeftState
	// touched are the parents the batch touched, by key; parents the same,
	// in first-touch order.
	touched map[Key]*rollupParent
	parents []*rollupParent
	// fetched are the accumulators read ahead of the changes (nil: none
	// stored).
	fetched map[Key]*RightState
	// members are the sorted sets' changes: true added, false removed.
	members map[Subscription]bool
	// loads caches r.LoadsResults().
	loads bool
	// states and ptrs are the rest of the slabs take cuts accumulators
	// from.
	states []agg.State
	ptrs   []*agg.State
}

// rollupParent is a parent a batch touched.
type rollupParent struct {
	key Key
	// values are its key's columns (the children's foreign key).
	values []Value
	// accs are its accumulators, windows its windows; stored their
	// encoding as read ("" when absent).
	accs    []*agg.State
	windows []window
	stored  string
	// before are its aggregates at the batch start (nil: none), when the
	// roll-up computes them from its state (LoadsResults).
	before []Value
}

// applySizeHint bounds the entries Apply sizes its first maps for, before
// it knows the batch's children and parents: a batch of many changes to
// one row allocates no more.
const applySizeHint = 1 << 14

// Apply applies a batch of child changes in commit order and returns the
// state's mutations and the new aggregates of the parents it changed.
func (r *Rollup) Apply(ctx context.Context, store StateReader, changes []RollupChange) (Mutations, []RollupOutput, error) {
	// The maps are sized for the batch's children and parents: grown by
	// rehashing, they took a tenth of W9's CPU per change.
	n := min(len(changes), applySizeHint)
	a := &rollupApply{r: r, store: store, base: make(map[Key]*LeftState, n), fetched: make(map[Key]*RightState, min(n, 1024)),
		loads: r.LoadsResults()}
	if err := a.prefetch(ctx, changes); err != nil {
		return Mutations{}, nil, err
	}
	a.children = make(map[Key]*LeftState, len(a.base))
	a.members = make(map[Subscription]bool, len(a.base)*len(r.sets))
	a.touched = make(map[Key]*rollupParent, len(a.fetched))
	a.parents = make([]*rollupParent, 0, len(a.fetched))
	for i := range changes {
		if err := a.change(ctx, &changes[i]); err != nil {
			return Mutations{}, nil, fmt.Errorf("roll-up %s, change %d: %w", r.spec.Name, i, err)
		}
	}
	m := a.mutations()
	view, err := a.view(&m)
	if err != nil {
		return Mutations{}, nil, err
	}
	if err := a.slideWindows(ctx, view); err != nil {
		return Mutations{}, nil, err
	}
	a.putParents(&m)
	outs, err := a.outputs(ctx, view)
	if err != nil {
		return Mutations{}, nil, err
	}
	r.changes.Add(uint64(len(changes)))
	r.parents.Add(uint64(len(outs)))
	return m, outs, nil
}

// view returns the state as the batch leaves its children and sorted sets
// (m): the store's, or none after a TRUNCATE, with m over it.
func (a *rollupApply) view(m *Mutations) (*Pending, error) {
	view := NewPending(a.store)
	if a.cleared {
		view = NewPending(emptyReader{})
		cm := *m
		cm.ClearLeft, cm.ClearRight = false, false
		m = &cm
	}
	if err := view.Set(m); err != nil {
		return nil, err
	}
	return view, nil
}

// prefetch reads the stored state of every child the batch names, in one
// round trip. An inserted child is read too, unlike the two-table engine's
// (Change.Insert): the accumulators count, so a batch applied again over
// a state that already has it must find it, as after a frozen daemon's
// late commit of the batch its successor replays.
func (a *rollupApply) prefetch(ctx context.Context, changes []RollupChange) error {
	var keys []Key
	for i := range changes {
		c := &changes[i]
		if c.Kind == LeftTruncate {
			break // the store does not count after it
		}
		for _, vals := range [][]Value{c.Key, c.OldKey} {
			if vals == nil {
				continue
			}
			k, err := EncodeKey(a.r.spec.Child, vals)
			if err != nil {
				return fmt.Errorf("roll-up %s: child key: %w", a.r.spec.Name, err)
			}
			if _, ok := a.base[k]; !ok {
				a.base[k] = nil
				keys = append(keys, k)
			}
		}
	}
	if len(keys) > 0 {
		got, err := a.store.GetLeft(ctx, keys)
		if err != nil {
			return err
		}
		sts := make([]LeftState, 0, len(got)) // one allocation for the batch's
		for k, st := range got {
			sts = append(sts, st)
			a.base[k] = &sts[len(sts)-1]
		}
	}
	// The accumulators of every parent the batch may touch, in one round
	// trip too: the stored children's and the changes' parents.
	var parents []Key
	addParent := func(vals []Value) error {
		if vals == nil || hasNull(vals) || hasToast(vals) {
			return nil
		}
		k, err := EncodeKey(a.r.spec.Parent, vals)
		if err != nil {
			return fmt.Errorf("roll-up %s: parent key: %w", a.r.spec.Name, err)
		}
		if _, ok := a.fetched[k]; !ok {
			a.fetched[k] = nil
			parents = append(parents, k)
		}
		return nil
	}
	for _, st := range a.base {
		if st != nil {
			if err := addParent(st.FK); err != nil {
				return err
			}
		}
	}
	for i := range changes {
		if changes[i].Kind == LeftTruncate {
			break
		}
		if err := addParent(changes[i].Parent); err != nil {
			return err
		}
	}
	if len(parents) == 0 {
		return nil
	}
	got, err := a.store.GetRight(ctx, parents)
	if err != nil {
		return err
	}
	sts := make([]RightState, 0, len(got))
	for k, st := range got {
		sts = append(sts, st)
		a.fetched[k] = &sts[len(sts)-1]
	}
	return nil
}

// child returns child k's state as the batch has it so far.
func (a *rollupApply) child(k Key) *LeftState {
	if st, ok := a.children[k]; ok {
		return st
	}
	if a.cleared {
		return nil
	}
	return a.base[k]
}

func (a *rollupApply) change(ctx context.Context, c *RollupChange) error {
	if c.Kind == LeftTruncate {
		a.truncate()
		return nil
	}
	key, err := EncodeKey(a.r.spec.Child, c.Key)
	if err != nil {
		return err
	}
	oldKey := key
	if c.Kind == LeftKeyChange {
		if oldKey, err = EncodeKey(a.r.spec.Child, c.OldKey); err != nil {
			return err
		}
	}
	old := a.child(oldKey)
	upsert := c.Kind == LeftUpsert || c.Kind == LeftKeyChange
	present := upsert && !c.Absent
	if upsert && c.IfPresent {
		if old == nil {
			return nil // out of the roll-up, and stays out
		}
		present = true
	}
	var next *LeftState
	if present {
		next = &LeftState{PK: slices.Clone(c.Key), FK: slices.Clone(c.Parent), Values: slices.Clone(c.Values)}
		if err := fillChildToast(next, old); err != nil {
			return err
		}
	}
	if old != nil {
		if err := a.account(ctx, oldKey, old, false); err != nil {
			return err
		}
		a.children[oldKey] = nil
	}
	if c.Kind == LeftDelete {
		return nil
	}
	if next != nil {
		if err := a.account(ctx, key, next, true); err != nil {
			return err
		}
	}
	a.children[key] = next
	return nil
}

// fillChildToast replaces next's unchanged-TOAST markers with old's values.
func fillChildToast(next, old *LeftState) error {
	if !hasToast(next.FK) && !hasToast(next.Values) {
		return nil
	}
	if old == nil {
		return errors.New("an unchanged TOASTed value of a child the roll-up does not hold")
	}
	for i := range next.FK {
		if next.FK[i].Toast {
			next.FK[i] = old.FK[i]
		}
	}
	for i := range next.Values {
		if next.Values[i].Toast {
			next.Values[i] = old.Values[i]
		}
	}
	return nil
}

// truncate forgets every child: the store's and the batch's.
func (a *rollupApply) truncate() {
	a.cleared = true
	clear(a.children)
	clear(a.touched)
	clear(a.members)
	a.parents = a.parents[:0]
}

// account adds (in) or removes child st, of key k, from its parent's
// aggregates.
func (a *rollupApply) account(ctx context.Context, k Key, st *LeftState, in bool) error {
	if hasNull(st.FK) {
		return nil // no parent
	}
	parent, err := EncodeKey(a.r.spec.Parent, st.FK)
	if err != nil {
		return fmt.Errorf("parent key: %w", err)
	}
	p, err := a.parent(ctx, parent, st.FK)
	if err != nil {
		return err
	}
	if err := a.r.count(p.accs, st, in); err != nil {
		return err
	}
	for s, set := range a.r.sets {
		member, ok, err := a.member(parent, st, k, s, set)
		if err != nil {
			return err
		}
		if !ok {
			continue
		}
		if was, seen := a.members[member]; seen && was != in {
			delete(a.members, member) // back to the stored state
		} else {
			a.members[member] = in
		}
	}
	return nil
}

// count adds child st's inputs to accumulators accs (in), or removes them.
func (r *Rollup) count(accs []*agg.State, st *LeftState, in bool) error {
	apply := func(s *agg.State, text string, null bool) error {
		if in {
			return s.Add(text, null)
		}
		return s.Remove(text, null)
	}
	if err := apply(accs[0], "", false); err != nil {
		return err
	}
	for i, ag := range r.spec.Aggregates {
		slot := r.scalar[i]
		if slot < 0 {
			continue
		}
		var v Value
		if ag.Input >= 0 {
			v = st.Values[ag.Input]
		}
		if err := apply(accs[slot], v.Text, ag.Input >= 0 && v.Null); err != nil {
			return fmt.Errorf("aggregate %d: %w", i, err)
		}
	}
	return nil
}

// member returns child st's member of sorted set s of its parent, and
// false when the child is not in it.
func (a *rollupApply) member(parent Key, st *LeftState, k Key, s int, set rollupSet) (Subscription, bool, error) {
	var b []byte
	for i, c := range set.cols {
		v := st.Values[c]
		if v.Null && set.skipNull {
			return Subscription{}, false, nil
		}
		var err error
		if b, err = agg.AppendOrderKey(b, a.r.spec.Inputs[c], v.Text, v.Null, set.desc[i]); err != nil {
			return Subscription{}, false, err
		}
	}
	for i, v := range st.PK {
		if set.keyed {
			break // the order has no ties
		}
		var err error
		if b, err = agg.AppendOrderKey(b, a.r.spec.ChildTypes[i], v.Text, v.Null, false); err != nil {
			return Subscription{}, false, err
		}
	}
	return Subscription{FK: a.setKey(parent, s), PK: Key(string(b) + string(k))}, true, nil
}

// setKey is the foreign key of sorted set s of parent: the parent key,
// then the set's index in one byte (parent keys are prefix-free, so these
// are too).
func (a *rollupApply) setKey(parent Key, s int) Key {
	return Key(string(parent) + string([]byte{byte(s)}))
}

// parent returns the batch's parent of key k, whose key columns are vals,
// with its accumulators read from the store the first time. vals are kept:
// a child's foreign key is not changed once accounted.
func (a *rollupApply) parent(ctx context.Context, k Key, vals []Value) (*rollupParent, error) {
	if p, ok := a.touched[k]; ok {
		return p, nil
	}
	p := &rollupParent{key: k, values: vals}
	if !a.cleared {
		st, ok := a.fetched[k]
		if !ok {
			got, err := a.store.GetRight(ctx, []Key{k})
			if err != nil {
				return nil, err
			}
			if g, found := got[k]; found {
				st = &g
			}
		}
		if st != nil {
			var err error
			if p.accs, p.windows, err = a.r.decode(*st, a.take()); err != nil {
				return nil, err
			}
			p.stored = st.Values[0].Text
			if a.loads && !p.accs[0].Empty() {
				p.before = a.r.results(p.accs, p.windows)
			}
		}
	}
	if p.accs == nil {
		p.accs, p.windows = a.take(), a.r.newWindows()
		for i, fn := range a.r.funcs {
			*p.accs[i] = *agg.New(fn)
		}
	}
	a.touched[k] = p
	a.parents = append(a.parents, p)
	return p, nil
}

// take returns a parent's accumulators, zero, from the batch's slabs: a
// batch allocates them a few times, not once per parent.
func (a *rollupApply) take() []*agg.State {
	n := len(a.r.funcs)
	if len(a.states) < n {
		size := n * max(len(a.fetched), 64)
		a.states, a.ptrs = make([]agg.State, size), make([]*agg.State, size)
	}
	accs := a.ptrs[:n:n]
	for i := range accs {
		accs[i] = &a.states[i]
	}
	a.states, a.ptrs = a.states[n:], a.ptrs[n:]
	return accs
}

// decode reads a parent's stored accumulators and windows into accs
// (zero, one per aggregate function).
func (r *Rollup) decode(st RightState, accs []*agg.State) ([]*agg.State, []window, error) {
	if len(st.Values) != 1 {
		return nil, nil, fmt.Errorf("roll-up %s: a stored parent has %d values", r.spec.Name, len(st.Values))
	}
	text := st.Values[0].Text
	b := []byte(text)
	for i, fn := range r.funcs {
		s := accs[i]
		rest, err := agg.DecodeInto(s, b)
		if err != nil {
			return nil, nil, fmt.Errorf("roll-up %s: %w", r.spec.Name, err)
		}
		// A sum of integers whose input widened to bigint goes on as a
		// numeric sum.
		w, ok := s.Widened(fn)
		if !ok {
			return nil, nil, fmt.Errorf("roll-up %s: a stored accumulator of another aggregate", r.spec.Name)
		}
		accs[i], b = w, rest
	}
	ws, err := r.decodeWindows(text[len(text)-len(b):])
	if err != nil {
		return nil, nil, fmt.Errorf("roll-up %s: %w", r.spec.Name, err)
	}
	return accs, ws, nil
}

// encode returns a parent's state: its accumulators, then its windows.
func (r *Rollup) encode(accs []*agg.State, ws []window) string {
	b := make([]byte, 0, 256)
	for _, s := range accs {
		b = s.Append(b)
	}
	return string(r.appendWindows(b, ws))
}

// mutations returns the batch's net changes of children and sorted sets.
func (a *rollupApply) mutations() Mutations {
	m := Mutations{ClearLeft: a.cleared, ClearRight: a.cleared}
	for k, st := range a.children {
		base := a.base[k]
		if a.cleared {
			base = nil
		}
		switch {
		case st == nil && base != nil:
			m.DelLeft = append(m.DelLeft, k)
		case st != nil && (base == nil || !sameChild(st, base)):
			if m.PutLeft == nil {
				m.PutLeft = make(map[Key]LeftState, len(a.children))
			}
			m.PutLeft[k] = *st
		}
	}
	for sub, in := range a.members {
		if in {
			m.AddSubs = append(m.AddSubs, sub)
		} else {
			m.DelSubs = append(m.DelSubs, sub)
		}
	}
	slices.SortFunc(m.AddSubs, compareSubs)
	slices.SortFunc(m.DelSubs, compareSubs)
	slices.Sort(m.DelLeft)
	return m
}

// putParents adds to m the touched parents' states that changed: their
// accumulators and windows.
func (a *rollupApply) putParents(m *Mutations) {
	for _, p := range a.parents {
		if p.accs[0].Empty() {
			if p.stored != "" {
				m.DelRight = append(m.DelRight, p.key)
			}
			continue
		}
		b := a.r.encode(p.accs, p.windows)
		if b == p.stored {
			continue
		}
		if m.PutRight == nil {
			m.PutRight = make(map[Key]RightState, len(a.parents))
		}
		m.PutRight[p.key] = RightState{Key: p.values, Values: []Value{TextValue(b)}}
	}
	slices.Sort(m.DelRight)
}

func sameChild(a, b *LeftState) bool {
	return ValuesEqual(a.PK, b.PK) && ValuesEqual(a.FK, b.FK) && ValuesEqual(a.Values, b.Values)
}

// outputs computes the touched parents' aggregates from the state as the
// batch leaves it: the accumulators, the windows, and the sorted sets
// without one read through view.
func (a *rollupApply) outputs(ctx context.Context, view *Pending) ([]RollupOutput, error) {
	if len(a.parents) == 0 {
		return nil, nil
	}
	sets, rows, err := a.readSets(ctx, view)
	if err != nil {
		return nil, err
	}
	outs := make([]RollupOutput, 0, len(a.parents))
	for _, p := range a.parents {
		accs := p.accs
		out := RollupOutput{Parent: p.values, Known: a.loads && !a.cleared, Before: p.before}
		if !accs[0].Empty() {
			out.Values = make([]Value, len(a.r.spec.Aggregates))
			for i, ag := range a.r.spec.Aggregates {
				if v, ok := a.r.kept(accs, p.windows, i); ok {
					out.Values[i] = v
					continue
				}
				v, err := a.ordered(sets, rows, p.key, i, ag)
				if err != nil {
					return nil, err
				}
				out.Values[i] = v
			}
		}
		if out.Known && (out.Before == nil) == (out.Values == nil) && ValuesEqual(out.Before, out.Values) {
			continue // the batch left its aggregates as they were
		}
		outs = append(outs, out)
	}
	return outs, nil
}

// setPage is how many members a sorted set read whole is read at a time.
const setPage = 1024

// childOf returns the child's key of member mem of sorted set s: what
// follows its order key and its key's order key.
func (a *rollupApply) childOf(s int, mem Key) (Key, error) {
	set := a.r.sets[s]
	n := 0
	for c, col := range set.cols {
		w, err := agg.OrderKeyLen([]byte(mem[n:]), a.r.spec.Inputs[col], set.desc[c])
		if err != nil {
			return "", fmt.Errorf("roll-up %s: %w", a.r.spec.Name, err)
		}
		n += w
	}
	for _, typ := range a.r.spec.ChildTypes {
		if set.keyed {
			break
		}
		w, err := agg.OrderKeyLen([]byte(mem[n:]), typ, false)
		if err != nil {
			return "", fmt.Errorf("roll-up %s: %w", a.r.spec.Name, err)
		}
		n += w
	}
	return mem[n:], nil
}

// ordered computes ordered aggregate i of parent from its sorted set as
// read: the first child's value (min, max) or the first children's
// elements (jsonb_agg).
func (a *rollupApply) ordered(sets map[Key][]Key, rows map[Key]LeftState, parent Key, i int, ag RollupAggregate) (Value, error) {
	keys := sets[a.setKey(parent, a.r.setOf[i])]
	if len(keys) == 0 {
		return NullValue(), nil
	}
	child := func(k Key) (LeftState, error) {
		st, ok := rows[k]
		if !ok {
			return st, fmt.Errorf("roll-up %s: a sorted set names a child the state does not hold", a.r.spec.Name)
		}
		return st, nil
	}
	if ag.Func != "jsonb_agg" {
		st, err := child(keys[0])
		if err != nil {
			return Value{}, err
		}
		return st.Values[ag.Input], nil
	}
	var b strings.Builder
	b.WriteByte('[')
	for j, k := range keys {
		st, err := child(k)
		if err != nil {
			return Value{}, err
		}
		if j > 0 {
			b.WriteString(", ")
		}
		if e := st.Values[ag.Input]; e.Null {
			b.WriteString("null")
		} else {
			b.WriteString(e.Text)
		}
	}
	b.WriteByte(']')
	return TextValue(b.String()), nil
}

// readSets reads, for every touched parent with children, each of its
// sorted sets without a window (those of a jsonb_agg of all children),
// then the children they name: for each set, the children's keys in its
// order, and the children. Two round trips for the batch, and more only
// for a set past its first page.
func (a *rollupApply) readSets(ctx context.Context, view *Pending) (map[Key][]Key, map[Key]LeftState, error) {
	var fks []Key
	var limits []int
	for _, p := range a.parents {
		if p.accs[0].Empty() {
			continue
		}
		for s := range a.r.sets {
			if a.r.sets[s].window == 0 {
				fks, limits = append(fks, a.setKey(p.key, s)), append(limits, setPage)
			}
		}
	}
	if len(fks) == 0 {
		return nil, nil, nil
	}
	pages, err := view.DependentsMany(ctx, fks, limits)
	if err != nil {
		return nil, nil, err
	}
	out := make(map[Key][]Key, len(fks))
	var keys []Key
	for i, fk := range fks {
		members := pages[i]
		s := int(fk[len(fk)-1])
		for page := members; len(page) == setPage; {
			if page, err = view.Dependents(ctx, fk, page[len(page)-1], setPage); err != nil {
				return nil, nil, err
			}
			members = append(members, page...)
		}
		children := make([]Key, len(members))
		for j, mem := range members {
			if children[j], err = a.childOf(s, mem); err != nil {
				return nil, nil, err
			}
		}
		out[fk] = children
		keys = append(keys, children...)
	}
	rows, err := view.GetLeft(ctx, keys)
	if err != nil {
		return nil, nil, err
	}
	return out, rows, nil
}

// emptyReader is a state with nothing in it: the store after a TRUNCATE.
type emptyReader struct{}

func (emptyReader) GetLeft(context.Context, []Key) (map[Key]LeftState, error) {
	return map[Key]LeftState{}, nil
}

func (emptyReader) GetRight(context.Context, []Key) (map[Key]RightState, error) {
	return map[Key]RightState{}, nil
}

func (emptyReader) Dependents(context.Context, Key, Key, int) ([]Key, error) { return nil, nil }

// RollupLoad builds a roll-up's state from its children as a backfill
// reads them: each child once, ordered by its parent key (children of one
// parent next to each other), in pages that may be handed to several
// goroutines at once. Each page yields its children, their sorted-set
// members, and the accumulators of the parents whose children it holds
// whole; a parent at either end of a page may have children in the next
// or the previous one, and is kept until Finish. So the memory held is a
// few parents per page, whatever the number of parents: holding every
// parent's accumulators until the end made W9's backfill (100k parents)
// spend half of its CPU in the garbage collector.
type RollupLoad struct {
	r    *Rollup
	mu   sync.Mutex
	accs map[Key]*loadParent // the parents at the ends of pages
}

type loadParent struct {
	key     []Value
	accs    []*agg.State
	windows []window
}

// Load returns a RollupLoad of r.
func (r *Rollup) Load() *RollupLoad { return &RollupLoad{r: r, accs: map[Key]*loadParent{}} }

// loadChild is a child of a page, with its parent key and its members.
type loadChild struct {
	parent  Key
	st      LeftState
	members []Key
}

// Page returns the state of a page of children, each row its key, then its
// parent key, then its inputs, ordered by parent key: the children of a
// parent are next to each other, in this page and the pages around it
// (children without a parent anywhere).
//
// With the state, it returns the aggregates of the parents whose state it
// holds whole, when LoadsResults (else none).
func (l *RollupLoad) Page(rows [][]Value) (Mutations, []RollupOutput, error) {
	r := l.r
	results := r.LoadsResults()
	nk, np := len(r.spec.Child), len(r.spec.Parent)
	m := Mutations{PutLeft: make(map[Key]LeftState, len(rows)), AddSubs: make([]Subscription, 0, len(rows)*len(r.sets))}
	a := &rollupApply{r: r}
	children := make([]loadChild, 0, len(rows))
	slab := make([]Key, len(rows)*len(r.sets)) // the children's members
	for _, row := range rows {
		if len(row) != nk+np+len(r.spec.Inputs) {
			return m, nil, fmt.Errorf("roll-up %s: a loaded row of %d values, want %d", r.spec.Name, len(row), nk+np+len(r.spec.Inputs))
		}
		st := LeftState{PK: row[:nk:nk], FK: row[nk : nk+np : nk+np], Values: row[nk+np:]}
		k, err := EncodeKey(r.spec.Child, st.PK)
		if err != nil {
			return m, nil, fmt.Errorf("roll-up %s: child key: %w", r.spec.Name, err)
		}
		m.PutLeft[k] = st
		if hasNull(st.FK) {
			continue
		}
		parent, err := EncodeKey(r.spec.Parent, st.FK)
		if err != nil {
			return m, nil, fmt.Errorf("roll-up %s: parent key: %w", r.spec.Name, err)
		}
		members := slab[:len(r.sets):len(r.sets)]
		slab = slab[len(r.sets):]
		for s, set := range r.sets {
			sub, ok, err := a.member(parent, &st, k, s, set)
			if err != nil {
				return m, nil, err
			}
			if ok {
				m.AddSubs = append(m.AddSubs, sub)
				members[s] = sub.PK
			}
		}
		children = append(children, loadChild{parent: parent, st: st, members: members})
	}
	// The parents of the page, one run of children each: the first and
	// the last may go on in other pages.
	var outs []RollupOutput
	for i := 0; i < len(children); {
		j := i + 1
		for j < len(children) && children[j].parent == children[i].parent {
			j++
		}
		run := children[i:j]
		if i == 0 || j == len(children) {
			for c := range run {
				if err := l.add(&run[c]); err != nil {
					return m, nil, err
				}
			}
		} else {
			p := l.r.newLoadParent(run[0].st.FK)
			for c := range run {
				if err := l.r.addChild(p, &run[c]); err != nil {
					return m, nil, err
				}
			}
			if m.PutRight == nil {
				m.PutRight = make(map[Key]RightState, len(children)/(j-i)) // about as many runs as this one
			}
			m.PutRight[run[0].parent] = RightState{Key: p.key, Values: []Value{TextValue(l.r.encode(p.accs, p.windows))}}
			if results {
				outs = append(outs, RollupOutput{Parent: p.key, Values: l.r.results(p.accs, p.windows)})
			}
		}
		i = j
	}
	return m, outs, nil
}

// newLoadParent returns the empty accumulators and windows of the parent
// of key values key.
func (r *Rollup) newLoadParent(key []Value) *loadParent {
	p := &loadParent{key: key, windows: r.newWindows()}
	for _, fn := range r.funcs {
		p.accs = append(p.accs, agg.New(fn))
	}
	return p
}

// addChild adds a child to its parent's accumulators, and its members (""
// where it has none) to the parent's windows.
func (r *Rollup) addChild(p *loadParent, c *loadChild) error {
	if err := r.count(p.accs, &c.st, true); err != nil {
		return fmt.Errorf("roll-up %s: %w", r.spec.Name, err)
	}
	for s := range r.sets {
		if set := &r.sets[s]; set.window > 0 && c.members[s] != "" {
			set.insert(&p.windows[s], set.entryOf(c.members[s], &c.st))
		}
	}
	return nil
}

// add adds a child of a parent at an end of a page to the parents kept
// until Finish.
func (l *RollupLoad) add(c *loadChild) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	p := l.accs[c.parent]
	if p == nil {
		// Kept past its page: its key copied, not a part of the page's
		// values, which would keep the whole page (every page, until
		// Finish: W9's backfill held 200 MB of pages and spent a fifth
		// of its CPU collecting garbage against the soft memory limit).
		key := make([]Value, len(c.st.FK))
		for i, v := range c.st.FK {
			key[i] = Value{Text: strings.Clone(v.Text), Null: v.Null, Toast: v.Toast}
		}
		p = l.r.newLoadParent(key)
		l.accs[c.parent] = p
	}
	return l.r.addChild(p, c)
}

// Finish returns the accumulators of the parents at the ends of pages,
// once every child is paged, and their aggregates when LoadsResults (else
// none).
func (l *RollupLoad) Finish() (Mutations, []RollupOutput) {
	results := l.r.LoadsResults()
	l.mu.Lock()
	defer l.mu.Unlock()
	m := Mutations{PutRight: make(map[Key]RightState, len(l.accs))}
	var outs []RollupOutput
	for k, p := range l.accs {
		m.PutRight[k] = RightState{Key: p.key, Values: []Value{TextValue(l.r.encode(p.accs, p.windows))}}
		if results {
			outs = append(outs, RollupOutput{Parent: p.key, Values: l.r.results(p.accs, p.windows)})
		}
	}
	return m, outs
}

// LoadsResults says a load computes every parent's aggregates as it goes:
// each ordered aggregate reads its parent's window (min, max, jsonb_agg …
// LIMIT n), not the whole sorted set (jsonb_agg without LIMIT), which a
// load does not keep.
func (r *Rollup) LoadsResults() bool {
	for _, s := range r.setOf {
		if s >= 0 && r.sets[s].window == 0 {
			return false
		}
	}
	return true
}

// results returns the aggregates of a parent of accumulators accs and
// windows ws, when LoadsResults.
func (r *Rollup) results(accs []*agg.State, ws []window) []Value {
	out := make([]Value, len(r.spec.Aggregates))
	for i := range r.spec.Aggregates {
		out[i], _ = r.kept(accs, ws, i)
	}
	return out
}

// kept returns aggregate i of a parent from its accumulators accs and
// windows ws, and false when it reads the whole sorted set (a jsonb_agg of
// all children).
func (r *Rollup) kept(accs []*agg.State, ws []window, i int) (Value, bool) {
	if slot := r.scalar[i]; slot >= 0 {
		text, null := accs[slot].Result()
		return Value{Text: text, Null: null}, true
	}
	if set := &r.sets[r.setOf[i]]; set.window > 0 {
		return set.ordered(ws[r.setOf[i]], r.spec.Aggregates[i]), true
	}
	return Value{}, false
}
