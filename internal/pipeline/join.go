package pipeline

import (
	"context"
	"errors"
	"fmt"

	"github.com/fkmat/fkmat/cdc"
	"github.com/fkmat/fkmat/internal/plan"
	"github.com/fkmat/fkmat/internal/wal"
	"github.com/fkmat/fkmat/join"
	"github.com/fkmat/fkmat/redisstore"
)

// Join is one maintained join as the pipeline runs it: its plan, the
// engine that joins its changes, and its Redis state. A two-table join is
// a *Pair, a join of more than two tables a *Tree; the pipeline treats
// both alike through this interface.
type Join interface {
	// Plan is the join's resolved definition.
	Plan() *plan.JoinPlan
	// Stores returns the join's Redis states: one, or one per table of a
	// tree (nil in the pipeline's unit tests, whose states are fakes).
	Stores() []*redisstore.Store
	// Stats returns the join's engine counters.
	Stats() join.Stats
	// Resume reads the join's state before a run: its epoch (which every
	// commit then checks), its checkpoint, and the undo of a large
	// transaction a crash cut short.
	Resume(ctx context.Context) (Resumed, error)

	// apply joins a batch's changes, emitting the target's changes, and
	// returns the state's mutations. bound says what the batch brings: a
	// table of a tree whose checkpoint is at least bound has it already (a
	// replay after a crash between the tables' commits), and its changes
	// are left out; the target has the batch then.
	apply(ctx context.Context, changes []join.Change, bound wal.LSN, emit func(context.Context, join.Output) error) (join.Mutations, error)
	// overlay sets the in-flight mutations the engine reads through: older
	// (the batch in its state commit) and newer (the next one); nil for
	// none.
	overlay(older, newer *join.Mutations) error
	// recycle gives back the containers of a batch's mutations and
	// outputs, committed and no longer overlaid, for the next batches.
	recycle(m *join.Mutations, outs []join.Output)
	// located wraps an engine error with where it happened in the stream.
	located(spans []txnSpan, err error) error

	// The rest is common to every shape (joinBase).
	state() State
	uses(rel *cdc.Relation) bool
	changes(txns []*cdc.Txn) ([]join.Change, []txnSpan, error)
	mapChunk(t *cdc.Txn) ([]join.Change, error)
	checkState(ctx context.Context) error
}

// Resumed is what a join's state says at the start of a run.
type Resumed struct {
	// Checkpoint is the source position the state has applied through
	// (the lowest of a tree's tables).
	Checkpoint wal.LSN
	// Undone says a large transaction a crash cut short was rolled back; it
	// is replayed.
	Undone bool
	// Ahead are the checkpoints of a tree's tables ahead of the lowest (a
	// crash between the tables' commits), by table; the tables behind
	// catch up first, and no batch straddles one of them.
	Ahead map[int]wal.LSN
}

// joinBase is what every shape of join has: its plan, its state as the
// pipeline commits it, the mapping of source changes to join changes,
// and the epoch of the state the run started with.
type joinBase struct {
	plan   *plan.JoinPlan
	st     State
	mapper changeMapper
	epoch  string
	// batch is the last batch's join changes, emptied: the next batch's
	// room (the engines keep none of the slice past a batch).
	batch []join.Change
}

func (b *joinBase) Plan() *plan.JoinPlan        { return b.plan }
func (b *joinBase) state() State                { return b.st }
func (b *joinBase) uses(rel *cdc.Relation) bool { return b.mapper.uses(rel) }
func (b *joinBase) errorf(err error) error      { return fmt.Errorf("join %q: %w", b.plan.Name, err) }
func (b *joinBase) mapChunk(t *cdc.Txn) ([]join.Change, error) {
	return b.appendChunk(make([]join.Change, 0, len(t.Changes)), t)
}

// resume reads the state's epoch, undoes a partial large transaction and
// returns the checkpoint.
func (b *joinBase) resume(ctx context.Context) (Resumed, error) {
	meta, err := b.st.Meta(ctx)
	if err != nil {
		return Resumed{}, b.errorf(err)
	}
	b.epoch = meta.Epoch
	undone, err := b.st.Recover(ctx)
	if err != nil {
		return Resumed{}, b.errorf(err)
	}
	return Resumed{Checkpoint: b.st.Checkpoint(), Undone: undone}, nil
}

// checkState checks, after the engine's reads and before the target
// commit, that the join's Redis state is still the one the run started
// with. If it vanished (FLUSHALL, eviction) the reads may have seen empty
// state and the output would be wrong: nothing is committed. A loss after
// this check is harmless: the reads came before it.
func (b *joinBase) checkState(ctx context.Context) error {
	m, err := b.st.Meta(ctx)
	if errors.Is(err, redisstore.ErrNoState) || (err == nil && m.Epoch != b.epoch) {
		return b.errorf(ErrStateChanged)
	}
	if err != nil {
		return b.errorf(err)
	}
	return nil
}

// txnSpan says that the join changes from index start on come from txn.
type txnSpan struct {
	start int
	txn   *cdc.Txn
}

// changes maps the transactions this join has not applied yet to join
// changes, and says which transaction each comes from.
func (b *joinBase) changes(txns []*cdc.Txn) ([]join.Change, []txnSpan, error) {
	done := b.st.Checkpoint()
	n := 0
	for _, t := range txns {
		n += len(t.Changes)
	}
	if cap(b.batch) < n || cap(b.batch) > 4*max(n, 4096) {
		b.batch = make([]join.Change, 0, n)
	}
	clear(b.batch[:cap(b.batch)])
	out := b.batch[:0]
	spans := make([]txnSpan, 0, len(txns))
	for _, t := range txns {
		if t.EndLSN <= done {
			continue
		}
		spans = append(spans, txnSpan{start: len(out), txn: t})
		var err error
		if out, err = b.appendChunk(out, t); err != nil {
			return nil, nil, err
		}
	}
	b.batch = out
	return out, spans, nil
}

// appendChunk appends the join changes of t's row changes to out.
func (b *joinBase) appendChunk(out []join.Change, t *cdc.Txn) ([]join.Change, error) {
	for i := range t.Changes {
		var err error
		if out, err = b.mapper.appendChanges(out, &t.Changes[i]); err != nil {
			return nil, fmt.Errorf("join %q, transaction %d at %s: %w", b.plan.Name, t.Xid, t.CommitLSN, err)
		}
	}
	return out, nil
}
