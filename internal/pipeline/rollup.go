package pipeline

import (
	"context"
	"fmt"
	"slices"

	"github.com/fkmat/fkmat/internal/plan"
	"github.com/fkmat/fkmat/join"
)

// A roll-up runs in a Tree as two parts: a join.Rollup over its children
// (their changes and state are numbered after the tree's tables), whose
// results per parent become the rows of an entry of the tree (the last
// tables of its spec), which the left table references by its own key.
// The roll-up runs first in each batch, and its results are changes of
// that entry at the batch's end: the tree then writes them into the
// parents' rows with the rest of the batch.
//
// The children's states commit after every table of the tree
// (treeState.Commit): after a crash between, the tree's tables have the
// batch and skip it, and the roll-up, behind, applies it again from the
// same state and gives the same results.
//
// In a large transaction, the results of the chunks before the last are
// held (the latest per parent) and join the last chunk's: a transaction
// that changes 10^5 children of one parent writes its row once. The
// chunks' state commits are undone together after a crash, and the target
// transaction spans them all, so nothing reads the held results early.

// heldResults are a roll-up's results held over the chunks of a large
// transaction, in first-touch order.
type heldResults struct {
	order []join.Key
	by    map[join.Key]join.Change
}

// holdChunks says whether the batches to come are chunks of a large
// transaction before its last (hold), and whether one starts (drop what
// an abandoned attempt held).
func (t *Tree) holdChunks(hold, start bool) {
	t.holding = hold
	if start {
		clear(t.held)
	}
}

// hold keeps result c of roll-up k for the end of the transaction; a
// later result of the parent replaces it.
func (t *Tree) hold(k int, c join.Change) error {
	key, err := join.EncodeKey(t.rollups[k].Spec().Parent, c.Right.Key)
	if err != nil {
		return fmt.Errorf("roll-up %s: parent key: %w", t.rollups[k].Spec().Name, err)
	}
	h := t.held[k]
	if h == nil {
		h = &heldResults{by: map[join.Key]join.Change{}}
		t.held[k] = h
	}
	if _, ok := h.by[key]; !ok {
		h.order = append(h.order, key)
	}
	h.by[key] = c
	return nil
}

// release appends roll-up k's held results to out.
func (t *Tree) release(k int, out []join.Change) []join.Change {
	h := t.held[k]
	if h == nil {
		return out
	}
	for _, key := range h.order {
		out = append(out, h.by[key])
	}
	delete(t.held, k)
	return out
}

// RollupSpecOf returns the join.RollupSpec of roll-up k of p.
func RollupSpecOf(p *plan.JoinPlan, k int) join.RollupSpec {
	r := &p.Rollups[k]
	spec := join.RollupSpec{Name: r.Table.Table.String(), Parent: plan.Families(p.Left.Key), Child: plan.Families(r.Table.Key)}
	for _, c := range r.Table.Key {
		spec.ChildTypes = append(spec.ChildTypes, c.Type)
	}
	for _, in := range r.Inputs {
		spec.Inputs = append(spec.Inputs, in.Type)
	}
	for _, c := range r.Table.Key {
		spec.KeyInputs = append(spec.KeyInputs, slices.IndexFunc(r.Inputs, func(in plan.SourceColumn) bool { return in.Expr == "" && in.Name == c.Name }))
	}
	for _, a := range r.Aggregates {
		spec.Aggregates = append(spec.Aggregates, join.RollupAggregate{Func: a.Func, Input: a.Input, OrderBy: a.OrderBy, Desc: a.Desc, Limit: a.Limit})
	}
	return spec
}

// rollupAt returns the roll-up whose children's changes and state have
// number t (-1: a table of the tree), and the tree table of its results.
func (t *Tree) rollupAt(n int) (k, results int) {
	trees := len(t.layout.Spec.Tables)
	if n < trees {
		return -1, -1
	}
	k = n - trees
	return k, trees - len(t.rollups) + k
}

// rollUp runs the batch's children's changes through their roll-ups. It
// returns the tree's changes, with each roll-up's results appended as
// changes of its entry, and the roll-ups' mutations. known says the
// tree's tables are where the roll-ups are (no table is ahead after a
// crash): a result then carries its parent's results before the batch,
// which the entry's stored row holds too, unless held results of a large
// transaction are in between.
func (t *Tree) rollUp(ctx context.Context, changes []join.Change, known bool) ([]join.Change, []join.Mutations, error) {
	if len(t.rollups) == 0 {
		return changes, nil, nil
	}
	// Each roll-up's changes and the tree's, sized exactly: a batch of
	// children alone keeps only the results.
	counts := make([]int, len(t.rollups))
	trees := 0
	for _, c := range changes {
		if k, _ := t.rollupAt(c.Table); k >= 0 {
			counts[k]++
		} else {
			trees++
		}
	}
	per := make([][]join.RollupChange, len(t.rollups))
	kept := make([]join.Change, 0, trees)
	for _, c := range changes {
		k, _ := t.rollupAt(c.Table)
		if k < 0 {
			kept = append(kept, c)
			continue
		}
		rc := join.RollupChange{Kind: c.Kind, Key: c.Left.PK, Parent: c.Left.FK, Values: c.Left.Values, IfPresent: c.IfPresent}
		switch c.Kind {
		case join.LeftTruncate, join.RightTruncate:
			rc.Kind = join.LeftTruncate
		case join.LeftKeyChange:
			rc.OldKey = c.OldKey
		case join.LeftUpsert, join.LeftDelete:
		default:
			return nil, nil, fmt.Errorf("roll-up %d: change kind %s", k, c.Kind)
		}
		if per[k] == nil {
			per[k] = make([]join.RollupChange, 0, counts[k])
		}
		per[k] = append(per[k], rc)
	}
	muts := make([]join.Mutations, len(t.rollups))
	for k, r := range t.rollups {
		if len(per[k]) > 0 {
			_, results := t.rollupAt(len(t.layout.Spec.Tables) + k)
			m, outs, err := r.Apply(ctx, t.tables[len(t.layout.Spec.Tables)+k].pending, per[k])
			if err != nil {
				return nil, nil, err
			}
			muts[k] = m
			kept = slices.Grow(kept, len(outs)+1)
			if m.ClearLeft {
				// Every parent's results so far are void.
				delete(t.held, k)
				kept = append(kept, join.Change{Table: results, Kind: join.RightTruncate})
			}
			for _, o := range outs {
				c := join.Change{Table: results, Kind: join.RightUpsert, Right: join.RightRow{Key: o.Parent, Values: o.Values}}
				if o.Values == nil {
					c.Kind = join.RightDelete
				}
				if !t.holding && t.held[k] == nil {
					c.Known, c.Before = known && o.Known, o.Before
					kept = append(kept, c)
					continue
				}
				if err := t.hold(k, c); err != nil {
					return nil, nil, err
				}
			}
		}
		if !t.holding {
			kept = t.release(k, kept)
		}
	}
	return kept, muts, nil
}
