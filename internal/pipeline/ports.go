package pipeline

import (
	"context"

	"github.com/fkmat/fkmat/cdc"
	"github.com/fkmat/fkmat/internal/wal"
	"github.com/fkmat/fkmat/join"
	"github.com/fkmat/fkmat/redisstore"
	"github.com/fkmat/fkmat/sink"
)

// The pipeline reaches the outside through these consumer-side
// interfaces: the replication stream it reads and acknowledges, the target
// database its rows and checkpoints go to, and each join's Redis state. The
// daemon passes *cdc.Stream, SinkTarget and *redisstore.Store; the unit
// tests (pipeline_test.go) pass in-memory fakes.

// Source is the replication stream: whole transactions (or chunks of a
// large one) in commit order, and the acknowledgement of those applied.
// Ack promises that everything up to the position is committed in the
// target and in every join's state.
type Source interface {
	Next(ctx context.Context) (*cdc.Txn, error)
	Ack(lsn wal.LSN)
	Stats() cdc.StreamStats
}

// Target opens target transactions.
type Target interface {
	Begin(ctx context.Context) (TargetTx, error)
}

// TargetTx is one target transaction: rows, then the checkpoint, committed
// together.
type TargetTx interface {
	Apply(ctx context.Context, table *sink.Table, out join.Output) error
	Exec(ctx context.Context, sql string, args ...any) error
	Commit(ctx context.Context, slot string, lsn wal.LSN) error
	Rollback(ctx context.Context) error
	// Counts returns the rows the transaction really changed in table (as
	// passed to Apply).
	Counts(table *sink.Table) sink.Stats
}

// State is one join's Redis state as the pipeline reads and commits it
// (the engine reads it through its join.Pending overlays). Commit writes a
// batch's mutations with the checkpoint lsn atomically; CommitPartial
// writes a chunk of a large transaction with an undo log, FinishPartial
// ends it at its commit position, and Recover undoes one a crash cut short.
type State interface {
	join.StateReader
	Meta(ctx context.Context) (redisstore.Meta, error)
	Checkpoint() wal.LSN
	Commit(ctx context.Context, m join.Mutations, lsn wal.LSN) error
	CommitPartial(ctx context.Context, m join.Mutations, txn wal.LSN) error
	FinishPartial(ctx context.Context, lsn wal.LSN) error
	Recover(ctx context.Context) (bool, error)
}

var (
	_ Source = (*cdc.Stream)(nil)
	_ State  = (*redisstore.Store)(nil)
	_ Target = SinkTarget{}
)

// SinkTarget is the target database through a sink.Writer.
type SinkTarget struct{ W *sink.Writer }

func (s SinkTarget) Begin(ctx context.Context) (TargetTx, error) {
	tx, err := s.W.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return sinkTx{tx}, nil
}

// sinkTx is a sink.Tx as a TargetTx.
type sinkTx struct{ *sink.Tx }

func (t sinkTx) Counts(table *sink.Table) sink.Stats { return t.TableStats(table) }
