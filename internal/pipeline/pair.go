package pipeline

import (
	"context"
	"errors"

	"github.com/fkmat/fkmat/internal/plan"
	"github.com/fkmat/fkmat/internal/wal"
	"github.com/fkmat/fkmat/join"
	"github.com/fkmat/fkmat/redisstore"
)

// Pair is a join of two tables: one engine over one Redis state.
type Pair struct {
	joinBase
	engine *join.Engine
	// store is the join's Redis state (nil in the unit tests: st is a fake).
	store *redisstore.Store
	// pending is the engine's reader: the state, overlaid with the
	// mutations of the batches whose commits are in flight, the older
	// through older (nearer the state), the newer through pending.
	pending, older *join.Pending
}

var _ Join = (*Pair)(nil)

// NewPair returns the two-table join p over its Redis state, its engine
// reading pageSize dependents at a time.
func NewPair(p *plan.JoinPlan, store *redisstore.Store, pageSize int) (*Pair, error) {
	j, err := newPair(p, store, pageSize)
	if err != nil {
		return nil, err
	}
	j.store = store
	return j, nil
}

// newPair returns the join over any State (the unit tests' fakes).
func newPair(p *plan.JoinPlan, st State, pageSize int) (*Pair, error) {
	spec := p.Spec
	spec.PageSize = pageSize
	older := join.NewPending(st)
	pending := join.NewPending(older)
	engine, err := join.NewEngine(spec, pending)
	if err != nil {
		return nil, err
	}
	return &Pair{joinBase: joinBase{plan: p, st: st, mapper: newMapper(p)}, engine: engine, pending: pending, older: older}, nil
}

func (j *Pair) Stores() []*redisstore.Store {
	if j.store == nil {
		return nil
	}
	return []*redisstore.Store{j.store}
}

func (j *Pair) Stats() join.Stats { return j.engine.Stats() }

func (j *Pair) Resume(ctx context.Context) (Resumed, error) { return j.resume(ctx) }

func (j *Pair) apply(ctx context.Context, changes []join.Change, _ wal.LSN, emit func(context.Context, join.Output) error) (join.Mutations, error) {
	return j.engine.Apply(ctx, changes, emit)
}

func (j *Pair) overlay(older, newer *join.Mutations) error {
	err := j.older.SetFrom(older, j.pending) // the last batch's newer is often this one's older
	if err2 := j.pending.Set(newer); err == nil {
		err = err2
	}
	return err
}

func (j *Pair) recycle(m *join.Mutations, outs []join.Output) { j.engine.Recycle(m, outs) }

// located wraps an engine error of this join with where it happened: the
// source transaction of the failed change, its table and key columns.
func (j *Pair) located(spans []txnSpan, err error) error {
	ce, ok := errors.AsType[*join.ChangeError](err)
	if !ok {
		return err
	}
	e := &TxnError{Join: j.plan.Name, err: err}
	tp := &j.plan.Right
	if ce.Left() {
		tp = &j.plan.Left
	}
	e.Table = tp.Table.String()
	for _, k := range tp.Key {
		e.KeyColumns = append(e.KeyColumns, k.Name)
	}
	for _, sp := range spans {
		if sp.start > ce.Index {
			break
		}
		e.LSN = sp.txn.CommitLSN
	}
	return e
}
