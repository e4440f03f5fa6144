package fkmat

import (
	"context"
	"errors"
	"fmt"

	"github.com/fkmat/fkmat/internal/plan"

	"github.com/fkmat/fkmat/cdc"
	"github.com/fkmat/fkmat/join"
	"github.com/fkmat/fkmat/redisstore"
)

// changeMapper turns cdc changes into a join's changes: the two-table
// mapper, or the chainMapper of a list-form join.
type changeMapper interface {
	appendChanges(dst []join.Change, c *cdc.Change) ([]join.Change, error)
	uses(rel *cdc.Relation) bool
}

var (
	_ changeMapper = (*mapper)(nil)
	_ changeMapper = (*chainMapper)(nil)
	_ stateStore   = (*chainState)(nil)
)

// uses reports whether rel is a table of the chain.
func (m *chainMapper) uses(rel *cdc.Relation) bool { return len(m.tablesOf(rel)) > 0 }

// chainRunner is what a list-form join adds to its joinRunner: the
// join.Chain and one Redis state per step (docs/nway.md).
type chainRunner struct {
	chain  *join.Chain
	layout plan.ChainLayout
	steps  []*chainStep
	state  *chainState
}

// chainStep is one step's Redis state and the overlays its engine reads it
// through (as joinRunner's pending and older).
type chainStep struct {
	store          *redisstore.Store
	state          stateStore // store, or a fake in tests
	pending, older *join.Pending
}

// stores returns the join's Redis states: its one, or each chain step's.
func (jr *joinRunner) stores() []*redisstore.Store {
	if jr.chain == nil {
		return []*redisstore.Store{jr.store}
	}
	out := make([]*redisstore.Store, len(jr.chain.steps))
	for i, s := range jr.chain.steps {
		out[i] = s.store
	}
	return out
}

// waitShort sums the Redis writes that run --redis-wait-replicas could not
// confirm, over every join's states, and says why the last of them (of
// some state) came short.
func (p *pipeline) waitShort() (n int64, why string) {
	for _, jr := range p.joins {
		if jr.store == nil && jr.chain == nil {
			continue // a pipeline test's fake
		}
		for _, s := range jr.stores() {
			if k := s.WaitShort(); k > 0 {
				n += k
				why = s.LastWaitShort()
			}
		}
	}
	return n, why
}

// sizes returns what each of the join's states is sized for at Init.
func (d *daemon) sizes(ctx context.Context, p *plan.JoinPlan) []redisstore.Size {
	if p.Edges == nil {
		return []redisstore.Size{{LeftRows: d.estimate(ctx, p.Left.Table), RightRows: d.estimate(ctx, p.Right.Table)}}
	}
	left := d.estimate(ctx, p.Left.Table)
	out := make([]redisstore.Size, len(p.Edges))
	for i, e := range p.Edges {
		out[i] = redisstore.Size{LeftRows: left, RightRows: d.estimate(ctx, e.Table.Table)}
	}
	return out
}

// openChain opens a list-form join: a Redis state per step, each read by
// its step's engine through two overlays (the batches whose commits are in
// flight), and the join.Chain of the steps.
func (d *daemon) openChain(ctx context.Context, p *plan.JoinPlan) (*joinRunner, error) {
	l := plan.ChainOf(p)
	cr := &chainRunner{layout: l}
	readers := make([]join.StateReader, len(l.Steps))
	for i := range l.Steps {
		store, err := redisstore.Open(ctx, d.rdb, redisstore.Config{
			Prefix: RedisStepPrefix(d.cfg.Slot, p.Name, i), SubShards: d.opts.SubShards, RowShards: d.opts.RowShards,
			WaitReplicas: d.opts.RedisWaitReplicas,
		})
		if err != nil {
			return nil, fmt.Errorf("join %q: step %d: %w", p.Name, i, err)
		}
		older := join.NewPending(store)
		pending := join.NewPending(older)
		cr.steps = append(cr.steps, &chainStep{store: store, state: store, pending: pending, older: older})
		readers[i] = pending
		l.Steps[i].Spec.PageSize = d.opts.PageSize
	}
	c, err := join.NewChain(l.Steps, readers, l.Out)
	if err != nil {
		return nil, fmt.Errorf("join %q: %w", p.Name, err)
	}
	c.SetPageRows(d.opts.ChainPageRows)
	cr.chain, cr.state = c, newChainState(cr.steps)
	return &joinRunner{plan: p, state: cr.state, mapper: newChainMapper(p, l), chain: cr}, nil
}

// RedisStepPrefix is the Redis key prefix of the state of entry i (step i)
// of a join of more than two tables: no step's prefix is a prefix of
// another's, nor of another join's.
func RedisStepPrefix(slot, joinName string, i int) string {
	return fmt.Sprintf("%s~%d", RedisPrefix(slot, joinName), i)
}

// prefix returns how many leading steps lack what a batch ending at bound
// brings: a step has it when its checkpoint is at least bound. The states
// commit from the last step to the first, so the steps that have it are a
// suffix, and the pipeline's batches never straddle a step's checkpoint
// (chainCuts).
func (c *chainRunner) prefix(bound cdc.LSN) int {
	n := 0
	for n < len(c.steps) && c.steps[n].state.Checkpoint() < bound {
		n++
	}
	return n
}

