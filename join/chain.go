package join

import (
	"context"
	"errors"
	"fmt"
	"slices"
)

// A Chain maintains a join of more than two tables (README, "Joins of more than
// two tables"): the entries joined in list order, each on a foreign key of
// the left table or of an earlier entry. The SQL is left-deep,
//
//	R0 = left;  Ri = R(i-1) <type i> JOIN table i ON from_i.fk = table_i.key
//
// so every step is a two-table foreign-key join whose left side is R(i-1),
// keyed by the left table's key, and whose right side is a base table. A
// Chain runs one Engine per step, in order: the changes of the left table
// and of the first entry go to step 0; the Outputs of step i become the
// left changes of step i+1, beside the changes of entry i+1's table; the
// Outputs of the last step, projected, go to the target. SQL's semantics
// hold at every level by construction (an inner step after a left one drops
// the row as SQL does), and fan-out stays one level deep: a change of an
// entry's table fans out over the left keys of its step, whatever the depth
// of the entry in the tree.
//
// Each step's row R(i) carries the columns later steps need as foreign
// keys even when the target does not show them (Out projects them away).
type Chain struct {
	steps   []ChainStep
	engines []*Engine
	out     []int
	// pageRows is how many rows a step passes on before they are paged.
	pageRows int
	// outRight are the positions in the last step's right values of the
	// target's right columns (Out's entries past the last step's left
	// part).
	outRight []int
}

// ChainStep is one step of a Chain.
type ChainStep struct {
	// Spec is the step's two-table join. PK is the left table's key in
	// every step; LeftValues is the width of the previous step's row past
	// the key (for step 0, the left table's values); RightValues the
	// entry's values (projected, and carried for later steps).
	Spec Spec
	// FK are the positions, in the step's left values, of its foreign key
	// columns, in the order of Spec.FK.
	FK []int
}

// ErrChainNullRight is a TRUNCATE of the table of a left step that is not
// the last: every row of the steps after it changes, and the state holds
// no index of them. The caller rebuilds the join.
var ErrChainNullRight = errors.New("a TRUNCATE of a table joined with a left join before the last entry needs a rebuild of the join")

// NewChain returns a chain of steps reading each step's state from the
// matching store; out lists, in target order, the positions in the last
// step's rows (key, left values, right values) of the target's columns. The
// key comes first, in order; the last step's right columns come last.
func NewChain(steps []ChainStep, stores []StateReader, out []int) (*Chain, error) {
	if len(steps) < 1 || len(stores) != len(steps) {
		return nil, fmt.Errorf("new join chain: %d steps and %d stores", len(steps), len(stores))
	}
	c := &Chain{steps: slices.Clone(steps), out: slices.Clone(out), pageRows: DefaultChainPageRows}
	width := len(steps[0].Spec.PK) + steps[0].Spec.LeftValues
	for i, s := range steps {
		if i > 0 && (s.Spec.LeftValues != width-len(s.Spec.PK) || !slices.Equal(s.Spec.PK, steps[0].Spec.PK)) {
			return nil, fmt.Errorf("new join chain: step %d has %d left values and key %v, want %d and %v (the previous step's row)",
				i, s.Spec.LeftValues, s.Spec.PK, width-len(steps[0].Spec.PK), steps[0].Spec.PK)
		}
		if len(s.FK) != len(s.Spec.FK) {
			return nil, fmt.Errorf("new join chain: step %d has %d foreign key positions for %d columns", i, len(s.FK), len(s.Spec.FK))
		}
		for _, p := range s.FK {
			if p < 0 || p >= s.Spec.LeftValues {
				return nil, fmt.Errorf("new join chain: step %d: foreign key position %d out of its %d left values", i, p, s.Spec.LeftValues)
			}
		}
		e, err := NewEngine(s.Spec, stores[i])
		if err != nil {
			return nil, fmt.Errorf("new join chain: step %d: %w", i, err)
		}
		c.engines = append(c.engines, e)
		width += s.Spec.RightValues
	}
	last := steps[len(steps)-1].Spec
	rightFrom := len(last.PK) + last.LeftValues
	for i, p := range out {
		if p < 0 || p >= width {
			return nil, fmt.Errorf("new join chain: output column %d at position %d out of the row's %d", i, p, width)
		}
		if i < len(last.PK) && p != i {
			return nil, fmt.Errorf("new join chain: output column %d must be key column %d", i, i)
		}
		if p >= rightFrom {
			c.outRight = append(c.outRight, p-rightFrom)
		} else if len(c.outRight) > 0 {
			return nil, fmt.Errorf("new join chain: output column %d comes from the left part after a right column", i)
		}
	}
	return c, nil
}

