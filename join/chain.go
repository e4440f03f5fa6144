package join

import (
	"context"
	"errors"
	"fmt"
	"slices"
)

// A Chain maintains a join of more than two tables (SPEC "Joins of more than
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
	c := &Chain{steps: slices.Clone(steps), out: slices.Clone(out)}
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
// on the target is passed to emit, in order, as in Engine.Apply.
func (c *Chain) Apply(ctx context.Context, changes []Change, emit func(context.Context, Output) error) ([]Mutations, error) {
	return c.ApplyPrefix(ctx, changes, len(c.steps), emit)
}

// ApplyPrefix is Apply on the first n steps only, for a replay after a
// crash: the states are committed from the last step to the first, so the
// steps that already have a batch are a suffix n, n+1, ... of the chain,
// and the target has it too. The first n steps recompute it from their
// states and inputs; what step n-1 would pass on is dropped (step n has
// it), and emit is not called unless n is every step. It returns the
// mutations of the first n steps.
func (c *Chain) ApplyPrefix(ctx context.Context, changes []Change, n int, emit func(context.Context, Output) error) ([]Mutations, error) {
	if n < 0 || n > len(c.steps) {
		return nil, fmt.Errorf("apply join chain: %d steps of %d", n, len(c.steps))
	}
	for _, ch := range changes {
		left := ch.Kind == LeftUpsert || ch.Kind == LeftDelete || ch.Kind == LeftKeyChange || ch.Kind == LeftTruncate
		if ch.Table < 0 || ch.Table > len(c.steps) || left != (ch.Table == 0) {
			return nil, fmt.Errorf("apply join chain: a %s change of table %d; the chain has %d tables, the left one 0", ch.Kind, ch.Table, len(c.steps)+1)
		}
	}
	muts := make([]Mutations, len(c.steps))
	// in holds the next step's left changes, derived from this step's
	// outputs; each table's own changes keep their order, which is all the
	// final state depends on.
	var in []Change
	for _, ch := range changes {
		if ch.Table == 0 {
			in = append(in, ch)
		}
	}
	for i, s := range c.steps[:n] {
		step := in
		for k := range step {
			if err := c.deriveFK(i, &step[k]); err != nil {
				return nil, err
			}
		}
		for _, ch := range changes {
			if ch.Table == i+1 {
				step = append(step, ch)
			}
		}
		next := []Change{}
		var sink func(context.Context, Output) error
		switch {
		case i == len(c.steps)-1:
			sink = func(ctx context.Context, o Output) error { return emit(ctx, c.project(o)) }
		case i == n-1:
			sink = func(context.Context, Output) error { return nil }
		default:
			sink = func(_ context.Context, o Output) error {
				d, err := derive(o, s.Spec)
				next = append(next, d...)
				return err
			}
		}
		m, err := c.engines[i].Apply(ctx, step, sink)
		if err != nil {
			return nil, fmt.Errorf("step %d: %w", i, err)
		}
		muts[i] = m
		in = next
	}
	return muts[:n], nil
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
func derive(o Output, spec Spec) ([]Change, error) {
	var out []Change
	if o.Truncate {
		out = append(out, Change{Kind: LeftTruncate})
	}
	if o.NullRight {
		return nil, ErrChainNullRight
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
	}
	return out, nil
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