// overlay sets each step's in-flight mutations, as joinRunner.overlay.
func (c *chainRunner) overlay(older, newer *join.Mutations) error {
	step := func(m *join.Mutations, i int) *join.Mutations {
		if m == nil || i >= len(m.Steps) {
			return nil
		}
		return &m.Steps[i]
	}
	var first error
	for i, s := range c.steps {
		err := s.older.Set(step(older, i))
		if err2 := s.pending.Set(step(newer, i)); err == nil {
			err = err2
		}
		if first == nil {
			first = err
		}
	}
	return first
}

// stats sums the steps' engine counters.
func (c *chainRunner) stats() join.Stats {
	var s join.Stats
	for _, e := range c.chain.Engines() {
		st := e.Stats()
		s.Instructions += st.Instructions
		s.Responses += st.Responses
		s.StaleResponses += st.StaleResponses
		s.InnerNullFKDrops += st.InnerNullFKDrops
		s.FanoutRows += st.FanoutRows
	}
	return s
}

// chainState is the Redis state of a list-form join as the pipeline
// commits it: one state per step, each with its own checkpoint, committed
// from the last step to the first.
type chainState struct {
	steps []*chainStep
	// partial marks the steps written by CommitPartial since the last
	// FinishPartial or Recover (large transactions are not pipelined).
	partial []bool
}

func newChainState(steps []*chainStep) *chainState {
	return &chainState{steps: steps, partial: make([]bool, len(steps))}
}

var errChainRead = errors.New("a join chain's state is read step by step, through each step's overlays")

func (s *chainState) GetLeft(context.Context, []join.Key) (map[join.Key]join.LeftState, error) {
	return nil, errChainRead
}

func (s *chainState) GetRight(context.Context, []join.Key) (map[join.Key]join.RightState, error) {
	return nil, errChainRead
}

func (s *chainState) Dependents(context.Context, join.Key, join.Key, int) ([]join.Key, error) {
	return nil, errChainRead
}

func (s *chainState) DependentsMany(context.Context, []join.Key, []int) ([][]join.Key, error) {
	return nil, errChainRead
}

// Meta returns the first step's meta; a step without state, or with
// another epoch (replaced under the daemon), is ErrNoState.
func (s *chainState) Meta(ctx context.Context) (redisstore.Meta, error) {
	var first redisstore.Meta
	for i, st := range s.steps {
		m, err := st.state.Meta(ctx)
		if err != nil {
			return redisstore.Meta{}, fmt.Errorf("step %d: %w", i, err)
		}
		if i == 0 {
			first = m
		} else if m.Epoch != first.Epoch {
			return redisstore.Meta{}, fmt.Errorf("%w: step %d has epoch %s, step 0 %s", redisstore.ErrNoState, i, m.Epoch, first.Epoch)
		}
	}
	return first, nil
}

// Checkpoint is the lowest of the steps' checkpoints: the first step's.
func (s *chainState) Checkpoint() cdc.LSN {
	low := s.steps[0].state.Checkpoint()
	for _, st := range s.steps[1:] {
		low = min(low, st.state.Checkpoint())
	}
	return low
}

// Commit commits m's steps from the last to the first, each at lsn (a step
// that has lsn already skips it). Mutations without steps (a batch that
// touched no table of the join) advance every step.
func (s *chainState) Commit(ctx context.Context, m join.Mutations, lsn cdc.LSN) error {
	if m.Steps == nil {
		if !m.Empty() {
			return errors.New("commit a join chain's state: mutations without steps")
		}
		m.Steps = make([]join.Mutations, len(s.steps))
	}
	for i := len(m.Steps) - 1; i >= 0; i-- {
		if err := s.steps[i].state.Commit(ctx, m.Steps[i], lsn); err != nil {
			return fmt.Errorf("step %d: %w", i, err)
		}
	}
	return nil
}

// CommitPartial writes a chunk of a large transaction to the steps that
// lack it (m.Steps).
func (s *chainState) CommitPartial(ctx context.Context, m join.Mutations, txn cdc.LSN) error {
	for i := range m.Steps {
		if err := s.steps[i].state.CommitPartial(ctx, m.Steps[i], txn); err != nil {
			return fmt.Errorf("step %d: %w", i, err)
		}
		s.partial[i] = true
	}
	return nil
}

// FinishPartial finishes the large transaction on the steps it was written
// to, from the last to the first.
func (s *chainState) FinishPartial(ctx context.Context, lsn cdc.LSN) error {
	for i := len(s.steps) - 1; i >= 0; i-- {
		if !s.partial[i] {
			continue
		}
		if err := s.steps[i].state.FinishPartial(ctx, lsn); err != nil {
			return fmt.Errorf("step %d: %w", i, err)
		}
		s.partial[i] = false
	}
	return nil
}

// Recover rolls back the partial transaction of every step that has one.
func (s *chainState) Recover(ctx context.Context) (bool, error) {
	any := false
	for i, st := range s.steps {
		undone, err := st.state.Recover(ctx)
		if err != nil {
			return any, fmt.Errorf("step %d: %w", i, err)
		}
		any = any || undone
		s.partial[i] = false
	}
	return any, nil
}