// Engines returns the steps' engines, for their Stats.
func (c *Chain) Engines() []*Engine { return c.engines }

// TargetRightFrom returns the index of the first target column that the last
// step's right side fills (RightUpdates and NullRight write from there on).
func (c *Chain) TargetRightFrom() int { return len(c.out) - len(c.outRight) }

// Apply applies a batch of changes (Change.Table says of which table; the
// left table's foreign keys are taken from Left.Values, so Left.FK is
// ignored), whole source transactions in commit order, and returns each
// step's mutations, to be persisted with the batch's checkpoint. The effect
// on the target is passed to emit, in order, as in Engine.Apply. A fan-out
// through an entry that is not the last (a customer rename reaching its
// orders, with entries after customers) passing on more than PageRows rows
// fails with ErrChainFanOut: see ApplyPrefix.
func (c *Chain) Apply(ctx context.Context, changes []Change, emit func(context.Context, Output) error) ([]Mutations, error) {
	return c.ApplyPrefix(ctx, changes, len(c.steps), emit, nil)
}

// DefaultChainPageRows is how many rows a step passes on to the next before
// they are paged (ApplyPrefix).
const DefaultChainPageRows = 10_000

// SetPageRows sets how many rows a step passes on to the next before they
// are paged; 0 restores DefaultChainPageRows.
func (c *Chain) SetPageRows(n int) {
	if n <= 0 {
		n = DefaultChainPageRows
	}
	c.pageRows = n
}

// ErrChainFanOut is a batch whose fan-out through an entry before the last
// passes on more rows than a page, applied without a flush: nothing of it
// is returned, and the caller applies it again with one (a large
// transaction, whose partial state is undone after a crash).
var ErrChainFanOut = errors.New("a fan-out through a join chain's entry passes on more rows than a page")

// ApplyPrefix is Apply on the first n steps only, for a replay after a
// crash: the states are committed from the last step to the first, so the
// steps that already have a batch are a suffix n, n+1, ... of the chain,
// and the target has it too. The first n steps recompute it from their
// states and inputs; what step n-1 would pass on is dropped (step n has
// it), and emit is not called unless n is every step. It returns the
// mutations of the first n steps.
//
// Memory stays bounded by the batch and a page: when a step has PageRows
// rows to pass on, they go through the later steps at once, as a batch of
// their own, whose mutations (one per step, nil for the steps before) are
// handed to flush to be written before the batch goes on. The later steps
// read them from their states afterwards. The mutations returned are the
// rest. With flush nil, a fan-out passing on more than PageRows rows fails
// with ErrChainFanOut.
func (c *Chain) ApplyPrefix(ctx context.Context, changes []Change, n int, emit func(context.Context, Output) error,
	flush func(context.Context, []Mutations) error) ([]Mutations, error) {
	if n < 0 || n > len(c.steps) {
		return nil, fmt.Errorf("apply join chain: %d steps of %d", n, len(c.steps))
	}
	own := make([][]Change, len(c.steps)+1)
	for _, ch := range changes {
		left := ch.Kind == LeftUpsert || ch.Kind == LeftDelete || ch.Kind == LeftKeyChange || ch.Kind == LeftTruncate
		if ch.Table < 0 || ch.Table > len(c.steps) || left != (ch.Table == 0) {
			return nil, fmt.Errorf("apply join chain: a %s change of table %d; the chain has %d tables, the left one 0", ch.Kind, ch.Table, len(c.steps)+1)
		}
		own[ch.Table] = append(own[ch.Table], ch)
	}
	a := &chainApply{c: c, n: n, emit: emit, flush: flush}
	muts := make([]Mutations, n)
	// in holds step i's left changes, derived from step i-1's outputs (the
	// left table's changes for step 0); each table's own changes keep their
	// order, which is all the final state depends on, so a step takes its
	// entry's changes after them.
	in := own[0]
	for i := range n {
		m, next, err := a.step(ctx, i, in, own[i+1])
		if err != nil {
			return nil, err
		}
		muts[i], in = m, next
	}
	return muts, nil
}

// chainApply is one ApplyPrefix call.
type chainApply struct {
	c     *Chain
	n     int
	emit  func(context.Context, Output) error
	flush func(context.Context, []Mutations) error
	// fanOut counts the rows passed on from right updates (without flush).
	fanOut int
}

