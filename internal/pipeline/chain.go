package pipeline

import (
	"context"
	"errors"
	"fmt"

	"github.com/fkmat/fkmat/cdc"
	"github.com/fkmat/fkmat/internal/plan"
	"github.com/fkmat/fkmat/join"
	"github.com/fkmat/fkmat/redisstore"
)

// Chain is a join of more than two tables: a join.Chain of steps, one per
// entry, each with its own Redis state (docs/nway.md).
type Chain struct {
	joinBase
	chain *join.Chain
	steps []*chainStep
}

var (
	_ Join  = (*Chain)(nil)
	_ State = (*chainState)(nil)
)

// chainStep is one step's Redis state and the overlays its engine reads it
// through (as Pair's pending and older).
type chainStep struct {
	store          *redisstore.Store
	pending, older *join.Pending
}

// NewChain returns the join p of more than two tables over one Redis state
// per entry (stores, in entry order); each step's engine reads pageSize
// dependents at a time, and a fan-out through an entry before the last is
// written in pages of pageRows rows.
func NewChain(p *plan.JoinPlan, stores []*redisstore.Store, pageSize, pageRows int) (*Chain, error) {
	l := plan.ChainOf(p)
	if len(stores) != len(l.Steps) {
		return nil, fmt.Errorf("join %q: %d states for %d entries", p.Name, len(stores), len(l.Steps))
	}
	c := &Chain{}
	readers := make([]join.StateReader, len(l.Steps))
	for i, store := range stores {
		older := join.NewPending(store)
		pending := join.NewPending(older)
		c.steps = append(c.steps, &chainStep{store: store, pending: pending, older: older})
		readers[i] = pending
		l.Steps[i].Spec.PageSize = pageSize
	}
	jc, err := join.NewChain(l.Steps, readers, l.Out)
	if err != nil {
		return nil, fmt.Errorf("join %q: %w", p.Name, err)
	}
	jc.SetPageRows(pageRows)
	c.chain = jc
	c.joinBase = joinBase{plan: p, st: newChainState(c.steps), mapper: newChainMapper(p, l)}
	return c, nil
}

func (c *Chain) Stores() []*redisstore.Store {
	out := make([]*redisstore.Store, len(c.steps))
	for i, s := range c.steps {
		out[i] = s.store
	}
	return out
}

// Stats sums the steps' engine counters.
func (c *Chain) Stats() join.Stats {
	var s join.Stats
	for _, e := range c.chain.Engines() {
		s.Add(e.Stats())
	}
	return s
}

func (c *Chain) Resume(ctx context.Context) (Resumed, error) {
	r, err := c.resume(ctx)
	if err != nil {
		return r, err
	}
	for i, s := range c.steps {
		if cp := s.store.Checkpoint(); cp > r.Checkpoint {
			if r.Ahead == nil {
				r.Ahead = map[int]cdc.LSN{}
			}
			r.Ahead[i] = cp
		}
	}
	return r, nil
}

func (c *Chain) apply(ctx context.Context, changes []join.Change, bound cdc.LSN, emit func(context.Context, join.Output) error,
	flush func(context.Context, join.Mutations) error) (join.Mutations, error) {
	var pages func(context.Context, []join.Mutations) error
	if flush != nil {
		pages = func(ctx context.Context, muts []join.Mutations) error { return flush(ctx, join.ChainMutations(muts)) }
	}
	muts, err := c.chain.ApplyPrefix(ctx, changes, c.prefix(bound), emit, pages)
	if errors.Is(err, join.ErrChainNullRight) {
		// Nothing of the batch is committed. Once everything has stopped,
		// the daemon drops the join's state, so that the restart finds it
		// lost and rebuilds it (or refuses, naming fkmat backfill --force,
		// with --on-lost-state refuse).
		return join.Mutations{}, &RebuildError{Join: c, Err: err}
	}
	if err != nil {
		return join.Mutations{}, err
	}
	return join.ChainMutations(muts), nil
}

// located returns err as it is: a chain step's change index is its own,
// not the batch's.
func (c *Chain) located(_ []txnSpan, err error) error { return err }

// prefix returns how many leading steps lack what a batch ending at bound
// brings: a step has it when its checkpoint is at least bound. The states
// commit from the last step to the first, so the steps that have it are a
// suffix, and the pipeline's batches never straddle a step's checkpoint
// (Resumed.Ahead).
func (c *Chain) prefix(bound cdc.LSN) int {
	n := 0
	for n < len(c.steps) && c.steps[n].store.Checkpoint() < bound {
		n++
	}
	return n
}

// overlay sets each step's in-flight mutations, as Pair.overlay.
func (c *Chain) overlay(older, newer *join.Mutations) error {
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
		m, err := st.store.Meta(ctx)
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
	low := s.steps[0].store.Checkpoint()
	for _, st := range s.steps[1:] {
		low = min(low, st.store.Checkpoint())
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
		if err := s.steps[i].store.Commit(ctx, m.Steps[i], lsn); err != nil {
			return fmt.Errorf("step %d: %w", i, err)
		}
	}
	return nil
}

// CommitPartial writes a chunk of a large transaction to the steps that
// lack it (m.Steps).
func (s *chainState) CommitPartial(ctx context.Context, m join.Mutations, txn cdc.LSN) error {
	for i := range m.Steps {
		if err := s.steps[i].store.CommitPartial(ctx, m.Steps[i], txn); err != nil {
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
		if err := s.steps[i].store.FinishPartial(ctx, lsn); err != nil {
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
		undone, err := st.store.Recover(ctx)
		if err != nil {
			return any, fmt.Errorf("step %d: %w", i, err)
		}
		any = any || undone
		s.partial[i] = false
	}
	return any, nil
}
