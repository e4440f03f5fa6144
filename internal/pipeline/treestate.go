package pipeline

import (
	"context"
	"errors"
	"fmt"

	"github.com/fkmat/fkmat/internal/wal"
	"github.com/fkmat/fkmat/join"
	"github.com/fkmat/fkmat/redisstore"
)

var _ State = (*treeState)(nil)

// tableState is one table's Redis state and the overlays the engine reads
// it through (as Pair's pending and older).
type tableState struct {
	store          State
	pending, older *join.Pending
}

// treeState is the Redis state of a join of more than two tables as the
// pipeline commits it: one state per table, each with its own checkpoint.
// A table's mutations depend only on its own state, so the order of the
// commits does not matter: after a crash between them, the tables behind
// get what they lack (Tree.apply) and the ones ahead skip it.
type treeState struct {
	tables []*tableState
	// trees counts the tree's tables; the roll-ups' children's states
	// follow them, and commit after them (pipeline/rollup.go).
	trees int
	// partial marks the tables written by CommitPartial since the last
	// FinishPartial or Recover (large transactions are not pipelined).
	partial []bool
}

func newTreeState(tables []*tableState, trees int) *treeState {
	return &treeState{tables: tables, trees: trees, partial: make([]bool, len(tables))}
}

// commitOrder is the order the tables commit in: the tree's from the last
// to the first, then the roll-ups' children's.
func (s *treeState) commitOrder(n int) []int {
	order := make([]int, 0, n)
	for i := min(s.trees, n) - 1; i >= 0; i-- {
		order = append(order, i)
	}
	for i := s.trees; i < n; i++ {
		order = append(order, i)
	}
	return order
}

var errTreeRead = errors.New("a join tree's state is read table by table, through each table's overlays")

func (s *treeState) GetLeft(context.Context, []join.Key) (map[join.Key]join.LeftState, error) {
	return nil, errTreeRead
}

func (s *treeState) GetRight(context.Context, []join.Key) (map[join.Key]join.RightState, error) {
	return nil, errTreeRead
}

func (s *treeState) Dependents(context.Context, join.Key, join.Key, int) ([]join.Key, error) {
	return nil, errTreeRead
}

func (s *treeState) DependentsMany(context.Context, []join.Key, []int) ([][]join.Key, error) {
	return nil, errTreeRead
}

// Meta returns the first table's meta; a table without state, or with
// another epoch (replaced under the daemon), is ErrNoState.
func (s *treeState) Meta(ctx context.Context) (redisstore.Meta, error) {
	var first redisstore.Meta
	for i, st := range s.tables {
		m, err := st.store.Meta(ctx)
		if err != nil {
			return redisstore.Meta{}, fmt.Errorf("table %d: %w", i, err)
		}
		if i == 0 {
			first = m
		} else if m.Epoch != first.Epoch {
			return redisstore.Meta{}, fmt.Errorf("%w: table %d has epoch %s, table 0 %s", redisstore.ErrNoState, i, m.Epoch, first.Epoch)
		}
	}
	return first, nil
}

// Checkpoint is the lowest of the tables' checkpoints: the first table's.
func (s *treeState) Checkpoint() wal.LSN {
	low := s.tables[0].store.Checkpoint()
	for _, st := range s.tables[1:] {
		low = min(low, st.store.Checkpoint())
	}
	return low
}

// Commit commits m's tables in commitOrder, each at lsn (a table that has
// lsn already skips it). Mutations without tables (a batch that
// touched no table of the join) advance every table.
func (s *treeState) Commit(ctx context.Context, m join.Mutations, lsn wal.LSN) error {
	if m.Tables == nil {
		if !m.Empty() {
			return errors.New("commit the state of a join of several tables: mutations without tables")
		}
		m.Tables = make([]join.Mutations, len(s.tables))
	}
	for _, i := range s.commitOrder(len(m.Tables)) {
		if err := s.tables[i].store.Commit(ctx, m.Tables[i], lsn); err != nil {
			return fmt.Errorf("table %d: %w", i, err)
		}
	}
	return nil
}

// CommitPartial writes a chunk of a large transaction (txn, its commit
// position) to the tables that lack it.
func (s *treeState) CommitPartial(ctx context.Context, m join.Mutations, txn wal.LSN) error {
	for i := range m.Tables {
		if s.tables[i].store.Checkpoint() > txn {
			continue // the table has the whole transaction
		}
		if err := s.tables[i].store.CommitPartial(ctx, m.Tables[i], txn); err != nil {
			return fmt.Errorf("table %d: %w", i, err)
		}
		s.partial[i] = true
	}
	return nil
}

// FinishPartial finishes the large transaction on the tables it was written
// to, from the last to the first.
func (s *treeState) FinishPartial(ctx context.Context, lsn wal.LSN) error {
	for _, i := range s.commitOrder(len(s.tables)) {
		if !s.partial[i] {
			continue
		}
		if err := s.tables[i].store.FinishPartial(ctx, lsn); err != nil {
			return fmt.Errorf("table %d: %w", i, err)
		}
		s.partial[i] = false
	}
	return nil
}

// Recover rolls back the partial transaction of every table that has one.
func (s *treeState) Recover(ctx context.Context) (bool, error) {
	any := false
	for i, st := range s.tables {
		undone, err := st.store.Recover(ctx)
		if err != nil {
			return any, fmt.Errorf("table %d: %w", i, err)
		}
		any = any || undone
		s.partial[i] = false
	}
	return any, nil
}
