package pipeline

import (
	"context"
	"errors"
	"sync/atomic"

	"github.com/fkmat/fkmat/join"
	"github.com/fkmat/fkmat/sink"

	"github.com/fkmat/fkmat/internal/crash"
)

// writerDepth is the outputs (pages of a fan-out) an asyncWriter holds
// while it writes one: the engine reads the next pages meanwhile.
const writerDepth = 2

// errWriterFailed is what send returns once the writer has failed; close
// returns the failure itself.
var errWriterFailed = errors.New("target write failed")

// asyncWriter applies a batch's outputs to its target transaction on a
// goroutine of its own, in the order they were sent, so that a fan-out
// larger than a batch may buffer reads its next page from Redis while the
// target writes the last one. Only the writer uses the transaction until
// close returns.
type asyncWriter struct {
	ch     chan pendingOutput
	done   chan struct{}
	err    error // the first failure; read after done is closed
	failed atomic.Bool
}

type pendingOutput struct {
	table *sink.Table
	out   join.Output
}

// startWriter starts the writer of tx.
func startWriter(ctx context.Context, tx TargetTx) *asyncWriter {
	w := &asyncWriter{ch: make(chan pendingOutput, writerDepth), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		for po := range w.ch {
			if w.err != nil {
				continue // failed: drop the rest, close reports it
			}
			if err := apply(ctx, tx, po); err != nil {
				w.err = err
				w.failed.Store(true)
			}
		}
	}()
	return w
}

// apply writes one output into tx; a panic becomes an error, and the
// writer drains the rest.
func apply(ctx context.Context, tx TargetTx, po pendingOutput) (err error) {
	defer crash.Recover(&err, func() (string, uint64) { return "writing the target " + po.table.Schema + "." + po.table.Name, 0 })
	return tx.Apply(ctx, po.table, po.out)
}

// send queues out for table, waiting while the writer holds writerDepth
// outputs.
func (w *asyncWriter) send(ctx context.Context, table *sink.Table, out join.Output) error {
	if w.failed.Load() {
		return errWriterFailed
	}
	select {
	case w.ch <- pendingOutput{table, out}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// close waits until every output sent is written and returns the first
// failure. The transaction is the caller's again afterwards.
func (w *asyncWriter) close() error {
	close(w.ch)
	<-w.done
	return w.err
}
