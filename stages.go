package fkmat

import (
	"context"

	"github.com/fkmat/fkmat/cdc"
	"github.com/fkmat/fkmat/join"
	"github.com/fkmat/fkmat/redisstore"
	"github.com/fkmat/fkmat/sink"
)

// The pipeline's stages reach the outside through these consumer-side
// interfaces: the replication stream it reads and acknowledges, the target
// database its rows and checkpoints go to, and each join's Redis state. The
// daemon passes *cdc.Stream, sinkTarget and *redisstore.Store; the unit
// tests (pipeline_test.go) pass in-memory fakes.

// txnSource is the replication stream: whole transactions (or chunks of a
// large one) in commit order, and the acknowledgement of those applied.
type txnSource interface {
	Next(ctx context.Context) (*cdc.Txn, error)
	Ack(lsn cdc.LSN)
	Stats() cdc.StreamStats
}

// targetDB opens target transactions.
type targetDB interface {
	Begin(ctx context.Context) (targetTx, error)
}

// targetTx is one target transaction: rows, then the checkpoint, committed
// together.
type targetTx interface {
	Apply(ctx context.Context, table *sink.Table, out join.Output) error
	Exec(ctx context.Context, sql string, args ...any) error
	Commit(ctx context.Context, slot string, lsn cdc.LSN) error
	Rollback(ctx context.Context) error
	// Counts returns the rows the transaction really changed.
	Counts() sink.Stats
}

// stateStore is one join's Redis state as the pipeline reads and commits
// it (the engine reads it through its join.Pending overlays).
type stateStore interface {
	join.StateReader
	Meta(ctx context.Context) (redisstore.Meta, error)
	Checkpoint() cdc.LSN
	Commit(ctx context.Context, m join.Mutations, lsn cdc.LSN) error
	CommitPartial(ctx context.Context, m join.Mutations, txn cdc.LSN) error
	FinishPartial(ctx context.Context, lsn cdc.LSN) error
	Recover(ctx context.Context) (bool, error)
}

var (
	_ txnSource  = (*cdc.Stream)(nil)
	_ stateStore = (*redisstore.Store)(nil)
	_ targetDB   = sinkTarget{}
)

// sinkTarget is the target database through a sink.Writer.
type sinkTarget struct{ w *sink.Writer }

func (s sinkTarget) Begin(ctx context.Context) (targetTx, error) {
	tx, err := s.w.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return sinkTx{tx}, nil
}

// sinkTx is a sink.Tx as a targetTx.
type sinkTx struct{ *sink.Tx }

func (t sinkTx) Counts() sink.Stats { return t.Stats }