// step applies in, then own, to step i, and returns its mutations and what
// it passes on to step i+1 (but the pages it passed on already).
func (a *chainApply) step(ctx context.Context, i int, in, own []Change) (Mutations, []Change, error) {
	c := a.c
	s := c.steps[i]
	batch := make([]Change, 0, len(in)+len(own))
	for _, ch := range in {
		if err := c.deriveFK(i, &ch); err != nil {
			return Mutations{}, nil, err
		}
		batch = append(batch, ch)
	}
	batch = append(batch, own...)
	var next []Change
	var sink func(context.Context, Output) error
	switch {
	case i == len(c.steps)-1:
		sink = func(ctx context.Context, o Output) error { return a.emit(ctx, c.project(o)) }
	case i == a.n-1:
		sink = func(context.Context, Output) error { return nil }
	default:
		sink = func(ctx context.Context, o Output) error {
			d, fanOut, err := derive(o, s.Spec)
			if err != nil {
				return err
			}
			next = append(next, d...)
			if a.flush == nil {
				if a.fanOut += fanOut; a.fanOut > c.pageRows {
					return ErrChainFanOut
				}
				return nil
			}
			if len(next) >= c.pageRows {
				page := next
				next = nil
				return a.page(ctx, i+1, page)
			}
			return nil
		}
	}
	m, err := c.engines[i].Apply(ctx, batch, sink)
	if err != nil {
		return Mutations{}, nil, fmt.Errorf("step %d: %w", i, err)
	}
	return m, next, nil
}

// page runs a page of step from's left changes through it and the steps
// after it, and flushes their mutations.
func (a *chainApply) page(ctx context.Context, from int, in []Change) error {
	muts := make([]Mutations, a.n)
	for i := from; i < a.n; i++ {
		m, next, err := a.step(ctx, i, in, nil)
		if err != nil {
			return err
		}
		muts[i], in = m, next
	}
	if err := a.flush(ctx, muts); err != nil {
		return fmt.Errorf("apply join chain: flush a page of step %d: %w", from, err)
	}
	return nil
}

// deriveFK sets a left change's foreign key for step i from its values.
func (c *Chain) deriveFK(i int, ch *Change) error {
	switch ch.Kind {
	case LeftUpsert, LeftKeyChange:
	default:
		return nil
	}
	s := c.steps[i]
	if len(ch.Left.Values) != s.Spec.LeftValues {
		return fmt.Errorf("apply join chain: step %d: a left change with %d values, want %d", i, len(ch.Left.Values), s.Spec.LeftValues)
	}
	fk := make([]Value, len(s.FK))
	for k, p := range s.FK {
		fk[k] = ch.Left.Values[p]
	}
	ch.Left.FK = fk
	return nil
}

// derive turns one Output of a step into the next step's left changes: a
// truncate empties it, deletes delete, upserts upsert the whole row, and a
// right update upserts the rows with their earlier columns unchanged (the
// engine fills them from the next step's stored rows, as it fills
// unchanged TOAST values).
func derive(o Output, spec Spec) (out []Change, fanOut int, err error) {
	if o.Truncate {
		out = append(out, Change{Kind: LeftTruncate})
	}
	if o.NullRight {
		return nil, 0, ErrChainNullRight
	}
	npk := len(spec.PK)
	for _, pk := range o.Deletes {
		out = append(out, Change{Kind: LeftDelete, Left: LeftRow{PK: pk}})
	}
	for _, row := range o.Upserts {
		out = append(out, Change{Kind: LeftUpsert, Left: LeftRow{PK: row[:npk:npk], Values: row[npk:]}})
	}
	for _, u := range o.RightUpdates {
		for _, pk := range u.Keys {
			values := make([]Value, spec.LeftValues, spec.LeftValues+len(u.Right))
			for k := range values {
				values[k] = ToastValue()
			}
			values = append(values, u.Right...)
			out = append(out, Change{Kind: LeftUpsert, Left: LeftRow{PK: pk, Values: values}})
		}
		fanOut += len(u.Keys)
	}
	return out, fanOut, nil
}

// project maps an Output of the last step to the target's columns.
func (c *Chain) project(o Output) Output {
	p := Output{Truncate: o.Truncate, NullRight: o.NullRight && len(c.outRight) > 0, Deletes: o.Deletes}
	for _, row := range o.Upserts {
		r := make(Row, len(c.out))
		for k, pos := range c.out {
			r[k] = row[pos]
		}
		p.Upserts = append(p.Upserts, r)
	}
	for _, u := range o.RightUpdates {
		if len(c.outRight) == 0 {
			continue // the target shows none of the last entry's columns
		}
		right := make([]Value, len(c.outRight))
		for k, pos := range c.outRight {
			right[k] = u.Right[pos]
		}
		p.RightUpdates = append(p.RightUpdates, RightUpdate{Keys: u.Keys, Right: right})
	}
	return p
}
